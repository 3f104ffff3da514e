"""compile_only: slice names, the FLOP count of a program (against hand counts
written here from the shapes), the report's arithmetic, and (with libtpu)
compiling real programs for a TPU slice on this CPU host."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import pytest

from jaxdistill import compile_only
from jaxdistill import config_lib
from jaxdistill import sharding
from jaxdistill.train import loop
from tests import config_util


@pytest.mark.parametrize("name,topology,chips", [
    ("v5e-8", "v5e:2x4", 8), ("v6e-8", "v6e:2x4", 8), ("v5e-16", "v5e:4x4", 16),
    ("v6e-16", "v6e:4x4", 16), ("v5p-8", "v5p:2x2x1", 4),
    ("v4-8", "v4:2x2x1", 4), ("v5e:2x2", "v5e:2x2", 4), ("V6E-4", "v6e:2x2", 4)])
def test_parse_slice(name, topology, chips):
  chip, topo, n = compile_only.parse_slice(name)
  assert (topo, n) == (topology, chips)
  assert chip.name == topology.split(":")[0]


@pytest.mark.parametrize("name,words", [
    ("v7-8", "unknown slice"), ("v5e-3", "no v5e slice of size 3"),
    ("v5p-5", "no v5p slice of size 5"), ("v5e:2x2x2", "needs 2 positive"),
    ("tpu", "unknown slice"), ("v5e:3x3", "v5e has no topology '3x3'"),
    ("v4:3x3x3", "v4 has no topology"), ("", "no slice given")])
def test_parse_slice_refuses_in_one_line(name, words):
  with pytest.raises(ValueError, match=words) as e:
    compile_only.parse_slice(name)
  assert "\n" not in str(e.value)


def test_jaxpr_flops_counts_loops_by_their_trips():
  """2 x M x N x K per product; a scan body x its length; a while body x the
  trip count given; a cond's costlier branch."""
  def f(x, w, v):
    y = x @ w                                      # 2*4*8*16
    def body(c, _):
      return c @ v, None                           # 2*4*16*16, 5 times
    y, _ = jax.lax.scan(body, y, None, length=5)
    y = jax.lax.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] @ v),
                           (0, y))[1]              # 2*4*16*16, x trips
    y = jax.lax.cond(y.sum() > 0, lambda a: a @ v @ v, lambda a: a, y)
    return jnp.einsum("bk,bk->b", y, y)            # 2*4*16
  args = (jax.ShapeDtypeStruct((4, 8), jnp.float32),
          jax.ShapeDtypeStruct((8, 16), jnp.float32),
          jax.ShapeDtypeStruct((16, 16), jnp.float32))
  jaxpr = jax.make_jaxpr(f)(*args)
  step = 2 * 4 * 16 * 16
  want = 2 * 4 * 8 * 16 + 5 * step + 7 * step + 2 * step + 2 * 4 * 16
  assert compile_only.jaxpr_flops(jaxpr, while_trips=7) == want


# A tiny pair whose every product is easy to write down.
S = dict(family="llama", vocab_size=300, hidden_size=32, intermediate_size=48,
         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
         head_dim=8, eos_token_id=(2,), max_position_embeddings=512)
T = dict(S, hidden_size=64, intermediate_size=96, num_hidden_layers=3)


def _layers_fwd(m, rows, q, s):
  """One forward of the decoder layers: `rows` x `q` query tokens attending
  to `s` keys. Projections q, k, v, o and the three MLP products; attention
  QK^T and PV (dense: masking does not skip work)."""
  d, n, k, h, f = (m["hidden_size"], m["num_attention_heads"],
                   m["num_key_value_heads"], m["head_dim"],
                   m["intermediate_size"])
  proj = 2 * rows * q * (d * n * h + 2 * d * k * h + n * h * d + 3 * d * f)
  attn = 2 * 2 * rows * n * q * s * h
  return m["num_hidden_layers"] * (proj + attn)


def _config(remat="none", **fields):
  c = config_lib.load_config("configs/distill.py:runlocal")
  c.student.init = S
  c.teacher.init = T
  c.student.remat = remat
  return config_util.set_fields(c, fields)


def _program_flops(c, name, vocab=300):
  mesh = sharding.make_mesh({"fsdp": 1}, jax.devices()[:1])
  rules = sharding.DEFAULT_RULES
  scfg, tcfg, cached = loop.model_configs(c)
  p, = [p for p in loop.run_programs(c, scfg, tcfg, vocab, mesh, rules, cached)
        if p.name == name]
  return compile_only.jaxpr_flops(p.trace().jaxpr, p.while_trips)


@pytest.mark.parametrize("remat", ["none", "full"])
def test_update_flops_hand_count(remat):
  """The distillation update: student layers forward + backward (2 x forward)
  and, with remat 'full', the forward again minus each layer's down_proj
  (the backward needs no layer's output: the next layer's input is saved);
  teacher layers forward; the fused loss's head products over the positions
  padded to whole chunks: student logits, their gradient to the hidden
  states and to the head, teacher logits. The heads are cut to the
  vocabulary rounded up to 128 columns, within their width (300)."""
  c = _config(remat, **{"data.batch_size": 4, "data.max_prompt_len": 8,
                        "rollout.max_new_tokens": 8, "loss.chunk_size": 4})
  b, seq = 4, 16
  pos = math.ceil((seq - 1) / 4) * 4  # 15 loss positions -> 4 chunks of 4
  w = 300  # min(384, the heads' width 300)
  recompute = 0
  if remat == "full":
    down_proj = 2 * b * seq * S["intermediate_size"] * S["hidden_size"]
    recompute = _layers_fwd(S, b, seq, seq) - S["num_hidden_layers"] * down_proj
  want = (3 * _layers_fwd(S, b, seq, seq) + recompute
          + _layers_fwd(T, b, seq, seq)
          + 3 * 2 * b * pos * S["hidden_size"] * w
          + 2 * b * pos * T["hidden_size"] * w)
  assert _program_flops(c, "update") == want


def test_rollout_flops_hand_count():
  """Student rollout: the prefill runs the prompt's P tokens against the
  whole cache (P + N - 1 slots) and the head on the last position; each of
  the N - 1 decode steps one token per row; the head is cut to the
  vocabulary sampled (300)."""
  c = _config(**{"data.batch_size": 4, "data.max_prompt_len": 8,
                 "rollout.max_new_tokens": 6})
  b, p, n = 4, 8, 6
  cache = p + n - 1
  head = 2 * b * S["hidden_size"] * 300
  want = (_layers_fwd(S, b, p, cache) + head
          + (n - 1) * (_layers_fwd(S, b, 1, cache) + head))
  assert _program_flops(c, "rollout") == want


# A compiled program whose one collective all-gathers 30 bytes over 2
# devices: 30 bytes into each.
_GATHER_HLO = """\
HloModule m
ENTRY %main (p: u8[30]) -> u8[60] {
  %p = u8[30] parameter(0)
  ROOT %g = u8[60] all-gather(%p), replica_groups={{0,1}}, dimensions={0}
}
"""


@pytest.mark.parametrize("ici_bandwidth,ici_s,bound_by,hlo", [
    (None, None, "memory", _GATHER_HLO), (10.0, 6.0, "memory", _GATHER_HLO),
    (4.0, 15.0, "ici", _GATHER_HLO), (4.0, None, "memory", "HloModule m\n")])
def test_report_row_arithmetic(ici_bandwidth, ici_s, bound_by, hlo):
  """total = arguments + outputs - aliased + temporaries + resident; the
  bound is the largest of FLOPs / peak, bytes / bandwidth and ICI bytes /
  half the bidirectional ICI bandwidth (none without a figure, or where
  the compiled text cannot be read: the row says why)."""
  chip = compile_only.Chip("x", 1000, 10.0, 5.0, 2, False, ici_bandwidth)
  t = compile_only._target("x-1", chip, "x:1x1", 1, (None,), 1000)

  class Mem:
    argument_size_in_bytes, output_size_in_bytes = 300, 200
    alias_size_in_bytes, temp_size_in_bytes = 150, 100

  class Compiled:
    def memory_analysis(self):
      return Mem()

    def as_text(self):
      return hlo

  class Traced:
    jaxpr = jax.make_jaxpr(lambda a: a @ a)(jnp.ones((2, 2)))  # 16 FLOPs

    def lower(self):
      class L:
        def compile(self):
          return Compiled()
      return L()

  p = compile_only.Program("prog", None, (), model_flops=8.0,
                           bytes_accessed=50.0, resident_bytes=350,
                           limit_bytes=20.0)
  p.trace = lambda: Traced()
  row = compile_only.compile_program(p, t)
  assert row["total_bytes"] == 300 + 200 - 150 + 100 + 350 == 800
  assert row["fits"] and abs(row["headroom"] - 0.2) < 1e-12
  assert row["flops"] == 16
  if hlo == _GATHER_HLO:
    assert row["ici_bytes"] == 30 and row["ici_s"] == ici_s
  else:
    assert row["ici_bytes"] is None and row["ici_s"] is None
    assert "no ENTRY" in row["ici_error"]
  assert row["step_time_bound_s"] == max(16 / 10.0, 50 / 5.0, ici_s or 0)
  assert row["bound_by"] == bound_by
  table = compile_only.format_report(
      {"topology": "x-1", "topology_desc": "x:1x1", "chips": 1,
       "hbm_bytes_per_device": 1000, "programs": [row]}).splitlines()
  assert table[1].split(" | ")[9] == "ICI GB"
  assert table[2].split(" | ")[9] == ("3e-08" if hlo == _GATHER_HLO
                                      else "-")  # GB
  ratio = row["step_time_bound_s"] / 4.0
  assert table[2].split(" | ")[11] == f"4000.0 (bound {ratio:.1f}x)"
  bound = row["step_time_bound_s"]
  assert abs(row["mfu_ceiling"] - (8.0 / 10.0) / bound) < 1e-12
  assert row["limit_s"] == max(8.0 / 10.0, 20.0 / 5.0) == 4.0
  assert row["bound_over_limit"] == bound / 4.0
  resident = dataclasses.replace(p, resident_bytes=560)
  resident.trace = p.trace
  assert not compile_only.compile_program(resident, t)["fits"]  # 1010 > 900



def test_rollout_and_update_physical_limit_bytes_hand_count():
  """The physical limit's HBM bytes on 8 chips: the rollout reads each
  chip's 1/8 of the student's weights and its rows' KV cache once per pass
  (the prefill and N - 1 decode steps); the update reads 1/8 of the
  student's weights twice (forward, backward) and of the teacher's once,
  and AdamW's state (params read and written, float32 gradient, m and v)."""
  c = _config(**{"data.batch_size": 8, "data.max_prompt_len": 8,
                 "rollout.max_new_tokens": 6, "track_sparsity": False})
  mesh = loop.config_mesh(c, jax.devices())
  assert mesh.devices.size == 8
  scfg, tcfg, cached = loop.model_configs(c)
  progs = {p.name: p for p in loop.run_programs(
      c, scfg, tcfg, 300, mesh, sharding.DEFAULT_RULES, cached)}

  def weights(m, itemsize, tied):
    d, f, n, k, h, v, l = (m["hidden_size"], m["intermediate_size"],
                           m["num_attention_heads"], m["num_key_value_heads"],
                           m["head_dim"], m["vocab_size"],
                           m["num_hidden_layers"])
    layer = d * n * h * 2 + d * k * h * 2 + 3 * d * f + 2 * d
    return (l * layer + v * d * (1 if tied else 2) + d) * itemsize

  size = {"float32": 4, "bfloat16": 2}
  ws = weights(S, size[scfg.param_dtype], scfg.tie_word_embeddings)
  wt = weights(T, size[tcfg.param_dtype], tcfg.tie_word_embeddings)
  p, n, rows = 8, 6, 8 / 8
  kv = (2 * S["num_hidden_layers"] * rows * S["num_key_value_heads"]
        * (p + n - 1) * S["head_dim"] * size[scfg.dtype])
  assert progs["rollout"].limit_bytes == pytest.approx(n * (ws / 8 + kv))
  params = ws / size[scfg.param_dtype]
  adam = params * (4 * 2 + 4 * 4) / 8
  assert progs["update"].limit_bytes == pytest.approx(
      2 * ws / 8 + wt / 8 + adam)


@pytest.mark.slow  # two 8-device compilations of the update
def test_grad_accum_splits_every_devices_rows():
  """With the rows split over 8 devices, gradient accumulation runs each
  micro-batch on all of them (rows j, A + j, ...), so the update's
  activations shrink with A: XLA's compiled temporaries at A = 4 are under
  0.4 x those at A = 1 (1/4 of the activations plus what does not scale)."""
  m = dict(S, vocab_size=512, hidden_size=128, intermediate_size=512,
           head_dim=32)
  temps = []
  for accum in (1, 4):
    c = _config(**{"data.batch_size": 32, "data.max_prompt_len": 128,
                   "rollout.max_new_tokens": 128, "optim.grad_accum": accum,
                   "track_sparsity": False})
    c.student.init = c.teacher.init = m
    mesh = loop.config_mesh(c, jax.devices())
    scfg, tcfg, cached = loop.model_configs(c)
    p, = [p for p in loop.run_programs(c, scfg, tcfg, 512, mesh,
                                       sharding.DEFAULT_RULES, cached)
          if p.name == "update"]
    temps.append(p.trace().lower().compile().memory_analysis().temp_size_in_bytes)
  assert temps[1] < 0.4 * temps[0], temps


def test_a_run_on_a_tpu_checks_its_fit_before_loading_weights(
    tmp_path, monkeypatch):
  """On a TPU, train compiles its programs for its own devices before any
  weight is loaded and stops in one line when one does not fit. Here the
  'TPU' is the CPU devices with 10 kB of HBM (compile_only.local_target
  patched); loading weights would fail the test."""
  c = _config(**{"data.batch_size": 8, "total_steps": 1})
  chip = compile_only.Chip("tiny", 10**4, 1e12, 1e11, 2, False)

  def fake_target(devices):
    return compile_only.Target("tiny-8", chip, "tiny:2x4", 8, tuple(devices),
                               10**4, 1e12, 1e11)

  def no_weights(*a, **k):
    raise AssertionError("weights loaded before the fit check")

  monkeypatch.setattr(compile_only, "local_target", fake_target)
  monkeypatch.setattr(compile_only, "ensure_persistent_cache", lambda: None)
  monkeypatch.setattr(loop.train_setup, "load_params", no_weights)
  with pytest.raises(compile_only.FitError,
                     match=r"^rollout does not fit tiny-8: it needs .* GiB per "
                           r"chip of 0.0 GiB .*; try .*") as e:
    loop.train(c, str(tmp_path / "w"))
  assert "\n" not in str(e.value)
  assert not (tmp_path / "w" / "config.json").exists()


def test_teacher_prompt_programs_run_the_teacher_over_its_own_width():
  """data.teacher_prompt: the rollout prefills the teacher from its own
  [B, Pt] prompt and the update's teacher runs over [B, Pt + N]: the
  update's FLOPs are the hand count with the teacher's layers at that
  width (the fused heads still over the student's response positions)."""
  pt = 12
  c = _config("none", **{"data.batch_size": 4, "data.max_prompt_len": 8,
                         "rollout.max_new_tokens": 8, "loss.chunk_size": 4,
                         "data.task": "countdown",
                         "data.teacher_prompt": "In Spanish. {prompt}",
                         "data.max_teacher_prompt_len": pt,
                         "rollout.policy": "teacher"})
  config_lib.validate(c)
  b, seq = 4, 16
  pos, w = math.ceil((seq - 1) / 4) * 4, 300
  want = (3 * _layers_fwd(S, b, seq, seq) + _layers_fwd(T, b, pt + 8, pt + 8)
          + 3 * 2 * b * pos * S["hidden_size"] * w
          + 2 * b * pos * T["hidden_size"] * w)
  assert _program_flops(c, "update") == want
  mesh = sharding.make_mesh({"fsdp": 1}, jax.devices()[:1])
  scfg, tcfg, cached = loop.model_configs(c)
  progs = {p.name: p for p in loop.run_programs(
      c, scfg, tcfg, 300, mesh, sharding.DEFAULT_RULES, cached)}
  assert progs["update"].args[2]["teacher_tokens"].shape == (b, pt + 8)
  shapes = [x.shape for x in jax.tree.leaves(progs["rollout"].args)
            if hasattr(x, "shape")]
  assert (b, pt) in shapes and (b, 8) in shapes
  progs["rollout"].trace()
