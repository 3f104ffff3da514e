"""Two temperatures (the paper's teacher 0.5, student 1.0; App. D.2.2) in every
loss kind, against float64 NumPy references (values and closed-form
gradients), and the paper's fresh-token sampled KL (App. A.2) by Monte Carlo
against the exact gradients."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdistill import losses
from tests.losses import reference as ref

TS, TT = 1.0, 0.5


def _inputs(seed=0, b=3, t=5, v=24, d=8):
  rng = np.random.default_rng(seed)
  hs = rng.normal(0, 1, (b, t, d)).astype(np.float32)
  ht = rng.normal(0, 1, (b, t, d)).astype(np.float32)
  ws = rng.normal(0, 1, (d, v)).astype(np.float32)
  wt = rng.normal(0, 1, (d, v)).astype(np.float32)
  mask = (rng.random((b, t)) < 0.7).astype(np.int32)
  mask[0] = 1
  return hs, ws, ht, wt, mask


@pytest.mark.parametrize("kind", ["forward", "reverse"])
@pytest.mark.parametrize("reduction", ["sequence_mean", "token_mean"])
def test_exact_and_fused_losses_use_each_models_temperature(kind, reduction):
  hs, ws, ht, wt, mask = _inputs()
  z, u = hs @ ws, ht @ wt
  d = ref.divergences(z, u, TS, tau_t=TT)
  want = np.sum(ref.weights(mask, reduction) * np.where(mask, d[kind], 0))
  g_want = ref.grad_closed_form(z, u, mask, kind, reduction, TS, tau_t=TT)
  kw = dict(kind=kind, temperature=TS, teacher_temperature=TT,
            reduction=reduction)
  f = lambda z: losses.divergence(z, jnp.asarray(u), jnp.asarray(mask), **kw)[0]
  got, g = jax.value_and_grad(f)(jnp.asarray(z))
  np.testing.assert_allclose(got, want, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(g), g_want, atol=1e-6)
  fused = lambda hs: losses.fused_divergence(
      hs, jnp.asarray(ws), jnp.asarray(ht), jnp.asarray(wt), jnp.asarray(mask),
      chunk_size=2, **kw)[0]
  got_f, g_hs = jax.value_and_grad(fused)(jnp.asarray(hs))
  np.testing.assert_allclose(got_f, want, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(g_hs), g_want @ ws.T, atol=1e-5)
  # A single temperature would give another value: the test can tell.
  one = ref.divergences(z, u, TS)[kind]
  assert abs(np.sum(ref.weights(mask, reduction) * np.where(mask, one, 0))
             - want) > 1e-3


def test_topk_with_k_equal_to_v_at_the_teachers_temperature_is_exact():
  hs, ws, ht, wt, mask = _inputs(1)
  z, u = hs @ ws, ht @ wt
  t = losses.teacher_topk(jnp.asarray(u), u.shape[-1], temperature=TT)
  got, _ = losses.topk_divergence(jnp.asarray(z), t.ids, t.logprobs,
                                  jnp.asarray(mask), kind="reverse",
                                  temperature=TS, reduction="sequence_mean")
  d = ref.divergences(z, u, TS, tau_t=TT)
  want = np.sum(ref.weights(mask, "sequence_mean") * np.where(mask, d["reverse"], 0))
  np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_fresh_token_estimator_has_the_exact_expected_gradient(direction):
  rng = np.random.default_rng(3)
  v, n = 6, 200_000  # n independent draws at one position
  z = rng.normal(0, 1.5, v).astype(np.float32)
  u = rng.normal(0, 1.5, v).astype(np.float32)
  uniforms = jax.random.uniform(jax.random.key(0), (n, 1))
  mask = jnp.ones((n, 1), jnp.int32)

  def loss(z1):
    zs = jnp.broadcast_to(z1, (n, 1, v))
    us = jnp.broadcast_to(jnp.asarray(u), (n, 1, v))
    return losses.fresh_sampled_kl(zs, us, mask, uniforms, direction=direction,
                                   temperature=TS, teacher_temperature=TT,
                                   reduction="sequence_mean")[0]

  g = np.asarray(jax.grad(loss)(jnp.asarray(z)), np.float64)
  want = ref.grad_closed_form(z[None, None], u[None, None], np.ones((1, 1)),
                              direction, "sum", TS, tau_t=TT)[0, 0]
  # Monte Carlo error of a mean of n per-draw gradients: a few standard
  # errors, from the per-draw gradient's spread computed in float64.
  d = ref.divergences(z, u, TS, tau_t=TT)
  q, p = d["q"], d["p"]
  src = p if direction == "forward" else q
  onehot = np.eye(v)
  per_draw = -(onehot - q) / TS  # d(-log q(y))/dz for each y
  if direction == "reverse":
    per_draw = -(d["logq"] - d["logp"])[:, None] * per_draw
  mean = src @ per_draw
  sd = np.sqrt(src @ (per_draw - mean) ** 2)
  np.testing.assert_allclose(mean, want, atol=1e-9)  # the closed form itself
  assert np.all(np.abs(g - want) <= 5 * sd / np.sqrt(n) + 1e-6), (g, want)
  # The other direction's gradient is far from this one: the test can tell.
  other = ref.grad_closed_form(
      z[None, None], u[None, None], np.ones((1, 1)),
      "reverse" if direction == "forward" else "forward", "sum", TS,
      tau_t=TT)[0, 0]
  assert np.abs(other - want).max() > 20 * (sd.max() / np.sqrt(n))


def test_fresh_token_draws_follow_the_chosen_model():
  rng = np.random.default_rng(4)
  v, n = 5, 100_000
  z = rng.normal(0, 1, (1, 1, v)).astype(np.float32)
  u = rng.normal(0, 1, (1, 1, v)).astype(np.float32)
  uni = np.asarray(jax.random.uniform(jax.random.key(1), (n,)))
  p = np.exp(ref.log_softmax(u[0, 0] / TT))
  lp = jnp.asarray(ref.log_softmax(u[0, 0] / TT), jnp.float32)
  y = np.asarray(losses.sampled.draw_by_cdf(jnp.broadcast_to(lp, (n, v)),
                                             jnp.asarray(uni)))
  freq = np.bincount(y, minlength=v) / n
  assert np.abs(freq - p).max() < 5 * np.sqrt(p.max() / n)


def test_fresh_token_estimator_checks_its_arguments():
  z = jnp.zeros((2, 3, 4))
  with pytest.raises(ValueError, match="direction"):
    losses.fresh_sampled_kl(z, z, jnp.ones((2, 3)), jnp.zeros((2, 3)),
                            direction="both")
  with pytest.raises(ValueError, match="uniforms"):
    losses.fresh_sampled_kl(z, z, jnp.ones((2, 3)), jnp.zeros((2,)))
  with pytest.raises(ValueError, match="teacher_temperature"):
    losses.fresh_sampled_kl(z, z, jnp.ones((2, 3)), jnp.zeros((2, 3)),
                            teacher_temperature=0.0)
