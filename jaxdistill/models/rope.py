"""Rotary position embeddings, with Llama 3 frequency scaling.

Rotation uses the HF 'rotate_half' layout: the head dim is split in two halves
(x1, x2) rather than interleaved pairs.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from jaxdistill.models.config import ModelConfig


def inv_frequencies(cfg: ModelConfig) -> np.ndarray:
  """Inverse frequencies [H/2] as float32 constants, as HF computes them.

  Mirrors transformers' `_compute_default_rope_parameters` and
  `_compute_llama3_parameters` (float32, since HF does the scaling in float32).
  """
  dim = cfg.head_dim
  exps = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
  inv = (np.float32(1.0) / (np.float32(cfg.rope_theta) ** exps)).astype(np.float32)
  d = cfg.rope_scaling_dict
  if d is None:
    return inv
  factor = float(d["factor"])
  low, high = float(d["low_freq_factor"]), float(d["high_freq_factor"])
  old_len = float(d["original_max_position_embeddings"])
  low_wavelen, high_wavelen = old_len / low, old_len / high
  wavelen = (np.float32(2 * math.pi) / inv).astype(np.float32)
  scaled = np.where(wavelen > low_wavelen, inv / np.float32(factor), inv)
  smooth = (old_len / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def apply_rope(x: jnp.ndarray, positions: jnp.ndarray,
               inv_freq: np.ndarray) -> jnp.ndarray:
  """Rotates x [B, T, N, H] by integer positions [B, T]; keeps x.dtype.

  The angles are computed in float32 and cos/sin cast to x.dtype before the
  product, like HF, so bfloat16 results follow the reference too.
  """
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, H/2]
  angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
  cos, sin = jnp.cos(angles).astype(x.dtype), jnp.sin(angles).astype(x.dtype)
  x1, x2 = jnp.split(x, 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  return x * cos + rotated * sin
