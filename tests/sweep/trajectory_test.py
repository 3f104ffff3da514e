"""Evaluation along the trajectory (App. A.3): config.export_every's exports,
every one evaluated by the sweep, the best reported (sweep/trajectory.py)."""
import json
import os
import pathlib

import jax
import numpy as np
import pytest

from jaxdistill import config_lib
from jaxdistill import models
from jaxdistill.evaluate import run as evaluate_run
from jaxdistill.sweep import grid as grid_lib
from jaxdistill.sweep import runner
from jaxdistill.sweep import trajectory
from jaxdistill.train import loop as train_loop

ONE_DEVICE = [jax.devices()[0]]


def _config(total, every):
  c = config_lib.load_config("configs/distill.py:runlocal")
  c.total_steps, c.export_every = total, every
  return c


def test_step_exports_are_every_n_steps_before_the_last():
  assert train_loop.step_exports(_config(1000, 100)) == list(range(100, 1000, 100))
  assert train_loop.step_exports(_config(250, 100)) == [100, 200]
  assert train_loop.step_exports(_config(100, 100)) == []
  assert train_loop.step_exports(_config(5, 0)) == []
  with pytest.raises(ValueError, match="export_every"):
    config_lib.validate_run(_config(5, -1))


def _fake_run(tmp_path, steps):
  for s in steps[:-1]:
    d = tmp_path / train_loop.step_export(s)
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
  (tmp_path / "hf_student").mkdir()
  (tmp_path / "hf_student" / "config.json").write_text("{}")


def test_the_best_checkpoint_is_reported_with_the_final_beside_it(tmp_path):
  accs = {1: 0.2, 2: 0.5, 3: 0.5, 4: 0.1}  # a tie: the earlier step wins
  _fake_run(tmp_path, [1, 2, 3, 4])
  calls = []

  def evaluate_one(ckpt, base, out, before):
    step = 4 if ckpt.endswith("hf_student") else int(ckpt.rsplit("_", 1)[1])
    calls.append((step, before))
    m = {"id/greedy_acc": accs[step], "forgetting/mean_pp": -step,
         "baseline/countdown5/greedy_acc": 0.3}
    res = {"metrics": m}
    pathlib.Path(out).write_text(json.dumps(res))
    return res

  got = trajectory.evaluate(_config(4, 1), str(tmp_path), "base", {},
                            evaluate_one=evaluate_one)
  assert got["trajectory/selected_step"] == 2
  assert got["id/greedy_acc"] == 0.5 and got["forgetting/mean_pp"] == -2
  assert got["final/id/greedy_acc"] == 0.1
  assert got["final/forgetting/mean_pp"] == -4
  # The baseline's scores from the first evaluation are reused after it.
  assert calls[0] == (1, None)
  assert all(b == {"countdown5/greedy_acc": 0.3} for _, b in calls[1:])
  saved = json.loads((tmp_path / trajectory.TRAJECTORY).read_text())
  assert saved["steps"] == [1, 2, 3, 4] and saved["selected_step"] == 2
  assert saved["metrics"]["id/greedy_acc"] == [0.2, 0.5, 0.5, 0.1]
  # keep='selected': the unselected step exports are gone, the final stays.
  left = sorted(os.listdir(tmp_path / "exports"))
  assert left == ["step_000002"] and (tmp_path / "hf_student").is_dir()

  # Done evaluations are read back, not redone.
  def boom(*a):
    raise AssertionError("evaluated again")
  again = trajectory.evaluate(_config(4, 1), str(tmp_path), "base",
                              {"keep": "all"}, evaluate_one=boom)
  assert again == got


def test_bad_trajectory_settings_are_named(tmp_path):
  with pytest.raises(ValueError, match="trajectory.keep"):
    trajectory.check({"keep": "some"})
  with pytest.raises(ValueError, match="unknown field"):
    trajectory.check({"selct": "id/greedy_acc"})
  _fake_run(tmp_path, [1, 2])
  with pytest.raises(ValueError, match="'id/nope' is not a metric"):
    trajectory.evaluate(
        _config(2, 1), str(tmp_path), None, {"select": "id/nope"},
        evaluate_one=lambda c, b, o, f: {"metrics": {"id/greedy_acc": 0.0}})
  (tmp_path / "eval_step_000001.json").unlink(missing_ok=True)
  (tmp_path / "exports" / "step_000001" / "config.json").unlink()
  with pytest.raises(FileNotFoundError, match="step 1"):
    trajectory.evaluate(_config(2, 1), str(tmp_path), None, {},
                        evaluate_one=lambda *a: None)


def test_a_grid_with_a_trajectory_needs_step_exports(tmp_path):
  g = config_lib.load_config("configs/grid_math.py:runlocal")
  g.base.export_every = 0
  with pytest.raises(ValueError, match="needs export_every > 0"):
    runner.run_sweep(g, str(tmp_path / "w"), devices=ONE_DEVICE)
  assert not (tmp_path / "w" / "assets").exists()


def _leaves(directory):
  _, params = models.load_pretrained(str(directory))
  return {jax.tree_util.keystr(k): np.asarray(v) for k, v in
          jax.tree_util.tree_leaves_with_path(params)}


@pytest.mark.slow
def test_runlocal_math_grid_evaluates_every_export(tmp_path, monkeypatch):
  """configs/grid_math.py:runlocal, one arm: the step-1 export is the
  student after one step (a separate 1-step run's export), both checkpoints
  are evaluated, the baseline once, and the arm reports the better one."""
  work = tmp_path / "sweep"
  g = config_lib.load_config("configs/grid_math.py:runlocal")
  g.eval.trajectory.keep = "all"
  only = "kl=forward,policy=student,lr=0.001"
  roles = []
  real = evaluate_run._evaluate  # pylint: disable=protected-access
  monkeypatch.setattr(evaluate_run, "_evaluate",
                      lambda role, *a, **k: roles.append(role) or real(role, *a, **k))
  runner.run_sweep(g, str(work), only=only, devices=ONE_DEVICE)
  arm = work / f"{only},seed=0"
  assert roles == ["checkpoint", "baseline", "checkpoint"]

  # An independent 1-step run of the same config (run_sweep pointed g.base
  # at the sweep's tiny student): its final export is the step-1 export.
  one = grid_lib.expand(g, only=only)[0].config
  one.total_steps, one.export_every = 1, 0
  train_loop.train(one, str(tmp_path / "one"), devices=ONE_DEVICE)
  a, b = _leaves(arm / "exports" / "step_000001"), _leaves(tmp_path / "one" / "hf_student")
  assert a.keys() == b.keys()
  assert all(np.array_equal(a[k], b[k]) for k in a)
  final = _leaves(arm / "hf_student")
  assert any(not np.array_equal(a[k], final[k]) for k in a)

  evals = {s: json.loads((arm / f"eval_step_{s:06d}.json").read_text())["metrics"]
           for s in (1, 2)}
  res = json.loads((arm / "results.json").read_text())["eval"]
  best = max((1, 2), key=lambda s: (evals[s]["id/greedy_acc"], -s))
  assert res["trajectory/selected_step"] == best
  assert res["id/greedy_acc"] == evals[best]["id/greedy_acc"]
  assert res["final/id/greedy_acc"] == evals[2]["id/greedy_acc"]
  assert res["forgetting/mean_pp"] == evals[best]["forgetting/mean_pp"]
  assert evals[1]["baseline/countdown5/greedy_acc"] == \
      evals[2]["baseline/countdown5/greedy_acc"]
