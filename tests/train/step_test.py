"""One update step: the loss dispatch, gradient accumulation, config checks.

The losses themselves (reductions, sampled estimators and their importance
weights, cross-entropy) are tested in tests/losses/."""
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


def _fkl_reference(s_logits, t_logits, w, tau, tau_t=None):
  """Forward KL written out directly (independent of jaxdistill.losses); the
  teacher at tau_t (default tau)."""
  logq = jax.nn.log_softmax(s_logits / tau, -1)
  logp = jax.nn.log_softmax(t_logits / (tau if tau_t is None else tau_t), -1)
  per_tok = (jnp.exp(logp) * (logp - logq)).sum(-1)
  return (per_tok * w).sum()


@pytest.mark.parametrize("grad_accum,fused", [(1, False), (4, False), (2, True)])
def test_step_gradient_equals_full_batch_reference(grad_accum, fused):
  scfg, tcfg, sp, tp = _tiny_pair()
  batch = {k: jnp.asarray(v) for k, v in _batch().items()}
  batch["weights"] = losses.reduction_weights(batch["loss_mask"], "token_mean")
  loss_cfg = ml_collections.ConfigDict(dict(
      kind="forward", beta=0.5, fused=fused, chunk_size=8))
  loss_fn = functools.partial(
      step_lib.distill_loss, student_cfg=scfg, teacher_cfg=tcfg,
      loss_cfg=loss_cfg, vocab_size=64, temperatures=(2.0, 0.5))
  sgd = optax.sgd(1.0)  # new params = params - grad
  state = {"params": sp, "opt_state": sgd.init(sp), "step": jnp.int32(0)}
  new, metrics = jax.jit(functools.partial(
      step_lib.train_step, optimizer=sgd, schedule=lambda s: 1.0,
      loss_fn=loss_fn, grad_accum=grad_accum))(state, tp, batch)
  got_grad = jax.tree.map(lambda a, b: a - b, sp, new["params"])

  def ref_loss(p):
    s = models.apply(scfg, p, batch["tokens"], batch["attention_mask"])[:, :-1]
    t = models.apply(tcfg, tp, batch["tokens"], batch["attention_mask"])[:, :-1]
    return _fkl_reference(s, t, batch["weights"][:, 1:], 2.0, 0.5)
  ref_val, ref_grad = jax.value_and_grad(ref_loss)(sp)
  np.testing.assert_allclose(metrics["train/loss"], ref_val, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4,
                                                       atol=1e-7),
               got_grad, ref_grad)


def _np_logsoftmax(x):
  x = np.asarray(x, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.parametrize("kind", ["sampled", "ce"])
def test_loss_sees_the_next_token_and_its_weight(kind):
  """Logits at t, token t + 1, weight t + 1 (and behaviour t + 1): the
  step's shift, against a float64 NumPy value from the models' logits."""
  scfg, tcfg, sp, tp = _tiny_pair()
  raw = _batch(seed=5, v=60)  # tokens < the real vocabulary (60 of 64)
  rs = np.random.default_rng(5)
  raw["behaviour_logprobs"] = rs.normal(-3.0, 1.0, raw["tokens"].shape)
  batch = {k: jnp.asarray(v) for k, v in raw.items()}
  batch["behaviour_logprobs"] = batch["behaviour_logprobs"].astype(jnp.float32)
  batch["weights"] = losses.reduction_weights(batch["loss_mask"], "sum")
  loss_cfg = ml_collections.ConfigDict(dict(
      kind=kind, beta=0.5, estimator="k3", iw_clip=None))
  loss, _ = step_lib.distill_loss(
      sp, tp, batch, student_cfg=scfg, teacher_cfg=tcfg, loss_cfg=loss_cfg,
      vocab_size=60, policy="coin_mixture", lam=0.4, temperatures=(1.5, 1.5))
  y = raw["tokens"][:, 1:, None]
  w = raw["loss_mask"][:, 1:].astype(np.float64)
  s = np.asarray(models.apply(scfg, sp, batch["tokens"],
                              batch["attention_mask"]))[:, :-1, :60]
  if kind == "ce":
    nll = -np.take_along_axis(_np_logsoftmax(s), y, -1)[..., 0]
    want = (w * nll).sum()
  else:
    t = np.asarray(models.apply(tcfg, tp, batch["tokens"],
                                batch["attention_mask"]))[:, :-1, :60]
    lq = np.take_along_axis(_np_logsoftmax(s / 1.5), y, -1)[..., 0]
    lp = np.take_along_axis(_np_logsoftmax(t / 1.5), y, -1)[..., 0]
    iw = np.exp(lq - raw["behaviour_logprobs"][:, 1:])  # q / b, b as given
    r = np.exp(lp - lq)
    want = (w * iw * ((r - 1) - np.log(r))).sum()
  np.testing.assert_allclose(loss, want, rtol=1e-4)


def _distill_config(**over):
  # The estimators on the rollout's own tokens (the fresh-token ones draw
  # their own tokens and accept any rollout).
  c = config_lib.load_config("configs/distill.py:runlocal,kl=sampled")
  c.loss.estimator = "k3"
  for k, val in over.items():
    node, leaf = k.rsplit(".", 1)
    c[node][leaf] = val
  return c


@pytest.mark.parametrize("over,field", [
    ({"rollout.policy": "dataset"}, "rollout.policy"),
    ({"rollout.top_k": 20}, "rollout.top_k"),
    ({"rollout.top_p": 0.9}, "rollout.top_p"),
])
def test_config_refuses_sampled_loss_with_mismatched_rollouts(over, field):
  config_lib.validate(_distill_config())  # the base is fine
  with pytest.raises(ValueError, match=f"config.{field}") as e:
    config_lib.validate(_distill_config(**over))
  other = {"rollout.policy": "dataset", "rollout.top_k": "models' temperatures",
           "rollout.top_p": "models' temperatures"}[field]
  assert other in str(e.value)
  # The exact losses and the paper's fresh-token estimators accept them.
  config_lib.validate(_distill_config(**over, **{"loss.kind": "forward"}))
  config_lib.validate(_distill_config(**over, **{"loss.estimator":
                                                 "fresh_forward"}))


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
  batch["weights"] = losses.reduction_weights(batch["loss_mask"], reduction)
  if kind == "grpo":
    n = 6
    rs = np.random.default_rng(0)
    batch = {"tokens": batch["tokens"], "attention_mask": batch["attention_mask"],
             "loss_mask": batch["loss_mask"][:, -n:],
             "old_logp": jnp.asarray(rs.normal(-3, 0.3, (8, n)), jnp.float32),
             "ref_logp": jnp.asarray(rs.normal(-3, 0.3, (8, n)), jnp.float32),
             "advantages": jnp.asarray(rs.normal(size=8), jnp.float32)}
    batch["weights"] = losses.reduction_weights(batch["loss_mask"], "token_mean")
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
  batch["weights"] = losses.reduction_weights(batch["loss_mask"], "token_mean")
  t_logits = models.apply(tcfg, tp, batch["tokens"], batch["attention_mask"])
  if cached:  # what a teacher cache holds: no teacher params in the step
    t = losses.teacher_topk(t_logits, 8, temperature=2.0)
    batch.update(zip(step_lib.CACHE_KEYS, t))
    tp_in = None
  else:
    tp_in = tp
  loss_cfg = ml_collections.ConfigDict(dict(
      kind="reverse", beta=0.5, fused=fused, chunk_size=8,
      teacher_topk=8, topk_variant=variant))
  loss_fn = functools.partial(
      step_lib.distill_loss, student_cfg=scfg, teacher_cfg=tcfg,
      loss_cfg=loss_cfg, vocab_size=64, temperatures=(2.0, 2.0))
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


# ------------------------------------- a teacher that sees its own prompt

@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
  """(student, teacher) as (torch model, (cfg, params)): tiny random Llamas
  written by transformers, read back with models.load_pretrained."""
  from tests import tiny_hf
  out = []
  for name, seed, over in (
      ("student", 0, dict(hidden_size=32, intermediate_size=64,
                          num_attention_heads=2, num_key_value_heads=1)),
      ("teacher", 1, {})):
    path = tiny_hf.make_tiny_checkpoint(
        "llama", tmp_path_factory.mktemp(name), seed=seed, **over)
    out.append((tiny_hf.make_tiny_model("llama", seed=seed, **over),
                models.load_pretrained(path, dtype="float32")))
  return out


def _left(rows, width):
  toks = np.zeros((len(rows), width), np.int32)
  mask = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    toks[i, width - len(r):], mask[i, width - len(r):] = r, 1
  return toks, mask


@pytest.mark.parametrize("kind,fused,t_lens", [
    ("forward", False, (2, 5, 3)),   # teacher prompts narrower than the student's
    ("reverse", True, (9, 3, 11)),   # and wider (fused: hidden states)
])
def test_teacher_prompt_loss_equals_two_transformers_forwards(
    hf_pair, kind, fused, t_lens):
  """The loss with teacher_tokens: the student scored on [its prompt |
  response], the teacher on [its own prompt | the same response], each row
  run alone by transformers, KL in float64 over the response tokens."""
  import torch  # pylint: disable=g-import-not-at-top
  (s_hf, s_model), (t_hf, t_model) = hf_pair
  rs = np.random.default_rng(7)
  s_prompts = [rs.integers(3, 256, n).tolist() for n in (4, 7, 2)]
  t_prompts = [rs.integers(3, 256, n).tolist() for n in t_lens]
  resps = [rs.integers(3, 256, n).tolist() for n in (6, 3, 1)]
  p, pt, n = 8, 12 if max(t_lens) > 8 else 6, 6
  sp, spm = _left(s_prompts, p)
  tp, tpm = _left(t_prompts, pt)
  resp = np.zeros((3, n), np.int32)
  rm = np.zeros((3, n), np.int32)
  for i, r in enumerate(resps):
    resp[i, :len(r)], rm[i, :len(r)] = r, 1
  batch = {"tokens": np.concatenate([sp, resp], 1),
           "attention_mask": np.concatenate([spm, rm], 1),
           "loss_mask": np.concatenate([np.zeros_like(spm), rm], 1),
           "teacher_tokens": np.concatenate([tp, resp], 1),
           "teacher_attention_mask": np.concatenate([tpm, rm], 1)}
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  batch["weights"] = losses.reduction_weights(batch["loss_mask"],
                                              "sequence_mean")
  loss_cfg = ml_collections.ConfigDict(dict(kind=kind, beta=0.5, fused=fused,
                                            chunk_size=8))
  loss, _ = jax.jit(functools.partial(
      step_lib.distill_loss, student_cfg=s_model[0], teacher_cfg=t_model[0],
      loss_cfg=loss_cfg, vocab_size=256, temperatures=(1.0, 0.5)))(
          s_model[1], t_model[1], batch)

  def logp(model, prompt, r, tau):
    with torch.no_grad():
      x = model(torch.tensor([prompt + r])).logits[0].double().numpy()
    return _np_logsoftmax(x[len(prompt) - 1:len(prompt) - 1 + len(r)] / tau)

  def reference(teacher_prompts):
    per_row = []
    for s_pr, t_pr, r in zip(s_prompts, teacher_prompts, resps):
      lq = logp(s_hf, s_pr, r, 1.0)
      lp = logp(t_hf, t_pr, r, 0.5)
      kl = ((np.exp(lp) * (lp - lq)).sum(-1) if kind == "forward"
            else (np.exp(lq) * (lq - lp)).sum(-1))
      per_row.append(kl.mean())
    return np.mean(per_row)

  want = reference(t_prompts)
  np.testing.assert_allclose(float(loss), want, rtol=2e-4)
  # The teacher's prompt matters here: under the student's it is not this.
  assert abs(reference(s_prompts) - want) > 1e-2 * want


@pytest.mark.parametrize("over,match", [
    ({"data.teacher_prompt": "no task"}, r"data.teacher_prompt: must contain"),
    ({"data.task": "synthetic"}, "data.teacher_prompt: synthetic"),
    ({"rollout.policy": "dataset", "loss.kind": "forward"},
     "data.teacher_prompt: not supported with rollout.policy='dataset'"),
    ({"loss.kind": "forward", "rollout.policy": "teacher",
      "loss.teacher_topk": 8, "loss.teacher_cache": "/tmp/c"},
     "data.teacher_prompt: not supported with loss.teacher_cache"),
    ({"data.max_teacher_prompt_len": 0}, "data.max_teacher_prompt_len"),
])
def test_config_checks_teacher_prompt(over, match):
  base = {"data.task": "countdown",
          "data.teacher_prompt": "Reason in Spanish.\n{prompt}"}
  config_lib.validate(_distill_config(**base))
  with pytest.raises(ValueError, match=match) as e:
    config_lib.validate(_distill_config(**{**base, **over}))
  assert "\n" not in str(e.value)
