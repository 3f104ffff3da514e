"""The compiled decode loop, generic over the models that feed it.

A model is seen here only through a step function
`step(cache, tokens [B]) -> (logits [B, V], cache)`; the prefill (which also
gives the logits for the first new token) happens before the loop. This keeps
the loop testable with toy logits tables and independent of the model code.

Policies: one model ('student' or 'teacher'), or two models decoding in
lockstep (index 0 = student, 1 = teacher), combined one of two ways:
- 'coin_mixture': at every step each model proposes a token from its own
  distribution with the SAME sampling key, and a coin from a separate stream
  picks the student's proposal with probability lam. lam = 1 (coin always
  student) is exactly the student-only rollout, lam = 0 exactly the
  teacher-only rollout, for the same rng.
- 'spectrum': the token is drawn from pi_lambda (rollout/spectrum.py), the
  paper's policy between (and beyond) the two, with lam the paper's lambda in
  [-2, 2]. At lam = +1 (-1) the scores drawn from are the student's (teacher's)
  own tempered logits, so with the same rng the tokens are exactly the pure
  student (teacher) rollout's.
Each model has its own temperature (`temperature`: one per model).

RNG (what is guaranteed): with `rng` split into a sampling stream and a coin
stream, the key of row b at step i is fold_in(fold_in(stream, row_ids[b]), i).
A row's draws therefore depend only on (rng, its row id, the step, its own
logits), not on the batch size or on the other rows. `rng` may also be [B]
keys, one per row (rows of several rollouts decoded in one call, each with
its own key): row b's streams are then fold_in(rng[b], 0) and
fold_in(rng[b], 1), the same keys a call with the scalar rng[b] gives it. Its logits can still
differ in the last bits with batch composition (batched matmuls, padding to a
different prompt width), which can flip a near-tie; bit-identical results are
guaranteed only for identical inputs.

Shapes: B batch rows, N max new tokens, V vocabulary.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from jaxdistill.rollout import sampling
from jaxdistill.rollout import spectrum as spectrum_lib

StepFn = Callable[[Any, jax.Array], tuple[jax.Array, Any]]


@flax.struct.dataclass
class LoopState:
  step: jax.Array          # [] int32: index of the next token to sample
  tokens: jax.Array        # [B, N] int32, pad after a row ends
  logprobs: jax.Array      # [B, N] float32, 0 where not generated
  behaviour_logprobs: jax.Array  # [B, N] float32: under the mixture; 0 where not generated
  from_student: jax.Array  # [B, N] bool, False where not generated
  mask: jax.Array          # [B, N] bool: generated (up to and incl. EOS)
  done: jax.Array          # [B] bool
  logits: tuple            # per model [B, V]: logits for the next token
  caches: tuple            # per model cache pytree


def as_keys(rng):
  """`rng` as typed PRNG keys: a typed key (jax.random.key) or [B] of them
  as given; raw key data (jax.random.PRNGKey's uint32 [2], or [B, 2])
  wrapped. Without it a raw key's 2 words read as 2 per-row keys."""
  raw = getattr(rng, "dtype", None) == jnp.uint32
  if not raw or jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
    return rng
  width = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0))).shape
  if tuple(rng.shape[-1:]) != tuple(width) or len(rng.shape) > 2:
    return rng  # left to the caller's shape check, which names it
  if isinstance(rng, jax.ShapeDtypeStruct):
    keys = jax.eval_shape(jax.random.wrap_key_data, rng)
    return jax.ShapeDtypeStruct(keys.shape, keys.dtype,
                                sharding=getattr(rng, "sharding", None))
  return jax.random.wrap_key_data(rng)


def row_keys(key, row_ids):
  """[B] keys, one per row id: fold_in(key, row_id)."""
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, row_ids)


def stream_keys(rng, stream: int, row_ids):
  """[B] keys of a stream: fold_in(fold_in(rng, stream), row_id) per row,
  where `rng` is one key or [B] keys (one per row)."""
  if jnp.ndim(rng) == 0:
    return row_keys(jax.random.fold_in(rng, stream), row_ids)
  return jax.vmap(lambda k, r: jax.random.fold_in(
      jax.random.fold_in(k, stream), r))(rng, row_ids)


def _step_keys(keys, i):
  return jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, i)


def _spectrum_draw(logits, temps, lam, keys):
  """One token per row from pi_lambda and its log-prob log pi_lambda(token).

  At lam = +-1 the scores are the anchor model's tempered logits themselves
  (not their log-softmax), drawn like `sampling.sample` draws them, so those
  rollouts are bitwise the pure policies'."""
  xs, xt = (l.astype(jnp.float32) / t for l, t in zip(logits, temps))
  ls, lt = (jax.nn.log_softmax(x, axis=-1) for x in (xs, xt))
  scores = jnp.where(lam == 1, xs, jnp.where(
      lam == -1, xt, spectrum_lib.spectrum_scores(ls, lt, lam)))
  dist = sampling.distribution(sampling.Sampler(), scores, 1.0, 1.0)
  return sampling.draw_from(dist, keys)


def decode(step_fns: Sequence[StepFn], logits, caches, *, rng, row_ids,
           max_new_tokens: int, sampler: sampling.Sampler, temperature,
           top_p=1.0, lam=None, student_index: int | None = 0,
           combine: str = "coin_mixture",
           eos_ids: Sequence[int] = (), pad_id: int = 0,
           constrain: Callable[[LoopState], LoopState] = lambda s: s):
  """Samples up to `max_new_tokens` tokens; call inside jit.

  Args:
    step_fns: one step function, or (student, teacher) for two models.
    logits: per model [B, V] logits for the first new token (from prefill).
    caches: per model cache after prefill.
    rng: PRNG key, or [B] keys (one per row); streams fold_in(rng, 0)
      (sampling), fold_in(rng, 1) (coin).
    row_ids: [B] int32 ids that key each row's RNG stream.
    max_new_tokens: N, static.
    sampler: static sampling settings.
    temperature: traced sampling temperature, one per model (a sequence) or
      one for all.
    top_p: traced nucleus mass.
    lam: traced; 'coin_mixture': the probability of the student's token;
      'spectrum': the paper's lambda in [-2, 2].
    student_index: for one model, 0 if it is the student, None if teacher.
    combine: with two models, 'coin_mixture' or 'spectrum' (static).
    eos_ids: a row ends after emitting any of these.
    pad_id: written after a row's end.
    constrain: applied to the state every step (sharding constraints).

  Returns:
    The final LoopState.
  """
  n_models = len(step_fns)
  if n_models not in (1, 2) or len(logits) != n_models:
    raise ValueError(f"step_fns: need 1 or 2 models, got {n_models}")
  if combine not in ("coin_mixture", "spectrum"):
    raise ValueError(f"combine: 'coin_mixture' or 'spectrum', got {combine!r}")
  temps = (tuple(temperature) if isinstance(temperature, (tuple, list))
           else (temperature,) * n_models)
  if len(temps) != n_models:
    raise ValueError(f"temperature: one per model ({n_models}), got {len(temps)}")
  b = logits[0].shape[0]
  rng = as_keys(rng)
  if jnp.ndim(rng) not in (0, 1) or (jnp.ndim(rng) == 1
                                     and rng.shape[0] != b):
    raise ValueError(f"rng: one key or one per row ({b}), got shape "
                     f"{tuple(jnp.shape(rng))}")
  sample_keys = stream_keys(rng, 0, row_ids)  # [B]
  coin_keys = stream_keys(rng, 1, row_ids)  # [B]
  eos = jnp.asarray(tuple(eos_ids), jnp.int32).reshape(-1)

  def choose(logits, keys, i):
    """(token, its log-prob under its sampler, under the rollout's policy,
    whether the student is its source), each [B]."""
    if n_models == 2 and combine == "spectrum":
      tok, lp = _spectrum_draw(logits, temps, lam, keys)
      return tok, lp, lp, jnp.full((b,), jnp.asarray(lam) >= 1)
    dists = [sampling.distribution(sampler, l, t, top_p)
             for l, t in zip(logits, temps)]
    proposals = [sampling.draw_from(d, keys) for d in dists]
    if n_models == 1:
      tok, lp = proposals[0]
      return tok, lp, lp, jnp.full((b,), student_index == 0)
    u = jax.vmap(jax.random.uniform)(_step_keys(coin_keys, i))  # [B]
    # u is in [0, 1): lam = 1 always picks the student, lam = 0 never.
    student = u < lam
    (tok_s, lp_s), (tok_t, lp_t) = proposals
    tok = jnp.where(student, tok_s, tok_t)
    lp = jnp.where(student, lp_s, lp_t)
    # The token's log-prob under each model's (sampling) distribution, then
    # under the mixture lam q + (1 - lam) p that it was drawn from.
    lq = jnp.where(student, lp_s, sampling.logprob_of(dists[0], tok_t))
    lpt = jnp.where(student, sampling.logprob_of(dists[1], tok_s), lp_t)
    lam32 = jnp.asarray(lam, jnp.float32)
    lb = jnp.logaddexp(jnp.log(lam32) + lq, jnp.log1p(-lam32) + lpt)
    return tok, lp, lb, student

  def pick(s: LoopState) -> LoopState:
    i = s.step
    tok, lp, lb, student = choose(s.logits, _step_keys(sample_keys, i), i)
    live = ~s.done
    tok = jnp.where(live, tok, pad_id).astype(jnp.int32)
    ended = live & jnp.any(tok[:, None] == eos[None, :], axis=-1)
    col = lambda buf, v: buf.at[:, i].set(v)
    return constrain(s.replace(
        step=i + 1,
        tokens=col(s.tokens, tok),
        logprobs=col(s.logprobs, jnp.where(live, lp, 0.0)),
        behaviour_logprobs=col(s.behaviour_logprobs, jnp.where(live, lb, 0.0)),
        from_student=col(s.from_student, student & live),
        mask=col(s.mask, live),
        done=s.done | ended))

  def cond(s: LoopState):
    return (s.step < max_new_tokens) & ~jnp.all(s.done)

  def body(s: LoopState) -> LoopState:
    last = jax.lax.dynamic_index_in_dim(s.tokens, s.step - 1, 1, False)  # [B]
    out = [f(c, last) for f, c in zip(step_fns, s.caches)]
    return pick(s.replace(logits=tuple(o[0] for o in out),
                          caches=tuple(o[1] for o in out)))

  n = max_new_tokens
  s = LoopState(
      step=jnp.zeros((), jnp.int32),
      tokens=jnp.full((b, n), pad_id, jnp.int32),
      logprobs=jnp.zeros((b, n), jnp.float32),
      behaviour_logprobs=jnp.zeros((b, n), jnp.float32),
      from_student=jnp.zeros((b, n), bool),
      mask=jnp.zeros((b, n), bool),
      done=jnp.zeros((b,), bool),
      logits=tuple(logits),
      caches=tuple(caches))
  # The first token comes from the prefill logits; each loop iteration then
  # runs one forward step per model, so no forward is wasted after the last.
  return jax.lax.while_loop(cond, body, pick(constrain(s)))
