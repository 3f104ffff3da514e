"""Evaluation metrics: accuracy, coverage (pass@k, distinct answers),
forgetting and update sparsity. Definitions follow shared/METHOD.md.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
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


# ------------------------------------------------------------ update sparsity

_LAYER_KEY = re.compile(r"^(?:layers?|blocks?|h)[._]?(\d+)$")


def _key_str(k) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def _layer_info(path: Sequence[str], layer_key: str):
  """(stacked, layer index or None, group name without the layer part)."""
  for i, k in enumerate(path):
    if k == layer_key:
      if i + 1 < len(path) and path[i + 1].isdigit():  # A list of layers.
        return False, int(path[i + 1]), "/".join(path[:i + 1] + path[i + 2:])
      return True, None, "/".join(path)
    m = _LAYER_KEY.match(k)
    if m:
      return False, int(m.group(1)), "/".join(path[:i] + (layer_key,) + path[i + 1:])
  return False, None, "/".join(path)


@functools.partial(jax.jit, static_argnames=("dtype", "atol", "axis"))
def _row_counts(a, b, *, dtype, atol, axis):
  """int32 [rows] counts of |a - b| <= atol and of a == b, per index of `axis`.

  Both operands are first rounded to `dtype`, then widened exactly to float32
  so the difference itself is not rounded to a coarse (bf16) grid.
  """
  a, b = a.astype(dtype), b.astype(dtype)
  if a.ndim == 0:
    a, b = a[None], b[None]
  else:
    a, b = jnp.moveaxis(a, axis, 0), jnp.moveaxis(b, axis, 0)
  red = tuple(range(1, a.ndim))
  exact = jnp.sum(a == b, axis=red, dtype=jnp.int32)
  if jnp.issubdtype(a.dtype, jnp.floating):
    close = jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)) <= atol
  else:
    close = a == b
  return jnp.sum(close, axis=red, dtype=jnp.int32), exact


def _summary(total, close, exact) -> dict:
  return {"num_params": int(total), "sparsity": close / total if total else 0.0,
          "exact_sparsity": exact / total if total else 0.0}


def update_sparsity(params0, params1, *, atol: float = 1e-5, dtype=None,
                    tied: bool = False, layer_key: str = "layers",
                    layer_axis: int = 0) -> dict:
  """Fraction of parameter entries left unchanged by training.

  An entry counts as unchanged when |theta1 - theta0| <= atol after both are
  rounded to the storage dtype (`dtype`, or else each leaf's dtype in
  `params0`, i.e. the checkpoint's); `exact_sparsity` counts bit-equal
  entries. Reported whole-model, per layer and per parameter group.

  Layers are found in two layouts: leaves under a `layer_key` entry are
  STACKED along `layer_axis` ([L, ...], one count per index), while keys like
  'layers_3' / 'layer.3' or a numeric key after `layer_key` name one layer.
  Other leaves (embeddings, final norm) only enter the whole-model and
  per-group figures. Tied embeddings count once: a tied model has no lm_head
  leaf; `tied=True` drops one that a conversion duplicated.

  Leaves are reduced one at a time by a jitted counter on their own devices
  (sharded leaves stay sharded), so peak memory is one leaf's temporaries.
  """
  flat0 = jax.tree_util.tree_flatten_with_path(params0)[0]
  flat1, def1 = jax.tree_util.tree_flatten_with_path(params1)
  def0 = jax.tree_util.tree_structure(params0)
  if def0 != def1:
    raise ValueError("params0 and params1 have different tree structures")
  if not flat0:
    raise ValueError("params0 has no leaves")
  if not atol >= 0:
    raise ValueError(f"atol must be >= 0, got {atol}")
  total = close = exact = 0
  per_layer: dict[int, list[int]] = {}
  per_group: dict[str, list[int]] = {}
  dtypes = set()
  for (path, a), (_, b) in zip(flat0, flat1):
    names = tuple(_key_str(k) for k in path)
    if tied and "lm_head" in names:
      continue
    if a.shape != b.shape:
      raise ValueError(f"{'/'.join(names)}: shape {a.shape} vs {b.shape}")
    leaf_dtype = jnp.dtype(dtype if dtype is not None else a.dtype)
    dtypes.add(leaf_dtype.name)
    stacked, layer, group = _layer_info(names, layer_key)
    axis = layer_axis if stacked else 0
    if stacked and not -a.ndim <= layer_axis < a.ndim:
      raise ValueError(f"{'/'.join(names)}: no layer axis {layer_axis} in {a.shape}")
    c_rows, e_rows = jax.device_get(
        _row_counts(a, b, dtype=leaf_dtype, atol=float(atol), axis=axis))
    c_rows, e_rows = c_rows.astype(np.int64), e_rows.astype(np.int64)
    per_row = int(np.prod(a.shape)) // max(len(c_rows), 1)
    n, c, e = int(np.prod(a.shape)), int(c_rows.sum()), int(e_rows.sum())
    total, close, exact = total + n, close + c, exact + e
    g = per_group.setdefault(group, [0, 0, 0])
    g[0], g[1], g[2] = g[0] + n, g[1] + c, g[2] + e
    if stacked:
      for i in range(len(c_rows)):
        l = per_layer.setdefault(i, [0, 0, 0])
        l[0], l[1], l[2] = l[0] + per_row, l[1] + int(c_rows[i]), l[2] + int(e_rows[i])
    elif layer is not None:
      l = per_layer.setdefault(layer, [0, 0, 0])
      l[0], l[1], l[2] = l[0] + n, l[1] + c, l[2] + e
  out = {"atol": float(atol),
         "dtype": dtypes.pop() if len(dtypes) == 1 else ",".join(sorted(dtypes)),
         **_summary(total, close, exact)}
  out["per_layer"] = {i: _summary(*per_layer[i]) for i in sorted(per_layer)}
  out["per_group"] = {k: _summary(*per_group[k]) for k in sorted(per_group)}
  return out
