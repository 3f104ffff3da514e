"""Sampled estimators: values, and Monte Carlo checks of the expected gradient.

Each estimator's gradient w.r.t. the student logits, averaged over N sampled
tokens, is compared with the exact gradient of the divergence it claims (the
closed forms of docs/method.md), within 5 standard errors computed from the
per-sample gradients. The per-sample gradients come from an independent NumPy
formula: d estimator / d z = weight * c(y) * (onehot(y) - q).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdistill import losses
from tests.losses import reference as ref

V, N = 6, 100_000
RNG = np.random.default_rng(1234)
Z = 1.5 * RNG.standard_normal(V)  # student logits (the parameters)
U = 1.5 * RNG.standard_normal(V)  # teacher logits
D = ref.divergences(Z, U)
Q, P = D["q"], D["p"]
GRAD = {  # exact gradients w.r.t. z (tau = 1)
    "fkl": Q - P,
    "rkl": Q * (D["logq"] - D["logp"] - D["reverse"]),
    "zero": np.zeros(V),
}


def _coef(estimator, lq, lp):
  """d estimator / d log q(y) as a NumPy formula."""
  r = np.exp(lp - lq)
  return {"k1": np.ones_like(lq), "k2": lq - lp, "k3": 1.0 - r,
          "rkl_surrogate": lq - lp}[estimator]


def _mc_gradient(estimator, sampler, weighted):
  """MC gradient w.r.t. z, the per-sample gradients, and the metrics.

  JAX gives d loss / d log q(y_i) per sampled token; the chain rule to the
  logits, d log q(y) / d z = onehot(y) - q, is applied in float64 so that
  float32 sums over N samples do not blur the comparison.
  """
  y = np.random.default_rng(7).choice(V, size=N, p=Q if sampler == "student" else P)
  lq, lp = D["logq"][y], D["logp"][y]
  iw = np.exp(lq - lp) if weighted else None
  (_, metrics), g_lq = jax.value_and_grad(
      lambda a: losses.sampled_kl(
          a, jnp.asarray(lp[None], jnp.float32), jnp.ones((1, N), bool),
          estimator=estimator,
          importance_weight=None if iw is None else jnp.asarray(iw[None], jnp.float32)),
      has_aux=True)(jnp.asarray(lq[None], jnp.float32))
  g_lq = np.asarray(g_lq, np.float64)[0]  # [N]
  c = _coef(estimator, lq, lp) * (1.0 if iw is None else iw)
  # The loss is the token mean of weight * estimator: per-token gradient c / N.
  np.testing.assert_allclose(g_lq * N, c, rtol=1e-5, atol=1e-6)
  onehot_minus_q = np.eye(V)[y] - Q  # [N, V]
  return g_lq @ onehot_minus_q, c[:, None] * onehot_minus_q, metrics


@pytest.mark.parametrize("estimator,sampler,weighted,target", [
    ("k1", "student", False, "zero"),
    ("k2", "student", False, "rkl"),
    ("k3", "student", False, "fkl"),  # the trap
    ("rkl_surrogate", "student", False, "rkl"),
    ("k1", "teacher", True, "zero"),
    ("k2", "teacher", True, "rkl"),
    ("k3", "teacher", True, "fkl"),
    ("rkl_surrogate", "teacher", True, "rkl"),
])
def test_expected_gradient(estimator, sampler, weighted, target):
  g, per_sample, _ = _mc_gradient(estimator, sampler, weighted)
  # The MC mean's expectation is the claimed exact gradient.
  se = per_sample.std(0) / np.sqrt(N)
  assert np.all(np.abs(g - GRAD[target]) <= 5 * se + 1e-6), (g, GRAD[target], se)
  # The claim is discriminating: the other candidates are many errors away.
  for other in {"fkl", "rkl", "zero"} - {target}:
    assert np.max(np.abs(g - GRAD[other]) / (se + 1e-9)) > 20, other


def test_value_estimates_of_reverse_kl():
  # On student samples k1 and k3 are unbiased estimates of the RKL value.
  y = np.random.default_rng(7).choice(V, size=N, p=Q)
  log_r = D["logp"][y] - D["logq"][y]
  _, _, metrics = _mc_gradient("k3", "student", False)
  for k, vals in (("k1", -log_r), ("k3", np.expm1(log_r) - log_r)):
    np.testing.assert_allclose(metrics[f"distill/{k}"], vals.mean(), rtol=1e-4)
    assert abs(vals.mean() - D["reverse"]) < 5 * vals.std() / np.sqrt(N)


@pytest.mark.parametrize("reduction", ["token_mean", "sequence_mean",
                                       "sequence_sum", "sum"])
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3", "rkl_surrogate"])
def test_values(estimator, reduction):
  rng = np.random.default_rng(3)
  lq = np.log(rng.uniform(0.01, 1.0, (3, 5))).astype(np.float32)
  lp = np.log(rng.uniform(0.01, 1.0, (3, 5))).astype(np.float32)
  iw = rng.uniform(0.0, 2.0, (3, 5)).astype(np.float32)
  mask = rng.random((3, 5)) < 0.6
  mask[2] = False
  lq64, lp64 = lq.astype(np.float64), lp.astype(np.float64)
  log_r = lp64 - lq64
  per_tok = {"k1": -log_r, "k2": 0.5 * log_r ** 2,
             "k3": np.exp(log_r) - 1 - log_r, "rkl_surrogate": -log_r * lq64}
  w = ref.weights(mask, reduction)
  loss, metrics = losses.sampled_kl(lq, lp, mask, estimator=estimator,
                                    importance_weight=iw, reduction=reduction)
  np.testing.assert_allclose(loss, np.sum(w * iw * per_tok[estimator]), rtol=1e-5)
  for k in ("k1", "k2", "k3"):
    np.testing.assert_allclose(metrics[f"distill/{k}"],
                               np.sum(mask * iw * per_tok[k]) / mask.sum(),
                               rtol=1e-5)
  # Gradient w.r.t. log q: weight * d estimator / d log q; none to the teacher.
  gq, gp = jax.grad(
      lambda a, b: losses.sampled_kl(a, b, mask, estimator=estimator,
                                     importance_weight=iw, reduction=reduction)[0],
      argnums=(0, 1))(lq, lp)
  np.testing.assert_allclose(gq, w * iw * _coef(estimator, lq64, lp64),
                             rtol=1e-5, atol=1e-7)
  np.testing.assert_array_equal(gp, 0.0)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3", "rkl_surrogate"])
def test_nan_safety(estimator):
  lq = np.full((2, 4), -1.0, np.float32)
  lp = np.full((2, 4), -2.0, np.float32)
  mask = np.ones((2, 4), bool)
  lq[1, 2:] = -np.inf  # padded positions
  lp[1, 3] = np.nan
  mask[1, 2:] = False
  iw = np.ones((2, 4), np.float32)
  iw[0, 1] = 0.0  # weight underflowed to 0 on a token with an infinite ratio
  lq[0, 1] = -np.inf
  f = jax.jit(jax.value_and_grad(
      lambda a: losses.sampled_kl(a, lp, mask, estimator=estimator,
                                  importance_weight=iw)[0]))
  loss, g = f(lq)
  assert np.isfinite(loss) and np.all(np.isfinite(g))
  np.testing.assert_array_equal(np.asarray(g)[1, 2:], 0.0)
  loss0, g0 = jax.value_and_grad(
      lambda a: losses.sampled_kl(a, lp, np.zeros_like(mask),
                                  estimator=estimator)[0])(lq)
  assert float(loss0) == 0.0 and np.all(np.asarray(g0) == 0.0)


# ------------------------------------------- importance weights, from logits
# Expected gradients by exact enumeration over a small vocabulary (float64
# NumPy): every token y gets its own row, weighted by its probability b(y)
# under the rollout policy, so the loss's gradient IS the expectation. This
# runs through `sampled_kl_from_logits`, the training step's sampled loss.

def _closed_form_grads(z, u, tau):
  """float64 gradients w.r.t. the student logits z of FKL and RKL at tau."""
  lq = z / tau - np.log(np.exp(z / tau).sum())
  lp = u / tau - np.log(np.exp(u / tau).sum())
  q, p = np.exp(lq), np.exp(lp)
  rkl = np.sum(q * (lq - lp))
  return {"forward": (q - p) / tau, "reverse": q * (lq - lp - rkl) / tau,
          "zero": np.zeros_like(z)}, q, p

# Which gradient each estimator follows, under every policy once weighted.
EXPECTED = {"k1": "zero", "k2": "reverse", "k3": "forward",
            "rkl_surrogate": "reverse"}


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3", "rkl_surrogate"])
@pytest.mark.parametrize("policy,lam,given", [
    ("student", None, False), ("teacher", None, False),
    ("teacher", None, True), ("coin_mixture", 0.35, False),
    ("coin_mixture", 0.35, True)])
def test_expected_gradient_from_logits_by_enumeration(
    estimator, policy, lam, given):
  v, tau = 6, 1.3
  rs = np.random.default_rng(7)
  z = rs.normal(size=v) * 3.0
  u = rs.normal(size=v) * 3.0
  grads, q, p = _closed_form_grads(z, u, tau)
  b = {"student": q, "teacher": p,
       "coin_mixture": None if lam is None else lam * q + (1 - lam) * p}[policy]
  tokens = jnp.asarray(np.arange(v)[:, None], jnp.int32)  # row y samples y
  # The rollout's own log b(y) (Rollout.behaviour_logprobs), if given.
  behaviour = jnp.asarray(np.log(b)[:, None], jnp.float32) if given else None
  w = jnp.asarray(b[:, None], jnp.float32)  # [V, 1]: probability of row y
  t_logits = jnp.asarray(np.tile(u, (v, 1, 1)), jnp.float32)

  def loss(zz):
    s_logits = jnp.tile(zz, (v, 1, 1))  # [V, 1, V]
    return losses.sampled_kl_from_logits(
        s_logits, t_logits, tokens, w, estimator=estimator, temperature=tau,
        policy=policy, lam=lam, behaviour_logprobs=behaviour,
        reduction="sum")[0]
  got = np.asarray(jax.grad(loss)(jnp.asarray(z, jnp.float32)), np.float64)
  want = grads[EXPECTED[estimator]]
  np.testing.assert_allclose(got, want, atol=2e-6)
  # The two KL gradients differ here, so a wrong direction cannot pass.
  assert np.abs(grads["forward"] - grads["reverse"]).max() > 0.05


@pytest.mark.parametrize("lam", [0.3, 0.0, 1.0])
def test_mixture_importance_weight_is_q_over_behaviour(lam):
  """q / (lam q + (1-lam) p), rebuilt from the log-probs (no behaviour)."""
  rs = np.random.default_rng(0)
  qy, py = rs.random((2, 5)), rs.random((2, 5))
  iw = losses.importance_weights(jnp.asarray(np.log(qy), jnp.float32),
                                 jnp.asarray(np.log(py), jnp.float32),
                                 "coin_mixture", lam)
  np.testing.assert_allclose(iw, qy / (lam * qy + (1 - lam) * py), rtol=1e-5)
  np.testing.assert_allclose(  # teacher rollouts: q / p
      losses.importance_weights(jnp.log(qy), jnp.log(py), "teacher"), qy / py,
      rtol=1e-5)
  assert losses.importance_weights(jnp.log(qy), jnp.log(py), "student") is None


def test_sampled_estimators_refuse_dataset_policy():
  x = jnp.zeros((1, 2, 5))
  with pytest.raises(ValueError, match="rollout.policy='dataset'"):
    losses.sampled_kl_from_logits(x, x, jnp.zeros((1, 2), jnp.int32),
                                  jnp.ones((1, 2)), estimator="k3",
                                  policy="dataset")
  with pytest.raises(ValueError, match="rollout.lam"):
    losses.importance_weights(jnp.zeros((1, 2)), jnp.zeros((1, 2)), "coin_mixture")
