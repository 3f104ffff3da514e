"""bench.profile: per-op times read back from a profiler trace, labelled with
the source scope that XLA's HLO dump records for each op."""
import json
import os
import subprocess
import sys
import textwrap

from jaxdistill import bench
from jaxdistill.bench import profile


def _hlo(ops):
  lines = ["HloModule jit_f", "", "ENTRY %main {"]
  for name, op_name in ops.items():
    lines.append(f'  %{name} = f32[8]{{0}} add(%a, %b), metadata={{'
                 f'op_name="{op_name}" source_file="f.py"}}')
  return "\n".join(lines + ["}"])


def test_op_names_reads_the_dump_that_holds_the_traced_ops(tmp_path):
  # Two dumps of one module name (the same function compiled twice): the one
  # naming the ops the trace saw is read.
  (tmp_path / "module_0001.jit_f.cpu_after_optimizations.txt").write_text(
      _hlo({"fusion.1": "jit(f)/other/add"}))
  (tmp_path / "module_0002.jit_f.cpu_after_optimizations.txt").write_text(
      _hlo({"fusion.1": "jit(f)/mlp/up_proj/dot_general",
            "fusion.2": "jit(f)/transpose(jvp(f))/up_proj/dot_general"}))
  (tmp_path / "module_0003.jit_g.cpu_after_optimizations.txt").write_text(
      _hlo({"fusion.2": "jit(g)/x/y"}))
  names = profile.op_names(str(tmp_path), "jit_f", ["fusion.1", "fusion.2"])
  assert names == {"fusion.1": "jit(f)/mlp/up_proj/dot_general",
                   "fusion.2": "jit(f)/transpose(jvp(f))/up_proj/dot_general"}
  assert profile.scope(names["fusion.1"]) == "up_proj/dot_general"
  assert profile.scope(names["fusion.2"]) == "bwd:up_proj/dot_general"
  assert profile.scope("jit(f)/jvp(g)/mlp/up_proj/dot_general") == (
      "fwd:up_proj/dot_general")
  assert profile.scope("jit(f)/jvp(teacher)/jit(apply)/q_proj/dot_general",
                       groups=("teacher",)) == "fwd:teacher:q_proj/dot_general"
  assert profile.scope("jit(f)/teacher/jit(apply)/q_proj/dot_general",
                       groups=("teacher",)) == "teacher:q_proj/dot_general"
  assert profile.scope("", "ynn_fusion.14") == "ynn_fusion"
  rows = [{"op_name": names["fusion.1"], "op": "fusion.1", "ms": 1.0},
          {"op_name": "jit(f)/a/b/exp", "op": "e.1", "ms": 0.5},
          {"op_name": "jit(f)/mlp/up_proj/dot_general", "op": "fusion.9",
           "ms": 2.0}]
  assert profile.by_scope(rows) == {"up_proj/dot_general": 3.0, "b/exp": 0.5}


def test_profile_of_a_program_names_its_scopes(tmp_path):
  # End to end in a fresh process (the dump flag must precede JAX's start):
  # a wide product under one named scope and a cheap add under another.
  script = textwrap.dedent(f"""
      import json, os
      from jaxdistill.bench import profile
      os.environ["XLA_FLAGS"] = profile.dump_flags({str(tmp_path)!r})
      import jax, jax.numpy as jnp

      @jax.jit
      def f(a, b):
        with jax.named_scope("wide"):
          y = a @ b
        with jax.named_scope("cheap"):
          return y[:, :8] + 1.0

      a, b = jnp.ones((256, 256)), jnp.ones((256, 4096))
      jax.block_until_ready(f(a, b))
      rows = profile.op_times(lambda: f(a, b), {str(tmp_path)!r}, calls=3)
      print(json.dumps({{"rows": rows, "scopes": profile.by_scope(rows)}}))
      """)
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  out = subprocess.run([sys.executable, "-c", script], env=env, check=True,
                       capture_output=True, text=True, timeout=120).stdout
  got = json.loads(out.strip().splitlines()[-1])
  f_rows = [r for r in got["rows"] if r["module"] == "jit_f"]
  assert f_rows and all(r["count"] == 1 for r in f_rows)  # once per call
  scopes = list(got["scopes"])
  assert "wide/dot_general" in scopes
  assert any(s.startswith("cheap/") for s in scopes)
  # 256 x 256 x 4096 multiply-adds against an 8-column add: the product is
  # the slowest scope.
  assert scopes[0] == "wide/dot_general"


def test_a_failed_profile_leaves_the_figures():
  def broken(unused_dump_dir):
    raise RuntimeError("no trace")
  assert bench.profile_section("/tmp/d", broken) == {
      "error": "RuntimeError('no trace')"}
  assert bench.profile_section(None, broken) is None  # no --profile
