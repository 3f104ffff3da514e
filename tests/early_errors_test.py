"""Bad settings found before anything is built or written (issue 31): the
teacher's top-k beyond the vocabulary, prompt + new tokens beyond a model's
max_position_embeddings, non-finite numbers, an output path of the wrong
kind, a grid whose arms or RLVR stage cannot run. Each used to surface at
step 1, after the models were built, or after the whole computation.

The expected limits come from the configs' own numbers (the runlocal tiny
models: vocabulary 320, max_position_embeddings 512), and "nothing built"
is checked by replacing the loaders with None.
"""
import math
import pathlib
import sys

import jax
import pytest

from jaxdistill import config_lib
from jaxdistill import analysis
from jaxdistill.rl import train as rl_train
from jaxdistill.sweep import runner
from jaxdistill.train import loop as train_loop
from jaxdistill.train import setup as train_setup

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from configs import distill  # pylint: disable=g-import-not-at-top,wrong-import-position
from configs import grpo_countdown  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests import config_util  # pylint: disable=g-import-not-at-top,wrong-import-position

ONE_DEVICE = [jax.devices()[0]]
TOPK = (r"config\.loss\.teacher_topk: 1000 exceeds the real vocabulary "
        r"\(320\)")


def _positions(model):
  return (r"config\.rollout\.max_new_tokens: data\.max_prompt_len \d+ \+ "
          rf"rollout\.max_new_tokens 600 = \d+ positions exceed the {model}'s "
          "max_position_embeddings 512")


@pytest.mark.parametrize("updates,match", [
    ({"loss.teacher_topk": 1000}, TOPK),
    ({"rollout.max_new_tokens": 600}, _positions("student")),
    ({"optim.lr": math.inf}, r"config\.optim\.lr: must be a finite number, "
     "got inf"),
    ({"teacher.temperature": math.inf}, r"config\.teacher\.temperature: must "
     "be"),
    # The temperatures are each model's own: the old shared fields are refused.
    ({"rollout.temperature": 1.0}, r"config\.rollout\.temperature: rollouts "
     "sample each model at its own temperature"),
    ({"loss.temperature": 1.0}, r"config\.loss\.temperature: the "
     "temperatures are each model's own"),
    ({"rollout.policy": "spectrum", "rollout.lam": 2.5},
     r"config\.rollout\.lam: must be in \[-2, 2\] for policy='spectrum'"),
    # Forward KL ignores beta, but its loss function still checks it.
    ({"loss.kind": "forward", "loss.beta": 1.5},
     r"config\.loss\.beta: must be in \[0, 1\], got 1\.5"),
    ({"loss.kind": "reverse", "loss.beta": -0.1}, r"config\.loss\.beta"),
])
def test_train_refuses_before_building_anything(tmp_path, monkeypatch,
                                                updates, match):
  monkeypatch.setattr(train_setup, "load_params", None)  # never reached
  c = config_util.set_fields(distill.get_config("runlocal"), updates)
  with pytest.raises(ValueError, match=match):
    train_loop.train(c, str(tmp_path / "w"), devices=ONE_DEVICE)
  assert not (tmp_path / "w" / "config.json").exists()


@pytest.mark.parametrize("updates,match", [
    ({"rollout.max_new_tokens": 600}, _positions("policy")),
    ({"optim.lr": math.inf}, r"config\.optim\.lr: must be a finite number"),
])
def test_grpo_refuses_before_building_anything(tmp_path, monkeypatch, updates,
                                               match):
  monkeypatch.setattr(train_setup, "load_params", None)
  c = config_util.set_fields(grpo_countdown.get_config("runlocal"), updates)
  with pytest.raises(ValueError, match=match):
    rl_train.train(c, str(tmp_path / "w"), devices=ONE_DEVICE)
  assert not (tmp_path / "w" / "config.json").exists()


def test_analysis_refuses_before_computing(tmp_path, monkeypatch):
  monkeypatch.setattr(train_setup, "load_params", None)
  (tmp_path / "file").write_text("x")
  c = distill.get_config("runlocal")
  with pytest.raises(ValueError, match=f"--out: {tmp_path / 'file'} is a "
                     "file; give a directory"):
    analysis.run(c, [0.0, 1.0], out_dir=str(tmp_path / "file"),
                 devices=ONE_DEVICE)
  c = config_util.set_fields(distill.get_config("runlocal"),
                             {"loss.kind": "reverse", "loss.teacher_topk": 1000})
  with pytest.raises(ValueError, match=TOPK):
    analysis.run(c, [0.0, 1.0], devices=ONE_DEVICE)


@pytest.mark.parametrize("arg,match", [
    ("lr=-1", r"run 'train_n=3,.*': config\.optim\.lr: must be > 0"),
    ("rl_lr=-1", r"grid\.rlvr: config\.optim\.lr: must be > 0"),
    ("lr=inf", r"config\.optim\.lr: must be a finite number"),
])
def test_sweep_refuses_a_bad_arm_before_writing_its_workdir(tmp_path, arg,
                                                            match):
  """The harder grid's lr and rl_lr under runlocal used to be dropped."""
  grid = config_lib.load_config(
      f"configs/grid_countdown_harder.py:runlocal,{arg}")
  with pytest.raises(ValueError, match=match):
    runner.run_sweep(grid, str(tmp_path / "sweep"), devices=ONE_DEVICE)
  assert not (tmp_path / "sweep").exists()


def test_sweep_refuses_an_arm_beyond_the_vocabulary(tmp_path):
  grid = config_lib.load_config("configs/grid_topk.py:runlocal")
  grid.axes = tuple((n, f, (8, 1000) if n == "topk" else v)
                    for n, f, v in grid.axes)
  with pytest.raises(ValueError, match=r"run 'topk=1000,.*': " + TOPK):
    runner.run_sweep(grid, str(tmp_path / "sweep"), devices=ONE_DEVICE)
  assert not (tmp_path / "sweep").exists()
