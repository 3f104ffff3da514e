"""Evaluating a run along its training trajectory (App. A.3, Figs. 10-11).

An arm trained with config.export_every = N leaves an export every N steps
(<run>/exports/step_000100, ...) and its final one (<run>/hf_student). With
grid.eval.trajectory set, the sweep evaluates every one of them with the
grid's evaluation config and reports, as the arm's `eval`, the metrics of the
checkpoint whose selection metric is highest (the paper's "maximum along
the trajectory"; forgetting and sparsity at that checkpoint, as its Fig. 10
does), with

  trajectory/selected_step   the step of that checkpoint
  final/<key>                the final checkpoint's value of every metric

and writes the whole trajectory (every metric at every step) to
<run>/trajectory.json for the learning curves (Fig. 11). Each checkpoint's
evaluation is its own file, <run>/eval_step_<step>.json, written when it
finishes: a killed sweep redoes only the checkpoints without one. The
baseline is evaluated once, with the first checkpoint, and its scores reused
for the others (evaluate.run's `before`).

grid.eval.trajectory (a dict):
  select   the metric to maximise (default: the table's accuracy, 'id/' and
           the first of table.ACC_METRICS the evaluation reports)
  keep     'all' keeps every step export; 'selected' (default) deletes the
           others once every checkpoint is evaluated (a 1.5B student's export
           is 6 GB in float32, and the paper's ten per arm add up)

The selection and the reported value use the same evaluations, so the
maximum is optimistic (the paper says so too); final/ keeps the unselected
figure beside it. Ties go to the earliest step.
"""
from __future__ import annotations

from collections.abc import Callable
import json
import logging
import os

from jaxdistill import storage
from jaxdistill.sweep import table
from jaxdistill.train import loop as train_loop

TRAJECTORY = "trajectory.json"
KEEP = ("all", "selected")


def eval_file(step: int) -> str:
  return f"eval_step_{int(step):06d}.json"


def points(config, run_dir: str) -> list[tuple[int, str]]:
  """(step, checkpoint directory) of each export of a run, in step order,
  the final hf_student/ last."""
  out = [(s, os.path.join(run_dir, train_loop.step_export(s)))
         for s in train_loop.step_exports(config)]
  return out + [(int(config.total_steps), os.path.join(run_dir, "hf_student"))]


def check(spec) -> dict:
  """grid.eval.trajectory as a dict {select, keep}; ValueError naming the
  field."""
  spec = dict(spec or {})
  unknown = set(spec) - {"select", "keep"}
  if unknown:
    raise ValueError(f"grid.eval.trajectory: unknown field(s) "
                     f"{sorted(unknown)}; expected select, keep")
  keep = spec.get("keep") or "selected"
  if keep not in KEEP:
    raise ValueError(f"grid.eval.trajectory.keep: expected one of {KEEP}, "
                     f"got {keep!r}")
  select = spec.get("select")
  if select is not None and (not isinstance(select, str) or "/" not in select):
    raise ValueError("grid.eval.trajectory.select: a metric key such as "
                     f"'id/single_acc', got {select!r}")
  return {"select": select, "keep": keep}


def selection_key(metrics: dict, select: str | None) -> str:
  """The metric a trajectory is maximised on."""
  if select is not None:
    key = select
  else:
    acc = next((a for a in table.ACC_METRICS if f"id/{a}" in metrics), None)
    if acc is None:
      raise ValueError("trajectory: the evaluation reports no in-distribution "
                       f"accuracy ({', '.join('id/' + a for a in table.ACC_METRICS)}); "
                       "set grid.eval.trajectory.select")
    key = f"id/{acc}"
  if not isinstance(metrics.get(key), (int, float)):
    raise ValueError(f"grid.eval.trajectory.select: {key!r} is not a metric "
                     "of the evaluation (it reports "
                     f"{', '.join(sorted(metrics)[:8])}, ...)")
  return key


def _read_done(path: str) -> dict | None:
  """A finished checkpoint evaluation (evaluate.run's result), or None."""
  if not storage.exists(path):
    return None
  fix = "delete it to evaluate that checkpoint again"
  res = table.read_json(path, fix=fix)
  if not isinstance(res.get("metrics"), dict):
    raise ValueError(f"{path}: no 'metrics' object; {fix}")
  return res


def evaluate(config, run_dir: str, baseline: str | None, spec, *,
             evaluate_one: Callable, primary: bool = True,
             before: dict | None = None) -> dict:
  """Evaluates every export of the run in `run_dir` trained with `config`;
  returns the selected checkpoint's metrics with trajectory/ and final/
  entries (module docstring). `evaluate_one(checkpoint, baseline, out,
  before) -> evaluate.run's result`. Only the `primary` process writes
  trajectory.json and deletes exports. `before`: the baseline's scores
  already known (sweep/baselines.py), else the first evaluation's."""
  spec = check(spec)
  steps, rows = [], []
  for step, ckpt in points(config, run_dir):
    out = os.path.join(run_dir, eval_file(step))
    res = _read_done(out)
    if res is None:
      if not storage.exists(os.path.join(ckpt, "config.json")):
        raise FileNotFoundError(
            f"trajectory: {ckpt} (step {step}) is missing or incomplete; the "
            "run was trained without config.export_every or the export was "
            f"deleted (keep='selected' deletes them only after {TRAJECTORY} "
            "is written)")
      logging.info("trajectory: evaluating step %d (%s)", step, ckpt)
      res = evaluate_one(ckpt, baseline, out, before)
    m = res["metrics"]
    if baseline and before is None:
      before = {k.removeprefix("baseline/"): v for k, v in m.items()
                if k.startswith("baseline/")} or None
    steps.append(step)
    rows.append(m)
  key = selection_key(rows[0], spec["select"])
  values = [r.get(key) for r in rows]
  best = max(range(len(rows)),
             key=lambda i: (values[i] if values[i] is not None else float("-inf"),
                            -i))
  metrics = dict(rows[best])
  metrics["trajectory/selected_step"] = steps[best]
  metrics.update({f"final/{k}": v for k, v in rows[-1].items()})
  curves = {k: [r.get(k) for r in rows]
            for k in sorted(set().union(*rows))
            if all(isinstance(r.get(k), (int, float, type(None))) for r in rows)}
  if primary:
    storage.write_text(os.path.join(run_dir, TRAJECTORY), json.dumps(
        {"select": key, "selected_step": steps[best], "steps": steps,
         "metrics": curves}, indent=1, sort_keys=True))
    if spec["keep"] == "selected":
      for step, ckpt in points(config, run_dir)[:-1]:
        if step != steps[best] and storage.exists(ckpt):
          storage.rmtree(ckpt)
  return metrics
