r"""The paper's rollout-policy spectrum pi_lambda (arXiv 2609.35259, Sec. 5.2 and
App. D.5): one policy per lambda in [-2, 2] between and beyond the teacher
(lambda = -1, off-policy) and the student (lambda = +1, on-policy).

Both models score the same prefix; ls = log pi_S, lt = log pi_T are their
tempered log-softmaxes and r = ls - lt. The sampling scores are

  |lambda| <= 1:  z = (1 + lambda)/2 ls + (1 - lambda)/2 lt
                  (lambda = 0: the normalised geometric midpoint)
  lambda > 1:     z = ls + (lambda - 1)/2 * M_S * min(max(r, 0), c)
  lambda < -1:    z = lt + (-lambda - 1)/2 * M_T * min(max(-r, 0), c)

with plausibility masks M_S = [ls >= max ls + log alpha] (M_T likewise on lt)
that gate only the extrapolation bonus, and pi_lambda = softmax(z). The
defaults alpha = 0.2 and c = 2 log 3 are the paper's: over [-2, 2] no pair of
tokens has its odds moved by more than a factor of 3 against the anchor
policy. Continuity at |lambda| = 1 holds because the bonus vanishes there.

This is a different method from the token-level coin flip (policy
'coin_mixture', a hybrid in the spirit of Xu et al. 2024), whose lam in [0, 1]
is the probability that a token is the student's.

Shapes: any leading shape [..., V]; lambda is a scalar (Python float or a
traced array, so sweeping it does not recompile).
"""
from __future__ import annotations

import math

import jax.numpy as jnp

ALPHA = 0.2
CLIP = 2 * math.log(3)
LAM_RANGE = (-2.0, 2.0)


def _scaled(coef, x):
  # coef * x with 0 * -inf = 0: a token one model rules out (-inf) must not
  # turn the other model's score into NaN when its coefficient is 0.
  return jnp.where(coef == 0, 0.0, coef * x)


def _bonus(l_anchor, r, alpha, clip):
  """M * min(max(r, 0), c): the clipped log-ratio, only on plausible tokens."""
  plausible = l_anchor >= (jnp.max(l_anchor, axis=-1, keepdims=True)
                           + math.log(alpha))
  return jnp.where(plausible, jnp.clip(r, 0.0, clip), 0.0)


def spectrum_scores(student_logprobs, teacher_logprobs, lam, *,
                    alpha: float = ALPHA, clip: float = CLIP):
  """Unnormalised log pi_lambda (the scores z above), float32 [..., V]."""
  if not 0.0 < alpha <= 1.0:
    raise ValueError(f"alpha: must be in (0, 1], got {alpha}")
  if not clip > 0:
    raise ValueError(f"clip: must be > 0, got {clip}")
  ls = jnp.asarray(student_logprobs, jnp.float32)
  lt = jnp.asarray(teacher_logprobs, jnp.float32)
  if ls.shape != lt.shape:
    raise ValueError(f"student_logprobs {ls.shape} and teacher_logprobs "
                     f"{lt.shape} must have one shape")
  lam = jnp.asarray(lam, jnp.float32)
  # r is only read where the anchor's mask holds (anchor finite), so an -inf
  # in the other model gives r = +-inf, which the clip turns into c.
  r = jnp.where(jnp.isneginf(ls) & jnp.isneginf(lt), 0.0, ls - lt)
  inside = _scaled((1 + lam) / 2, ls) + _scaled((1 - lam) / 2, lt)
  above = ls + _scaled((lam - 1) / 2, _bonus(ls, r, alpha, clip))
  below = lt + _scaled((-lam - 1) / 2, _bonus(lt, -r, alpha, clip))
  # Exactly the anchors at lambda = +-1 (inside's sum rounds otherwise).
  return jnp.where(lam == 1, ls, jnp.where(lam == -1, lt, jnp.where(
      lam > 1, above, jnp.where(lam < -1, below, inside))))


def spectrum_logprobs(student_logprobs, teacher_logprobs, lam, *,
                      alpha: float = ALPHA, clip: float = CLIP):
  """log pi_lambda over the last axis (the module docstring's formulas).

  Args:
    student_logprobs, teacher_logprobs: [..., V] log-softmaxes of the two
      models at one prefix, each at its own temperature (the caller tempers).
    lam: the paper's lambda in [-2, 2]: -1 the teacher, +1 the student.
    alpha: plausibility-mask fraction in (0, 1].
    clip: the bonus clip c > 0.

  Returns:
    float32 [..., V] log-probabilities of pi_lambda (normalised).
  """
  z = spectrum_scores(student_logprobs, teacher_logprobs, lam, alpha=alpha,
                      clip=clip)
  top = jnp.max(z, axis=-1, keepdims=True)
  return z - top - jnp.log(jnp.sum(jnp.exp(z - top), axis=-1, keepdims=True))


def check_lam(lam) -> float:
  """lambda as a float in [-2, 2], or a ValueError naming it."""
  try:
    value = float(lam)
  except (TypeError, ValueError):
    raise ValueError(f"lam: the spectrum needs a number in [-2, 2], got "
                     f"{lam!r}") from None
  if not LAM_RANGE[0] <= value <= LAM_RANGE[1]:  # NaN fails too
    raise ValueError(f"lam: the spectrum needs lam in [-2, 2] (-1 the teacher, "
                     f"+1 the student), got {lam}")
  return value
