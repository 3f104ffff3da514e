r"""The paper's Numina-MATH training set and MATH-500 (App. A.3), from their hub files.

  NAME         sources                                   split
  numina_math  EleutherAI/hendrycks_math (MATH train,    train 20,000: every MATH
               and test for the exclusion) +             train problem, the rest
               AI-MO/NuminaMath-CoT (source              synthetic_math drawn with
               'synthetic_math')                         seed 42
  math500      HuggingFaceH4/MATH-500                    test 500

The MATH copy is ours to choose (the paper cites Hendrycks et al. only):
EleutherAI/hendrycks_math, one config per subject, files
`<subject>/{train,test}-*.parquet` with `problem`, `level`, `type`,
`solution`; it holds the original 7,500 / 5,000 problems. Revisions are not
pinned (we could not check commits offline): the record of each prepare
names the commits read.

The rule, as App. A.3 gives it (the order of the filters is ours):
- a problem's key is its text lowercased with runs of whitespace made one
  space (`norm`);
- MATH train rows are kept unless their key repeats an earlier one (the
  paper's count, 7,498 of the 7,500, fits two repeats) or their solution
  has no usable last \boxed{} (none is expected; counted if any);
- NuminaMath-CoT rows are kept when `source` is synthetic_math, problem and
  solution are non-empty, the solution's last \boxed{} is balanced and
  non-empty (tasks.math_answer.last_boxed), the key is in neither MATH
  train nor MATH test (the whole test split: MATH-500 is part of it), the
  key is new (rows sorted by key digest, then solution, first kept) and
  the solution is at most 384 tokens of the DeepSeek-R1-Distill-Llama-8B
  tokenizer (no special tokens);
- the train split is every kept MATH row (sorted by key digest) followed by
  20,000 - that many synthetic rows: the first of
  numpy.random.default_rng(42).permutation over the kept synthetic rows
  sorted by key digest.

Each record is {'problem', 'solution', 'answer' (the solution's last box,
or MATH-500's `answer`), 'origin'}; tasks.MATH scores against 'answer'.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Sequence

import numpy as np

from jaxdistill.data import sources
from jaxdistill.tasks import math_answer


@dataclasses.dataclass(frozen=True)
class Source:
  repo: str
  files: tuple[str, ...]


MATH = Source("EleutherAI/hendrycks_math", ("*/train-*.parquet",
                                            "*/test-*.parquet"))
NUMINA = Source("AI-MO/NuminaMath-CoT", ("data/train-*.parquet",))
MATH500 = Source("HuggingFaceH4/MATH-500", ("test.jsonl",))
TOKENIZER = "deepseek-ai/DeepSeek-R1-Distill-Llama-8B"
TOTAL, SEED, MAX_SOLUTION_TOKENS = 20_000, 42, 384
SYNTHETIC = "synthetic_math"


def norm(text: str) -> str:
  """A problem's key: lowercased, whitespace runs collapsed, ends stripped."""
  return " ".join(str(text).lower().split())


def _digest(key: str) -> str:
  return hashlib.sha256(key.encode()).hexdigest()


def _rows(paths: Sequence[str]):
  for path in paths:
    yield from sources.read_rows(path)


def _text(row, field) -> str:
  v = row.get(field)
  return "" if v is None else str(v)


def math_split(paths: Sequence[str]) -> tuple[list[dict], dict]:
  """MATH rows of `paths` as records sorted by key digest, and the rows
  left out by reason."""
  kept: dict[str, dict] = {}
  left = collections.Counter()
  for _, row in _rows(paths):
    problem, solution = _text(row, "problem"), _text(row, "solution")
    answer = math_answer.last_boxed(solution)
    key = norm(problem)
    if not key or answer is None:
      left["no_boxed_answer" if key else "empty_problem"] += 1
      continue
    if key in kept:
      left["duplicate"] += 1
      continue
    kept[key] = {"problem": problem, "solution": solution, "answer": answer,
                 "origin": "math"}
  order = sorted(kept, key=_digest)
  return [kept[k] for k in order], dict(left)


def synthetic_pool(paths: Sequence[str], exclude: set[str],
                   count_tokens: Callable[[list[str]], list[int]],
                   max_tokens: int) -> tuple[list[dict], dict]:
  """Kept synthetic_math rows of NuminaMath-CoT `paths`, sorted by key
  digest, and the rows left out by reason (see the module docstring)."""
  left = collections.Counter()
  found = []
  for _, row in _rows(paths):
    if _text(row, "source") != SYNTHETIC:
      left["not_synthetic_math"] += 1
      continue
    problem, solution = _text(row, "problem"), _text(row, "solution")
    key = norm(problem)
    if not key:
      left["empty_problem"] += 1
    elif not solution.strip():
      left["empty_solution"] += 1
    elif (answer := math_answer.last_boxed(solution)) is None:
      left["no_boxed_answer"] += 1
    elif key in exclude:
      left["in_math"] += 1
    else:
      found.append((_digest(key), solution, key, problem, answer))
  found.sort()
  unique, seen = [], set()
  for item in found:
    if item[2] in seen:
      left["duplicate"] += 1
      continue
    seen.add(item[2])
    unique.append(item)
  lengths = count_tokens([u[1] for u in unique]) if unique else []
  pool = []
  for (_, solution, _, problem, answer), n in zip(unique, lengths):
    if n > max_tokens:
      left["too_long"] += 1
      continue
    pool.append({"problem": problem, "solution": solution, "answer": answer,
                 "origin": SYNTHETIC})
  return pool, dict(left)


def train_split(math_train: Sequence[str], math_test: Sequence[str],
                numina: Sequence[str],
                count_tokens: Callable[[list[str]], list[int]], *,
                total: int = TOTAL, seed: int = SEED,
                max_tokens: int = MAX_SOLUTION_TOKENS) -> tuple[list[dict], dict]:
  """The 20,000-example training split and its account (counts, rows left
  out by reason, the draw); ValueError when the pool is too small."""
  train, left_train = math_split(math_train)
  test_keys = {norm(r.get("problem", "")) for _, r in _rows(math_test)}
  exclude = {norm(r["problem"]) for r in train} | test_keys
  pool, left_syn = synthetic_pool(numina, exclude, count_tokens, max_tokens)
  want = total - len(train)
  if want < 0 or want > len(pool):
    raise ValueError(f"numina_math: {len(train)} MATH train problems and "
                     f"{len(pool)} usable synthetic_math ones cannot make "
                     f"{total} examples")
  pick = np.random.default_rng(seed).permutation(len(pool))[:want]
  records = train + [pool[i] for i in pick]
  account = {"math_train": len(train), "math_test_keys": len(test_keys),
             "synthetic_pool": len(pool), "synthetic": want,
             "left_out": {"math_train": left_train,
                          "numina": left_syn},
             "draw": {"seed": seed, "total": total, "max_solution_tokens":
                      max_tokens, "rule": "permutation of the pool sorted "
                      "by sha256 of the normalised problem"}}
  return records, account


def math500_split(paths: Sequence[str]) -> tuple[list[dict], dict]:
  """MATH-500's rows as records (its own `answer` field), file order."""
  out, left = [], collections.Counter()
  for _, row in _rows(paths):
    problem, answer = _text(row, "problem"), _text(row, "answer").strip()
    if not problem.strip() or not answer:
      left["empty_problem_or_answer"] += 1
      continue
    out.append({"problem": problem, "solution": _text(row, "solution"),
                "answer": answer, "origin": "math500"})
  return out, dict(left)


def files_dir(data_dir: str, name: str) -> str:
  """Where prepared numina_math / math500 records lie (SPLIT.jsonl)."""
  return os.path.join(os.path.expanduser(data_dir), "math_files", name)


FIELDS = ("problem", "solution", "answer", "origin")


def write_jsonl(records: Sequence[dict], path: str) -> None:
  with open(path, "w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps({k: r[k] for k in FIELDS}, ensure_ascii=False) + "\n")


def read_jsonl(path: str) -> list[dict]:
  """Records as `write_jsonl` left them; ValueError naming the line if one
  lacks a field."""
  out = []
  for where, row in sources.read_rows(path):
    if not all(isinstance(row.get(k), str) for k in FIELDS):
      raise ValueError(f"{where}: a math record needs string fields "
                       f"{', '.join(FIELDS)}")
    out.append(row)
  return out
