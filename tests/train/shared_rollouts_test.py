"""Shared teacher rollouts (train/shared_rollouts.py): runs of one key read
the steps another run decoded and train on the same arrays; a run whose
key differs (another teacher temperature) decodes its own; the store's
files are written first-writer-wins."""
import json
import os
import pathlib
import shutil
import sys

import jax
import numpy as np
import pytest

from jaxdistill import rollout
from jaxdistill.train import log as train_log
from jaxdistill.train import loop as train_loop
from jaxdistill.train import shared_rollouts as shared_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from configs import \
    distill as distill_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests import config_util

ONE_DEVICE = [jax.devices()[0]]


def _config(arg="runlocal,policy=teacher", **updates):
  c = distill_config.get_config(arg)
  c.progress = False
  c.export_hf = False
  return config_util.set_fields(c, {"total_steps": 2, "ckpt_every": 2,
                                    "eval_every": 2, **updates})


@pytest.fixture
def teacher_calls(monkeypatch):
  """The policies of every rollout.generate call, in order."""
  calls = []
  orig = rollout.generate

  def counting(*a, **k):
    calls.append(k.get("policy"))
    return orig(*a, **k)
  monkeypatch.setattr(rollout, "generate", counting)
  return calls


def _metrics(workdir):
  return [{k: v for k, v in r.items()
           if not k.startswith("perf/") and k != "time"}
          for r in train_log.read_metrics(str(workdir))]


def _first_run(tmp_path):
  """A 2-step teacher-policy run in tmp_path/a filling tmp_path/shared."""
  store = tmp_path / "shared"
  train_loop.train(_config(), str(tmp_path / "a"), devices=ONE_DEVICE,
                   shared_rollouts=str(store))
  return store


def _keys(store):
  return sorted(os.listdir(store)) if os.path.isdir(store) else []


@pytest.mark.slow  # five tiny runs of 2 steps
def test_a_run_of_the_same_key_reads_another_of_a_different_key_decodes(
    tmp_path, teacher_calls):
  store = _first_run(tmp_path)
  assert teacher_calls == ["teacher"] * 2  # one per step
  (key,) = _keys(store)
  assert sorted(os.listdir(store / key)) == [
      "meta.json", "step_000000.npz", "step_000001.npz"]

  # Another learning rate and KL: the same key; nothing is decoded.
  b = _config("runlocal,policy=teacher,kl=reverse", **{"optim.lr": 5e-3})
  train_loop.train(b, str(tmp_path / "b"), devices=ONE_DEVICE,
                   shared_rollouts=str(store))
  assert teacher_calls == ["teacher"] * 2 and _keys(store) == [key]
  # ... and it trained on what it would have decoded itself: every logged
  # metric (loss, rollout lengths, sparsity) of the unshared run.
  train_loop.train(b, str(tmp_path / "b_alone"), devices=ONE_DEVICE)
  assert teacher_calls == ["teacher"] * 4
  assert _metrics(tmp_path / "b") == _metrics(tmp_path / "b_alone")
  with np.load(store / key / "step_000001.npz") as z:
    assert z["tokens"].shape == (4, 8 + 8)  # runlocal: batch 4, 8 + 8 tokens

  # Another teacher temperature (runlocal's teacher samples at 0.5): another
  # key, decoded and stored apart.
  c = _config(**{"rollout.teacher_temperature": 1.0})
  train_loop.train(c, str(tmp_path / "c"), devices=ONE_DEVICE,
                   shared_rollouts=str(store))
  assert teacher_calls == ["teacher"] * 6
  assert len(_keys(store)) == 2
  other = (set(_keys(store)) - {key}).pop()
  meta = json.loads((store / other / "meta.json").read_text())
  assert meta["temperature"] == 1.0
  assert json.loads((store / key / "meta.json").read_text())[
      "temperature"] == 0.5


def test_a_student_policy_run_is_refused_before_anything_is_written(tmp_path):
  with pytest.raises(ValueError, match=r"^--shared_rollouts: only "
                     r"teacher-policy rollouts .*policy='student'$"):
    train_loop.train(_config("runlocal"), str(tmp_path / "w"),
                     devices=ONE_DEVICE,
                     shared_rollouts=str(tmp_path / "shared"))
  assert os.listdir(tmp_path) == []


def test_the_first_writer_of_a_step_wins_and_a_bad_file_is_named(tmp_path):
  made_from = {"any": "description"}
  one = shared_lib.Store(str(tmp_path), made_from)
  two = shared_lib.Store(str(tmp_path), made_from)  # a second worker
  assert one.directory == two.directory
  first = {"tokens": np.arange(6, dtype=np.int32).reshape(2, 3)}
  one.put(0, first, {"rollout/len": 1.5})
  two.put(0, {"tokens": np.zeros((2, 3), np.int32)}, {"rollout/len": 9.0})
  arrays, metrics = two.get(0)
  np.testing.assert_array_equal(arrays["tokens"], first["tokens"])
  assert arrays["tokens"].dtype == np.int32 and metrics == {"rollout/len": 1.5}
  assert sorted(os.listdir(one.directory)) == ["meta.json", "step_000000.npz"]
  assert two.get(1) is None
  with open(one.path(1), "wb") as f:
    f.write(b"not an npz")
  with pytest.raises(ValueError, match=f"^--shared_rollouts: {one.path(1)} "
                     "is unreadable"):
    one.get(1)
  # A meta.json that is not this key's description is refused.
  with open(os.path.join(one.directory, "meta.json"), "w") as f:
    json.dump({"other": 1}, f)
  with pytest.raises(ValueError, match="describes other rollouts"):
    shared_lib.Store(str(tmp_path), made_from)


EXPECT = {"tokens": (2, 5), "attention_mask": (2, 5), "loss_mask": (2, 5)}


def _step(width=4, fill=0):
  return {k: np.full((2, width), fill, np.int32) for k in EXPECT}


def _refused(directory, match, made_from=None):
  with pytest.raises(ValueError, match=match):
    shared_lib.Store(directory, made_from or {"any": 1}, expect=EXPECT)


def test_a_damaged_store_is_refused_when_opened_naming_the_file(tmp_path):
  """Each damage, on its own copy of a good store of steps 0 and 1: the
  store's open (before a run computes or writes) names the file; the good
  store opens and serves both steps."""
  good = tmp_path / "good"
  store = shared_lib.Store(str(good), {"any": 1}, expect=EXPECT)
  store.put(0, _step(fill=0), {"rollout/len": 1.0})
  store.put(1, _step(fill=1), {"rollout/len": 2.0})
  again = shared_lib.Store(str(good), {"any": 1}, expect=EXPECT)
  assert again.get(1)[0]["tokens"][0, 0] == 1 and again.get(1)[1] == {
      "rollout/len": 2.0}

  def damaged(name, damage):
    root = tmp_path / name
    shutil.copytree(good, root)
    d = root / store.key
    damage(d)
    return str(root), d

  root, d = damaged("copied", lambda d: shutil.copy(
      d / "step_000000.npz", d / "step_000001.npz"))
  _refused(root, rf"{d}/step_000001.npz holds step 0, not 1; delete it")
  root, d = damaged("truncated", lambda d: (d / "step_000001.npz").write_bytes(
      (d / "step_000001.npz").read_bytes()[:-100]))
  _refused(root, rf"{d}/step_000001.npz is unreadable")

  def narrower(d):  # a step of width 3 with a matching entry
    other = shared_lib.Store(str(d.parent), {"any": 1})
    os.remove(d / "step_000001.npz")
    other.put(1, {**_step(), "loss_mask": np.ones((2, 3), np.int32)}, {})
  root, d = damaged("narrower", narrower)
  _refused(root, r"step_000001.npz holds arrays of widths \[3, 4\], which "
           "must be one")

  def wider(d):
    os.remove(d / "step_000001.npz")
    shared_lib.Store(str(d.parent), {"any": 1}).put(1, _step(width=6), {})
  root, d = damaged("wider", wider)
  _refused(root, r"holds tokens of shape \(2, 6\); this run's is "
           r"\[2, at most 5\]")

  def fewer(d):
    os.remove(d / "step_000001.npz")
    shared_lib.Store(str(d.parent), {"any": 1}).put(
        1, {"tokens": np.zeros((2, 4), np.int32)}, {})
  root, d = damaged("fewer", fewer)
  _refused(root, r"holds the arrays \['tokens'\]; this run's batch has")

  def edited(d):  # arrays rewritten, the old entry kept
    with np.load(d / "step_000001.npz") as z:
      held = {k: z[k] for k in z.files}
    held["tokens"] = held["tokens"] + 1
    np.savez(d / "step_000001.npz", **held)
  root, d = damaged("edited", edited)
  _refused(root, "does not match its entry")

  def unmarked(d):  # written without an entry (another writer, old files)
    np.savez(d / "step_000001.npz", **_step())
  root, d = damaged("unmarked", unmarked)
  _refused(root, "has no entry")

  def foreign(d):  # another store's step file
    other = shared_lib.Store(str(tmp_path / "other"), {"other": 2})
    other.put(1, _step(), {})
    shutil.copy(other.path(1), d / "step_000001.npz")
  root, d = damaged("foreign", foreign)
  _refused(root, "belongs to the rollouts")

  root, d = damaged("meta", lambda d: (d / "meta.json").write_text("{"))
  _refused(root, "meta.json: not valid JSON")
  (tmp_path / "a_file").write_text("")
  _refused(str(tmp_path / "a_file"), "a_file is a file, not a directory$")


@pytest.mark.slow  # one tiny run of 2 steps
def test_a_run_is_refused_a_damaged_store_before_writing_its_workdir(
    tmp_path, teacher_calls):
  store = _first_run(tmp_path)
  (key,) = _keys(store)
  shutil.copy(store / key / "step_000000.npz", store / key / "step_000001.npz")
  with pytest.raises(ValueError, match="step_000001.npz holds step 0, not 1"):
    train_loop.train(_config("runlocal,policy=teacher,kl=reverse"),
                     str(tmp_path / "b"), devices=ONE_DEVICE,
                     shared_rollouts=str(store))
  assert not (tmp_path / "b").exists() or not os.listdir(tmp_path / "b")
  assert teacher_calls == ["teacher"] * 2  # only run a's


def test_the_store_key_changes_when_data_dir_is_prepared_again(tmp_path):
  from jaxdistill.train import teacher_cache  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  c = ml_collections.ConfigDict({"data": {"data_dir": str(tmp_path),
                                          "task": "mcq"}})
  record = tmp_path / "prepared" / "sciknoweval.json"
  record.parent.mkdir()
  record.write_text(json.dumps({"repo": "r", "commit": "aaa", "records": {}}))
  info = tmp_path / "mcq_files" / "sciknoweval" / "1.0.0" / "dataset_info.json"
  info.parent.mkdir(parents=True)
  info.write_text("{}")
  first = teacher_cache.data_fingerprint(c)
  assert sorted(first["data_dir"]) == [
      "mcq_files/sciknoweval/1.0.0/dataset_info.json",
      "prepared/sciknoweval.json"]
  record.write_text(json.dumps({"repo": "r", "commit": "bbb", "records": {}}))
  assert teacher_cache.data_fingerprint(c) != first
