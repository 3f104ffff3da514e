"""A grid's RLVR stage: GRPO from the finished arms, evaluated like the arms.

The study's last question is whether what distillation gained survives a
later reinforcement-learning stage with verifiable rewards. A grid config
declares that stage with

  rlvr  dict(base_spec='configs/grpo_countdown.py:n={train_n}',
                             # formatted with the arm's factors, like
                             # grid.eval.spec
             base=None,      # or the GRPO ConfigDict itself; base_spec then
                             # only names where launch commands start
             updates={},     # merged into it (dotted fields must exist)
             seed=None,      # None: the arm's seed; or one for every
                             # stage (the paper's RLVR seed 42, App. D.6)
             select=None)    # None: every arm; or dict(metric='accuracy',
                             # per=('kl', 'policy')): in each group of arms
                             # sharing these study factors, the arm with the
                             # highest mean table metric (study.table) over
                             # seeds, all of its seeds

and `python -m jaxdistill.sweep` (study.runner.run_sweep) then runs, after
the arms, one GRPO run per chosen arm in <arm dir>/rlvr/: started from the
arm's export (<arm dir>/hf_student/, tokenizer included) with the arm's seed
(or rlvr.seed: one for every stage), so every arm gets the same RL stage and
only the start differs. The stage is
evaluated as the arm was (grid.eval, against the student the arm started
from), so the table shows before and after RLVR in the same columns. A stage
is finished when <arm dir>/rlvr/results.json exists (written last):

  name, dirname, factors, study   the arm's (study.runner.RESULTS)
  stage                           'rlvr'
  train                           the GRPO run's last logged metrics: rl/*
                                  and sparsity/* of the stage (against the
                                  arm it started from)
  rewards                         rl/reward_mean of every logged iteration
  revisions                       what the stage took from the hub
                                  (kl.reference, tokenizer: {id, revision,
                                  commit}, as rl.train's revisions.json)
  eval                            evaluation metrics, or None
  elapsed_s, finished
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
import os

from huggingface_hub import constants as hf_constants
import ml_collections
import numpy as np

from jaxdistill import config_lib
from jaxdistill import models
from jaxdistill.models import hub
from jaxdistill.rl import train as rl_train
from jaxdistill.sweep import grid as grid_lib
from jaxdistill.sweep import table

DIR = table.RLVR_DIR  # <arm dir>/rlvr/
stage_dir = table.stage_dir
MODULE = "jaxdistill.rl.train"


def declared(grid) -> bool:
  return bool(grid.get("rlvr"))


def base_spec(grid, run: grid_lib.Run) -> str | None:
  spec = grid.rlvr.get("base_spec")
  try:
    return spec.format(**run.factors) if spec else None
  except KeyError as e:
    raise ValueError(f"grid.rlvr.base_spec: {spec!r} names {e}, which is not "
                     f"a factor of run {run.name!r}") from None


def stage_config(grid, run: grid_lib.Run, run_dir: str):
  """The GRPO config of `run`'s RLVR stage (run_dir: the arm's directory)."""
  r = grid.rlvr
  if r.get("base") is not None:
    c = ml_collections.ConfigDict(r.base.to_dict())
  elif r.get("base_spec"):
    c = config_lib.load_config(base_spec(grid, run))
  else:
    raise ValueError("grid.rlvr: needs base_spec (a GRPO config file spec, "
                     "e.g. 'configs/grpo_countdown.py:n=3') or base")
  grid_lib.merge(c, r.get("updates") or {}, "grid.rlvr.updates")
  # The arm's export: its weights and the tokenizer saved with them.
  c.student.path = os.path.join(run_dir, models.checkpoint.EXPORT_DIR)
  c.student.init = None
  if "tokenizer_build" in c:
    c.tokenizer_build = None
  seed = r.get("seed")
  c.seed = int(run.config.seed if seed is None else seed)
  _pin_hub_names(c)
  return c


# spec -> org/name@<commit>, per hub cache: every stage of one sweep process
# (its check, its launch command, its run) sees the same commit.
_PINNED: dict = {}


def _pin_hub_names(c) -> None:
  """The stage's hub names (kl.reference, tokenizer) as org/name@<commit>,
  as the arms' are (sweep.inputs.pin_checkpoints): its config, snapshot and
  command name the weights it used, and a moved name is a stale stage."""
  fields = [("kl", "reference")] if c.get("kl") else []
  fields += [(None, "tokenizer")]
  for block, key in fields:
    node = c[block] if block else c
    spec = node.get(key)
    if not (spec and hub.is_hub_id(spec)):
      continue
    cache_key = (spec, hf_constants.HF_HUB_CACHE)
    if cache_key not in _PINNED:
      try:
        _PINNED[cache_key] = hub.pin(spec)
      except hub.HubError as e:
        field = f"{block}.{key}" if block else key
        raise ValueError(f"grid.rlvr: config.{field}: {e}") from None
    node[key] = _PINNED[cache_key]


def check(grid, runs: Sequence[grid_lib.Run], workdir: str) -> None:
  """The stage's config errors, before any arm trains."""
  sel = grid.rlvr.get("select")
  if sel:
    if sel.get("metric") not in table.METRICS and not str(
        sel.get("metric")).startswith("acc/"):
      raise ValueError(f"grid.rlvr.select.metric: {sel.get('metric')!r} is not "
                       f"a table metric ({table.METRICS} or acc/<suite>)")
    bad = [p for p in sel.get("per") or () if p not in table.STUDY]
    if bad:
      raise ValueError(f"grid.rlvr.select.per: {bad} are not study factors "
                       f"{table.STUDY}")
  for run in runs[:1]:
    c = stage_config(grid, run, os.path.join(workdir, run.dirname))
    try:
      rl_train.validate(c)
      config_lib.validate_run(c)
    except ValueError as e:
      raise ValueError(f"grid.rlvr: {e}") from None


def select(grid, runs: Sequence[grid_lib.Run], results: Mapping[str, Mapping]
           ) -> list[grid_lib.Run] | None:
  """The runs whose RLVR stage runs, in grid order; None while a selection
  needs arms that have not finished. `results`: run name -> results.json."""
  sel = grid.rlvr.get("select")
  if not sel:
    return list(runs)
  if any(r.name not in results for r in runs):
    return None
  metric, per = sel["metric"], tuple(sel.get("per") or ())
  rows = {r.name: table.row_of(results[r.name]) for r in runs}
  by_arm: dict[str, list[float]] = {}
  for row in rows.values():
    v = row.get(metric)
    by_arm.setdefault(row["arm"], []).append(np.nan if v is None else float(v))
  best: dict[tuple, tuple[float, str]] = {}
  for name, row in rows.items():
    arm = row["arm"]
    score = float(np.nanmean(by_arm[arm])) if not np.all(
        np.isnan(by_arm[arm])) else -np.inf
    group = tuple(row.get(p) for p in per)
    if group not in best or score > best[group][0]:
      best[group] = (score, arm)
  chosen = {arm for _, arm in best.values()}
  return [r for r in runs if rows[r.name]["arm"] in chosen]


def command(grid, run: grid_lib.Run, workdir: str) -> str:
  """The stage's `python -m jaxdistill.rl.train` line (writes its snapshot
  when flags cannot express the config)."""
  run_dir = os.path.join(workdir, run.dirname)
  config, out = stage_config(grid, run, run_dir), stage_dir(run_dir)
  spec = base_spec(grid, run)
  if not spec:
    raise ValueError("grid.rlvr.base_spec: launch commands start from a config "
                     "file spec, e.g. 'configs/grpo_countdown.py:n=3'")
  grid_lib.write_config_snapshot(config, out)
  return grid_lib.launch_command(MODULE, spec, config, out)


def rewards_of(records: Sequence[Mapping]) -> list[float]:
  return [float(r["rl/reward_mean"]) for r in records if "rl/reward_mean" in r]


def reward_steps(records: Sequence[Mapping]) -> list[int]:
  """The GRPO step of each of rewards_of's values (log_every may skip)."""
  return [int(r["step"]) for r in records if "rl/reward_mean" in r]


def reward_window(n: int) -> int:
  """Iterations averaged for a reward's start, end and moving average: a
  tenth of the n iterations (at least one)."""
  return max(1, n // 10)
