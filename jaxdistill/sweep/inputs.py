"""What a sweep's arms read, settled once before the first arm trains.

- Checkpoints: every hub name an arm loads (student, teacher, tokenizer) is
  pinned to the commit it resolves to now, `org/name@<commit>`, in the arm's
  config. So run_config.json, the run's config.json, the launch commands and
  results.json name exactly which weights made a result, an arm trained from
  another commit is a stale arm (refused, or rerun with --rerun_stale), and
  arms that name one repo at different commits are refused.
- Data: the hub data sets the arms and their evaluation suites read by name
  (data.task='mcq' or a suite of kind 'mcq' with `source` one of
  data.builders.HUB_DATASETS, e.g. sciknoweval / medreason, and no files of
  their own), and the math sets (data.task='math', suites of kind 'math':
  numina_math, math500), are prepared once into the grid's data_dir
  (default <workdir>/data) with jaxdistill.data.prepare.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
import os

from jaxdistill import config_lib
from jaxdistill import losses
from jaxdistill import storage
from jaxdistill.data import builders
from jaxdistill.data import prepare as prepare_lib
from jaxdistill.models import hub
from jaxdistill.sweep import grid as grid_lib

DATA_DIR = "data"  # <workdir>/data unless the grid's base sets data.data_dir


def eval_config(grid, run: grid_lib.Run):
  """The evaluation config of a run (grid.eval's spec and updates), its
  prepared multiple-choice suites reading the run's data_dir; None without
  grid.eval."""
  spec = grid_lib.eval_spec(grid, run)
  if spec is None:
    return None
  cfg = config_lib.load_config(spec)
  grid_lib.merge(cfg, grid.eval.get("updates") or {}, "grid.eval.updates")
  for name in cfg.get("eval_suites") or ():
    s = cfg.suites.get(name)
    if (s is not None and s.get("kind") in ("mcq", "math")
        and not s.get("path") and not s.get("manual_dir")
        and not s.get("data_dir")):
      s.data_dir = run.config.data.get("data_dir")
  return cfg


def _needs(grid, run: grid_lib.Run) -> list[tuple[str, str | None]]:
  """(data set name, data_dir or None) the run and its evaluation read from
  data prepared by name."""
  out = []
  d = run.config.data
  if (d.get("task") == "mcq" and not d.get("manual_dir")
      and d.get("source") in builders.HUB_DATASETS):
    out.append((d.source, d.get("data_dir")))
  if d.get("task") == "math" and d.get("source") in prepare_lib.MATH_SETS:
    out.append((d.source, d.get("data_dir")))
  cfg = eval_config(grid, run)
  for name in (cfg.get("eval_suites") or ()) if cfg is not None else ():
    s = cfg.suites.get(name)
    if (s is not None and s.get("kind") == "mcq" and not s.get("path")
        and not s.get("manual_dir") and s.get("source") in builders.HUB_DATASETS):
      out.append((s.source, s.get("data_dir")))
    if (s is not None and s.get("kind") == "math"
        and s.get("source") in prepare_lib.MATH_SETS):
      out.append((s.source, s.get("data_dir")))
  return out


def _pinned(spec, field: str, run: grid_lib.Run, cache: dict) -> str:
  if spec not in cache:
    try:
      cache[spec] = hub.pin(spec)
    except hub.HubError as e:
      raise ValueError(f"run {run.name!r}: config.{field}: {e}") from None
  return cache[spec]


def pin_checkpoints(runs: Sequence[grid_lib.Run]) -> None:
  """Writes each hub name the runs load as org/name@<commit> (in place);
  refuses runs that name one repo at different commits."""
  cache, seen = {}, {}  # spec -> pinned; repo -> (commit, run name)
  for run in runs:
    c = run.config
    blocks = ["student"]
    if c.loss.kind != losses.CE and not c.loss.get("teacher_cache"):
      blocks.append("teacher")
    fields = [(f"{b}.path", c[b], "path") for b in blocks
              if hub.weights_spec(c[b])]
    if c.get("tokenizer"):
      fields.append(("tokenizer", c, "tokenizer"))
    for field, node, key in fields:
      if not hub.is_hub_id(node[key]):
        continue
      node[key] = _pinned(node[key], field, run, cache)
      repo, commit = hub.parse(node[key])
      first = seen.setdefault(repo, (commit, run.name))
      if first[0] != commit:
        raise ValueError(
            f"grid: arms {first[1]!r} and {run.name!r} name {repo} at "
            f"different commits ({first[0]} and {commit}): one summary needs "
            "one revision of each checkpoint; give the same org/name@revision")


def plan(grid, workdir: str, only: str | None = None, *,
         is_finished: Callable[[str], bool] = lambda d: False,
         log=print, prepare: bool = True) -> list[grid_lib.Run]:
  """The grid's runs, ready to train: data_dir defaulted (when data is read
  by name), hub names pinned, and (`prepare`) the data sets unfinished runs
  need prepared (once each). Without `prepare` nothing is written."""
  runs = grid_lib.expand(grid, only)
  if any(d is None for r in runs for _, d in _needs(grid, r)):
    # A gs:// sweep prepares its data on each host's local disk: data sets
    # are read as local files (storage.scratch).
    root = (storage.scratch(workdir) if storage.is_gs(workdir)
            else os.path.abspath(workdir))
    grid.base.data.data_dir = os.path.join(root, DATA_DIR)
    runs = grid_lib.expand(grid, only)
  pin_checkpoints(runs)
  if not prepare:
    return runs
  done = set()
  for run in runs:
    if is_finished(os.path.join(workdir, run.dirname)):
      continue
    for name, data_dir in _needs(grid, run):
      if (name, data_dir) in done:
        continue
      done.add((name, data_dir))
      try:
        prepare_lib.ensure(name, data_dir, log=log)
      except (ValueError, OSError) as e:
        raise ValueError(
            f"data set {name!r} (for run {run.name!r}) in {data_dir}: "
            f"{e}; or prepare it where the hub is reachable: "
            f"{builders.prepare_command(name, data_dir)}") from None
  return runs


def data_revisions(grid, run: grid_lib.Run) -> dict:
  """{'data/NAME': record of DIR/prepared/NAME.json} of the data sets the
  run and its evaluation read by name."""
  out = {}
  for name, data_dir in _needs(grid, run):
    rec = builders.read_record(data_dir, name) if data_dir else None
    if rec:
      out[f"data/{name}"] = {k: rec.get(k) for k in ("repo", "revision",
                                                      "commit")}
  return out
