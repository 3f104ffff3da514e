"""What a grid costs before renting: chip-hours from `--compile_only`.

`python -m jaxdistill.sweep --config GRID --workdir W --compile_only=SLICE`
compiles every distinct program of the grid's arms (sweep/programs.py) and
then adds, per arm and for the grid, the device time those programs need
at their step-time bounds (compile_only.py: max(compute, HBM, ICI) per
chip):

  training    total_steps x (rollout + update): one rollout (one per
              chunk of rollout.decode_ahead steps where that is set; none for
              dataset rollouts or a teacher cache, and none for an arm
              that reads shared teacher rollouts: with
              grid.share_teacher_rollouts, the first teacher-policy arm of
              a group (train/shared_rollouts.py group) in the grid's order
              decodes them, the others of its group read them) and one
              update per step;
  evaluation  per suite and decoding mode, num_problems over the prompts one
              call decodes, rounded up, times that program's bound
              (evaluate/programs.py decode_calls); the baseline (the
              student the arm starts from) on its suites as
              evaluate/run.py baseline_plan says, once per distinct
              baseline and evaluation config, as the sweep runs it
              (sweep/baselines.py: the first arm in the grid's order
              evaluates it, the others reuse its scores);
  RLVR stage  with grid.rlvr, the stage's total_steps x its programs
              (rollout, reference, rescore, update), then its evaluation as
              the arm's; every arm counted (with grid.rlvr.select, the
              stages of the arms not chosen are counted too).

chip-hours = seconds x the slice's chips / 3600: the whole slice is held
while any program runs. Beside it, the same sum of the programs' physical
limits (compile_only: weights read in place, compute at peak), and the disk
each arm keeps once finished (sweep/disk.py). Prices vary: chip-hours only.

The bound is a lower bound of the device time at the programs' compiled
shapes: every completion decoded to its max_new_tokens and every prompt at
its full width. A batch whose completions all end early stops sooner (the
decode loop exits when every row is done), so a run can take less than this
figure; host time (loading weights, compiling, checkpoints, scoring) is not
counted and takes more.
"""
from __future__ import annotations

from jaxdistill import config_lib
from jaxdistill.evaluate import programs as eval_programs
from jaxdistill.evaluate import run as evaluate_run
from jaxdistill.sweep import grid as grid_lib
from jaxdistill.sweep import inputs
from jaxdistill.sweep import rlvr as rlvr_lib
from jaxdistill.sweep import trajectory
from jaxdistill.train import batches as train_batches
from jaxdistill.train import disk as disk_lib
from jaxdistill.train import shared_rollouts as shared_lib

TRAIN = ("train rollout", "train update")
RLVR = ("rlvr rollout", "rlvr reference", "rlvr rescore", "rlvr update")
NOTE = ("a lower bound: every program at its compiled shape (completions "
        "decoded to max_new_tokens), device time only (no loading, "
        "compiling, checkpoints or scoring); chip-hours only, no price")


def rows_by_arm(report) -> dict[str, dict[str, dict]]:
  """{arm: {program: report row}}, the program named without its arm
  ('train rollout', 'eval sampled, 4096 new tokens')."""
  rows = {r["name"]: r for r in report["programs"]}
  out = {}
  for full, arms in report["arms"].items():
    short = full.partition(": ")[0]
    for arm in arms:
      out.setdefault(arm, {})[short] = rows[full]
  return out


def readers(grid, runs) -> set[str]:
  """The names of the arms that read shared teacher rollouts rather than
  decode them: every sharing arm (grid.shares_rollouts) but the first of
  its group, in the grid's order."""
  seen, out = set(), set()
  for run in runs:
    if grid_lib.shares_rollouts(grid, run):
      key = shared_lib.group(run.config)
      if key in seen:
        out.add(run.name)
      seen.add(key)
  return out


def arm_calls(grid, run, reads: bool = False,
              baselines_seen: set | None = None) -> tuple[list, list]:
  """([(phase, program, calls)], [suites not counted]) of one arm: its
  training, evaluation, baseline and RLVR stage (module doc); `reads`: it
  reads shared teacher rollouts (no train rollout); `baselines_seen`: the
  (baseline, evaluation config) pairs earlier arms evaluate, which this arm
  reuses (updated; None: the baseline counted)."""
  c = run.config
  steps = int(c.total_steps)
  # rollout.decode_ahead = k: one rollout call per chunk of k steps (the
  # last, shorter chunk counted at the full call's bound: an upper figure).
  ahead = train_batches.decode_ahead(c) if "rollout" in c else 1
  out = [("train", p, -(-steps // ahead) if p == "train rollout" else steps)
         for p in TRAIN if not (reads and p == "train rollout")]
  uncounted = []
  ec = inputs.eval_config(grid, run)

  def evaluation(where):
    if ec is None:
      return
    calls, missing = eval_programs.decode_calls(ec, tuple(ec.eval_suites))
    # grid.eval.trajectory: every export is evaluated (the baseline once).
    times = (len(trajectory.points(c, "<arm>"))
             if where == "" and grid.eval.get("trajectory") is not None else 1)
    out.extend((f"{where}eval", f"eval {p}", n * times)
               for p, n in calls.items())
    uncounted.extend(missing)
    if grid.eval.get("baseline"):
      # The store's key without the weights (none are read here).
      key = (str(c.student.get("path")), config_lib.to_json(ec))
      if baselines_seen is not None:
        if key in baselines_seen:
          return
        baselines_seen.add(key)
      names, samples = evaluate_run.baseline_plan(ec, tuple(ec.eval_suites))
      calls, missing = eval_programs.decode_calls(ec, names,
                                                  samples=bool(samples))
      out.extend((f"{where}baseline", f"eval {p}", n) for p, n in calls.items())
      uncounted.extend(missing)

  evaluation("")
  if rlvr_lib.declared(grid):
    stage = rlvr_lib.stage_config(grid, run, "<arm>")
    rows = int(stage.data.batch_size) * int(stage.rollout.group_size)
    # rollout.generation_batch: that many rows per rollout call.
    per_step = rows // int(stage.rollout.get("generation_batch") or rows)
    out.extend(("rlvr", p, int(stage.total_steps) * (
        per_step if p == "rlvr rollout" else 1)) for p in RLVR)
    evaluation("rlvr ")
  return out, sorted(set(uncounted))


def estimate(grid, runs, report, needs=(), shared_bytes: int = 0) -> dict:
  """{chips, note, per_arm: {arm: ...}, grid: ...}: per arm its calls of
  each program, bound and limit seconds per phase and in all, chip-hours
  at the bound and at the limit, and the bytes it keeps (`needs`: sweep/disk
  (name, need) pairs of the arms and their RLVR stages); the grid's kept
  bytes add `shared_bytes`, its store of shared teacher rollouts."""
  chips = int(report["chips"])
  by_arm = rows_by_arm(report)
  disk = dict(needs)
  per_arm = {}
  reading = readers(grid, runs)
  seen = set()
  for run in runs:
    rows = by_arm.get(run.name, {})
    reads = run.name in reading
    calls, uncounted = arm_calls(grid, run, reads, seen)
    terms = [(phase, rows[p], n) for phase, p, n in calls if p in rows]
    phases = {}
    for phase, row, n in terms:
      ph = phases.setdefault(phase, {"bound_s": 0.0, "limit_s": 0.0})
      ph["bound_s"] += n * row["step_time_bound_s"]
      ph["limit_s"] = (None if ph["limit_s"] is None or row["limit_s"] is None
                       else ph["limit_s"] + n * row["limit_s"])
    bound = sum(ph["bound_s"] for ph in phases.values())
    limits = [ph["limit_s"] for ph in phases.values()]
    limit = None if None in limits else sum(limits)
    kept = sum(d["kept_bytes"] for name, d in disk.items()
               if name in (run.name, f"{run.name} (RLVR stage)"))
    per_arm[run.name] = {
        "steps": int(run.config.total_steps),
        "calls": [{"phase": ph, "program": p, "calls": n}
                  for ph, p, n in calls if p in rows],
        "train_step_bound_s": sum(
            rows[p]["step_time_bound_s"] for p in TRAIN
            if p in rows and not (reads and p == "train rollout")),
        "reads_shared_rollouts": reads,
        "phases": phases, "bound_s": bound, "limit_s": limit,
        "chip_hours": bound * chips / 3600,
        "limit_chip_hours": None if limit is None else limit * chips / 3600,
        "kept_bytes": kept if disk else None,
        "uncounted_suites": uncounted}
  arms = list(per_arm.values())
  limits = [a["limit_chip_hours"] for a in arms]
  total = {
      "arms": len(arms), "chip_hours": sum(a["chip_hours"] for a in arms),
      "limit_chip_hours": (None if any(x is None for x in limits)
                           else sum(limits)),
      "kept_bytes": (sum(a["kept_bytes"] or 0 for a in arms) + shared_bytes
                     if disk else None)}
  for phase in dict.fromkeys(p for a in arms for p in a["phases"]):
    total[f"{phase}_chip_hours"] = sum(
        a["phases"].get(phase, {"bound_s": 0.0})["bound_s"]
        for a in arms) * chips / 3600
  # A GPU is the unit clouds rent and price GPUs by: GPU-hours there.
  gpu = report.get("platform") == "gpu"
  return {"slice": report["topology"], "chips": chips, "note": NOTE,
          "unit": "GPU" if gpu else "chip", "per_arm": per_arm, "grid": total}


def _h(x) -> str:
  return "-" if x is None else f"{x:.3g}"


def lines(cost) -> list[str]:
  """One line per arm and one for the grid."""
  chips = cost["chips"]
  unit = cost.get("unit", "chip")
  out = []
  for name, a in cost["per_arm"].items():
    ph = a["phases"]
    parts = [f"{a['steps']} steps x {a['train_step_bound_s']:.3g} s a step"
             + (" (shared teacher rollouts read)"
                if a.get("reads_shared_rollouts") else "")]
    parts += [f"{p} {v['bound_s']:.3g} s" for p, v in ph.items() if p != "train"]
    keeps = ("" if a["kept_bytes"] is None else
             f"; keeps {disk_lib.gb(a['kept_bytes'])}")
    missing = ("" if not a["uncounted_suites"] else
               f" (not counted: suites {', '.join(a['uncounted_suites'])}, "
               "run by lm-eval outside the compiled programs or without "
               "num_problems)")
    out.append(f"cost {name}: {' + '.join(parts)} = {a['bound_s'] / 3600:.3g} h"
               f" x {chips} {unit}s = {_h(a['chip_hours'])} {unit}-hours at the "
               f"bound (limit {_h(a['limit_chip_hours'])}){keeps}{missing}")
  g = cost["grid"]
  split = ", ".join(f"{k[:-len('_chip_hours')]} {v:.3g}" for k, v in g.items()
                    if k.endswith("_chip_hours") and k not in (
                        "limit_chip_hours",))
  keeps = ("" if g["kept_bytes"] is None else
           f"; the arms keep {disk_lib.gb(g['kept_bytes'])}")
  arms = f"{g['arms']} arm" + ("" if g["arms"] == 1 else "s")
  out.append(f"cost grid: {arms} on {cost['slice']}: "
             f"{_h(g['chip_hours'])} {unit}-hours at the step-time bound "
             f"({split}), {_h(g['limit_chip_hours'])} at the physical limit"
             f"{keeps}; {cost['note']}")
  return out
