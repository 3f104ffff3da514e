"""`python -m jaxdistill.data.prepare countdown3|countdown4e|countdown4` end to
end on a tmp dir, data configs / eval suites reading what it wrote, and the
Table 1 MCQ prompts chosen by data.prompt / a suite's prompt."""
import json
import os

import ml_collections
import pytest

from jaxdistill import tasks
from jaxdistill.data import pipeline
from jaxdistill.data import prepare
from jaxdistill.evaluate import suites
from jaxdistill.tasks import countdown as cd
from jaxdistill.tasks import mcq


def test_prepare_all_three_and_read_back(tmp_path):
  out = str(tmp_path)
  prepare.main(["countdown3", "--data_dir", out])
  prepare.main(["countdown4e", "--data_dir", out])
  prepare.main(["countdown4", "--data_dir", out])
  with open(os.path.join(out, "prepared", "countdown3.json")) as f:
    rec = json.load(f)
  assert rec["records"] == {"train": 5000, "test": 500}
  assert rec["preset"]["splits"] == {"train": {"count": 5000, "seed": 42},
                                     "test": {"count": 500, "seed": 43}}
  assert rec["overlap"] == cd.overlap(cd.paper_problems("countdown3", "train"),
                                      cd.paper_problems("countdown3", "test"))
  with open(os.path.join(out, "prepared", "countdown4.json")) as f:
    assert json.load(f)["records"] == {"train": 5000}
  data = ml_collections.ConfigDict(dict(task="countdown", source="countdown3",
                                        split="test", data_dir=out))
  got = pipeline.records_from_config(data)
  want = [dict(p.to_record(), variant="countdown3")
          for p in cd.paper_problems("countdown3", "test")]
  assert got == want
  data.data_dir = None  # Generated in memory: the same records.
  assert pipeline.records_from_config(data) == want
  spec = ml_collections.ConfigDict(dict(kind="countdown", source="countdown4e",
                                        data_dir=out, num_problems=200))
  recs = suites.suite_records("countdown4e", spec)
  assert len(recs) == 200 and all(len(r["numbers"]) == 4 for r in recs)
  assert recs[0]["variant"] == "countdown4e"
  spec = ml_collections.ConfigDict(dict(kind="countdown", source="countdown3",
                                        data_dir=out, num_problems=None,
                                        unseen=True))
  fresh = suites.suite_records("countdown3_paper", spec)
  want_fresh = cd.unseen(cd.paper_problems("countdown3", "train"),
                         cd.paper_problems("countdown3", "test"))
  assert [r["target"] for r in fresh] == [p.target for p in want_fresh]
  assert len(fresh) == 500 - rec["overlap"]["problems"]
  # A second prepare is a no-op with the same record.
  prepare.main(["countdown3", "--data_dir", out])
  with open(os.path.join(out, "prepared", "countdown3.json")) as f:
    assert json.load(f) == rec


def test_bad_names_and_splits(tmp_path):
  with pytest.raises(ValueError, match="generated"):
    prepare.prepare("countdown3", str(tmp_path), revision="main")
  with pytest.raises(ValueError, match="--seed: countdown4 is the paper's"):
    prepare.main(["countdown4", "--data_dir", str(tmp_path), "--seed", "1"])
  data = ml_collections.ConfigDict(dict(task="countdown", source="countdown4e",
                                        split="train", data_dir=None))
  with pytest.raises(ValueError, match="data.split"):
    pipeline.records_from_config(data)
  with pytest.raises(ValueError, match="unseen"):
    pipeline.paper_countdown_records("countdown4e", "test", None, "data",
                                     unseen=True)
  data.source = "countdown7"
  with pytest.raises(ValueError, match="data.source"):
    pipeline.records_from_config(data)


def test_prompt_batches_use_table1_system_line(tiny_tokenizer):
  recs = [dict(p.to_record(), variant="countdown3")
          for p in cd.paper_problems("countdown3", "train", count=4)]
  b = pipeline.make_prompt_batches(recs, tiny_tokenizer, batch_size=2,
                                   max_prompt_len=1024, seed=0, shuffle=False,
                                   num_epochs=1)
  row = b[0]
  text = tiny_tokenizer.decode(row["prompt"][0][row["prompt_mask"][0] == 1])
  assert "You are a careful arithmetic solver." in text
  assert "Numbers: [" in text and "Target: " in text
  got = b.score(["<answer>" + recs[0]["solution"] + "</answer>",
                 "<answer>1+1=2</answer>"], row)
  assert list(got["reward"]) == [1.0, 0.0]


def test_mcq_table1_prompt_by_data_and_suite_field(tmp_path, tiny_tokenizer):
  files = tmp_path / "files"
  files.mkdir()
  rows = [{"question": "Which drug?", "options": ["a", "b", "c", "d"],
           "answer": "C"}]
  (files / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  data = ml_collections.ConfigDict(dict(
      task="mcq", source="generic", manual_dir=str(files),
      data_dir=str(tmp_path / "tfds"), split="test", prompt="medreason"))
  recs = pipeline.records_from_config(data)
  assert recs == [dict(rows[0], prompt="medreason")]
  assert tasks.prompt_messages(recs[0]) == mcq.medreason_prompt(
      "Which drug?", ["a", "b", "c", "d"])
  assert tasks.reference_response(recs[0]) == "<answer>C</answer>"
  b = pipeline.make_prompt_batches(recs, tiny_tokenizer, batch_size=1,
                                   max_prompt_len=1024, seed=0, shuffle=False,
                                   num_epochs=1)
  row = b[0]
  text = tiny_tokenizer.decode(row["prompt"][0][row["prompt_mask"][0] == 1])
  assert "You are a careful medical reasoning assistant." in text
  got = b.score(["<think>x</think><answer>C</answer>"], row)
  assert list(got["reward"]) == [1.0]
  spec = ml_collections.ConfigDict(dict(kind="mcq", source="generic",
                                        path=str(files / "test.jsonl"),
                                        prompt="science", num_problems=None))
  assert suites.suite_records("science", spec)[0]["prompt"] == "science"
  spec.prompt = "poetry"
  with pytest.raises(ValueError, match=r"config\.suites\.science\.prompt"):
    suites.suite_records("science", spec)
  data.prompt = "poetry"
  with pytest.raises(ValueError, match=r"data\.prompt"):
    pipeline.records_from_config(data)
