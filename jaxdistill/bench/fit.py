"""Benchmark: do the study's real pairs fit the TPU slices users rent?

  python -m jaxdistill.bench.fit                  # configs/distill.py, 3 pairs
  python -m jaxdistill.bench.fit --configs all --markdown   # docs/tpu.md's table
  python -m jaxdistill.bench.fit --families llama --slices v5e-8,v5p-8
  python -m jaxdistill.bench.fit --configs all --slices h100-8 --markdown  # docs/gpu.md

For each family (configs/distill.py with the pair's presets and real
vocabulary) and slice, `python -m jaxdistill.train ... --compile_only=SLICE`
in this process: every program of a distillation run compiled for the slice
by XLA's TPU compiler on this host (jaxdistill/compile_only.py; needs
libtpu: pip install -e '.[tpu]'). `--configs` adds the study's other
configs (table CONFIGS: the grids through `python -m jaxdistill.sweep
--compile_only`, every distinct program of their arms, RLVR stages included;
GRPO through `python -m jaxdistill.rl.train --compile_only`), each with its
own pair. Every pair compiles for the slice the study runs it on (STUDY)
unless --slices names others. Prints one JSON object: per config, family and slice the per-chip
memory of each program, its headroom, the bytes its collectives move
into each chip (ICI), the roofline step time bound (compute, HBM or ICI,
whichever binds) and MFU ceiling; the headline is the share of (config, family, slice) runs whose
programs all fit with the required headroom (goal: those on the study's
slices); a distillation run's `step` sums its rollout's and update's
bounds and physical limits (compile_only: every weight read in place, at
peak FLOPs) and gives their ratio. `--markdown` prints docs/tpu.md's fit table instead. Programs compiled before are read back from compile_only's cache
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
from jaxdistill.rl import train as rl_train
from jaxdistill.sweep import programs as sweep_programs
from jaxdistill.train import loop

# family: (student preset, teacher preset, real vocabulary).
FAMILIES = {
    "qwen05b": ("qwen2.5-0.5b", "qwen2.5-7b", 151665),
    "qwen15b": ("qwen2.5-1.5b", "qwen2.5-7b", 151665),
    "llama": ("llama-3.2-1b", "llama-3.1-8b", 128000),
    # The style transfer's pair (App. D.7): a 3B teacher; grid_spanish only.
    "qwen15b_3b": ("qwen2.5-1.5b", "qwen2.5-3b", 151665),
    # The Numina-MATH grid's pair (App. A.3): Qwen2.5-Math-1.5B-Instruct
    # teaching Qwen2.5-1.5B-Instruct; grid_math only.
    "qwen15b_math": ("qwen2.5-1.5b", "qwen2.5-math-1.5b", 151665),
}
# The families of the study's main pairs (configs/distill.py, grid_main).
MAIN = ("qwen05b", "qwen15b", "llama")
SLICES = ("v5e-8", "v6e-8", "v5p-8")
# Where the study runs each family (the goal: every program fits there).
# Qwen2.5-1.5B <- 7B at the paper's Table 3 lengths (prompt 2,048 +
# completion 512 / 1,024, 32 rows) fits a v5e-8 since the fused loss runs
# vocab-parallel and the rollout prefills in 512-position passes: per chip,
# update 14.7 -> 9.2 GiB (512) / 9.3 (1,024), teacher rollout at 1,024
# 15.3 -> 8.0 GiB (compile_only; losses/fused.py, rollout/generation.py).
STUDY = {"qwen05b": "v5e-8", "qwen15b": "v5e-8", "llama": "v6e-8",
         "qwen15b_3b": "v5e-8", "qwen15b_math": "v5e-8"}
MAXTEXT_MFU = 0.455  # Llama-3.1-8B pretraining, v6e-256 (MaxText's README)


# config: (kind, spec, families). kind: "train" (a distillation run),
# "sweep" (a grid: its base run takes the family's pair) or "rl" (GRPO: the
# family's student as the policy). The pairs are the configs' own: the
# spectrum grid distils Llama-3.2-1B and Qwen2.5-1.5B (the paper's Sec. 5.2,
# App. A.5), the paper's Countdown-3 / MedReason grids and its RLVR stage
# (App. D.6) Llama-3.2-1B, the top-k grid Qwen2.5-0.5B, the harder Countdown
# grid Qwen2.5-1.5B, the Numina-MATH grid Qwen2.5-1.5B <- Qwen2.5-Math-1.5B
# (App. A.3), the Spanish style transfer Qwen2.5-1.5B <- 3B (App. D.7).
CONFIGS = {
    "distill": ("train", "configs/distill.py", MAIN),
    "grid_main": ("sweep", "configs/grid_main.py:families={family}", MAIN),
    "grid_spectrum": ("sweep", "configs/grid_spectrum.py:family={family}",
                      ("llama", "qwen15b")),
    "grid_lr_sweep": ("sweep", "configs/grid_lr_sweep.py", ("llama",)),
    "grid_noclip": ("sweep", "configs/grid_noclip.py", ("llama",)),
    "grid_sampled_kl": ("sweep", "configs/grid_sampled_kl.py", ("llama",)),
    "grid_temperature": ("sweep", "configs/grid_temperature.py", ("llama",)),
    "grid_topk": ("sweep", "configs/grid_topk.py", ("qwen05b",)),
    "grid_countdown_harder": ("sweep", "configs/grid_countdown_harder.py",
                              ("qwen15b",)),
    "grpo_after_distill": ("rl", "configs/grpo_after_distill.py",
                           ("llama", "qwen05b")),
    "grid_spanish": ("sweep", "configs/grid_spanish.py", ("qwen15b_3b",)),
    "grid_math": ("sweep", "configs/grid_math.py", ("qwen15b_math",)),
}


def _with_pair(c, family: str, *, teacher: bool = True):
  """Config `c` with the family's presets (shapes without weights) and real
  vocabulary."""
  student, teacher_preset, vocab = FAMILIES[family]
  c.student.preset = student
  if teacher:
    c.teacher.preset = teacher_preset
    c.loss.vocab_size = vocab
  return c


def family_config(family: str, spec: str = "configs/distill.py"):
  return _with_pair(config_lib.load_config(spec), family)


def compile_config(name: str, family: str, slice_name: str) -> dict:
  """compile_only's report of config `name` (CONFIGS) with `family`'s pair,
  compiled for `slice_name`."""
  kind, spec, _ = CONFIGS[name]
  c = config_lib.load_config(spec.format(family=family))
  if kind == "train":
    return loop.compile_for(_with_pair(c, family), slice_name)
  if kind == "sweep":
    _with_pair(c.base, family)
    return sweep_programs.compile_for(c, slice_name)
  return rl_train.compile_for(_with_pair(c, family, teacher=False), slice_name)


def _label(name: str) -> str:
  """A program's name for the table: a grid's 'train update: family=..,
  task=..,kl=reverse,policy=student,lr=..,seed=0 (+5 arms)' as 'train update
  (kl=reverse)': the axes that make its training programs differ (the
  rollout's policy, the update's loss), nothing for evaluation and RLVR
  programs, which every arm shares."""
  program, _, arm = name.partition(": ")
  axes = {"train rollout": ("policy",), "train update": ("kl", "topk")}
  keep = [x for x in arm.partition(" (+")[0].split(",")
          if x.split("=")[0] in axes.get(program, ())]
  return f"{program} ({', '.join(keep)})" if keep else program


def _limit(p) -> str:
  if p.get("limit_s") is None:
    return "-"
  return f"{p['limit_s'] * 1e3:.0f} ms ({p['bound_over_limit']:.1f}x)"


def step_summary(report) -> dict | None:
  """A distillation run's step (its rollout, if any, then its update)
  against the physical limit: the sums of their bounds and limits."""
  progs = {p["name"]: p for p in report["programs"]}
  if "update" not in progs:
    return None
  step = [progs[k] for k in ("rollout", "update") if k in progs]
  if any(p.get("limit_s") is None for p in step):
    return None
  # A rollout decoded ahead serves `steps` steps (rollout.decode_ahead).
  bound = sum(p["step_time_bound_s"] / p.get("steps", 1) for p in step)
  limit = sum(p["limit_s"] / p.get("steps", 1) for p in step)
  return {"step_time_bound_s": bound, "step_limit_s": limit,
          "bound_over_limit": bound / limit}


def markdown(results) -> str:
  lines = ["| config | family (student <- teacher) | slice | program | "
           "per-device memory GiB (of HBM; a GPU's: of its allocator pool) | "
           "headroom | ICI (NVLink) GB per device | "
           "step-time bound | physical limit (bound / limit) | MFU ceiling |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  seen = set()
  for r in results:
    s, t, _ = FAMILIES[r["family"]]
    pair = f"{s} <- {t}" if CONFIGS[r["config"]][0] != "rl" else s
    for p in r["report"]["programs"]:
      hbm = r["report"]["hbm_bytes_per_device"] / 2**30
      ceiling = "-" if p["mfu_ceiling"] is None else f"{p['mfu_ceiling']:.2f}"
      name = _label(p["name"])
      # A grid's arms that differ in a setting the program does not see
      # compile one program, reported once.
      key = (r["config"], r["family"], r["slice"], name,
             p["total_bytes"], p["flops"])
      if key in seen:
        continue
      seen.add(key)
      ici = ("-" if p.get("ici_bytes") is None else
             ("" if p.get("ici_complete", True) else ">= ")
             + f"{p['ici_bytes'] / 1e9:.1f}")
      lines.append(
          f"| {r['config']} | {r['family']} ({pair}) | {r['slice']} | {name} | "
          f"{p['total_bytes'] / 2**30:.1f} ({hbm:.0f}) | {p['headroom']:.0%}"
          f"{'' if p['fits'] else ' (does not fit)'} | {ici} | "
          f"{p['step_time_bound_s'] * 1e3:.0f} ms ({p['bound_by']}) | "
          f"{_limit(p)} | {ceiling} |")
  return "\n".join(lines)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--families", default=",".join(FAMILIES))
  ap.add_argument("--slices", default=None,
                  help=f"some of {','.join(SLICES)} (any slice compile_only "
                  "knows); default: the pair's slice in the study (STUDY)")
  ap.add_argument("--configs", default="distill",
                  help=f"'all' or some of {','.join(CONFIGS)}")
  ap.add_argument("--markdown", action="store_true",
                  help="print docs/tpu.md's fit table instead of the JSON")
  args = ap.parse_args(argv)
  families = args.families.split(",")
  for family in families:
    if family not in FAMILIES:
      raise SystemExit(f"error: --families: unknown {family!r}; choose from "
                       f"{sorted(FAMILIES)}")
  names = list(CONFIGS) if args.configs == "all" else args.configs.split(",")
  for name in names:
    if name not in CONFIGS:
      raise SystemExit(f"error: --configs: unknown {name!r}; choose 'all' or "
                       f"from {list(CONFIGS)}")
  results = []
  for name in names:
    for family in families:
      if family not in CONFIGS[name][2]:
        continue
      slices = (args.slices.split(",") if args.slices else
                (STUDY[family],))
      for sl in slices:
        report = compile_config(name, family, sl)
        results.append({"config": name, "family": family, "slice": sl,
                        "report": report, "step": step_summary(report),
                        "fits": all(p["fits"] for p in report["programs"])})
  if args.markdown:
    print(markdown(results))
    return results
  # The runs on the study's slices, or on the targets asked for.
  study = (results if args.slices else
           [r for r in results if STUDY.get(r["family"]) == r["slice"]])
  fit = sum(r["fits"] for r in study)
  out = {
      "headline": {"name": "runs (config x pair x target) whose programs all "
                           "fit (>= 10 % of the device's memory free)",
                   "value": f"{fit}/{len(study)}", "unit": "runs",
                   "goal": "all", "meets_goal": bool(study) and fit == len(study)},
      "maxtext_reference_mfu": MAXTEXT_MFU,
      "results": results}
  print(json.dumps(out, indent=1, default=str))
  sys.stdout.flush()
  return results


if __name__ == "__main__":
  main()
