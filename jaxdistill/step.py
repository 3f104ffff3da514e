"""One distillation update, as pure functions.

A batch is a dict of [B, L] arrays over whole sequences (left-padded prompt,
then the response, then right padding):

  tokens          int32  token ids
  attention_mask  int32  1 for real tokens (prompt and response)
  loss_mask       int32  1 where the token is a response token (to be predicted)
  sampler_is_student  bool, optional: which model sampled each response token
                  (only the sampled-estimator importance weights need it)

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


def _sampled_loss(s_logits, t_logits, batch, w, loss_cfg, policy, lam, vocab):
  """Single-sample estimators on the rollout's own tokens (METHOD.md)."""
  tau = loss_cfg.temperature
  s_logits, t_logits = s_logits[..., :vocab], t_logits[..., :vocab]
  logq_all = jax.nn.log_softmax(s_logits.astype(jnp.float32) / tau, axis=-1)
  logp_all = jax.nn.log_softmax(t_logits.astype(jnp.float32) / tau, axis=-1)
  nxt = batch["tokens"][:, 1:]
  logq, logp = _gather(logq_all, nxt), _gather(logp_all, nxt)  # [B, L-1]
  iw = None
  if loss_cfg.estimator == "rkl_surrogate" and policy != "student":
    # The surrogate follows the reverse-KL gradient only on student samples;
    # tokens from the teacher (or a mixture) get q / (behaviour prob).
    lq, lp = jax.lax.stop_gradient(logq), logp
    if policy == "mixture":
      lb = jnp.logaddexp(jnp.log(lam) + lq, jnp.log1p(-lam) + lp) if 0 < lam < 1 \
          else (lq if lam == 1 else lp)
    else:  # teacher rollouts or a fixed dataset of teacher/reference text
      lb = lp
    iw = jnp.exp(lq - lb)
    if loss_cfg.get("iw_clip") is not None:
      iw = jnp.minimum(iw, loss_cfg.iw_clip)
  return losses.sampled_kl(
      logq, jax.lax.stop_gradient(logp), w, estimator=loss_cfg.estimator,
      importance_weight=iw, reduction="sum")


def _ce_loss(logits, targets, w, vocab):
  """Next-token cross-entropy (SFT), weighted like the divergences."""
  logp = jax.nn.log_softmax(logits[..., :vocab].astype(jnp.float32), axis=-1)
  nll = -_gather(logp, targets)  # [B, L-1]
  loss = (nll * w).sum()
  n = jnp.maximum((w > 0).sum(), 1)
  return loss, {"sft/nll": jnp.where(w > 0, nll, 0.0).sum() / n,
                "sft/tokens": (w > 0).sum().astype(jnp.float32)}


def distill_loss(params, teacher_params, batch, *, student_cfg, teacher_cfg,
                 loss_cfg, vocab_size, policy="student", lam=None):
  """Weighted divergence over the batch's response positions -> (loss, metrics).

  `batch['weights']` ([B, L]) must already hold `loss_weights(...)`.
  """
  tokens, attn = batch["tokens"], batch["attention_mask"]
  w = batch["weights"][:, 1:]  # [B, L-1]: weight of predicting token t+1 at t
  kind = loss_cfg.kind
  if kind == "ce":  # supervised fine-tuning on the batch's own tokens
    return _ce_loss(models.apply(student_cfg, params, tokens, attn)[:, :-1],
                    tokens[:, 1:], w, vocab_size)
  fused = bool(loss_cfg.get("fused", False)) and kind != "sampled"
  t_out = models.apply(teacher_cfg, teacher_params, tokens, attn,
                       return_hidden=fused)
  t_out = jax.lax.stop_gradient(t_out[:, :-1])
  s_out = models.apply(student_cfg, params, tokens, attn,
                       return_hidden=fused)[:, :-1]
  if kind == "sampled":
    return _sampled_loss(s_out, t_out, batch, w, loss_cfg, policy, lam,
                         vocab_size)
  kw = dict(kind=kind, beta=loss_cfg.beta, temperature=loss_cfg.temperature,
            reduction="sum", vocab_size=vocab_size)
  if fused:
    t_head = jax.lax.stop_gradient(models.output_head(teacher_cfg, teacher_params))
    return losses.fused_divergence(
        s_out, models.output_head(student_cfg, params), t_out, t_head, w,
        chunk_size=loss_cfg.get("chunk_size", losses.DEFAULT_CHUNK_SIZE), **kw)
  return losses.divergence(s_out, t_out, w, **kw)


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


def train_step(state, teacher_params, batch, *, optimizer, schedule, loss_fn,
               grad_accum: int = 1):
  """state = {'params', 'opt_state', 'step'} -> (new state, metrics).

  `loss_fn(params, teacher_params, micro_batch) -> (loss, metrics)` sums over
  tokens with globally normalised weights, so micro-batch losses and
  gradients add up to the full-batch ones.
  """
  params = state["params"]
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if grad_accum == 1:
    (loss, metrics), grads = grad_fn(params, teacher_params, batch)
  else:
    micro = jax.tree.map(
        lambda x: x.reshape((grad_accum, x.shape[0] // grad_accum) + x.shape[1:]),
        batch)

    def body(carry, mb):
      (l, m), g = grad_fn(params, teacher_params, mb)
      return jax.tree.map(jnp.add, carry, (l, m, g)), None

    zeros = jax.eval_shape(lambda: grad_fn(params, teacher_params,
                                           jax.tree.map(lambda x: x[0], micro)))
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                         (zeros[0][0], zeros[0][1], zeros[1]))
    (loss, metrics, grads), _ = jax.lax.scan(body, zeros, micro)
    # Loss and grads add up exactly (globally normalised weights); the loss
    # module's monitoring metrics are per-micro-batch means: average them.
    metrics = jax.tree.map(lambda m: m / grad_accum, metrics)
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
