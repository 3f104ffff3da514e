r"""The disk a grid's arms need (train/disk.py per arm), for its plan.

Per arm: the peak while it trains and what it keeps once finished. For the
grid: what all finished arms keep; what a sweep, which trains one arm at a
time, needs at most (the arms before the one training keep theirs); and
what all arms need when their printed commands run at once. A grid with
an RLVR stage (grid.rlvr) counts one stage per arm, trained after every arm
from the arm's student (all arms: an upper bound when grid.rlvr.select
picks some). With grid.share_teacher_rollouts the grid's figures add the
store of shared teacher rollouts (<workdir>/shared_rollouts: one copy of
each group's steps, train/shared_rollouts.py store_bytes), written while
the first arm of a group trains and kept. The sweep prints these lines
with --print_commands and in its log; on their own, without weights or data
(a preset gives a model's shapes without its hub config.json):

  python -m jaxdistill.sweep.disk --config configs/grid_main.py:families=qwen15b \
      --config.base.student.preset=qwen2.5-1.5b
  python -m jaxdistill.sweep.disk --config configs/distill.py   # one run
"""
from __future__ import annotations

from absl import flags
from ml_collections import config_flags

from jaxdistill import cli
from jaxdistill.sweep import grid as grid_lib
from jaxdistill.sweep import programs as sweep_programs
from jaxdistill.sweep import rlvr as rlvr_lib
from jaxdistill.train import disk as disk_lib
from jaxdistill.train import setup as train_setup
from jaxdistill.train import shared_rollouts as shared_lib


def arms(runs) -> list[tuple[str, dict]]:
  """[(run name, train.disk.need)] in the grid's order."""
  return [(run.name, disk_lib.need(
      run.config, train_setup.model_config(run.config.student, "student")))
          for run in runs]


def stages(grid, runs) -> list[tuple[str, dict]]:
  """[(name, train.disk.need)] of the arms' RLVR stages ([] without
  grid.rlvr)."""
  if not rlvr_lib.declared(grid):
    return []
  out = []
  for run in runs:
    stage = sweep_programs.as_policy(
        rlvr_lib.stage_config(grid, run, "<arm>"), run.config)
    out.append((f"{run.name} (RLVR stage)", disk_lib.need(
        stage, train_setup.model_config(stage.student, "student"))))
  return out


def shared(grid, runs) -> int:
  """Bytes of the grid's store of shared teacher rollouts (0 without
  grid.share_teacher_rollouts or a teacher-policy arm)."""
  return shared_lib.store_bytes(
      [r.config for r in runs if grid_lib.shares_rollouts(grid, r)])


def totals(needs, shared_bytes: int = 0) -> dict:
  """The grid's figures (module docstring); `shared_bytes` (`shared`) is
  counted whole in each, as if written at the start."""
  kept = sum(d["kept_bytes"] for _, d in needs) + shared_bytes
  before, one_at_a_time = shared_bytes, 0
  for _, d in needs:
    one_at_a_time = max(one_at_a_time, before + d["peak_bytes"])
    before += d["kept_bytes"]
  return {"runs": len(needs), "kept_bytes": kept,
          "shared_rollouts_bytes": shared_bytes,
          "sweep_peak_bytes": one_at_a_time,
          "all_at_once_bytes": sum(d["peak_bytes"] for _, d in needs)
                               + shared_bytes}


def lines(needs, shared_bytes: int = 0) -> list[str]:
  """One line per run (arm or stage) and one for the grid."""
  gb = disk_lib.gb
  out = [f"{name}: {disk_lib.describe(d)}" for name, d in needs]
  t = totals(needs, shared_bytes)
  store = (f" (with {gb(shared_bytes)} of shared teacher rollouts)"
           if shared_bytes else "")
  out.append(f"grid: {t['runs']} runs keep {gb(t['kept_bytes'])} once "
             f"finished{store}; the sweep (one run at a time) needs at most "
             f"{gb(t['sweep_peak_bytes'])}, all at once "
             f"{gb(t['all_at_once_bytes'])}")
  return out


def main(argv):
  del argv
  c = flags.FLAGS.config
  if "axes" in c and "base" in c:
    runs = grid_lib.expand(c, flags.FLAGS.only)
    if not runs:
      raise ValueError(f"--only {flags.FLAGS.only!r}: no run of the grid matches")
    for line in lines(arms(runs) + stages(c, runs), shared(c, runs)):
      print(line)
  else:  # one training run (configs/distill.py, configs/grpo_*.py)
    scfg = train_setup.model_config(c.student, "student")
    print(disk_lib.describe(disk_lib.need(c, scfg)))


def define_flags():
  config_flags.DEFINE_config_file(
      "config", None, "A grid config (configs/grid_*.py[:arg]) or a training "
      "config.", lock_config=False)
  flags.DEFINE_string("only", None, "Only arms whose name contains this.")
  flags.mark_flags_as_required(["config"])


if __name__ == "__main__":
  cli.run_absl(main, define_flags)
