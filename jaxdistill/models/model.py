"""Pure functions over parameter pytrees: init, apply, KV cache, logical axes.

Parameters are a plain nested dict; layer parameters are stacked [L, ...]:

  embed_tokens/embedding [V, D]
  layers/input_layernorm/scale [L, D]
  layers/self_attn/{q,k,v}_proj/kernel [L, D, N|K, H]  (+ bias [L, N|K, H])
  layers/self_attn/o_proj/kernel [L, N, H, D]
  layers/post_attention_layernorm/scale [L, D]
  layers/mlp/{gate,up}_proj/kernel [L, D, F];  layers/mlp/down_proj/kernel [L, F, D]
  norm/scale [D]
  lm_head/kernel [D, V]   (absent when tie_word_embeddings)

The KV cache is a plain dict (gemma style), written with dynamic_update_slice
at one write index shared by the batch:

  k      [L, B, K, S, H]  keys      (the contracted dim minor, so that the
  v      [L, B, K, H, S]  values     attention dots read a layer in place)
  mask   [B, S] bool      slot holds a real token (left padding never does)
  pos    [B] int32        number of real tokens so far = next token's position
  index  [] int32         next slot to write
"""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from jaxdistill.models.config import ModelConfig
from jaxdistill.models.transformer import Transformer

CACHE_KEYS = ("k", "v", "mask", "pos", "index")


def _dummy_inputs(cfg):
  tokens = jnp.zeros((1, 1), jnp.int32)
  return tokens, tokens, jnp.ones((1, 1, 1), bool)


def init(cfg: ModelConfig, rng: jax.Array) -> dict:
  """Random parameters (normal(0.02) kernels, unit norms, zero biases)."""
  if not isinstance(cfg, ModelConfig):
    raise ValueError(f"cfg must be a ModelConfig, got {type(cfg).__name__}")
  return _init(cfg, rng)


@functools.partial(jax.jit, static_argnums=0)
def _init(cfg, rng):
  variables = Transformer(cfg).init(rng, *_dummy_inputs(cfg))
  return nn.meta.unbox(variables["params"])


@functools.lru_cache(maxsize=64)
def _boxed_shapes(cfg: ModelConfig):
  return jax.eval_shape(
      lambda: Transformer(cfg).init(jax.random.key(0), *_dummy_inputs(cfg))
  )["params"]


def logical_axes(cfg: ModelConfig):
  """Pytree like init(cfg, rng) whose leaves are tuples of logical axis names."""
  return jax.tree.map(
      lambda b: tuple(b.names), _boxed_shapes(cfg),
      is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))


def param_shapes(cfg: ModelConfig):
  """Pytree like init(cfg, rng) of jax.ShapeDtypeStruct; nothing allocated."""
  return nn.meta.unbox(_boxed_shapes(cfg))


def output_head(cfg: ModelConfig, params) -> jax.Array:
  """The [D, V] output projection (embed_tokens.T when tied)."""
  if cfg.tie_word_embeddings:
    return params["embed_tokens"]["embedding"].T
  return params["lm_head"]["kernel"]


def num_params(params, cfg: ModelConfig | None = None) -> int:
  """Parameter count; a tied output head is one tensor, so counted once."""
  del cfg  # Tied heads are not stored twice, so the tree count is exact.
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def init_cache(cfg: ModelConfig, batch_size: int, max_len: int,
               dtype=None) -> dict:
  """An empty KV cache for `batch_size` rows of up to `max_len` tokens."""
  if batch_size <= 0 or max_len <= 0:
    raise ValueError(f"init_cache: batch_size and max_len must be positive, "
                     f"got {batch_size}, {max_len}")
  dtype = jnp.dtype(dtype or cfg.dtype)
  lbk = (cfg.num_hidden_layers, batch_size, cfg.num_key_value_heads)
  return {
      "k": jnp.zeros(lbk + (max_len, cfg.head_dim), dtype),
      "v": jnp.zeros(lbk + (cfg.head_dim, max_len), dtype),
      "mask": jnp.zeros((batch_size, max_len), bool),
      "pos": jnp.zeros((batch_size,), jnp.int32),
      "index": jnp.zeros((), jnp.int32),
  }


def cache_logical_axes(cfg: ModelConfig) -> dict:
  del cfg
  lbk = ("layers", "batch", "kv_heads")
  return {"k": lbk + ("cache_seq", "head_dim"),
          "v": lbk + ("head_dim", "cache_seq"),
          "mask": ("batch", "cache_seq"), "pos": ("batch",), "index": ()}


def _check_inputs(cfg, tokens, attention_mask, positions, cache):
  if not isinstance(cfg, ModelConfig):
    raise ValueError(f"cfg must be a ModelConfig, got {type(cfg).__name__}")
  if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(f"tokens must be an int array [B, T], got "
                     f"{tokens.dtype}{list(tokens.shape)}")
  for name, x in (("attention_mask", attention_mask), ("positions", positions)):
    if x is not None and tuple(x.shape) != tuple(tokens.shape):
      raise ValueError(f"{name} must have the tokens' shape {tokens.shape}, "
                       f"got {tuple(x.shape)}")
  if cache is not None:
    if not isinstance(cache, dict) or set(cache) != set(CACHE_KEYS):
      got = sorted(cache) if isinstance(cache, dict) else type(cache).__name__
      raise ValueError(f"cache must be a dict from init_cache with keys "
                       f"{CACHE_KEYS}, got {got}")
    l, b, k, s, h = cache["k"].shape
    want = (cfg.num_hidden_layers, tokens.shape[0], cfg.num_key_value_heads,
            cfg.head_dim)
    if (l, b, k, h) != want:
      raise ValueError(f"cache['k'] has shape {cache['k'].shape}; this config "
                       f"and batch need [L, B, K, S, H] = "
                       f"{(want[0], want[1], want[2], 'S', want[3])}")
    if tokens.shape[1] > s:
      raise ValueError(f"tokens length {tokens.shape[1]} exceeds the cache "
                       f"length {s}")


def _exclusive_cumsum(m):
  return jnp.cumsum(m, axis=1) - m


@functools.partial(jax.jit, static_argnums=0,
                   static_argnames=("return_hidden", "shard"))
def apply(cfg: ModelConfig, params, tokens, attention_mask=None, *,
          positions=None, cache=None, return_hidden=False, shard=None):
  """Forward pass (jitted; cfg and return_hidden are static).

  Args:
    cfg: the model config (static under jit).
    params: pytree from init / load_pretrained.
    tokens: int [B, T].
    attention_mask: [B, T], 1 = real token, 0 = (left) padding; default ones.
    positions: int [B, T] RoPE positions; default: the number of real tokens
      before each token in its row (continuing from the cache, if any).
    cache: None, or a dict from init_cache / a previous call. The T tokens are
      written at cache['index']; the caller keeps index + T <= max_len. The
      index is traced, so an overflow cannot raise: it returns all-NaN
      logits (hidden) instead of silently overwriting earlier slots.
    return_hidden: return final-normed hidden states [B, T, D] (compute dtype)
      instead of float32 logits [B, T, V].
    shard: None, or a sharding.Activations (static): activations are pinned
      to its mesh by logical axes (batch over the data axes), the logits as
      ('batch', 'seq', 'vocab'). Numerically a no-op.

  Returns:
    logits (or hidden) without a cache; (logits (or hidden), new_cache) with one.
  """
  tokens = jnp.asarray(tokens)
  _check_inputs(cfg, tokens, attention_mask, positions, cache)
  b, t = tokens.shape
  m = (jnp.ones((b, t), jnp.int32) if attention_mask is None
       else jnp.asarray(attention_mask).astype(jnp.int32))
  module = Transformer(cfg, shard)
  variables = {"params": params}

  if cache is None:
    if positions is None:
      positions = _exclusive_cumsum(m)
    causal = jnp.tril(jnp.ones((t, t), bool))
    mask = causal[None] & (m[:, None, :] > 0)  # [B, T, S=T]
    hidden, _ = module.apply(variables, tokens, positions, mask)
    new_cache = None
  else:
    index = cache["index"]
    if positions is None:
      positions = cache["pos"][:, None] + _exclusive_cumsum(m)
    slot_ok = lax.dynamic_update_slice(cache["mask"], m > 0, (0, index))
    s = slot_ok.shape[1]
    q_slot = index + jnp.arange(t)
    mask = (jnp.arange(s)[None, :] <= q_slot[:, None])[None] & slot_ok[:, None, :]
    hidden, (k, v) = module.apply(variables, tokens, positions, mask,
                                  (cache["k"], cache["v"]), index)
    # dynamic_update_slice clamps the write: poison the result, never wrong
    # numbers that look right.
    hidden = jnp.where(index + t > s, jnp.nan, hidden).astype(hidden.dtype)
    last = jnp.max(jnp.where(m > 0, positions, -1), axis=1)
    new_cache = {
        "k": k, "v": v, "mask": slot_ok,
        "pos": jnp.where(last >= 0, last + 1, cache["pos"]).astype(jnp.int32),
        "index": (index + t).astype(jnp.int32),
    }

  if return_hidden:
    out = hidden
  else:
    with jax.named_scope("lm_head"):  # names the op in profiles
      head = output_head(cfg, params).astype(cfg.dtype)
      if shard is not None:  # FSDP: the head is gathered where it is used
        head = shard(head, None, "vocab")
      # A 2-D matmul (see transformer.Linear); float32 logits for the losses.
      out = jnp.dot(hidden.reshape(b * t, -1), head,
                    preferred_element_type=jnp.float32).reshape(b, t, -1)
      if shard is not None:
        out = shard(out, "batch", "seq", "vocab")
  return out if new_cache is None else (out, new_cache)
