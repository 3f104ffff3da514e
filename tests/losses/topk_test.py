"""Top-k teacher losses vs float64 NumPy values and torch float64 autograd."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxdistill import losses
from tests.losses import reference as ref

B, T, V = 3, 5, 11
TAU = 0.7


def _inputs(seed=0, v_s=V + 2, v_t=V + 1, scale=2.0):
  rng = np.random.default_rng(seed)
  z = (scale * rng.standard_normal((B, T, v_s))).astype(np.float32)
  u = (scale * rng.standard_normal((B, T, v_t))).astype(np.float32)
  mask = rng.random((B, T)) < 0.7
  mask[1] = False  # one sequence without response tokens
  mask[0, 0] = True
  return z, u, mask


def _topk_ref(z, u, k, variant, tau=TAU, beta=0.5):
  """Per-position top-k divergences in float64, from the FULL logits."""
  logp = ref.log_softmax(np.asarray(u, np.float64) / tau)
  logq = ref.log_softmax(np.asarray(z, np.float64) / tau)
  ids = np.argsort(-logp, axis=-1, kind="stable")[..., :k]
  lp_s = np.take_along_axis(logp, ids, -1)
  lq_s = np.take_along_axis(logq, ids, -1)
  if variant == "tail" and k < logp.shape[-1]:
    out = np.ones(logp.shape, bool)
    np.put_along_axis(out, ids, False, -1)
    tail = lambda lx: np.log(np.sum(np.where(out, np.exp(lx), 0.0), -1))
    lp_s = np.concatenate([lp_s, tail(logp)[..., None]], -1)
    lq_s = np.concatenate([lq_s, tail(logq)[..., None]], -1)
  # The bucket log-probs are the logits of the k (+1)-entry distributions
  # (renorm: log_softmax renormalises them over the top-k).
  return ref.divergences(lq_s, lp_s, tau=1.0, beta=beta)


def _torch_loss_grad(z, u, mask, k, variant, kind, reduction, beta=0.5):
  """The top-k loss and d loss / d z by torch float64 autograd."""
  zt = torch.tensor(z, dtype=torch.float64, requires_grad=True)
  logq = torch.log_softmax(zt / TAU, -1)
  logp = torch.log_softmax(torch.tensor(u, dtype=torch.float64) / TAU, -1)
  ids = torch.topk(logp, k, -1).indices
  lq, lp = logq.gather(-1, ids), logp.gather(-1, ids)
  if variant == "tail" and k < logp.shape[-1]:
    out = torch.ones(logp.shape, dtype=torch.bool).scatter(-1, ids, False)
    neg = torch.tensor(-np.inf, dtype=torch.float64)
    lq = torch.cat([lq, torch.logsumexp(torch.where(out, logq, neg), -1,
                                        keepdim=True)], -1)
    lp = torch.cat([lp, torch.logsumexp(torch.where(out, logp, neg), -1,
                                        keepdim=True)], -1)
  lq, lp = torch.log_softmax(lq, -1), torch.log_softmax(lp, -1)
  q, p = lq.exp(), lp.exp()
  if kind == "forward":
    per = (p * (lp - lq)).sum(-1)
  elif kind == "reverse":
    per = (q * (lq - lp)).sum(-1)
  else:
    lm = torch.log(beta * p + (1 - beta) * q)
    per = (beta * (p * (lp - lm)).sum(-1)
           + (1 - beta) * (q * (lq - lm)).sum(-1)) / (beta * (1 - beta))
  loss = (torch.tensor(ref.weights(mask, reduction)) * per).sum()
  loss.backward()
  return loss.item(), zt.grad.numpy()


def _ours(z, u, mask, k, variant, kind, give_tail=True, **kw):
  t = losses.teacher_topk(u, k, temperature=TAU, vocab_size=V)
  tail = t.tail if give_tail else None

  def f(z):
    return losses.topk_divergence(z, t.ids, t.logprobs, mask, kind=kind,
                                  temperature=TAU, vocab_size=V,
                                  variant=variant, teacher_tail=tail, **kw)
  (loss, metrics), g = jax.value_and_grad(f, has_aux=True)(jnp.asarray(z))
  return float(loss), metrics, np.asarray(g)


@pytest.mark.parametrize("variant", ["renorm", "tail"])
@pytest.mark.parametrize("kind", ["forward", "reverse", "jsd"])
def test_k_equal_to_vocab_is_the_exact_loss(kind, variant):
  z, u, mask = _inputs()
  loss, _, g = _ours(z, u, mask, V, variant, kind, beta=0.3,
                     reduction="sequence_mean")
  d = ref.divergences(z[..., :V], u[..., :V], TAU, beta=0.3)
  w = ref.weights(mask, "sequence_mean")
  np.testing.assert_allclose(loss, np.sum(w * d[kind]), rtol=2e-6)
  if kind != "jsd":
    want = ref.grad_closed_form(z[..., :V], u[..., :V], mask, kind,
                                "sequence_mean", TAU)
    np.testing.assert_allclose(g[..., :V], want, rtol=1e-5, atol=2e-7)
  np.testing.assert_array_equal(g[..., V:], 0.0)  # padding columns


@pytest.mark.parametrize("variant", ["renorm", "tail"])
@pytest.mark.parametrize("kind,reduction", [("forward", "token_mean"),
                                            ("reverse", "sequence_sum"),
                                            ("jsd", "sum")])
def test_value_and_grad_vs_float64(kind, reduction, variant):
  z, u, mask = _inputs(seed=1)
  k = 4
  loss, metrics, g = _ours(z, u, mask, k, variant, kind, reduction=reduction)
  d = _topk_ref(z[..., :V], u[..., :V], k, variant)
  np.testing.assert_allclose(
      loss, np.sum(ref.weights(mask, reduction) * d[kind]), rtol=2e-6)
  t_loss, t_grad = _torch_loss_grad(z[..., :V], u[..., :V], mask, k, variant,
                                    kind, reduction)
  np.testing.assert_allclose(loss, t_loss, rtol=2e-6)
  np.testing.assert_allclose(g[..., :V], t_grad, rtol=1e-5, atol=2e-7)
  np.testing.assert_array_equal(g[..., V:], 0.0)
  n = mask.sum()
  np.testing.assert_allclose(metrics["distill/fkl"],
                             np.sum(mask * d["forward"]) / n, rtol=2e-6)
  np.testing.assert_allclose(metrics["distill/rkl"],
                             np.sum(mask * d["reverse"]) / n, rtol=2e-6)
  mass = np.exp(np.sort(ref.log_softmax(u[..., :V] / TAU), -1)[..., -k:]
                ).sum(-1)
  np.testing.assert_allclose(metrics["distill/topk_mass"],
                             np.sum(mask * mass) / n, rtol=2e-6)
  if variant == "renorm":  # the student's mass off the top-k gets no gradient
    off = np.ones((B, T, V), bool)
    np.put_along_axis(off, np.argsort(-u[..., :V], -1)[..., :k], False, -1)
    np.testing.assert_array_equal(g[..., :V][off], 0.0)


@pytest.mark.parametrize("kind", ["forward", "reverse"])
def test_tail_rebuilt_from_logprobs(kind):
  # Without the exact tail the tail variant uses 1 - sum of the top-k probs.
  z, u, mask = _inputs(seed=2)
  loss, _, g = _ours(z, u, mask, 5, "tail", kind, give_tail=False)
  d = _topk_ref(z[..., :V], u[..., :V], 5, "tail")
  np.testing.assert_allclose(loss, np.sum(ref.weights(mask, "token_mean") *
                                          d[kind]), rtol=1e-5)
  _, t_grad = _torch_loss_grad(z[..., :V], u[..., :V], mask, 5, "tail", kind,
                               "token_mean")
  np.testing.assert_allclose(g[..., :V], t_grad, rtol=1e-4, atol=1e-6)


def test_tiny_tail_stays_finite_and_exact():
  # A peaked teacher: its top-2 mass rounds to 1 in float32, the tail is
  # ~1e-13. The exact tail (from the logits) keeps the reverse KL finite and
  # equal to the float64 value.
  z, u, mask = _inputs(seed=3, v_s=V, v_t=V)
  u[..., 0] += 30.0
  u[..., 1] += 30.0
  loss, _, g = _ours(z, u, mask, 2, "tail", "reverse")
  d = _topk_ref(z, u, 2, "tail")
  np.testing.assert_allclose(loss, np.sum(ref.weights(mask, "token_mean") *
                                          d["reverse"]), rtol=1e-5)
  assert np.all(np.isfinite(g))


@pytest.mark.parametrize("kind,variant", [("forward", "renorm"),
                                          ("reverse", "tail"), ("jsd", "tail")])
def test_fused_topk_vs_float64(kind, variant):
  rng = np.random.default_rng(4)
  d_s, d_t, k = 6, 5, 4
  hs = rng.standard_normal((B, T, d_s)).astype(np.float32)
  ws = rng.standard_normal((d_s, V + 2)).astype(np.float32)
  ht = rng.standard_normal((B, T, d_t)).astype(np.float32)
  wt = rng.standard_normal((d_t, V + 1)).astype(np.float32)
  _, _, mask = _inputs(seed=4)
  z, u = hs @ ws, ht @ wt
  t = losses.teacher_topk(u, k, temperature=TAU, vocab_size=V)
  kw = dict(kind=kind, temperature=TAU, vocab_size=V, chunk_size=2,
            reduction="sequence_mean")
  live = lambda hs, ws: losses.fused_divergence(
      hs, ws, ht, wt, mask, teacher_topk=k, topk_variant=variant, **kw)
  given = lambda hs, ws: losses.fused_topk_divergence(
      hs, ws, t.ids, t.logprobs, mask, teacher_tail=t.tail, variant=variant,
      **kw)
  d = _topk_ref(z[..., :V], u[..., :V], k, variant)
  want = np.sum(ref.weights(mask, "sequence_mean") * d[kind])
  _, g_z = _torch_loss_grad(z[..., :V], u[..., :V], mask, k, variant, kind,
                            "sequence_mean")
  g_z = np.pad(g_z, [(0, 0), (0, 0), (0, 2)])
  for f in (live, given):
    (loss, metrics), (g_hs, g_ws) = jax.value_and_grad(
        f, argnums=(0, 1), has_aux=True)(jnp.asarray(hs), jnp.asarray(ws))
    np.testing.assert_allclose(loss, want, rtol=2e-6)
    np.testing.assert_allclose(g_hs, g_z @ ws.T.astype(np.float64),
                               rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(
        g_ws, np.einsum("bts,btv->sv", hs.astype(np.float64), g_z),
        rtol=1e-4, atol=1e-6)
    assert "distill/topk_mass" in metrics


def test_teacher_topk_is_topk_of_the_real_vocabulary():
  z, u, _ = _inputs(seed=5)
  u[..., V] = 100.0  # a padding column the top-k must never pick
  t = losses.teacher_topk(u, 3, temperature=TAU, vocab_size=V)
  logp = ref.log_softmax(u[..., :V] / TAU)
  want = np.sort(logp, -1)[..., ::-1][..., :3]
  np.testing.assert_allclose(t.logprobs, want, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(np.take_along_axis(logp, np.asarray(t.ids), -1),
                                np.asarray(want))
  rest = np.log(1 - np.exp(want).sum(-1))
  np.testing.assert_allclose(t.tail, rest, rtol=1e-5)
  del z


@pytest.mark.parametrize("call,match", [
    (lambda z, t, m: losses.topk_divergence(z, t.ids, t.logprobs, m,
                                            variant="bucket"), "variant"),
    (lambda z, t, m: losses.topk_divergence(z, t.ids.astype(jnp.float32),
                                            t.logprobs, m), "teacher_ids"),
    (lambda z, t, m: losses.topk_divergence(z, t.ids, t.logprobs[..., :2], m),
     "teacher_logprobs"),
    (lambda z, t, m: losses.topk_divergence(z[..., :3], t.ids[..., :3],
                                            t.logprobs[..., :3], m,
                                            vocab_size=2), "exceeds the real"),
    (lambda z, t, m: losses.topk_divergence(z, t.ids, t.logprobs, m,
                                            teacher_tail=t.tail[0]),
     "teacher_tail"),
    (lambda z, t, m: losses.teacher_topk(z, 0), "k must"),
    (lambda z, t, m: losses.teacher_topk(z, V + 3), "exceeds"),
])
def test_bad_arguments_are_named(call, match):
  z, u, mask = _inputs(seed=6, v_s=V, v_t=V)
  t = losses.teacher_topk(u, 4)
  with pytest.raises(ValueError, match=match):
    call(jnp.asarray(z), t, mask)
