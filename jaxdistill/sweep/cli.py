r"""Run a grid of distillation runs, or print their launch commands.

  # Every arm, one after another, then the table and figures (checkpoints
  # and data by hub name, configs/grid_main.py's defaults):
  python -m jaxdistill.sweep --config configs/grid_main.py:families=qwen05b \
      --workdir /runs/main
  # Local checkpoints instead:
  python -m jaxdistill.sweep --config configs/grid_main.py:families=llama \
      --config.presets.family.llama.student.path=/ckpt/Llama-3.2-1B-Instruct \
      --config.presets.family.llama.teacher.path=/ckpt/Llama-3.1-8B-Instruct \
      --workdir /runs/main
  # One launch command per run, for a cluster (each on one machine):
  python -m jaxdistill.sweep --config configs/grid_spectrum.py ... \
      --workdir /runs/spectrum --print_commands
  # A multi-host TPU slice: the same command on every host, one arm at a
  # time over all chips (training and evaluation), the workdir shared:
  python -m jaxdistill.sweep --config configs/grid_main.py:families=llama \
      --workdir /mnt/shared/main --distributed
  # Or one command per run for such a slice, each to run on every host:
  python -m jaxdistill.sweep ... --print_commands --distributed
  # Only the runs whose name contains a string; tiny CPU version of a grid:
  python -m jaxdistill.sweep --config configs/grid_main.py:runlocal \
      --workdir /tmp/grid --only kl=reverse

Before the commands, and in the sweep's log before the first arm, each
arm's disk is printed (its peak while training and what it keeps: the final
checkpoint and the export for the grids' arms, keep_final_only) with the
grid's total (sweep/disk.py).

With --compile_only=SLICE the sweep compiles every distinct program of its
arms for the slice (sweep/programs.py) and prints, per arm and for the
grid, the chip-hours of its training, evaluation and RLVR stage at the
programs' step-time bounds and physical limits, beside the disk each arm
keeps (sweep/cost.py; a lower bound, chip-hours only); --json holds them
under "cost".

With grid.share_teacher_rollouts (on in the study grids) the teacher-policy
arms that would sample the same rollouts decode each step once, into
<workdir>/shared_rollouts, and the others read it (train/shared_rollouts.py;
their printed commands carry --shared_rollouts; not with --distributed yet).

Before the first arm, hub names are pinned to their commits and the data
sets read by name are prepared into <workdir>/data (sweep/inputs.py); the
printed commands carry the pinned names. Each run gets <workdir>/<run name>/
(run_config.json, config.json, checkpoints, metrics.jsonl, hf_student/,
eval.json, results.json); finished runs (results.json present) are skipped
and interrupted ones resume from their checkpoints. The summary (results.csv,
results.md, figures) goes to <workdir>/summary/.

After cluster runs of the printed commands have finished, the same command
without --print_commands (same --workdir) evaluates and tabulates them:
train.train finds each run at its final step and trains nothing.

A grid config with an `rlvr` block (jaxdistill/sweep/rlvr.py; e.g.
configs/grid_countdown_harder.py) adds GRPO after the arms: each chosen arm
gets <workdir>/<run name>/rlvr/ (trained from the arm's hf_student/, then
evaluated like the arm), and the summary tables accuracy before RLVR, after
it and the change. --print_commands prints one `python -m
jaxdistill.rl.train` line per stage after the training lines.

Functions for other code (the demo uses them):
  grid_lib.expand(grid, only=None) -> [Run]          the runs of a grid config
  grid_lib.command(grid, run, workdir) -> str        its `python -m jaxdistill.train` line
  runner.run_sweep(grid, workdir, only=None, evaluate_fn=None, devices=None)
  aggregate(workdir) -> rows                one row per finished run
  write_table(rows, out_dir) -> (csv, md)   per arm: mean, std, n over seeds
  make_figures(rows, out_dir) -> [paths]
"""
from __future__ import annotations

import functools
import os
import sys

from absl import flags
import jax
from ml_collections import config_flags

from jaxdistill import cli
from jaxdistill import compile_only
from jaxdistill import storage
from jaxdistill.sweep import cost as sweep_cost
from jaxdistill.sweep import disk as sweep_disk
from jaxdistill.sweep import grid as grid_lib
from jaxdistill.sweep import inputs
from jaxdistill.sweep import programs as sweep_programs
from jaxdistill.sweep import rlvr
from jaxdistill.sweep import runner
from jaxdistill.sweep import table
from jaxdistill.train import distributed


def print_rlvr_commands(grid, runs, workdir, extra=""):
  """One `python -m jaxdistill.rl.train` line per arm's RLVR stage, to run
  after that arm's training; with grid.rlvr.select, once every arm has
  finished (the choice needs their results)."""
  results = {}
  for run in runs:
    path = os.path.join(workdir, run.dirname, "results.json")
    if os.path.isfile(path):
      results[run.name] = table.read_results(path)
  chosen = rlvr.select(grid, runs, results)
  if chosen is None:
    print("# RLVR stage: grid.rlvr.select chooses arms by their results; run "
          "the commands above, then this command again (or the sweep without "
          "--print_commands) for the RLVR commands")
    return
  for run in chosen:
    print(rlvr.command(grid, run, workdir) + extra)


def main(argv):
  del argv
  f = flags.FLAGS
  grid = f.config
  if f.print_commands:  # printing joins no cluster; the commands will
    if any(getattr(f, k) is not None for k in distributed.FLAG_NAMES):
      raise ValueError("--print_commands: the commands it prints take "
                       "--distributed alone; run them with the cluster "
                       "flags on each host")
  elif not f.compile_only:
    distributed.initialize_from_flags(f)
  if f.workdir is not None:
    storage.check(f.workdir, "--workdir", gs_ok=True)
  if f.compile_only:
    report = sweep_programs.compile_for(grid, f.compile_only, f.only)
    runs = grid_lib.expand(grid, f.only)
    needs = sweep_disk.arms(runs) + sweep_disk.stages(grid, runs)
    store = sweep_disk.shared(grid, runs)
    report["disk"] = {"per_run": dict(needs),
                      **sweep_disk.totals(needs, store)}
    report["disk_lines"] = sweep_disk.lines(needs, store)
    report["cost"] = sweep_cost.estimate(grid, runs, report, needs, store)
    report["cost_lines"] = sweep_cost.lines(report["cost"])
    compile_only.emit(report, f.json)
    compile_only.check(report, advice=functools.partial(
        sweep_programs.advice, grid))
    return
  if f.print_commands:
    runs = inputs.plan(grid, f.workdir, f.only, is_finished=runner.is_finished,
                       log=runner.log)
    if not runs:
      raise ValueError(f"--only {f.only!r}: no run of the grid matches")
    extra = " --distributed" if f.distributed else ""
    if f.distributed:
      print("# multi-host: run each command on every host of the slice "
            "(e.g. gcloud compute tpus tpu-vm ssh NAME --worker=all "
            "--command='...'), one after another")
      if grid.get("share_teacher_rollouts"):
        print("# teacher rollouts are not shared between multi-host runs "
              "yet: each teacher-policy arm decodes its own")
        grid.share_teacher_rollouts = False
    disk = sweep_disk.lines(sweep_disk.arms(runs) +
                            sweep_disk.stages(grid, runs),
                            sweep_disk.shared(grid, runs))
    for run, line in zip(runs, disk):
      # snapshots first: a command may read its run's
      grid_lib.write_snapshot(run, os.path.join(f.workdir, run.dirname))
      print(f"# {line}")
      print(grid_lib.command(grid, run, f.workdir) + extra)
    if rlvr.declared(grid):
      for line in disk[len(runs):-1]:
        print(f"# {line}")
      print_rlvr_commands(grid, runs, f.workdir, extra)
    print("# then, to evaluate the runs and tabulate them: this command "
          "without --print_commands" + (" (on every host)" if extra else ""))
    print(f"# {disk[-1]}")
    return
  runner.run_sweep(grid, f.workdir, only=f.only, rerun_stale=f.rerun_stale)
  if jax.process_index() == 0:  # it wrote the summary
    print(storage.read_text(f"{f.workdir}/summary/results.md"))
  sys.stdout.flush()


def define_flags():
  config_flags.DEFINE_config_file(
      "config", None, "Grid config file (configs/grid_*.py[:arg]).",
      lock_config=False)
  flags.DEFINE_string("workdir", None, "Sweep directory: one subdir per run.")
  flags.DEFINE_bool("print_commands", False,
                    "Print one launch command per run instead of running.")
  flags.DEFINE_string("only", None, "Only runs whose name contains this.")
  flags.DEFINE_bool("rerun_stale", False,
                    "Rerun runs trained under a config other than the grid's "
                    "now (moved into <workdir>/stale/); default: refuse.")
  distributed.define_flags()
  compile_only.define_flags()
  flags.mark_flags_as_required(["config", "workdir"])
