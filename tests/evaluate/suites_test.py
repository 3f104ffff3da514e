"""Suites from configs/eval.py: names, Countdown test splits, MCQ files, errors."""
import importlib.util
import json
import pathlib

import pytest

from jaxdistill.data import sources
from jaxdistill.evaluate import suites
from jaxdistill.tasks import countdown

ROOT = pathlib.Path(__file__).resolve().parents[2]


def get_config(arg=None):
  spec = importlib.util.spec_from_file_location("eval_cfg", ROOT / "configs/eval.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config(arg)


def write_jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


ROWS = [{"question": f"Q{i}?", "options": ["x", "y", "z"], "answer": "ABC"[i % 3]}
        for i in range(7)]


def test_config_variants():
  # The default: forgetting on the paper's seven lm-eval benchmarks.
  c = get_config()
  assert c.eval_suites == ("countdown3_paper", "countdown4e", "lmeval")
  assert c.in_distribution == ("countdown3_paper",)
  assert c.ood == ("lmeval",) and c.harder == ("countdown4e",)
  assert c.suites.countdown4e.source == "countdown4e"
  # forgetting=suites: the other study tasks instead.
  c = get_config("forgetting=suites")
  assert c.eval_suites == ("countdown3_paper", "countdown4e", "science",
                           "medical")
  assert c.ood == ("science", "medical") and c.harder == ("countdown4e",)
  c = get_config("task=medical,forgetting=suites")
  assert c.in_distribution == ("medical",) and "countdown3_paper" in c.ood
  c = get_config("task=medical")
  assert c.eval_suites == ("medical", "lmeval") and c.ood == ("lmeval",)
  # An explicit suites= list is evaluated as given, its OOD the task's.
  c = get_config("task=science,suites=science+medical")
  assert c.eval_suites == ("science", "medical") and c.ood == ("medical",)
  c = get_config("suites=countdown3+countdown6,ood=")
  assert c.eval_suites == ("countdown3", "countdown6") and c.ood == ()
  assert c.harder == ("countdown6",)
  c = get_config("runlocal")
  assert suites.check_names(c) == ("countdown3", "countdown5")
  with pytest.raises(ValueError, match="task"):
    get_config("task=poetry")


def test_unknown_or_misplaced_suite_is_named():
  c = get_config("runlocal,suites=countdown3+countdown9")
  with pytest.raises(ValueError, match=r"unknown suite\(s\) \['countdown9'\]"):
    suites.check_names(c)
  c = get_config("runlocal,ood=countdown4")
  with pytest.raises(ValueError, match=r"config.ood: .*countdown4"):
    suites.check_names(c)


def test_countdown_suite_is_the_solvable_test_split():
  c = get_config("runlocal")
  recs = suites.load_suites(c)
  assert [len(r) for r in recs.values()] == [4, 4]
  for name, n in (("countdown3", 3), ("countdown5", 5)):
    for r in recs[name]:
      assert len(r["numbers"]) == n
      assert countdown.target_split(r["target"]) == "test"
      done = countdown.reference_completion(r["numbers"], r["target"], r["solution"])
      assert countdown.reward(done, r["numbers"], r["target"]) == 1.0
  assert suites.load_suites(c) == recs  # deterministic


def test_mcq_file_suite_subset(tmp_path):
  path = write_jsonl(tmp_path / "test.jsonl", ROWS)
  spec = dict(kind="mcq", path=path, source="generic", num_problems=3, data_seed=1)
  got = suites.suite_records("science", spec)
  assert len(got) == 3
  idx = [int(r["question"][1:-1]) for r in got]
  assert idx == sorted(idx)  # file order kept
  assert all(r == {**ROWS[i]} for r, i in zip(got, idx))
  assert suites.suite_records("science", spec) == got
  everything = suites.suite_records("science", dict(spec, num_problems=None))
  assert everything == ROWS


def test_mcq_errors_name_field_file_and_line(tmp_path):
  with pytest.raises(ValueError, match=r"config.suites.science.path: not set"):
    suites.suite_records("science", dict(kind="mcq", path=None))
  missing = str(tmp_path / "nope.jsonl")
  with pytest.raises(FileNotFoundError, match=r"config.suites.science.path.*nope.jsonl"):
    suites.suite_records("science", dict(kind="mcq", path=missing))
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
  with pytest.raises(sources.DataError, match=r"bad.jsonl:2"):
    suites.suite_records("science", dict(kind="mcq", path=str(bad)))
  with pytest.raises(ValueError, match=r"config.suites.science.source"):
    suites.suite_records("science", dict(kind="mcq", path=str(bad), source="x"))
  with pytest.raises(ValueError, match=r"config.suites.s.kind"):
    suites.suite_records("s", dict(kind="poems"))
  with pytest.raises(ValueError, match=r"config.suites.c.num_problems"):
    suites.suite_records("c", dict(kind="countdown", n_numbers=3, num_problems=0))


@pytest.mark.parametrize("options,words", [
    ([None, "Paris"], r"'options'\[0\] \(option A\) must be text, got null"),
    (["Paris", {"text": "Rome"}], r"'options'\[1\] \(option B\) must be text, "
     r"got \{\"text\": \"Rome\"\}"),
    (["Paris", ["Rome"]], r"'options'\[1\]"),
    (["Paris", True], r"'options'\[1\] \(option B\) must be text, got true"),
])
def test_mcq_options_that_are_not_text_are_refused(tmp_path, options, words):
  """They used to be graded as the options "None" and "{'text': 'Rome'}"."""
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({"question": "Capital of France?",
                             "options": options, "answer": "A"}) + "\n")
  with pytest.raises(sources.DataError, match=rf"bad.jsonl:1: {words}"):
    suites.suite_records("science", dict(kind="mcq", path=str(bad)))
  # Numbers are texts a person reads (options "3", "4").
  bad.write_text(json.dumps({"question": "2+2?", "options": [3, 4],
                             "answer": "B"}) + "\n")
  assert suites.suite_records("science", dict(kind="mcq", path=str(bad)))[0][
      "options"] == ["3", "4"]
