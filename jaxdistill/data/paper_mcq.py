"""The paper's science and medical sets (App. D.1), drawn from their hub files.

  NAME         repo                    pool                            draw (seed 42)
  sciknoweval  hicai-zju/SciKnowEval   Chemistry, level L3,            test 507, train 2,674
               (@3284f6fb)             type mcq-4-choices, deduplicated
  medreason    UCSC-VLAA/MedReason     every row with options and an   test 500, train 5,000
                                       answer naming one of them

`python -m jaxdistill.data.prepare NAME` reads every hub file matching the
set's patterns (builders.HUB_DATASETS), keeps the pool's rows (converted by
sources.SOURCES[NAME], which also grades a file of such rows given by
path), orders them by `row_id` (so neither file order nor a repeated row
moves the draw), and takes a permutation of them with
`numpy.random.default_rng(seed).permutation`: its first `test` rows are the
test split, the next `train` rows the train split. A pool smaller than
test + train gives the train split what is left after the test split; the
record says so (`short`).

How close this is to the paper (choices of ours, docs/evaluation.md):
- SciKnowEval: the paper's fixed splits (2,674 train with worked traces
  ending in <answer>X</answer>, 507 eval) have the counts of the hub set
  gray311/PromptSD, config science (train 2,474 + validation 200, test
  507; four-option molecular-property questions, traces in <reasoning>
  tags, each question inside a free-text prompt). We take the two to share
  a source, most likely the Chemistry L3 Science data of the
  self-distillation fine-tuning study (github.com/idanshen/
  Self-Distillation, data/science_data, built from hicai-zju/SciKnowEval
  at commit 3284f6fb, Chemistry config; not on the hub); neither says how
  its split was drawn, and this is an inference from the counts. We read
  hicai-zju/SciKnowEval at that commit (builders.SCIKNOWEVAL_COMMIT), keep
  its Chemistry L3 four-option questions and draw the two splits with the
  paper's data seed, 42: the paper's counts when the pool holds at least
  3,181 questions, from what is most likely the same population, but not
  its exact test questions. The worked traces are left out: the train split
  carries no reference response (SFT targets fall back to the answer letter
  in <answer>, tasks.reference_response).
- MedReason: the paper draws pools of 5,000 / 500 "from the prepared source
  partition" (seed unstated) and then keeps the questions its GPT-5
  demonstrations solved (4,748 / 471); we draw the pools only, with seed 42,
  and keep no demonstrations (MedReason's own `reasoning` field is not the
  paper's and is not used).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import numpy as np

from jaxdistill.data import sources


@dataclasses.dataclass(frozen=True)
class PaperSet:
  counts: tuple[tuple[str, int], ...]  # (split, size), drawn in this order
  seed: int
  select: dict                         # row field path -> value kept
  rule: str                            # the pool, in words (for the record)


SETS = {
    "sciknoweval": PaperSet(
        counts=(("test", 507), ("train", 2674)), seed=42,
        select={"domain": "Chemistry", "details.level": "L3"},
        rule="domain Chemistry, details.level L3, type mcq-4-choices, "
             "choices labelled A-D over four texts; one row per question "
             "and options"),
    "medreason": PaperSet(
        counts=(("test", 500), ("train", 5000)), seed=42, select={},
        rule="options parse as A, B, ... and the answer names exactly one "
             "option (data.sources, 'medreason'); one row per question and "
             "options"),
}


def _field(row: dict, path: str):
  for key in path.split("."):
    row = row.get(key) if isinstance(row, dict) else None
  return row


def row_id(record: dict) -> str:
  """A converted record's identity: its question and options, case and
  spacing aside (sha256 hex)."""
  text = "\0".join(" ".join(str(x).casefold().split())
                   for x in [record["question"], *record["options"]])
  return hashlib.sha256(text.encode()).hexdigest()


def pool(name: str, paths: list[str]) -> tuple[list[tuple[str, dict, dict]], dict]:
  """The set's pool from its hub files: [(row_id, raw row, record)] sorted
  by row_id, and the rows left out by reason. A row that cannot be read at
  all is a sources.DataError naming its file and line."""
  spec = SETS[name]
  convert = sources.SOURCES[name]
  kept: dict[str, tuple[dict, dict]] = {}
  left = {"not_selected": 0, "not_mcq": 0, "duplicate": 0}
  for path in paths:
    for where, row in sources.read_rows(path):
      if any(_field(row, k) != v for k, v in spec.select.items()):
        left["not_selected"] += 1
        continue
      try:
        parts = convert(row, 0, {})
        record = None if parts is None else sources.validate_record(*parts)
      except (ValueError, TypeError, KeyError) as e:
        raise sources.DataError(f"{where}: {e}") from None
      if record is None:
        left["not_mcq"] += 1
        continue
      key = row_id(record)
      if key in kept:
        left["duplicate"] += 1
        continue
      kept[key] = (row, record)
  return [(k, *kept[k]) for k in sorted(kept)], left


def draw(n: int, counts, seed: int) -> dict[str, np.ndarray]:
  """Indices into a pool of n rows: {split: indices}, consecutive slices of
  one seeded permutation in the order of `counts`; the last split gets
  what is left when the pool is short. ValueError if a split gets none."""
  perm = np.random.default_rng(seed).permutation(n)
  out, start = {}, 0
  for split, size in counts:
    out[split] = perm[start:start + size]
    start += size
    if not len(out[split]):
      raise ValueError(f"the pool holds {n} rows: too few for the "
                       f"{split} split ({dict(counts)})")
  return out


def draw_spec(name: str) -> dict:
  """What decides set `name`'s draw from given files (kept in its record)."""
  spec = SETS[name]
  return {"seed": spec.seed, "counts": dict(spec.counts), "rule": spec.rule}


def draw_spec_of(record: dict) -> dict:
  draw = record.get("draw") if isinstance(record.get("draw"), dict) else {}
  return {k: draw.get(k) for k in ("seed", "counts", "rule")}


def same_draw(name: str, record: dict) -> bool:
  """A prepared record was drawn as set `name` is drawn now."""
  return draw_spec_of(record) == draw_spec(name)


def write_splits(name: str, paths: list[str], out: str) -> dict:
  """Writes the drawn raw rows of set `name` as OUT/{split}.jsonl (what the
  mcq_files builder's config NAME converts); returns what the data set's
  record says of the draw."""
  spec = SETS[name]
  rows, left = pool(name, paths)
  if not rows:
    raise ValueError(f"{name}: no row of its files is in the pool "
                     f"({spec.rule}); left out: {left}")
  picked = draw(len(rows), spec.counts, spec.seed)
  os.makedirs(out, exist_ok=True)
  for split, idx in picked.items():
    with open(os.path.join(out, f"{split}.jsonl"), "w", encoding="utf-8") as f:
      for i in idx:
        f.write(json.dumps(rows[i][1], ensure_ascii=False, default=str) + "\n")
  want = sum(size for _, size in spec.counts)
  return {**draw_spec(name), "pool": len(rows), "left_out": left,
          "method": "rows sorted by row_id (sha256 of question and options); "
                    "numpy.random.default_rng(seed).permutation; slices in "
                    "the order of counts",
          "short": len(rows) < want,
          "ids": {s: [rows[i][0] for i in idx] for s, idx in picked.items()}}
