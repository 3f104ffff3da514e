"""The paper's rollout spectrum pi_lambda (App. D.5) against a float64 NumPy
implementation written here from the paper's formulas, and rollouts drawn
from it on small random models (bitwise end points, chi-square frequencies).
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxdistill import models
from jaxdistill import rollout

LAMS = (-2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0)


def _np_log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _np_pi_lambda(ls, lt, lam, alpha=0.2, c=2 * math.log(3)):
  """log pi_lambda from App. D.5, in float64, one case per formula."""
  ls, lt = np.asarray(ls, np.float64), np.asarray(lt, np.float64)
  r = ls - lt
  if abs(lam) <= 1:
    z = 0.5 * (ls + lt) + 0.5 * lam * (ls - lt)
  elif lam > 1:
    m = ls >= ls.max(-1, keepdims=True) + np.log(alpha)
    z = ls + (lam - 1) / 2 * m * np.minimum(np.maximum(r, 0), c)
  else:
    m = lt >= lt.max(-1, keepdims=True) + np.log(alpha)
    z = lt + (-lam - 1) / 2 * m * np.minimum(np.maximum(-r, 0), c)
  return _np_log_softmax(z)


def _random_pair(seed, shape=(6, 40)):
  rng = np.random.default_rng(seed)
  # Peaked rows so that both plausibility masks exclude most tokens, and
  # tokens outside both masks are common.
  zs = rng.normal(0, 3, shape)
  zt = rng.normal(0, 3, shape)
  return _np_log_softmax(zs), _np_log_softmax(zt)


@pytest.mark.parametrize("lam", LAMS)
def test_spectrum_logprobs_match_the_papers_formulas(lam):
  ls, lt = _random_pair(int(10 * lam) + 50)
  got = np.asarray(rollout.spectrum_logprobs(ls, lt, lam))
  np.testing.assert_allclose(got, _np_pi_lambda(ls, lt, lam), atol=1e-6)
  # Some tokens lie outside both masks (the bonus must leave them alone).
  outside = ((ls < ls.max(-1, keepdims=True) + np.log(0.2))
             & (lt < lt.max(-1, keepdims=True) + np.log(0.2)))
  assert outside.sum() > 10


def test_end_points_are_the_models_and_density_is_continuous_at_one():
  ls, lt = _random_pair(3)
  np.testing.assert_array_equal(
      np.asarray(rollout.spectrum_logprobs(ls, lt, 1.0)),
      np.asarray(jax.nn.log_softmax(jnp.asarray(ls, jnp.float32))))
  np.testing.assert_allclose(
      np.asarray(rollout.spectrum_logprobs(ls, lt, -1.0)), lt, atol=1e-6)
  for edge in (1.0, -1.0):
    for eps in (1e-4, -1e-4):
      a = np.exp(np.asarray(rollout.spectrum_logprobs(ls, lt, edge + eps)))
      b = np.exp(np.asarray(rollout.spectrum_logprobs(ls, lt, edge)))
      assert np.abs(a - b).max() < 1e-3


def test_beyond_one_odds_move_at_most_threefold():
  ls, lt = _random_pair(4)
  for lam, anchor in ((2.0, ls), (-2.0, lt)):
    got = np.asarray(rollout.spectrum_logprobs(ls, lt, lam), np.float64)
    shift = (got - got[:, :1]) - (anchor - anchor[:, :1])  # log-odds change
    assert np.abs(shift).max() <= 2 * math.log(3) + 1e-5


def test_minus_infinity_in_one_model_is_no_nan():
  ls, lt = _random_pair(5, (2, 10))
  lt = lt.copy()
  lt[:, 3] = -np.inf  # the teacher rules a token out
  for lam in LAMS:
    got = np.asarray(rollout.spectrum_logprobs(ls, lt, lam))
    assert not np.isnan(got).any(), lam
    np.testing.assert_allclose(np.exp(got).sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("bad", [2.5, -2.01, float("nan"), None, "x"])
def test_lambda_outside_the_range_is_refused(bad):
  with pytest.raises(ValueError, match="lam"):
    rollout.spectrum.check_lam(bad)


# --- rollouts on small random models --------------------------------------

def _cfg(**kw):
  base = dict(family="llama", vocab_size=48, hidden_size=32,
              intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, eos_token_id=(2,),
              max_position_embeddings=64, rope_theta=10000.0)
  return models.ModelConfig(**{**base, **kw})


def _params(cfg, seed):
  rng = np.random.default_rng(seed)
  def fill(path, s):
    is_norm = "scale" in jax.tree_util.keystr(path)
    return jnp.asarray(rng.normal(0.0, 0.2, s.shape) + is_norm, s.dtype)
  return jax.tree_util.tree_map_with_path(fill, models.param_shapes(cfg))


@pytest.fixture(scope="module")
def pair():
  s_cfg, t_cfg = _cfg(), _cfg(hidden_size=48, num_hidden_layers=3)
  return (s_cfg, _params(s_cfg, 0)), (t_cfg, _params(t_cfg, 1))


TS, TT = 1.0, 0.5  # the paper's student and teacher temperatures


def _generate(pair, policy, lam=None, n=6, rows=8, seed=0, **kw):
  ids = [[5 + i, 7, 9 + (i % 3)] for i in range(rows)]
  prompts, mask = rollout.pad_prompts(ids)
  return rollout.generate(*pair, prompts, mask, rng=jax.random.key(seed),
                          policy=policy, lam=lam, max_new_tokens=n,
                          temperature=TS, teacher_temperature=TT, **kw)


@pytest.mark.slow  # compiles the two-model and both one-model programs
def test_lambda_plus_minus_one_rollouts_are_bitwise_the_pure_policies(pair):
  for lam, pure in ((1.0, "student"), (-1.0, "teacher")):
    a = _generate(pair, "spectrum", lam)
    b = _generate(pair, pure)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_array_equal(np.asarray(a.response_mask),
                                  np.asarray(b.response_mask))
    np.testing.assert_array_equal(np.asarray(a.behaviour_logprobs),
                                  np.asarray(b.logprobs))


@pytest.mark.slow  # one compiled rollout, 4,000 rows
def test_lambda_half_rollout_has_pi_lambda_token_frequencies(pair):
  (s_cfg, s_p), (t_cfg, t_p) = pair
  rows, prompt = 4000, [11, 12, 13]
  prompts, mask = rollout.pad_prompts([prompt] * rows)
  r = rollout.generate(*pair, prompts, mask, rng=jax.random.key(7),
                       policy="spectrum", lam=0.5, max_new_tokens=1,
                       temperature=TS, teacher_temperature=TT,
                       eos_token_ids=())
  tok = np.asarray(r.tokens)[:, -1]
  x = jnp.asarray([prompt])
  ls = _np_log_softmax(np.asarray(models.apply(s_cfg, s_p, x), np.float64)[0, -1] / TS)
  lt = _np_log_softmax(np.asarray(models.apply(t_cfg, t_p, x), np.float64)[0, -1] / TT)
  p = np.exp(_np_pi_lambda(ls, lt, 0.5))
  counts = np.bincount(tok, minlength=p.size)
  # Pool the rare tokens so that every expected count is >= 5.
  order = np.argsort(p)
  keep = p[order] * rows >= 5
  obs = np.append(counts[order][keep], counts[order][~keep].sum())
  exp = np.append(p[order][keep], p[order][~keep].sum()) * rows
  obs, exp = obs[exp > 0], exp[exp > 0]
  assert stats.chisquare(obs, exp).pvalue > 1e-3
  # The behaviour log-prob recorded is log pi_lambda of the drawn token.
  np.testing.assert_allclose(np.asarray(r.behaviour_logprobs)[:, 0],
                             np.log(p[tok]), atol=2e-4)


def test_spectrum_settings_are_checked(pair):
  with pytest.raises(ValueError, match="lam"):
    _generate(pair, "spectrum", 3.0)
  with pytest.raises(ValueError, match="top_k, top_p"):
    _generate(pair, "spectrum", 0.5, top_p=0.9)
  with pytest.raises(ValueError, match="coin_mixture needs lam in"):
    _generate(pair, "coin_mixture", -0.5)
