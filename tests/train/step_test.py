"""One update step: reductions, gradient accumulation, importance weights."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from jaxdistill import config_lib
from jaxdistill import losses
from jaxdistill import models
from jaxdistill.rl import grpo
from jaxdistill.train import step as step_lib

TINY = dict(family="llama", vocab_size=64, hidden_size=32, intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8, max_position_embeddings=128)


def _tiny_pair():
  """(student cfg, teacher cfg, student params, teacher params), tiny."""
  scfg = models.ModelConfig(**TINY)
  tcfg = dataclasses.replace(scfg, hidden_size=48, head_dim=12)
  return scfg, tcfg, models.init(scfg, jax.random.key(0)), models.init(
      tcfg, jax.random.key(1))


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
  scfg, tcfg, sp, tp = _tiny_pair()
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


# ---------------------------------------------------------------- sampled KL
# Expected gradients by exact enumeration over a small vocabulary (float64
# NumPy): every token y gets its own row, weighted by its probability b(y)
# under the rollout policy, so the loss's gradient IS the expectation.

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
    ("teacher", None, True), ("mixture", 0.35, False),
    ("mixture", 0.35, True)])
def test_sampled_estimators_expected_gradient_by_enumeration(
    estimator, policy, lam, given):
  v, tau = 6, 1.3
  rs = np.random.default_rng(7)
  z = rs.normal(size=v) * 3.0
  u = rs.normal(size=v) * 3.0
  grads, q, p = _closed_form_grads(z, u, tau)
  b = {"student": q, "teacher": p,
       "mixture": None if lam is None else lam * q + (1 - lam) * p}[policy]
  batch = {"tokens": jnp.asarray(np.stack([np.zeros(v), np.arange(v)], 1),
                                 jnp.int32)}  # row y samples token y
  if given:  # the rollout's own log b(y) (Rollout.behaviour_logprobs)
    batch["behaviour_logprobs"] = jnp.asarray(
        np.stack([np.zeros(v), np.log(b)], 1), jnp.float32)
  w = jnp.asarray(b[:, None], jnp.float32)  # [V, 1]: probability of row y
  cfg = ml_collections.ConfigDict(dict(temperature=tau, estimator=estimator,
                                       iw_clip=None))
  t_logits = jnp.asarray(np.tile(u, (v, 1, 1)), jnp.float32)

  def loss(zz):
    s_logits = jnp.tile(zz, (v, 1, 1))  # [V, 1, V]
    return step_lib._sampled_loss(s_logits, t_logits, batch, w, cfg, policy,  # pylint: disable=protected-access
                                  lam, v)[0]
  got = np.asarray(jax.grad(loss)(jnp.asarray(z, jnp.float32)), np.float64)
  want = grads[EXPECTED[estimator]]
  np.testing.assert_allclose(got, want, atol=2e-6)
  # The two KL gradients differ here, so a wrong direction cannot pass.
  assert np.abs(grads["forward"] - grads["reverse"]).max() > 0.05


def test_sampled_estimators_refuse_dataset_policy():
  batch = {"tokens": jnp.zeros((1, 3), jnp.int32)}
  cfg = ml_collections.ConfigDict(dict(temperature=1.0, estimator="k3",
                                       iw_clip=None))
  x = jnp.zeros((1, 2, 5))
  with pytest.raises(ValueError, match="rollout.policy='dataset'"):
    step_lib._sampled_loss(x, x, batch, jnp.ones((1, 2)), cfg, "dataset",  # pylint: disable=protected-access
                           None, 5)


def _distill_config(**over):
  c = config_lib.load_config("configs/distill.py:runlocal,kl=sampled")
  for k, val in over.items():
    node, leaf = k.rsplit(".", 1)
    c[node][leaf] = val
  return c


@pytest.mark.parametrize("over,field", [
    ({"rollout.policy": "dataset"}, "rollout.policy"),
    ({"rollout.temperature": 0.7}, "rollout.temperature"),
    ({"rollout.top_k": 20}, "rollout.top_k"),
    ({"rollout.top_p": 0.9}, "rollout.top_p"),
])
def test_config_refuses_sampled_loss_with_mismatched_rollouts(over, field):
  config_lib.validate(_distill_config())  # the base is fine
  with pytest.raises(ValueError, match=f"config.{field}") as e:
    config_lib.validate(_distill_config(**over))
  other = {"rollout.policy": "dataset", "rollout.temperature": "loss.temperature",
           "rollout.top_k": "loss.temperature",
           "rollout.top_p": "loss.temperature"}[field]
  assert other in str(e.value)
  # The exact losses accept the same rollouts.
  config_lib.validate(_distill_config(**over, **{"loss.kind": "forward"}))


# ------------------------------------------------ metrics under grad_accum

def _run_step(loss_fn, batch, params, teacher, grad_accum):
  sgd = optax.sgd(0.0)
  state = {"params": params, "opt_state": sgd.init(params), "step": jnp.int32(0)}
  _, metrics = jax.jit(functools.partial(
      step_lib.train_step, optimizer=sgd, schedule=lambda s: 1.0,
      loss_fn=loss_fn, grad_accum=grad_accum))(state, teacher, batch)
  return {k: float(v) for k, v in metrics.items()}


@pytest.mark.slow  # compiles eight tiny train steps
@pytest.mark.parametrize("kind", ["forward", "sampled", "ce", "grpo"])
def test_logged_metrics_do_not_depend_on_grad_accum(kind):
  scfg, tcfg, sp, tp = _tiny_pair()
  raw = _batch(seed=3, b=8)
  raw["loss_mask"][1] = 0  # micro-batches with very different token counts
  raw["loss_mask"][:4, -2:] = 0
  batch = {k: jnp.asarray(v) for k, v in raw.items()}
  reduction = "sequence_mean" if kind == "forward" else "token_mean"
  batch["weights"] = step_lib.loss_weights(batch["loss_mask"], reduction)
  if kind == "grpo":
    n = 6
    rs = np.random.default_rng(0)
    batch = {"tokens": batch["tokens"], "attention_mask": batch["attention_mask"],
             "loss_mask": batch["loss_mask"][:, -n:],
             "old_logp": jnp.asarray(rs.normal(-3, 0.3, (8, n)), jnp.float32),
             "ref_logp": jnp.asarray(rs.normal(-3, 0.3, (8, n)), jnp.float32),
             "advantages": jnp.asarray(rs.normal(size=8), jnp.float32)}
    batch["weights"] = step_lib.loss_weights(batch["loss_mask"], "token_mean")
    cfgs = ml_collections.ConfigDict(dict(
        g=dict(clip_low=0.2, clip_high=0.2), kl=dict(coef=0.1, estimator="k3")))
    loss_fn = functools.partial(grpo.grpo_loss, cfg=scfg, grpo_cfg=cfgs.g,
                                kl_cfg=cfgs.kl, temperature=1.0)
  else:
    loss_cfg = ml_collections.ConfigDict(dict(
        kind=kind, beta=0.5, temperature=1.0, estimator="k3", iw_clip=None))
    loss_fn = functools.partial(
        step_lib.distill_loss, student_cfg=scfg, teacher_cfg=tcfg,
        loss_cfg=loss_cfg, vocab_size=64,
        policy="teacher" if kind == "sampled" else "student")
  m1 = _run_step(loss_fn, batch, sp, tp, 1)
  m4 = _run_step(loss_fn, batch, sp, tp, 4 if kind != "grpo" else 2)
  assert m1.keys() == m4.keys() and "_mean_weight" not in m1
  for k in m1:
    np.testing.assert_allclose(m4[k], m1[k], rtol=2e-5, atol=1e-7, err_msg=k)
  mask = raw["loss_mask"][:, 1:] > 0
  if kind == "forward":
    # Independent reference for the full batch: float64 FKL/RKL from the
    # models' logits, weighted like the sequence_mean reduction.
    s = np.asarray(models.apply(scfg, sp, batch["tokens"],
                                batch["attention_mask"]), np.float64)[:, :-1]
    t = np.asarray(models.apply(tcfg, tp, batch["tokens"],
                                batch["attention_mask"]), np.float64)[:, :-1]
    lq = s - np.log(np.exp(s).sum(-1, keepdims=True))
    lp = t - np.log(np.exp(t).sum(-1, keepdims=True))
    fkl = (np.exp(lp) * (lp - lq)).sum(-1)
    w = np.asarray(batch["weights"], np.float64)[:, 1:]
    np.testing.assert_allclose(m4["distill/loss"], (w * fkl).sum(), rtol=1e-5)
    np.testing.assert_allclose(m4["distill/fkl"], (w * fkl).sum() / w.sum(),
                               rtol=1e-5)
    assert m4["distill/tokens"] == mask.sum()
  if kind == "ce":
    assert m4["sft/tokens"] == mask.sum()


# ------------------------------------------------ the teacher's top-k (issue 19)

def _topk_reference(s_logits, t_logits, w, tau, k, variant):
  """Top-k reverse KL written out directly from the full logits (independent
  of jaxdistill.losses): sort, keep k, renormalise or add the tail bucket."""
  logq = jax.nn.log_softmax(s_logits / tau, -1)
  logp = jax.nn.log_softmax(t_logits / tau, -1)
  order = jnp.argsort(-logp, axis=-1)[..., :k]
  lq, lp = (jnp.take_along_axis(x, order, -1) for x in (logq, logp))
  if variant == "tail":
    rest = lambda x: jnp.log1p(-jnp.exp(x).sum(-1, keepdims=True))
    lq, lp = (jnp.concatenate([x, rest(x)], -1) for x in (lq, lp))
  lq, lp = jax.nn.log_softmax(lq, -1), jax.nn.log_softmax(lp, -1)
  per_tok = (jnp.exp(lq) * (lq - lp)).sum(-1)
  return (per_tok * w).sum()


@pytest.mark.parametrize("fused,variant,cached", [
    (False, "renorm", False), (True, "tail", False), (True, "renorm", True),
    (False, "tail", True)])
def test_step_with_teacher_topk_matches_reference(fused, variant, cached):
  scfg, tcfg, sp, tp = _tiny_pair()
  batch = {k: jnp.asarray(v) for k, v in _batch().items()}
  batch["weights"] = step_lib.loss_weights(batch["loss_mask"], "token_mean")
  t_logits = models.apply(tcfg, tp, batch["tokens"], batch["attention_mask"])
  if cached:  # what a teacher cache holds: no teacher params in the step
    t = losses.teacher_topk(t_logits, 8, temperature=2.0)
    batch.update(zip(step_lib.CACHE_KEYS, t))
    tp_in = None
  else:
    tp_in = tp
  loss_cfg = ml_collections.ConfigDict(dict(
      kind="reverse", beta=0.5, temperature=2.0, fused=fused, chunk_size=8,
      teacher_topk=8, topk_variant=variant))
  loss_fn = functools.partial(
      step_lib.distill_loss, student_cfg=scfg, teacher_cfg=tcfg,
      loss_cfg=loss_cfg, vocab_size=64)
  (loss, metrics), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(
      sp, tp_in, batch)

  def ref_loss(p):
    s = models.apply(scfg, p, batch["tokens"], batch["attention_mask"])[:, :-1]
    return _topk_reference(s, t_logits[:, :-1], batch["weights"][:, 1:], 2.0,
                           8, variant)
  ref_val, ref_grad = jax.value_and_grad(ref_loss)(sp)
  np.testing.assert_allclose(loss, ref_val, rtol=1e-4)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4,
                                                       atol=1e-7),
               grads, ref_grad)
  assert 0 < float(metrics["distill/topk_mass"]) < 1


@pytest.mark.parametrize("over,field", [
    ({"loss.teacher_topk": 0}, "loss.teacher_topk"),
    ({"loss.teacher_topk": 8, "loss.kind": "sampled"}, "loss.teacher_topk"),
    ({"loss.topk_variant": "bucket"}, "loss.topk_variant"),
    ({"loss.teacher_cache": "/tmp/c"}, "loss.teacher_cache"),
    ({"loss.teacher_cache": "/tmp/c", "loss.teacher_topk": 8,
      "rollout.policy": "student"}, "loss.teacher_cache"),
])
def test_config_checks_teacher_topk(over, field):
  base = {"loss.kind": "forward", "rollout.policy": "teacher"}
  config_lib.validate(_distill_config(**base, **{"loss.teacher_topk": 8}))
  with pytest.raises(ValueError, match=f"config.{field}"):
    config_lib.validate(_distill_config(**{**base, **over}))
