"""Benchmark presets (`--preset NAME`) and the machine's limits they are judged by.

A preset names a student/teacher pair and the shapes of one benchmark step:

  tiny             two small Llama models, float32: what the CPU tests run
  qwen-0.5b-1.5b   Qwen2.5-0.5B student, Qwen2.5-1.5B teacher (the study's
                   Qwen pair), random weights, bfloat16: for a GPU or TPU
  llama-1b-8b      Llama-3.2-1B student, Llama-3.1-8B teacher, bfloat16

Weights are random (nothing is downloaded): speed does not depend on them.

The limits are measured in the same process on the default backend, so a
figure is always a fraction of what this device did a moment earlier:
`matmul_rate(dtype)` (FLOP/s of one large jitted matmul) and
`copy_bandwidth()` (bytes/s read + written by a jitted copy of a large array).
"""
from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp

from jaxdistill import models

_TINY = models.ModelConfig(
    family="llama", vocab_size=2048, hidden_size=64, intermediate_size=192,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, max_position_embeddings=1024, dtype="float32",
    param_dtype="float32")


@dataclasses.dataclass(frozen=True)
class Preset:
  name: str
  student: models.ModelConfig
  teacher: models.ModelConfig
  batch: int          # sequences per step (training) / per decode batch
  seq: int            # training sequence length (prompt + response)
  prompt_len: int     # decode benchmarks: prompt tokens
  new_tokens: int     # decode benchmarks: tokens generated
  dtype: str          # activations (and parameters) of both models


def _with_dtype(cfg: models.ModelConfig, dtype: str) -> models.ModelConfig:
  return dataclasses.replace(cfg, dtype=dtype, param_dtype=dtype)


def _tiny():
  teacher = dataclasses.replace(_TINY, hidden_size=128, intermediate_size=384)
  return Preset("tiny", _TINY, teacher, batch=2, seq=64, prompt_len=16,
                new_tokens=16, dtype="float32")


def _pair(name, student, teacher, **shape):
  dtype = "bfloat16"
  return Preset(name, _with_dtype(models.get_preset(student), dtype),
                _with_dtype(models.get_preset(teacher), dtype), dtype=dtype,
                **shape)


PRESETS = {
    "tiny": _tiny,
    "qwen-0.5b-1.5b": lambda: _pair(
        "qwen-0.5b-1.5b", "qwen2.5-0.5b", "qwen2.5-1.5b", batch=8, seq=1024,
        prompt_len=256, new_tokens=256),
    "llama-1b-8b": lambda: _pair(
        "llama-1b-8b", "llama-3.2-1b", "llama-3.1-8b", batch=4, seq=1024,
        prompt_len=256, new_tokens=256),
}


def get(name: str) -> Preset:
  if name not in PRESETS:
    raise ValueError(f"--preset: unknown {name!r}; choose from {sorted(PRESETS)}")
  return PRESETS[name]()


def _best_time(fn, reps: int) -> float:
  fn()  # compile and warm up
  best = float("inf")
  for _ in range(reps):
    t0 = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t0)
  return best


def matmul_rate(dtype: str = "float32", n: int | None = None,
                reps: int = 5) -> float:
  """FLOP/s of a jitted n x n x n matmul in `dtype` on the default device
  (n: 2048 on CPU, 8192 on accelerators)."""
  if n is None:
    n = 2048 if jax.default_backend() == "cpu" else 8192
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), dtype)
  f = jax.jit(jnp.matmul)
  return 2 * n**3 / _best_time(lambda: f(a, b).block_until_ready(), reps)


def copy_bandwidth(nbytes: int | None = None, reps: int = 5) -> float:
  """Bytes/s (read + write) of a jitted elementwise pass over a large float32
  array on the default device (256 MiB on CPU, 2 GiB on accelerators), in
  place (donated), so that allocating and faulting in a fresh output is not
  timed."""
  if nbytes is None:
    nbytes = (256 << 20) if jax.default_backend() == "cpu" else (2 << 30)
  f = jax.jit(lambda v: v + 1.0, donate_argnums=0)
  box = [jnp.ones((nbytes // 4,), jnp.float32)]

  def step():
    box[0] = f(box[0])
    box[0].block_until_ready()
  return 2 * nbytes / _best_time(step, reps)
