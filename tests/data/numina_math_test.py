"""`python -m jaxdistill.data.prepare numina_math|math500` against a fake,
offline hub cache in the real repos' layouts and row schemas
(EleutherAI/hendrycks_math: <subject>/{train,test}-00000-of-00001.parquet;
AI-MO/NuminaMath-CoT: data/train-0000k-of-00002.parquet with source,
problem, solution, messages; HuggingFaceH4/MATH-500: test.jsonl).

The fakes hold exactly the rows written here, so which rows each filter
drops is known by construction; the seeded draw is re-derived here with
hashlib, numpy and transformers directly (not with data.numina_math)."""
import hashlib
import json
import os

import ml_collections
import numpy as np
import pytest
from transformers import AutoTokenizer

from jaxdistill import config_lib
from jaxdistill import tasks
from jaxdistill.data import numina_math
from jaxdistill.data import pipeline
from jaxdistill.data import prepare
from jaxdistill.data import tokenizer as tok_lib
from jaxdistill.evaluate import suites
from jaxdistill.sweep import grid as grid_lib
from jaxdistill.sweep import inputs
from tests import hub_cache

SUBJECTS = ("algebra", "counting_and_probability", "geometry",
            "intermediate_algebra", "number_theory", "prealgebra",
            "precalculus")
N_MATH_TRAIN, N_MATH_TEST = 700, 70   # +2 repeats in train (case, spacing)
N_GOOD = 19_800                       # valid synthetic rows before length
N_LONG = 40                           # of those, solutions far past 384 tokens


def _math_rows(split, n):
  rows = [{"problem": f"MATH {split} problem {i}: compute $x_{{{i}}}$.",
           "level": f"Level {1 + i % 5}", "type": "Algebra",
           "solution": f"So $x = \\boxed{{\\frac{{{i}}}{{{i + 1}}}}}$."}
          for i in range(n)]
  if split == "train":  # the same problems again, case and spacing aside
    rows += [dict(rows[3], problem=rows[3]["problem"].upper()),
             dict(rows[5], problem="  " + rows[5]["problem"].replace(" ", "\n  "))]
  return rows


def _numina_rows():
  rows = []
  for i in range(N_GOOD):
    sol = f"Step {i}. The answer is $\\boxed{{{{{i}}}+1}}$."  # nested braces
    if i < N_LONG:
      sol = " ".join(f"w{j}q" for j in range(700)) + " \\boxed{7}"
    rows.append({"problem": f"Synthetic {i}: find  y.", "solution": sol})
  bad = [
      {"problem": "", "solution": "\\boxed{1}"},                    # empty problem
      {"problem": "Empty solution one.", "solution": "   "},
      {"problem": "No box.", "solution": "the answer is 2"},
      {"problem": "Unbalanced.", "solution": "\\boxed{\\frac{1}{2}"},
      {"problem": "Empty box.", "solution": "so \\boxed{ }"},
      {"problem": "Last box unbalanced.", "solution": "\\boxed{1} \\boxed{2"},
      # MATH train (other case) and MATH test (other spacing) problems.
      {"problem": "math TRAIN problem 10: compute $x_{10}$.", "solution": "\\boxed{1}"},
      {"problem": "MATH test   problem 4:\tcompute $x_{4}$.", "solution": "\\boxed{1}"},
      # Repeats of synthetic problems (case): one of each pair stays.
      {"problem": "SYNTHETIC 100: find y.", "solution": "\\boxed{2}"},
      {"problem": "synthetic 101: FIND y.", "solution": "\\boxed{3}"},
  ]
  other = [{"problem": f"Olympiad {i}", "solution": "\\boxed{1}",
            "source": "olympiads"} for i in range(30)]
  out = [dict(r, source="synthetic_math") for r in rows + bad] + other
  for r in out:
    r["messages"] = [{"role": "user", "content": r["problem"]},
                     {"role": "assistant", "content": r["solution"]}]
  return out


def _math500_rows():
  return [{"problem": f"MATH-500 problem {i}", "solution": f"\\boxed{{{i}}}",
           "answer": f"\\frac{{{i}}}{{2}}", "subject": "Algebra", "level": 2,
           "unique_id": f"test/algebra/{i}.json"} for i in range(12)]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  cache = str(tmp_path_factory.mktemp("hf_math"))
  tok_dir = str(tmp_path_factory.mktemp("tok"))
  tok_lib.train_bpe_tokenizer(
      ["Synthetic 1: find y. Step 2. The answer is $\\boxed{3}$."] * 20, 300,
      tok_dir)
  tok_files = {n: open(os.path.join(tok_dir, n), "rb").read()
               for n in os.listdir(tok_dir)}
  hub_cache.add_repo(cache, numina_math.TOKENIZER, tok_files)
  math_files = {}
  for k, subject in enumerate(SUBJECTS):
    for split, n in (("train", N_MATH_TRAIN), ("test", N_MATH_TEST)):
      rows = _math_rows(split, n)
      per = len(rows) // len(SUBJECTS) + 1
      math_files[f"{subject}/{split}-00000-of-00001.parquet"] = (
          hub_cache._parquet(rows[k * per:(k + 1) * per]))  # pylint: disable=protected-access
  numina = _numina_rows()
  half = len(numina) // 2
  commits = {
      "math": hub_cache.add_repo(cache, numina_math.MATH.repo, {
          **math_files, "README.md": b"card"}, repo_type="dataset"),
      "numina": hub_cache.add_repo(cache, numina_math.NUMINA.repo, {
          "data/train-00000-of-00002.parquet": hub_cache._parquet(numina[:half]),  # pylint: disable=protected-access
          "data/train-00001-of-00002.parquet": hub_cache._parquet(numina[half:]),  # pylint: disable=protected-access
          "data/test-00000-of-00001.parquet": hub_cache._parquet(numina[:5]),  # pylint: disable=protected-access
      }, repo_type="dataset"),
      "math500": hub_cache.add_repo(cache, numina_math.MATH500.repo, {
          "test.jsonl": hub_cache.jsonl(_math500_rows())}, repo_type="dataset")}
  out = str(tmp_path_factory.mktemp("prepared"))
  mp = pytest.MonkeyPatch()
  hub_cache.use(mp, cache)
  try:
    logs = []
    records = {n: prepare.prepare(n, out, log=logs.append)
               for n in ("numina_math", "math500")}
    yield out, records, commits, tok_dir, logs
  finally:
    mp.undo()


def _key(text):
  return " ".join(text.lower().split())


def _expected_train(tok_dir):
  tok = AutoTokenizer.from_pretrained(tok_dir)
  math = {}
  for r in _math_rows("train", N_MATH_TRAIN):
    math.setdefault(_key(r["problem"]), r)
  assert len(math) == N_MATH_TRAIN
  math_sorted = [math[k] for k in sorted(
      math, key=lambda k: hashlib.sha256(k.encode()).hexdigest())]
  exclude = set(math) | {_key(r["problem"]) for r in _math_rows("test", N_MATH_TEST)}
  good = {}
  for r in _numina_rows():
    k = _key(r["problem"])
    if r["source"] != "synthetic_math" or not k or k in exclude:
      continue
    if r["problem"].startswith(("Empty", "No box", "Unbalanced", "Last box")):
      continue
    d = hashlib.sha256(k.encode()).hexdigest()
    if d not in good or r["solution"] < good[d]["solution"]:
      good[d] = r
  pool = [good[d] for d in sorted(good)
          if len(tok(good[d]["solution"], add_special_tokens=False).input_ids) <= 384]
  want = 20_000 - len(math_sorted)
  pick = np.random.default_rng(42).permutation(len(pool))[:want]
  return math_sorted, [pool[i] for i in pick], len(pool)


def _lines(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def test_train_split_is_math_then_the_seeded_draw(prepared):
  out, records, _, tok_dir, _ = prepared
  math, drawn, pool = _expected_train(tok_dir)
  got = _lines(os.path.join(numina_math.files_dir(out, "numina_math"),
                            "train.jsonl"))
  assert len(got) == 20_000
  assert [(r["problem"], r["solution"]) for r in got] == [
      (r["problem"], r["solution"]) for r in math + drawn]
  assert [r["origin"] for r in got] == (
      ["math"] * N_MATH_TRAIN + ["synthetic_math"] * len(drawn))
  assert got[0]["answer"] == numina_math.math_answer.last_boxed(math[0]["solution"])
  assert {r["answer"] for r in got[N_MATH_TRAIN:]} <= (
      {"7"} | {f"{{{i}}}+1" for i in range(N_GOOD)} | {"2", "3"})
  rec = records["numina_math"]
  assert rec["records"] == {"train": 20_000}
  assert rec["math_train"] == N_MATH_TRAIN
  assert rec["synthetic_pool"] == pool
  assert rec["synthetic"] == 20_000 - N_MATH_TRAIN


def test_rows_left_out_by_reason(prepared):
  rec = prepared[1]["numina_math"]
  assert rec["left_out"]["math_train"] == {"duplicate": 2}
  assert rec["left_out"]["numina"] == {
      "not_synthetic_math": 30, "empty_problem": 1, "empty_solution": 1,
      "no_boxed_answer": 4, "in_math": 2, "duplicate": 2, "too_long": N_LONG}
  assert rec["math_test_keys"] == N_MATH_TEST


def test_record_names_repos_commits_and_tokenizer(prepared):
  out, records, commits, _, _ = prepared
  rec = records["numina_math"]
  assert rec["repos"] == {numina_math.MATH.repo: commits["math"],
                          numina_math.NUMINA.repo: commits["numina"]}
  assert rec["tokenizer"]["name"] == numina_math.TOKENIZER
  assert len(rec["tokenizer"]["commit"]) == 40
  assert not any("test-" in f and "data/" in f for f in rec["files"])
  with open(os.path.join(out, "prepared", "numina_math.json")) as f:
    assert json.load(f) == rec


def test_math500_keeps_its_answers(prepared):
  out, records, commits, _, _ = prepared
  got = numina_math.read_jsonl(os.path.join(
      numina_math.files_dir(out, "math500"), "test.jsonl"))
  assert [(r["problem"], r["answer"]) for r in got] == [
      (r["problem"], r["answer"]) for r in _math500_rows()]
  assert records["math500"]["records"] == {"test": 12}
  assert records["math500"]["repos"] == {numina_math.MATH500.repo:
                                         commits["math500"]}


def test_second_prepare_does_nothing(prepared):
  out, records, _, _, _ = prepared
  logs = []
  assert prepare.prepare("math500", out, log=logs.append) == records["math500"]
  assert "nothing to do" in logs[-1]


def test_revision_is_refused(tmp_path):
  with pytest.raises(ValueError, match="--revision"):
    prepare.prepare("numina_math", str(tmp_path), revision="abc")


def test_runs_and_suites_read_the_prepared_sets(prepared):
  out = prepared[0]
  train = pipeline.records_from_config(ml_collections.ConfigDict(dict(
      task="math", source="numina_math", split="train", data_dir=out)))
  assert len(train) == 20_000 and tasks.task_of(train[0]) == tasks.MATH
  spec = ml_collections.ConfigDict(dict(kind="math", source="math500",
                                        split="test", data_dir=out,
                                        num_problems=5))
  got = suites.suite_records("math500", spec)
  assert [r["answer"] for r in got] == [r["answer"] for r in _math500_rows()[:5]]
  with pytest.raises(ValueError, match="split"):
    suites.suite_records("math500", ml_collections.ConfigDict(dict(
        kind="math", source="math500", split="train", data_dir=out)))
  with pytest.raises(FileNotFoundError, match="prepare numina_math"):
    pipeline.math_records("numina_math", "train", out + "/nowhere", "data")


def test_the_math_grid_reads_both_sets_from_its_data_dir(prepared):
  out = prepared[0]
  grid = config_lib.load_config("configs/grid_math.py")
  grid.base.data.data_dir = out
  run = grid_lib.expand(grid)[0]
  # The math sets; forgetting is on the lm-eval benchmarks (the default),
  # which lm-eval fetches itself.
  assert inputs._needs(grid, run) == [  # pylint: disable=protected-access
      (n, out) for n in ("numina_math", "math500")]
  assert inputs.eval_config(grid, run).ood == ("lmeval",)
  # forgetting=suites: the paper's MCQ sets of those suites too.
  grid.eval.spec = "configs/eval.py:task=math,forgetting=suites"
  assert inputs._needs(grid, run) == [  # pylint: disable=protected-access
      (n, out) for n in ("numina_math", "math500", "sciknoweval", "medreason")]
  ev = inputs.eval_config(grid, run)
  assert len(suites.suite_records("math500", ev.suites.math500)) == 12
  assert prepare.ensure("numina_math", out, log=lambda m: None) == (
      prepared[1]["numina_math"])


def test_a_damaged_set_is_prepared_again(prepared):
  out, records = prepared[0], prepared[1]
  os.remove(os.path.join(numina_math.files_dir(out, "math500"), "test.jsonl"))
  assert prepare.prepare("math500", out, log=lambda m: None) == records["math500"]
  assert os.path.isfile(os.path.join(numina_math.files_dir(out, "math500"),
                                     "test.jsonl"))
