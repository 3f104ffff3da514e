"""The decode loop on toy bigram "models" whose logits are a fixed table.

A toy model's next-token logits are table[last token], so every quantity the
loop returns can be recomputed in float64 NumPy from the emitted tokens.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdistill.rollout import loop
from jaxdistill.rollout import sampling

V = 16
EOS = 3
PAD = 0


def _tables(seed):
  t = np.random.default_rng(seed).normal(0, 1.0, (V, V)).astype(np.float32)
  return t


def _step(table):
  table = jnp.asarray(table)

  def step(cache, tok):
    # The cache counts the forward steps, to check the loop stops early.
    return table[tok], cache + 1
  return step


@functools.partial(jax.jit, static_argnames=("n", "sampler", "two", "teacher",
                                             "eos"))
def _run(tables, first, rng, row_ids, lam, t, *, n, sampler, two=False,
         teacher=False, eos=(EOS,)):
  b = first.shape[0]
  fns = [_step(tb) for tb in tables]
  logits = [jnp.asarray(tb)[first] for tb in tables]
  caches = [jnp.zeros((b,), jnp.int32) for _ in tables]
  return loop.decode(fns, logits, caches, rng=rng, row_ids=row_ids,
                     max_new_tokens=n, sampler=sampler, temperature=t,
                     lam=lam, student_index=None if teacher else 0,
                     eos_ids=eos, pad_id=PAD)


def _log_softmax(x):
  x = np.asarray(x, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_eos_masking_and_max_new_tokens():
  tables = (_tables(0),)
  b, n = 64, 12
  first = jnp.arange(b, dtype=jnp.int32) % V
  s = _run(tables, first, jax.random.key(0), jnp.arange(b), 1.0, 1.0, n=n,
           sampler=sampling.Sampler())
  tok, mask = np.asarray(s.tokens), np.asarray(s.mask)
  saw_eos = saw_long = False
  for r in range(b):
    hits = np.flatnonzero(tok[r] == EOS)
    if hits.size:
      end = hits[0] + 1
      saw_eos = True
      assert np.asarray(s.done)[r]
    else:
      end = n
      saw_long = True
      assert not np.asarray(s.done)[r]
    np.testing.assert_array_equal(mask[r], np.arange(n) < end)
    assert (tok[r, end:] == PAD).all()
  assert saw_eos and saw_long


def test_stops_when_all_rows_end():
  table = np.full((V, V), -30.0, np.float32)
  table[:, EOS] = 30.0  # every row ends at its 2nd token
  first = jnp.full((4,), 5, jnp.int32)
  logits0 = np.full((V,), -30.0, np.float32)
  logits0[7] = 30.0
  s = loop.decode([_step(table)], [jnp.tile(logits0, (4, 1))],
                  [jnp.zeros((4,), jnp.int32)], rng=jax.random.key(0),
                  row_ids=jnp.arange(4), max_new_tokens=50,
                  sampler=sampling.Sampler(), temperature=1.0,
                  eos_ids=(EOS,), pad_id=PAD)
  assert int(s.step) == 2
  np.testing.assert_array_equal(np.asarray(s.caches[0]), 1)  # one forward
  np.testing.assert_array_equal(np.asarray(s.tokens)[:, :3], [[7, EOS, PAD]] * 4)


def test_no_eos_runs_to_max_new_tokens():
  tables = (_tables(1),)
  s = _run(tables, jnp.zeros((8,), jnp.int32), jax.random.key(1),
           jnp.arange(8), 1.0, 1.0, n=9, sampler=sampling.Sampler(), eos=())
  assert np.asarray(s.mask).all() and int(s.step) == 9
  np.testing.assert_array_equal(np.asarray(s.caches[0]), 8)


@pytest.mark.slow  # compiles four loop programs
def test_mixture_endpoints_reproduce_pure_policies():
  sampler, t = sampling.Sampler(top_k=4), 0.7
  ts, tt = _tables(2), _tables(3)
  b, n = 32, 10
  first = jnp.arange(b, dtype=jnp.int32) % V
  args = (jax.random.key(7), jnp.arange(b))
  st = _run((ts,), first, *args, 1.0, t, n=n, sampler=sampler)
  te = _run((tt,), first, *args, 1.0, t, n=n, sampler=sampler, teacher=True)
  m1 = _run((ts, tt), first, *args, 1.0, t, n=n, sampler=sampler, two=True)
  m0 = _run((ts, tt), first, *args, 0.0, t, n=n, sampler=sampler, two=True)
  for mix, pure, frm in ((m1, st, True), (m0, te, False)):
    np.testing.assert_array_equal(mix.tokens, pure.tokens)
    np.testing.assert_array_equal(mix.mask, pure.mask)
    np.testing.assert_array_equal(mix.logprobs, pure.logprobs)
    np.testing.assert_array_equal(mix.from_student, np.asarray(mix.mask) & frm)
    np.testing.assert_array_equal(pure.from_student, np.asarray(pure.mask) & frm)
  # The two policies really differ, so the equalities above can fail.
  assert (np.asarray(st.tokens) != np.asarray(te.tokens)).any()


def test_mixture_fraction_and_logprobs_of_the_sampling_model():
  ts, tt = _tables(4), _tables(5)
  b, n, lam, t = 512, 16, 0.3, 0.9
  first = jnp.arange(b, dtype=jnp.int32) % V
  s = _run((ts, tt), first, jax.random.key(3), jnp.arange(b), lam, t, n=n,
           sampler=sampling.Sampler(), two=True, eos=())
  fs, tok = np.asarray(s.from_student), np.asarray(s.tokens)
  frac = fs.mean()
  # Binomial standard error over b * n coin flips.
  assert abs(frac - lam) < 4 * np.sqrt(lam * (1 - lam) / fs.size)
  prev = np.concatenate([np.asarray(first)[:, None], tok[:, :-1]], axis=1)
  lp_s = _log_softmax(ts[prev] / t)
  lp_t = _log_softmax(tt[prev] / t)
  pick = lambda lp: np.take_along_axis(lp, tok[..., None], -1)[..., 0]
  ref = np.where(fs, pick(lp_s), pick(lp_t))
  np.testing.assert_allclose(np.asarray(s.logprobs), ref, atol=1e-5)
  # Both models' log-probs of a token differ, so a swap would be caught.
  assert np.abs(pick(lp_s) - pick(lp_t)).mean() > 0.1


def test_row_draws_do_not_depend_on_batch_composition():
  tables = (_tables(6),)
  rng = jax.random.key(11)
  sampler = sampling.Sampler()
  full = _run(tables, jnp.arange(8, dtype=jnp.int32), rng, jnp.arange(8), 1.0,
              1.0, n=10, sampler=sampler, eos=())
  # Rows 5 and 2 alone, in another order, keyed by their ids.
  sub = _run(tables, jnp.asarray([5, 2], jnp.int32), rng, jnp.asarray([5, 2]),
             1.0, 1.0, n=10, sampler=sampler, eos=())
  np.testing.assert_array_equal(np.asarray(sub.tokens),
                                np.asarray(full.tokens)[[5, 2]])
  # Different rng -> different draws.
  other = _run(tables, jnp.arange(8, dtype=jnp.int32), jax.random.key(12),
               jnp.arange(8), 1.0, 1.0, n=10, sampler=sampler, eos=())
  assert (np.asarray(other.tokens) != np.asarray(full.tokens)).any()


def _topk_log_probs(table_rows, t, k):
  """float64 log-probs of softmax(row / t) renormalised over its k largest."""
  x = np.asarray(table_rows, np.float64) / t
  kth = -np.sort(-x, axis=-1)[..., k - 1:k]
  x = np.where(x >= kth, x, -np.inf)
  return _log_softmax(np.where(np.isfinite(x), x, -1e300))


@pytest.mark.parametrize("sampler", [sampling.Sampler(),
                                     sampling.Sampler(top_k=5)])
def test_mixture_behaviour_logprobs_are_the_mixture_probability(sampler):
  """behaviour_logprobs = log(lam q'(y) + (1 - lam) p'(y)), float64 reference."""
  ts, tt = _tables(8), _tables(9)
  b, n, lam, t = 256, 8, 0.4, 0.8
  first = jnp.arange(b, dtype=jnp.int32) % V
  s = _run((ts, tt), first, jax.random.key(5), jnp.arange(b), lam, t, n=n,
           sampler=sampler, two=True, eos=())
  fs, tok = np.asarray(s.from_student), np.asarray(s.tokens)
  prev = np.concatenate([np.asarray(first)[:, None], tok[:, :-1]], axis=1)
  k = sampler.top_k or V
  with np.errstate(divide="ignore"):
    q = np.exp(_topk_log_probs(ts[prev], t, k))
    p = np.exp(_topk_log_probs(tt[prev], t, k))
    pick = lambda a: np.take_along_axis(a, tok[..., None], -1)[..., 0]
    ref = np.log(lam * pick(q) + (1 - lam) * pick(p))
  got = np.asarray(s.behaviour_logprobs)
  np.testing.assert_allclose(got, ref, atol=1e-5)
  # It is not the sampling model's own log-prob (what `logprobs` holds).
  assert np.abs(got - np.asarray(s.logprobs)).mean() > 0.1
  if sampler.top_k:  # some tokens lie outside the other model's top-k
    assert (pick(q) == 0).any() or (pick(p) == 0).any()


def test_single_model_behaviour_logprobs_equal_logprobs():
  s = _run((_tables(1),), jnp.zeros((8,), jnp.int32), jax.random.key(1),
           jnp.arange(8), 1.0, 0.9, n=6, sampler=sampling.Sampler(), eos=())
  np.testing.assert_array_equal(s.behaviour_logprobs, s.logprobs)
