"""Bad arguments raise a ValueError that names the argument."""
import numpy as np
import pytest

from jaxdistill import losses

Z = np.zeros((2, 3, 5), np.float32)
M = np.ones((2, 3), bool)
H = np.zeros((2, 3, 4), np.float32)
W = np.zeros((4, 5), np.float32)


@pytest.mark.parametrize("kwargs,name", [
    ({"kind": "kl"}, "kind"),
    ({"kind": "jsd", "beta": 1.5}, "beta"),
    ({"kind": "jsd", "beta": -0.1}, "beta"),
    ({"beta": float("nan")}, "beta"),
    ({"beta": True}, "beta"),
    ({"temperature": 0.0}, "temperature"),
    ({"temperature": -1.0}, "temperature"),
    ({"temperature": float("inf")}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"reduction": "mean"}, "reduction"),
    ({"vocab_size": 6}, "vocab_size"),
    ({"vocab_size": 0}, "vocab_size"),
    ({"vocab_size": 4.5}, "vocab_size"),
])
def test_divergence_keyword_errors(kwargs, name):
  with pytest.raises(ValueError, match=name):
    losses.divergence(Z, Z, M, **kwargs)


def test_divergence_shape_errors():
  with pytest.raises(ValueError, match="teacher_logits"):
    losses.divergence(Z, np.zeros((2, 4, 5), np.float32), M)
  with pytest.raises(ValueError, match="mask"):
    losses.divergence(Z, Z, np.ones((2, 4), bool))
  with pytest.raises(ValueError, match="student_logits"):
    losses.divergence(Z[0], Z, M)
  with pytest.raises(ValueError, match="student_logits"):
    losses.divergence(Z.astype(np.int32), Z, M)
  # Different widths are padding only if the caller says so.
  with pytest.raises(ValueError, match="vocab_size"):
    losses.forward_kl(Z, np.zeros((2, 3, 7), np.float32), M)
  with pytest.raises(ValueError, match="vocab_size"):
    losses.reverse_kl(Z, np.zeros((2, 3, 7), np.float32), M, vocab_size=6)
  with pytest.raises(ValueError, match="beta"):
    losses.jsd(Z, Z, M, beta=2.0)
  with pytest.raises(ValueError, match="kind"):
    losses.token_divergence(Z, Z, M, kind="backward")


def test_sampled_errors():
  lp = np.zeros((2, 3), np.float32)
  with pytest.raises(ValueError, match="estimator"):
    losses.sampled_kl(lp, lp, M, estimator="k4")
  with pytest.raises(ValueError, match="reduction"):
    losses.sampled_kl(lp, lp, M, reduction="avg")
  with pytest.raises(ValueError, match="teacher_logprobs"):
    losses.sampled_kl(lp, np.zeros((2, 4), np.float32), M)
  with pytest.raises(ValueError, match="mask"):
    losses.sampled_kl(lp, lp, M[:1])
  with pytest.raises(ValueError, match="importance_weight"):
    losses.sampled_kl(lp, lp, M, importance_weight=np.ones((3, 2), np.float32))
  with pytest.raises(ValueError, match="student_logprobs"):
    losses.sampled_kl(Z, lp, M)


def test_fused_errors():
  with pytest.raises(ValueError, match="student_head"):
    losses.fused_divergence(H, np.zeros((5, 5), np.float32), H, W, M)
  with pytest.raises(ValueError, match="teacher_head"):
    losses.fused_divergence(H, W, H, np.zeros((3, 5), np.float32), M)
  with pytest.raises(ValueError, match="teacher_hidden"):
    losses.fused_divergence(H, W, H[:1], W, M)
  with pytest.raises(ValueError, match="vocab_size"):
    losses.fused_divergence(H, W, H, np.zeros((4, 6), np.float32), M)
  with pytest.raises(ValueError, match="chunk_size"):
    losses.fused_divergence(H, W, H, W, M, chunk_size=0)
  with pytest.raises(ValueError, match="kind"):
    losses.fused_divergence(H, W, H, W, M, kind="both")
  with pytest.raises(ValueError, match="mask"):
    losses.fused_divergence(H, W, H, W, M.T)
  with pytest.raises(ValueError, match="temperature"):
    losses.fused_divergence(H, W, H, W, M, temperature=0)
