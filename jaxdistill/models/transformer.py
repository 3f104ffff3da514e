"""Flax Linen modules of the Llama 3 / Qwen2.5 decoder.

Used only through `jaxdistill.models.model` (init/apply over plain dicts).
The decoder layers are one `nn.scan` over stacked parameters ([L, ...] leaves,
logical axis 'layers'), so compile time does not grow with depth.

Einsum letters:
  B batch, T query positions, S key positions (cache slots), D hidden_size,
  N query heads, K kv heads, G = N // K query heads per kv head, H head_dim,
  F intermediate_size, V vocab, L layers.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import flax.linen as nn
import jax
from jax import lax
import jax.numpy as jnp

from jaxdistill.models import quant
from jaxdistill.models import rope
from jaxdistill.models.config import ModelConfig

_NEG = -0.7 * float(jnp.finfo(jnp.float32).max)  # finite, so all-pad rows stay finite

_REMAT = {
    "full": None,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


def _pin(shard, x, *logical, site=None):
  """x constrained to its logical axes by `shard` (sharding.Activations), or
  as it is when the model runs without one; `site` tells a decode step's
  attention pins from the rest (sharding.DecodeActivations)."""
  return x if shard is None else shard(x, *logical, site=site)


def _normal(stddev=0.02):
  return nn.initializers.normal(stddev)


class _Param(nn.Module):
  """A module holding one parameter, for HF-like nesting (embed_tokens/...)."""
  leaf: str
  shape: Sequence[int]
  axes: Sequence[str | None]
  param_dtype: str = "float32"

  @nn.compact
  def __call__(self):
    return self.param(self.leaf, nn.with_logical_partitioning(
        _normal(), tuple(self.axes)), tuple(self.shape), self.param_dtype)


class Linear(nn.Module):
  """y = x . kernel (+ bias), contracting x's trailing len(in_shape) dims;
  + (x . lora_a) . lora_b when the params hold LoRA adapters (models/lora.py).
  The kernel may be held as NF4 codes and absmaxes (models/quant.py)."""
  in_shape: Sequence[int]
  out_shape: Sequence[int]
  axes: Sequence[str | None]  # logical names of kernel dims (in + out)
  use_bias: bool = False
  dtype: str = "float32"
  param_dtype: str = "float32"
  # Contract the kernel as stored ([in, *out], one input dim) instead of as
  # a [n_in, n_out] matrix: a decode layout may split an output dim that
  # the flattening would merge with another (q_proj's head_dim under 28
  # heads), which the compiler could only do by gathering the kernel.
  keep_out_dims: bool = False

  @nn.compact
  def __call__(self, x):
    shape = tuple(self.in_shape) + tuple(self.out_shape)
    n_in, n_out = math.prod(self.in_shape), math.prod(self.out_shape)
    if self.has_variable("params", quant.CODES):
      # A frozen NF4 base (models/quant.py): dequantised to the dtype it was
      # loaded in, as bitsandbytes does, then cast like any kernel.
      kernel = quant.dequantize(self.get_variable("params", quant.CODES),
                                self.get_variable("params", quant.ABSMAX),
                                self.param_dtype, axis=0)
    else:
      kernel = self.param("kernel", nn.with_logical_partitioning(
          _normal(), tuple(self.axes)), shape, self.param_dtype)
    # As one 2-D matmul: XLA:CPU runs dot_generals with several contracting
    # dims (the weight gradient of a [B, T, ...] input) far slower.
    lead = x.shape[:x.ndim - len(self.in_shape)]
    x2 = x.reshape(-1, n_in)
    keep = self.keep_out_dims and len(self.in_shape) == 1
    # [n, in] x [in, *out] with no output dims merged, or as one 2-D matmul.
    mul = ((lambda u, w: lax.dot_general(u, w, (((1,), (0,)), ((), ()))))
           if keep else (lambda u, w: u @ w.reshape(-1, n_out)))
    y = mul(x2, kernel.astype(self.dtype) if keep
            else kernel.astype(self.dtype).reshape(n_in, n_out))
    if self.has_variable("params", "lora_a"):
      # LoRA (models/lora.py): + (x A) (scale B), never materialising A B.
      a = self.get_variable("params", "lora_a").astype(self.dtype)
      b = self.get_variable("params", "lora_b").astype(self.dtype)
      r = a.shape[-1]
      y = y + mul(x2 @ a.reshape(n_in, r),
                  b.reshape(r, *self.out_shape) if keep else b.reshape(r, n_out))
    y = y.reshape(*lead, *self.out_shape)
    if self.use_bias:
      bias = self.param("bias", nn.with_logical_partitioning(
          nn.initializers.zeros_init(), tuple(self.axes[len(self.in_shape):])),
                        tuple(self.out_shape), self.param_dtype)
      y = y + bias.astype(self.dtype)
    return y


class RMSNorm(nn.Module):
  """HF RMSNorm: statistics in float32, scale applied in the compute dtype."""
  eps: float
  dtype: str = "float32"
  param_dtype: str = "float32"

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.with_logical_partitioning(
        nn.initializers.ones_init(), (None,)), (x.shape[-1],), self.param_dtype)
    x32 = x.astype(jnp.float32)
    x32 = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return scale.astype(self.dtype) * x32.astype(self.dtype)


class Attention(nn.Module):
  """Grouped-query self-attention with RoPE and an optional stacked KV cache."""
  cfg: ModelConfig
  shard: Any = None

  @nn.compact
  def __call__(self, x, positions, mask, cache, index, layer):
    # x [B, T, D]; positions [B, T]; mask [B, T, S] bool; cache None or
    # k [L, B, K, S, H], v [L, B, K, H, S]; index: cache write slot; layer: scan index.
    c = self.cfg
    d, n, k, h = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    kw = dict(dtype=c.dtype, param_dtype=c.param_dtype, use_bias=c.attention_bias,
              keep_out_dims=getattr(self.shard, "KEEP_OUT_DIMS", False))
    q = Linear((d,), (n, h), ("embed", "heads", "head_dim"), name="q_proj", **kw)(x)
    kk = Linear((d,), (k, h), ("embed", "kv_heads", "head_dim"), name="k_proj", **kw)(x)
    vv = Linear((d,), (k, h), ("embed", "kv_heads", "head_dim"), name="v_proj", **kw)(x)
    # A decode step only (sharding.DecodeActivations): as the projections
    # leave them (split as their weights' outputs), then onto the KV cache's
    # rows before RoPE, whose rotation pairs dims of head_dim that a decode
    # layout may hold on different chips.
    out = dict(site="proj_out")
    q = _pin(self.shard, q, "batch", "seq", "heads", "head_dim", **out)
    kk = _pin(self.shard, kk, "batch", "seq", "kv_heads", "head_dim", **out)
    vv = _pin(self.shard, vv, "batch", "seq", "kv_heads", "head_dim", **out)
    raw = dict(site="attention_in")
    q = _pin(self.shard, q, "batch", "seq", "heads", "head_dim", **raw)
    kk = _pin(self.shard, kk, "batch", "seq", "kv_heads", "head_dim", **raw)
    vv = _pin(self.shard, vv, "batch", "seq", "kv_heads", "head_dim", **raw)
    inv_freq = rope.inv_frequencies(c)
    q = rope.apply_rope(q, positions, inv_freq)  # [B, T, N, H]
    kk = rope.apply_rope(kk, positions, inv_freq)  # [B, T, K, H]
    attn = dict(site="attention")  # where they meet the KV cache's layout
    q = _pin(self.shard, q, "batch", "seq", "heads", "head_dim", **attn)
    kk = _pin(self.shard, kk, "batch", "seq", "kv_heads", "head_dim", **attn)
    vv = _pin(self.shard, vv, "batch", "seq", "kv_heads", "head_dim", **attn)

    b, t = x.shape[:2]
    q = q.reshape(b, t, k, c.num_groups, h)  # [B, T, K, G, H]
    if cache is None:
      scores = jnp.einsum("BTKGH,BSKH->BKGTS", q, kk,
                          preferred_element_type=jnp.float32)
    else:
      # Keys [L, B, K, S, H] and values [L, B, K, H, S]: the contracted dim
      # (H for q.k, S for p.v) is minor, the layout XLA:CPU's dot kernels
      # read in place (a [L, B, S, K, H] cache was transposed, i.e. read
      # and rewritten whole, at every decode step).
      kc, vc = cache
      new_k = kk.astype(kc.dtype).transpose(0, 2, 1, 3)[None]  # [1, B, K, T, H]
      new_v = vv.astype(vc.dtype).transpose(0, 2, 3, 1)[None]  # [1, B, K, H, T]
      kc = lax.dynamic_update_slice(kc, new_k, (layer, 0, 0, index, 0))
      vc = lax.dynamic_update_slice(vc, new_v, (layer, 0, 0, 0, index))
      cache = (kc, vc)
      kk = lax.dynamic_index_in_dim(kc, layer, 0, keepdims=False).astype(c.dtype)
      vv = lax.dynamic_index_in_dim(vc, layer, 0, keepdims=False).astype(c.dtype)
      scores = jnp.einsum("BTKGH,BKSH->BKGTS", q, kk,
                          preferred_element_type=jnp.float32)
    scores = scores * (h ** -0.5)
    scores = jnp.where(mask[:, None, None], scores, _NEG)
    probs = jax.nn.softmax(scores, axis=-1).astype(c.dtype)
    if cache is None:
      out = jnp.einsum("BKGTS,BSKH->BTKGH", probs, vv)
    else:
      out = jnp.einsum("BKGTS,BKHS->BTKGH", probs, vv)
    out = _pin(self.shard, out.reshape(b, t, n, h), "batch", "seq", "heads",
               "head_dim", site="attention_out")
    out = Linear((n, h), (d,), ("heads", "head_dim", "embed"), name="o_proj",
                 dtype=c.dtype, param_dtype=c.param_dtype)(out)
    return _pin(self.shard, out, "batch", "seq", "embed", site="proj_out"), cache


class MLP(nn.Module):
  cfg: ModelConfig
  shard: Any = None

  @nn.compact
  def __call__(self, x):
    c = self.cfg
    kw = dict(dtype=c.dtype, param_dtype=c.param_dtype)
    d, f = c.hidden_size, c.intermediate_size
    gate = Linear((d,), (f,), ("embed", "mlp"), name="gate_proj", **kw)(x)
    up = Linear((d,), (f,), ("embed", "mlp"), name="up_proj", **kw)(x)
    h = _pin(self.shard, nn.silu(gate) * up, "batch", "seq", "mlp")
    y = Linear((f,), (d,), ("mlp", "embed"), name="down_proj", **kw)(h)
    return _pin(self.shard, y, "batch", "seq", "embed", site="proj_out")


class DecoderLayer(nn.Module):
  """One pre-norm block; signature fits nn.scan (carry, *broadcast, layer)."""
  cfg: ModelConfig
  shard: Any = None

  @nn.compact
  def __call__(self, carry, positions, mask, index, layer):
    c = self.cfg
    x, cache = carry
    pin = lambda y: _pin(self.shard, y, "batch", "seq", "embed")
    kw = dict(eps=c.rms_norm_eps, dtype=c.dtype, param_dtype=c.param_dtype)
    h, cache = Attention(c, self.shard, name="self_attn")(
        RMSNorm(name="input_layernorm", **kw)(pin(x)), positions, mask, cache,
        index, layer)
    x = pin(x + h)
    x = x + MLP(c, self.shard, name="mlp")(
        RMSNorm(name="post_attention_layernorm", **kw)(x))
    return (pin(x), cache), None


class Transformer(nn.Module):
  """tokens -> final-normed hidden states [B, T, D] (+ updated (k, v) cache).

  `shard` (a sharding.Activations, or None) pins the activations to the
  mesh by logical axes: the residual stream ('batch', 'seq', 'embed'), the
  attention heads and the MLP's hidden layer.
  """
  cfg: ModelConfig
  shard: Any = None

  @nn.compact
  def __call__(self, tokens, positions, mask, cache=None, index=0):
    c = self.cfg
    embedding = _Param("embedding", (c.vocab_size, c.hidden_size),
                       ("vocab", "embed"), c.param_dtype, name="embed_tokens")()
    x = jnp.take(embedding, tokens, axis=0).astype(c.dtype)  # [B, T, D]
    x = _pin(self.shard, x, "batch", "seq", "embed")

    layer_cls = DecoderLayer
    if c.remat != "none":
      layer_cls = nn.remat(layer_cls, policy=_REMAT[c.remat], prevent_cse=False)
    stack = nn.scan(
        layer_cls,
        variable_axes={"params": 0},
        split_rngs={"params": True},
        in_axes=(nn.broadcast, nn.broadcast, nn.broadcast, 0),
        length=c.num_hidden_layers,
        unroll=c.scan_unroll,
        metadata_params={nn.PARTITION_NAME: "layers"},
    )(c, self.shard, name="layers")
    layers = jnp.arange(c.num_hidden_layers, dtype=jnp.int32)
    (x, cache), _ = stack((x, cache), positions, mask, index, layers)
    x = RMSNorm(c.rms_norm_eps, c.dtype, c.param_dtype, name="norm")(x)
    x = _pin(self.shard, x, "batch", "seq", "embed")
    if not c.tie_word_embeddings:
      # Created here so init makes it; apply() multiplies by it outside.
      _Param("kernel", (c.hidden_size, c.vocab_size), ("embed", "vocab"),
             c.param_dtype, name="lm_head")()
    return x, cache
