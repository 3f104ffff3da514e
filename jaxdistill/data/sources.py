"""Readers and converters for user-downloaded multiple-choice files.

Nothing here touches the network: the user downloads the public files and
points us at them. Every format is converted into one schema::

  {"question": str, "options": list[str] (2..26), "answer": "A".."Z"}

File formats (by extension): .jsonl (one object per line), .json (an array of
objects, an object of objects as in PubMedQA's ori_pqal.json, or one object
per line as in MedMCQA's original train.json), .csv (with a
header row) and .parquet (via pyarrow). A row that cannot be converted raises
`DataError` naming the file and line (row for Parquet, item or key for JSON).

Sources (`SOURCES`) and the fields they read:

  generic   question, options (a list, or a JSON list in CSV, or columns A, B,
            C...), answer (a letter)
  sciq      question, correct_answer, distractor1..3            [shuffled]
  gpqa      Question, Correct Answer, Incorrect Answer 1..3     [shuffled]
  medmcqa   question, opa..opd, cop (0-based as on the HF hub, 1-based in the
            original release; detected per file from a 0 or a 4, else given
            as convert_file's cop_base argument or McqConfig.cop_base)
  medqa     question, options ({"A": ..} or [{"key", "value"}]), answer_idx
  pubmedqa  QUESTION/CONTEXTS/final_decision (ori_pqal.json) or
            question/context.contexts/final_decision (HF parquet); options are
            yes/no/maybe and the abstract is prepended to the question
  sciknoweval  question, choices {text: [4], label: [A..D]}, answerKey
            (hicai-zju/SciKnowEval); rows of another `type` than
            mcq-4-choices, or whose labels are not A..D over four texts or
            whose answerKey is not one of them, are skipped; a non-empty
            text `response` (a worked trace: prepare --split_dir writes the
            release's) is kept as the record's `response`
  medreason question, options (one text: lines "A. ...", "(A) ..." or
            "A.: ...", other lines such as "Answer Choices:" ignored), answer (the correct option's
            TEXT, UCSC-VLAA/MedReason); the letter is the one option equal
            (case and spacing aside) to the answer, or to its first
            sentence, or to what follows that sentence's last ':' or ' is ',
            or to it without a leading "B." label; rows with fewer than two
            options or an answer that names no single option are skipped

Sources whose correct option sits in a fixed place (SciQ's and GPQA's
correct_answer column) have their options shuffled with a permutation seeded
by (seed, question text), so it does not depend on file order. Rows without a
gradable question (MedMCQA's test split has cop = -1; the skips above) are
skipped, and counted in the log.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
import csv
import hashlib
import json
import logging
import os
import random
import re
import string

LETTERS = string.ascii_uppercase
FORMATS = (".jsonl", ".json", ".csv", ".parquet")


class DataError(ValueError):
  """A malformed row in a user file; the message starts with `file:location`."""


# ------------------------------------------------------------------ readers


def read_rows(path: str) -> Iterator[tuple[str, dict]]:
  """Yields (location, row) pairs; location is e.g. 'train.jsonl:17'."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"data file not found: {path}")
  ext = _ext(path)
  if ext == ".jsonl":
    yield from _read_jsonl(path)
  elif ext == ".json":
    yield from _read_json(path)
  elif ext == ".csv":
    yield from _read_csv(path)
  elif ext == ".parquet":
    yield from _read_parquet(path)
  else:
    raise ValueError(f"{path}: unknown file format; use one of {FORMATS}")


def _ext(path: str) -> str:
  return os.path.splitext(path)[1].lower()


def _read_jsonl(path):
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise DataError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
      if not isinstance(row, dict):
        raise DataError(f"{path}:{lineno}: expected a JSON object, got "
                        f"{type(row).__name__}")
      yield f"{path}:{lineno}", row


def _read_json(path):
  with open(path, encoding="utf-8") as f:
    try:
      data = json.load(f)
    except json.JSONDecodeError as e:
      if e.msg == "Extra data":
        # One object per line under a .json name (MedMCQA's original release).
        yield from _read_jsonl(path)
        return
      raise DataError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
  if isinstance(data, dict) and data and all(isinstance(v, dict) for v in data.values()):
    items = ((f"key {k!r}", v) for k, v in data.items())
  elif isinstance(data, dict):
    items = [("item 0", data)]  # A single record (a one-line JSONL file).
  elif isinstance(data, list):
    items = ((f"item {i}", v) for i, v in enumerate(data))
  else:
    raise DataError(f"{path}: expected a JSON array or object at top level")
  for where, row in items:
    if not isinstance(row, dict):
      raise DataError(f"{path}: {where}: expected an object")
    yield f"{path}: {where}", row


def _read_csv(path):
  with open(path, encoding="utf-8", newline="") as f:
    reader = csv.reader(f)
    try:
      header = next(reader)
    except StopIteration:
      return
    except csv.Error as e:
      raise DataError(f"{path}:1: {e}") from None
    start = reader.line_num + 1
    while True:
      try:
        values = next(reader)
      except StopIteration:
        return
      except csv.Error as e:
        raise DataError(f"{path}:{start}: {e}") from None
      if values and len(values) != len(header):
        raise DataError(f"{path}:{start}: {len(values)} fields, header has "
                        f"{len(header)}")
      if values:
        yield f"{path}:{start}", dict(zip(header, values))
      start = reader.line_num + 1


def _read_parquet(path):
  import pyarrow.parquet as pq  # heavy: imported when a Parquet file is read
  table = pq.read_table(path)
  for i, row in enumerate(table.to_pylist()):
    yield f"{path}: row {i}", row


# --------------------------------------------------------------- converters


def _text(row, key) -> str:
  if key not in row or row[key] is None:
    raise ValueError(f"missing field {key!r}")
  value = row[key]
  if not isinstance(value, (str, int, float)):
    raise ValueError(f"field {key!r} must be text, got {type(value).__name__}")
  value = str(value).strip()
  if not value:
    raise ValueError(f"field {key!r} is empty")
  return value


def _shuffled(question, correct, wrong, seed):
  """Options with the correct one at a position fixed by (seed, question)."""
  options = [correct] + list(wrong)
  digest = hashlib.sha256(f"{seed}\0{question}".encode()).hexdigest()
  random.Random(digest).shuffle(options)
  return options, LETTERS[options.index(correct)]


def _generic(row, seed, opts):
  del seed, opts
  question = _text(row, "question")
  if "options" in row:
    options = row["options"]
    if isinstance(options, str):
      try:
        options = json.loads(options)
      except json.JSONDecodeError:
        raise ValueError("field 'options' must be a list (JSON list in CSV)") from None
  else:
    options = []
    for letter in LETTERS:
      if letter not in row or row[letter] in (None, ""):
        break
      options.append(row[letter])
    if not options:
      raise ValueError("missing field 'options' (or option columns A, B, ...)")
  return question, options, _text(row, "answer").upper()


def _sciq(row, seed, opts):
  del opts
  question = _text(row, "question")
  wrong = [_text(row, f"distractor{i}") for i in (1, 2, 3)]
  options, answer = _shuffled(question, _text(row, "correct_answer"), wrong, seed)
  return question, options, answer


def _gpqa(row, seed, opts):
  del opts
  question = _text(row, "Question")
  wrong = [_text(row, f"Incorrect Answer {i}") for i in (1, 2, 3)]
  options, answer = _shuffled(question, _text(row, "Correct Answer"), wrong, seed)
  return question, options, answer


def _medmcqa(row, seed, opts):
  del seed
  question = _text(row, "question")
  options = [_text(row, k) for k in ("opa", "opb", "opc", "opd")]
  cop = _medmcqa_cop(row)
  if cop is None:
    return None
  index = cop - opts["cop_base"]
  if not 0 <= index < 4:
    raise ValueError(f"field 'cop' = {cop} out of range for cop_base "
                     f"{opts['cop_base']}")
  return question, options, LETTERS[index]


def _medmcqa_cop(row):
  cop = row.get("cop")
  if cop is None or cop == "" or str(cop).strip() == "-1":
    return None  # Unlabelled (the public test split).
  try:
    return int(cop)
  except (TypeError, ValueError):
    raise ValueError(f"field 'cop' must be an integer, got {cop!r}") from None


def _medqa(row, seed, opts):
  del seed, opts
  question = _text(row, "question")
  raw = row.get("options")
  if isinstance(raw, Mapping):
    keys = sorted(raw)
    if keys != list(LETTERS[:len(keys)]):
      raise ValueError(f"field 'options' keys must be A, B, ..., got {keys}")
    options = [raw[k] for k in keys]
  elif isinstance(raw, list) and all(isinstance(o, Mapping) for o in raw):
    pairs = sorted((str(o.get("key")), o.get("value")) for o in raw)
    if [k for k, _ in pairs] != list(LETTERS[:len(pairs)]):
      raise ValueError("field 'options' entries need keys A, B, ...")
    options = [v for _, v in pairs]
  else:
    raise ValueError("field 'options' must map letters to option texts")
  key = "answer_idx" if "answer_idx" in row else "answer"
  return question, options, _text(row, key).upper()


def _pubmedqa(row, seed, opts):
  del seed, opts
  if "QUESTION" in row:
    question, contexts, decision = row["QUESTION"], row.get("CONTEXTS"), row.get(
        "final_decision")
  else:
    question, decision = row.get("question"), row.get("final_decision")
    context = row.get("context")
    contexts = context.get("contexts") if isinstance(context, Mapping) else context
  if not isinstance(question, str) or not question.strip():
    raise ValueError("missing field 'QUESTION'/'question'")
  if contexts is None:
    contexts = []
  if isinstance(contexts, str):
    contexts = [contexts]
  options = ["yes", "no", "maybe"]
  if decision not in options:
    raise ValueError(f"field 'final_decision' must be yes/no/maybe, got {decision!r}")
  body = "\n".join(str(c).strip() for c in contexts)
  text = f"Context: {body}\n\nQuestion: {question.strip()}" if body else question
  return text, options, LETTERS[options.index(decision)]


def _sciknoweval(row, seed, opts):
  del seed, opts
  if row.get("type") != "mcq-4-choices":
    return None  # open-ended, true/false, two-choice ...: not the MCQ part
  question = _text(row, "question")
  choices = row.get("choices")
  if (not isinstance(choices, Mapping) or not isinstance(choices.get("text"), list)
      or not isinstance(choices.get("label"), list)):
    raise ValueError("field 'choices' must be {'text': [...], 'label': [...]}")
  labels = [str(x).strip().upper() for x in choices["label"]]
  if labels != list(LETTERS[:4]) or len(choices["text"]) != 4:
    return None  # a broken row: which text goes with which letter is unknown
  answer = str(row.get("answerKey") or "").strip().upper()
  if answer not in labels:
    return None
  return question, list(choices["text"]), answer


# "A. x", "A) x", "(A) x", "A: x", "A.: x" (all in MedReason's options).
_OPTION_LINE = re.compile(r"^\s*\(?([A-Z])\s*(?:[.)]\s*:?|:)\s*(\S.*?)\s*$")


def _norm(text) -> str:
  return " ".join(str(text).casefold().split()).rstrip(" .")


def medreason_options(text: str) -> list[str]:
  """The option texts of a MedReason `options` field, in letter order; []
  if its lines do not give options A, B, ... in order."""
  found = [m.groups() for m in map(_OPTION_LINE.match, str(text).splitlines()) if m]
  if [k for k, _ in found] != list(LETTERS[:len(found)]):
    return []
  return [v for _, v in found]


def _medreason(row, seed, opts):
  del seed, opts
  question = _text(row, "question")
  raw = row.get("options")
  if not isinstance(raw, str):
    return None  # open-ended (the HuatuoGPT-o1 part has no options)
  options = medreason_options(raw)
  if len(options) < 2:
    return None
  norms = [_norm(o) for o in options]
  for cand in _answer_candidates(_text(row, "answer")):
    if norms.count(cand) == 1:
      return question, options, LETTERS[norms.index(cand)]
  return None  # the answer names no single option


def _answer_candidates(answer: str):
  """What a MedReason answer text may name, normalised, most literal first:
  the whole text, its first sentence, and that sentence after its last ':'
  or ' is ' ("The correct answer is: X. Because ..."); a leading option
  label ("B. X") is dropped."""
  first = answer.split(". ", 1)[0]
  out = [answer, first, first.rsplit(":", 1)[-1],
         re.split(r"\s+is\s+", first, flags=re.IGNORECASE)[-1]]
  label = _OPTION_LINE.match(answer.splitlines()[0])
  if label:
    out += [label.group(2), label.group(2).split(". ", 1)[0]]
  return [_norm(c) for c in out if c.strip()]


SOURCES: dict[str, Callable] = {
    "generic": _generic, "sciq": _sciq, "gpqa": _gpqa, "medmcqa": _medmcqa,
    "medqa": _medqa, "pubmedqa": _pubmedqa, "sciknoweval": _sciknoweval,
    "medreason": _medreason,
}


# Sources whose rows may carry a worked trace, kept as the record's response.
RESPONSES = ("sciknoweval",)


def validate_record(question, options, answer) -> dict:
  """The schema checks every converter's output passes; ValueError otherwise."""
  if not isinstance(options, list) or not 2 <= len(options) <= len(LETTERS):
    raise ValueError(f"'options' must be a list of 2..{len(LETTERS)} texts")
  for i, o in enumerate(options):
    # str() would grade null as the option "None" and an object as its repr.
    if isinstance(o, bool) or not isinstance(o, (str, int, float)):
      raise ValueError(f"'options'[{i}] (option {LETTERS[i]}) must be text, "
                       f"got {json.dumps(o, default=str)[:40]}")
  options = [str(o).strip() for o in options]
  if any(not o for o in options):
    raise ValueError("'options' contains an empty option")
  if answer not in LETTERS[:len(options)]:
    raise ValueError(f"'answer' {answer!r} is not one of "
                     f"{LETTERS[0]}..{LETTERS[len(options) - 1]}")
  return {"question": question, "options": options, "answer": answer}


def convert_file(path: str, source: str = "generic", *, seed: int = 0,
                 cop_base: int | None = None) -> list[dict]:
  """All records of one user file, in file order; DataError names file:line."""
  if source not in SOURCES:
    raise ValueError(f"source must be one of {sorted(SOURCES)}, got {source!r}")
  rows = list(read_rows(path))
  opts = {}
  if source == "medmcqa":
    opts["cop_base"] = _detect_cop_base(path, rows) if cop_base is None else cop_base
  convert, out, skipped = SOURCES[source], [], 0
  for where, row in rows:
    try:
      parts = convert(row, seed, opts)
      if parts is None:
        skipped += 1
        continue
      out.append(validate_record(*parts))
      response = row.get("response")
      if source in RESPONSES and isinstance(response, str) and response.strip():
        out[-1]["response"] = response
    except DataError:
      raise
    except (ValueError, TypeError, KeyError) as e:
      raise DataError(f"{where}: {e}") from None
  if skipped:
    logging.info("%s: skipped %d rows without a gradable question", path,
                 skipped)
  return out


def _detect_cop_base(path, rows) -> int:
  seen = set()
  for where, row in rows:
    try:
      cop = _medmcqa_cop(row)
    except ValueError as e:
      raise DataError(f"{where}: {e}") from None
    if cop is not None:
      seen.add(cop)
  if 0 in seen and 4 in seen:
    raise DataError(f"{path}: field 'cop' holds both 0 and 4, so it is neither "
                    "0-based (0-3) nor 1-based (1-4); fix the file")
  if 0 in seen:
    return 0
  if 4 in seen:
    return 1
  if not seen:
    return 0
  raise DataError(
      f"{path}: cannot tell whether field 'cop' is 0-based (HF hub) or 1-based "
      "(original release): no row has 0 or 4. Convert it in Python with "
      f"jaxdistill.data.sources.convert_file({path!r}, 'medmcqa', cop_base=0 "
      "or 1) and save that with sources.write_jsonl, then use source 'generic'")


def split_of_file(path: str) -> str:
  """'train', 'validation' or 'test' from a file name; unmarked files are test
  sets (e.g. gpqa_diamond.csv, ori_pqal.json)."""
  name = os.path.basename(path).lower()
  if "train" in name:
    return "train"
  if "valid" in name or "dev" in name:
    return "validation"
  return "test"


def find_files(directory: str) -> dict[str, list[str]]:
  """Data files directly under `directory`, grouped by split."""
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"data directory not found: {directory}")
  splits: dict[str, list[str]] = {}
  for name in sorted(os.listdir(directory)):
    path = os.path.join(directory, name)
    if os.path.isfile(path) and _ext(path) in FORMATS:
      splits.setdefault(split_of_file(path), []).append(path)
  if not splits:
    raise FileNotFoundError(f"{directory}: no {'/'.join(FORMATS)} files found")
  return splits


def write_jsonl(records, path: str) -> None:
  """Writes records in the documented schema, one JSON object per line."""
  with open(path, "w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps({k: r[k] for k in ("question", "options", "answer")},
                         ensure_ascii=False) + "\n")
