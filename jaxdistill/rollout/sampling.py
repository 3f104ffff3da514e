"""Next-token sampling from a batch of logits: greedy, temperature, top-k, top-p.

Order of operations follows transformers' logits processors: divide by the
temperature, keep the `top_k` largest, then keep the smallest prefix (in
descending probability, renormalised over the top-k set) whose mass reaches
`top_p`. The token is then drawn from the softmax of what is kept.

Log-probabilities returned with each token are those of the distribution it
was actually drawn from: tempered, truncated and renormalised. For greedy
decoding (temperature 0) there is no such distribution, so the log-prob is
that of the raw model, log_softmax(logits)[token].

Shapes: B batch rows, V vocabulary, K kept candidates (top_k, or V).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Sampler:
  """Static (shape/branch-deciding) sampling settings; hashable for jit.

  The temperature and top_p values themselves are traced arguments so that
  changing them does not recompile; only whether they are used is static.
  """
  greedy: bool = False
  top_k: int | None = None
  use_top_p: bool = False


def _take(x, idx):
  # x [B, K], idx [B] -> [B]
  return jnp.take_along_axis(x, idx[:, None], axis=-1)[:, 0]


def sample(sampler: Sampler, logits, keys, temperature, top_p):
  """Draws one token per row.

  Args:
    sampler: static settings.
    logits: [B, V] model logits (any float dtype; computed in float32).
    keys: [B] PRNG keys, one per row (unused when greedy).
    temperature: scalar > 0 (ignored when greedy).
    top_p: scalar in (0, 1] (ignored unless sampler.use_top_p).

  Returns:
    tokens [B] int32 and logprobs [B] float32 (see module docstring).
  """
  logits = logits.astype(jnp.float32)
  if sampler.greedy:
    tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return tok, _take(jax.nn.log_softmax(logits, axis=-1), tok)

  x = logits / temperature  # [B, V]
  draw = jax.vmap(jax.random.categorical)
  if sampler.top_k is None and not sampler.use_top_p:
    tok = draw(keys, x).astype(jnp.int32)
    return tok, _take(jax.nn.log_softmax(x, axis=-1), tok)

  # Sampling among the K best directly (instead of masking all V logits)
  # makes top-k exact under ties and keeps the per-step work O(B K).
  k = sampler.top_k if sampler.top_k is not None else x.shape[-1]
  vals, idx = jax.lax.top_k(x, k)  # [B, K] descending, [B, K]
  if sampler.use_top_p:
    probs = jax.nn.softmax(vals, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs  # [B, K]
    # The best candidate has mass_before == 0 and is always kept.
    keep = mass_before < top_p
    keep = keep.at[:, 0].set(True)
    vals = jnp.where(keep, vals, -jnp.inf)
  j = draw(keys, vals).astype(jnp.int32)  # [B] index into K
  return _take(idx, j).astype(jnp.int32), _take(jax.nn.log_softmax(vals, -1), j)
