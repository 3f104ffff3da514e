"""Single-sample KL estimators on the tokens of a rollout.

Inputs are per-token log-probabilities of the sampled tokens y_t:
log q(y_t) from the student (carries the gradient) and log p(y_t) from the
teacher (constant). With log r = log p(y_t) - log q(y_t):

  k1 = -log r                 k2 = (log r)^2 / 2
  k3 = (r - 1) - log r        rkl_surrogate = -stopgrad(log r) * log q(y_t)

What matters for training is the EXPECTED GRADIENT of each, not its value.
Using grad k1 = grad log q, grad k2 = grad rkl_surrogate = -log r grad log q,
grad k3 = (1 - r) grad log q, and E_q[grad log q] = 0, on tokens drawn from
the rollout policy b with the constant weight w(y) = q(y) / b(y)
(E_b[w f] = E_q[f], so every row is the same as for student samples):

  estimator      student: b = q, w = 1   teacher: b = p,   mixture: b = lam q +
                                         w = q / p         (1 - lam) p, w = q / b
  k1             0 (value: unbiased RKL)  0                 0
  k2             grad RKL (value biased)  grad RKL          grad RKL
  k3             grad FKL  <- the trap    grad FKL          grad FKL
  rkl_surrogate  grad RKL                 grad RKL          grad RKL

(FKL = KL(p||q), RKL = KL(q||p), gradients w.r.t. the student parameters;
checked in tests/losses/sampled_test.py by Monte Carlo and, every cell, by
exact enumeration over a small vocabulary through `sampled_kl_from_logits`,
the training step's loss.) k3 is the trap:
back-propagating the unbiased, low-variance RKL VALUE estimator trains the
FORWARD KL. WITHOUT the weight, teacher samples give none of these: k1 then
follows -grad FKL (it pushes q away from the teacher's tokens), and k2, k3
and rkl_surrogate follow neither KL's gradient. So the reverse-KL objective
is 'rkl_surrogate' (or 'k2'), weighted by q/b whenever b is not the student;
`importance_weights` computes that weight (`sampled_kl_from_logits` applies it
to every estimator) and refuses rollout.policy='dataset' (fixed text has no
known b). The
estimators also assume y ~ softmax(z / tau_S) over the full vocabulary (or
the teacher's / the policy's distribution, reweighted): config validation
refuses a sampled loss with a rollout top-k or top-p.

These estimators score the rollout's OWN tokens. The paper's sampled KL (App.
A.2) is another method: `fresh_sampled_kl` draws a new token at every
position, from the teacher for forward KL and from the student for reverse KL. Nothing here differentiates through the
sampling itself.

`importance_weight` [B, T] is treated as a constant (stop-gradient) and
multiplies each token's estimate; the reduction still normalises by the mask
(unbiased, not self-normalised). Tokens with weight exactly 0 contribute
exactly 0, even where their log-ratio is infinite.
"""
from __future__ import annotations

import jax
from jax import lax
import jax.numpy as jnp

from jaxdistill import choices
from jaxdistill.losses import _common as c

# The loss kind (config loss.kind) of these estimators.
SAMPLED = choices.SAMPLED
ESTIMATORS = choices.ESTIMATORS
# sampled_kl's: on the rollout's own tokens.
_ON_ROLLOUT = choices.ROLLOUT_TOKEN_ESTIMATORS


def _estimates(lq, log_r):
  """All four per-token estimates from log q(y) and the constant log r."""
  return {
      "k1": -log_r,
      "k2": 0.5 * jnp.square(log_r),
      # expm1 keeps k3 accurate when r ~ 1, where (r - 1) - log r cancels.
      "k3": jnp.expm1(log_r) - log_r,
      "rkl_surrogate": -lax.stop_gradient(log_r) * lq,
  }


def sampled_kl(student_logprobs, teacher_logprobs, mask, *,
               estimator="rkl_surrogate", importance_weight=None,
               reduction="token_mean"):
  """Sampled KL estimator on rollout tokens, reduced over the response mask.

  Args:
    student_logprobs: [B, T] log q(y_t) of the sampled tokens (gradient).
    teacher_logprobs: [B, T] log p(y_t); no gradient flows into it.
    mask: [B, T] response mask.
    estimator: 'k1' | 'k2' | 'k3' | 'rkl_surrogate'; see the module table for
      which divergence's gradient each follows.
    importance_weight: optional [B, T] per-token constant weight q(y)/b(y)
      for tokens drawn from a policy b other than the student (q/p for the
      teacher, q/(lam q + (1-lam) p) for the mixture); see the module table.
    reduction: 'token_mean' | 'sequence_mean' | 'sequence_sum' | 'sum'
      (see losses.divergence).

  Returns:
    (loss, metrics) with 'distill/loss', 'distill/k1', 'distill/k2',
    'distill/k3' (weighted token means: k1 and k3 are reverse-KL value
    estimates when the weighted samples follow q), 'distill/tokens' and, if
    given, 'distill/importance_weight' (token mean). Metrics carry no gradient.
  """
  if estimator not in _ON_ROLLOUT:
    raise ValueError(f"estimator must be one of {_ON_ROLLOUT}, got "
                     f"{estimator!r} (the fresh-token estimators are "
                     "fresh_sampled_kl)")
  c.check_float(student_logprobs, "student_logprobs", 2)
  c.check_float(teacher_logprobs, "teacher_logprobs", 2)
  shape = student_logprobs.shape
  if teacher_logprobs.shape != shape:
    raise ValueError(
        f"teacher_logprobs must have shape {shape}, got {teacher_logprobs.shape}")
  c.check_mask(mask, shape)
  if importance_weight is not None:
    c.check_float(importance_weight, "importance_weight", 2)
    if importance_weight.shape != shape:
      raise ValueError(f"importance_weight must have shape {shape}, "
                       f"got {importance_weight.shape}")

  active = mask != 0
  if importance_weight is None:
    iw = jnp.ones(shape, jnp.float32)
  else:
    iw = lax.stop_gradient(importance_weight.astype(jnp.float32))
  keep = active & (iw != 0)
  iw = jnp.where(keep, iw, 0.0)
  # Sanitise the inputs of dropped tokens too (double where): a -inf log-prob
  # at a padded position would otherwise put 0 * inf = NaN into the gradient.
  lq = jnp.where(keep, student_logprobs.astype(jnp.float32), 0.0)
  lp = jnp.where(keep, lax.stop_gradient(teacher_logprobs.astype(jnp.float32)),
                 0.0)
  log_r = lp - lq
  est = {k: jnp.where(keep, iw * v, 0.0) for k, v in _estimates(lq, log_r).items()}

  loss = jnp.sum(c.reduction_weights(mask, reduction) * est[estimator])
  metrics = {
      "distill/loss": loss,
      "distill/k1": c.token_mean(est["k1"], mask),
      "distill/k2": c.token_mean(est["k2"], mask),
      "distill/k3": c.token_mean(est["k3"], mask),
      "distill/tokens": jnp.sum(active.astype(jnp.float32)),
  }
  if importance_weight is not None:
    metrics["distill/importance_weight"] = c.token_mean(iw, mask)
  return loss, {k: lax.stop_gradient(v) for k, v in metrics.items()}


def importance_weights(logq, logp, policy, lam=None, behaviour=None):
  """[B, T] constant weights q(y) / b(y) for the sampled estimators, or None.

  The estimators' expected gradients (module table) hold for tokens drawn
  from the student q = softmax(z / tau). Tokens drawn from another policy b
  are reweighted by q(y) / b(y), which turns the expectation under b into
  the one under q, for every estimator. `behaviour` ([B, T], log b(y)) is the
  rollout's own `behaviour_logprobs` when available (the mixture's log-prob
  as sampled); otherwise b is rebuilt from the given log-probs: p for
  'teacher', lam q + (1 - lam) p for 'coin_mixture'.

  Args:
    logq, logp: [B, T] log q(y), log p(y), each at its model's temperature.
    policy: the rollout policy: 'student' (no weight: returns None),
      'teacher' or 'coin_mixture'. 'dataset' is refused: fixed text was not
      sampled from any of these, so no q / b weight is known.
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
  lq = lax.stop_gradient(logq)
  if behaviour is not None:
    lb = lax.stop_gradient(behaviour.astype(jnp.float32))
  elif policy == "teacher":
    lb = logp
  elif policy == "coin_mixture":
    if lam is None or not 0.0 <= float(lam) <= 1.0:
      raise ValueError(f"rollout.lam: must be in [0, 1] for a mixture, got {lam}")
    lam = float(lam)
    lb = (jnp.logaddexp(jnp.log(lam) + lq, jnp.log1p(-lam) + logp)
          if 0 < lam < 1 else (lq if lam == 1 else logp))
  else:
    raise ValueError(f"rollout.policy: unknown {policy!r}")
  return lax.stop_gradient(jnp.exp(lq - lb))


def _gather(logp, ids):
  return jnp.take_along_axis(logp, ids[..., None], axis=-1)[..., 0]


def sampled_kl_from_logits(student_logits, teacher_logits, tokens, mask, *,
                           estimator="rkl_surrogate", temperature=1.0,
                           teacher_temperature=None, policy="student", lam=None,
                           behaviour_logprobs=None, iw_clip=None,
                           reduction="token_mean", vocab_size=None):
  """`sampled_kl` on a rollout's own tokens, from full logits: the log-probs
  of `tokens` at `temperature`, importance-weighted by `importance_weights`
  when the rollout policy is not the student.

  Args:
    student_logits: [B, T, V_s] logits at the positions that predict `tokens`.
    teacher_logits: [B, T, V_t] teacher logits there; no gradient.
    tokens: [B, T] int the sampled tokens y_t.
    mask: [B, T] response mask (or token weights).
    estimator: as in `sampled_kl`.
    temperature: the student's tau_S > 0 (a student rollout samples at it).
    teacher_temperature: the teacher's tau_T (None: tau_S).
    policy, lam, behaviour_logprobs: the rollout policy, its mixture weight
      and, optionally, its own [B, T] log b(y_t) (`importance_weights`).
    iw_clip: optional cap on the importance weights (None: no cap).
    reduction: as in `sampled_kl`.
    vocab_size: shared real vocabulary; required if V_s != V_t.

  Returns:
    (loss, metrics) of `sampled_kl`.
  """
  c.check_float(student_logits, "student_logits", 3)
  c.check_float(teacher_logits, "teacher_logits", 3)
  v = c.shared_vocab(student_logits.shape[-1], teacher_logits.shape[-1],
                     vocab_size, "student_logits", "teacher_logits")
  tau, tau_t = c.check_temperatures(temperature, teacher_temperature)
  logq_all = jax.nn.log_softmax(
      student_logits[..., :v].astype(jnp.float32) / tau, axis=-1)
  logp_all = jax.nn.log_softmax(
      teacher_logits[..., :v].astype(jnp.float32) / tau_t, axis=-1)
  logq, logp = _gather(logq_all, tokens), _gather(logp_all, tokens)  # [B, T]
  logp = lax.stop_gradient(logp)
  iw = importance_weights(logq, logp, policy, lam, behaviour_logprobs)
  if iw is not None and iw_clip is not None:
    iw = jnp.minimum(iw, iw_clip)
  return sampled_kl(logq, logp, mask, estimator=estimator,
                    importance_weight=iw, reduction=reduction)


FRESH = choices.FRESH_ESTIMATORS  # loss.estimator names of fresh_sampled_kl


def draw_by_cdf(logprobs, u):
  """[...] index drawn from exp(logprobs) [..., V] by inverse CDF with one
  uniform u [...] in [0, 1) per row (float32; never a zero-probability id)."""
  p = jnp.exp(logprobs - jnp.max(logprobs, axis=-1, keepdims=True))
  cdf = jnp.cumsum(p, axis=-1)
  idx = jnp.sum(cdf <= (u * cdf[..., -1])[..., None], axis=-1)
  # Rounding can step past the last token with mass: clamp to it.
  last = jnp.max(jnp.where(p > 0, jnp.arange(p.shape[-1]), 0), axis=-1)
  return jnp.minimum(idx, last).astype(jnp.int32)


def fresh_sampled_kl(student_logits, teacher_logits, mask, uniforms, *,
                     direction="forward", temperature=1.0,
                     teacher_temperature=None, reduction="sequence_mean",
                     vocab_size=None):
  """The paper's single-sample KL (App. A.2): a FRESH token per position.

  At every position with mask != 0 one token y is drawn, independently of the
  rollout's own token: from the teacher p = softmax(u / tau_T) for
  direction='forward', with per-token loss -log q(y); from the (current,
  stop-gradient) student q = softmax(z / tau_S) for direction='reverse', with
  loss sg[log q(y) - log p(y)] * log q(y). Their expected gradients are the
  exact forward and reverse KL gradients (tests/losses/sampled_test.py checks
  this by Monte Carlo against the closed forms).

  Args:
    student_logits: [B, T, V_s]; teacher_logits: [B, T, V_t] (no gradient).
    mask: [B, T] response mask (or token weights).
    uniforms: [B, T] float32 in [0, 1): one uniform per position, the draw's
      randomness (inverse CDF), so the loss stays a pure function.
    direction: 'forward' | 'reverse' (which model the token is drawn from).
    temperature, teacher_temperature: tau_S and tau_T (None: tau_S).
    reduction: as in `divergence` (the paper: 'sequence_mean').
    vocab_size: shared real vocabulary; required if V_s != V_t.

  Returns:
    (loss, metrics): 'distill/loss', 'distill/fresh_logq' (mean log q(y)),
    'distill/fresh_logratio' (mean log q(y) - log p(y); for 'reverse' an
    unbiased estimate of the reverse KL) and 'distill/tokens'.
  """
  if direction not in ("forward", "reverse"):
    raise ValueError(f"direction: 'forward' or 'reverse', got {direction!r}")
  c.check_float(student_logits, "student_logits", 3)
  c.check_float(teacher_logits, "teacher_logits", 3)
  c.check_mask(mask, student_logits.shape[:2])
  if tuple(jnp.shape(uniforms)) != tuple(student_logits.shape[:2]):
    raise ValueError(f"uniforms: expected shape {student_logits.shape[:2]} "
                     f"([B, T]), got {jnp.shape(uniforms)}")
  v = c.shared_vocab(student_logits.shape[-1], teacher_logits.shape[-1],
                     vocab_size, "student_logits", "teacher_logits")
  tau, tau_t = c.check_temperatures(temperature, teacher_temperature)
  active = mask != 0
  z = jnp.where(active[..., None],
                student_logits[..., :v].astype(jnp.float32) / tau, 0.0)
  u = jnp.where(active[..., None], lax.stop_gradient(
      teacher_logits[..., :v].astype(jnp.float32)) / tau_t, 0.0)
  logq_all = jax.nn.log_softmax(z, axis=-1)
  logp_all = jax.nn.log_softmax(u, axis=-1)
  source = logp_all if direction == "forward" else lax.stop_gradient(logq_all)
  y = draw_by_cdf(source, jnp.asarray(uniforms, jnp.float32))  # [B, T]
  logq, logp = _gather(logq_all, y), _gather(logp_all, y)
  log_ratio = lax.stop_gradient(logq - logp)
  per_token = -logq if direction == "forward" else log_ratio * logq
  per_token = jnp.where(active, per_token, 0.0)
  loss = jnp.sum(c.reduction_weights(mask, reduction) * per_token)
  metrics = {
      "distill/loss": loss,
      "distill/fresh_logq": c.token_mean(jnp.where(active, logq, 0.0), mask),
      "distill/fresh_logratio": c.token_mean(
          jnp.where(active, log_ratio, 0.0), mask),
      "distill/tokens": jnp.sum(active.astype(jnp.float32)),
  }
  return loss, {k: lax.stop_gradient(x) for k, x in metrics.items()}
