"""Supervised cross-entropy vs a NumPy float64 formula."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdistill import losses


def _numpy_nll(logits, targets, v):
  z = np.asarray(logits, np.float64)[..., :v]
  logp = z - z.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  return -np.take_along_axis(logp, targets[..., None], -1)[..., 0]


def test_weighted_sum_and_metrics_match_numpy():
  rs = np.random.default_rng(1)
  logits = rs.normal(size=(2, 5, 11)) * 3  # two padding columns
  targets = rs.integers(0, 9, size=(2, 5))
  w = (rs.random((2, 5)) > 0.3) / 7.0  # token weights, as the training step's
  loss, m = losses.cross_entropy(
      jnp.asarray(logits, jnp.float32), jnp.asarray(targets),
      jnp.asarray(w, jnp.float32), reduction="sum", vocab_size=9)
  nll = _numpy_nll(logits, targets, 9)
  np.testing.assert_allclose(loss, (nll * w).sum(), rtol=1e-5)
  np.testing.assert_allclose(m["sft/nll"], nll[w > 0].mean(), rtol=1e-5)
  assert float(m["sft/tokens"]) == (w > 0).sum()


def test_token_mean_and_gradient_match_numpy():
  rs = np.random.default_rng(2)
  logits = rs.normal(size=(3, 4, 7)) * 2
  targets = rs.integers(0, 7, size=(3, 4))
  mask = rs.random((3, 4)) > 0.4
  g = jax.grad(lambda x: losses.cross_entropy(
      x, jnp.asarray(targets), jnp.asarray(mask))[0])(
          jnp.asarray(logits, jnp.float32))
  nll = _numpy_nll(logits, targets, 7)
  z = logits - logits.max(-1, keepdims=True)
  q = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
  want = (q - np.eye(7)[targets]) * mask[..., None] / mask.sum()
  np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-7)
  loss, _ = losses.cross_entropy(jnp.asarray(logits, jnp.float32),
                                 jnp.asarray(targets), jnp.asarray(mask))
  np.testing.assert_allclose(loss, nll[mask].mean(), rtol=1e-5)


def test_errors_name_the_argument():
  x = jnp.zeros((2, 3, 5))
  with pytest.raises(ValueError, match="targets"):
    losses.cross_entropy(x, jnp.zeros((2, 4), jnp.int32), jnp.ones((2, 3)))
  with pytest.raises(ValueError, match="mask"):
    losses.cross_entropy(x, jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 4)))
  with pytest.raises(ValueError, match="reduction"):
    losses.cross_entropy(x, jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 3)),
                         reduction="mean")
