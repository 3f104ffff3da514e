"""`python -m jaxdistill.demo [--quick | --spectrum] [--seeds N] [--rlvr] [--workers N] [--workdir DIR] [--config SPEC]`.

Writes <workdir>/results/<settings>/{demo_table.md, findings.md, results.csv,
results.md, results.json, *.png} and prints the table and the findings to
stdout (progress to stderr). <settings> names the variant and a hash of every
setting, so runs of different settings never overwrite each other's results.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from jaxdistill import config_lib
from jaxdistill import storage
from jaxdistill.demo import build
from jaxdistill.demo import report
from jaxdistill.demo import study
from jaxdistill.demo import tasks
from jaxdistill.demo import workers
from jaxdistill.sweep import table

DEFAULT_WORKDIR = "~/.cache/jaxdistill/demo"


def parse(argv):
  p = argparse.ArgumentParser(prog="python -m jaxdistill.demo",
                              description=__doc__.splitlines()[0])
  p.add_argument("--quick", action="store_true",
                 help="smaller grid and models (< 2 min; used by the tests)")
  p.add_argument("--spectrum", action="store_true",
                 help="the paper's spectrum, lambda in {-2, -1, 0, 1, 2}, x KL direction at one "
                 "learning rate instead of the default grid")
  p.add_argument("--seeds", type=int, default=1,
                 help="run every arm with this many seeds (table: mean and "
                 "spread; figures: spread over seeds)")
  p.add_argument("--rlvr", action="store_true",
                 help="after the grid, GRPO from the best arm of each KL "
                 "direction x rollout policy, evaluated again (adds < 10 min)")
  p.add_argument("--workdir", default=None,
                 help=f"cache and outputs (default {DEFAULT_WORKDIR}, or "
                 "<workdir>-quick with --quick)")
  p.add_argument("--workers", type=int, default=None,
                 help="processes that train arms side by side, each on its "
                 "own cores (default: one per CPU core, at most one per arm; "
                 "1 with --quick, whose arms take seconds)")
  p.add_argument("--seed", type=int, default=0)
  # A worker of jaxdistill.demo.workers: these arms, on these cores.
  p.add_argument("--worker-runs", help=argparse.SUPPRESS)
  p.add_argument("--worker-model", choices=("student",), help=argparse.SUPPRESS)
  p.add_argument("--worker-cores", help=argparse.SUPPRESS)
  p.add_argument("--worker-report", help=argparse.SUPPRESS)
  p.add_argument("--worker-name", help=argparse.SUPPRESS)
  p.add_argument("--config", default="configs/demo.py",
                 help="settings file[:args], e.g. configs/demo.py:arm_steps=60")
  return p.parse_args(argv)


def load_config(args):
  path, _, arg = args.config.partition(":")
  extra = [a for a in (arg, "quick" if args.quick else "",
                       "spectrum" if args.spectrum else "",
                       "rlvr" if args.rlvr else "",
                       f"seed={args.seed}", f"seeds={args.seeds}") if a]
  return config_lib.load_config(f"{path}:{','.join(extra)}")


def results_name(args, cfg) -> str:
  """'<variant>-<hash of every setting>', e.g. 'default-1a2b3c4d5e6f'."""
  parts = [p for p, on in (("quick", args.quick), ("spectrum", args.spectrum),
                           (f"seeds{args.seeds}", args.seeds > 1),
                           ("rlvr", args.rlvr)) if on]
  return "-".join(parts or ["default"]) + "-" + build.cache_key(cfg.to_dict())


def main(argv=None) -> dict | None:
  argv = list(sys.argv[1:] if argv is None else argv)
  args = parse(argv)
  worker = args.worker_runs is not None or args.worker_model is not None
  if worker:  # before JAX sizes its thread pools
    workers.pin([int(c) for c in args.worker_cores.split(",")])
    build.PREFIX = f"[demo worker {args.worker_name}]"
  if args.workers is not None and args.workers < 1:
    raise ValueError(f"--workers: must be >= 1, got {args.workers}")
  if args.seed < 0:
    raise ValueError(f"--seed: must be >= 0, got {args.seed}")
  if args.seeds < 1:
    raise ValueError(f"--seeds: must be >= 1, got {args.seeds}")
  if args.quick and args.spectrum:
    raise ValueError("--quick, --spectrum: choose one")
  cfg = load_config(args)
  workdir = args.workdir or (DEFAULT_WORKDIR + ("-quick" if args.quick else ""))
  workdir = os.path.abspath(storage.check(workdir, "--workdir"))
  if worker:
    return study.run(cfg, workdir, worker_model=args.worker_model,
                     worker_runs=args.worker_runs and [
                         int(i) for i in args.worker_runs.split(",")],
                     worker_report=args.worker_report)
  n = args.workers or (1 if args.quick else workers.default_workers(
      len(cfg.grid.kl) * len(cfg.grid.policy) * len(cfg.grid.lrs) *
      len(cfg.grid.precisions) * cfg.seeds))
  res = study.run(cfg, workdir, workers=n,
                  argv=argv + ["--workdir", workdir])
  out = os.path.join(workdir, "results", results_name(args, cfg))
  os.makedirs(out, exist_ok=True)
  runs = report.rows_with_extras(res["rows"], res["grid_dir"])
  arms = report.arm_means(runs)
  table.write_table(res["rows"], out)  # results.csv / results.md per arm
  n_test = res["n_test"]
  # The study's findings and figures on the first precision's arms (the
  # others differ in how weights are stored; compared in their own finding).
  first = cfg.grid.precisions[0]
  figs = report.make_figures([r for r in runs if r["precision"] == first],
                             res["teacher"], res["student"], n_test, out)
  md = report.table_markdown(arms, res["teacher"], res["student"], n_test)
  for extra in (report.sparsity_markdown(arms),
                report.rlvr_markdown(arms, n_test)):
    if extra:
      md += "\n\n" + extra
  found = report.findings([a for a in arms if a["precision"] == first],
                          res["teacher"], res["student"], n_test,
                          chance=tasks.CHANCE, figures=figs)
  found += report.precision_finding(arms, n_test)
  text = report.paragraph(found)
  with open(os.path.join(out, "demo_table.md"), "w") as f:
    f.write(md + "\n")
  with open(os.path.join(out, "findings.md"), "w") as f:
    f.write(text + "\n")
  summary = {"rows": runs, "arms": arms, "teacher": res["teacher"],
             "student": res["student"], "n_test": n_test,
             "findings": [{"finding": n, "reproduced": ok, "sentence": s}
                          for n, ok, s in found],
             "figures": figs, "seconds": res["seconds"],
             "arms_run": res["arms_run"], "rlvr_run": res["rlvr_run"],
             "results_dir": out, "grid_dir": res["grid_dir"],
             "config": cfg.to_dict()}
  with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(summary, f, indent=2, sort_keys=True, default=str)
  s = res["seconds"]
  print(md)
  print()
  print(text)
  print(f"\nfiles: {out} (figures: {', '.join(os.path.basename(p) for p in figs)})")
  rl = (f", RLVR {s['rlvr']:.0f} s ({res['rlvr_run']} stages run, "
        f"evaluation {s['rlvr_evaluation']:.0f} s of it)" if res["rlvr"] else "")
  by = (f" by {s['grid_workers']} workers" if s["grid_workers"] > 1 else "")
  print(f"time: {s['total']:.0f} s (teacher and student {s['models']:.0f} s, "
        f"grid training {s['grid_training']:.0f} s{by}, evaluation "
        f"{s['evaluation']:.0f} s{rl}; {res['arms_run']} arms run, the rest "
        "cached)")
  sys.stdout.flush()
  return summary
