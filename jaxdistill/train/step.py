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
  teacher_tokens, teacher_attention_mask  int32 [B, Lt], optional: the
                  teacher's own sequence when it has a prompt of its own
                  (data.teacher_prompt): [its left-padded prompt | the SAME
                  response columns], so the response fills the last columns of
                  both sequences. The teacher then runs over these and its
                  outputs are right-aligned to `tokens` (TEACHER_KEYS).

Logits at position t predict token t + 1, so the loss at t is weighted by
loss_mask[t + 1]. The reduction is turned into per-token weights
(losses.reduction_weights) normalised over the WHOLE batch before it is split into micro-batches for gradient
accumulation; the accumulated loss is therefore exactly the full-batch loss.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxdistill import config_lib
from jaxdistill import losses
from jaxdistill import models
from jaxdistill import rollout as rollout_lib
from jaxdistill import sharding
from jaxdistill.models import lora
from jaxdistill.train import optim as optim_lib

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


# Batch keys of a teacher cache (jaxdistill/train/teacher_cache.py): the teacher's
# top-k at every position, aligned with `tokens` ([B, L, K], [B, L, K], [B, L]).
CACHE_KEYS = ("teacher_topk_ids", "teacher_topk_logprobs", "teacher_topk_tail")

# Batch keys of a teacher that sees its own prompt (SequenceMaker adds them
# when data.teacher_prompt is set; absent, the teacher reads `tokens`).
TEACHER_KEYS = ("teacher_tokens", "teacher_attention_mask")


def right_align(x, width: int):
  """x [B, Lt, ...] -> [B, width, ...]: the last `width` columns of x, or x
  after zero columns where it is narrower.

  Both sequences end with the same response columns, so column c of the
  student's and column c + Lt - width of the teacher's predict the same
  response token; the columns this drops or zero-fills are prompt columns,
  which the loss weights 0 (and zeros keep them finite).
  """
  lt = x.shape[1]
  if lt >= width:
    return x[:, lt - width:]
  return jnp.pad(x, ((0, 0), (width - lt, 0)) + ((0, 0),) * (x.ndim - 2))


def distill_loss(params, teacher_params, batch, *, student_cfg, teacher_cfg,
                 loss_cfg, vocab_size, policy="student", lam=None, shard=None,
                 temperatures=(1.0, 1.0)):
  """Weighted divergence over the batch's response positions -> (loss, metrics).

  `batch['weights']` ([B, L]) must already hold
  `losses.reduction_weights(batch['loss_mask'], reduction)`. With
  loss_cfg.teacher_topk = k the loss sees only the teacher's top-k
  (losses.topk_divergence, variant loss_cfg.topk_variant); a batch holding
  CACHE_KEYS takes that top-k from the cache and runs no teacher at all
  (teacher_params may then be None). `shard` (a sharding.Activations, or
  None) pins both models' activations to the mesh (models.apply) and gathers
  the output heads the fused loss multiplies by (FSDP: weights are gathered
  where they are used, activations stay split over the batch).
  `temperatures`: (student, teacher), each model's distribution inside the
  loss (config_lib.temperatures). With loss.estimator 'fresh_forward' /
  'fresh_reverse' the batch holds 'fresh_uniforms' [B, L] (SequenceMaker).
  A batch holding TEACHER_KEYS runs the teacher over its own sequence (its
  own prompt, the same response) and every loss compares it with the
  student at the matching response positions (`right_align`).
  """
  ts, tt = temperatures
  apply = functools.partial(models.apply, shard=shard)
  if shard is not None:  # rows over the batch axes (also each micro-batch's)
    batch = {k: shard(x, "batch", "seq", *([None] * (x.ndim - 2)))
             for k, x in batch.items()}

  def head(cfg, p):
    w = models.output_head(cfg, p)
    return w if shard is None else shard(w, None, "vocab")

  tokens, attn = batch["tokens"], batch["attention_mask"]
  w = batch["weights"][:, 1:]  # [B, L-1]: weight of predicting token t+1 at t
  kind = loss_cfg.kind
  if kind == losses.CE:  # supervised fine-tuning on the batch's own tokens
    loss, metrics = losses.cross_entropy(
        apply(student_cfg, params, tokens, attn)[:, :-1], tokens[:, 1:],
        w, reduction="sum", vocab_size=vocab_size)
    return loss, {**metrics, MEAN_WEIGHT: metrics["sft/tokens"]}
  fused = bool(loss_cfg.get("fused", False)) and kind != losses.SAMPLED
  k = loss_cfg.get("teacher_topk") if kind != losses.SAMPLED else None
  variant = loss_cfg.get("topk_variant", "renorm")
  kw = dict(kind=kind, beta=loss_cfg.beta, temperature=ts,
            reduction="sum", vocab_size=vocab_size)
  chunk = loss_cfg.get("chunk_size", losses.DEFAULT_CHUNK_SIZE)
  own_prompt = TEACHER_KEYS[0] in batch
  if own_prompt and CACHE_KEYS[0] in batch:
    raise ValueError("data.teacher_prompt: not supported with a teacher "
                     "cache (loss.teacher_cache)")
  if CACHE_KEYS[0] in batch and kind != losses.SAMPLED:
    ids, lp, tail = (jax.lax.stop_gradient(batch[n][:, :-1]) for n in CACHE_KEYS)
    s_out = apply(student_cfg, params, tokens, attn,
                         return_hidden=fused)[:, :-1]
    if fused:
      loss, metrics = losses.fused_topk_divergence(
          s_out, head(student_cfg, params), ids, lp, w,
          teacher_tail=tail, variant=variant, chunk_size=chunk, **kw)
    else:
      loss, metrics = losses.topk_divergence(
          s_out, ids, lp, w, teacher_tail=tail, variant=variant, **kw)
    return loss, {**metrics, MEAN_WEIGHT: jnp.sum(w)}
  t_in = tuple(batch[n] for n in TEACHER_KEYS) if own_prompt else (tokens,
                                                                     attn)
  with jax.named_scope("teacher"):  # names its ops in profiles
    t_full = jax.lax.stop_gradient(apply(
        teacher_cfg, teacher_params, *t_in, return_hidden=fused))
  if own_prompt:  # [B, Lt, .] -> [B, L, .], response columns matched
    t_full = right_align(t_full, tokens.shape[1])
  s_full = apply(student_cfg, params, tokens, attn,
                        return_hidden=fused)
  t_out, s_out = t_full[:, :-1], s_full[:, :-1]
  if kind == losses.SAMPLED and loss_cfg.estimator in losses.FRESH:
    # The paper's sampled KL: a fresh token at every position (App. A.2).
    loss, metrics = losses.fresh_sampled_kl(
        s_out, t_out, w, batch["fresh_uniforms"][:, :-1],
        direction=loss_cfg.estimator.split("_", 1)[1], temperature=ts,
        teacher_temperature=tt, reduction="sum", vocab_size=vocab_size)
  elif kind == losses.SAMPLED:
    # Single-sample estimators on the rollout's own tokens (docs/method.md).
    behaviour = batch.get("behaviour_logprobs")
    loss, metrics = losses.sampled_kl_from_logits(
        s_out, t_out, tokens[:, 1:], w, estimator=loss_cfg.estimator,
        temperature=ts, teacher_temperature=tt, policy=policy, lam=lam,
        behaviour_logprobs=None if behaviour is None else behaviour[:, 1:],
        iw_clip=loss_cfg.get("iw_clip"), reduction="sum",
        vocab_size=vocab_size)
  elif fused:
    # The exact loss splits the heads over the vocabulary itself
    # (losses/fused.py, `shard`): gathering them here first would hold both
    # heads whole on every chip (3 GiB per chip for Qwen2.5-1.5B <- 7B).
    pick = models.output_head if k is None else head
    t_head = jax.lax.stop_gradient(pick(teacher_cfg, teacher_params))
    loss, metrics = losses.fused_divergence(
        s_out, pick(student_cfg, params), t_out, t_head, w,
        chunk_size=chunk, teacher_topk=k, topk_variant=variant,
        teacher_temperature=tt, shard=shard if k is None else None, **kw)
  elif k is not None:
    t = losses.teacher_topk(t_out, k, temperature=tt, vocab_size=vocab_size)
    loss, metrics = losses.topk_divergence(
        s_out, t.ids, t.logprobs, w, teacher_tail=t.tail, variant=variant, **kw)
  else:
    # Over all L positions, the last one (which predicts nothing) weighted 0:
    # the same sum, without copying both [B, L, V] logits to [B, L-1, V] and
    # padding the gradient back.
    loss, metrics = losses.divergence(s_full, t_full, jnp.pad(w, ((0, 0), (0, 1))),
                                      teacher_temperature=tt, **kw)
  # The losses' means weight tokens by w: the weight of this micro-batch.
  return loss, {**metrics, MEAN_WEIGHT: jnp.sum(w)}


def make_optimizer(optim_cfg, total_steps: int, param_dtype=None
                   ) -> optax.GradientTransformation:
  """AdamW with linear warmup, then constant or cosine; optional clipping.

  Float32 params (`param_dtype` None or 'float32', no optim.moment_dtype):
  optax's adamw. Params stored in another dtype (student.param_dtype
  'bfloat16': no float32 master copy), or an explicit optim.moment_dtype:
  train.optim.stored_adamw, float32 arithmetic with each rounding to the
  stored dtypes explicit (its docstring)."""
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

  moment_dtype = optim_cfg.get("moment_dtype")
  stored = moment_dtype is not None or jnp.dtype(
      param_dtype or "float32") != jnp.float32
  chain = [optim_lib.to_float32()] if stored else []
  if optim_cfg.clip_norm is not None:
    chain.append(optax.clip_by_global_norm(float(optim_cfg.clip_norm)))
  if stored:
    chain.append(optim_lib.stored_adamw(
        sched, b1=float(optim_cfg.b1), b2=float(optim_cfg.b2),
        eps=float(optim_cfg.eps), weight_decay=float(optim_cfg.weight_decay),
        mask=decay_mask, moment_dtype=moment_dtype))
  else:
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
               grad_accum: int = 1, lora_scale: float | None = None):
  """state = {'params', 'opt_state', 'step'} -> (new state, metrics).

  `loss_fn(params, teacher_params, micro_batch) -> (loss, metrics)` sums over
  tokens with globally normalised weights, so micro-batch losses and
  gradients add up to the full-batch ones; its metrics are merged by
  `merge_micro_metrics`, so the logged numbers do not depend on grad_accum.

  A LoRA state (new_state with a `base`) trains state['params'], the
  adapters: loss_fn sees lora.attach(state['base'], adapters, lora_scale)
  and the base passes through unchanged.
  """
  params = state["params"]
  if "base" in state:
    inner, base, scale = loss_fn, state["base"], _scale(lora_scale)
    loss_fn = lambda a, t, b: inner(lora.attach(base, a, scale), t, b)
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if grad_accum == 1:
    (loss, metrics), grads = grad_fn(params, teacher_params, batch)
    metrics = dict(metrics)
    metrics.pop(MEAN_WEIGHT, None)
  else:
    # Micro-batch j holds rows j, A + j, 2A + j, ...: with the rows split
    # over the devices in contiguous blocks, every device then holds 1/A of
    # each micro-batch, so each step of the scan runs on all of them with
    # 1/A of the activations (a contiguous split would put a micro-batch on
    # 1/A of the devices, or gather it). The gradient sums the same rows.
    micro = jax.tree.map(
        lambda x: x.reshape((x.shape[0] // grad_accum, grad_accum)
                            + x.shape[1:]).swapaxes(0, 1), batch)

    # Gradients of low-precision params add up in float32 (for float32
    # params this is the same sum).
    def body(carry, mb):
      (l, m), g = grad_fn(params, teacher_params, mb)
      g = jax.tree.map(lambda x: x.astype(jnp.float32), g)
      return jax.tree.map(jnp.add, carry, (l, g)), m

    shapes = jax.eval_shape(lambda: grad_fn(params, teacher_params,
                                            jax.tree.map(lambda x: x[0], micro)))
    zeros = (jnp.zeros(shapes[0][0].shape, shapes[0][0].dtype),
             jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), shapes[1]))
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
  new_state = {**state, "params": new_params, "opt_state": opt_state,
               "step": state["step"] + 1}
  return new_state, metrics


# The entries of a train state that are trained and checkpointed; a LoRA
# state also holds the frozen 'base', which is neither.
SAVED = ("params", "opt_state", "step")


def new_state(optimizer, params, base=None):
  """The train state at step 0: {params, opt_state, step}; with LoRA,
  `params` are the adapters and `base` the frozen model they adapt."""
  state = {"params": params, "opt_state": optimizer.init(params),
           "step": jnp.zeros((), jnp.int32)}
  return state if base is None else {**state, "base": base}


def saved(state):
  """What a checkpoint holds of a train state (SAVED: not a LoRA base)."""
  return {k: state[k] for k in SAVED}


def policy_params(state, lora_scale: float | None = None):
  """The student's params of a train state (what rollouts sample from): the
  base with the adapters attached for LoRA, else state['params']."""
  if "base" not in state:
    return state["params"]
  return lora.attach(state["base"], state["params"], _scale(lora_scale))


def export_params(state, lora_scale: float | None = None, cfg=None):
  """The student's weights to export: the base with the adapters merged
  (W + scale * A B, in the base's dtype; bfloat16 for an NF4 base, whose
  ModelConfig `cfg` it needs: lora.merge_base) for LoRA, else
  state['params']."""
  if "base" not in state:
    return state["params"]
  if cfg is None:
    return jax.jit(lora.merge, static_argnums=2)(
        state["base"], state["params"], _scale(lora_scale))
  return jax.jit(lora.merge_base, static_argnums=(0, 3))(
      cfg, state["base"], state["params"], _scale(lora_scale))


def _scale(lora_scale):
  if lora_scale is None:
    raise ValueError("a LoRA train state (with a 'base') needs lora_scale")
  return float(lora_scale)


def opt_shardings(optimizer, abstract_opt, param_shardings, mesh):
  """Shardings of an optax state: each param-shaped leaf like its param, the
  rest (counts, scalars) replicated."""
  return optax.tree_map_params(
      optimizer, lambda _, s: s, abstract_opt, param_shardings,
      transform_non_params=lambda _: sharding.replicated(mesh))


def state_shardings(cfg, optimizer, params, mesh, rules, lcfg=None):
  """Shardings of the train state {params, opt_state, step} of a model of
  `cfg` (params: arrays or ShapeDtypeStructs of its shapes). With `lcfg` (a
  lora.LoraConfig) `params` are its adapters, and the state's 'base' is
  placed as the model's params."""
  axes = (models.logical_axes(cfg) if lcfg is None
          else lora.logical_axes(cfg, lcfg))
  param_shardings = sharding.tree_shardings(axes, mesh, rules, params)
  out = {"params": param_shardings,
         "opt_state": opt_shardings(
             optimizer, jax.eval_shape(optimizer.init, params),
             param_shardings, mesh),
         "step": sharding.replicated(mesh)}
  if lcfg is not None:
    out["base"] = sharding.tree_shardings(  # maybe NF4 (models/quant.py)
        lora.base_logical_axes(cfg, lcfg), mesh, rules,
        lora.base_shapes(cfg, lcfg))
  return out


def jit_update(update, state_shard):
  """update(state, x, y) -> (state, metrics), jitted with the state sharded
  and donated."""
  return jax.jit(update, in_shardings=(state_shard, None, None),
                 out_shardings=(state_shard, None), donate_argnums=0)


def make_loss_fn(config, student_cfg, teacher_cfg, vocab_size, shard=None):
  ro = config.rollout
  return functools.partial(
      distill_loss, student_cfg=student_cfg, teacher_cfg=teacher_cfg,
      loss_cfg=config.loss, vocab_size=vocab_size, policy=ro.policy,
      lam=rollout_lib.policy_lam(ro), shard=shard,
      temperatures=config_lib.temperatures(config))
