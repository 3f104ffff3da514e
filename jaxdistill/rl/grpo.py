"""GRPO: group-normalised advantages and the clipped policy objective.

Letters: R rows (= B prompts x G samples, prompt-major: row i answers prompt
i // G), N response slots, P prompt width, D hidden size, V vocabulary.

For response token t of row i, with log-probs at the rollout temperature T:

  rho_t = exp(logp_t - old_t)                 importance ratio vs the sampler
  pg_t  = -min(rho_t A_i, clip(rho_t, 1 - eps_low, 1 + eps_high) A_i)
  kl_t  = k(log r_t),  log r_t = ref_t - logp_t   (r = pi_ref / pi_theta)
  L     = sum_t w_t (pg_t + beta kl_t)

`w` implements the averaging (jaxdistill.losses.reduction_weights): 'token_mean'
divides by the number of response tokens of the mini-batch (every token counts
the same), 'sequence_mean' averages tokens within a row, then rows (original
GRPO: long answers get less weight per token).

Temperature and nucleus sampling. The policy log-probs here are those of the
TEMPERED distribution softmax(z / T) over the whole vocabulary, and so are
the reference's. Without truncation the sampler draws from that distribution
and its log-probs (`Rollout.logprobs`) serve as old_t: rho = 1 exactly when
nothing changed. With rollout.top_p < 1 (the paper's RLVR and teacher GRPO
sample at top-p 0.95, App. D.2.2, D.6) the sampler draws from the nucleus,
truncated and renormalised, while the ratio stays on the untruncated tempered
distribution: rl.step.Collector then recomputes old_t under the sampling
params with the same forward pass as the loss, so rho = 1 on a fresh batch.
This is what TRL (the paper's trainer: vLLM samples with top-p, the trainer
scores with logits / T) and verl do. The alternative, both log-probs under
the truncated renormalised distribution, is the exact policy gradient of the
nucleus policy, but a token the sampler kept can leave the current policy's
nucleus after an update (log-prob -inf), and it is not what the paper ran.
top_k is not supported.

DAPO (Yu et al., 2025: "DAPO: An Open-Source LLM Reinforcement Learning
System at Scale") is four changes to GRPO. grpo.loss 'dapo' is its loss, as
the paper uses it ("GRPO with the DAPO loss", App. D.2.2 and D.6; TRL's
loss_type 'dapo'):

  L = -1 / (sum_i |o_i|) sum_i sum_t min(rho_t A_i,
                                          clip(rho_t, 1 - eps_low, 1 + eps_high) A_i)

  - token-level normalisation: one mean over EVERY completion token of the
    optimizer step's batch (all its groups and all its gradient-accumulation
    micro-batches; losses.reduction_weights 'token_mean' over the mini-batch
    before rl.step.ppo_update splits it, so the accumulated gradient is the
    whole batch's, not a mean of micro-batch means);
  - clip-higher: eps_low and eps_high are config values (the paper's
    configs use the DAPO paper's 0.2 and 0.28: the study does not state its
    values, a choice);
  - group-normalised advantages (r - mean_g r) / (std_g r + adv_eps), and no
    KL term (beta 0: `check_loss` refuses a KL coefficient).

Not included: DAPO's dynamic sampling (re-drawing prompts until no group has
equal rewards) and overlong reward shaping are sampling and reward changes,
not the loss, and the study names neither (App. D.6: "We add no separate
formatting or length rewards"; TRL's loss_type 'dapo' does neither). Groups with
equal rewards get A = 0 and only add their tokens to the normaliser, as in
TRL. Standard deviations here are over the group with ddof 0 (TRL: ddof 1,
eps 1e-4), so every advantage is sqrt(G / (G - 1)) times TRL's (1.069 at
G = 8): one factor for the whole run, which Adam absorbs up to the gradient
clip.

'grpo' keeps `grpo.reduction` free ('sequence_mean': the original GRPO) and
allows the KL penalty below.

KL to the frozen reference. The per-token estimators are differentiated
through logp only (samples come from the sampler, ~pi_theta). What each one
optimises in expectation is its GRADIENT, not its value:

  estimator  value                        expected gradient
  k1         -log r (unbiased RKL value)  0: useless as a penalty      'none'
  k2         (log r)^2 / 2                grad KL(pi_theta || pi_ref)  'reverse'
  k3         r - 1 - log r (DeepSeekMath) grad KL(pi_ref || pi_theta)  'forward'

So GRPO's usual k3 penalty, whose VALUE estimates the reverse KL, pulls along
the FORWARD KL (the same trap as in distillation, docs/method.md). The table is
exact for samples of pi_theta, i.e. on the first update of a fresh batch;
later mini-batch steps use pi_old's samples without reweighting the KL term
(as GRPO does), which is close while the clip keeps pi_theta near pi_old.
The config states the direction and `check_kl` refuses a mismatch. The
monitored `rl/kl_ref` is always the k3 value: an unbiased, non-negative
estimate of KL(pi_theta || pi_ref) on the sampled tokens.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxdistill import models
from jaxdistill import sharding
from jaxdistill.train import step as step_lib

KL_ESTIMATORS = ("k1", "k2", "k3")
# Which divergence's gradient each estimator follows when back-propagated.
KL_DIRECTIONS = {"k1": "none", "k2": "reverse", "k3": "forward"}
# The reductions GRPO offers, of losses.REDUCTIONS (whose weights it uses).
REDUCTIONS = ("token_mean", "sequence_mean")
# grpo.loss: 'grpo' (reduction and KL as configured) or 'dapo' (see above).
LOSSES = ("grpo", "dapo")


def check_loss(loss: str, reduction: str, kl_coef: float) -> None:
  """ValueError unless `loss` is known and the config agrees with it."""
  if loss not in LOSSES:
    raise ValueError(f"config.grpo.loss: unknown {loss!r}; choose from "
                     f"{LOSSES}")
  if reduction not in REDUCTIONS:
    raise ValueError(f"config.grpo.reduction: unknown {reduction!r}; choose "
                     f"from {REDUCTIONS}")
  if loss == "dapo" and reduction != "token_mean":
    raise ValueError("config.grpo.reduction: the DAPO loss normalises by all "
                     "completion tokens of the batch: must be 'token_mean', "
                     f"got {reduction!r}")
  if loss == "dapo" and kl_coef:
    raise ValueError(f"config.kl.coef: the DAPO loss has no KL term: must be "
                     f"0 with grpo.loss='dapo', got {kl_coef}")


def check_kl(estimator: str, direction: str, coef: float) -> None:
  """ValueError unless the stated direction is the estimator's gradient's."""
  if estimator not in KL_ESTIMATORS:
    raise ValueError(f"config.kl.estimator: unknown {estimator!r}; choose "
                     f"from {KL_ESTIMATORS}")
  if coef < 0:
    raise ValueError(f"config.kl.coef: must be >= 0, got {coef}")
  if coef > 0 and estimator == "k1":
    raise ValueError("config.kl.estimator: 'k1' as a loss has zero expected "
                     "gradient; use 'k2' (reverse KL) or 'k3' (forward KL)")
  want = KL_DIRECTIONS[estimator]
  if coef > 0 and direction != want:
    raise ValueError(
        f"config.kl.direction: estimator {estimator!r} back-propagated on "
        f"policy samples follows the {want!r} KL gradient, but the config "
        f"states {direction!r}")


@functools.partial(jax.jit,
                   static_argnames=("group_size", "scale_by_std", "eps"))
def group_advantages(rewards, group_size: int, *, scale_by_std: bool = True,
                     eps: float = 1e-6):
  """[R] rewards, prompt-major -> ([R] float32 advantages, group stats).

  A_i = (r_i - mean_g r) / (std_g r + eps), std over the group (ddof 0);
  without `scale_by_std`, A_i = r_i - mean_g r. A group whose rewards are all
  equal gets A = 0 exactly (0 / eps), hence no policy gradient.
  """
  r = jnp.asarray(rewards, jnp.float32)
  if r.ndim != 1 or group_size < 1 or r.shape[0] % group_size:
    raise ValueError(f"rewards: expected [B * {group_size}] rewards, got shape "
                     f"{r.shape}")
  g = r.reshape(-1, group_size)  # [B, G]
  mean = g.mean(-1, keepdims=True)
  centred = g - mean
  std = jnp.sqrt(jnp.mean(jnp.square(centred), -1, keepdims=True))
  adv = centred / (std + eps) if scale_by_std else centred
  # Exactly zero for constant groups, whatever rounding `g - mean` did.
  const = jnp.all(g == g[:, :1], axis=-1, keepdims=True)
  adv = jnp.where(const, 0.0, adv)
  stats = {"rl/zero_var_groups": const.mean(),
           "rl/reward_group_std": std.mean(),
           "rl/solved_groups": jnp.any(g > 0, -1).mean()}
  return adv.reshape(-1), stats


def _masked_mean(x, mask):
  m = mask.astype(jnp.float32)
  return jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(m.sum(), 1.0)


def kl_terms(logp, ref_logp, estimator: str):
  """Per-token (penalty, k3 value) from log pi_theta(y) and log pi_ref(y)."""
  log_r = ref_logp - logp
  k3 = jnp.expm1(log_r) - log_r  # expm1: accurate when r ~ 1
  pen = {"k1": -log_r, "k2": 0.5 * jnp.square(log_r), "k3": k3}[estimator]
  return pen, k3


def grpo_objective(logp, old_logp, advantages, weights, mask, *,
                   clip_low: float, clip_high: float, ref_logp=None,
                   kl_coef: float = 0.0, kl_estimator: str = "k3"):
  """The clipped GRPO objective on per-token log-probs -> (loss, metrics).

  Args:
    logp: [R, N] log pi_theta of the sampled tokens (carries the gradient).
    old_logp: [R, N] log-probs recorded at sampling time (constant).
    advantages: [R] per-row advantages (constant).
    weights: [R, N] loss weights (0 off the response), e.g.
      losses.reduction_weights(mask, reduction).
    mask: [R, N] bool/int response mask (for the monitoring means).
    clip_low, clip_high: the ratio is clipped to [1 - clip_low, 1 + clip_high].
    ref_logp: [R, N] reference log-probs, or None (no KL term or metric).
    kl_coef: beta >= 0.
    kl_estimator: 'k1' | 'k2' | 'k3' (see the module docstring).

  Returns:
    loss = sum(weights * (pg + beta kl)); metrics (no gradient): rl/pg_loss,
    rl/clip_frac (tokens whose gradient the clip removed), rl/clip_frac_low,
    rl/clip_frac_high, rl/ratio_mean, and with ref_logp rl/kl_ref (k3 value),
    rl/kl_penalty (the estimator's value).
  """
  if kl_coef and ref_logp is None:
    raise ValueError("ref_logp: required when kl_coef > 0")
  mask = jnp.asarray(mask) > 0
  old = jax.lax.stop_gradient(old_logp.astype(jnp.float32))
  adv = jax.lax.stop_gradient(advantages.astype(jnp.float32))[:, None]  # [R, 1]
  w = jax.lax.stop_gradient(jnp.where(mask, weights, 0.0))
  # Off-response slots hold arbitrary values: zero them before exp so that
  # an inf there cannot turn into 0 * inf = nan.
  log_ratio = jnp.where(mask, logp.astype(jnp.float32) - old, 0.0)
  ratio = jnp.exp(log_ratio)
  clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  pg = -jnp.minimum(ratio * adv, clipped * adv)  # [R, N]
  loss = jnp.sum(w * pg)
  sg = jax.lax.stop_gradient
  low = mask & (adv < 0) & (ratio < 1.0 - clip_low)
  high = mask & (adv > 0) & (ratio > 1.0 + clip_high)
  frac = lambda b: _masked_mean(b.astype(jnp.float32), mask)
  metrics = {"rl/pg_loss": sg(loss), "rl/clip_frac": frac(low | high),
             "rl/clip_frac_low": frac(low), "rl/clip_frac_high": frac(high),
             "rl/ratio_mean": _masked_mean(sg(ratio), mask)}
  if ref_logp is not None:
    ref = jax.lax.stop_gradient(
        jnp.where(mask, ref_logp.astype(jnp.float32), 0.0))
    pen, k3 = kl_terms(jnp.where(mask, logp.astype(jnp.float32), 0.0), ref,
                       kl_estimator)
    if kl_coef:
      loss = loss + kl_coef * jnp.sum(w * pen)
    metrics["rl/kl_ref"] = _masked_mean(sg(k3), mask)
    metrics["rl/kl_penalty"] = _masked_mean(sg(pen), mask)
  return loss, metrics


# On accelerators the response's log-probs are computed this many positions
# at a time (each block's [R, C, V] logits recomputed in the backward pass),
# never as whole [R, N, V] logits: at Qwen2.5's 151,936 columns, 32 rows of
# 512 responses are 10 GB of float32 logits per array. On CPU the whole
# response at once is faster and the runs there are small.
LOGPROB_CHUNK = 64


def _logprob_terms(h, head, targets, temperature):
  """(logp, entropy) [R, C] of `targets` [R, C] under softmax((h @ head) / T)
  for hidden states h [R, C, D]."""
  logits = jnp.einsum("RND,DV->RNV", h, head,
                      preferred_element_type=jnp.float32)
  x = logits / temperature  # [R, C, V]
  # logsumexp + gather rather than a [R, C, V] log_softmax: fewer passes over
  # the vocabulary (2x faster on CPU for the head's softmax part).
  lse = jax.nn.logsumexp(x, axis=-1)  # [R, C]
  logp = jnp.take_along_axis(x, targets[..., None], axis=-1)[..., 0] - lse
  xs, ls = jax.lax.stop_gradient(x), jax.lax.stop_gradient(lse)
  # H = lse - E_p[x].
  entropy = ls - jnp.sum(jnp.exp(xs - ls[..., None]) * xs, axis=-1)
  return logp, entropy


def token_logprobs(cfg, params, tokens, attention_mask, num_response: int, *,
                   temperature: float = 1.0, vocab_size: int | None = None,
                   shard=None, chunk_size: int | None = None):
  """Log-probs and entropies of the response tokens under one model.

  Args:
    cfg, params: a jaxdistill model.
    tokens, attention_mask: [R, P+N] rollout sequences (left-padded prompt,
      then the N response slots).
    num_response: N (static).
    temperature: T > 0, as used for sampling.
    vocab_size: the vocabulary sampled over (rollout.generate's vocab_size);
      default the model's full width.
    shard: None or a sharding.Activations: activations pinned to its mesh
      (models.apply), the head gradient gathered where it is used.
    chunk_size: None (default: LOGPROB_CHUNK on accelerators, the whole
      response on CPU) or C: the head's logits [R, C, V] are formed C
      response positions at a time and recomputed in the backward pass
      (jax.checkpoint), so memory holds one block of logits, not N.

  Returns:
    logp [R, N] float32 of tokens[:, P:] under softmax(logits / T) over the
    first vocab_size ids, and the entropy [R, N] of that distribution (no
    gradient through it).
  """
  n = num_response
  p = tokens.shape[1] - n
  hidden = models.apply(cfg, params, tokens, attention_mask,
                        return_hidden=True, shard=shard)[:, p - 1:-1]  # [R, N, D]
  # Only response positions need logits: skip the [R, P, V] prompt head.
  head = models.output_head(cfg, params).astype(cfg.dtype)  # [D, V]
  if vocab_size is not None:
    head = head[:, :vocab_size]
  if shard is not None:
    head = shard(head, None, "vocab")
  targets = tokens[:, p:]
  if chunk_size is None and sharding.platform() != "cpu":
    chunk_size = LOGPROB_CHUNK
  if chunk_size is None or chunk_size >= n:
    return _logprob_terms(hidden, head, targets, temperature)
  r = hidden.shape[0]
  k = -(-n // chunk_size)
  pad = k * chunk_size - n
  blocks = lambda x: jnp.moveaxis(  # [R, N, ...] -> [K, R, C, ...]
      jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)).reshape(
          (r, k, chunk_size) + x.shape[2:]), 1, 0)
  terms = jax.checkpoint(
      functools.partial(_logprob_terms, temperature=temperature))
  logp, entropy = jax.lax.map(lambda xs: terms(xs[0], head, xs[1]),
                              (blocks(hidden), blocks(targets)))
  unblock = lambda x: jnp.moveaxis(x, 0, 1).reshape(r, k * chunk_size)[:, :n]
  return unblock(logp), unblock(entropy)


def grpo_loss(params, unused_teacher, batch, *, cfg, grpo_cfg, kl_cfg,
              temperature, vocab_size=None, shard=None):
  """step.train_step loss: the GRPO objective of one (micro-)batch.

  `batch` holds tokens, attention_mask [R, P+N]; loss_mask, old_logp,
  ref_logp, weights [R, N]; advantages [R]. Metrics are means over the
  micro-batch's response tokens (rl/pg_loss a weighted sum), which
  step.train_step merges over micro-batches into the mini-batch's figures.
  """
  del unused_teacher
  n = batch["loss_mask"].shape[1]
  logp, entropy = token_logprobs(cfg, params, batch["tokens"],
                                 batch["attention_mask"], n,
                                 temperature=temperature,
                                 vocab_size=vocab_size, shard=shard)
  mask = batch["loss_mask"] > 0
  loss, metrics = grpo_objective(
      logp, batch["old_logp"], batch["advantages"], batch["weights"], mask,
      clip_low=float(grpo_cfg.clip_low), clip_high=float(grpo_cfg.clip_high),
      ref_logp=batch.get("ref_logp"), kl_coef=float(kl_cfg.coef),
      kl_estimator=kl_cfg.estimator)
  metrics["rl/entropy"] = _masked_mean(entropy, mask)
  # |log rho|: sampler/trainer numerics on a fresh batch, then policy drift.
  metrics["rl/abs_log_ratio"] = _masked_mean(
      jnp.abs(jax.lax.stop_gradient(logp) - batch["old_logp"]), mask)
  # Every mean above is over the response tokens: merged across gradient-
  # accumulation micro-batches by their token counts (step.train_step).
  metrics[step_lib.MEAN_WEIGHT] = jnp.sum(mask.astype(jnp.float32))
  return loss, metrics
