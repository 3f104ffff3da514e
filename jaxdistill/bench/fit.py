"""Benchmark: do the study's real pairs fit the TPU slices users rent?

  python -m jaxdistill.bench.fit                  # the README's table
  python -m jaxdistill.bench.fit --families qwen05b --slices v5e-8 --markdown

For each family (configs/distill.py with the pair's presets and real
vocabulary) and slice, `python -m jaxdistill.train ... --compile_only=SLICE`
in this process: every program of a distillation run compiled for the slice
by XLA's TPU compiler on this host (jaxdistill/compile_only.py; needs
libtpu: pip install -e '.[tpu]'). Prints one JSON object: per family and
slice the per-chip memory of each program, its headroom, the roofline step
time bound and MFU ceiling; the headline is the share of (family, slice)
pairs whose programs all fit with the required headroom (goal: those the
study runs on, table STUDY below). `--markdown` prints the README's table
instead. Programs compiled before are read back from compile_only's cache
(~/.cache/jaxdistill/compile_only), so a rerun is quick; a first run takes
minutes per program on a small host.

For scale: MaxText reports 45.5 % MFU for Llama-3.1-8B pretraining on a
v6e-256 (its README's table); a distillation step, which also runs a teacher
forward and whose rollouts decode token by token, should approach that in
its update and not in its rollout (memory-bound: its ceiling is low).
"""
from __future__ import annotations

import argparse
import json
import sys

from jaxdistill import config_lib
from jaxdistill.train import loop

# family: (student preset, teacher preset, real vocabulary).
FAMILIES = {
    "qwen05b": ("qwen2.5-0.5b", "qwen2.5-7b", 151665),
    "qwen15b": ("qwen2.5-1.5b", "qwen2.5-7b", 151665),
    "llama": ("llama-3.2-1b", "llama-3.1-8b", 128000),
}
SLICES = ("v5e-8", "v6e-8", "v5p-8")
# Where the study runs each family (the goal: every program fits there).
STUDY = {"qwen05b": "v5e-8", "qwen15b": "v5e-8", "llama": "v6e-8"}
MAXTEXT_MFU = 0.455  # Llama-3.1-8B pretraining, v6e-256 (MaxText's README)


def family_config(family: str, spec: str = "configs/distill.py"):
  student, teacher, vocab = FAMILIES[family]
  c = config_lib.load_config(spec)
  c.student.preset, c.teacher.preset = student, teacher
  c.loss.vocab_size = vocab
  return c


def markdown(results) -> str:
  lines = ["| family (student <- teacher) | slice | program | per-chip memory "
           "GiB (of HBM) | headroom | step-time bound | MFU ceiling |",
           "|---|---|---|---|---|---|---|"]
  for r in results:
    s, t, _ = FAMILIES[r["family"]]
    for p in r["report"]["programs"]:
      hbm = r["report"]["hbm_bytes_per_device"] / 2**30
      ceiling = "-" if p["mfu_ceiling"] is None else f"{p['mfu_ceiling']:.2f}"
      lines.append(
          f"| {r['family']} ({s} <- {t}) | {r['slice']} | {p['name']} | "
          f"{p['total_bytes'] / 2**30:.1f} ({hbm:.0f}) | {p['headroom']:.0%}"
          f"{'' if p['fits'] else ' (does not fit)'} | "
          f"{p['step_time_bound_s'] * 1e3:.0f} ms ({p['bound_by']}) | "
          f"{ceiling} |")
  return "\n".join(lines)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--families", default=",".join(FAMILIES))
  ap.add_argument("--slices", default=",".join(SLICES))
  ap.add_argument("--markdown", action="store_true",
                  help="print the README's table instead of the JSON")
  args = ap.parse_args(argv)
  results = []
  for family in args.families.split(","):
    if family not in FAMILIES:
      raise SystemExit(f"error: --families: unknown {family!r}; choose from "
                       f"{sorted(FAMILIES)}")
    for sl in args.slices.split(","):
      report = loop.compile_for(family_config(family), sl)
      results.append({"family": family, "slice": sl, "report": report,
                      "fits": all(p["fits"] for p in report["programs"])})
  if args.markdown:
    print(markdown(results))
    return results
  study = [r for r in results if STUDY.get(r["family"]) == r["slice"]]
  fit = sum(r["fits"] for r in study)
  out = {
      "headline": {"name": "study pairs whose programs all fit their slice "
                           "(>= 10 % HBM free)",
                   "value": f"{fit}/{len(study)}", "unit": "pairs",
                   "goal": "all", "meets_goal": bool(study) and fit == len(study)},
      "maxtext_reference_mfu": MAXTEXT_MFU,
      "results": results}
  print(json.dumps(out, indent=1, default=str))
  sys.stdout.flush()
  return results


if __name__ == "__main__":
  main()
