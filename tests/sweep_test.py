"""The sweep runner: grid expansion, launch commands, a 2x2 runlocal sweep
(4 runs, table, figures), no work on a second invocation, resume of an
interrupted run."""
import csv
import json
import os
import pathlib
import shlex

import jax
import numpy as np
import pytest

from jaxdistill import config_lib
from jaxdistill import sweep
from jaxdistill.study import figures
from jaxdistill.study import grid as grid_lib

ROOT = pathlib.Path(__file__).resolve().parents[1]
ONE_DEVICE = [jax.devices()[0]]


def test_names_are_deterministic_and_filesystem_safe():
  g = sweep.load_config("configs/grid_main.py")
  runs = sweep.expand(g)
  assert len(runs) == 3 * 3 * 2 * 2 * 2
  assert runs[0].name == ("family=llama,task=science,kl=forward,policy=student,"
                          "lr=1e-05,seed=0")
  assert [r.name for r in sweep.expand(g)] == [r.name for r in runs]
  assert grid_lib.safe_name("a=x/y z") == "a=x_y_z"
  assert all("/" not in r.dirname for r in runs)
  only = sweep.expand(g, only="kl=reverse,policy=student,lr=5e-05")
  assert len(only) == 9 and all("kl=reverse" in r.name for r in only)


def test_arms_that_differ_outside_the_axes_are_refused():
  g = sweep.load_config("configs/grid_spectrum.py:runlocal")
  runs = sweep.expand(g)
  # Expansion is fine; now make one arm sample differently.
  runs[1].config.rollout.temperature = 0.5
  with pytest.raises(ValueError, match="rollout.temperature"):
    grid_lib.check_arms(runs, g)
  g.axes = (("kl", "loss.kindd", ("forward",)),)
  with pytest.raises(ValueError, match="loss.kindd"):
    sweep.expand(g)


@pytest.mark.parametrize("spec", ["configs/grid_robustness.py",
                                  "configs/grid_main.py",
                                  "configs/grid_countdown_harder.py:runlocal"])
def test_launch_commands_rebuild_each_run_config(spec, monkeypatch, tmp_path):
  """Parsing a printed command with ml_collections' own flag parser gives the
  run's config (None, floats and paths included)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(ROOT)
  g = sweep.load_config(spec)
  if "grid_main" in spec:
    g.presets.family.llama.student.path = "/ckpt/Llama 3.2-1B"  # a space
  runs = sweep.expand(g)
  kinds = set()
  for run in runs[:: max(1, len(runs) // 8)] + runs[-1:]:
    grid_lib.write_snapshot(run, str(tmp_path / run.dirname))
    argv = shlex.split(sweep.command(g, run, str(tmp_path)))
    assert argv[:3] == ["python", "-m", "jaxdistill.train"]
    assert argv[-1] == str(tmp_path / run.dirname)
    kinds.add("snapshot" if "run_snapshot.py" in argv[4] else "flags")
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, flag_values=fv,
                                    sys_argv=["train"] + argv[3:])
    flags.DEFINE_string("workdir", None, "", flag_values=fv)
    fv(["train"] + argv[3:])
    got = json.loads(config_lib.to_json(fv.config))
    want = json.loads(config_lib.to_json(run.config))
    assert config_lib.diff(got, want) == []
  assert "flags" in kinds
  if "robustness" in spec:  # clip_norm=None has no flag form
    assert "snapshot" in kinds


def _mtimes(root):
  return {str(p): p.stat().st_mtime_ns for p in pathlib.Path(root).rglob("*")
          if p.is_file() and "summary" not in p.parts}


@pytest.mark.slow
def test_runlocal_sweep_table_figures_skip_and_resume(tmp_path, capsys):
  work = tmp_path / "sweep"
  g = sweep.load_config("configs/grid_main.py:runlocal,axes=policy+lr")
  g.base.ckpt_every = 1
  sweep.run_sweep(g, str(work), devices=ONE_DEVICE)
  runs = sorted(d for d in os.listdir(work) if (work / d / "results.json").exists())
  assert len(runs) == 4 and "policy=teacher,lr=0.005,seed=0" in runs

  # The table agrees with each run's own files, read independently.
  with open(work / "summary" / "results.csv") as f:
    table = {r["arm"]: r for r in csv.DictReader(f)}
  assert len(table) == 4
  for d in runs:
    ev = json.loads((work / d / "eval.json").read_text())["metrics"]
    row = table[d.removesuffix(",seed=0")]
    np.testing.assert_allclose(float(row["accuracy_mean"]), ev["id/greedy_acc"])
    np.testing.assert_allclose(float(row["forgetting_pp_mean"]),
                               ev["forgetting/mean_pp"])
    for dt in ("bfloat16", "float32"):  # both dtypes, named
      np.testing.assert_allclose(float(row[f"sparsity_{dt}_mean"]),
                                 ev[f"sparsity/whole_{dt}"])
    assert row["accuracy_n"] == "1"
    recs = [json.loads(l) for l in (work / d / "metrics.jsonl").read_text().split("\n") if l]
    res = json.loads((work / d / "results.json").read_text())
    assert res["compute"]["tokens_generated"] == sum(
        r["train/response_tokens"] for r in recs) > 0
    assert res["compute"]["flops"] > 0
  md = (work / "summary" / "results.md").read_text()
  assert sum(l.startswith("| ") for l in md.splitlines()) == 1 + 4
  pngs = sorted(p.name for p in (work / "summary").glob("*.png"))
  # Random tiny models solve no harder problem: that figure would be empty.
  harder = [float(r[k]) for r in table.values() for k in r
            if k.startswith("acc/countdown") and k.endswith("_mean")
            and not k.startswith("acc/countdown3") and r[k]]
  assert pngs == ["accuracy_vs_lambda.png"] + (
      ["harder_countdown.png"] if any(harder) else []) + [
          "lr_sparsity_forgetting.png"]

  # Second invocation: nothing trains or evaluates, no run file changes.
  before = _mtimes(work)
  def boom(*a, **k):
    raise AssertionError("work was redone")
  from jaxdistill import train  # pylint: disable=g-import-not-at-top
  orig_train = train.train
  train.train = boom
  try:
    sweep.run_sweep(g, str(work), devices=ONE_DEVICE, evaluate_fn=boom)
  finally:
    train.train = orig_train
  assert _mtimes(work) == before

  # Interrupted after step 1: checkpoint 1 but not 2, no results.json.
  d = work / "policy=student,lr=0.001,seed=0"
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.rmtree(d / "checkpoints" / "2")
  for f in ("results.json", "eval.json"):
    (d / f).unlink()
  first = (d / "metrics.jsonl").read_text().split("\n")[0]
  (d / "metrics.jsonl").write_text(first + "\n")
  ck1 = (d / "checkpoints" / "1").stat().st_mtime_ns
  others = {k: v for k, v in _mtimes(work).items() if str(d) not in k}
  capsys.readouterr()
  sweep.run_sweep(g, str(work), devices=ONE_DEVICE)
  err = capsys.readouterr().err
  assert "policy=student,lr=0.001,seed=0: resuming" in err
  lines = [l for l in (d / "metrics.jsonl").read_text().split("\n") if l]
  assert lines[0] == first and [json.loads(l)["step"] for l in lines] == [1, 2]
  assert (d / "checkpoints" / "1").stat().st_mtime_ns == ck1
  assert (d / "results.json").exists()
  assert {k: v for k, v in _mtimes(work).items() if k in others} == others


def test_figures_say_what_is_missing(tmp_path, capsys):
  rows = [{"name": "a", "arm": "a", "kl": "forward", "policy": "student",
           "lam": 1.0, "lr": 1e-5, "task": "countdown3", "seed": 0,
           "accuracy": 0.5, "sparsity": 0.9}]
  assert figures.make_figures(rows, str(tmp_path)) == []
  err = capsys.readouterr().err
  assert "accuracy_vs_lambda: skipped" in err and "harder_countdown: skipped" in err


def test_figures_draw_references_and_binomial_error_bars(tmp_path, capsys,
                                                        monkeypatch):
  rows = [{"name": f"{kl},{lam}", "arm": f"{kl},{lam}", "kl": kl,
           "policy": "mixture", "lam": lam, "lr": 1e-4, "task": "records",
           "seed": 0, "accuracy": acc, "acc/countdown4": 0.0}
          for kl, lam, acc in (("forward", 0.0, 0.4), ("forward", 1.0, 0.5),
                               ("reverse", 0.0, 0.2), ("reverse", 1.0, 0.3))]
  drawn = {}
  plt = figures._plt()  # pylint: disable=protected-access
  real = plt.Axes.errorbar
  def spy(ax, x, y, yerr=None, **kw):
    drawn.setdefault("errorbar", []).append((list(y), list(yerr)))
    return real(ax, x, y, yerr=yerr, **kw)
  monkeypatch.setattr(plt.Axes, "errorbar", spy)
  paths = figures.make_figures(
      rows, str(tmp_path), refs={"accuracy": {"teacher": 0.6, "student": 0.1},
                                 "acc/countdown4": {"teacher": 0.0}},
      n_test={"accuracy": 100})
  assert [p.split("/")[-1] for p in paths] == ["accuracy_vs_lambda.png"]
  # Error bars: binomial s.e. sqrt(p (1 - p) / n) in %, with one seed.
  (y, err), _ = drawn["errorbar"]
  np.testing.assert_allclose(y, [40.0, 50.0])
  np.testing.assert_allclose(err, [100 * np.sqrt(.4 * .6 / 100),
                                   100 * np.sqrt(.5 * .5 / 100)])
  # Everyone at 0 on the harder suite: no empty figure, and a line says so.
  assert "harder_countdown: skipped (every model scores 0" in capsys.readouterr().err


def test_linear_fit_r2_matches_numpy():
  x = np.array([1e-5, 1e-5, 5e-5, 5e-5, 3e-5])
  y = np.array([0.90, 0.86, 0.55, 0.60, 0.71])
  a, b, r2 = figures.linear_fit(x, y)
  r = np.corrcoef(x, y)[0, 1]
  np.testing.assert_allclose(r2, r ** 2, rtol=1e-9)
  np.testing.assert_allclose(a, np.cov(x, y, ddof=0)[0, 1] / np.var(x), rtol=1e-9)


def test_missing_checkpoint_paths_fail_before_any_run(tmp_path):
  g = sweep.load_config("configs/grid_main.py")  # no paths on the command line
  with pytest.raises(ValueError, match="config.student.path"):
    sweep.run_sweep(g, str(tmp_path), only="family=llama")
  assert not any(p.is_dir() for p in tmp_path.iterdir())
