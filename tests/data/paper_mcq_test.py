"""`python -m jaxdistill.data.prepare sciknoweval|medreason` against a fake,
offline hub cache in the real repos' layouts and row schemas
(tests/hub_cache.py's generated rows, here as many as the paper's draws).

The fakes hold exactly the rows the test writes, so the pools, the counts and
every answer letter are known here; the expected draw is re-derived with
hashlib and numpy directly (sort by the question-and-options digest, one
default_rng(42) permutation, test first), not with data.paper_mcq."""
import dataclasses
import hashlib
import json
import os

import ml_collections
import numpy as np
import pytest

from jaxdistill import tasks
from jaxdistill.data import builders
from jaxdistill.data import paper_mcq
from jaxdistill.data import pipeline
from jaxdistill.data import prepare
from jaxdistill.data import sources
from jaxdistill.evaluate import suites as suites_lib
from tests import hub_cache

N_SCIENCE = 507 + 2674  # exactly the paper's two splits
N_MED = 5600             # more than its 500 + 5,000
_jsonl = hub_cache.jsonl
_ske_row = hub_cache.sciknoweval_row
_med_row = hub_cache.medreason_row


@pytest.fixture(scope="module")
def fake_hub(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("hf_paper_mcq"))
  commits = {
      "hicai-zju/SciKnowEval": hub_cache.add_repo(
          d, "hicai-zju/SciKnowEval", hub_cache.sciknoweval_files(N_SCIENCE),
          repo_type="dataset", commit=builders.SCIKNOWEVAL_COMMIT),
      "UCSC-VLAA/MedReason": hub_cache.add_repo(
          d, "UCSC-VLAA/MedReason", hub_cache.medreason_files(N_MED),
          repo_type="dataset")}
  return d, commits


@pytest.fixture(scope="module")
def prepared(fake_hub, tmp_path_factory):
  out = str(tmp_path_factory.mktemp("prepared"))
  mp = pytest.MonkeyPatch()
  hub_cache.use(mp, fake_hub[0])
  try:
    yield out, {n: prepare.prepare(n, out, log=lambda m: None)
                for n in builders.PAPER_MCQ}
  finally:
    mp.undo()


def _digest(question, options):
  text = "\0".join(" ".join(str(x).casefold().split()) for x in [question, *options])
  return hashlib.sha256(text.encode()).hexdigest()


def _expected(truth: list[dict], counts):
  """{split: records} re-derived: one row per digest (the first), sorted by
  digest, slices of default_rng(42).permutation."""
  by = {}
  for r in truth:
    by.setdefault(_digest(r["question"], r["options"]), r)
  keys = sorted(by)
  perm = np.random.default_rng(42).permutation(len(keys))
  out, start = {}, 0
  for split, n in counts:
    out[split] = [by[keys[i]] for i in perm[start:start + n]]
    start += n
  return out


def _science_truth():
  return [{"question": f"Chemistry question {i}: which reagent?",
           "options": [f"reagent {i}-{k}" for k in range(4)],
           "answer": "ABCD"[i % 4]} for i in range(N_SCIENCE)]


def _medical_truth():
  out = []
  for i in range(N_MED):
    opts = hub_cache.medreason_options(i)
    out.append({"question": f"Patient {i}: the likely finding?", "options": opts,
                "answer": "ABCDE"[i % len(opts)]})
  return out


def _key(r):
  return (r["question"], tuple(r["options"]), r["answer"])


@pytest.mark.parametrize("name,truth,counts,left", [
    ("sciknoweval", _science_truth, {"test": 507, "train": 2674},
     {"not_selected": 2, "not_mcq": 5, "duplicate": 1}),
    ("medreason", _medical_truth, {"test": 500, "train": 5000},
     {"not_selected": 0, "not_mcq": 2, "duplicate": 1})])
def test_prepare_draws_the_paper_counts_with_a_recorded_seed(
    name, truth, counts, left, prepared, fake_hub):
  out, records = prepared
  record = records[name]
  repo = builders.HUB_DATASETS[name].repo
  assert record["repo"] == repo and record["commit"] == fake_hub[1][repo]
  assert record["records"] == counts
  # SciKnowEval at the commit the paper's source drew from, unless asked.
  assert record["revision"] == (builders.SCIKNOWEVAL_COMMIT
                                if name == "sciknoweval" else "main")
  if name == "sciknoweval":  # the Chemistry file only
    assert record["source_files"] == [
        "data/Chemistry/sciknoweval_chemistry_test.jsonl"]
  draw = record["draw"]
  assert draw["seed"] == 42 and draw["counts"] == counts
  assert draw["left_out"] == left and not draw["short"]
  assert draw["pool"] == len(truth())
  expected = _expected(truth(), counts.items())  # test first, then train
  builder = builders.mcq_builder(dict(data_dir=out, source=name), "data")
  for split, n in counts.items():
    got = builders.load_records(builder, split)
    assert len(got) == n
    assert sorted(map(_key, got)) == sorted(map(_key, expected[split]))
  train = {_key(r) for r in builders.load_records(builder, "train")}
  assert not train & {_key(r) for r in builders.load_records(builder, "test")}
  assert draw["ids"]["test"] == [_digest(r["question"], r["options"])
                                 for r in expected["test"]]
  # Stored in the order drawn; a draw carries no worked traces.
  assert not any("response" in r for s in counts
                 for r in builders.load_records(builder, s))
  for split in counts:
    assert [_digest(r["question"], r["options"]) for r in
            builders.load_records(builder, split)] == draw["ids"][split]


def test_a_second_prepare_is_a_no_op_and_the_sweep_reads_it(prepared, fake_hub):
  out, records = prepared
  mp = pytest.MonkeyPatch()
  hub_cache.use(mp, fake_hub[0])
  try:
    logs = []
    again = prepare.prepare("sciknoweval", out, log=logs.append)
  finally:
    mp.undo()
  assert again == records["sciknoweval"] and "nothing to do" in logs[0]
  assert prepare.ensure("medreason", out) == records["medreason"]


@pytest.mark.parametrize("name,prompt", [("sciknoweval", "science"),
                                         ("medreason", "medreason")])
def test_training_and_suites_read_it_with_the_table1_prompt(name, prompt, prepared):
  out, _ = prepared
  data = dict(task="mcq", source=name, data_dir=out, prompt=prompt,
              manual_dir=None, split="train")
  rows = pipeline.records_from_config(ml_collections.ConfigDict(data))
  assert len(rows) == dict(paper_mcq.SETS[name].counts)["train"]
  system, user = tasks.prompt_messages(rows[0])
  assert system and rows[0]["question"] in user and "<answer>" in user
  spec = dict(kind="mcq", source=name, data_dir=out, split="test",
              num_problems=200, data_seed=0, prompt=prompt)
  got = suites_lib.suite_records("s", ml_collections.ConfigDict(spec))
  assert len(got) == 200 and all(r["prompt"] == prompt for r in got)


def test_a_row_file_given_by_path_converts_like_the_prepared_data(tmp_path):
  path = tmp_path / "rows.jsonl"
  path.write_bytes(_jsonl([_med_row(0), _med_row(4),
                           {"question": "Open?", "options": None, "answer": "x"}]))
  got = sources.convert_file(str(path), "medreason")
  assert [r["answer"] for r in got] == ["A", "A"] and len(got[1]["options"]) == 4


def test_draw_short_pools_and_too_small_ones():
  counts = (("test", 5), ("train", 20))
  got = paper_mcq.draw(12, counts, 42)
  perm = np.random.default_rng(42).permutation(12)
  assert list(got["test"]) == list(perm[:5]) and list(got["train"]) == list(perm[5:])
  with pytest.raises(ValueError, match="too few for the train split"):
    paper_mcq.draw(5, counts, 42)


def test_bad_input_is_one_clear_error(tmp_path):
  bad = tmp_path / "sciknoweval_chemistry_test.jsonl"
  bad.write_text(json.dumps(_ske_row(0)) + "\n{not json\n")
  with pytest.raises(sources.DataError, match=r"sciknoweval_chemistry_test.jsonl:2"):
    paper_mcq.pool("sciknoweval", [str(bad)])
  bad.write_text(json.dumps(dict(_ske_row(0), choices=["a", "b", "c", "d"])) + "\n")
  with pytest.raises(sources.DataError, match=r":1: field 'choices'"):
    paper_mcq.pool("sciknoweval", [str(bad)])
  bio = tmp_path / "bio.jsonl"
  bio.write_text(json.dumps(_ske_row(0, domain="Biology")) + "\n")
  with pytest.raises(ValueError, match="no row of its files is in the pool"):
    paper_mcq.write_splits("sciknoweval", [str(bio)], str(tmp_path / "o"))
  few = tmp_path / "few.jsonl"
  few.write_bytes(_jsonl([_med_row(i) for i in range(3)]))
  with pytest.raises(ValueError, match="too few for the train split"):
    paper_mcq.write_splits("medreason", [str(few)], str(tmp_path / "o2"))


def test_the_seeded_hub_sets_come_out_short_and_say_so(hf_cache, tmp_path):
  """tests/hub_cache.py seeds each set with SEEDED_POOL questions: the test
  split is whole, the train split gets the rest."""
  for name, test in (("sciknoweval", 507), ("medreason", 500)):
    record = prepare.prepare(name, str(tmp_path), log=lambda m: None)
    assert record["draw"]["short"] and record["draw"]["pool"] == hub_cache.SEEDED_POOL
    assert record["records"] == {"test": test, "train": hub_cache.SEEDED_POOL - test}


def test_the_study_configs_name_the_paper_sets_and_keep_the_old_as_extras():
  from jaxdistill import config_lib  # pylint: disable=g-import-not-at-top
  for task, source, prompt in (("science", "sciknoweval", "science"),
                               ("medical", "medreason", "medreason")):
    d = config_lib.load_config(f"configs/distill.py:task={task}").data
    assert (d.task, d.source, d.prompt) == ("mcq", source, prompt)
    g = config_lib.load_config(f"configs/grid_main.py:tasks={task}")
    assert g.presets.task[task].data.source == source
  ev = config_lib.load_config("configs/eval.py:task=science")
  assert (ev.suites.science.source, ev.suites.medical.source) == (
      "sciknoweval", "medreason")
  assert ev.suites.science.split == ev.suites.medical.split == "test"
  assert {ev.suites[n].source for n in ("sciq", "medmcqa", "gpqa")} == {
      "sciq", "medmcqa", "gpqa"}
  assert not {"sciq", "medmcqa", "gpqa"} & set(ev.eval_suites)


OPTIONS = "Answer Choices:\nA. Fever\nB. Cough\nC. Night sweats"


@pytest.mark.parametrize("answer,letter", [
    ("Cough", "B"), ("cough.", "B"), ("NIGHT  SWEATS. Explanation: TB.", "C"),
    ("The correct answer is: Fever. It is the first sign.", "A"),
    ("Final answer: Night sweats", "C"), ("B. Cough", "B"),
    ("(C) Night sweats. Because", "C"),
    ("Fever or cough", None), ("Rash", None), ("It is probably a cough", None)])
def test_a_medreason_answer_names_one_option_or_none(answer, letter):
  row = {"question": "Which sign?", "options": OPTIONS, "answer": answer}
  got = sources.SOURCES["medreason"](row, 0, {})
  assert (got and got[2]) == letter
  if letter:
    assert got[1] == ["Fever", "Cough", "Night sweats"]


@pytest.mark.parametrize("options,answer,want", [
    ("A.: 12 mm\nB.: 24 mm", "24 mm", ("B", ["12 mm", "24 mm"])),
    ("(A) Yes\n(B) No", "The final decision is: yes. Because ...", ("A", ["Yes", "No"])),
    ("", "Normal residual volume.", None),           # open-ended (HuatuoGPT-o1)
    ("B. two\nC. three", "two", None),               # letters must start at A
    ("A. one\nB. two\nD. four", "one", None)])      # ... and run in order
def test_medreason_option_layouts(options, answer, want):
  got = sources.SOURCES["medreason"](
      {"question": "Q?", "options": options, "answer": answer}, 0, {})
  assert (got and (got[2], got[1])) == want


def test_a_sciknoweval_file_given_by_path_keeps_its_four_option_rows(tmp_path):
  path = tmp_path / "sciknoweval_chemistry_test.jsonl"
  path.write_bytes(_jsonl([_ske_row(1), _ske_row(2, kind="open-ended-qa"),
                           _ske_row(3, labels="ABCE"), _ske_row(6, domain="Biology")]))
  got = sources.convert_file(str(path), "sciknoweval")
  # Conversion alone does not select the domain: that is the pool's rule.
  assert [(r["answer"], r["options"][0]) for r in got] == [
      ("B", "reagent 1-0"), ("C", "reagent 6-0")]


def test_data_drawn_by_another_rule_is_refused_unless_overwritten(
    hf_cache, tmp_path, monkeypatch):
  prepare.prepare("medreason", str(tmp_path), log=lambda m: None)
  monkeypatch.setitem(paper_mcq.SETS, "medreason", dataclasses.replace(
      paper_mcq.SETS["medreason"], seed=7))
  with pytest.raises(ValueError, match="split by another rule.*'seed': 42.*'seed': 7"):
    prepare.prepare("medreason", str(tmp_path), log=lambda m: None)
  again = prepare.prepare("medreason", str(tmp_path), overwrite=True,
                          log=lambda m: None)
  assert again["draw"]["seed"] == 7
  perm = np.random.default_rng(7).permutation(hub_cache.SEEDED_POOL)
  keys = sorted({_digest(r["question"], r["options"])
                 for r in _medical_truth()[:hub_cache.SEEDED_POOL]})
  assert again["draw"]["ids"]["test"] == [keys[i] for i in perm[:500]]


def _release(tmp_path, test_ids, train_ids, extra_train=()):
  """A fake release dir in the layout of the self-distillation release's
  data/science_data: datasets save_to_disk directories of Arrow streams,
  train rows {messages: [system, user], output_text}, eval rows {prompt:
  [system, user], answer}."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top

  def turn(i):
    r = hub_cache.sciknoweval_row(i)
    opts = "\n".join(f"{k}. {t}" for k, t in zip(r["choices"]["label"],
                                                 r["choices"]["text"]))
    return f"{r['question']}\n\n{opts}\n\nPut the letter in <answer></answer>."

  system = {"role": "system", "content": "Reason in <reasoning>, answer in <answer>."}
  train = [{"messages": [system, {"role": "user", "content": turn(i)}],
            "output_text": f"<reasoning>work {i}</reasoning>\n<answer>"
                           f"{'ABCD'[i % 4]}</answer>"} for i in train_ids]
  train += list(extra_train)
  test = [{"prompt": [system, {"role": "user", "content": turn(i)}],
           "answer": "ABCD"[i % 4]} for i in test_ids]
  for sub, rows in (("train_data", train), ("eval_data", test)):
    os.makedirs(tmp_path / sub)
    table = pa.Table.from_pylist(rows)
    with pa.OSFile(str(tmp_path / sub / "data-00000-of-00001.arrow"), "wb") as f:
      with pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table)
    (tmp_path / sub / "state.json").write_text("{}")
  return str(tmp_path)


def test_split_dir_takes_the_release_splits_in_its_order(hf_cache, tmp_path):
  system = {"role": "system", "content": "x"}
  odd = [  # not in the pool; a wrong gold letter; a test question again
      {"messages": [system, {"role": "user", "content": "Which solvent?\n\nA. a"}],
       "output_text": "<answer>A</answer>"},
      {"messages": [system, {"role": "user", "content": "Chemistry question 101: "
                             "which reagent?\nA. reagent 101-0\nB. reagent 101-1\n"
                             "C. reagent 101-2\nD. reagent 101-3"}],
       "output_text": "<answer>D</answer>"},  # its gold is B
      {"messages": [system, {"role": "user", "content": "Chemistry question 3: "
                             "which reagent? A. reagent 3-0 B. reagent 3-1 "
                             "C. reagent 3-2 D. reagent 3-3"}],
       "output_text": "<answer>D</answer>"}]
  test_ids, train_ids = list(range(49, -1, -1)), list(range(102, 502))
  release = _release(tmp_path / "rel", test_ids, train_ids, odd)
  out = str(tmp_path / "data")
  record = prepare.prepare("sciknoweval", out, split_dir=release,
                           log=lambda m: None)
  assert record["records"] == {"test": 50, "train": 400}
  draw = record["draw"]
  assert draw["split_from"] == paper_mcq.RELEASE and "seed" not in draw
  assert draw["left_out_release"] == {"unmatched": 1, "ambiguous": 0,
                                      "answer_differs": 1, "in_both": 1}
  assert draw["release_rows"] == {"test": 50, "train": 403}
  assert draw["traces"] == {"test": 0, "train": 400}
  builder = builders.mcq_builder(dict(data_dir=out, source="sciknoweval"), "data")
  for split, ids in (("test", test_ids), ("train", train_ids)):
    got = builders.load_records(builder, split)
    assert [(r["question"], r["answer"]) for r in got] == [
        (f"Chemistry question {i}: which reagent?", "ABCD"[i % 4]) for i in ids]
  # The train records carry the release's worked traces; the test ones none.
  train = builders.load_records(builder, "train")
  assert [r["response"] for r in train] == [
      f"<reasoning>work {i}</reasoning>\n<answer>{'ABCD'[i % 4]}</answer>"
      for i in train_ids]
  assert tasks.reference_response(train[0]) == train[0]["response"]
  assert not any("response" in r for r in builders.load_records(builder, "test"))
  # Without --split_dir the same data_dir is refused: another rule.
  with pytest.raises(ValueError, match="split by another rule"):
    prepare.prepare("sciknoweval", out, log=lambda m: None)
  assert prepare.prepare("sciknoweval", out, split_dir=release,
                         log=lambda m: None) == record


def test_split_dir_bad_input(hf_cache, tmp_path):
  out = str(tmp_path / "data")
  with pytest.raises(ValueError, match="--split_dir: only for sciknoweval"):
    prepare.prepare("medreason", out, split_dir=str(tmp_path))
  with pytest.raises(ValueError, match="not a directory"):
    prepare.prepare("sciknoweval", out, split_dir=str(tmp_path / "nope"))
  (tmp_path / "empty").mkdir()
  with pytest.raises(ValueError, match=r"no Arrow file in .*eval_data"):
    prepare.prepare("sciknoweval", out, split_dir=str(tmp_path / "empty"),
                    log=lambda m: None)
  rel = _release(tmp_path / "rel", [], [1])
  with pytest.raises(ValueError, match="match no question of the pool"):
    prepare.prepare("sciknoweval", out, split_dir=rel, log=lambda m: None)
  bad = _release(tmp_path / "bad", [1], [2], [{"messages": [], "output_text": "x"}])
  with pytest.raises(ValueError, match=r"train_data.*row 1: no 'messages'"):
    prepare.prepare("sciknoweval", out, split_dir=bad, log=lambda m: None)
