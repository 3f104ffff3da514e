"""The sweep's plan says what disk each arm and the grid need (sweep/disk.py)."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

from jaxdistill import config_lib
from jaxdistill.sweep import disk as sweep_disk
from jaxdistill.sweep import grid as grid_lib
from jaxdistill.train import disk as train_disk
from jaxdistill.train import setup as train_setup

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _gb(text: str) -> float:
  number, unit = text.split()
  return float(number) * {"MB": 1e-3, "GB": 1.0, "TB": 1e3}[unit]


def test_grid_totals_against_a_disk_timeline():
  # Three arms of different sizes trained one after another: the disk holds
  # the finished arms' kept bytes plus the running arm's peak.
  needs = [("a", {"peak_bytes": 50, "kept_bytes": 20}),
           ("b", {"peak_bytes": 10, "kept_bytes": 5}),
           ("c", {"peak_bytes": 40, "kept_bytes": 30})]
  timeline = [50, 20 + 10, 20 + 5 + 40, 20 + 5 + 30]
  t = sweep_disk.totals(needs)
  assert t == {"runs": 3, "kept_bytes": 55, "sweep_peak_bytes": max(timeline),
               "all_at_once_bytes": 100, "shared_rollouts_bytes": 0}
  # A store of shared teacher rollouts of 7 bytes is on the disk throughout.
  t = sweep_disk.totals(needs, 7)
  assert t == {"runs": 3, "kept_bytes": 62,
               "sweep_peak_bytes": 7 + max(timeline),
               "all_at_once_bytes": 107, "shared_rollouts_bytes": 7}


def test_each_arm_s_disk_is_its_run_s():
  g = config_lib.load_config("configs/grid_main.py:runlocal")
  runs = grid_lib.expand(g)
  for (name, d), run in zip(sweep_disk.arms(runs), runs):
    assert name == run.name and d["keep_final_only"]
    scfg = train_setup.model_config(run.config.student, "student")
    assert d == train_disk.need(run.config, scfg)


@pytest.mark.slow
def test_print_commands_say_each_arm_s_disk_and_the_grid_s(tmp_path):
  out = subprocess.run(
      [sys.executable, "-m", "jaxdistill.sweep", "--config",
       "configs/grid_main.py:runlocal", "--workdir", str(tmp_path),
       "--print_commands"], cwd=ROOT, capture_output=True, text=True,
      env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  lines = out.stdout.strip().splitlines()
  runs = grid_lib.expand(config_lib.load_config("configs/grid_main.py:runlocal"))
  assert len(lines) == 2 * len(runs) + 2
  assert lines[-2].startswith("# then, to evaluate the runs"), lines[-2]
  kept = 0.0
  for i, run in enumerate(runs):
    note, cmd = lines[2 * i], lines[2 * i + 1]
    assert note.startswith(f"# {run.name}: disk: "), note
    assert "(the final checkpoint and the export)" in note
    assert cmd.startswith("python -m jaxdistill.train ") and run.dirname in cmd
    kept += _gb(re.search(r"([\d.]+ [MGT]B) kept after", note).group(1))
  m = re.fullmatch(r"# grid: (\d+) runs keep ([\d.]+ [MGT]B) once finished "
                   r"\(with ([\d.]+ [MGT]B) of shared teacher rollouts\); .*",
                   lines[-1])
  assert m and int(m.group(1)) == len(runs)
  # The two teacher arms' store: 2 steps of three int32 [4, 16] arrays and
  # the 8 KiB allowance each.
  assert _gb(m.group(3)) == pytest.approx(2 * (3 * 4 * 4 * 16 + 8192) / 1e9,
                                          rel=0.01)
  assert _gb(m.group(2)) == pytest.approx(kept + _gb(m.group(3)), rel=0.01)


@pytest.mark.slow
def test_the_command_prints_one_run_s_disk():
  out = subprocess.run(
      [sys.executable, "-m", "jaxdistill.sweep.disk", "--config",
       "configs/distill.py:runlocal"], cwd=ROOT, capture_output=True,
      text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  c = config_lib.load_config("configs/distill.py:runlocal")
  d = train_disk.need(c, train_setup.model_config(c.student, "student"))
  assert out.stdout.strip() == train_disk.describe(d)


def test_rlvr_stages_are_counted_after_the_arms():
  g = config_lib.load_config("configs/grid_countdown_harder.py:runlocal")
  runs = grid_lib.expand(g)
  arms, stages = sweep_disk.arms(runs), sweep_disk.stages(g, runs)
  assert [n for n, _ in stages] == [f"{r.name} (RLVR stage)" for r in runs]
  for (_, a), (_, s) in zip(arms, stages):
    # The stage trains the arm's student: the same float32 weights and
    # AdamW moments, and keeps only its final checkpoint too.
    assert s["state_bytes"] == a["state_bytes"] and s["keep_final_only"]
  assert sweep_disk.totals(arms + stages)["runs"] == 2 * len(runs)
  assert not sweep_disk.stages(
      config_lib.load_config("configs/grid_main.py:runlocal"), runs)
