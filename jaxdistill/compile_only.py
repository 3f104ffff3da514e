"""Compile a run's programs for a TPU slice on any host, and say if they fit.

  python -m jaxdistill.train --config configs/distill.py \
      --config.student.preset=qwen2.5-0.5b --config.teacher.preset=qwen2.5-7b \
      --config.loss.vocab_size=151665 --workdir W --compile_only=v5e-8 [--json]

JAX compiles for a TPU topology without a TPU (libtpu installed: the `tpu`
extra, `pip install -e '.[tpu]'`): `jax.experimental.topologies` gives the
slice's devices, each command lays its programs (rollout, train step, ...)
on a mesh over them with abstract arguments (shapes, dtypes and shardings;
no weights), and XLA's TPU compiler reports per chip what each needs. That
is the TPU's own word on fit, got before anyone pays for the slice.

Per program and chip:
  argument / output / temp bytes   XLA's memory_analysis();
  total      arguments + outputs - donated (aliased) + temporaries, plus
             `resident_bytes`: what the run keeps on the chip meanwhile that
             is no argument of the program (the optimizer state while the
             rollout runs, the initial weights kept for update sparsity);
  fits       total <= (1 - HEADROOM) x HBM;
  flops      the program's matrix-product FLOPs per chip, counted on its
             jaxpr with every loop body times its trip count (XLA's
             cost_analysis() counts a loop body once: the layer scan, the
             loss's chunk scan, the decode loop), divided over the chips;
             rematerialised products are counted, as they run;
  bytes      a lower bound of the HBM traffic per chip that the command
             computes from its shapes (weights read per pass, gathered under
             FSDP; optimizer state read and written; the KV cache read per
             decode step); activations are not counted;
  ici_bytes  the bytes the compiled program's collectives move into each
             chip (all-gathers, reduce-scatters, all-reduces, all-to-alls,
             collective-permutes; ring algorithms), each times the trips of
             the loops it sits in, read from the optimized HLO
             (collectives.py; `ici_bytes_by_kind`, `ici_loops` with the
             trip count of each loop and how it is known; `ici_complete`
             False where a loop's count is unknown: the total is then a
             lower bound);
  ici_s      ici_bytes / (half the chip's bidirectional ICI bandwidth): a
             chip cannot take in data faster than all its links deliver
             at once. A slice whose chips use fewer links (a ring over a
             2x4 v5e uses 2 of 4) takes up to twice as long: a lower bound;
  bound      max(flops / peak FLOP/s, bytes / HBM bandwidth, ici_s) per
             chip: no step can be faster (the roofline); `bound_by` names
             the term that binds (compute, memory or ici);
  mfu_ceiling  model FLOPs (models.flops: the useful work, no
             rematerialisation) / (bound x peak): the best MFU the program
             could reach;
  limit_s    the program's physical limit per chip: max(model FLOPs / peak,
             `limit_bytes` / HBM bandwidth), where `limit_bytes` reads every
             weight once per pass from the chip's own HBM share (weights in
             place, nothing gathered) and the KV cache once per decode step;
             `bound_over_limit` = bound / limit_s, how far the program's
             layout is from the hardware's best.

Each command builds its Programs (train/programs.py, rl/programs.py,
evaluate/programs.py, ...); `compile_programs` compiles them and `check`
raises FitError, one line, when one does not fit.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses
import hashlib
from importlib import metadata
import json
import logging
import math
import os
import re
import sys
import time
from typing import Any

from absl import flags
import jax
from jax._src import xla_bridge
from jax._src.lib import xla_client
from jax.experimental import topologies
import numpy as np

from jaxdistill import collectives
from jaxdistill import sharding

# A program fits when it leaves at least this fraction of a chip's HBM free.
HEADROOM = 0.10
GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
  """Per-chip figures of a TPU generation (bf16 dense peak, HBM, bandwidth),
  from Google Cloud's TPU pages. `names_count_cores`: v4 and v5p slices are
  named by TensorCores (v5p-8 is 4 chips), v5e and v6e by chips.
  `ici_bandwidth`: the bidirectional inter-chip interconnect bandwidth per
  chip, bytes/s (docs.cloud.google.com/tpu/docs/v5e: 400 GBps; /v5p-training:
  1200 GBps; /v6e: 800 GBps, as read 2026-12-03); None for v4, whose page
  gives no per-chip figure (no ICI term then)."""
  name: str
  hbm_bytes: int
  peak_flops: float
  hbm_bandwidth: float
  dims: int
  names_count_cores: bool
  ici_bandwidth: float | None = None
  platform: str = "tpu"
  target_config: str | None = None  # GPUs: the file in gpu_targets/
  device_kind: str | None = None    # GPUs: jax.Device.device_kind


CHIPS = {
    "v4": Chip("v4", 32 * GiB, 275e12, 1228e9, 3, True),
    "v5e": Chip("v5e", 16 * GiB, 197e12, 819e9, 2, False, 400e9),
    "v5p": Chip("v5p", 95 * GiB, 459e12, 2765e9, 3, True, 1200e9),
    "v6e": Chip("v6e", 32 * GiB, 918e12, 1640e9, 2, False, 800e9),
}

# NVIDIA data-center GPUs (SXM boards), from NVIDIA's data sheets: dense bf16
# tensor-core peak, HBM bandwidth, NVLink bandwidth per GPU (bidirectional:
# H100 / H200 18 links x 50 GB/s = 900 GB/s, A100 12 x 50 = 600 GB/s); the
# memory is the card's as the driver reports it (gpu_targets/*.txtpb). `dims`
# unused; GPUs are named by count ('h100-8') or hosts x GPUs ('h100-2x8').
GPUS = {
    "h100": Chip("h100", 85520809984, 989.4e12, 3352e9, 0, False, 900e9,
                 "gpu", "h100_sxm_80gb.txtpb", "NVIDIA H100 80GB HBM3"),
    "h200": Chip("h200", 150754820096, 989.4e12, 4800e9, 0, False, 900e9,
                 "gpu", "h200_sxm_141gb.txtpb", "NVIDIA H200"),
    "a100-80g": Chip("a100-80g", 85899345920, 312e12, 2039e9, 0, False, 600e9,
                     "gpu", "a100_sxm_80gb.txtpb", "NVIDIA A100-SXM4-80GB"),
}
# NVLink joins at most this many GPUs of one machine (an HGX board).
GPUS_PER_HOST = (1, 2, 4, 8)
# The share of a GPU's memory JAX's allocator takes (sharding.py).
GPU_MEM_FRACTION = sharding.GPU_MEM_FRACTION
MEM_FRACTION_ENV = sharding.MEM_FRACTION_ENV


def gpu_mem_fraction() -> float:
  """The share of a GPU's memory JAX's allocator takes in this process."""
  raw = os.environ.get(MEM_FRACTION_ENV)
  if raw is None:
    return GPU_MEM_FRACTION
  try:
    frac = float(raw)
  except ValueError:
    raise ValueError(f"{MEM_FRACTION_ENV}={raw!r}: expected a fraction in "
                     "(0, 1]") from None
  if not 0.0 < frac <= 1.0:
    raise ValueError(f"{MEM_FRACTION_ENV}={raw!r}: expected a fraction in (0, 1]")
  return frac

# Chips -> the topology of a slice of that many (2-D: v5e/v6e; 3-D: v4/v5p).
_SHAPES_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8",
              128: "8x16", 256: "16x16"}
_SHAPES_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4",
              128: "4x4x8", 256: "4x8x8"}


class FitError(ValueError):
  """A program of the run does not fit the slice (one-line message)."""


@dataclasses.dataclass(frozen=True)
class Target:
  """Devices to compile for, with the per-device figures a report uses."""
  name: str
  chip: Chip
  topology: str
  chips: int
  devices: tuple
  hbm_bytes: int        # per device
  peak_flops: float     # per device
  hbm_bandwidth: float  # per device
  ici_in_bandwidth: float | None = None  # into a device, all links at once


def _target(name, chip, topology, chips, devices, hbm_bytes=None) -> Target:
  per_device = chips / len(devices)  # v4: 2 devices a chip
  ici = None if chip.ici_bandwidth is None else chip.ici_bandwidth / 2
  if hbm_bytes is None and chip.platform == "gpu":  # the allocator's pool
    hbm_bytes = chip.hbm_bytes * gpu_mem_fraction()
  return Target(name, chip, topology, chips, tuple(devices),
                int(hbm_bytes or chip.hbm_bytes * per_device),
                chip.peak_flops * per_device, chip.hbm_bandwidth * per_device,
                None if ici is None else ici * per_device)


def parse_slice(name: str) -> tuple[Chip, str, int]:
  """'v5e-8' (a slice as Cloud TPU names it), 'v5e:2x4' (a topology), 'h100-8'
  (GPUs of one machine), 'h100-2x8' (machines x GPUs each) -> (chip,
  topology, chips). Raises ValueError naming what it accepts."""
  known = ", ".join(sorted(CHIPS) + sorted(GPUS))
  if not isinstance(name, str) or not name.strip():
    raise ValueError(f"--compile_only: no slice given ({name!r}); give a Cloud "
                     "TPU slice like v5e-8, a topology like v5e:2x4 or GPUs "
                     "like h100-8")
  gpu = re.fullmatch(r"([a-z]\d+(?:-\d+g)?)-(\d+)(?:x(\d+))?", name.strip().lower())
  if gpu and gpu.group(1) in GPUS:
    return _parse_gpus(name, GPUS[gpu.group(1)], gpu.group(2), gpu.group(3))
  m = re.fullmatch(r"(v\d+[a-z]?)([-:])(\S+)", name.strip().lower())
  if not m or m.group(1) not in CHIPS:
    raise ValueError(f"--compile_only: unknown slice {name!r}; give a Cloud TPU "
                     f"slice like v5e-8, v6e-8, v5p-8, v4-8, a topology like "
                     f"v5e:2x4, or NVIDIA GPUs like h100-1, h100-8, a100-80g-8, "
                     f"h100-2x8 (chips: {known})")
  chip = CHIPS[m.group(1)]
  if m.group(2) == ":":
    dims = m.group(3).split("x")
    if len(dims) != chip.dims or not all(d.isdigit() and int(d) > 0 for d in dims):
      raise ValueError(f"--compile_only: topology {name!r} needs {chip.dims} "
                       f"positive dimensions for {chip.name}")
    # Refused here, not by libtpu, whose error would read as a missing install.
    shapes = (_SHAPES_3D if chip.dims == 3 else _SHAPES_2D).values()
    topology = "x".join(str(int(d)) for d in dims)
    if topology not in shapes:
      raise ValueError(f"--compile_only: {chip.name} has no topology "
                       f"{topology!r}; known: {', '.join(shapes)}")
    return chip, f"{chip.name}:{topology}", math.prod(int(d) for d in dims)
  if not m.group(3).isdigit():
    raise ValueError(f"--compile_only: {name!r}: expected {chip.name}-N")
  n = int(m.group(3))
  chips = n // 2 if chip.names_count_cores else n
  shapes = _SHAPES_3D if chip.dims == 3 else _SHAPES_2D
  if chips not in shapes or (chip.names_count_cores and n % 2):
    sizes = sorted(k * (2 if chip.names_count_cores else 1) for k in shapes)
    raise ValueError(f"--compile_only: no {chip.name} slice of size {n}; "
                     f"sizes: {sizes} (or give a topology, e.g. "
                     f"{chip.name}:{shapes[min(shapes)]})")
  return chip, f"{chip.name}:{shapes[chips]}", chips


def _parse_gpus(name: str, chip: Chip, a: str, b: str | None):
  """'h100-8' -> one machine of 8; 'h100-16' -> two of 8; 'h100-2x8' -> two
  machines of 8. Topology 'h100:HOSTSx1xGPUS' (the CUDA plugin's
  'hosts x 1 x GPUs per host')."""
  hosts, per_host = (int(a), int(b)) if b is not None else (
      (1, int(a)) if int(a) <= max(GPUS_PER_HOST) else
      (int(a) // max(GPUS_PER_HOST), max(GPUS_PER_HOST)))
  if (hosts < 1 or per_host not in GPUS_PER_HOST or
      (b is None and int(a) > max(GPUS_PER_HOST) and
       int(a) % max(GPUS_PER_HOST))):
    raise ValueError(
        f"--compile_only: {name!r}: give {chip.name}-N with N GPUs of one "
        f"machine (N in {list(GPUS_PER_HOST)}) or a multiple of "
        f"{max(GPUS_PER_HOST)}, or {chip.name}-HxG: H machines of G GPUs "
        f"each (e.g. {chip.name}-2x8)")
  return chip, f"{chip.name}:{hosts}x1x{per_host}", hosts * per_host


def target_config_text(chip: Chip) -> str:
  """The GpuTargetConfig (text proto) a GPU chip is compiled for."""
  path = os.path.join(os.path.dirname(__file__), "gpu_targets",
                      chip.target_config)
  with open(path) as f:
    return f.read()


def target(name: str) -> Target:
  """The compile-only devices of a TPU slice (needs libtpu; no TPU) or of
  NVIDIA GPUs (needs the CUDA plugin; no GPU)."""
  chip, topology, chips = parse_slice(name)
  if chip.platform == "gpu":
    return _gpu_target(name, chip, topology, chips)
  # Compiling needs no TPU: this process neither takes the TPU of the host it
  # runs on (a TPU VM may be training) nor waits for libtpu's one-process
  # lock, so that several compile-only runs (and a run) can go at once.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  if not xla_bridge.backends_are_initialized():
    jax.config.update("jax_platforms", "cpu")
  try:
    devices = topologies.get_topology_desc(topology, platform="tpu").devices
  except Exception as e:  # pylint: disable=broad-except
    raise RuntimeError(
        f"--compile_only={name}: cannot compile for a TPU here ({_first_line(e)}); "
        "install libtpu for the installed JAX: pip install -e '.[tpu]'") from None
  return _target(name, chip, topology, chips, devices)


def _gpu_target(name, chip, topology, chips) -> Target:
  # The CPU stays this process's platform: a GPU on this host is not used.
  if not xla_bridge.backends_are_initialized():
    jax.config.update("jax_platforms", "cpu")
  try:
    # The CUDA plugin reads the shape from its `topology` option, not from
    # the topology's name.
    devices = topologies.get_topology_desc(
        platform="cuda", topology=topology.split(":")[1],
        target_config=target_config_text(chip)).devices
  except Exception as e:  # pylint: disable=broad-except
    raise RuntimeError(
        f"--compile_only={name}: cannot compile for an NVIDIA GPU here "
        f"({_first_line(e)}); install the CUDA plugin for the installed JAX: "
        "pip install -e '.[cuda]'") from None
  return _target(name, chip, topology, chips, devices)


# jax.Device.device_kind -> chip.
_KINDS = {"TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5e": "v5e",
          "TPU v5": "v5p", "TPU v5p": "v5p", "TPU v6 lite": "v6e",
          "TPU v6e": "v6e"}


def _chip_of(device) -> Chip | None:
  """The chip table's entry for a device (a TPU's or an NVIDIA GPU's), or
  None (CPU, a GPU the table lacks)."""
  if device.platform == "tpu":
    kind = _KINDS.get(device.device_kind)
    return None if kind is None else CHIPS[kind]
  if device.platform == "gpu":
    for chip in GPUS.values():
      if chip.device_kind == device.device_kind:
        return chip
  return None


def device_hbm_bytes(device) -> int | None:
  """Memory of one device, bytes: as the runtime reports it (on a GPU, the
  allocator's pool), else the chip table's for a device of a compile-only
  topology (a GPU's pool: gpu_mem_fraction() of it); None when unknown
  (CPU)."""
  try:
    return int(device.memory_stats()["bytes_limit"])
  except Exception:  # pylint: disable=broad-except
    pass
  chip = _chip_of(device)
  if chip is None:
    return None
  if chip.platform == "gpu":
    return int(chip.hbm_bytes * gpu_mem_fraction())
  return chip.hbm_bytes // (2 if chip.names_count_cores else 1)


# The GpuTargetConfig fields a fit and a bound depend on.
CARD_FIELDS = ("core_count", "fpus_per_core", "clock_rate_ghz",
               "memory_bandwidth", "device_memory_size", "l2_cache_size",
               "shared_memory_per_core", "shared_memory_per_block_optin")


def _card_fields(text: str) -> dict:
  out = {}
  for f in CARD_FIELDS:
    m = re.search(rf"\b{f}:\s*([\d.]+)", text)
    out[f] = None if m is None else m.group(1)
  # The compute capability (a text proto leaves out a field at its default, 0).
  cc = re.search(r"cuda_compute_capability\s*\{([^}]*)\}", text)
  for f in ("major", "minor"):
    m = re.search(rf"\b{f}:\s*(\d+)", cc.group(1)) if cc else None
    out[f"compute_capability_{f}"] = m.group(1) if m else "0"
  return out


def card_check(devices) -> dict | None:
  """NVIDIA GPUs: the card's GpuTargetConfig as XLA reads it for `devices`
  (on a real GPU, from the driver) beside the one shipped for
  --compile_only (gpu_targets/), field by field: {'device', 'shipped',
  'differ': [fields]}; None off GPUs. A diagnostic: it reads XLA's
  private client, and says so in 'error' where that fails."""
  devices = list(devices)
  if devices[0].platform != "gpu":
    return None
  try:
    text = xla_client.get_topology_for_devices(devices).target_config
  except Exception as e:  # pylint: disable=broad-except
    return {"error": _first_line(e)}
  out = {"device_kind": devices[0].device_kind, "device": _card_fields(text)}
  chip = _chip_of(devices[0])
  if chip is not None:
    out["shipped"] = _card_fields(target_config_text(chip))
    out["differ"] = sorted(f for f in out["device"]
                           if out["device"][f] != out["shipped"][f])
  return out


def local_target(devices=None) -> Target | None:
  """The TPU or NVIDIA GPUs this process runs on, as a Target (memory as the
  runtime reports it), or None off them or on a chip the tables lack."""
  devices = list(jax.devices() if devices is None else devices)
  chip = _chip_of(devices[0])
  if chip is None:
    return None
  try:
    hbm = int(devices[0].memory_stats()["bytes_limit"])
  except Exception:  # pylint: disable=broad-except
    hbm = None
  n = len(devices)
  chips = n // 2 if chip.name == "v4" and n > 1 else n
  return _target(f"{chip.name} ({n} devices)", chip, devices[0].device_kind,
                 chips, devices, hbm)


def _first_line(e: BaseException) -> str:
  lines = [l for l in str(e).splitlines() if l.strip()]
  return lines[0] if lines else type(e).__name__


@dataclasses.dataclass
class Program:
  """One compiled program of a run, with its abstract arguments.

  `fn` is the jitted function the run calls, `args`/`kwargs` what it is
  called with (jax.ShapeDtypeStruct leaves with shardings; static keyword
  arguments). `model_flops` and `bytes_accessed` are for the whole program
  (all chips) and per chip respectively; `while_trips` is the trip count its
  while loops are counted with (the decode loop's steps); `limit_bytes` the
  per-chip HBM bytes of its physical limit (module doc; None: not known);
  `steps` the training steps one call serves (a teacher rollout decoded
  ahead for several steps, rollout.decode_ahead: a step's share of the
  call's time is bound / steps).
  """
  name: str
  fn: Callable
  args: tuple
  kwargs: dict = dataclasses.field(default_factory=dict)
  model_flops: float = 0.0
  bytes_accessed: float = 0.0
  resident_bytes: int = 0
  while_trips: int = 1
  limit_bytes: float | None = None
  steps: int = 1

  def trace(self):
    return self.fn.trace(*self.args, **self.kwargs)


def _is_jaxpr(x) -> bool:
  return isinstance(x, (jax.extend.core.Jaxpr, jax.extend.core.ClosedJaxpr))


def _inner(x):
  return x.jaxpr if isinstance(x, jax.extend.core.ClosedJaxpr) else x


def jaxpr_flops(jaxpr, while_trips: int = 1) -> float:
  """Matrix-product FLOPs of a jaxpr: 2 x output size x contracted size per
  dot_general, scan bodies times their length, while bodies times
  `while_trips`, the costlier branch of a cond, and every other sub-jaxpr
  (jit, remat, custom derivatives) once."""
  total = 0.0
  for eqn in _inner(jaxpr).eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      (lc, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      out = eqn.outvars[0].aval.shape
      total += 2.0 * math.prod(out) * math.prod(lhs[d] for d in lc)
    elif name == "scan":
      total += eqn.params["length"] * jaxpr_flops(eqn.params["jaxpr"], while_trips)
    elif name == "while":
      total += while_trips * jaxpr_flops(eqn.params["body_jaxpr"], while_trips)
    elif name == "cond":
      total += max(jaxpr_flops(b, while_trips) for b in eqn.params["branches"])
    else:
      for v in eqn.params.values():
        for sub in (v if isinstance(v, (tuple, list)) else (v,)):
          if _is_jaxpr(sub):
            total += jaxpr_flops(sub, while_trips)
  return total


def _shard_bytes(x) -> int:
  """Bytes of one device's shard of an abstract array."""
  shape = x.shape
  sh = getattr(x, "sharding", None)
  if sh is not None and hasattr(sh, "shard_shape"):
    shape = sh.shard_shape(x.shape)
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):  # a typed PRNG key
    data = jax.eval_shape(jax.random.key_data,
                          jax.ShapeDtypeStruct(shape, x.dtype))
    return int(math.prod(data.shape)) * data.dtype.itemsize
  return int(math.prod(shape)) * np.dtype(x.dtype).itemsize


def tree_bytes_per_device(tree) -> int:
  """Per-device bytes of a pytree of abstract arrays (with shardings)."""
  return sum(_shard_bytes(x) for x in jax.tree.leaves(tree)
             if hasattr(x, "shape") and hasattr(x, "dtype"))


_OOM = re.compile(r"memory required for HLO temporaries \(([\d.]+)([KMGT]?)\)")
_UNITS = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def _oom_temp_bytes(msg: str) -> float | None:
  m = _OOM.search(msg)
  return None if m is None else float(m.group(1)) * _UNITS[m.group(2)]


# Memory analyses are kept here by program: compiling a real program for a
# TPU takes minutes on a small host, and a sweep's arms share most programs.
CACHE_DIR = os.path.join("~", ".cache", "jaxdistill", "compile_only")


def program_key(lowered, t: Target) -> str:
  """What a program's report depends on: its StableHLO with the value of
  every constant masked but whole numbers (a learning rate or a
  temperature changes no buffer; a loop bound changes the collectives'
  trips), the devices it is laid out on, and the compiler's version."""
  text = re.sub(r"dense<(?!-?\d+>)[^>]*>", "dense<_>", lowered.as_text())
  ids = ",".join(str(getattr(d, "id", d)) for d in t.devices)
  card = target_config_text(t.chip) if t.chip.target_config else ""
  blob = "\n".join([jax.__version__, compiler_version(t.chip.platform),
                    f"collectives {collectives.VERSION}", t.topology, ids,
                    card, text])
  return hashlib.sha256(blob.encode()).hexdigest()[:32]


def compiler_version(platform: str) -> str:
  """The version of the package that holds `platform`'s compiler: libtpu,
  or the CUDA plugin (cuda12 or cuda13)."""
  names = (("libtpu",) if platform == "tpu" else
           ("jax-cuda12-plugin", "jax-cuda13-plugin"))
  for n in names:
    try:
      return f"{n} {metadata.version(n)}"
    except metadata.PackageNotFoundError:
      pass
  return "none"


def _memory(lowered, name, args, n_dev: int) -> dict:
  """XLA's memory analysis of the compiled program and its collectives'
  bytes (collectives.count), or, when the compiler runs out of memory, the
  temporaries it reports and the arguments counted from their shardings."""
  try:
    compiled = lowered.compile()
  except Exception as e:  # pylint: disable=broad-except
    temp = _oom_temp_bytes(str(e))
    if temp is None:
      raise RuntimeError(f"{name}: the compiler failed: {_first_line(e)}") from e
    return {"argument_bytes": tree_bytes_per_device(args), "output_bytes": None,
            "temp_bytes": int(temp), "alias_bytes": None,
            "compile_error": "out of memory", "ici_bytes": None}
  ma = compiled.memory_analysis()
  try:
    ici = collectives.count(compiled.as_text(), n_dev)
  except Exception as e:  # pylint: disable=broad-except
    # HLO text this reader does not know must not stop a fit check.
    logging.warning("%s: collectives not counted: %s", name, _first_line(e))
    ici = {"ici_bytes": None, "ici_error": _first_line(e)}
  return {"argument_bytes": int(ma.argument_size_in_bytes),
          "output_bytes": int(ma.output_size_in_bytes),
          "temp_bytes": int(ma.temp_size_in_bytes),
          "alias_bytes": int(ma.alias_size_in_bytes), **ici}


def compile_program(p: Program, t: Target, *, cache_dir: str | None = None) -> dict:
  """Compiles one program for `t`; returns its report row (module doc).
  With `cache_dir`, a program compiled before (program_key) is not compiled
  again: its memory analysis is read back."""
  t0 = time.perf_counter()
  traced = p.trace()
  flops = jaxpr_flops(traced.jaxpr, p.while_trips) / len(t.devices)
  lowered = traced.lower()
  mem, path = None, None
  if cache_dir:
    path = os.path.join(os.path.expanduser(cache_dir),
                        program_key(lowered, t) + ".json")
    if os.path.isfile(path):
      with open(path) as f:
        mem = dict(json.load(f), cached=True)
      if "ici_bytes" not in mem:  # written before the ICI count
        mem = None
  if mem is None:
    mem = _memory(lowered, p.name, (p.args, p.kwargs), len(t.devices))
    if path:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      tmp = f"{path}.{os.getpid()}.tmp"  # processes may race on one program
      with open(tmp, "w") as f:
        json.dump(mem, f)
      os.replace(tmp, path)
  row = {"name": p.name, **mem, "steps": int(p.steps)}
  if mem.get("compile_error"):
    total = mem["argument_bytes"] + mem["temp_bytes"] + p.resident_bytes
  else:
    total = (mem["argument_bytes"] + mem["output_bytes"] - mem["alias_bytes"]
             + mem["temp_bytes"] + p.resident_bytes)
  hbm = t.hbm_bytes
  terms = {"compute": flops / t.peak_flops,
           "memory": p.bytes_accessed / t.hbm_bandwidth}
  if mem.get("ici_bytes") is not None and t.ici_in_bandwidth:
    terms["ici"] = mem["ici_bytes"] / t.ici_in_bandwidth
  bound_by = max(terms, key=terms.get)
  bound = terms[bound_by]
  model = p.model_flops / len(t.devices)
  limit = (None if p.limit_bytes is None else
           max(model / t.peak_flops, p.limit_bytes / t.hbm_bandwidth))
  row.update(
      resident_bytes=int(p.resident_bytes), total_bytes=int(total),
      hbm_bytes=hbm, fits=total <= (1.0 - HEADROOM) * hbm,
      headroom=1.0 - total / hbm, flops=flops, model_flops=model,
      bytes_accessed=float(p.bytes_accessed), compute_s=terms["compute"],
      memory_s=terms["memory"], ici_s=terms.get("ici"),
      step_time_bound_s=bound, bound_by=bound_by,
      mfu_ceiling=(model / t.peak_flops) / bound if bound > 0 else None,
      limit_s=limit,
      bound_over_limit=bound / limit if limit else None,
      compile_s=round(time.perf_counter() - t0, 1))
  return row


def compile_programs(programs: Sequence[Program], t: Target, *,
                     log=None, cache_dir: str | None = CACHE_DIR) -> dict:
  """Compiles every program for `t` -> the report: {topology, chips,
  devices, hbm_bytes_per_chip, programs: [row, ...]} (rows per device).
  Programs compiled before are read back from `cache_dir` (None: always
  compile)."""
  log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
  rows = []
  for i, p in enumerate(programs):
    log(f"compiling {p.name} for {t.name} ({i + 1}/{len(programs)}) ...")
    rows.append(compile_program(p, t, cache_dir=cache_dir))
    log(f"  {p.name}: {rows[-1]['total_bytes'] / GiB:.2f} GiB per device"
        + (" (compiled before)" if rows[-1].get("cached") else
           f", {rows[-1]['compile_s']:.0f} s"))
  return {"topology": t.name, "topology_desc": t.topology, "chips": t.chips,
          "devices": len(t.devices), "hbm_bytes_per_chip": t.chip.hbm_bytes,
          "hbm_bytes_per_device": t.hbm_bytes,
          "peak_flops_per_chip": t.chip.peak_flops,
          "hbm_bandwidth_per_chip": t.chip.hbm_bandwidth,
          "ici_bandwidth_per_chip": t.chip.ici_bandwidth,
          "platform": t.chip.platform,
          "device_kind": getattr(t.devices[0], "device_kind", t.chip.name),
          **({"memory_fraction": t.hbm_bytes / t.chip.hbm_bytes,
              "memory_fraction_env": MEM_FRACTION_ENV}
             if t.chip.platform == "gpu" else {}),
          "headroom_required": HEADROOM, "programs": rows}


def _gb(x) -> str:
  return "-" if x is None else f"{x / 1e9:.3g}"


def format_report(report: dict) -> str:
  """The report as a table (GB = 1e9 bytes, per chip)."""
  if report.get("platform") == "gpu":
    hosts = int(report["topology_desc"].split(":")[1].split("x")[0])
    head = (f"{report['topology']} ({report['chips']} x {report['device_kind']}"
            f" on {hosts} machine{'s' if hosts > 1 else ''}; "
            f"{report['hbm_bytes_per_device'] / GiB:.1f} GiB per GPU: JAX's "
            f"allocator pool, {report['memory_fraction_env']}="
            f"{report['memory_fraction']:.2g} of "
            f"{report['hbm_bytes_per_chip'] / GiB:.1f} GiB; fits = "
            f"{1 - HEADROOM:.0%} of the pool or less; ICI = NVLink)")
  else:
    head = (f"{report['topology']} ({report['topology_desc']}, "
            f"{report['chips']} chips, {report['hbm_bytes_per_device'] / GiB:.1f} "
            f"GiB HBM per device; fits = {1 - HEADROOM:.0%} of it or less)")
  cols = ("program", "args GB", "out GB", "temp GB", "resident GB",
          "total GB", "fits", "headroom", "TFLOP", "ICI GB", "bound ms",
          "limit ms", "MFU ceiling")
  lines = [head, " | ".join(cols)]
  for r in report["programs"]:
    lines.append(" | ".join([
        r["name"], _gb(r["argument_bytes"]), _gb(r["output_bytes"]),
        _gb(r["temp_bytes"]), _gb(r["resident_bytes"]), _gb(r["total_bytes"]),
        ("yes" if r["fits"] else "NO") + (" (compile: out of memory)"
                                          if r.get("compile_error") else ""),
        f"{r['headroom']:.0%}", f"{r['flops'] / 1e12:.2f}", _ici(r),
        f"{r['step_time_bound_s'] * 1e3:.1f} ({r['bound_by']})",
        "-" if r.get("limit_s") is None else
        f"{r['limit_s'] * 1e3:.1f} (bound {r['bound_over_limit']:.1f}x)",
        "-" if r["mfu_ceiling"] is None else f"{r['mfu_ceiling']:.2f}"]))
  # What the command adds: the disk its run(s) need (train/disk.py).
  lines += report.get("disk_lines", [])
  lines += report.get("cost_lines", [])  # a sweep's chip-hours (sweep/cost.py)
  return "\n".join(lines)


def _ici(r) -> str:
  """ICI GB of a row; '>= ' where a loop's trip count is unknown."""
  if r.get("ici_bytes") is None:
    return "-"
  return ("" if r.get("ici_complete", True) else ">= ") + _gb(r["ici_bytes"])


def check(report: dict, advice: Callable[[dict], str] | None = None) -> None:
  """Raises FitError naming the first program that does not fit, its need
  and `advice(row)` (what would help)."""
  for r in report["programs"]:
    if not r["fits"]:
      need = r["total_bytes"] / GiB
      have = report["hbm_bytes_per_device"] / GiB
      extra = f"; {advice(r)}" if advice else ""
      if report.get("platform") == "gpu":
        extra += (f"; or give JAX's allocator more of the card "
                  f"({report['memory_fraction_env']}, now "
                  f"{report['memory_fraction']:.2g}; what it leaves holds "
                  "CUDA's own workspaces)")
      raise FitError(
          f"{r['name']} does not fit {report['topology']}: it needs "
          f"{need:.1f} GiB per chip of {have:.1f} GiB (at most "
          f"{(1 - HEADROOM) * have:.1f} GiB to leave {HEADROOM:.0%} free){extra}")


def check_on_devices(programs: Sequence[Program], devices, advice=None) -> None:
  """A run's fit check on the TPU or GPUs it runs on, before it loads
  weights: compiles its programs for those devices and raises FitError (one
  line) if one does not fit. Nothing happens on CPU. The compilations go to
  JAX's persistent cache, where the run's own calls find them."""
  t = local_target(devices)
  if t is None:
    return
  ensure_persistent_cache()
  report = compile_programs(programs, t, log=lambda m: logging.info("%s", m),
                            cache_dir=None)
  check(report, advice=advice)


def ensure_persistent_cache() -> None:
  """Turns on JAX's persistent compilation cache when the user has not
  (~/.cache/jaxdistill/xla): a run's fit check compiles its programs ahead
  of time, and the run's own calls then find them there instead of
  compiling again (also after a preemption)."""
  if not jax.config.jax_compilation_cache_dir:
    jax.config.update("jax_compilation_cache_dir", os.path.expanduser(
        "~/.cache/jaxdistill/xla"))


def emit(report: dict, as_json: bool, out=None) -> None:
  """Prints the report: one JSON object, or the table."""
  out = out or sys.stdout
  if as_json:
    print(json.dumps(report, indent=1, default=_json_default), file=out)
  else:
    print(format_report(report), file=out)


def _json_default(x: Any):
  if isinstance(x, (np.integer,)):
    return int(x)
  if isinstance(x, (np.floating,)):
    return float(x)
  if isinstance(x, np.bool_):
    return bool(x)
  return str(x)


def define_flags(flag_values=flags.FLAGS) -> None:
  """--compile_only TARGET and --json: compile the command's programs for a
  TPU slice or NVIDIA GPUs on this host and report their memory (this
  module). Shared by train, rl.train, sweep, evaluate and teacher_cache."""
  flags.DEFINE_string(
      "compile_only", None,
      "Compile every program of the run for this TPU slice (v5e-8, v6e-8, "
      "v5p-8, v4-8, ... or a topology like v5e:2x4) or these NVIDIA GPUs "
      "(h100-1, h100-8, a100-80g-8, h200-8, h100-2x8: machines x GPUs) on "
      "this host, without weights, data or an accelerator; print per-device "
      "memory, FLOPs and the roofline bound, and fail in one line if one does "
      "not fit. Needs libtpu (pip install -e '.[tpu]') or the CUDA plugin "
      "(pip install -e '.[cuda]').", flag_values=flag_values)
  flags.DEFINE_bool("json", False, "--compile_only: print the report as one "
                    "JSON object.", flag_values=flag_values)
  flags.register_validator("compile_only", _check_slice, flag_values=flag_values)


def _check_slice(name) -> bool:
  """Refuses a slice at parse time: an empty `--compile_only=` would
  otherwise be falsy and run the command for real."""
  if name is None:
    return True
  try:
    parse_slice(name)
  except ValueError as e:
    raise flags.ValidationError(str(e)) from None
  return True
