"""Divergences against the teacher's top-k: the truncation real-scale systems use.

The teacher is given by its k most likely token ids and their log-probs,
log p_v = log softmax(u / tau_T)_v over the real vocabulary at the teacher's
temperature (`teacher_topk` produces them; a teacher cache stores them). The
student's logits z are full. Two variants (`variant`), each then fed to the
same per-token core as the exact losses (forward KL, reverse KL, JSD(beta)):

  renorm  both distributions restricted to the k ids S and renormalised:
          p~_i = p_i / sum_S p, q~_i = q_i / sum_S q (a softmax of the
          gathered student logits); the student's mass outside S is ignored.
  tail    k + 1 buckets: the k ids, and one tail bucket holding the
          teacher's remaining mass 1 - sum_S p against the student's
          remaining mass sum_{v not in S} q (a log-sum-exp over the
          non-top-k logits, so it keeps full precision when it is tiny).

With k = V both are the exact divergences (the tail bucket is then absent).
Gradients w.r.t. the full student logits, from the gradient g' of the core
w.r.t. its k (+ 1) bucket logits (which sums to 0): renorm g'_i at id i and 0
elsewhere; tail g'_i at id i and g'_tail * q_v / q_tail at every other v.

Temperatures: the student's logits are divided by its tau_S here
(`temperature`); the teacher's log-probs must already be at the teacher's
tau_T (teacher_topk(..., temperature=tau_T)), since a top-k at one
temperature does not determine the tail mass at another.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
from jax import lax
import jax.numpy as jnp

from jaxdistill import choices
from jaxdistill.losses import _common as c

VARIANTS = choices.TOPK_VARIANTS


def check_topk_inputs(teacher_ids, teacher_logprobs, student, name: str):
  """A teacher top-k ([B, T, K] integer ids and float log-probs) that lines
  up with the student's [B, T, ...] `name`."""
  c.check_float(teacher_logprobs, "teacher_logprobs", 3)
  if not hasattr(teacher_ids, "dtype") or not jnp.issubdtype(
      teacher_ids.dtype, jnp.integer):
    raise ValueError("teacher_ids must be an integer array, got "
                     f"{getattr(teacher_ids, 'dtype', type(teacher_ids))}")
  if teacher_ids.shape != teacher_logprobs.shape:
    raise ValueError(f"teacher_ids {teacher_ids.shape} and teacher_logprobs "
                     f"{teacher_logprobs.shape} must both be [B, T, K]")
  if teacher_ids.shape[:2] != student.shape[:2]:
    raise ValueError(f"teacher_ids must match {name} in [B, T]: got "
                     f"{teacher_ids.shape} vs {student.shape}")


def check_variant(variant) -> str:
  if variant not in VARIANTS:
    raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
  return variant


def check_k(k, vocab: int, name: str = "k") -> int:
  if isinstance(k, bool) or not isinstance(k, int) or k < 1:
    raise ValueError(f"{name} must be a positive int, got {k!r}")
  if k > vocab:
    raise ValueError(f"{name}={k} exceeds the real vocabulary ({vocab})")
  return k


class TeacherTopK(NamedTuple):
  """The teacher's top-k at one temperature: ids [..., k] int32, logprobs
  [..., k] float32 (decreasing), tail [...] float32 = log(1 - sum_k p),
  computed from the non-top-k logits (-inf when k = V)."""
  ids: jax.Array
  logprobs: jax.Array
  tail: jax.Array


def topk_of_scaled(u, k: int) -> TeacherTopK:
  """TeacherTopK of teacher logits u already / tau and sliced to the real
  vocabulary; no gradient."""
  u = lax.stop_gradient(u.astype(jnp.float32))
  lse = _safe_lse(u)
  lse = jnp.where(jnp.isfinite(lse), lse, 0.0)
  vals, ids = lax.top_k(u, k)
  if k == u.shape[-1]:
    tail = jnp.full(lse.shape, -jnp.inf)
  else:
    tail = _safe_lse(_scatter(u, ids, jnp.full(ids.shape, -jnp.inf))) - lse
  return TeacherTopK(ids.astype(jnp.int32), vals - lse[..., None], tail)


def teacher_topk(teacher_logits, k, *, temperature=1.0, vocab_size=None):
  """The teacher's k most likely ids and their log-probs at `temperature`.

  Args:
    teacher_logits: [..., V_t] logits (any float dtype); no gradient.
    k: entries kept, 1 <= k <= vocab (static).
    temperature: tau > 0; the log-probs are log softmax(u / tau).
    vocab_size: real vocabulary (default V_t): padding columns are dropped
      before the softmax, so they never enter the top-k.

  Returns:
    TeacherTopK(ids, logprobs, tail): ids [..., k] int32 and their log-probs
    [..., k] float32 in decreasing order, and the log of the remaining mass
    [...] (exact, from the other logits; what the 'tail' variant uses).
  """
  temperature = c.check_temperature(temperature)
  if not hasattr(teacher_logits, "shape") or teacher_logits.ndim < 1:
    raise ValueError("teacher_logits must be an array with a vocabulary axis")
  v = teacher_logits.shape[-1] if vocab_size is None else c.shared_vocab(
      teacher_logits.shape[-1], teacher_logits.shape[-1], vocab_size,
      "teacher_logits", "teacher_logits")
  check_k(k, v)
  u = teacher_logits[..., :v].astype(jnp.float32) / temperature
  return topk_of_scaled(u, k)


def _safe_lse(x):
  """logsumexp over the last axis: -inf (zero gradient) for an all -inf row."""
  m = lax.stop_gradient(jnp.max(x, axis=-1))
  m = jnp.where(jnp.isfinite(m), m, 0.0)
  se = jnp.sum(jnp.exp(x - m[..., None]), axis=-1)
  return jnp.where(se > 0, m + jnp.log(jnp.where(se > 0, se, 1.0)), -jnp.inf)


def _scatter(x, ids, vals):
  """x[..., ids[..., i]] = vals[..., i] along the last axis."""
  lead = x.shape[:-1]
  n = 1
  for d in lead:
    n *= d
  x2 = jnp.asarray(x).reshape(n, x.shape[-1])
  rows = jnp.arange(n)[:, None]
  out = x2.at[rows, ids.reshape(n, -1)].set(vals.reshape(n, -1))
  return out.reshape(x.shape)


# Smallest tail mass `teacher_tail_logmass` reports: 1 - sum_S p is known only to
# float32 resolution, and a tail of exactly 0 against any student mass makes
# the reverse KL infinite.
TAIL_FLOOR = 2.0 ** -23


def teacher_tail_logmass(logp):
  """log max(1 - sum_S p, TAIL_FLOOR), from the top-k log-probs alone."""
  lse = jnp.minimum(jax.nn.logsumexp(logp, axis=-1), 0.0)
  return jnp.log(jnp.maximum(-jnp.expm1(lse), TAIL_FLOOR))


def topk_token_terms(z, ids, logp, variant: str, kind: str, beta: float,
                     with_grad: bool = False, tail=None):
  """Per-position top-k divergences, as `_common.token_terms`.

  Args:
    z: student logits / tau [..., V] over the real vocabulary (gradient).
    ids: [..., K] int teacher top-k ids (< V, distinct).
    logp: [..., K] teacher log-probs at tau (constant).
    with_grad: also return 'grad' = d loss / d z [..., V] in closed form.
    tail: [...] teacher log(1 - sum_S p) (TeacherTopK.tail); if None it is
      rebuilt from `logp`, floored at TAIL_FLOOR.
  """
  v, k = z.shape[-1], ids.shape[-1]
  logp = lax.stop_gradient(logp.astype(jnp.float32))
  z_s = jnp.take_along_axis(z, ids, axis=-1)  # [..., K]
  if variant == "renorm" or k == v:
    zz, uu = z_s, logp  # the core's log-softmax renormalises both over S
  else:
    lse_all = _safe_lse(z)
    # The student's mass outside S: a log-sum-exp over the non-top-k logits
    # (not log(1 - sum_S q), which cancels when the tail is tiny).
    lse_tail = _safe_lse(_scatter(z, ids, jnp.full(ids.shape, -jnp.inf)))
    zz = jnp.concatenate([z_s, lse_tail[..., None]], -1) - lse_all[..., None]
    tail = teacher_tail_logmass(logp) if tail is None else lax.stop_gradient(
        tail.astype(jnp.float32))
    uu = jnp.concatenate([logp, tail[..., None]], -1)
  terms = c.token_terms(zz, uu, kind, beta, with_grad=with_grad)
  if with_grad:
    g = terms["grad"]  # [..., K (+1)]
    if zz.shape[-1] == k:
      full = jnp.zeros(z.shape, jnp.float32)
    else:
      # g'_tail * q_v / q_tail off S (the top-k entries are overwritten below).
      share = jnp.exp(z - zz[..., -1:] - lse_all[..., None])
      full = g[..., -1:] * jnp.where(jnp.isfinite(zz[..., -1:]), share, 0.0)
    terms["grad"] = lax.stop_gradient(_scatter(full, ids, g[..., :k]))
  return terms


def topk_logit_gradient(student_logits, teacher_ids, teacher_logprobs, *,
                        kind="forward", beta=0.5, temperature=1.0,
                        vocab_size=None, variant="renorm", teacher_tail=None):
  """Closed-form per-position gradient of the top-k divergence w.r.t. the
  student logits (module docstring), as `divergence.logit_gradient`.

  Args:
    student_logits: [..., V_s] student logits.
    teacher_ids, teacher_logprobs: [..., K] the teacher's top-k at its own
      temperature (`teacher_topk`), same leading shape.
    kind, beta, temperature, vocab_size, variant, teacher_tail: as in
      `topk_divergence` (teacher_tail [...]).

  Returns:
    (grad, terms): grad [..., V] float32 over the real vocabulary V, and
    terms [...] float32: 'loss', 'fkl', 'rkl' (and 'jsd') of the top-k
    variant. Nothing is differentiable.
  """
  kind = c.check_kind(kind)
  beta = c.check_beta(beta)
  tau = c.check_temperature(temperature)
  variant = check_variant(variant)
  if not hasattr(student_logits, "ndim") or student_logits.ndim < 1:
    raise ValueError("student_logits must be an array with a vocabulary axis")
  c.check_float(student_logits, "student_logits", student_logits.ndim)
  c.check_float(teacher_logprobs, "teacher_logprobs", student_logits.ndim)
  if not hasattr(teacher_ids, "dtype") or not jnp.issubdtype(
      teacher_ids.dtype, jnp.integer):
    raise ValueError("teacher_ids must be an integer array, got "
                     f"{getattr(teacher_ids, 'dtype', type(teacher_ids))}")
  lead = student_logits.shape[:-1]
  if (teacher_ids.shape != teacher_logprobs.shape
      or teacher_ids.shape[:-1] != lead):
    raise ValueError(f"teacher_ids {teacher_ids.shape} and teacher_logprobs "
                     f"{teacher_logprobs.shape} must both be {lead} + [K]")
  z = _student_z(student_logits, teacher_ids, teacher_tail, vocab_size, tau)
  terms = topk_token_terms(z, teacher_ids, teacher_logprobs, variant, kind,
                           beta, with_grad=True, tail=teacher_tail)
  grad = terms.pop("grad") / tau
  return lax.stop_gradient(grad), {k: lax.stop_gradient(x)
                                   for k, x in terms.items()}


def _prepare(student_logits, teacher_ids, teacher_logprobs, mask, kind, beta,
             temperature, vocab_size, variant, teacher_tail=None):
  kind = c.check_kind(kind)
  beta = c.check_beta(beta)
  temperature = c.check_temperature(temperature)
  variant = check_variant(variant)
  c.check_float(student_logits, "student_logits", 3)
  check_topk_inputs(teacher_ids, teacher_logprobs, student_logits,
                    "student_logits")
  c.check_mask(mask, student_logits.shape[:2])
  z = _student_z(student_logits, teacher_ids, teacher_tail, vocab_size,
                 temperature)
  return z, kind, beta, variant


def _student_z(student_logits, teacher_ids, teacher_tail, vocab_size, tau):
  """The student logits over the real vocabulary, divided by the temperature,
  after the checks every top-k loss makes of the tail, vocabulary and k."""
  lead = tuple(teacher_ids.shape[:-1])
  if teacher_tail is not None and tuple(teacher_tail.shape) != lead:
    raise ValueError(f"teacher_tail must have shape {lead} (the leading axes "
                     f"of teacher_ids), got {teacher_tail.shape}")
  v = c.shared_vocab(student_logits.shape[-1], student_logits.shape[-1],
                     vocab_size, "student_logits", "student_logits")
  check_k(teacher_ids.shape[-1], v, "teacher_ids.shape[-1] (k)")
  return student_logits[..., :v].astype(jnp.float32) / tau


def topk_divergence(student_logits, teacher_ids, teacher_logprobs, mask, *,
                    kind="forward", beta=0.5, temperature=1.0,
                    reduction="token_mean", vocab_size=None, variant="renorm",
                    teacher_tail=None):
  """Reduced divergence of `kind` against the teacher's top-k.

  Args:
    student_logits: [B, T, V_s] student logits.
    teacher_ids: [B, T, K] int teacher top-k ids (< vocab_size).
    teacher_logprobs: [B, T, K] teacher log-probs at the teacher's own
      temperature (from `teacher_topk`); no gradient flows into them.
    mask, kind, beta, reduction: as in `divergence`.
    temperature: the student's tau_S > 0.
    vocab_size: the real vocabulary (default V_s); student columns beyond it
      are padding and are dropped (their gradient is 0).
    variant: 'renorm' | 'tail' (module docstring).
    teacher_tail: [B, T] log of the teacher's mass outside its top-k
      (TeacherTopK.tail, exact); if None, the 'tail' variant rebuilds it from
      the log-probs as 1 - sum, floored at TAIL_FLOOR (float32 resolution).

  Returns:
    (loss, metrics) as `divergence`; 'distill/fkl', 'distill/rkl' (and
    'distill/jsd') are the top-k variant's values, and 'distill/topk_mass' is
    the teacher's mean probability mass on its top-k.
  """
  z, kind, beta, variant = _prepare(student_logits, teacher_ids,
                                    teacher_logprobs, mask, kind, beta,
                                    temperature, vocab_size, variant,
                                    teacher_tail)
  active = mask != 0
  z = jnp.where(active[..., None], z, 0.0)
  lp = jnp.where(active[..., None], teacher_logprobs.astype(jnp.float32), 0.0)
  ids = jnp.where(active[..., None], teacher_ids, jnp.arange(
      teacher_ids.shape[-1], dtype=teacher_ids.dtype))
  tail = None if teacher_tail is None else jnp.where(
      active, teacher_tail.astype(jnp.float32), -1.0)
  terms = topk_token_terms(z, ids, lp, variant, kind, beta, tail=tail)
  terms = {k: jnp.where(active, x, 0.0) for k, x in terms.items()}
  loss = jnp.sum(c.reduction_weights(mask, reduction) * terms["loss"])
  mass = jnp.exp(jax.nn.logsumexp(lp, axis=-1))
  metrics = {
      "distill/loss": loss,
      "distill/fkl": c.token_mean(terms["fkl"], mask),
      "distill/rkl": c.token_mean(terms["rkl"], mask),
      "distill/topk_mass": c.token_mean(mass, mask),
      "distill/tokens": jnp.sum(active.astype(jnp.float32)),
  }
  if kind == "jsd":
    metrics["distill/jsd"] = c.token_mean(terms["jsd"], mask)
  return loss, {k: lax.stop_gradient(x) for k, x in metrics.items()}


def topk_forward_kl(student_logits, teacher_ids, teacher_logprobs, mask, **kw):
  """Forward KL(p || q) against the teacher's top-k; see `topk_divergence`."""
  return topk_divergence(student_logits, teacher_ids, teacher_logprobs, mask,
                         kind="forward", **kw)


def topk_reverse_kl(student_logits, teacher_ids, teacher_logprobs, mask, **kw):
  """Reverse KL(q || p) against the teacher's top-k; see `topk_divergence`."""
  return topk_divergence(student_logits, teacher_ids, teacher_logprobs, mask,
                         kind="reverse", **kw)


def topk_jsd(student_logits, teacher_ids, teacher_logprobs, mask, *, beta=0.5,
             **kw):
  """Scaled JSD(beta) against the teacher's top-k; see `topk_divergence`."""
  return topk_divergence(student_logits, teacher_ids, teacher_logprobs, mask,
                         kind="jsd", beta=beta, **kw)
