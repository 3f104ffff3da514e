"""Next-token sampling from a batch of logits: greedy, temperature, top-k, top-p.

Order of operations follows transformers' logits processors: divide by the
temperature, keep the `top_k` largest, then keep the smallest set of the most
likely tokens (probabilities renormalised over the top-k set) whose mass
reaches `top_p`. The token is drawn from the softmax of what is kept.

Drawing is by inverse CDF with one uniform number per row (a two-level search:
blocks of the vocabulary, then tokens within the chosen block). On CPU this is
~50x cheaper than Gumbel-max, which needs V random numbers per row and step.
Probabilities are exact up to float32 rounding of the cumulative sums and the
2^-24 resolution of the uniform draw.

Log-probabilities returned with each token are those of the distribution it
was actually drawn from: tempered, truncated and renormalised. For greedy
decoding (temperature 0) there is no such distribution, so the log-prob is
that of the raw model, log_softmax(logits)[token].

Shapes: B batch rows, V vocabulary, K kept candidates, C blocks of W tokens.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

_BLOCK = 256  # W: tokens per block of the two-level inverse-CDF search


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
  # x [B, M], idx [B] -> [B]
  return jnp.take_along_axis(x, idx[:, None], axis=-1)[:, 0]


def _first_argmax(x):
  """argmax over the last axis (lowest index on ties); two plain reductions
  are several times faster than XLA's CPU argmax."""
  m = jnp.max(x, axis=-1, keepdims=True)
  iota = jnp.arange(x.shape[-1], dtype=jnp.int32)
  return jnp.min(jnp.where(x == m, iota, x.shape[-1]), axis=-1).astype(jnp.int32)


def _last_positive(w):
  # w [B, M] -> [B]: index of the last entry > 0 (0 if none).
  iota = jnp.arange(w.shape[-1], dtype=jnp.int32)
  return jnp.max(jnp.where(w > 0, iota, 0), axis=-1)


def draw(weights, u):
  """Index i with probability weights[i] / sum(weights), per row.

  Args:
    weights: [B, M] non-negative, at least one positive per row.
    u: [B] uniform in [0, 1).

  Returns:
    idx [B] int32 (never an index with zero weight) and the row sums [B].
  """
  b, m = weights.shape
  w_blk = min(_BLOCK, m)
  c = -(-m // w_blk)
  w = jnp.pad(weights, ((0, 0), (0, c * w_blk - m))).reshape(b, c, w_blk)
  # Prefix sums only over the block masses and inside the chosen block:
  # XLA:CPU runs a cumsum as a windowed reduction, O(W) work per entry, so a
  # cumsum of all C blocks cost O(V W) per row and step.
  block_mass = jnp.sum(w, axis=-1)  # [B, C]
  upto = jnp.cumsum(block_mass, axis=-1)  # [B, C]
  total = upto[:, -1]
  target = u * total  # [B]
  # First block whose cumulative mass exceeds the target; rounding can push
  # past the last positive block, so clamp to it (likewise inside the block).
  j = jnp.sum(upto <= target[:, None], axis=-1).astype(jnp.int32)
  j = jnp.minimum(j, _last_positive(block_mass))
  rest = target - _take(upto - block_mass, j)  # [B]
  inner_w = jnp.take_along_axis(w, j[:, None, None], axis=1)[:, 0]  # [B, W]
  inner = jnp.cumsum(inner_w, axis=-1)
  i = jnp.sum(inner <= rest[:, None], axis=-1).astype(jnp.int32)
  i = jnp.minimum(i, _last_positive(inner_w))
  return j * w_blk + i, total


def _top_p_threshold(p, top_p):
  """Smallest probability kept by nucleus truncation, per row.

  p [B, V] unnormalised probabilities. Finds the largest t among float32
  values with mass(p >= t) >= top_p * mass(p) by bisection over the bit
  patterns (ordered like the values for non-negative floats): exact, and
  O(32 V) instead of an O(V log V) sort, which is slow on CPU.
  """
  target = top_p * jnp.sum(p, axis=-1)  # [B]
  bits = lambda t: jax.lax.bitcast_convert_type(t, jnp.float32)
  mass_at = lambda t: jnp.sum(jnp.where(p >= bits(t)[:, None], p, 0.0), -1)

  def body(_, lohi):
    lo, hi = lohi
    mid = lo + (hi - lo) // 2
    ok = mass_at(mid) >= target
    return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

  b = p.shape[0]
  lo = jnp.zeros((b,), jnp.int32)  # mass(p >= 0) = everything
  hi = jax.lax.bitcast_convert_type(jnp.max(p, -1), jnp.int32) + 1  # empty
  lo, _ = jax.lax.fori_loop(0, 32, body, (lo, hi))
  return bits(lo)


def distribution(sampler: Sampler, logits, temperature, top_p) -> dict:
  """The per-row distribution tokens are drawn from, as a dict of arrays.

  Tempered, top-k and top-p truncated (the module docstring's order); for
  greedy decoding just the float32 logits. Consumed by `draw_from` and
  `logprob_of`, so that a mixture can score one model's token under the
  other model's distribution without recomputing it.
  """
  logits = logits.astype(jnp.float32)
  if sampler.greedy:
    return {"logits": logits}
  x = logits / temperature  # [B, V]
  if sampler.top_k is None:
    top = jnp.max(x, axis=-1, keepdims=True)
    p = jnp.exp(x - top)  # [B, V]
    if sampler.use_top_p:
      p = jnp.where(p >= _top_p_threshold(p, top_p)[:, None], p, 0.0)
    return {"x": x, "top": top[:, 0], "p": p, "total": jnp.sum(p, axis=-1)}
  # The barrier keeps XLA:CPU from fusing the consumers into the top-k, which
  # otherwise becomes a full sort of the vocabulary (~100x slower).
  vals, idx = jax.lax.optimization_barrier(
      jax.lax.top_k(x, sampler.top_k))  # [B, K] descending
  p = jnp.exp(vals - vals[:, :1])  # [B, K]
  if sampler.use_top_p:
    # Sorted already: keep while the mass before a token is below top_p (the
    # best token has none before it and is always kept).
    before = jnp.cumsum(p, axis=-1) - p
    p = jnp.where(before < top_p * jnp.sum(p, -1, keepdims=True), p, 0.0)
  return {"vals": vals, "idx": idx, "p": p, "total": jnp.sum(p, axis=-1)}


def draw_from(dist: dict, keys):
  """One token per row from `distribution(...)`: tokens [B] and their log-probs."""
  if "logits" in dist:
    tok = _first_argmax(dist["logits"])
    return tok, _take(jax.nn.log_softmax(dist["logits"], axis=-1), tok)
  u = jax.vmap(jax.random.uniform)(keys)  # [B] in [0, 1)
  j, total = draw(dist["p"], u)
  if "idx" in dist:
    return (_take(dist["idx"], j),
            _take(dist["vals"], j) - dist["vals"][:, 0] - jnp.log(total))
  return j, _take(dist["x"], j) - dist["top"] - jnp.log(total)


def logprob_of(dist: dict, tok):
  """[B] log-probs of tokens `tok` [B] under `distribution(...)`.

  -inf for a token the truncation removed; for greedy decoding the raw
  model's log_softmax (there is no sampled distribution). Equals the log-prob
  `draw_from` returns for its own tokens.
  """
  if "logits" in dist:
    return _take(jax.nn.log_softmax(dist["logits"], axis=-1), tok)
  if "idx" in dist:
    hit = dist["idx"] == tok[:, None]  # [B, K]
    kept = jnp.any(hit & (dist["p"] > 0), axis=-1)
    v = jnp.sum(jnp.where(hit, dist["vals"], 0.0), axis=-1)
    lp = v - dist["vals"][:, 0] - jnp.log(dist["total"])
  else:
    kept = _take(dist["p"], tok) > 0
    lp = _take(dist["x"], tok) - dist["top"] - jnp.log(dist["total"])
  return jnp.where(kept, lp, -jnp.inf)


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
  return draw_from(distribution(sampler, logits, temperature, top_p), keys)
