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
  ending in <answer>X</answer>, 507 eval) are those of the self-
  distillation fine-tuning study's release (github.com/idanshen/
  Self-Distillation at d77573212fa0, data/science_data: 2,674 train
  prompts with GPT-4o demonstrations in <reasoning>/<answer> tags, 507 eval
  prompts with gold letters; Chemistry L3 four-option questions of
  hicai-zju/SciKnowEval at commit 3284f6fb, its Chemistry config), by
  their counts and make-up as public descriptions of it give them. It is
  not on the Hugging Face hub (gray311/PromptSD re-releases it there, its
  train cut into 2,474 + 200, each question inside a free-text prompt).
  By default we read hicai-zju/SciKnowEval at that commit
  (builders.SCIKNOWEVAL_COMMIT), keep its Chemistry L3 four-option
  questions and draw the two splits with the paper's data seed, 42: the
  paper's counts when the pool holds at least 3,181 questions, from the
  same population, but not its exact test questions (the release's split
  rule is not published). With `--split_dir` (a checkout's
  data/science_data) the splits are the release's own, matched question by
  question to the hub rows (match_release), in the release's order, and
  each train record carries the release's worked trace as its `response`
  (the target of SFT and of rollout.policy='dataset', verbatim: in the
  release's <reasoning>/<answer> tags, not Table 1's <think>). Without it
  the train split carries no trace (targets fall back to the answer letter
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
import re

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


def draw_spec(name: str, split_dir: str | None = None) -> dict:
  """What decides set `name`'s splits from given files (kept in its
  record): the seeded draw, or (`split_dir`) a release's own splits."""
  spec = SETS[name]
  if split_dir:
    return {"split_from": RELEASE, "rule": spec.rule}
  return {"split_from": "seed", "seed": spec.seed, "counts": dict(spec.counts),
          "rule": spec.rule}


def same_draw(name: str, record: dict, split_dir: str | None = None) -> bool:
  """A prepared record's splits were made as they would be now."""
  draw_ = record.get("draw") if isinstance(record.get("draw"), dict) else {}
  spec = draw_spec(name, split_dir)
  return {k: draw_.get(k) for k in spec} == spec


# -- the splits of the paper's Science source --------------------------------
# The self-distillation fine-tuning release (github.com/idanshen/
# Self-Distillation at d77573212fa0, data/science_data) holds the paper's
# Science splits: train_data/ (2,674 prompts, their GPT-4o demonstrations)
# and eval_data/ (507 prompts and gold letters), `datasets` save_to_disk
# directories of Arrow files. Each prompt's user turn holds a SciKnowEval
# question and its options; `--split_dir` matches them to the hub rows.
RELEASE = "idanshen/Self-Distillation data/science_data"
RELEASE_SPLITS = (("test", "eval_data"), ("train", "train_data"))
_ANSWER_TAG = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.S | re.I)


def _norm(text) -> str:
  return " ".join(str(text).casefold().split())


def _read_arrow(path: str) -> list[dict]:
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  try:
    with pa.memory_map(path) as source:
      try:
        return pa.ipc.open_stream(source).read_all().to_pylist()
      except pa.ArrowInvalid:
        source.seek(0)
        return pa.ipc.open_file(source).read_all().to_pylist()
  except (OSError, pa.ArrowInvalid) as e:
    raise ValueError(f"{path}: not an Arrow file ({e})") from None


def _user_turn(row: dict, where: str) -> str:
  for key in ("messages", "prompt"):
    turns = row.get(key)
    if isinstance(turns, str):
      return turns
    if isinstance(turns, list):
      users = [t.get("content") for t in turns
               if isinstance(t, dict) and t.get("role") == "user"]
      if users and isinstance(users[-1], str):
        return users[-1]
  raise ValueError(f"{where}: no 'messages' / 'prompt' with a user turn")


def _gold(row: dict, where: str) -> str:
  answer = row.get("answer")
  if not isinstance(answer, str) or not answer.strip():
    tags = _ANSWER_TAG.findall(str(row.get("output_text") or ""))
    answer = tags[-1] if tags else ""
  answer = answer.strip().upper()
  if len(answer) != 1 or answer not in sources.LETTERS:
    raise ValueError(f"{where}: no gold letter ('answer', or <answer>X</answer> "
                     "in 'output_text')")
  return answer


def read_release(split_dir: str) -> dict[str, list[tuple]]:
  """{split: [(user turn, gold letter, worked trace or None)]} of the
  release under split_dir, in its stored order; ValueError naming what is
  missing."""
  out = {}
  for split, sub in RELEASE_SPLITS:
    d = os.path.join(split_dir, sub)
    files = sorted(f for f in os.listdir(d) if f.endswith(".arrow")
                   and not f.startswith("cache-")) if os.path.isdir(d) else []
    if not files:
      raise ValueError(f"--split_dir {split_dir}: no Arrow file in {d} (the "
                       f"release's {sub}/, a `datasets` save_to_disk directory)")
    out[split] = []
    for f in files:
      for i, row in enumerate(_read_arrow(os.path.join(d, f))):
        where = f"{os.path.join(d, f)}: row {i}"
        trace = row.get("output_text")
        out[split].append((_user_turn(row, where), _gold(row, where),
                           trace if isinstance(trace, str) and trace.strip()
                           else None))
  return out


def match_release(rows, release) -> tuple[dict[str, list], dict]:
  """The pool rows each release split names, in the release's order: a
  pool row matches a user turn holding its question and every option text
  (case and spacing aside; of several, the longest question), and must have
  the release's gold letter. Returns ({split: [(pool row, trace)]},
  release rows left out by reason); a row in both splits stays in test
  only."""
  index: dict[str, list] = {}
  short = []  # questions shorter than the key: tried against every turn
  for r in rows:
    q = _norm(r[2]["question"])
    c = (q, [_norm(o) for o in r[2]["options"]], r)
    (short.append(c) if len(q) < _KEY
     else index.setdefault(q[:_KEY], []).append(c))
  left = {"unmatched": 0, "ambiguous": 0, "answer_differs": 0, "in_both": 0}
  out, seen = {}, set()
  for split, items in release.items():
    out[split] = []
    for text, letter, trace in items:
      t = _norm(text)
      cands = {id(c): c for i in range(max(1, len(t) - _KEY + 1))
               for c in index.get(t[i:i + _KEY], ())}
      cands.update((id(c), c) for c in short)
      found = [c for c in cands.values()
               if c[0] in t and all(o in t for o in c[1])]
      if found:
        top = max(len(c[0]) for c in found)
        found = [c for c in found if len(c[0]) == top]
      if not found:
        left["unmatched"] += 1
      elif len(found) > 1:
        left["ambiguous"] += 1
      elif found[0][2][2]["answer"] != letter:
        left["answer_differs"] += 1
      elif found[0][2][0] in seen:
        left["in_both"] += 1
      else:
        seen.add(found[0][2][0])
        out[split].append((found[0][2], trace))
  return out, left


_KEY = 24  # characters of a question's start that index it


def _write(out: str, picked: dict[str, list]) -> None:
  """OUT/{split}.jsonl: each (pool row, trace)'s raw row, the trace (if
  any) as its `response`."""
  os.makedirs(out, exist_ok=True)
  for split, rows in picked.items():
    with open(os.path.join(out, f"{split}.jsonl"), "w", encoding="utf-8") as f:
      for r, trace in rows:
        row = dict(r[1], response=trace) if trace else r[1]
        f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")


def write_splits(name: str, paths: list[str], out: str,
                 split_dir: str | None = None) -> dict:
  """Writes the raw rows of set `name`'s splits as OUT/{split}.jsonl (what
  the mcq_files builder's config NAME converts, in this order); returns
  what the data set's record says of them. The splits are the seeded draw,
  or with `split_dir` (sciknoweval only) the release's (read_release)."""
  spec = SETS[name]
  rows, left = pool(name, paths)
  if not rows:
    raise ValueError(f"{name}: no row of its files is in the pool "
                     f"({spec.rule}); left out: {left}")
  info = {**draw_spec(name, split_dir), "pool": len(rows), "left_out": left}
  if split_dir:
    if name != "sciknoweval":
      raise ValueError(f"--split_dir: only for sciknoweval ({RELEASE}), not "
                       f"{name}")
    release = read_release(split_dir)
    picked, dropped = match_release(rows, release)
    if not all(picked.values()):
      raise ValueError(f"--split_dir {split_dir}: the release's rows match no "
                       f"question of the pool in some split ({dropped}; "
                       f"{len(rows)} pool questions)")
    info.update(split_dir=os.path.abspath(split_dir), left_out_release=dropped,
                release_rows={s: len(v) for s, v in release.items()},
                traces={s: sum(t is not None for _, t in v)
                        for s, v in picked.items()}, short=False)
  else:
    idx = draw(len(rows), spec.counts, spec.seed)
    picked = {s: [(rows[i], None) for i in ix] for s, ix in idx.items()}
    info.update(method="rows sorted by row_id (sha256 of question and "
                       "options); numpy.random.default_rng(seed).permutation; "
                       "slices in the order of counts",
                short=len(rows) < sum(size for _, size in spec.counts))
  _write(out, picked)
  info["ids"] = {s: [r[0] for r, _ in v] for s, v in picked.items()}
  return info
