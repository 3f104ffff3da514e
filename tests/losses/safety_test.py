"""No NaN/Inf in values or gradients on the numerically hard inputs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdistill import losses
from tests.losses import reference as ref

B, T, V = 2, 4, 9
KINDS = [("forward", 0.5), ("reverse", 0.5), ("jsd", 0.3)]


def _random(seed, scale=2.0):
  rng = np.random.default_rng(seed)
  z = (scale * rng.standard_normal((B, T, V))).astype(np.float32)
  u = (scale * rng.standard_normal((B, T, V))).astype(np.float32)
  mask = np.ones((B, T), bool)
  mask[1, 2:] = False
  return z, u, mask


def _run(kind, beta, z, u, mask, jit=False, **kw):
  # Eager by default (fast for tiny inputs); the jitted program is checked too
  # where XLA's rewrites of the where-guards could matter.
  f = lambda z: losses.divergence(z, u, mask, kind=kind, beta=beta, **kw)
  f = jax.value_and_grad(f, has_aux=True)
  (loss, metrics), g = (jax.jit(f) if jit else f)(z)
  return float(loss), metrics, np.asarray(g)


def _want(kind, beta, z, u, mask, tau=1.0):
  d = ref.divergences(np.asarray(z, np.float64), np.asarray(u, np.float64), tau,
                      beta)
  return np.sum(ref.weights(mask, "token_mean") * np.where(mask, d[kind], 0.0))


@pytest.mark.parametrize("kind,beta", KINDS)
def test_masked_vocab_minus_inf(kind, beta):
  z, u, mask = _random(0)
  z[..., -3:] = -np.inf  # both models mask the same entries
  u[..., -3:] = -np.inf
  loss, metrics, g = _run(kind, beta, z, u, mask)
  assert np.isfinite(loss) and np.all(np.isfinite(g))
  np.testing.assert_allclose(loss, _want(kind, beta, z[..., :-3], u[..., :-3], mask),
                             rtol=2e-6)
  np.testing.assert_array_equal(g[..., -3:], 0.0)
  assert all(np.isfinite(float(v)) for v in metrics.values())


@pytest.mark.parametrize("kind,beta,side", [("forward", 0.5, "teacher"),
                                            ("jsd", 0.3, "teacher"),
                                            ("reverse", 0.5, "student"),
                                            ("jsd", 0.3, "student")])
def test_one_sided_minus_inf(kind, beta, side):
  # FKL stays finite when only the teacher rules entries out, RKL when only
  # the student does; JSD in both cases (the other direction is truly +inf).
  z, u, mask = _random(1)
  (u if side == "teacher" else z)[..., :2] = -np.inf
  loss, _, g = _run(kind, beta, z, u, mask)
  assert np.isfinite(loss) and np.all(np.isfinite(g))
  np.testing.assert_allclose(loss, _want(kind, beta, z, u, mask), rtol=2e-6)


@pytest.mark.parametrize("kind,beta", KINDS)
def test_fully_masked_rows_and_empty_mask(kind, beta):
  z, u, mask = _random(2)
  z[1, 2:] = -np.inf  # padded positions whose logits are all -inf
  u[1, 2:] = -np.inf
  z[1, 3] = np.nan  # garbage at a padded position must not leak either
  loss, _, g = _run(kind, beta, z, u, mask)
  assert np.isfinite(loss) and np.all(np.isfinite(g))
  loss_jit, _, g_jit = _run(kind, beta, z, u, mask, jit=True)
  assert np.all(np.isfinite(g_jit))
  np.testing.assert_allclose(loss_jit, loss, rtol=1e-6)
  np.testing.assert_array_equal(g[1, 2:], 0.0)
  with np.errstate(invalid="ignore"):
    want = _want(kind, beta, z, u, mask)  # the reference drops masked rows
  np.testing.assert_allclose(loss, want, rtol=2e-6)
  for reduction in ("token_mean", "sequence_mean", "sum"):
    loss, metrics, g = _run(kind, beta, z, u, np.zeros_like(mask),
                            reduction=reduction)
    assert loss == 0.0 and np.all(g == 0.0)
    assert all(float(v) == 0.0 for v in metrics.values())


@pytest.mark.parametrize("kind,beta", KINDS)
def test_large_logits_and_low_temperature(kind, beta):
  z, u, mask = _random(3, scale=1e4)
  loss, _, g = _run(kind, beta, z, u, mask)
  assert np.isfinite(loss) and np.all(np.isfinite(g))
  np.testing.assert_allclose(loss, _want(kind, beta, z, u, mask), rtol=1e-5)
  z, u, mask = _random(4, scale=5.0)
  loss, _, g = _run(kind, beta, z, u, mask, temperature=0.1)
  assert np.isfinite(loss) and np.all(np.isfinite(g))
  np.testing.assert_allclose(loss, _want(kind, beta, z, u, mask, tau=0.1),
                             rtol=1e-5)


@pytest.mark.parametrize("kind,beta", KINDS)
def test_bfloat16_inputs(kind, beta):
  z, u, mask = _random(5)
  zb, ub = jnp.asarray(z, jnp.bfloat16), jnp.asarray(u, jnp.bfloat16)
  loss, _, g = _run(kind, beta, zb, ub, mask)
  assert g.dtype == jnp.bfloat16
  assert np.isfinite(loss) and np.all(np.isfinite(np.asarray(g, np.float32)))
  # Computed in float32 from the bf16 values: matches the float64 reference
  # of the rounded inputs far tighter than bf16 precision.
  want = _want(kind, beta, np.asarray(zb, np.float64), np.asarray(ub, np.float64),
               mask)
  np.testing.assert_allclose(loss, want, rtol=1e-5)
