"""A sweep whose workdir is gs:// (against tests/gcs_emulator.py): its arms,
results, evaluations and summary land in the bucket and equal a local
sweep's; a second invocation redoes nothing; a stale arm is moved into
stale/ on the bucket; the inputs it reads as local files (prepared data)
stay on the local disk, and nothing named gs: is written locally."""
import csv
import io
import json
import os
import pathlib

import jax
import numpy as np
import pytest

from jaxdistill import config_lib
from jaxdistill import storage
from jaxdistill.sweep import runner
from jaxdistill.train import loop as train_loop
from tests import gcs_emulator
from tests.gcs_emulator import gcs  # pylint: disable=unused-import  # a fixture

GS = f"gs://{gcs_emulator.BUCKET}"
ONE_DEVICE = [jax.devices()[0]]
ROOT = pathlib.Path(__file__).resolve().parents[2]


def _grid():
  g = config_lib.load_config("configs/grid_main.py:runlocal,axes=policy")
  g.base.total_steps = g.base.ckpt_every = 1
  return g


def _json(path):
  return json.loads(storage.read_text(str(path)))


@pytest.mark.slow  # two 2-arm runlocal sweeps, evaluated
def test_a_gs_sweep_equals_a_local_one(gcs, tmp_path, monkeypatch):
  del gcs
  monkeypatch.setenv(storage.MIRROR_ENV, str(tmp_path / "mirror"))
  monkeypatch.chdir(tmp_path)
  local = tmp_path / "local"
  runner.run_sweep(_grid(), str(local), devices=ONE_DEVICE)
  w = f"{GS}/sweeps/main"
  runner.run_sweep(_grid(), w, devices=ONE_DEVICE)

  arms = sorted(d.name for d in local.iterdir()
                if (d / "results.json").exists())
  assert len(arms) == 2
  assert sorted(n for n in storage.listdir(w)
                if storage.isfile(f"{w}/{n}/results.json")) == arms
  for arm in arms:
    a, b = _json(local / arm / "results.json"), _json(f"{w}/{arm}/results.json")
    assert a["study"] == b["study"] and a["factors"] == b["factors"]
    assert sorted(a["eval"]) == sorted(b["eval"])
    for k, v in a["eval"].items():
      assert v == pytest.approx(b["eval"][k], rel=1e-5, abs=1e-7), k
    for k in ("train/loss", "train/grad_norm"):
      assert a["train"][k] == pytest.approx(b["train"][k], rel=1e-6), k
    assert storage.isfile(f"{w}/{arm}/hf_student/config.json")
    assert storage.isfile(f"{w}/{arm}/eval.json")
  # The summary, uploaded, tabulates the same numbers.
  with open(local / "summary" / "results.csv") as f:
    want = list(csv.DictReader(f))
  got = list(csv.DictReader(io.StringIO(
      storage.read_text(f"{w}/summary/results.csv"))))
  assert [r["arm"] for r in got] == [r["arm"] for r in want]
  assert "paper_fig1.png" in storage.listdir(f"{w}/summary")
  # The runlocal assets are in the bucket; the prepared data on this disk.
  assert storage.isfile(f"{w}/assets/student/config.json")
  data_dir = _json(f"{w}/{arms[0]}/config.json")["data"]["data_dir"]
  assert data_dir is None or data_dir.startswith(str(tmp_path / "mirror"))
  assert not os.path.exists(tmp_path / "gs:") and not os.path.exists(
      ROOT / "gs:")

  # Again: nothing trains or evaluates.
  def boom(*a, **k):
    raise AssertionError("work was redone")
  monkeypatch.setattr(train_loop, "train", boom)
  runner.run_sweep(_grid(), w, devices=ONE_DEVICE, evaluate_fn=boom)
  monkeypatch.undo()
  monkeypatch.setenv(storage.MIRROR_ENV, str(tmp_path / "mirror"))

  # A setting changed outside the axes: refused, then moved into stale/.
  g = _grid()
  g.base.optim.lr = 7e-3
  with pytest.raises(ValueError, match="trained under a different config"):
    runner.run_sweep(g, w, devices=ONE_DEVICE, only="policy=student",
                     evaluate_fn=lambda *a: None)
  runner.run_sweep(g, w, devices=ONE_DEVICE, only="policy=student",
                   rerun_stale=True, evaluate_fn=lambda *a: None,
                   summarize=False)
  stale = storage.listdir(f"{w}/{runner.STALE_DIR}")
  assert len(stale) == 1 and stale[0].startswith("policy=student")
  moved = f"{w}/{runner.STALE_DIR}/{stale[0]}"
  assert _json(f"{moved}/config.json")["optim"]["lr"] != 7e-3
  assert storage.isfile(f"{moved}/results.json")
  student = [a for a in arms if a.startswith("policy=student")][0]
  assert _json(f"{w}/{student}/config.json")["optim"]["lr"] == 7e-3
  np.testing.assert_equal(_json(f"{w}/{student}/results.json")["eval"], None)
