"""Argument checks, reduction weights and the safe per-token divergence core.

Shared by the plain-logits losses (divergence.py), the sampled estimators
(sampled.py) and the fused hidden-state path (fused.py), so that every path
computes exactly the same per-token numbers.

Notation: p = softmax(u / tau) is the teacher, q = softmax(z / tau) the
student, d = log p - log q per vocabulary entry.
"""
from __future__ import annotations

import math
import numbers

import jax
from jax import lax
import jax.numpy as jnp

from jaxdistill import choices
from jaxdistill import sharding

KINDS = choices.KINDS
REDUCTIONS = choices.REDUCTIONS


# --------------------------------------------------------------------------
# Argument checks. They run at trace time on static values and shapes, so a
# bad configuration fails before any compute.
# --------------------------------------------------------------------------


def static_number(value, name: str) -> float:
  """Returns `value` as a Python float; ValueError naming `name` otherwise."""
  if isinstance(value, (bool, str, bytes)):
    raise ValueError(f"{name} must be a number, got {value!r}")
  try:
    out = float(value)
  except (TypeError, ValueError, jax.errors.ConcretizationTypeError) as e:
    raise ValueError(
        f"{name} must be a static (Python or concrete) number, got {value!r}"
    ) from e
  if not math.isfinite(out):
    raise ValueError(f"{name} must be finite, got {value!r}")
  return out


def check_kind(kind) -> str:
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
  return kind


def check_beta(beta) -> float:
  beta = static_number(beta, "beta")
  if not 0.0 <= beta <= 1.0:
    raise ValueError(f"beta must lie in [0, 1], got {beta}")
  return beta


def check_temperature(temperature) -> float:
  temperature = static_number(temperature, "temperature")
  if temperature <= 0.0:
    raise ValueError(f"temperature must be > 0, got {temperature}")
  return temperature


def check_temperatures(temperature, teacher_temperature) -> tuple[float, float]:
  """(student tau_S, teacher tau_T): `teacher_temperature` None means tau_S."""
  ts = check_temperature(temperature)
  if teacher_temperature is None:
    return ts, ts
  tt = static_number(teacher_temperature, "teacher_temperature")
  if tt <= 0.0:
    raise ValueError(f"teacher_temperature must be > 0, got {tt}")
  return ts, tt


def check_reduction(reduction) -> str:
  if reduction not in REDUCTIONS:
    raise ValueError(
        f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
  return reduction


def check_float(x, name: str, ndim: int):
  if not hasattr(x, "shape") or not hasattr(x, "dtype"):
    raise ValueError(f"{name} must be an array, got {type(x).__name__}")
  if x.ndim != ndim:
    raise ValueError(f"{name} must have {ndim} dims, got shape {x.shape}")
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f"{name} must be floating point, got dtype {x.dtype}")


def check_mask(mask, shape) -> None:
  if not hasattr(mask, "shape"):
    raise ValueError(f"mask must be an array, got {type(mask).__name__}")
  if tuple(mask.shape) != tuple(shape):
    raise ValueError(
        f"mask must have shape {tuple(shape)} ([B, T]), got {tuple(mask.shape)}")


def shared_vocab(student_width: int, teacher_width: int, vocab_size,
                 student_name: str, teacher_name: str) -> int:
  """The vocabulary both distributions are compared over.

  Equal widths need no vocab_size. Unequal widths are only ever embedding
  padding of one shared tokenizer, so the caller must name the real size:
  guessing min(widths) would silently hide a tokenizer mismatch.
  """
  if vocab_size is None:
    if student_width != teacher_width:
      raise ValueError(
          f"vocab_size is required: {student_name} has width {student_width} "
          f"but {teacher_name} has width {teacher_width}; pass the shared real "
          "vocabulary size (padding columns are then dropped)")
    return int(student_width)
  if isinstance(vocab_size, bool) or not isinstance(vocab_size, numbers.Integral):
    raise ValueError(f"vocab_size must be an int, got {vocab_size!r}")
  vocab_size = int(vocab_size)
  if vocab_size <= 0:
    raise ValueError(f"vocab_size must be positive, got {vocab_size}")
  if vocab_size > min(student_width, teacher_width):
    raise ValueError(
        f"vocab_size={vocab_size} exceeds the vocabulary width of "
        f"{student_name} ({student_width}) or {teacher_name} ({teacher_width})")
  return vocab_size


# --------------------------------------------------------------------------
# CPU row blocking. XLA:CPU does not fuse an elementwise producer into a
# reduction: every log-softmax statistic over V writes a [rows, V] temporary
# to memory and reads it back. On CPU the exact losses therefore loop over
# blocks of rows (the per-row numbers are the same; only the loop differs).
# --------------------------------------------------------------------------


def cpu_row_block(n_rows: int, width: int, block_bytes: int,
                  whole_bytes: int) -> int:
  """Rows per block of a loop over [n_rows, width] float32 rows on CPU: all
  n_rows when they take at most `whole_bytes`, else the largest divisor of
  n_rows whose block is at most `block_bytes` (at least 1 row). 0 off CPU
  (`sharding.platform()`, so a TPU program traced on a CPU host is not
  blocked)."""
  if sharding.platform() != "cpu":
    return 0
  if n_rows * width * 4 <= whole_bytes:
    return n_rows
  target = max(1, block_bytes // (4 * width))
  return max(r for r in range(1, min(target, n_rows) + 1) if n_rows % r == 0)


# --------------------------------------------------------------------------
# Reductions. Every reduction is a weighted sum over tokens, so the plain and
# the fused (chunked) paths share it: loss = sum_bt weights[b, t] * value[b, t].
# --------------------------------------------------------------------------


def _safe_div(num, den):
  ok = den > 0
  return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


def reduction_weights(mask, reduction: str):
  """Per-token weights [B, T] (float32) that implement `reduction`.

  The one implementation of the reductions (and the one check of the name,
  ValueError naming 'reduction'): every loss here reduces as
  sum_bt weights * value, and the training step computes these weights once
  over the whole batch before splitting it into micro-batches.

  token_mean:    mask / sum(mask)                 (0 if the mask is empty)
  sequence_mean: mask / n_tokens[b] / n_sequences (sequences without response
                 tokens are left out of the mean over sequences)
  sequence_sum:  mask / n_sequences: each sequence's SUM over its tokens, then
                 the mean over sequences (docs/method.md's "sum per sequence"; the
                 scale does not grow with the batch size, it does with length)
  sum:           mask: the sum over every token of the whole batch, so the
                 loss and gradient scale grow with the batch size (and change
                 what a fixed clip_norm clips)
  Float masks act as token weights; bool/int masks as 0/1.
  """
  check_reduction(reduction)
  w = mask.astype(jnp.float32)  # [B, T]
  if reduction == "token_mean":
    return _safe_div(w, jnp.sum(w))
  if reduction == "sequence_mean":
    per_seq = jnp.sum(w, axis=-1, keepdims=True)  # [B, 1]
    n_seq = jnp.sum((per_seq > 0).astype(jnp.float32))
    return _safe_div(_safe_div(w, per_seq), n_seq)
  if reduction == "sequence_sum":
    n_seq = jnp.sum((jnp.sum(w, axis=-1) > 0).astype(jnp.float32))
    return _safe_div(w, n_seq)
  return w


def token_mean(values, mask):
  """Mean of [B, T] values over tokens with mask != 0 (0 for an empty mask)."""
  w = mask.astype(jnp.float32)
  return _safe_div(jnp.sum(w * values), jnp.sum(w))


# --------------------------------------------------------------------------
# The per-token core.
# --------------------------------------------------------------------------


def safe_log_softmax(x):
  """log_softmax over the last axis that tolerates -inf entries and rows.

  A row of only -inf (a padded position) yields -inf everywhere instead of
  NaN, and its gradient is 0, so where-masking it later is NaN-free also in
  the backward pass (0 * NaN would survive a plain multiply by the mask).
  """
  m = lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))
  m = jnp.where(jnp.isfinite(m), m, 0.0)
  s = x - m
  se = jnp.sum(jnp.exp(s), axis=-1, keepdims=True)
  return s - jnp.log(jnp.where(se > 0, se, 1.0))


def token_terms(z, u, kind: str, beta: float, with_grad: bool = False):
  """Per-position divergences from float32 logits already divided by tau.

  Args:
    z: student logits / tau, [..., V]; carries the gradient.
    u: teacher logits / tau, [..., V]; treated as a constant.
    kind: which divergence `loss` holds ('forward', 'reverse' or 'jsd').
    beta: JSD mixing weight (used only for kind='jsd').
    with_grad: also return 'grad', d loss / d z [..., V], from the closed
      forms below (no autodiff): the gradient every exact loss
      back-propagates (divergence's custom VJP, the fused path, whose
      per-chunk gradient then needs no autodiff residuals) and that
      `divergence.logit_gradient` returns.

  Returns:
    dict of [...] arrays: 'loss' (the chosen divergence), and 'fkl', 'rkl'
    (and 'jsd' for kind='jsd') for monitoring; the monitoring values carry no
    gradient.

  Terms with p = 0 (resp. q = 0) are dropped by where-guards on both the value
  and its argument, so masked vocabulary entries (-inf logits) cost no NaN in
  either pass. FKL is +inf only where the teacher has mass the student lacks
  (and RKL vice versa): that is the true value, not a numerical accident. JSD
  is always finite.

  Closed-form gradients w.r.t. z (the 1/tau of z = logits / tau is the
  caller's): forward q - p; reverse q (log q - log p - RKL); scaled JSD
  q (h - sum_v q h) with h = -log(m / q) / beta, because
  d [beta KL(p||m) + (1-beta) KL(q||m)] / d q_v = (1 - beta) log(q_v / m_v).
  """
  if kind == "jsd" and beta in (0.0, 1.0):
    kind = "forward" if beta == 0.0 else "reverse"
    jsd_alias = True
  else:
    jsd_alias = False
  logq = safe_log_softmax(z)
  logp = lax.stop_gradient(safe_log_softmax(u))
  q, p = jnp.exp(logq), jnp.exp(logp)
  d = logp - logq  # NaN where both are -inf; never used there
  d_p = jnp.where(p > 0, d, 0.0)  # finite or +inf
  d_q = jnp.where(q > 0, d, 0.0)  # finite or -inf
  fkl = jnp.sum(p * d_p, axis=-1)
  rkl = -jnp.sum(q * d_q, axis=-1)
  out = {"fkl": lax.stop_gradient(fkl), "rkl": lax.stop_gradient(rkl)}
  if kind == "forward":
    out["loss"] = fkl
    if with_grad:
      out["grad"] = lax.stop_gradient(q - p)
  elif kind == "reverse":
    out["loss"] = rkl
    if with_grad:
      out["grad"] = lax.stop_gradient(q * (-d_q - rkl[..., None]))
  else:
    log_b, log_1mb = math.log(beta), math.log1p(-beta)
    # log(m/q) = log((1-beta) + beta e^d), log(m/p) = log(beta + (1-beta) e^-d):
    # through d, each KL / beta keeps full relative precision near the ends.
    log_m_over_q = jnp.logaddexp(log_1mb, log_b + d_q)
    log_m_over_p = jnp.logaddexp(log_b, log_1mb - d_p)
    kl_p_m = -jnp.sum(p * log_m_over_p, axis=-1)
    kl_q_m = -jnp.sum(q * log_m_over_q, axis=-1)
    # [beta KL(p||m) + (1-beta) KL(q||m)] / (beta (1-beta)): GKD's JSD over
    # beta (1 - beta), whose ends are FKL (beta -> 0) and RKL (beta -> 1).
    out["loss"] = kl_p_m / (1.0 - beta) + kl_q_m / beta
    if with_grad:
      h = -log_m_over_q / beta
      out["grad"] = lax.stop_gradient(
          q * (h - jnp.sum(q * h, axis=-1, keepdims=True)))
  if kind == "jsd" or jsd_alias:
    out["jsd"] = lax.stop_gradient(out["loss"])
  return out
