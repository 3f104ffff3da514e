"""TFDS builders prepare array_record files and read back without TensorFlow."""
import importlib.util
import json
import re
import shutil
import sys

import grain
import pytest
import tensorflow_datasets as tfds

from jaxdistill.data import builders
from jaxdistill.tasks import countdown


def test_tensorflow_is_absent():
  # The point of the builders: this environment has no TensorFlow at all.
  assert importlib.util.find_spec("tensorflow") is None
  with pytest.raises(ImportError):
    import tensorflow  # noqa: F401


def test_countdown_builder_round_trip(tmp_path):
  cfg = builders.CountdownConfig(name="n4_tiny", n_numbers=4, train_size=30,
                                 test_size=10, seed=5)
  b = builders.prepare(builders.CountdownTasks, data_dir=str(tmp_path), config=cfg)
  files = sorted(p.name for p in (tmp_path / "countdown_tasks" / "n4_tiny" /
                                  "1.0.0").iterdir())
  assert any(".array_record" in f for f in files), files
  for split, size in (("train", 30), ("test", 10)):
    got = builders.load_records(b, split)
    want = [p.to_record() for p in countdown.generate_problems(4, size, 5, split=split)]
    key = lambda r: (tuple(r["numbers"]), r["target"], r["solution"])
    assert sorted(map(key, got)) == sorted(map(key, want))
  # grain reads the random-access source directly.
  ds = grain.MapDataset.source(b.as_data_source(split="test"))
  assert len(ds) == 10 and int(ds[3]["target"]) >= 1
  assert "tensorflow" not in sys.modules


def test_mcq_builder_from_manual_dir(tmp_path):
  manual = tmp_path / "downloads"
  manual.mkdir()
  rows = [{"question": f"q{i}", "opa": "a", "opb": "b", "opc": "c", "opd": "d",
           "cop": i % 4} for i in range(8)]
  (manual / "train.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
  (manual / "dev.json").write_text(json.dumps(rows[0]) + "\n")
  data_dir = str(tmp_path / "tfds")
  b = builders.prepare(builders.McqFiles, data_dir=data_dir, config="medmcqa",
                       manual_dir=str(manual))
  assert set(b.info.splits) == {"train", "validation"}
  train = builders.load_records(b, "train")
  assert sorted((r["question"], r["answer"]) for r in train) == sorted(
      (f"q{i}", "ABCD"[i % 4]) for i in range(8))
  assert all(r["options"] == ["a", "b", "c", "d"] for r in train)
  # The public entry point, by registered name, also works without TensorFlow.
  src = tfds.data_source("mcq_files/medmcqa", split="validation", data_dir=data_dir)
  assert builders.to_record(src[0]) == {"question": "q0", "options": ["a", "b", "c", "d"],
                                        "answer": "A"}
  assert "tensorflow" not in sys.modules


def test_builder_errors(tmp_path):
  with pytest.raises(ValueError, match="data_dir"):
    builders.prepare(builders.CountdownTasks, data_dir="")
  with pytest.raises(FileNotFoundError, match="manual_dir"):
    builders.prepare(builders.McqFiles, data_dir=str(tmp_path), config="generic",
                     manual_dir=str(tmp_path / "missing"))
  manual = tmp_path / "m"
  manual.mkdir()
  (manual / "test.jsonl").write_text('{"question": "q", "options": ["a"], "answer": "A"}\n')
  with pytest.raises(Exception, match=r"test\.jsonl:1"):
    builders.prepare(builders.McqFiles, data_dir=str(tmp_path / "d"),
                     config="generic", manual_dir=str(manual))


def test_damaged_prepared_data_names_the_file(tmp_path):
  cfg = builders.CountdownConfig(name="n3_dmg", n_numbers=3, train_size=6,
                                 test_size=2, seed=1)
  prep = lambda: builders.prepare(builders.CountdownTasks,
                                  data_dir=str(tmp_path), config=cfg)
  want = builders.load_records(prep(), "train")
  version_dir = tmp_path / "countdown_tasks" / "n3_dmg" / "1.0.0"
  (shard,) = version_dir.glob("countdown_tasks-train.array_record*")
  shard.write_bytes(shard.read_bytes()[:1000])   # truncated
  with pytest.raises(ValueError) as e:
    builders.load_records(prep(), "train")
  msg = str(e.value)
  assert msg.startswith(f"{shard}: damaged prepared data (") and "\n" not in msg
  assert f"delete {version_dir} " in msg
  assert builders.load_records(prep(), "test")   # the other split is intact
  # What the message says to do works: the data is prepared again.
  shutil.rmtree(version_dir)
  assert builders.load_records(prep(), "train") == want
  info = version_dir / "dataset_info.json"
  info.write_text(info.read_text()[:40])
  with pytest.raises(ValueError, match=rf"^{re.escape(str(info))}: damaged "):
    prep()
