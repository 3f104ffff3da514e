"""The reduction weights every loss (and the training step) shares."""
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdistill import losses


def _mask(seed=0, b=4, l=12):
  rs = np.random.default_rng(seed)
  start = rs.integers(0, l // 2, size=b)
  n = rs.integers(0, l // 2, size=b)
  pos = np.arange(l)[None]
  m = ((pos >= start[:, None]) & (pos < (start + n)[:, None])).astype(np.float64)
  m[1] = 0  # a row without response tokens is not counted
  return m


@pytest.mark.parametrize("reduction",
                         ["token_mean", "sequence_mean", "sequence_sum", "sum"])
def test_reduction_weights_match_numpy(reduction):
  m = _mask()
  w = np.asarray(losses.reduction_weights(jnp.asarray(m, jnp.int32), reduction))
  if reduction == "sum":
    want = m
  elif reduction == "sequence_sum":  # sum within each row, mean over rows
    want = m / (m.sum(1) > 0).sum()
  elif reduction == "token_mean":
    want = m / m.sum()
  else:
    per = m.sum(1, keepdims=True)
    rows = (per[:, 0] > 0).sum()
    want = np.where(per > 0, m / np.maximum(per, 1), 0) / rows
  assert w.dtype == np.float32
  np.testing.assert_allclose(w, want, rtol=1e-6)
  # An empty mask gives zero weights, not NaN.
  np.testing.assert_array_equal(
      losses.reduction_weights(jnp.zeros((2, 3), jnp.int32), reduction), 0.0)


def test_unknown_reduction_names_the_argument():
  with pytest.raises(ValueError, match="reduction"):
    losses.reduction_weights(jnp.ones((2, 3)), "mean")
