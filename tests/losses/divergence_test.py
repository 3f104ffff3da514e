"""Exact divergences vs float64 NumPy values and closed-form gradients."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxdistill import losses
from tests.losses import reference as ref

B, T, V = 3, 5, 11


def _inputs(seed=0, v_s=V, v_t=V, scale=2.0):
  rng = np.random.default_rng(seed)
  z = (scale * rng.standard_normal((B, T, v_s))).astype(np.float32)
  u = (scale * rng.standard_normal((B, T, v_t))).astype(np.float32)
  mask = rng.random((B, T)) < 0.7
  mask[1] = False  # one sequence without response tokens
  mask[0, 0] = True
  return z, u, mask


def _loss_and_grad(kind, z, u, mask, **kw):
  f = lambda z: losses.divergence(z, u, mask, kind=kind, **kw)
  (loss, metrics), g = jax.value_and_grad(f, has_aux=True)(jnp.asarray(z))
  return float(loss), metrics, np.asarray(g)


@pytest.mark.parametrize("reduction", ["token_mean", "sequence_mean",
                                       "sequence_sum", "sum"])
@pytest.mark.parametrize("kind", ["forward", "reverse"])
def test_value_and_closed_form_grad(kind, reduction):
  # Vocab padding (student 11 -> 13 wide, teacher 11 -> 12) and temperature.
  z, u, mask = _inputs(v_s=V + 2, v_t=V + 1)
  tau = 0.7
  loss, metrics, g = _loss_and_grad(kind, z, u, mask, temperature=tau,
                                    reduction=reduction, vocab_size=V)
  d = ref.divergences(z[..., :V], u[..., :V], tau)
  w = ref.weights(mask, reduction)
  np.testing.assert_allclose(loss, np.sum(w * d[kind]), rtol=2e-6, atol=1e-7)
  want = ref.grad_closed_form(z[..., :V], u[..., :V], mask, kind, reduction, tau)
  np.testing.assert_allclose(g[..., :V], want, rtol=1e-5, atol=2e-7)
  np.testing.assert_array_equal(g[..., V:], 0.0)  # padding columns
  n = mask.sum()
  np.testing.assert_allclose(metrics["distill/fkl"],
                             np.sum(mask * d["forward"]) / n, rtol=2e-6)
  np.testing.assert_allclose(metrics["distill/rkl"],
                             np.sum(mask * d["reverse"]) / n, rtol=2e-6)
  assert float(metrics["distill/tokens"]) == n
  assert float(metrics["distill/loss"]) == loss


def test_token_divergence_is_per_token():
  z, u, mask = _inputs(seed=1)
  for kind in ("forward", "reverse", "jsd"):
    got = losses.token_divergence(z, u, mask, kind=kind, beta=0.3)
    want = np.where(mask, ref.divergences(z, u, beta=0.3)[kind], 0.0)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)


def _torch_jsd(z, u, mask, beta, tau, reduction):
  """JSD loss and its gradient by torch float64 autograd (independent)."""
  zt = torch.tensor(z, dtype=torch.float64, requires_grad=True)
  logq = torch.log_softmax(zt / tau, -1)
  logp = torch.log_softmax(torch.tensor(u, dtype=torch.float64) / tau, -1)
  q, p = logq.exp(), logp.exp()
  logm = torch.log(beta * p + (1 - beta) * q)
  per_tok = (beta * (p * (logp - logm)).sum(-1)
             + (1 - beta) * (q * (logq - logm)).sum(-1)) / (beta * (1 - beta))
  loss = (torch.tensor(ref.weights(mask, reduction)) * per_tok).sum()
  loss.backward()
  return loss.item(), zt.grad.numpy()


@pytest.mark.parametrize("beta,reduction", [(0.5, "token_mean"),
                                            (0.1, "sequence_mean"),
                                            (0.9, "sum")])
def test_jsd_value_and_grad_vs_torch(beta, reduction):
  z, u, mask = _inputs(seed=2)
  loss, metrics, g = _loss_and_grad("jsd", z, u, mask, beta=beta,
                                    temperature=1.3, reduction=reduction)
  want_loss, want_g = _torch_jsd(z, u, mask, beta, 1.3, reduction)
  np.testing.assert_allclose(loss, want_loss, rtol=2e-6)
  np.testing.assert_allclose(g, want_g, rtol=1e-5, atol=2e-7)
  assert "distill/jsd" in metrics


def test_jsd_limits_are_forward_and_reverse_and_continuous():
  z, u, mask = _inputs(seed=3)
  fkl, _, g_f = _loss_and_grad("forward", z, u, mask)
  rkl, _, g_r = _loss_and_grad("reverse", z, u, mask)
  j0, _, g0 = _loss_and_grad("jsd", z, u, mask, beta=0.0)
  j1, _, g1 = _loss_and_grad("jsd", z, u, mask, beta=1.0)
  assert j0 == fkl and j1 == rkl
  np.testing.assert_array_equal(g0, g_f)
  np.testing.assert_array_equal(g1, g_r)
  # Near the ends JSD(beta) matches the float64 reference to float32-level
  # accuracy (the log-ratio form avoids cancellation) and converges to the
  # limits (the gap shrinks linearly in beta, slope ~ a chi^2 divergence).
  w = ref.weights(mask, "token_mean")
  gaps = []
  for beta, limit in ((1e-3, fkl), (1e-6, fkl), (1 - 1e-3, rkl), (1 - 1e-6, rkl)):
    got = _loss_and_grad("jsd", z, u, mask, beta=beta)[0]
    want = np.sum(w * ref.divergences(z, u, beta=beta)["jsd"])
    np.testing.assert_allclose(got, want, rtol=1e-4)
    gaps.append(abs(got - limit))
  assert gaps[1] < gaps[0] / 100 and gaps[3] < gaps[2] / 100
  assert gaps[1] < 1e-3 * fkl and gaps[3] < 1e-3 * rkl


def test_wrappers_match_dispatcher():
  z, u, mask = _inputs(seed=4)
  for fn, kind in ((losses.forward_kl, "forward"), (losses.reverse_kl, "reverse")):
    assert float(fn(z, u, mask)[0]) == float(
        losses.divergence(z, u, mask, kind=kind)[0])
  assert float(losses.jsd(z, u, mask, beta=0.2)[0]) == float(
      losses.divergence(z, u, mask, kind="jsd", beta=0.2)[0])


def test_teacher_gets_no_gradient():
  z, u, mask = _inputs(seed=5)
  for kind in ("forward", "reverse", "jsd"):
    g = jax.grad(lambda u: losses.divergence(z, u, mask, kind=kind)[0])(
        jnp.asarray(u))
    np.testing.assert_array_equal(g, 0.0)


def test_jit_and_bool_int_float_masks_agree():
  z, u, mask = _inputs(seed=6)
  f = jax.jit(lambda z, u, m: losses.reverse_kl(z, u, m)[0])
  a = f(z, u, mask)
  np.testing.assert_allclose(f(z, u, mask.astype(np.int32)), a, rtol=1e-6)
  np.testing.assert_allclose(f(z, u, mask.astype(np.float32)), a, rtol=1e-6)


@pytest.mark.parametrize("kind,beta", [("forward", 0.5), ("reverse", 0.5),
                                       ("jsd", 0.3)])
def test_logit_gradient_is_the_per_token_closed_form(kind, beta):
  # Any leading shape ([B, T] here flattened to [B * T]), padded widths.
  z, u, _ = _inputs(seed=4, v_s=V + 2, v_t=V + 1)
  tau = 0.7
  grad, terms = losses.logit_gradient(
      z.reshape(B * T, -1), u.reshape(B * T, -1), kind=kind, beta=beta,
      temperature=tau, vocab_size=V)
  assert grad.shape == (B * T, V)
  ones = np.ones((B, T), bool)
  if kind == "jsd":  # torch float64 autograd of the plain formula
    want = _torch_jsd(z[..., :V], u[..., :V], ones, beta, tau, "sum")[1]
  else:
    want = ref.grad_closed_form(z[..., :V], u[..., :V], ones, kind, "sum", tau)
  np.testing.assert_allclose(grad, want.reshape(B * T, V), rtol=1e-5,
                             atol=2e-7)
  d = ref.divergences(z[..., :V], u[..., :V], tau, beta=beta)
  np.testing.assert_allclose(terms["loss"], d[kind].reshape(-1), rtol=2e-6,
                             atol=1e-7)
  np.testing.assert_allclose(terms["fkl"], d["forward"].reshape(-1),
                             rtol=2e-6, atol=1e-7)
  with pytest.raises(ValueError, match="vocab_size"):
    losses.logit_gradient(z, u, kind=kind)
