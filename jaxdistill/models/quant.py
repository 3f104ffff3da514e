"""A 4-bit NormalFloat (NF4) frozen base for LoRA: QLoRA's quantisation.

The paper's RLVR stage (App. D.6) trains fresh LoRA adapters on the distilled
checkpoint "loaded in 4 bits". The paper names no format; we take QLoRA's
(Dettmers et al. 2023): NF4 codes over blocks of 64 weights, each block
scaled by its float32 absmax, the bf16 compute dtype, no double quantisation
of the absmaxes (bitsandbytes' BitsAndBytesConfig(load_in_4bit=True,
bnb_4bit_quant_type='nf4', bnb_4bit_compute_dtype=torch.bfloat16), its
default double_quant=False). That choice is ours, named in docs/method.md.

A target projection's kernel [L, *in, *out] (models/model.py) becomes

  kernel_nf4     uint8   [L, n_in // 2, *out]   two codes a byte, the even
                                                input row in the high nibble
  kernel_absmax  float32 [L, n_in // 64, *out]  max |w| of each block

with n_in = prod(in): the input dims flattened row-major, as Hugging Face's
[out, in] weight is, so a block holds the same 64 weights that bitsandbytes
quantises together (blocks run along the input of one output row). Per
block, the rule bitsandbytes applies:

  s    = clip(w * (1 / absmax), -1, 1)                 float32
  code = the index of the NF4 value nearest s (ties to the lower one)
  w'   = round(NF4[code] * absmax)   float32, rounded to the dtype the
                                     weights were loaded in (param_dtype)

transformer.Linear dequantises a kernel it finds in this form before its
matmul; everything else (norms, embeddings, the head, biases) is left as
loaded. Quantisation is deterministic, so a resumed run re-quantises the
same base and only the adapters need saving.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

BLOCK = 64
CODES, ABSMAX = "kernel_nf4", "kernel_absmax"
FORMATS = (None, "nf4")

# The 16 NF4 values (QLoRA, App. E): quantiles of N(0, 1) scaled to [-1, 1],
# with an exact zero.
NF4 = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
    0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0], np.float32)
_MIDS = (NF4[:-1] + NF4[1:]) / np.float32(2)


def check_format(fmt, field: str = "quantize") -> None:
  if fmt not in FORMATS:
    raise ValueError(f"{field} must be one of {FORMATS}, got {fmt!r}")


def _n_in(kernel_shape, n_in_dims: int) -> int:
  return math.prod(kernel_shape[1:1 + n_in_dims])


def quantize_kernel(kernel: jax.Array, n_in_dims: int) -> dict:
  """{CODES, ABSMAX} of one stacked kernel [L, *in, *out] (in: its first
  `n_in_dims` dims after L). ValueError unless prod(in) is a multiple of
  BLOCK (every Llama 3 / Qwen2.5 projection is)."""
  lay, shape = kernel.shape[0], kernel.shape
  n_in, out = _n_in(shape, n_in_dims), shape[1 + n_in_dims:]
  if n_in % BLOCK:
    raise ValueError(f"NF4 quantisation needs the input size ({n_in}) to be a "
                     f"multiple of the block size {BLOCK}")
  x = kernel.astype(jnp.float32).reshape(lay, n_in // BLOCK, BLOCK, *out)
  absmax = jnp.max(jnp.abs(x), axis=2)
  # bitsandbytes divides by max(absmax, 1e-38); XLA flushes that subnormal
  # to 0, so an all-zero block is given s = 0 (code 7, the exact zero) here.
  inv = jnp.where(absmax > 0, 1.0 / jnp.where(absmax > 0, absmax, 1.0), 0.0)
  s = jnp.clip(x * jnp.expand_dims(inv, 2), -1.0, 1.0)
  code = jnp.searchsorted(jnp.asarray(_MIDS), s, side="left").astype(jnp.uint8)
  code = code.reshape(lay, n_in // 2, 2, *out)
  packed = (code[:, :, 0] << 4) | code[:, :, 1]
  return {CODES: packed, ABSMAX: absmax}


def dequantize(codes: jax.Array, absmax: jax.Array, dtype, axis: int = 1
               ) -> jax.Array:
  """The weights [..., n_in, *out] of codes [..., n_in // 2, *out] and absmax
  [..., n_in // BLOCK, *out], the packed input at `axis` (1 with the layer
  axis in front, 0 for one layer's slice): computed in float32 and rounded
  once to `dtype`."""
  idx = jnp.stack([codes >> 4, codes & 0xF], axis=axis + 1)
  head, tail = codes.shape[:axis], codes.shape[axis + 1:]
  n_in, nb = 2 * codes.shape[axis], absmax.shape[axis]
  vals = jnp.asarray(NF4)[idx.astype(jnp.int32)].reshape(
      head + (nb, n_in // nb) + tail)
  w = vals * jnp.expand_dims(absmax.astype(jnp.float32), axis + 1)
  return w.reshape(head + (n_in,) + tail).astype(dtype)


def is_quantized(leaf) -> bool:
  return isinstance(leaf, dict) and CODES in leaf


def quantize_params(params, modules: dict, n_in_of) -> dict:
  """params with the kernel of every projection of `modules` ({target:
  the sub-module of layers/ that holds it}, as models/lora.MODULES)
  replaced by its NF4 form; `n_in_of(target)` is the number of its
  kernel's input dims. Pure (jit it with the shardings of the NF4 leaves'
  logical axes, lora.base_logical_axes)."""
  layers = dict(params["layers"])
  for t, m in modules.items():
    sub = dict(layers[m])
    leaf = {k: v for k, v in sub[t].items() if k != "kernel"}
    sub[t] = {**leaf, **quantize_kernel(sub[t]["kernel"], n_in_of(t))}
    layers[m] = sub
  return {**params, "layers": layers}


def dequantize_params(params, dtype, kernel_shapes) -> dict:
  """params with every NF4 kernel dequantised to `dtype` in its original
  shape (`kernel_shapes(module, target)` -> [L, *in, *out])."""
  layers = dict(params["layers"])
  for m, sub in params["layers"].items():
    if not isinstance(sub, dict):
      continue
    new = dict(sub)
    for t, leaf in sub.items():
      if is_quantized(leaf):
        rest = {k: v for k, v in leaf.items() if k not in (CODES, ABSMAX)}
        w = dequantize(leaf[CODES], leaf[ABSMAX], dtype)
        new[t] = {**rest, "kernel": w.reshape(kernel_shapes(m, t))}
    layers[m] = new
  return {**params, "layers": layers}


def leaf_axes(kernel_axes, n_in_dims: int) -> tuple:
  """The logical axes of CODES / ABSMAX from the kernel's: the flattened
  input takes the name of its first dim (a split of it over the mesh is a
  split of that dim when the mesh divides it)."""
  return (kernel_axes[0], kernel_axes[1]) + tuple(kernel_axes[1 + n_in_dims:])
