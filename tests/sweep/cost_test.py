"""A sweep's --compile_only chip-hours (sweep/cost.py) against hand counts.

The programs are the runlocal grids' own, laid out on 4 CPU devices; their
compilation is replaced by rows with chosen bounds and limits, so that the
arithmetic is checked, not the compiler. Steps and decode calls are counted
here from the configs' numbers."""
import json
import os
import pathlib
import subprocess
import sys

import jax
import pytest

from jaxdistill import compile_only
from jaxdistill import config_lib
from jaxdistill import sharding
from jaxdistill.sweep import cost
from jaxdistill.sweep import disk as sweep_disk
from jaxdistill.sweep import grid as grid_lib
from jaxdistill.sweep import programs as sweep_programs

# Seconds per call of each program (the arm-free name); limit = bound / 4.
BOUNDS = {"train rollout": 3.0, "train update": 5.0, "eval greedy": 0.5,
          "eval sampled": 0.25, "rlvr rollout": 7.0, "rlvr reference": 1.5,
          "rlvr update": 11.0}
CHIPS = 4
ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def fake_compile(monkeypatch):
  chip = compile_only.CHIPS["v5e"]
  devices = tuple(jax.devices()[:CHIPS])
  t = compile_only.Target("v5e-4", chip, "v5e:2x2", CHIPS, devices,
                          chip.hbm_bytes, chip.peak_flops, chip.hbm_bandwidth)
  monkeypatch.setattr(compile_only, "target", lambda name: t)

  def row(p, target, cache_dir=None):
    del target, cache_dir
    b = BOUNDS[p.name.partition(": ")[0]]
    return {"name": p.name, "step_time_bound_s": b, "limit_s": b / 4,
            "total_bytes": 0, "fits": True, "cached": False, "compile_s": 0}
  monkeypatch.setattr(compile_only, "compile_program", row)


def _estimate(grid):
  report = sweep_programs.compile_for(grid, "v5e-4")
  runs = grid_lib.expand(grid)
  needs = sweep_disk.arms(runs) + sweep_disk.stages(grid, runs)
  return runs, needs, cost.estimate(grid, runs, report, needs), report


def test_grid_main_runlocal_chip_hours_by_hand(fake_compile):
  g = config_lib.load_config("configs/grid_main.py:runlocal")
  # Problem counts that do not divide the prompts per call.
  g.eval.updates.suites = dict(countdown3=dict(num_problems=10),
                               countdown5=dict(num_problems=6))
  g.eval.updates.sampler = dict(batch_size=4)
  runs, needs, c, report = _estimate(g)
  assert len(runs) == 4  # kl x policy
  steps = 2  # make_runlocal's total_steps
  # configs/eval.py:runlocal,samples=2: greedy and 2 samples per problem, no
  # single sample; a greedy call decodes 4 prompts, a sampled one 4 // 2.
  greedy = -(-10 // 4) + -(-6 // 4)       # 3 + 2
  sampled = -(-10 // 2) + -(-6 // 2)      # 5 + 3
  baseline = -(-6 // 4)                   # the OOD suite, countdown5, greedy
  per_arm = (steps * (3.0 + 5.0) + greedy * 0.5 + sampled * 0.25
             + baseline * 0.5)
  assert per_arm == 21.5
  # The two teacher-policy arms differ only in KL: the second reads the
  # first's teacher rollouts (grid.share_teacher_rollouts), no train rollout.
  reader = "kl=reverse,policy=teacher,seed=0"
  assert [r.name for r in runs].index(reader) == 3
  read = steps * 3.0
  kept = dict(needs)
  # The four arms start from one student under one evaluation config: the
  # first evaluates the baseline, the others reuse it (sweep/baselines.py).
  base_s = baseline * 0.5
  for i, run in enumerate(runs):
    a = c["per_arm"][run.name]
    own = (per_arm - (read if run.name == reader else 0.0)
           - (base_s if i else 0.0))
    assert a["reads_shared_rollouts"] == (run.name == reader)
    assert a["steps"] == steps
    assert a["bound_s"] == pytest.approx(own)
    assert a["limit_s"] == pytest.approx(own / 4)
    assert a["chip_hours"] == pytest.approx(own * CHIPS / 3600)
    assert a["phases"]["train"]["bound_s"] == pytest.approx(
        16.0 - (read if run.name == reader else 0.0))
    assert a["phases"]["eval"]["bound_s"] == pytest.approx(4.5)
    if i:
      assert "baseline" not in a["phases"]
    else:
      assert a["phases"]["baseline"]["bound_s"] == pytest.approx(1.0)
    assert a["kept_bytes"] == kept[run.name]["kept_bytes"] > 0
    assert a["uncounted_suites"] == []
  total = c["grid"]
  grid_s = 4 * per_arm - read - 3 * base_s
  assert total["chip_hours"] == pytest.approx(grid_s * CHIPS / 3600)
  assert total["limit_chip_hours"] == pytest.approx(total["chip_hours"] / 4)
  assert total["train_chip_hours"] == pytest.approx(
      (4 * 16.0 - read) * CHIPS / 3600)
  assert total["kept_bytes"] == sum(d["kept_bytes"] for _, d in needs)
  # The printed lines, one per arm and the grid's, with the table.
  report["cost_lines"] = cost.lines(c)
  text = compile_only.format_report(dict(
      report, topology_desc="v5e:2x2", hbm_bytes_per_device=1 << 34,
      programs=[]))
  arm_lines = [l for l in text.splitlines() if l.startswith("cost ")]
  assert len(arm_lines) == 5
  assert arm_lines[0].startswith(f"cost {runs[0].name}: 2 steps x 8 s a step + "
                                 "eval 4.5 s + baseline 1 s = ")
  assert f"x 4 chips = {per_arm * 4 / 3600:.3g} chip-hours" in arm_lines[0]
  assert arm_lines[3].startswith(f"cost {reader}: 2 steps x 5 s a step "
                                 "(shared teacher rollouts read) + ")
  assert arm_lines[-1].startswith(
      f"cost grid: 4 arms on v5e-4: {grid_s * 4 / 3600:.3g} chip-hours "
      "at the step-time bound")
  assert "lower bound" in arm_lines[-1]


def test_unshared_teacher_arms_each_count_their_rollouts(fake_compile):
  g = config_lib.load_config("configs/grid_main.py:runlocal")
  g.share_teacher_rollouts = False
  _, _, c, _ = _estimate(g)
  for a in c["per_arm"].values():
    assert not a["reads_shared_rollouts"]
    assert a["phases"]["train"]["bound_s"] == pytest.approx(2 * (3.0 + 5.0))


@pytest.mark.parametrize("ahead,calls", [(2, 1), (3, 1), (1, 2)])
def test_a_teacher_rollout_decoded_ahead_is_counted_once_per_chunk(
    fake_compile, ahead, calls):
  # runlocal: 2 steps; chunks of k steps, a short last chunk counted whole.
  g = config_lib.load_config("configs/grid_main.py:runlocal")
  g.share_teacher_rollouts = False
  g.base.rollout.decode_ahead = ahead
  _, _, c, _ = _estimate(g)
  for name, a in c["per_arm"].items():
    rollouts = calls if "policy=teacher" in name else 2  # students: per step
    assert a["phases"]["train"]["bound_s"] == pytest.approx(
        rollouts * 3.0 + 2 * 5.0), name


def test_the_shared_rollout_store_is_counted_once_per_group():
  g = config_lib.load_config("configs/grid_main.py:runlocal")
  runs = grid_lib.expand(g)
  # One group (the two teacher arms): 2 steps of three int32 [4, 8 + 8]
  # arrays (runlocal: batch 4, prompts 8, 8 new tokens) and 8 KiB of npz
  # headers allowed per step.
  want = 2 * (3 * 4 * 4 * (8 + 8) + 8 * 1024)
  assert sweep_disk.shared(g, runs) == want
  needs = sweep_disk.arms(runs)
  t = sweep_disk.totals(needs, want)
  assert t["kept_bytes"] == sum(d["kept_bytes"] for _, d in needs) + want
  assert "of shared teacher rollouts" in sweep_disk.lines(needs, want)[-1]
  g.share_teacher_rollouts = False
  assert sweep_disk.shared(g, runs) == 0


def test_rlvr_stage_and_its_evaluation_are_counted(fake_compile):
  g = config_lib.load_config("configs/grid_countdown_harder.py:runlocal")
  runs, _, c, _ = _estimate(g)
  ec = config_lib.load_config(grid_lib.eval_spec(g, runs[0]))
  grid_lib.merge(ec, g.eval.get("updates") or {}, "grid.eval.updates")
  s = ec.sampler
  assert not s.get("single_temperature") and s.greedy
  # Greedy and sampled calls of every suite, the baseline's greedy ones.
  n = int(s.num_samples)
  problems = {k: int(ec.suites[k].num_problems) for k in ec.eval_suites}
  b = int(s.batch_size)
  evaluation = sum(-(-p // b) * 0.5 + -(-p // max(1, b // n)) * 0.25
                   for p in problems.values())
  baseline = sum(-(-problems[k] // b) * 0.5 for k in ec.ood)
  # One student, one evaluation config: the baseline is evaluated once, by
  # the first arm; the other arms and every RLVR stage reuse its scores.
  for i, run in enumerate(runs):
    stage = config_lib.load_config(
        g.rlvr.base_spec.format(**run.factors))
    grid_lib.merge(stage, g.rlvr.get("updates") or {}, "grid.rlvr.updates")
    rl_steps = int(stage.total_steps)
    top_p = stage.rollout.get("top_p")
    assert top_p is None or top_p == 1.0  # no rescore program
    # Each reverse-KL teacher arm reads the teacher rollouts of the forward
    # one before it (same train_n): no train rollout.
    reads = run.factors["policy"] == "teacher" and run.factors["kl"] == "reverse"
    train = int(run.config.total_steps) * (5.0 if reads else 8.0)
    want = (train + 2 * evaluation + (0.0 if i else baseline)
            + rl_steps * (7.0 + 11.0 + (1.5 if stage.kl.get("coef") or
                                        stage.kl.get("monitor") else 0.0)))
    a = c["per_arm"][run.name]
    assert a["bound_s"] == pytest.approx(want), run.name
    assert a["phases"]["rlvr"]["bound_s"] == pytest.approx(want - (
        train + 2 * evaluation + (0.0 if i else baseline)))
    assert "rlvr baseline" not in a["phases"]
    assert a["phases"]["rlvr eval"]["bound_s"] == pytest.approx(evaluation)


@pytest.mark.slow
def test_sweep_compile_only_json_has_the_arms_chip_hours(tmp_path):
  # The command itself, compiled for a v5e:2x2 by XLA's TPU compiler (libtpu):
  # one runlocal arm; its chip-hours from the report's own bounds, counted
  # here (2 steps; Countdown-3 and -5, 4 problems each: one greedy call of
  # 8 prompts and one of 4 prompts x 2 samples per suite; the baseline's
  # greedy call on the OOD suite countdown5).
  pytest.importorskip("libtpu")
  out = subprocess.run(
      [sys.executable, "-m", "jaxdistill.sweep", "--config",
       "configs/grid_main.py:runlocal", "--workdir", str(tmp_path),
       "--only", "kl=forward,policy=student", "--compile_only=v5e:2x2",
       "--json"], cwd=ROOT, capture_output=True, text=True,
      env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=900)
  assert out.returncode == 0, out.stderr[-2000:]
  report = json.loads(out.stdout)
  b = {r["name"].partition(": ")[0]: r["step_time_bound_s"]
       for r in report["programs"]}
  want = (2 * (b["train rollout"] + b["train update"])
          + 2 * b["eval greedy"] + 2 * b["eval sampled"] + b["eval greedy"])
  (arm,) = report["cost"]["per_arm"].values()
  assert arm["bound_s"] == pytest.approx(want)
  assert report["cost"]["grid"]["chip_hours"] == pytest.approx(want * 4 / 3600)
  assert report["cost_lines"][-1].startswith("cost grid: 1 arm on v5e:2x2: ")


def test_the_spectrum_s_endpoint_arms_get_their_own_one_model_rollout():
  """rollout.lam is a value the programs do not depend on, except at the
  spectrum's endpoints, which decode with the pure policy's program
  (rollout.sampling_policy): runlocal grid_spectrum (lam -2, 0, +1) groups
  lam -2 with 0 and gives +1 its own rollout (it used to share lam -2's
  two-model program, so --compile_only and the cost measured the wrong one)."""
  grid = config_lib.load_config("configs/grid_spectrum.py:runlocal")
  with sharding.compiling_for("tpu"):
    programs, arms = sweep_programs.grid_programs(
        grid, compile_only.target("v5e-4"), log=lambda _: None)
  rollouts = sorted(sorted(a.split(",")[1] for a in arms[p.name])
                    for p in programs if p.name.startswith("train rollout"))
  assert rollouts == [["lam=-2.0", "lam=0.0"], ["lam=-2.0", "lam=0.0"],
                      ["lam=1.0"], ["lam=1.0"]]
