"""Programs compiled for NVIDIA GPUs on this CPU host (the CUDA plugin, no
GPU): every shipped card's GpuTargetConfig against the chip table, the
names --compile_only takes, the allocator's pool the fit is judged
against, a sharded program's memory against a hand count on every card, the
decode layout GPUs get, and a whole distillation run's programs. The tests
that compile skip where the CUDA plugin is not installed: .ci/run installs
it (`pip install -e '.[cuda]'`) in a virtual environment of its own and runs
this file there."""
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdistill import cli
from jaxdistill import compile_only
from jaxdistill import config_lib
from jaxdistill.models import flops
from jaxdistill import models
from jaxdistill.rollout import generation
from jaxdistill.train import loop

HAS_CUDA = any(importlib.util.find_spec(m) is not None
               for m in ("jax_cuda12_plugin", "jax_cuda13_plugin"))
needs_cuda = pytest.mark.skipif(
    not HAS_CUDA, reason="the CUDA plugin is not installed: "
    "pip install -e '.[cuda]'")
MiB = 1 << 20


def _field(text, name):
  return re.search(rf"\b{name}:\s*\"?([^\"\n]+)\"?", text).group(1)


@pytest.mark.parametrize("name", sorted(compile_only.GPUS))
def test_target_config_matches_the_chip_table(name):
  """The file the compiler reads and the table the report divides by say
  the same card: its memory (as the driver reports it: nvidia-smi's MiB),
  its HBM bandwidth (to 0.1 %), its name, and NVIDIA's SM counts."""
  chip = compile_only.GPUS[name]
  text = compile_only.target_config_text(chip)
  mib = {"h100": 81559, "h200": 143771, "a100-80g": 81920}[name]
  assert int(_field(text, "device_memory_size")) == chip.hbm_bytes == mib * MiB
  bw = float(_field(text, "memory_bandwidth"))
  assert abs(bw - chip.hbm_bandwidth) / chip.hbm_bandwidth < 1e-3
  assert _field(text, "device_description_str") == chip.device_kind
  sms = {"h100": 132, "h200": 132, "a100-80g": 108}[name]
  assert int(_field(text, "core_count")) == sms
  assert _field(text, "platform_name") == "CUDA"


@pytest.mark.parametrize("spec, want", [
    ("h100-1", ("h100", "h100:1x1x1", 1)),
    ("h100-8", ("h100", "h100:1x1x8", 8)),
    ("H100-4", ("h100", "h100:1x1x4", 4)),
    ("h100-16", ("h100", "h100:2x1x8", 16)),
    ("h100-2x8", ("h100", "h100:2x1x8", 16)),
    ("a100-80g-8", ("a100-80g", "a100-80g:1x1x8", 8)),
    ("h200-8", ("h200", "h200:1x1x8", 8)),
])
def test_gpu_names(spec, want):
  chip, topology, n = compile_only.parse_slice(spec)
  assert (chip.name, topology, n) == want
  assert chip.platform == "gpu"


@pytest.mark.parametrize("spec", ["h100-3", "h100-0", "h100-12", "h100-2x3",
                                  "h100-0x8", "a100-8", "a100-40g-8", "b200-8"])
def test_bad_gpu_names_refused(spec):
  with pytest.raises(ValueError, match="--compile_only"):
    compile_only.parse_slice(spec)


def test_memory_fraction(monkeypatch):
  """The pool: XLA_PYTHON_CLIENT_MEM_FRACTION when set, else what our
  commands set it to; anything but a fraction in (0, 1] is refused."""
  monkeypatch.delenv(compile_only.MEM_FRACTION_ENV, raising=False)
  assert compile_only.gpu_mem_fraction() == 0.9
  monkeypatch.setenv(compile_only.MEM_FRACTION_ENV, "0.5")
  assert compile_only.gpu_mem_fraction() == 0.5
  for bad in ("abc", "0", "1.5"):
    monkeypatch.setenv(compile_only.MEM_FRACTION_ENV, bad)
    with pytest.raises(ValueError, match=compile_only.MEM_FRACTION_ENV):
      compile_only.gpu_mem_fraction()


def test_commands_set_the_memory_fraction(monkeypatch):
  """Every command's start sets the allocator's share unless the user did."""
  monkeypatch.delenv(compile_only.MEM_FRACTION_ENV, raising=False)
  cli._prepare(["prog"])  # pylint: disable=protected-access
  assert os.environ[compile_only.MEM_FRACTION_ENV] == "0.9"
  monkeypatch.setenv(compile_only.MEM_FRACTION_ENV, "0.8")
  cli._prepare(["prog"])  # pylint: disable=protected-access
  assert os.environ[compile_only.MEM_FRACTION_ENV] == "0.8"


CASES = [("h100-8", 8), ("a100-80g-8", 8), ("h200-8", 8), ("h100-1", 1),
         ("h100-2x8", 16)]


@needs_cuda
@pytest.mark.parametrize("spec, n", CASES)
def test_every_card_compiles_a_sharded_program(spec, n, monkeypatch):
  """Each card's config parses and XLA's GPU compiler compiles a program
  sharded over all its devices: x [1024, 512] bf16 split by rows, w
  [512, 256] bf16 whole on each device. Per device, by hand: arguments
  1024 / n x 512 x 2 + 512 x 256 x 2 bytes; the report's memory is the
  allocator's pool, 0.9 of the card."""
  monkeypatch.delenv(compile_only.MEM_FRACTION_ENV, raising=False)
  t = compile_only.target(spec)
  chip = compile_only.parse_slice(spec)[0]
  assert len(t.devices) == n
  assert {d.device_kind for d in t.devices} == {chip.device_kind}
  assert t.hbm_bytes == int(0.9 * chip.hbm_bytes)
  mesh = jax.sharding.Mesh(np.array(t.devices), ("fsdp",))
  spec_ = jax.sharding.PartitionSpec

  def sds(shape, s):
    return jax.ShapeDtypeStruct(shape, jnp.bfloat16,
                                sharding=jax.sharding.NamedSharding(mesh, s))

  fn = jax.jit(lambda x, w: jnp.tanh(x @ w).sum(0))
  prog = compile_only.Program("matmul", fn, (sds((1024, 512), spec_("fsdp")),
                                             sds((512, 256), spec_())))
  report = compile_only.compile_programs([prog], t, cache_dir=None,
                                         log=lambda m: None)
  row, = report["programs"]
  assert row["argument_bytes"] == 1024 // n * 512 * 2 + 512 * 256 * 2
  assert row["flops"] == 2 * 1024 * 512 * 256 / n  # the jaxpr's, per device
  assert report["platform"] == "gpu" and report["device_kind"] == chip.device_kind
  assert report["hbm_bytes_per_device"] == int(0.9 * chip.hbm_bytes)
  assert row["fits"]
  assert chip.device_kind in compile_only.format_report(report)


@needs_cuda
def test_decode_layout_on_gpus():
  """On 8 compile-only H100s the decode layout is chosen from the card's
  memory (before, it was unknown and every decoded token gathered the
  weights: 'train'): Qwen2.5-1.5B's bf16 copy, 3.1 GB by hand, is over 2 %
  of the 64 GB pool, so 'tp'; a tiny model's is under it: 'replicated'."""
  t = compile_only.target("h100-8")
  mesh = jax.sharding.Mesh(np.array(t.devices).reshape(1, 8, 1),
                           ("data", "fsdp", "tensor"))
  cfg = models.get_preset("qwen2.5-1.5b")
  # Hand count: embed (tied head) + 28 layers of q, k, v, o and the MLP.
  d, f, v, l, kv = 1536, 8960, 151936, 28, 256
  n = v * d + l * (d * d * 2 + 2 * d * kv + 3 * d * f)
  assert 2 * n > generation.REPLICATE_SHARE * 0.9 * 85520809984
  assert generation.resolve_layout(cfg, "auto", mesh) == "tp"
  tiny = config_lib.load_config("configs/distill.py:runlocal")
  scfg, _, _ = loop.model_configs(tiny)
  assert flops.weight_bytes(scfg) < generation.REPLICATE_SHARE * 1e9
  assert generation.resolve_layout(scfg, "auto", mesh) == "replicated"


@needs_cuda
def test_runlocal_distillation_compiles_for_h100s(tmp_path):
  """`python -m jaxdistill.train --compile_only=h100-4` on the runlocal
  pair: both programs compiled by XLA's GPU compiler, named for the card,
  fitting; the rollout's decode loop (its condition fused by the GPU
  compiler) has a trip count, so its collectives are counted in full."""
  c = config_lib.load_config("configs/distill.py:runlocal")
  report = loop.compile_for(c, "h100-4")  # its batch of 4
  assert report["device_kind"] == "NVIDIA H100 80GB HBM3"
  names = [p["name"] for p in report["programs"]]
  assert names == ["rollout", "update"]
  assert all(p["fits"] for p in report["programs"])
  ro = report["programs"][0]
  assert ro["ici_complete"], ro.get("ici_loops")


@needs_cuda
@pytest.mark.slow
def test_sweep_compile_only_gpu_hours(tmp_path):
  """`python -m jaxdistill.sweep --compile_only=h100-4` (the command, as a
  user runs it): one runlocal arm's programs compiled for 4 H100s, and its
  cost in GPU-hours from the report's own bounds, counted here (2 steps;
  two Countdown suites: one greedy and one sampled call each, and the
  baseline's greedy call on the OOD suite) x 4 GPUs."""
  root = pathlib.Path(__file__).resolve().parents[1]
  out = subprocess.run(
      [sys.executable, "-m", "jaxdistill.sweep", "--config",
       "configs/grid_main.py:runlocal", "--workdir", str(tmp_path),
       "--only", "kl=forward,policy=student", "--compile_only=h100-4",
       "--json"], cwd=root, capture_output=True, text=True,
      env=dict(os.environ, PYTHONPATH=str(root)), timeout=900)
  assert out.returncode == 0, out.stderr[-2000:]
  report = json.loads(out.stdout)
  assert report["device_kind"] == "NVIDIA H100 80GB HBM3"
  b = {r["name"].partition(": ")[0]: r["step_time_bound_s"]
       for r in report["programs"]}
  want = (2 * (b["train rollout"] + b["train update"])
          + 2 * b["eval greedy"] + 2 * b["eval sampled"] + b["eval greedy"])
  assert report["cost"]["grid"]["chip_hours"] == pytest.approx(want * 4 / 3600)
  assert report["cost_lines"][-1].startswith(
      "cost grid: 1 arm on h100-4: ")
  assert "GPU-hours at the step-time bound" in report["cost_lines"][-1]


@needs_cuda
@pytest.mark.parametrize("spec", ["h100-8", "a100-80g-8", "h200-8"])
def test_card_check_reads_back_the_shipped_config(spec):
  """What XLA parsed from each shipped file, read back from its topology,
  equals the file's own fields (so no field was dropped or misspelt); on a
  real GPU the same call sets the driver's against ours (bench.accelerator
  records it). Off GPUs there is nothing to check."""
  t = compile_only.target(spec)
  got = compile_only.card_check(t.devices)
  assert got["differ"] == [], got
  text = compile_only.target_config_text(compile_only.parse_slice(spec)[0])
  assert got["device"]["core_count"] == _field(text, "core_count")
  assert compile_only.card_check(jax.devices("cpu")) is None


def test_gpu_fit_error_names_the_memory_fraction():
  """A GPU program that does not fit is refused in one line that also names
  the allocator's share, the knob a GPU user has beside the run's own."""
  report = {"topology": "h100-1", "hbm_bytes_per_device": 70 * 2**30,
            "platform": "gpu", "memory_fraction": 0.9,
            "memory_fraction_env": compile_only.MEM_FRACTION_ENV,
            "programs": [{"name": "update", "fits": False,
                          "total_bytes": 68 * 2**30}]}
  with pytest.raises(compile_only.FitError) as e:
    compile_only.check(report, advice=lambda r: "try remat")
  msg = str(e.value)
  assert "\n" not in msg and "68.0 GiB" in msg and "try remat" in msg
  assert "XLA_PYTHON_CLIENT_MEM_FRACTION, now 0.9" in msg
