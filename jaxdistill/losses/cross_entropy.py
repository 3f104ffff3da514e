"""Next-token cross-entropy: supervised fine-tuning on a batch's own tokens.

  nll_t = -log softmax(z_t)[y_t]   (no temperature; float32)

reduced with the same per-token weights as the divergences
(`_common.reduction_weights`), so SFT and distillation runs differ only in
the per-token term.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxdistill import choices
from jaxdistill.losses import _common as c

# The loss kind (config loss.kind) of supervised fine-tuning.
CE = choices.CE


def cross_entropy(logits, targets, mask, *, reduction="token_mean",
                  vocab_size=None):
  """Next-token cross-entropy of `targets` under `logits`.

  Args:
    logits: [B, T, V] logits (any float dtype) at the positions that predict
      `targets`.
    targets: [B, T] int target token ids (< vocab_size).
    mask: [B, T] response mask (bool, int or float token weights).
    reduction: 'token_mean' | 'sequence_mean' | 'sequence_sum' | 'sum' (see
      losses.divergence).
    vocab_size: the real vocabulary (default V): padding columns are dropped
      before the softmax.

  Returns:
    (loss, metrics): 'sft/nll', the plain mean of nll over the tokens with
    mask > 0, and 'sft/tokens', their number. Metrics carry no gradient.
  """
  c.check_float(logits, "logits", 3)
  if tuple(getattr(targets, "shape", ())) != tuple(logits.shape[:2]):
    raise ValueError(f"targets must have shape {tuple(logits.shape[:2])} "
                     f"([B, T]), got {getattr(targets, 'shape', targets)}")
  c.check_mask(mask, logits.shape[:2])
  v = c.shared_vocab(logits.shape[-1], logits.shape[-1], vocab_size,
                     "logits", "logits")
  w = c.reduction_weights(mask, reduction)
  logp = jax.nn.log_softmax(logits[..., :v].astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  loss = (nll * w).sum()
  active = mask > 0
  n = jnp.maximum(active.sum(), 1)
  tokens = active.sum().astype(jnp.float32)
  return loss, {"sft/nll": jax.lax.stop_gradient(
                    jnp.where(active, nll, 0.0).sum() / n),
                "sft/tokens": tokens}
