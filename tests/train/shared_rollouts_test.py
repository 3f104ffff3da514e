"""Shared teacher rollouts (train/shared_rollouts.py): runs of one key read
the steps another run decoded and train on the same arrays; a run whose
key differs (another teacher temperature) decodes its own; the store's
files are written first-writer-wins."""
import json
import os
import pathlib
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


def _keys(store):
  return sorted(os.listdir(store)) if os.path.isdir(store) else []


@pytest.mark.slow  # five tiny runs of 2 steps
def test_a_run_of_the_same_key_reads_another_of_a_different_key_decodes(
    tmp_path, teacher_calls):
  store = tmp_path / "shared"
  train_loop.train(_config(), str(tmp_path / "a"), devices=ONE_DEVICE,
                   shared_rollouts=str(store))
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
