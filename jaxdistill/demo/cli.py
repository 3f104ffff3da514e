"""`python -m jaxdistill.demo [--quick] [--workdir DIR] [--seed N] [--config SPEC]`.

Writes <workdir>/results/{results.md, results.csv, results.json, findings.md,
*.png} and prints the table and the findings to stdout (progress to stderr).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

DEFAULT_WORKDIR = "~/.cache/jaxdistill/demo"


def parse(argv):
  p = argparse.ArgumentParser(prog="python -m jaxdistill.demo",
                              description=__doc__.splitlines()[0])
  p.add_argument("--quick", action="store_true",
                 help="smaller grid and models (< 2 min; used by the tests)")
  p.add_argument("--workdir", default=None,
                 help=f"cache and outputs (default {DEFAULT_WORKDIR}, or "
                 "<workdir>-quick with --quick)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--config", default="configs/demo.py",
                 help="settings file[:args], e.g. configs/demo.py:arm_steps=60")
  return p.parse_args(argv)


def load_config(args):
  from jaxdistill.study import grid as grid_lib  # pylint: disable=g-import-not-at-top
  path, _, arg = args.config.partition(":")
  extra = [a for a in (arg, "quick" if args.quick else "",
                       f"seed={args.seed}") if a]
  return grid_lib.load_config(f"{path}:{','.join(extra)}")


def main(argv=None) -> dict:
  args = parse(sys.argv[1:] if argv is None else argv)
  cfg = load_config(args)
  if args.seed < 0:
    raise ValueError(f"--seed: must be >= 0, got {args.seed}")
  workdir = args.workdir or (DEFAULT_WORKDIR + ("-quick" if args.quick else ""))
  workdir = os.path.abspath(os.path.expanduser(workdir))
  from jaxdistill.demo import report  # pylint: disable=g-import-not-at-top
  from jaxdistill.demo import study  # pylint: disable=g-import-not-at-top
  from jaxdistill.study import figures, table  # pylint: disable=g-import-not-at-top
  res = study.run(cfg, workdir)
  out = os.path.join(workdir, "results")
  os.makedirs(out, exist_ok=True)
  rows = report.rows_with_extras(res["rows"], res["grid_dir"])
  table.write_table(res["rows"], out)  # results.csv / results.md per arm
  figs = figures.make_figures(res["rows"], out)
  md = report.table_markdown(rows, res["teacher"], res["student"])
  from jaxdistill.demo import tasks  # pylint: disable=g-import-not-at-top
  found = report.findings(rows, res["teacher"], res["student"],
                          int(cfg.data.test_problems), chance=tasks.CHANCE)
  text = report.paragraph(found)
  with open(os.path.join(out, "demo_table.md"), "w") as f:
    f.write(md + "\n")
  with open(os.path.join(out, "findings.md"), "w") as f:
    f.write(text + "\n")
  summary = {"rows": rows, "teacher": res["teacher"], "student": res["student"],
             "findings": [{"finding": n, "reproduced": ok, "sentence": s}
                          for n, ok, s in found],
             "figures": figs, "seconds": res["seconds"],
             "config": cfg.to_dict()}
  with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(summary, f, indent=2, sort_keys=True, default=str)
  print(md)
  print()
  print(text)
  print(f"\nfiles: {out} (figures: {', '.join(os.path.basename(p) for p in figs)})")
  print(f"time: {res['seconds']['total']:.0f} s (models {res['seconds']['models']:.0f}"
        f" s, grid {res['seconds']['grid']:.0f} s)")
  sys.stdout.flush()
  return summary
