"""A sweep's shared teacher rollouts (grid.share_teacher_rollouts): a
runlocal grid with two teacher-policy arms that differ only in learning rate
decodes one teacher rollout per step, and its tables, metrics and exports
equal those of the same sweep without sharing; the printed launch commands
pass --shared_rollouts to the teacher-policy arms only."""
import json
import os
import pathlib
import shlex

import jax
import pytest

from jaxdistill import config_lib
from jaxdistill import rollout
from jaxdistill.sweep import grid as grid_lib
from jaxdistill.sweep import runner
from jaxdistill.train import log as train_log
from jaxdistill.train import shared_rollouts as shared_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
ONE_DEVICE = [jax.devices()[0]]
SPEC = "configs/grid_main.py:runlocal,axes=policy+lr"


@pytest.fixture
def teacher_calls(monkeypatch):
  calls = []
  orig = rollout.generate

  def counting(*a, **k):
    calls.append(k.get("policy"))
    return orig(*a, **k)
  monkeypatch.setattr(rollout, "generate", counting)
  return calls


def _sweep(work, share):
  g = config_lib.load_config(SPEC)
  assert g.share_teacher_rollouts  # the study grids' default
  g.share_teacher_rollouts = share
  runner.run_sweep(g, str(work), devices=ONE_DEVICE, only="policy=teacher")
  return [r for r in grid_lib.expand(g) if "policy=teacher" in r.name]


def _run_files(work, run):
  d = work / run.dirname
  metrics = [{k: v for k, v in r.items()
              if not k.startswith("perf/") and k != "time"}
             for r in train_log.read_metrics(str(d))]
  return (metrics, json.loads((d / "eval.json").read_text())["metrics"],
          (d / "hf_student" / "model.safetensors").read_bytes())


@pytest.mark.slow  # two sweeps of two tiny arms, evaluated
def test_two_teacher_arms_decode_once_per_step_and_equal_the_unshared_sweep(
    tmp_path, teacher_calls):
  shared, alone = tmp_path / "shared", tmp_path / "alone"
  runs = _sweep(shared, True)
  assert len(runs) == 2 and {r.factors["lr"] for r in runs} == {1e-3, 5e-3}
  steps = int(runs[0].config.total_steps)
  trained = teacher_calls.count("teacher")
  assert trained == steps  # one generation per step for both arms
  (key,) = os.listdir(shared / grid_lib.SHARED_DIR)
  assert sorted(os.listdir(shared / grid_lib.SHARED_DIR / key)) == [
      "meta.json"] + [f"step_{s:06d}.npz" for s in range(steps)]

  _sweep(alone, False)
  assert teacher_calls.count("teacher") == trained + 2 * steps
  assert not (alone / grid_lib.SHARED_DIR).exists()
  for name in ("results.csv", "results.md"):
    assert ((shared / "summary" / name).read_text() ==
            (alone / "summary" / name).read_text())
  for run in runs:
    assert _run_files(shared, run) == _run_files(alone, run), run.name


def test_printed_commands_pass_the_store_to_teacher_arms_only(tmp_path):
  g = config_lib.load_config(SPEC)
  runs = grid_lib.expand(g)
  store = str(tmp_path / grid_lib.SHARED_DIR)
  for run in runs:
    argv = shlex.split(grid_lib.command(g, run, str(tmp_path)))
    assert argv[-2:] == ["--workdir", str(tmp_path / run.dirname)]
    teacher = run.config.rollout.policy == "teacher"
    assert (argv[-4:-2] == ["--shared_rollouts", store]) == teacher, run.name
    assert ("--shared_rollouts" in argv) == teacher
  g.share_teacher_rollouts = False
  assert not any("--shared_rollouts" in grid_lib.command(g, r, str(tmp_path))
                 for r in runs)


def test_the_spectrum_grid_shares_only_its_teacher_endpoint_per_seed():
  """grid_spectrum at seeds=3: the lambda = -1 arms of a seed (2 KLs x 2
  rates, a hand count) form one sharing group; no other lambda shares."""
  grid = config_lib.load_config("configs/grid_spectrum.py:seeds=3")
  runs = grid_lib.expand(grid, None)
  assert len(runs) == 2 * 9 * 2 * 3
  groups = {}
  for run in runs:
    shares = grid_lib.shares_rollouts(grid, run)
    assert shares == (run.config.rollout.lam == -1.0), run.name
    if shares:
      groups.setdefault(shared_lib.group(run.config), set()).add(
          (run.config.seed, run.config.loss.kind, run.config.optim.lr))
  assert sorted(len(g) for g in groups.values()) == [4, 4, 4]
  assert sorted({s for g in groups.values() for s, _, _ in g}) == [42, 43, 44]
  assert all(len({s for s, _, _ in g}) == 1 for g in groups.values())
