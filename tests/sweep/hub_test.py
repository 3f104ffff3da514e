"""The real study's grid by hub names (configs/grid_main.py's defaults),
offline against a seeded Hugging Face cache (tests/hub_cache.py): arms pinned
to the commits their names resolve to, data sets prepared once before the
first arm, arms at different revisions refused. Nothing is trained here
(the closing demonstration of issue 32 runs the command end to end).

References: the commits are the seeded cache's refs; the prepared records
are checked against the data the seeded cache holds."""
import os
import shutil

import pytest

from jaxdistill import config_lib
from jaxdistill.data import builders
from jaxdistill.sweep import grid as grid_lib
from jaxdistill.sweep import inputs
from jaxdistill.sweep import runner
from jaxdistill.train import loop as train_loop
from jaxdistill.train import setup as train_setup
from tests import hub_cache

QWEN05, QWEN7 = "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct"


@pytest.fixture(autouse=True)
def _code_eval_allowed(monkeypatch):
  # The grid's default forgetting suite (lm-eval's seven benchmarks) runs
  # HumanEval's code, which a user of the real grid allows this way.
  monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")


def _grid(arg="families=qwen05b,tasks=science"):
  return config_lib.load_config(f"configs/grid_main.py:{arg}")


def test_arms_are_pinned_and_their_data_prepared_once(hf_cache, tmp_path):
  # forgetting=suites: MedReason, the science arms' forgetting suite, is
  # prepared too.
  g, log = _grid("families=qwen05b,tasks=science,forgetting=suites"), []
  runs = inputs.plan(g, str(tmp_path), log=log.append)
  assert len(runs) == 8
  data_dir = str(tmp_path / "data")
  for r in runs:
    assert r.config.student.path == f"{QWEN05}@{hf_cache['models'][QWEN05]}"
    assert r.config.teacher.path == f"{QWEN7}@{hf_cache['models'][QWEN7]}"
    assert r.config.data.data_dir == data_dir
    ev = inputs.eval_config(g, r)
    assert ev.suites.science.data_dir == ev.suites.medical.data_dir == data_dir
  # Science arms train on the paper's SciKnowEval set; their forgetting
  # suite is its MedReason set: both prepared, once, at the seeded commits.
  sets = (("sciknoweval", "hicai-zju/SciKnowEval"),
          ("medreason", "UCSC-VLAA/MedReason"))
  assert [m.split(":")[0] for m in log if "prepared in" in m] == [
      n for n, _ in sets]
  for name, repo in sets:
    assert builders.read_record(data_dir, name)["commit"] == hf_cache[
        "datasets"][repo]
  assert all(r.config.data.source == "sciknoweval"
             and r.config.data.prompt == "science" for r in runs)
  assert inputs.data_revisions(g, runs[0]) == {
      f"data/{n}": {"repo": r, "revision": builders.HUB_DATASETS[n].revision
                    or "main", "commit": hf_cache["datasets"][r]}
      for n, r in sets}
  # The launch commands name the commits; a second plan prepares nothing.
  cmd = grid_lib.command(g, runs[0], str(tmp_path))
  assert f"--config.student.path={QWEN05}@{hf_cache['models'][QWEN05]}" in cmd
  log.clear()
  inputs.plan(_grid("families=qwen05b,tasks=science,forgetting=suites"),
              str(tmp_path), log=log.append)
  assert not log
  # The arms' checks pass on the pinned names (config.json from the cache).
  train_setup.model_config(runs[0].config.student, "student")
  # The default (forgetting on the lm-eval benchmarks) prepares only the
  # trained task's set: nothing else of ours is evaluated.
  log.clear()
  runs = inputs.plan(_grid(), str(tmp_path / "default"), log=log.append)
  assert [m.split(":")[0] for m in log if "prepared in" in m] == ["sciknoweval"]
  assert inputs.eval_config(_grid(), runs[0]).ood == ("lmeval",)


def test_the_default_grid_without_the_code_opt_in_is_refused_before_any_arm(
    hf_cache, tmp_path, monkeypatch):
  # Forgetting on the seven lm-eval benchmarks (the default) runs HumanEval's
  # code: without HF_ALLOW_CODE_EVAL=1 nothing trains.
  monkeypatch.delenv("HF_ALLOW_CODE_EVAL")
  work = str(tmp_path / "sweep")
  with pytest.raises(ValueError, match=r"grid.eval.spec 'configs/eval.py:task="
                     r"countdown,forgetting=lmeval': .*humaneval_instruct "
                     r"executes the code.*HF_ALLOW_CODE_EVAL=1"):
    runner.run_sweep(_grid("families=qwen05b,tasks=countdown"), work)
  assert not os.path.exists(work) or not [
      n for n in os.listdir(work) if n.startswith("family=")]


def test_arms_naming_one_repo_at_different_commits_are_refused(hf_cache, tmp_path):
  g = _grid("families=qwen05b+qwen15b,tasks=countdown")
  g.presets.family.qwen15b.student.path = f"{QWEN05}@v1"
  with pytest.raises(ValueError) as e:
    inputs.plan(g, str(tmp_path), log=lambda m: None)
  assert str(e.value) == (
      "grid: arms 'family=qwen05b,task=countdown,kl=forward,policy=student,"
      "lr=1e-05,seed=42' and 'family=qwen15b,task=countdown,kl=forward,"
      f"policy=student,lr=1e-05,seed=42' name {QWEN05} at different commits "
      f"({hf_cache['models'][QWEN05]} and {hf_cache['revised']}): one summary "
      "needs one revision of each checkpoint; give the same org/name@revision")


def test_an_arm_trained_from_a_commit_the_name_no_longer_gives_is_refused(
    seeded_hub, tmp_path, monkeypatch):
  cache = str(tmp_path / "hf")
  shutil.copytree(seeded_hub[0], cache, symlinks=True)
  hub_cache.use(monkeypatch, cache)
  work = str(tmp_path / "sweep")
  only = "kl=reverse,policy=student,lr=1e-05"
  run = inputs.plan(_grid("families=qwen05b,tasks=countdown"), work, only,
                    log=lambda m: None)[0]
  # The arm as training leaves it: its config.json names the old commit.
  train_loop.prepare_workdir(run.config, os.path.join(work, run.dirname), False)
  old, new = seeded_hub[1]["models"][QWEN05], seeded_hub[1]["revised"]
  with open(os.path.join(cache, "models--Qwen--Qwen2.5-0.5B-Instruct", "refs",
                         "main"), "w") as f:
    f.write(new)  # the hub's main moved on
  with pytest.raises(ValueError) as e:
    runner.run_sweep(_grid("families=qwen05b,tasks=countdown"), work, only=only)
  msg = str(e.value)
  assert f"student.path: '{QWEN05}@{old}' -> '{QWEN05}@{new}'" in msg
  assert "--rerun_stale" in msg and "pinned to the old one" in msg
  # Nothing ran (a Countdown arm forgetting on the lm-eval benchmarks has
  # no data set of ours to prepare: Countdown-3 is generated).
  assert os.listdir(work) == [run.dirname]


def test_an_rlvr_stages_kl_reference_is_pinned_like_the_arms(hf_cache,
                                                            tmp_path):
  """The arms' hub names were pinned, the stage's kl.reference was not
  (rl.train records its commit in revisions.json)."""
  from jaxdistill.sweep import rlvr  # pylint: disable=g-import-not-at-top
  g = config_lib.load_config("configs/grid_countdown_harder.py:runlocal")
  g.rlvr.updates = dict(g.rlvr.get("updates") or {}, kl={"reference": QWEN05})
  (run,) = grid_lib.expand(g, "train_n=3,kl=forward,policy=student")
  run_dir = str(tmp_path / run.dirname)
  c = rlvr.stage_config(g, run, run_dir)
  assert c.kl.reference == f"{QWEN05}@{hf_cache['models'][QWEN05]}"
  # The launch command's config (a snapshot here) names the commit too.
  rlvr.command(g, run, str(tmp_path))
  snap = "".join(open(os.path.join(rlvr.stage_dir(run_dir), n)).read()
                 for n in os.listdir(rlvr.stage_dir(run_dir)))
  assert f"{QWEN05}@{hf_cache['models'][QWEN05]}" in snap
  g.rlvr.updates = dict(g.rlvr.updates, kl={"reference": "nobody/not-cached"})
  with pytest.raises(ValueError, match=r"^grid\.rlvr: config\.kl\.reference: "
                     "nobody/not-cached"):
    rlvr.stage_config(g, run, run_dir)


def test_a_stage_trained_from_a_kl_reference_commit_that_moved_is_refused(
    seeded_hub, tmp_path, monkeypatch):
  """As for an arm: the stage's config.json names the commit its
  kl.reference was pinned to; the hub's main moved on, so the sweep refuses
  the stage as stale, naming both commits and how to keep the old one."""
  from jaxdistill.sweep import rlvr  # pylint: disable=g-import-not-at-top
  cache = str(tmp_path / "hf")
  shutil.copytree(seeded_hub[0], cache, symlinks=True)
  hub_cache.use(monkeypatch, cache)
  monkeypatch.setattr(rlvr, "_PINNED", {})

  def grid():
    g = config_lib.load_config("configs/grid_countdown_harder.py:runlocal")
    g.rlvr.updates = dict(g.rlvr.get("updates") or {},
                          kl={"reference": QWEN05})
    return g

  only = "train_n=3,kl=forward,policy=student"
  work = tmp_path / "sweep"
  (run,) = grid_lib.expand(grid(), only)
  stage = rlvr.stage_dir(str(work / run.dirname))
  old, new = seeded_hub[1]["models"][QWEN05], seeded_hub[1]["revised"]
  # The stage as rl.train leaves it: its config.json names the old commit.
  train_loop.prepare_workdir(rlvr.stage_config(grid(), run, str(
      work / run.dirname)), stage, False)
  assert f"{QWEN05}@{old}" in open(os.path.join(stage, "config.json")).read()
  with open(os.path.join(cache, "models--Qwen--Qwen2.5-0.5B-Instruct", "refs",
                         "main"), "w") as f:
    f.write(new)  # the hub's main moved on
  monkeypatch.setattr(rlvr, "_PINNED", {})  # a new sweep process
  with pytest.raises(ValueError) as e:
    runner.run_sweep(grid(), str(work), only=only, summarize=False)
  msg = str(e.value)
  assert f"kl.reference: '{QWEN05}@{old}' -> '{QWEN05}@{new}'" in msg, msg
  assert "(RLVR stage)" in msg and "--rerun_stale" in msg
  assert "pinned to the old one" in msg
