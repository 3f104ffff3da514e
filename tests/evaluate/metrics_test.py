"""Metrics against brute force and NumPy counts (update sparsity:
tests/sparsity_test.py)."""
from fractions import Fraction
import itertools
import math

import numpy as np
import pytest

from jaxdistill.evaluate import metrics
from jaxdistill.tasks import countdown


def brute_pass_at_k(n, c, k):
  """Fraction of k-subsets of n samples (c of them correct) with a correct one."""
  samples = [True] * c + [False] * (n - c)
  subsets = list(itertools.combinations(range(n), k))
  return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_equals_subset_enumeration():
  for n in range(1, 9):
    for c in range(n + 1):
      for k in range(1, n + 1):
        assert metrics.pass_at_k(n, c, k) == pytest.approx(
            brute_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_is_stable_for_large_n():
  for n, c, k in [(2000, 10, 16), (5000, 1, 1), (1200, 600, 4)]:
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert metrics.pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)


def test_mean_pass_at_k():
  rng = np.random.default_rng(0)
  correct = rng.random((7, 16)) < 0.3
  out = metrics.mean_pass_at_k(correct, ks=(1, 4, 16))
  for k in (1, 4, 16):
    want = np.mean([float(1 - Fraction(math.comb(16 - int(r.sum()), k),
                                       math.comb(16, k))) for r in correct])
    assert out[f"pass@{k}"] == pytest.approx(want, abs=1e-12)
  assert out["pass@1"] == pytest.approx(correct.mean())
  with pytest.raises(ValueError, match="k=32"):
    metrics.mean_pass_at_k(correct, ks=(32,))
  with pytest.raises(ValueError):
    metrics.pass_at_k(4, 5, 1)


def test_distinct_correct_and_accuracy():
  a = "<answer>{}</answer>"
  answers = [[a.format("3+4*5"), a.format("5*4+3"), a.format("(3+4)*5"),
              a.format("4*5+3"), a.format("3*5+4")],
             [a.format("1+1"), "junk", a.format("2")]]
  correct = [[True, True, True, True, False], [False, False, False]]
  got = metrics.distinct_correct(answers, correct,
                                 normalize=countdown.normalize_answer)
  np.testing.assert_array_equal(got, [2, 0])  # 3+4*5 three ways, and (3+4)*5.
  plain = metrics.distinct_correct([["A", " a ", "B"]], [[True, True, True]])
  np.testing.assert_array_equal(plain, [2])
  assert metrics.accuracy([[1, 0], [1, 1]]) == 0.75
  with pytest.raises(ValueError):
    metrics.distinct_correct([["a"]], [[True, False]])


def test_forgetting():
  out = metrics.forgetting({"mmlu": 0.60, "gsm8k": 0.50},
                           {"mmlu": 0.55, "gsm8k": 0.52})
  assert out["per_suite"] == pytest.approx({"mmlu": 5.0, "gsm8k": -2.0})
  assert out["mean"] == pytest.approx(1.5)
  with pytest.raises(ValueError, match="same"):
    metrics.forgetting({"a": 0.5}, {"b": 0.5})
  with pytest.raises(ValueError, match="fraction"):
    metrics.forgetting({"a": 50.0}, {"a": 0.5})
