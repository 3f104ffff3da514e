"""One update step: reductions, gradient accumulation, importance weights."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from jaxdistill import models
from jaxdistill import step as step_lib

TINY = dict(family="llama", vocab_size=64, hidden_size=32, intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8, max_position_embeddings=128)


def _batch(seed=0, b=4, l=12, v=64):
  rs = np.random.default_rng(seed)
  tokens = rs.integers(3, v, size=(b, l)).astype(np.int32)
  lead = rs.integers(0, 4, size=b)       # left padding
  plen = lead + rs.integers(2, 5, size=b)  # prompt end
  rlen = rs.integers(0, l - plen.max(), size=b)  # some rows have no response
  pos = np.arange(l)[None]
  attn = (pos >= lead[:, None]) & (pos < (plen + rlen)[:, None])
  loss = (pos >= plen[:, None]) & (pos < (plen + rlen)[:, None])
  tokens = tokens * attn
  return {"tokens": tokens, "attention_mask": attn.astype(np.int32),
          "loss_mask": loss.astype(np.int32)}


@pytest.mark.parametrize("reduction",
                         ["token_mean", "sequence_mean", "sequence_sum", "sum"])
def test_loss_weights_match_numpy(reduction):
  m = _batch()["loss_mask"].astype(np.float64)
  m[1] = 0  # a row without response tokens is not counted
  w = np.asarray(step_lib.loss_weights(jnp.asarray(m), reduction))
  if reduction == "sum":
    ref = m
  elif reduction == "sequence_sum":  # sum within each row, mean over rows
    ref = m / (m.sum(1) > 0).sum()
  elif reduction == "token_mean":
    ref = m / m.sum()
  else:
    per = m.sum(1, keepdims=True)
    rows = (per[:, 0] > 0).sum()
    ref = np.where(per > 0, m / np.maximum(per, 1), 0) / rows
  np.testing.assert_allclose(w, ref, rtol=1e-6)


def _fkl_reference(s_logits, t_logits, w, tau):
  """Forward KL written out directly (independent of jaxdistill.losses)."""
  logq = jax.nn.log_softmax(s_logits / tau, -1)
  logp = jax.nn.log_softmax(t_logits / tau, -1)
  per_tok = (jnp.exp(logp) * (logp - logq)).sum(-1)
  return (per_tok * w).sum()


@pytest.mark.parametrize("grad_accum,fused", [(1, False), (4, False), (2, True)])
def test_step_gradient_equals_full_batch_reference(grad_accum, fused):
  scfg = models.ModelConfig(**TINY)
  tcfg = dataclasses.replace(scfg, hidden_size=48, head_dim=12)
  sp = models.init(scfg, jax.random.key(0))
  tp = models.init(tcfg, jax.random.key(1))
  batch = {k: jnp.asarray(v) for k, v in _batch().items()}
  batch["weights"] = step_lib.loss_weights(batch["loss_mask"], "token_mean")
  loss_cfg = ml_collections.ConfigDict(dict(
      kind="forward", beta=0.5, temperature=2.0, fused=fused, chunk_size=8))
  loss_fn = functools.partial(
      step_lib.distill_loss, student_cfg=scfg, teacher_cfg=tcfg,
      loss_cfg=loss_cfg, vocab_size=64)
  sgd = optax.sgd(1.0)  # new params = params - grad
  state = {"params": sp, "opt_state": sgd.init(sp), "step": jnp.int32(0)}
  new, metrics = jax.jit(functools.partial(
      step_lib.train_step, optimizer=sgd, schedule=lambda s: 1.0,
      loss_fn=loss_fn, grad_accum=grad_accum))(state, tp, batch)
  got_grad = jax.tree.map(lambda a, b: a - b, sp, new["params"])

  def ref_loss(p):
    s = models.apply(scfg, p, batch["tokens"], batch["attention_mask"])[:, :-1]
    t = models.apply(tcfg, tp, batch["tokens"], batch["attention_mask"])[:, :-1]
    return _fkl_reference(s, t, batch["weights"][:, 1:], 2.0)
  ref_val, ref_grad = jax.value_and_grad(ref_loss)(sp)
  np.testing.assert_allclose(metrics["train/loss"], ref_val, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4,
                                                       atol=1e-7),
               got_grad, ref_grad)


def test_mixture_importance_weight_is_q_over_behaviour():
  """rkl_surrogate on mixture rollouts weights each token by q / (lam q + (1-lam) p)."""
  captured = {}
  real = step_lib.losses.sampled_kl

  def spy(logq, logp, w, **kw):
    captured.update(kw, logq=logq, logp=logp)
    return real(logq, logp, w, **kw)
  v, b, l = 16, 2, 6
  rs = np.random.default_rng(0)
  s_logits = jnp.asarray(rs.normal(size=(b, l - 1, v)), jnp.float32)
  t_logits = jnp.asarray(rs.normal(size=(b, l - 1, v)), jnp.float32)
  batch = {"tokens": jnp.asarray(rs.integers(0, v, size=(b, l)), jnp.int32)}
  w = jnp.ones((b, l - 1))
  cfg = ml_collections.ConfigDict(dict(temperature=1.0, estimator="rkl_surrogate",
                                       iw_clip=None))
  try:
    step_lib.losses.sampled_kl = spy
    step_lib._sampled_loss(s_logits, t_logits, batch, w, cfg, "mixture", 0.3, v)  # pylint: disable=protected-access
  finally:
    step_lib.losses.sampled_kl = real
  q = np.asarray(jax.nn.softmax(s_logits, -1), np.float64)
  p = np.asarray(jax.nn.softmax(t_logits, -1), np.float64)
  y = np.asarray(batch["tokens"][:, 1:])
  qy = np.take_along_axis(q, y[..., None], -1)[..., 0]
  py = np.take_along_axis(p, y[..., None], -1)[..., 0]
  np.testing.assert_allclose(captured["importance_weight"],
                             qy / (0.3 * qy + 0.7 * py), rtol=1e-5)


def test_sft_cross_entropy_matches_numpy():
  rs = np.random.default_rng(1)
  logits = rs.normal(size=(2, 5, 11)) * 3
  targets = rs.integers(0, 9, size=(2, 5))
  w = (rs.random((2, 5)) > 0.3) / 7.0
  loss, m = step_lib._ce_loss(jnp.asarray(logits, jnp.float32),  # pylint: disable=protected-access
                              jnp.asarray(targets), jnp.asarray(w), 9)
  z = logits[..., :9]
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
  np.testing.assert_allclose(loss, (nll * w).sum(), rtol=1e-5)
  np.testing.assert_allclose(m["sft/nll"], nll[w > 0].mean(), rtol=1e-5)
