"""Task metrics: accuracy, coverage (pass@k, distinct answers) and forgetting.
Definitions: docs/method.md. Update sparsity is jaxdistill/sparsity.py.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

# ------------------------------------------------------------ coverage


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k = 1 - C(n-c, k) / C(n, k) for n samples, c correct.

  Computed as 1 - prod_{i=n-c+1}^{n} (1 - k / i), which never forms the
  binomials (they overflow float64 beyond n ~ 1000).
  """
  n, c, k = int(n), int(c), int(k)
  if n <= 0 or not 0 <= c <= n:
    raise ValueError(f"need n > 0 and 0 <= c <= n, got n={n}, c={c}")
  if not 1 <= k <= n:
    raise ValueError(f"k must be in [1, n={n}], got {k}")
  if n - c < k:
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def mean_pass_at_k(correct: np.ndarray, ks: Sequence[int] = (1, 4, 16)) -> dict:
  """{'pass@k': mean over problems} from a [P, n] 0/1 matrix of sample results."""
  correct = np.asarray(correct)
  if correct.ndim != 2 or correct.shape[0] == 0:
    raise ValueError(f"correct must be [problems, samples], got {correct.shape}")
  n = correct.shape[1]
  counts = (correct != 0).sum(1)
  for k in ks:
    if not 1 <= k <= n:
      raise ValueError(f"ks: k={k} needs at least k samples per problem, have {n}")
  return {f"pass@{k}": float(np.mean([pass_at_k(n, c, k) for c in counts]))
          for k in ks}


def _default_normalize(answer: str | None) -> str | None:
  if answer is None:
    return None
  key = " ".join(str(answer).split()).casefold()
  return key or None


def distinct_correct(answers: Sequence[Sequence[str | None]],
                     correct: Sequence[Sequence[bool]], *,
                     normalize: Callable[[str | None], str | None] | None = None
                     ) -> np.ndarray:
  """int64 [P]: number of distinct correct answers per problem.

  `answers[p][j]` is sample j's answer (or whole completion) and
  `correct[p][j]` its verdict. Answers are compared after `normalize`;
  the default collapses whitespace and case. For Countdown pass
  `jaxdistill.tasks.countdown.normalize_answer`, which also identifies
  equations that differ only by commutativity/associativity (3+4*5 ==
  5*4+3). A correct sample whose key is None is not counted.
  """
  normalize = normalize or _default_normalize
  if len(answers) != len(correct):
    raise ValueError(f"answers has {len(answers)} problems, correct {len(correct)}")
  out = np.zeros(len(answers), np.int64)
  for p, (ans, ok) in enumerate(zip(answers, correct)):
    if len(ans) != len(ok):
      raise ValueError(f"problem {p}: {len(ans)} answers but {len(ok)} verdicts")
    keys = {normalize(a) for a, good in zip(ans, ok) if good}
    keys.discard(None)
    out[p] = len(keys)
  return out


def accuracy(correct) -> float:
  """Mean of 0/1 verdicts (any shape)."""
  correct = np.asarray(correct)
  if correct.size == 0:
    raise ValueError("accuracy of no samples")
  return float(np.mean(correct != 0))


# ------------------------------------------------------------ forgetting


def forgetting(before: Mapping[str, float], after: Mapping[str, float]) -> dict:
  """Accuracy drop in percentage points per suite, and its mean.

  Accuracies are fractions in [0, 1]; a positive drop means forgetting.
  """
  if set(before) != set(after) or not before:
    raise ValueError(f"before/after must name the same, non-empty suites: "
                     f"{sorted(before)} vs {sorted(after)}")
  for name, table in (("before", before), ("after", after)):
    for suite, acc in table.items():
      if not 0.0 <= float(acc) <= 1.0:
        raise ValueError(f"{name}[{suite!r}] = {acc} is not a fraction in [0, 1]")
  per = {s: 100.0 * (float(before[s]) - float(after[s])) for s in sorted(before)}
  return {"per_suite": per, "mean": float(np.mean(list(per.values())))}
