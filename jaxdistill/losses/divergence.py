"""Exact token-level divergences between teacher and student logits.

All functions take student logits z and teacher logits u of shape [B, T, V]
and a response mask [B, T] (prompt and padding positions 0). Each model has
its own temperature (the paper: tau_S = 1.0, tau_T = 0.5, App. D.2.2):
`temperature` is the student's tau_S, `teacher_temperature` the teacher's tau_T
(default tau_S). With p = softmax(u / tau_T) (teacher, no gradient) and
q = softmax(z / tau_S):

  forward  FKL_t = sum_v p_v (log p_v - log q_v)    grad_z = (q - p) / tau_S
  reverse  RKL_t = sum_v q_v (log q_v - log p_v)    grad_z = q (log q - log p - RKL_t) / tau_S
  jsd      JSD_t(beta) = [beta KL(p||m) + (1-beta) KL(q||m)] / (beta (1-beta)),
           m = beta p + (1-beta) q; JSD(0) = FKL and JSD(1) = RKL exactly.

The JSD convention is GKD's generalised JSD divided by beta (1 - beta). GKD's
own form tends to 0 at both ends; the division makes the family continuous on
[0, 1] with the forward and reverse KL as its end points (at beta = 1/2 it is
4x the usual Jensen-Shannon divergence). The gradient scale includes the 1/tau
of the chain rule (the student's); nothing multiplies the loss by tau^2.

Per-token values are reduced with weights from `reduction`:
  token_mean (default): sum of values / number of response tokens,
  sequence_mean: mean over sequences (with >= 1 response token) of each
    sequence's token mean,
  sequence_sum: mean over sequences (with >= 1 response token) of each
    sequence's SUM over its tokens (the method's "sum per sequence"),
  sum: sum over all response tokens of the WHOLE batch (scale grows with the
    batch size; for a per-sequence sum use sequence_sum).
An all-zero mask gives loss 0 (not NaN) and zero gradients.

Logits are cast to float32. Widths may differ by embedding padding (Qwen2.5:
151936 vs 152064 rows) only if `vocab_size`, the shared real vocabulary, is
given; both are then sliced to it.

Sharding: these functions add no sharding constraints. They are elementwise
plus reductions over V and over [B, T], so under jax.jit whatever sharding the
logits arrive with (batch over ('data', 'fsdp'), vocab over 'tensor', ...) is
propagated by XLA, which inserts the cross-device sums over V itself. Forcing a
layout here would only add resharding when callers shard differently.
"""
from __future__ import annotations

import functools

import jax
from jax import lax
import jax.numpy as jnp

from jaxdistill.losses import _common as c


def _prepare(student_logits, teacher_logits, mask, kind, beta, temperature,
             teacher_temperature, vocab_size):
  """Validates everything and returns float32 (z / tau_S, u / tau_T) over the
  shared vocab."""
  kind = c.check_kind(kind)
  beta = c.check_beta(beta)
  ts, tt = c.check_temperatures(temperature, teacher_temperature)
  c.check_float(student_logits, "student_logits", 3)
  c.check_float(teacher_logits, "teacher_logits", 3)
  if student_logits.shape[:2] != teacher_logits.shape[:2]:
    raise ValueError(
        "teacher_logits must match student_logits in [B, T]: got "
        f"{teacher_logits.shape} vs {student_logits.shape}")
  c.check_mask(mask, student_logits.shape[:2])
  v = c.shared_vocab(student_logits.shape[-1], teacher_logits.shape[-1],
                     vocab_size, "student_logits", "teacher_logits")
  z = student_logits[..., :v].astype(jnp.float32) / ts
  u = lax.stop_gradient(teacher_logits[..., :v].astype(jnp.float32)) / tt
  return z, u, kind, beta


def _masked_terms(z, u, mask, kind, beta, with_grad=False):
  # where, not multiply, on the inputs and the outputs: padded positions may
  # hold -inf rows or garbage whose NaNs a 0 * would carry into the gradient.
  active = mask != 0
  z = jnp.where(active[..., None], z, 0.0)
  u = jnp.where(active[..., None], u, 0.0)
  terms = c.token_terms(z, u, kind, beta, with_grad=with_grad)
  return {k: (v if k == "grad" else jnp.where(active, v, 0.0))
          for k, v in terms.items()}


# On CPU the rows are processed in blocks of about _CPU_BLOCK_BYTES per
# [rows, V] float32 array, whose temporaries stay in cache
# (`_common.cpu_row_block`).
_CPU_BLOCK_BYTES = 1 << 20
_CPU_UNBLOCKED_BYTES = 4 << 20  # below this, one block


def _row_block(n_rows: int, width: int) -> int:
  """Rows per block: n_rows off CPU (one block)."""
  return c.cpu_row_block(n_rows, width, _CPU_BLOCK_BYTES,
                         _CPU_UNBLOCKED_BYTES) or n_rows


def _weighted_rows(kind, beta, z, u, w, m, with_grad):
  """Per-token terms (and w-weighted closed-form gradient) of [N, V] rows."""
  terms = _masked_terms(z, u, m, kind, beta, with_grad=with_grad)
  grad = terms.pop("grad", None)
  if grad is not None:
    grad = jnp.where((m != 0)[..., None], w[..., None] * grad, 0.0)
  return terms, grad


def _weighted_fwd_terms(kind, beta, z, u, w, m, with_grad):
  shape = z.shape  # [B, T, V]
  n, v = shape[0] * shape[1], shape[2]
  rows = _row_block(n, v)
  flat = lambda x, width: x.reshape((n // rows, rows) + width)
  blocks = (flat(z, (v,)), flat(u, (u.shape[-1],)), flat(w, ()), flat(m, ()))
  body = lambda xs: _weighted_rows(kind, beta, *xs, with_grad)
  if rows == n:
    terms, grad = body(jax.tree.map(lambda x: x[0], blocks))
  else:
    terms, grad = lax.map(body, blocks)
  terms = {k: x.reshape(shape[:2]) for k, x in terms.items()}
  loss = jnp.sum(w * terms["loss"])
  return loss, terms, None if grad is None else grad.reshape(shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _weighted_terms(kind, beta, z, u, w, m):
  """(sum_bt w * loss_bt, masked per-token terms) of float32 z, u [B, T, V].

  Differentiable w.r.t. z only, by the closed-form gradient of
  `c.token_terms` (the fused path's), computed in the same pass as the value:
  autodiff would keep several [B, T, V] residuals alive and run as many
  vocabulary-wide passes again backwards. u, w and m get zero cotangents.
  """
  loss, terms, _ = _weighted_fwd_terms(kind, beta, z, u, w, m, False)
  return loss, terms


def _weighted_fwd(kind, beta, z, u, w, m):
  loss, terms, grad = _weighted_fwd_terms(kind, beta, z, u, w, m, True)
  return (loss, terms), (grad, u, w, m)


def _weighted_bwd(kind, beta, res, g):
  del kind, beta
  grad, u, w, m = res
  # The monitoring terms (g[1]) are not differentiated.
  return (g[0] * grad, jnp.zeros_like(u), jnp.zeros_like(w),
          jnp.zeros_like(m))


_weighted_terms.defvjp(_weighted_fwd, _weighted_bwd)


def token_divergence(student_logits, teacher_logits, mask, *, kind="forward",
                     beta=0.5, temperature=1.0, teacher_temperature=None,
                     vocab_size=None):
  """Per-token divergence [B, T] (float32) of `kind`; masked positions are 0."""
  z, u, kind, beta = _prepare(student_logits, teacher_logits, mask, kind, beta,
                              temperature, teacher_temperature, vocab_size)
  return _masked_terms(z, u, mask, kind, beta)["loss"]


def _check_leading(x, name: str):
  if not hasattr(x, "ndim") or x.ndim < 1:
    raise ValueError(f"{name} must be an array with a vocabulary axis, got "
                     f"{type(x).__name__}")
  c.check_float(x, name, x.ndim)


def logit_gradient(student_logits, teacher_logits, *, kind="forward",
                   beta=0.5, temperature=1.0, teacher_temperature=None,
                   vocab_size=None):
  """Closed-form per-position gradient of the divergence w.r.t. the student
  logits: the one `divergence` back-propagates (through its custom VJP).

  For D_t of `kind` between p = softmax(u / tau_T) and q = softmax(z / tau_S):
  forward (q - p) / tau_S, reverse q (log q - log p - RKL_t) / tau_S, jsd as
  in `_common.token_terms` (divided by tau_S). No mask and no reduction: the
  gradient of a reduced loss is weights[..., None] * this.

  Args:
    student_logits: [..., V_s] student logits (any float dtype).
    teacher_logits: [..., V_t] teacher logits with the same leading shape.
    kind, beta, temperature, teacher_temperature, vocab_size: as in
      `divergence`.

  Returns:
    (grad, terms): grad [..., V] float32 over the shared vocabulary V, and
    terms, [...] float32 arrays: 'loss' (the divergence of `kind`), 'fkl',
    'rkl' (and 'jsd' for kind='jsd'). Nothing is differentiable.
  """
  kind = c.check_kind(kind)
  beta = c.check_beta(beta)
  tau, tau_t = c.check_temperatures(temperature, teacher_temperature)
  _check_leading(student_logits, "student_logits")
  _check_leading(teacher_logits, "teacher_logits")
  if student_logits.shape[:-1] != teacher_logits.shape[:-1]:
    raise ValueError(
        "teacher_logits must match student_logits in all but the last axis: "
        f"got {teacher_logits.shape} vs {student_logits.shape}")
  v = c.shared_vocab(student_logits.shape[-1], teacher_logits.shape[-1],
                     vocab_size, "student_logits", "teacher_logits")
  z = student_logits[..., :v].astype(jnp.float32) / tau
  u = teacher_logits[..., :v].astype(jnp.float32) / tau_t
  terms = c.token_terms(z, u, kind, beta, with_grad=True)
  grad = terms.pop("grad") / tau
  return lax.stop_gradient(grad), {k: lax.stop_gradient(x)
                                   for k, x in terms.items()}


def divergence(student_logits, teacher_logits, mask, *, kind="forward",
               beta=0.5, temperature=1.0, teacher_temperature=None,
               reduction="token_mean", vocab_size=None):
  """Reduced divergence of `kind` ('forward' | 'reverse' | 'jsd').

  Args:
    student_logits: [B, T, V_s] student logits (any float dtype).
    teacher_logits: [B, T, V_t] teacher logits; no gradient flows into them.
    mask: [B, T] response mask (bool, int or float token weights).
    kind: 'forward' = KL(p||q), 'reverse' = KL(q||p), 'jsd' = JSD(beta).
    beta: JSD weight in [0, 1] (0 -> forward, 1 -> reverse); static.
    temperature: the student's tau_S > 0; static.
    teacher_temperature: the teacher's tau_T > 0 (None: tau_S); static.
    reduction: 'token_mean' | 'sequence_mean' | 'sequence_sum' | 'sum'.
    vocab_size: shared real vocabulary; required if V_s != V_t.

  Returns:
    (loss, metrics): scalar float32 loss and a dict with 'distill/loss',
    'distill/fkl', 'distill/rkl' (token means, also when the loss is another
    kind or reduction), 'distill/jsd' (kind='jsd' only) and 'distill/tokens'.
    Metrics carry no gradient.

  Raises:
    ValueError naming the offending argument, before any compute.
  """
  z, u, kind, beta = _prepare(student_logits, teacher_logits, mask, kind, beta,
                              temperature, teacher_temperature, vocab_size)
  loss, terms = _weighted_terms(kind, beta, z, u,
                                c.reduction_weights(mask, reduction),
                                mask.astype(jnp.float32))
  metrics = {
      "distill/loss": loss,
      "distill/fkl": c.token_mean(terms["fkl"], mask),
      "distill/rkl": c.token_mean(terms["rkl"], mask),
      "distill/tokens": jnp.sum((mask != 0).astype(jnp.float32)),
  }
  if kind == "jsd":
    metrics["distill/jsd"] = c.token_mean(terms["jsd"], mask)
  return loss, {k: lax.stop_gradient(v) for k, v in metrics.items()}


def forward_kl(student_logits, teacher_logits, mask, *, temperature=1.0,
               teacher_temperature=None, reduction="token_mean",
               vocab_size=None):
  """KL(p_teacher || q_student); see `divergence`."""
  return divergence(student_logits, teacher_logits, mask, kind="forward",
                    temperature=temperature,
                    teacher_temperature=teacher_temperature,
                    reduction=reduction, vocab_size=vocab_size)


def reverse_kl(student_logits, teacher_logits, mask, *, temperature=1.0,
               teacher_temperature=None, reduction="token_mean",
               vocab_size=None):
  """KL(q_student || p_teacher); see `divergence`."""
  return divergence(student_logits, teacher_logits, mask, kind="reverse",
                    temperature=temperature,
                    teacher_temperature=teacher_temperature,
                    reduction=reduction, vocab_size=vocab_size)


def jsd(student_logits, teacher_logits, mask, *, beta=0.5, temperature=1.0,
        teacher_temperature=None, reduction="token_mean", vocab_size=None):
  """Scaled generalised JSD(beta): 0 -> forward KL, 1 -> reverse KL; see `divergence`."""
  return divergence(student_logits, teacher_logits, mask, kind="jsd",
                    beta=beta, temperature=temperature,
                    teacher_temperature=teacher_temperature,
                    reduction=reduction, vocab_size=vocab_size)
