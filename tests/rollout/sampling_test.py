"""Sampling draws from softmax(logits / T), truncated exactly as specified.

References are float64 NumPy formulas and brute-force kept sets.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxdistill.rollout import sampling

V = 12
N_DRAWS = 40_000


def _probs(logits, t):
  x = np.asarray(logits, np.float64) / t
  e = np.exp(x - x.max())
  return e / e.sum()


def _draw(sampler, logits, t, top_p=1.0, seed=0):
  keys = jax.random.split(jax.random.key(seed), N_DRAWS)
  batch = jnp.broadcast_to(jnp.asarray(logits, jnp.float32), (N_DRAWS, V))
  fn = jax.jit(lambda k, l: sampling.sample(sampler, l, k, t, top_p))
  tok, lp = fn(keys, batch)
  return np.asarray(tok), np.asarray(lp)


def _kept(logits, t, top_k=None, top_p=None):
  """Brute force: ids kept by top-k then top-p, and their renormalised probs."""
  p = _probs(logits, t)
  order = np.argsort(-p, kind="stable")
  if top_k is not None:
    order = order[:top_k]
  q = p[order] / p[order].sum()
  if top_p is not None:
    n = 1
    while q[:n].sum() < top_p:
      n += 1
    order = order[:n]
  dist = np.zeros(V)
  dist[order] = p[order] / p[order].sum()
  return set(order.tolist()), dist


def _chi2_pvalue(tokens, dist):
  support = dist > 0
  counts = np.bincount(tokens, minlength=V)
  assert counts[~support].sum() == 0
  return stats.chisquare(counts[support], dist[support] * len(tokens)).pvalue


@pytest.fixture(scope="module")
def logits():
  return np.random.default_rng(0).normal(0.0, 1.5, V).astype(np.float32)


@pytest.mark.parametrize("t", [1.0, 0.6, 1.7])
def test_temperature_matches_softmax(logits, t):
  tok, lp = _draw(sampling.Sampler(), logits, t)
  assert _chi2_pvalue(tok, _probs(logits, t)) > 1e-3
  np.testing.assert_allclose(lp, np.log(_probs(logits, t))[tok], atol=1e-5)


def test_chi_square_detects_wrong_temperature(logits):
  # The test above must be able to fail: draws at T=1.3 are not softmax(l/1).
  tok, _ = _draw(sampling.Sampler(), logits, 1.3)
  counts = np.bincount(tok, minlength=V)
  assert stats.chisquare(counts, _probs(logits, 1.0) * N_DRAWS).pvalue < 1e-6


@pytest.mark.parametrize("top_k,top_p", [(1, None), (3, None), (None, 0.5),
                                         (None, 0.9), (5, 0.7)])
def test_truncation_keeps_exactly_the_brute_force_set(logits, top_k, top_p):
  t = 0.8
  sampler = sampling.Sampler(top_k=top_k, use_top_p=top_p is not None)
  tok, lp = _draw(sampler, logits, t, top_p=1.0 if top_p is None else top_p)
  kept, dist = _kept(logits, t, top_k, top_p)
  assert set(np.unique(tok).tolist()) <= kept
  # Every kept token shows up, drawn with its renormalised probability.
  assert set(np.unique(tok).tolist()) == kept
  if len(kept) > 1:
    assert _chi2_pvalue(tok, dist) > 1e-3
  np.testing.assert_allclose(lp, np.log(dist[tok]), atol=1e-5)


def test_greedy_is_argmax_with_raw_logprob():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(16, V)).astype(np.float32)
  tok, lp = sampling.sample(sampling.Sampler(greedy=True), jnp.asarray(logits),
                            None, 1.0, 1.0)
  np.testing.assert_array_equal(tok, logits.argmax(-1))
  x = logits.astype(np.float64)
  ref = x - x.max(-1, keepdims=True)
  ref = ref - np.log(np.exp(ref).sum(-1, keepdims=True))
  np.testing.assert_allclose(lp, ref[np.arange(16), logits.argmax(-1)], atol=1e-5)


def test_draw_inverse_cdf_edges_and_blocks():
  # 600 weights span 3 blocks of 256; zeros at both ends and in the middle.
  w = np.zeros(600, np.float32)
  w[5], w[300], w[520] = 1.0, 2.0, 1.0
  u = np.asarray([0.0, 0.2499, 0.25, 0.7499, 0.75, np.nextafter(np.float32(1), np.float32(0))],
                 np.float32)
  idx, total = sampling.draw(jnp.tile(jnp.asarray(w), (len(u), 1)),
                             jnp.asarray(u))
  # Brute-force inverse CDF: first index whose cumulative mass exceeds u*sum.
  ref = [int(np.argmax(np.cumsum(w) > x * w.sum())) for x in u]
  assert ref == [5, 5, 300, 300, 520, 520]
  np.testing.assert_array_equal(idx, ref)
  np.testing.assert_allclose(total, 4.0)
