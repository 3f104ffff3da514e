"""The sweep runner: grid expansion, launch commands, a 2x2 runlocal sweep
(4 runs, table, figures), no work on a second invocation, resume of an
interrupted run."""
import csv
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys

from absl import flags
import jax
from ml_collections import config_flags
import numpy as np
import pytest

from jaxdistill import config_lib
from jaxdistill import models
from jaxdistill.rl import train as rl_train
from jaxdistill.sweep import figures
from jaxdistill.sweep import grid as grid_lib
from jaxdistill.sweep import rlvr
from jaxdistill.sweep import runner
from jaxdistill.sweep import table as table_lib
from jaxdistill.train import loop as train_loop

ROOT = pathlib.Path(__file__).resolve().parents[2]
ONE_DEVICE = [jax.devices()[0]]


def test_names_are_deterministic_and_filesystem_safe():
  g = config_lib.load_config("configs/grid_main.py")
  runs = grid_lib.expand(g)
  assert len(runs) == 2 * 3 * 2 * 2 * 2  # the paper's two families
  assert runs[0].name == ("family=llama,task=science,kl=forward,policy=student,"
                          "lr=1e-05,seed=42")
  assert [r.name for r in grid_lib.expand(g)] == [r.name for r in runs]
  assert grid_lib.safe_name("a=x/y z") == "a=x_y_z"
  assert all("/" not in r.dirname for r in runs)
  only = grid_lib.expand(g, only="kl=reverse,policy=student,lr=5e-05")
  assert len(only) == 6 and all("kl=reverse" in r.name for r in only)


def test_arms_that_differ_outside_the_axes_are_refused():
  g = config_lib.load_config("configs/grid_spectrum.py:runlocal")
  runs = grid_lib.expand(g)
  # Expansion is fine; now make one arm sample differently.
  runs[1].config.rollout.top_p = 0.5
  with pytest.raises(ValueError, match="rollout.top_p"):
    grid_lib.check_arms(runs, g)
  g.axes = (("kl", "loss.kindd", ("forward",)),)
  with pytest.raises(ValueError, match="loss.kindd"):
    grid_lib.expand(g)


def _parsed_config(argv):
  """The config a launch command's flags give, parsed by ml_collections'
  own flag parser (as JSON)."""
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, flag_values=fv,
                                  sys_argv=["train"] + argv[3:])
  flags.DEFINE_string("workdir", None, "", flag_values=fv)
  flags.DEFINE_string("shared_rollouts", None, "", flag_values=fv)
  fv(["train"] + argv[3:])
  return json.loads(config_lib.to_json(fv.config))


@pytest.mark.parametrize("spec", ["configs/grid_robustness.py",
                                  "configs/grid_main.py",
                                  "configs/grid_countdown_harder.py:runlocal"])
def test_launch_commands_rebuild_each_run_config(spec, monkeypatch, tmp_path):
  """Parsing a printed command with ml_collections' own flag parser gives the
  run's config (None, floats and paths included)."""
  monkeypatch.chdir(ROOT)
  g = config_lib.load_config(spec)
  if "grid_main" in spec:
    g.presets.family.llama.student.path = "/ckpt/Llama 3.2-1B"  # a space
  runs = grid_lib.expand(g)
  kinds = set()
  for run in runs[:: max(1, len(runs) // 8)] + runs[-1:]:
    grid_lib.write_snapshot(run, str(tmp_path / run.dirname))
    argv = shlex.split(grid_lib.command(g, run, str(tmp_path)))
    assert argv[:3] == ["python", "-m", "jaxdistill.train"]
    assert argv[-1] == str(tmp_path / run.dirname)
    kinds.add("snapshot" if "run_snapshot.py" in argv[4] else "flags")
    got = _parsed_config(argv)
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
  g = config_lib.load_config("configs/grid_main.py:runlocal,axes=policy+lr")
  g.base.ckpt_every = 1
  g.base.keep_final_only = False  # the resume below starts from checkpoint 1
  runner.run_sweep(g, str(work), devices=ONE_DEVICE)
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
    for col in table_lib.SPARSITY:  # S_tau and the former figures, named
      np.testing.assert_allclose(float(row[f"{col}_mean"]),
                                 ev[col.replace("_", "/", 1)])
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
          "lr_sparsity_forgetting.png", "paper_fig1.png"]

  # Second invocation: nothing trains or evaluates, no run file changes.
  before = _mtimes(work)
  def boom(*a, **k):
    raise AssertionError("work was redone")
  orig_train = train_loop.train
  train_loop.train = boom
  try:
    runner.run_sweep(g, str(work), devices=ONE_DEVICE, evaluate_fn=boom)
  finally:
    train_loop.train = orig_train
  assert _mtimes(work) == before

  # Interrupted after step 1: checkpoint 1 but not 2, no results.json.
  d = work / "policy=student,lr=0.001,seed=0"
  shutil.rmtree(d / "checkpoints" / "2")
  for f in ("results.json", "eval.json"):
    (d / f).unlink()
  first = (d / "metrics.jsonl").read_text().split("\n")[0]
  (d / "metrics.jsonl").write_text(first + "\n")
  ck1 = (d / "checkpoints" / "1").stat().st_mtime_ns
  others = {k: v for k, v in _mtimes(work).items() if str(d) not in k}
  capsys.readouterr()
  runner.run_sweep(g, str(work), devices=ONE_DEVICE)
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
           "policy": "coin_mixture", "lam": lam, "lr": 1e-4, "task": "records",
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
  # The default hub names, offline and not in the (test machine's) cache.
  g = config_lib.load_config("configs/grid_main.py")
  with pytest.raises(ValueError, match="config.student.path"):
    runner.run_sweep(g, str(tmp_path), only="family=llama")
  assert not any(p.is_dir() for p in tmp_path.iterdir())


def _small_grid():
  g = config_lib.load_config("configs/grid_main.py:runlocal,axes=policy")
  g.base.total_steps = g.base.ckpt_every = 1
  return g


def test_a_second_sweep_on_the_same_workdir_is_refused(tmp_path):
  """Two sweeps started seconds apart used to race on assets/student.tmp."""
  holder = subprocess.Popen([sys.executable, "-c",
                             "import time; time.sleep(600)"])
  try:
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / ".lock").write_text(json.dumps(
        {"pid": holder.pid, "host": socket.gethostname()}))
    with pytest.raises(ValueError, match=f"in use by pid {holder.pid}"):
      runner.run_sweep(_small_grid(), str(tmp_path / "w"), devices=ONE_DEVICE,
                       only="policy=student", summarize=False,
                       evaluate_fn=lambda *a: None)
    assert os.listdir(tmp_path / "w") == [".lock"]  # no assets, no arm
  finally:
    holder.kill()
    holder.wait()


@pytest.mark.parametrize("name,text,words", [
    ("results.json", "{not json", "not valid JSON"),
    ("results.json", "[1, 2]", "expected a JSON object, got array"),
    ("results.json", '{"name": "x", "dirname": "x", "factors": [],'
     ' "study": {}}', "field 'factors' must be a JSON object"),
    ("results.json", "{}", "field 'name' must be a JSON string"),
    ("sweep.json", "", "not valid JSON"),
    ("sweep.json", '"runs"', "expected a JSON object, got string"),
])
def test_a_bad_results_or_sweep_json_is_named_before_anything(
    tmp_path, name, text, words):
  """They used to end as 'Expecting value: line 1 column 1' or a KeyError."""
  g = _small_grid()
  work = tmp_path / "w"
  (run,) = grid_lib.expand(g, "policy=student")
  path = work / run.dirname / name if name == "results.json" else work / name
  path.parent.mkdir(parents=True)
  path.write_text(text)
  before = sorted(p.name for p in work.rglob("*"))
  with pytest.raises(ValueError, match=f"^{path}: {words}"):
    runner.run_sweep(g, str(work), devices=ONE_DEVICE, only="policy=student",
                     summarize=False, evaluate_fn=lambda *a: None)
  assert sorted(p.name for p in work.rglob("*")) == before  # nothing written


def _finished(run, **changes):
  """A results.json of `run` as run_one writes it, by hand, with `changes`."""
  return dict({"name": run.name, "dirname": run.dirname,
               "factors": dict(run.factors),
               "study": {"kl": "forward", "policy": "student", "lam": 1.0,
                         "lr": 1e-5, "task": "science", "seed": 42,
                         "clip": 1.0, "max_new_tokens": 8,
                         "precision": "float32"},
               "train": {}, "eval": {"id/greedy_acc": 0.5}, "compute": {}},
              **changes)


@pytest.mark.parametrize("where,changes,words", [
    # the table groups seeds by study.seed: it was a KeyError at the summary
    ("arm", {"study": {"kl": "forward"}},
     "field 'study.seed' must be a JSON number, got null"),
    ("arm", {"study": {"seed": 42, "lr": "1e-5"}},
     "field 'study.lr' must be a JSON number, got \"1e-5\""),
    ("arm", {"eval": [0.5]}, "field 'eval' must be a JSON object, got \\[0.5\\]"),
    # copied from another arm's directory: it was a second row of that arm
    ("arm", {"name": "policy=teacher,seed=0"},
     "field 'name' is 'policy=teacher,seed=0', not this directory's run"),
    # another arm (outside --only) that only the summary used to read
    ("other", {"study": {"seed": True}},
     "field 'study.seed' must be a JSON number, got true"),
])
def test_results_json_of_the_wrong_shape_is_named_before_anything(
    tmp_path, where, changes, words):
  g = _small_grid()
  work = tmp_path / "w"
  run, other = grid_lib.expand(g)
  assert run.name == "policy=student,seed=0"  # the arm of --only
  target = run if where == "arm" else other
  path = work / target.dirname / "results.json"
  path.parent.mkdir(parents=True)
  path.write_text(json.dumps(_finished(target, **changes)))
  before = sorted(p.name for p in work.rglob("*"))
  with pytest.raises(ValueError) as e:
    runner.run_sweep(g, str(work), devices=ONE_DEVICE, only="policy=student",
                     evaluate_fn=lambda *a: None)
  msg = str(e.value)
  assert re.match(f"^{re.escape(str(path))}: {words}", msg), msg
  assert msg.endswith(f"delete {path.parent} to rerun it from the start") or (
      msg.endswith(f"delete {path.parent} to rerun it")), msg
  assert "\n" not in msg
  assert sorted(p.name for p in work.rglob("*")) == before  # nothing written


def test_a_config_json_that_is_not_an_object_is_named(tmp_path):
  """An unfinished arm's config.json (compared with the grid's before it
  resumes) that is a list: it was an AttributeError."""
  g = _small_grid()
  (run, _) = grid_lib.expand(g)
  path = tmp_path / run.dirname / "config.json"
  path.parent.mkdir(parents=True)
  path.write_text("[]")
  with pytest.raises(ValueError) as e:
    runner.run_sweep(g, str(tmp_path), devices=ONE_DEVICE,
                     only="policy=student", evaluate_fn=lambda *a: None)
  assert str(e.value) == (
      f"{path}: expected a JSON object, got array; delete {path.parent} to "
      "rerun it from the start (the config it was trained with is unknown)")
  assert os.listdir(tmp_path) == [run.dirname]


def test_the_table_names_an_rlvr_stage_with_bad_rewards(tmp_path):
  """rewards a number (list() of it was a TypeError) or a list of texts
  (NumPy's 'could not convert string to float' at the figures)."""
  (run, _) = grid_lib.expand(_small_grid())
  arm = tmp_path / run.dirname
  (arm / "rlvr").mkdir(parents=True)
  (arm / "results.json").write_text(json.dumps(_finished(run)))
  stage = arm / "rlvr" / "results.json"
  for rewards, shown in ((5, "5"), (["0.1"], '["0.1"]')):
    stage.write_text(json.dumps(_finished(run, stage="rlvr", rewards=rewards)))
    with pytest.raises(ValueError) as e:
      table_lib.aggregate(str(tmp_path))
    assert str(e.value) == (
        f"{stage}: field 'rewards' must be a list of numbers, got {shown}; "
        f"delete it to finish the run again from its checkpoints, or delete "
        f"{stage.parent} to rerun it from the start")
  stage.write_text(json.dumps(_finished(run, rewards=[0.1, 0.3])))
  (row,) = table_lib.aggregate(str(tmp_path))
  assert row["rlvr_rewards"] == [0.1, 0.3]
  # What runner.study_factors writes for policy='dataset' and no clipping.
  study = dict(_finished(run)["study"], policy="dataset", lam=None, clip=None)
  (arm / "results.json").write_text(json.dumps(_finished(run, study=study)))
  (row,) = table_lib.aggregate(str(tmp_path))
  assert row["lam"] is None and row["policy"] == "dataset"


@pytest.mark.slow  # one arm trains a step
def test_sigterm_between_arms_stops_at_once_saying_what_is_kept(
    tmp_path):
  # Without the sweep's own handler, this one would just swallow it.
  prev = signal.signal(signal.SIGTERM, lambda *a: None)

  def evaluate(grid, run, run_dir):  # after the arm's training
    os.kill(os.getpid(), signal.SIGTERM)
  try:
    with pytest.raises(train_loop.Preempted) as e:
      runner.run_sweep(_small_grid(), str(tmp_path), devices=ONE_DEVICE,
                       only="policy=student", summarize=False,
                       evaluate_fn=evaluate)
  finally:
    signal.signal(signal.SIGTERM, prev)
  assert e.value.exit_code == 128 + signal.SIGTERM
  assert str(e.value) == (
      f"stopped by SIGTERM; finished runs, and the checkpoints of the one in "
      f"progress, are kept in {tmp_path}; run the same command to resume")
  (arm,) = [d for d in os.listdir(tmp_path) if d.startswith("policy=")]
  assert os.listdir(tmp_path / arm / "checkpoints") == ["1"]
  assert not (tmp_path / ".lock").exists()


# ---------------------------------------------------------------- RLVR stage

def _result(name, acc, **study):
  factors = dict(p.split("=", 1) for p in name.split(","))
  return {"name": name, "dirname": name, "factors": factors,
          "study": dict(study, seed=int(factors["seed"])),
          "eval": {"id/greedy_acc": acc}, "train": {}, "compute": {}}


def test_rlvr_select_takes_the_best_arm_of_each_group_over_seeds():
  g = config_lib.load_config("configs/grid_countdown_harder.py:runlocal")
  g.rlvr.select = dict(metric="accuracy", per=("kl",))
  runs = grid_lib.expand(g, "train_n=3")  # kl x policy x seed 0
  assert len(runs) == 4
  acc = {"kl=forward,policy=student": .2, "kl=forward,policy=teacher": .5,
         "kl=reverse,policy=student": .4, "kl=reverse,policy=teacher": .3}
  results = {}
  for r in runs:
    key = ",".join(p for p in r.name.split(",")[1:3])
    results[r.name] = _result(r.name, acc[key], kl=r.factors["kl"],
                              policy=r.factors["policy"])
  got = [r.name for r in rlvr.select(g, runs, results)]
  assert got == ["train_n=3,kl=forward,policy=teacher,seed=0",
                 "train_n=3,kl=reverse,policy=student,seed=0"]
  # The choice needs every arm's result; without `select` every arm runs.
  del results[runs[0].name]
  assert rlvr.select(g, runs, results) is None
  g.rlvr.select = None
  assert rlvr.select(g, runs, results) == runs


def test_rlvr_stage_commands_rebuild_the_stage_config(monkeypatch, tmp_path):
  """The printed `python -m jaxdistill.rl.train` line, parsed by
  ml_collections' own flag parser, gives the stage's config: the arm's
  export as the student, the arm's seed, its Countdown-N."""
  monkeypatch.chdir(ROOT)
  g = config_lib.load_config("configs/grid_countdown_harder.py:seeds=2")
  runs = grid_lib.expand(g)
  for run in (runs[0], runs[-1]):
    argv = shlex.split(rlvr.command(g, run, str(tmp_path)))
    assert argv[:3] == ["python", "-m", "jaxdistill.rl.train"]
    assert argv[-1] == str(tmp_path / run.dirname / "rlvr")
    assert "run_snapshot.py" not in argv[4]  # expressible as flags
    got = _parsed_config(argv)
    assert got["student"]["path"] == str(tmp_path / run.dirname / "hf_student")
    assert got["seed"] == run.factors["seed"]
    assert got["data"]["n_numbers"] == run.factors["train_n"]
    assert got["optim"]["lr"] == 1e-6
    want = json.loads(config_lib.to_json(
        rlvr.stage_config(g, run, str(tmp_path / run.dirname))))
    assert config_lib.diff(got, want) == []


def test_an_rlvr_stage_result_names_what_it_took_from_the_hub(monkeypatch,
                                                             tmp_path):
  """The arms' results.json carry their hub commits; the stage's had none
  (its kl.reference commit was only in rl.train's revisions.json)."""
  g = config_lib.load_config("configs/grid_countdown_harder.py:runlocal")
  (run,) = grid_lib.expand(g, "train_n=3,kl=forward,policy=student")
  run_dir = tmp_path / run.dirname
  run_dir.mkdir()
  (run_dir / "results.json").write_text(json.dumps(_finished(run)))
  pinned = {"kl.reference": {"id": "Qwen/Qwen2.5-0.5B-Instruct",
                             "revision": "main", "commit": "a" * 40}}
  from_hub = [pinned]

  def fake_train(config, workdir, devices=None):  # what rl.train leaves
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
      f.write(json.dumps({"step": 1, "rl/reward_mean": 0.25}) + "\n")
    rev = os.path.join(workdir, "revisions.json")
    if from_hub[0]:  # rl.train writes it only when a name came from the hub
      with open(rev, "w") as f:
        json.dump(from_hub[0], f)
    elif os.path.exists(rev):
      os.remove(rev)

  monkeypatch.setattr(runner.rl_train, "train", fake_train)
  got = runner.run_rlvr_one(g, run, str(run_dir),
                            evaluate_fn=lambda *a: {"id/greedy_acc": 0.5})
  saved = json.loads((run_dir / "rlvr" / "results.json").read_text())
  assert got["revisions"] == saved["revisions"] == pinned
  assert saved["rewards"] == [0.25] and saved["name"] == run.name
  from_hub[0] = None  # local paths only
  assert runner.run_rlvr_one(
      g, run, str(run_dir), evaluate_fn=lambda *a: None)["revisions"] == {}


def test_rlvr_config_errors_surface_before_any_arm_trains(tmp_path):
  g = config_lib.load_config("configs/grid_countdown_harder.py:runlocal")
  g.rlvr.updates = dict(rollout=dict(group_size=1))
  with pytest.raises(ValueError, match="grid.rlvr: config.rollout.group_size"):
    runner.run_sweep(g, str(tmp_path / "w"), only="train_n=3,kl=reverse",
                    devices=ONE_DEVICE)
  assert not any((tmp_path / "w").glob("train_n=*"))


def _leaves(tree):
  return {jax.tree_util.keystr(k): np.asarray(v) for k, v in
          jax.tree_util.tree_leaves_with_path(tree)}


@pytest.mark.slow
def test_runlocal_grid_with_rlvr_stage_end_to_end(tmp_path, capsys):
  """`python -m jaxdistill.sweep` on a 2-arm grid with an RLVR stage: GRPO
  from each arm's export, evaluated, tabled before/after; a rerun does
  nothing; a changed stage config is refused."""
  work = tmp_path / "hard"
  spec = str(ROOT / "configs/grid_countdown_harder.py:runlocal")
  proc = subprocess.run(
      [sys.executable, "-m", "jaxdistill.sweep", "--config", spec, "--workdir",
       str(work), "--only", "train_n=3,kl=reverse"], capture_output=True,
      text=True, cwd=tmp_path, timeout=600,
      env={**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"},
           "PYTHONPATH": str(ROOT)})  # one CPU device, as a user's laptop
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "Change with RLVR" in proc.stdout
  arms = sorted(d.name for d in work.iterdir() if (d / "results.json").exists())
  assert arms == ["train_n=3,kl=reverse,policy=student,seed=0",
                  "train_n=3,kl=reverse,policy=teacher,seed=0"]
  with open(work / "summary" / "results.csv") as f:
    table = {r["arm"]: r for r in csv.DictReader(f)}
  _, base = models.load_pretrained(str(work / "assets" / "student"))
  for d in arms:
    stage = work / d / "rlvr"
    res = json.loads((stage / "results.json").read_text())
    assert res["stage"] == "rlvr" and len(res["rewards"]) == 2
    # Started from the arm: the tiny random policy earns reward 0, so GRPO's
    # update is exactly zero and the stage exports the arm's weights (which
    # differ from the student the arm started from).
    _, arm_p = models.load_pretrained(str(work / d / "hf_student"))
    _, rl_p = models.load_pretrained(str(stage / "hf_student"))
    a, r, b = _leaves(arm_p), _leaves(rl_p), _leaves(base)
    assert all(np.array_equal(a[k], r[k]) for k in a)
    assert any(not np.array_equal(a[k], b[k]) for k in a)
    # The table's after-RLVR columns are the stage's own evaluation.
    ev = json.loads((stage / "eval.json").read_text())["metrics"]
    before = json.loads((work / d / "eval.json").read_text())["metrics"]
    row = table[d.removesuffix(",seed=0")]
    np.testing.assert_allclose(float(row["rlvr/accuracy_mean"]),
                               ev["id/greedy_acc"])
    np.testing.assert_allclose(float(row["rlvr_change/accuracy_mean"]),
                               ev["id/greedy_acc"] - before["id/greedy_acc"])
  md = (work / "summary" / "results.md").read_text()
  assert "After RLVR" in md and "Change with RLVR" in md
  assert (work / "summary" / "rlvr.png").exists()

  # A rerun trains and evaluates nothing.
  before = _mtimes(work)
  def boom(*a, **k):
    raise AssertionError("work was redone")
  orig = train_loop.train, rl_train.train
  train_loop.train = rl_train.train = boom
  capsys.readouterr()
  try:
    runner.run_sweep(config_lib.load_config(spec), str(work),
                    only="train_n=3,kl=reverse", devices=ONE_DEVICE,
                    evaluate_fn=boom)
  finally:
    train_loop.train, rl_train.train = orig
  assert {k: v for k, v in _mtimes(work).items() if k in before} == before
  assert capsys.readouterr().err.count("finished, skipped") == 4

  # A changed stage config is refused, naming the field.
  with pytest.raises(ValueError, match="RLVR stage.*optim.lr"):
    g = config_lib.load_config(spec)
    g.rlvr.updates.optim = dict(lr=0.5)
    runner.run_sweep(g, str(work), only="train_n=3,kl=reverse",
                    devices=ONE_DEVICE)
