"""One distillation update, as pure functions.

A batch is a dict of [B, L] arrays over whole sequences (left-padded prompt,
then the response, then right padding):

  tokens          int32  token ids
  attention_mask  int32  1 for real tokens (prompt and response)
  loss_mask       int32  1 where the token is a response token (to be predicted)
  behaviour_logprobs  float32, optional: log-prob of each response token under
                  the policy that sampled it (Rollout.behaviour_logprobs, the
                  mixture's for a mixture; 0 elsewhere). Only the sampled
                  estimators' importance weights use it; without it they are
                  rebuilt from the training logits.

Logits at position t predict token t + 1, so the loss at t is weighted by
loss_mask[t + 1]. The reduction is turned into per-token weights normalised
over the WHOLE batch before it is split into micro-batches for gradient
accumulation; the accumulated loss is therefore exactly the full-batch loss.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxdistill import losses
from jaxdistill import models

PyTree = Any

# How train_step merges a loss function's micro-batch metrics. Keys ending in
# one of ADDITIVE_METRICS are sums over tokens (the loss, with globally
# normalised weights, and token counts): they add up. Every other metric is a
# weighted mean over the micro-batch's tokens whose weight the loss function
# returns under MEAN_WEIGHT (dropped from the result): merged as
# sum_i m_i W_i / sum_i W_i, exactly the full-batch mean. Without MEAN_WEIGHT
# the micro-batch means are averaged.
ADDITIVE_METRICS = ("/loss", "/tokens", "/pg_loss")
MEAN_WEIGHT = "_mean_weight"


def loss_weights(loss_mask: jax.Array, reduction: str) -> jax.Array:
  """[B, L] 0/1 mask -> [B, L] float32 weights implementing `reduction`.

  token_mean: every response token of the batch counts the same;
  sequence_mean: token mean within each sequence, then mean over sequences;
  sequence_sum: sum within each sequence, then mean over sequences;
  sum: sum over every response token of the whole batch (scale grows with the
  batch size). Sequences without response tokens are not counted.
  """
  m = loss_mask.astype(jnp.float32)
  if reduction == "sum":
    return m
  if reduction == "sequence_sum":
    n_seq = jnp.maximum((m.sum(-1) > 0).sum(), 1)
    return m / n_seq
  if reduction == "token_mean":
    return m / jnp.maximum(m.sum(), 1.0)
  if reduction == "sequence_mean":
    per_seq = m.sum(-1, keepdims=True)  # [B, 1]
    n_seq = jnp.maximum((per_seq > 0).sum(), 1)
    return jnp.where(per_seq > 0, m / jnp.maximum(per_seq, 1.0), 0.0) / n_seq
  raise ValueError(f"reduction: unknown {reduction!r}")


def _gather(logp: jax.Array, ids: jax.Array) -> jax.Array:
  return jnp.take_along_axis(logp, ids[..., None], axis=-1)[..., 0]


def sampled_importance_weights(logq, logp, policy, lam=None, behaviour=None):
  """[B, T] constant weights q(y) / b(y) for the sampled estimators, or None.

  The estimators' expected gradients (losses/sampled.py) hold for tokens
  drawn from the student q = softmax(z / tau). Tokens drawn from another
  policy b are reweighted by q(y) / b(y), which turns the expectation under b
  into the one under q, for every estimator. `behaviour` ([B, T], log b(y))
  is the rollout's own `behaviour_logprobs` when available (the mixture's
  log-prob as sampled); otherwise b is rebuilt from the training logits:
  p for 'teacher', lam q + (1 - lam) p for 'mixture'.

  Args:
    logq, logp: [B, T] log q(y), log p(y) at the loss temperature.
    policy: 'student' (no weight: returns None), 'teacher' or 'mixture'.
      'dataset' is refused: fixed text was not sampled from any of these, so
      no q / b weight is known.
    lam: the mixture's student probability.
    behaviour: optional [B, T] log b(y).
  """
  if policy == "student":
    return None
  if policy == "dataset":
    raise ValueError(
        "loss.kind='sampled' with rollout.policy='dataset': the sampled "
        "estimators need tokens drawn from a known policy (student, teacher "
        "or mixture) to be weighted by q/b; fixed dataset text has none. Use "
        "an exact loss (loss.kind='forward'/'reverse'/'jsd') on a dataset.")
  lq = jax.lax.stop_gradient(logq)
  if behaviour is not None:
    lb = jax.lax.stop_gradient(behaviour.astype(jnp.float32))
  elif policy == "teacher":
    lb = logp
  elif policy == "mixture":
    if lam is None or not 0.0 <= float(lam) <= 1.0:
      raise ValueError(f"rollout.lam: must be in [0, 1] for a mixture, got {lam}")
    lam = float(lam)
    lb = (jnp.logaddexp(jnp.log(lam) + lq, jnp.log1p(-lam) + logp)
          if 0 < lam < 1 else (lq if lam == 1 else logp))
  else:
    raise ValueError(f"rollout.policy: unknown {policy!r}")
  return jax.lax.stop_gradient(jnp.exp(lq - lb))


def _sampled_loss(s_logits, t_logits, batch, w, loss_cfg, policy, lam, vocab):
  """Single-sample estimators on the rollout's own tokens (docs/method.md), each
  importance-weighted when the rollout policy is not the student."""
  tau = loss_cfg.temperature
  s_logits, t_logits = s_logits[..., :vocab], t_logits[..., :vocab]
  logq_all = jax.nn.log_softmax(s_logits.astype(jnp.float32) / tau, axis=-1)
  logp_all = jax.nn.log_softmax(t_logits.astype(jnp.float32) / tau, axis=-1)
  nxt = batch["tokens"][:, 1:]
  logq, logp = _gather(logq_all, nxt), _gather(logp_all, nxt)  # [B, L-1]
  logp = jax.lax.stop_gradient(logp)
  behaviour = batch.get("behaviour_logprobs")
  iw = sampled_importance_weights(
      logq, logp, policy, lam,
      None if behaviour is None else behaviour[:, 1:])
  if iw is not None and loss_cfg.get("iw_clip") is not None:
    iw = jnp.minimum(iw, loss_cfg.iw_clip)
  return losses.sampled_kl(
      logq, logp, w, estimator=loss_cfg.estimator,
      importance_weight=iw, reduction="sum")


def _ce_loss(logits, targets, w, vocab):
  """Next-token cross-entropy (SFT), weighted like the divergences."""
  logp = jax.nn.log_softmax(logits[..., :vocab].astype(jnp.float32), axis=-1)
  nll = -_gather(logp, targets)  # [B, L-1]
  loss = (nll * w).sum()
  n = jnp.maximum((w > 0).sum(), 1)
  return loss, {"sft/nll": jnp.where(w > 0, nll, 0.0).sum() / n,
                "sft/tokens": (w > 0).sum().astype(jnp.float32),
                MEAN_WEIGHT: (w > 0).sum().astype(jnp.float32)}


# Batch keys of a teacher cache (jaxdistill/train/teacher_cache.py): the teacher's
# top-k at every position, aligned with `tokens` ([B, L, K], [B, L, K], [B, L]).
CACHE_KEYS = ("teacher_topk_ids", "teacher_topk_logprobs", "teacher_topk_tail")


def distill_loss(params, teacher_params, batch, *, student_cfg, teacher_cfg,
                 loss_cfg, vocab_size, policy="student", lam=None):
  """Weighted divergence over the batch's response positions -> (loss, metrics).

  `batch['weights']` ([B, L]) must already hold `loss_weights(...)`. With
  loss_cfg.teacher_topk = k the loss sees only the teacher's top-k
  (losses.topk_divergence, variant loss_cfg.topk_variant); a batch holding
  CACHE_KEYS takes that top-k from the cache and runs no teacher at all
  (teacher_params may then be None).
  """
  tokens, attn = batch["tokens"], batch["attention_mask"]
  w = batch["weights"][:, 1:]  # [B, L-1]: weight of predicting token t+1 at t
  kind = loss_cfg.kind
  if kind == "ce":  # supervised fine-tuning on the batch's own tokens
    return _ce_loss(models.apply(student_cfg, params, tokens, attn)[:, :-1],
                    tokens[:, 1:], w, vocab_size)
  fused = bool(loss_cfg.get("fused", False)) and kind != "sampled"
  k = loss_cfg.get("teacher_topk") if kind != "sampled" else None
  variant = loss_cfg.get("topk_variant", "renorm")
  kw = dict(kind=kind, beta=loss_cfg.beta, temperature=loss_cfg.temperature,
            reduction="sum", vocab_size=vocab_size)
  chunk = loss_cfg.get("chunk_size", losses.DEFAULT_CHUNK_SIZE)
  if CACHE_KEYS[0] in batch and kind != "sampled":
    ids, lp, tail = (jax.lax.stop_gradient(batch[n][:, :-1]) for n in CACHE_KEYS)
    s_out = models.apply(student_cfg, params, tokens, attn,
                         return_hidden=fused)[:, :-1]
    if fused:
      loss, metrics = losses.fused_topk_divergence(
          s_out, models.output_head(student_cfg, params), ids, lp, w,
          teacher_tail=tail, variant=variant, chunk_size=chunk, **kw)
    else:
      loss, metrics = losses.topk_divergence(
          s_out, ids, lp, w, teacher_tail=tail, variant=variant, **kw)
    return loss, {**metrics, MEAN_WEIGHT: jnp.sum(w)}
  t_full = jax.lax.stop_gradient(models.apply(
      teacher_cfg, teacher_params, tokens, attn, return_hidden=fused))
  s_full = models.apply(student_cfg, params, tokens, attn,
                        return_hidden=fused)
  t_out, s_out = t_full[:, :-1], s_full[:, :-1]
  if kind == "sampled":
    loss, metrics = _sampled_loss(s_out, t_out, batch, w, loss_cfg, policy,
                                  lam, vocab_size)
  elif fused:
    t_head = jax.lax.stop_gradient(
        models.output_head(teacher_cfg, teacher_params))
    loss, metrics = losses.fused_divergence(
        s_out, models.output_head(student_cfg, params), t_out, t_head, w,
        chunk_size=chunk, teacher_topk=k, topk_variant=variant, **kw)
  elif k is not None:
    t = losses.teacher_topk(t_out, k, temperature=loss_cfg.temperature,
                            vocab_size=vocab_size)
    loss, metrics = losses.topk_divergence(
        s_out, t.ids, t.logprobs, w, teacher_tail=t.tail, variant=variant, **kw)
  else:
    # Over all L positions, the last one (which predicts nothing) weighted 0:
    # the same sum, without copying both [B, L, V] logits to [B, L-1, V] and
    # padding the gradient back.
    loss, metrics = losses.divergence(s_full, t_full, jnp.pad(w, ((0, 0), (0, 1))),
                                      **kw)
  # The losses' means weight tokens by w: the weight of this micro-batch.
  return loss, {**metrics, MEAN_WEIGHT: jnp.sum(w)}


def make_optimizer(optim_cfg, total_steps: int) -> optax.GradientTransformation:
  """AdamW with linear warmup, then constant or cosine; optional clipping."""
  lr, warm = float(optim_cfg.lr), int(optim_cfg.warmup_steps)
  if optim_cfg.schedule == "cosine":
    sched = optax.warmup_cosine_decay_schedule(
        0.0, lr, warm, max(total_steps, warm + 1),
        end_value=lr * float(optim_cfg.get("final_lr_frac", 0.0)))
  else:
    sched = optax.join_schedules(
        [optax.linear_schedule(0.0, lr, max(warm, 1)), optax.constant_schedule(lr)],
        [warm]) if warm else optax.constant_schedule(lr)

  def decay_mask(params):
    # No weight decay on norms and biases (1-D per layer, even when stacked).
    return jax.tree_util.tree_map_with_path(
        lambda path, _: not any(
            "norm" in str(getattr(k, "key", "")) or
            str(getattr(k, "key", "")) == "bias" for k in path), params)

  chain = []
  if optim_cfg.clip_norm is not None:
    chain.append(optax.clip_by_global_norm(float(optim_cfg.clip_norm)))
  chain.append(optax.adamw(
      sched, b1=optim_cfg.b1, b2=optim_cfg.b2, eps=optim_cfg.eps,
      weight_decay=optim_cfg.weight_decay, mask=decay_mask))
  return optax.chain(*chain), sched




def merge_micro_metrics(stacked: dict) -> dict:
  """[A, ...] metrics of A micro-batches -> the full batch's (see above)."""
  stacked = dict(stacked)
  w = stacked.pop(MEAN_WEIGHT, None)
  out = {}
  for k, m in stacked.items():
    if k.endswith(ADDITIVE_METRICS):
      out[k] = m.sum(0)
    elif w is None:
      out[k] = m.mean(0)
    else:
      tot = w.sum(0)
      out[k] = jnp.where(tot > 0, (m * w).sum(0) / jnp.where(tot > 0, tot, 1.0),
                         0.0)
  return out


def train_step(state, teacher_params, batch, *, optimizer, schedule, loss_fn,
               grad_accum: int = 1):
  """state = {'params', 'opt_state', 'step'} -> (new state, metrics).

  `loss_fn(params, teacher_params, micro_batch) -> (loss, metrics)` sums over
  tokens with globally normalised weights, so micro-batch losses and
  gradients add up to the full-batch ones; its metrics are merged by
  `merge_micro_metrics`, so the logged numbers do not depend on grad_accum.
  """
  params = state["params"]
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if grad_accum == 1:
    (loss, metrics), grads = grad_fn(params, teacher_params, batch)
    metrics = dict(metrics)
    metrics.pop(MEAN_WEIGHT, None)
  else:
    micro = jax.tree.map(
        lambda x: x.reshape((grad_accum, x.shape[0] // grad_accum) + x.shape[1:]),
        batch)

    def body(carry, mb):
      (l, m), g = grad_fn(params, teacher_params, mb)
      return jax.tree.map(jnp.add, carry, (l, g)), m

    shapes = jax.eval_shape(lambda: grad_fn(params, teacher_params,
                                            jax.tree.map(lambda x: x[0], micro)))
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                         (shapes[0][0], shapes[1]))
    (loss, grads), stacked = jax.lax.scan(body, zeros, micro)
    metrics = merge_micro_metrics(stacked)
  updates, opt_state = optimizer.update(grads, state["opt_state"], params)
  new_params = optax.apply_updates(params, updates)
  metrics = dict(metrics)
  metrics["train/loss"] = loss
  metrics["train/grad_norm"] = optax.global_norm(grads)
  metrics["train/update_norm"] = optax.global_norm(updates)
  metrics["train/lr"] = schedule(state["step"])
  metrics["train/response_tokens"] = batch["loss_mask"].sum()
  new_state = {"params": new_params, "opt_state": opt_state,
               "step": state["step"] + 1}
  return new_state, metrics


def make_loss_fn(config, student_cfg, teacher_cfg, vocab_size):
  ro = config.rollout
  lam = float(ro.lam) if ro.policy == "mixture" else None
  return functools.partial(
      distill_loss, student_cfg=student_cfg, teacher_cfg=teacher_cfg,
      loss_cfg=config.loss, vocab_size=vocab_size, policy=ro.policy, lam=lam)
