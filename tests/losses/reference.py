"""Float64 NumPy references for the loss tests (independent of jaxdistill)."""
import numpy as np


def log_softmax(x):
  x = np.asarray(x, np.float64)
  m = np.max(x, axis=-1, keepdims=True)
  m = np.where(np.isfinite(m), m, 0.0)
  with np.errstate(divide="ignore"):
    return x - m - np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))


def _kl(a, log_a, log_b):
  """sum_v a (log a - log b) over entries with a > 0."""
  with np.errstate(invalid="ignore"):
    return np.sum(np.where(a > 0, a * (log_a - log_b), 0.0), axis=-1)


def divergences(z, u, tau=1.0, beta=0.5, tau_t=None):
  """Per-position FKL, RKL and scaled JSD(beta) of teacher u vs student z
  (student at tau, teacher at tau_t, default tau)."""
  tau_t = tau if tau_t is None else tau_t
  logq, logp = log_softmax(np.asarray(z, np.float64) / tau), log_softmax(
      np.asarray(u, np.float64) / tau_t)
  q, p = np.exp(logq), np.exp(logp)
  fkl, rkl = _kl(p, logp, logq), _kl(q, logq, logp)
  if beta in (0.0, 1.0):
    jsd = fkl if beta == 0.0 else rkl
  else:
    m = beta * p + (1 - beta) * q
    with np.errstate(divide="ignore"):
      logm = np.log(m)
    jsd = (beta * _kl(p, logp, logm) + (1 - beta) * _kl(q, logq, logm)) / (
        beta * (1 - beta))
  return {"forward": fkl, "reverse": rkl, "jsd": jsd, "p": p, "q": q,
          "logp": logp, "logq": logq}


def weights(mask, reduction):
  """Per-token reduction weights [B, T] in float64."""
  w = np.asarray(mask, np.float64)
  if reduction == "sum":
    return w
  if reduction == "sequence_sum":  # per-sequence sums, mean over sequences
    n_seq = (w.sum(-1) > 0).sum()
    return w / n_seq if n_seq else w * 0
  if reduction == "token_mean":
    return w / w.sum() if w.sum() > 0 else w * 0
  per_seq = w.sum(-1, keepdims=True)
  n_seq = (per_seq > 0).sum()
  out = np.where(per_seq > 0, w / np.where(per_seq > 0, per_seq, 1), 0)
  return out / n_seq if n_seq else out


def grad_closed_form(z, u, mask, kind, reduction, tau=1.0, tau_t=None):
  """d loss / d z from the closed forms: (q - p)/tau, q (log q - log p - RKL)/tau
  (tau the student's; the teacher at tau_t, default tau)."""
  d = divergences(z, u, tau, tau_t=tau_t)
  q, p = d["q"], d["p"]
  if kind == "forward":
    g = (q - p) / tau
  else:
    with np.errstate(invalid="ignore"):
      diff = np.where(q > 0, d["logq"] - d["logp"], 0.0)
    g = q * (diff - d["reverse"][..., None]) / tau
  return weights(mask, reduction)[..., None] * g
