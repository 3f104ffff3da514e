"""Grid configs -> named runs, each a full training config.

A grid config (configs/grid_*.py) is a ConfigDict with:

  base       the training config every arm starts from (a ConfigDict, usually
             configs/distill.py's get_config plus plain edits)
  base_spec  'configs/distill.py[:arg]': where launch commands start from
             (their --config.x=y flags are the differences to it)
  axes       ((name, field, values), ...): `field` a dotted config field that
             takes each value, or None: the value names a preset,
             presets[name][value], a nested dict merged into the config
  presets    {axis name: {value: nested dict}} (family checkpoints, task data)
  seeds      (0, 1, ...): config.seed of each run; the grid is repeated per seed
  eval       None, or dict(spec='configs/eval.py:task={task}', updates={...},
             baseline=True): evaluation after training; `spec` is formatted
             with the run's factors; baseline=True compares with the
             student's checkpoint (forgetting, sparsity)
  local_assets  runlocal only: the runner writes a tiny tokenizer and student
             checkpoint so that evaluation runs end to end on CPU
  share_teacher_rollouts  True: teacher-policy arms that would sample the
             same rollouts (differing only in KL, learning rate, student...)
             get them from one generation kept in <workdir>/shared_rollouts
             (train/shared_rollouts.py: the runs pass --shared_rollouts);
             default False

Run names list the factors in axis order, then the seed:
'kl=reverse,policy=student,lr=5e-05,seed=0'.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
import dataclasses
import itertools
import json
import os
import re
import shlex
from typing import Any

import ml_collections

from jaxdistill import config_lib
from jaxdistill import storage
from jaxdistill.train import shared_rollouts as shared_lib

SHARED_DIR = "shared_rollouts"


@dataclasses.dataclass
class Run:
  name: str                      # 'kl=reverse,lr=5e-05,seed=0'
  dirname: str                   # the name made filesystem-safe
  factors: dict[str, Any]        # {'kl': 'reverse', 'lr': 5e-05, 'seed': 0}
  config: ml_collections.ConfigDict


def fmt_value(v) -> str:
  if isinstance(v, float):
    return repr(v)  # 5e-05, 0.25: short and exact
  return str(v)


def safe_name(name: str) -> str:
  """A directory name: anything but [A-Za-z0-9._=,+-] becomes '_'."""
  return re.sub(r"[^A-Za-z0-9._=,+\-]", "_", name)


def _to_plain(x):
  if isinstance(x, (ml_collections.ConfigDict, ml_collections.FrozenConfigDict)):
    return x.to_dict()
  return x


def set_field(config, dotted: str, value, what: str):
  """config[a][b][c] = value for 'a.b.c'; the field must exist."""
  node = config
  *parents, leaf = dotted.split(".")
  for i, p in enumerate(parents):
    if p not in node or node[p] is None:
      raise ValueError(f"{what}: config has no field "
                       f"{'.'.join(parents[:i + 1])!r} (setting {dotted!r})")
    node = node[p]
  if leaf not in node:
    raise ValueError(f"{what}: config has no field {dotted!r}")
  node[leaf] = _to_plain(value)


def merge(config, updates: Mapping, what: str, prefix: str = "") -> list[str]:
  """Merges a nested dict of updates into config; returns the dotted leaves."""
  out = []
  for k, v in dict(_to_plain(updates)).items():
    dotted = f"{prefix}{k}"
    if k not in config:
      raise ValueError(f"{what}: config has no field {dotted!r}")
    cur = config[k]
    if isinstance(v, Mapping) and isinstance(
        cur, (Mapping, ml_collections.ConfigDict)):
      out += merge(cur, v, what, dotted + ".")
    else:
      config[k] = _to_plain(v)
      out.append(dotted)
  return out


def leaves(tree: Mapping, prefix: str = "") -> list[str]:
  out = []
  for k, v in dict(_to_plain(tree)).items():
    if isinstance(v, Mapping) and v:
      out += leaves(v, f"{prefix}{k}.")
    else:
      out.append(f"{prefix}{k}")
  return out


def axes_of(grid) -> list[tuple[str, str | None, tuple]]:
  out = []
  for i, axis in enumerate(grid.get("axes") or ()):
    if len(axis) != 3:
      raise ValueError(f"grid.axes[{i}]: expected (name, field, values), got "
                       f"{axis!r}")
    name, field, values = axis
    if not values:
      raise ValueError(f"grid.axes[{i}] ({name!r}): no values")
    if field is None and name not in (grid.get("presets") or {}):
      raise ValueError(f"grid.presets.{name}: axis {name!r} has no field, so "
                       "its values must name presets")
    out.append((name, field, tuple(values)))
  names = [a[0] for a in out]
  if len(set(names)) != len(names) or "seed" in names:
    raise ValueError(f"grid.axes: names must be unique and not 'seed': {names}")
  return out


def allowed_fields(grid) -> set[str]:
  """The config fields arms may differ in: the axes' fields and presets', seed."""
  out = {"seed"}
  for name, field, values in axes_of(grid):
    if field is not None:
      out.add(field)
    else:
      for v in values:
        out.update(leaves(grid.presets[name][v]))
  return out


def expand(grid, only: str | None = None) -> list[Run]:
  """All runs of a grid (axes x seeds), optionally those whose name has `only`."""
  axes = axes_of(grid)
  seeds = tuple(grid.get("seeds") or (0,))
  runs = []
  for combo in itertools.product(*(a[2] for a in axes), seeds):
    *values, seed = combo
    config = ml_collections.ConfigDict(grid.base.to_dict())
    factors = {}
    for (name, field, _), v in zip(axes, values):
      what = f"grid axis {name!r}={v!r}"
      if field is None:
        if v not in grid.presets[name]:
          raise ValueError(f"grid.presets.{name}: no preset {v!r}")
        merge(config, grid.presets[name][v], what)
      else:
        set_field(config, field, v, what)
      factors[name] = v
    config.seed = int(seed)
    factors["seed"] = int(seed)
    name = ",".join(f"{k}={fmt_value(v)}" for k, v in factors.items())
    runs.append(Run(name, safe_name(name), factors, config))
  dirs = [r.dirname for r in runs]
  if len(set(dirs)) != len(dirs):
    raise ValueError("grid: two runs map to the same directory name; make axis "
                     "values distinct")
  check_arms(runs, grid)
  if only:
    runs = [r for r in runs if only in r.name]
  return runs


def check_arms(runs: Sequence[Run], grid) -> None:
  """Arms share prompts, seeds and sampler settings: only grid fields differ."""
  if not runs:
    return
  allowed = allowed_fields(grid)
  ref = json.loads(config_lib.to_json(runs[0].config))
  for r in runs[1:]:
    diffs = config_lib.diff(ref, json.loads(config_lib.to_json(r.config)))
    bad = [d for d in diffs if not any(
        d.split(":")[0] == f or d.startswith(f + ".") for f in allowed)]
    if bad:
      raise ValueError(f"grid: arms {runs[0].name!r} and {r.name!r} differ in "
                       f"fields no axis varies: {bad}")


def eval_spec(grid, run: Run) -> str | None:
  ev = grid.get("eval")
  if not ev:
    return None
  try:
    return ev.spec.format(**run.factors)
  except KeyError as e:
    raise ValueError(f"grid.eval.spec: {ev.spec!r} names {e}, which is not a "
                     f"factor of run {run.name!r}") from None


def _settable(cfg, dotted: str, value) -> bool:
  """Whether `--config.<dotted>=<value>` can set this field (a typed scalar)."""
  if value is None or not isinstance(value, (str, int, float, bool)):
    return False
  *parents, leaf = dotted.split(".")
  node = cfg
  for p in parents:
    if not isinstance(node, ml_collections.ConfigDict) or p not in node:
      return False
    node = node[p]
  if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
    return False
  t = node.get_type(leaf)
  if t is float:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
  return t in (str, int, bool) and isinstance(value, t)


def _flag_value(v) -> str:
  if isinstance(v, str):
    return shlex.quote(v)
  return fmt_value(v)


SNAPSHOT = "run_config.json"
SNAPSHOT_SPEC = "configs/run_snapshot.py"


def write_snapshot(run: Run, run_dir: str) -> str:
  """<run_dir>/run_config.json: the run's full training config."""
  return write_config_snapshot(run.config, run_dir)


def write_config_snapshot(config, run_dir: str) -> str:
  """<run_dir>/run_config.json: `config` in full (configs/run_snapshot.py
  reads it back)."""
  storage.makedirs(run_dir)
  path = os.path.join(run_dir, SNAPSHOT)
  text = config_lib.to_json(config)
  if not (storage.isfile(path) and storage.read_text(path) == text):
    storage.write_text(path, text)  # whole or absent
  return path


def shares_rollouts(grid, run: Run) -> bool:
  """Whether the sweep gives `run` the shared teacher rollouts: with
  grid.share_teacher_rollouts, to the teacher-policy arms."""
  return (bool(grid.get("share_teacher_rollouts", False))
          and shared_lib.shareable(run.config))


def shared_rollouts_dir(grid, run: Run, workdir: str) -> str | None:
  """<workdir>/shared_rollouts for an arm that shares (shares_rollouts),
  else None."""
  return os.path.join(workdir, SHARED_DIR) if shares_rollouts(grid, run) else None


def command(grid, run: Run, workdir: str) -> str:
  """`python -m jaxdistill.train --config BASE --config.x=y ... --workdir W/run`.

  The flags are the run config's differences to grid.base_spec. Values flags
  cannot set (None into a typed field, lists, dicts) make the command read
  the run's snapshot instead (configs/run_snapshot.py, see write_snapshot).
  An arm that shares teacher rollouts (shared_rollouts_dir) gets
  --shared_rollouts.
  """
  if not grid.get("base_spec"):
    raise ValueError("grid.base_spec: launch commands start from a config "
                     "file spec, e.g. 'configs/distill.py:runlocal'")
  shared = shared_rollouts_dir(grid, run, workdir)
  extra = [] if shared is None else [shared_lib.FLAG, shlex.quote(shared)]
  return launch_command("jaxdistill.train", grid.base_spec, run.config,
                        os.path.join(workdir, run.dirname), extra)


def launch_command(module: str, base_spec: str, config, run_dir: str,
                   extra=()) -> str:
  """`python -m MODULE --config BASE_SPEC --config.x=y ... --workdir RUN_DIR`:
  the flags are `config`'s differences to base_spec's config, or, when a
  value cannot be a flag, the command reads <run_dir>/run_config.json (which
  the caller writes with write_snapshot). `extra`: more arguments, before
  --workdir."""
  base_cfg = config_lib.load_config(base_spec)
  base = json.loads(config_lib.to_json(base_cfg))
  new = json.loads(config_lib.to_json(config))
  flags = []
  for key in _diff_leaves(base, new):
    node = new
    for p in key.split("."):
      node = node[p]
    if not _settable(base_cfg, key, node):
      flags = None  # not expressible as a flag: use the snapshot
      break
    flags.append(f"--config.{key}={_flag_value(node)}")
  if flags is None:
    spec = f"{SNAPSHOT_SPEC}:{os.path.join(run_dir, SNAPSHOT)}"
    return " ".join([f"python -m {module}", "--config", shlex.quote(spec),
                     *extra, "--workdir", shlex.quote(run_dir)])
  return " ".join([f"python -m {module}", "--config", base_spec, *flags,
                   *extra, "--workdir", shlex.quote(run_dir)])


def _diff_leaves(a: Mapping, b: Mapping, prefix: str = "") -> list[str]:
  out = []
  for k in b:
    va, vb = a.get(k), b[k]
    if isinstance(va, dict) and isinstance(vb, dict) and va and vb:
      out += _diff_leaves(va, vb, f"{prefix}{k}.")
    elif va != vb:
      out.append(f"{prefix}{k}")
  return out


def main_grid_slice(arg, slice_args: str):
  """configs/grid_main.py restricted to one slice of it (`slice_args`, e.g.
  'families=llama,tasks=countdown'), or under arg.runlocal its runlocal
  variant with the axes kl x policy x lr; arg.seeds is passed on when given.
  The paper's Countdown-3 and MedReason grids (configs/grid_lr_sweep.py, ...)
  start from it and change what their section changes."""
  mode = "runlocal,axes=kl+policy+lr" if arg.runlocal else slice_args
  seeds = f",seeds={arg.seeds}" if arg.given("seeds") else ""
  return config_lib.load_config(f"configs/grid_main.py:{mode}{seeds}")


def make_runlocal(grid, arg=None, *,
                  eval_spec: str = "configs/eval.py:runlocal,samples=2",
                  lrs: tuple = (1e-3, 5e-3)) -> None:
  """Shrinks a grid config to tiny models on CPU (its `runlocal` variant).

  The base becomes configs/distill.py:runlocal (tiny random models, synthetic
  prompts) with a 320-entry vocabulary, so that the runner's local tokenizer
  (300 tokens) and tiny student checkpoint fit (grid.local_assets), and the
  evaluation is configs/eval.py:runlocal (Countdown-3 in distribution,
  Countdown-5 as the harder / OOD suite). One seed. Learning rates of tiny
  random models are larger than the study's: `lrs` replaces an 'lr' axis.
  The grid config's arguments `arg` (config_lib.Args) that were given stay
  applied: `lr` and `task` go to the base (and `task` to the evaluation),
  `seeds` keeps its number of seeds.
  """
  given = ({k: getattr(arg, k) for k in ("lr", "task")
            if k in arg and arg.given(k)} if arg is not None else {})
  spec = "configs/distill.py:runlocal" + "".join(
      f",{k}={fmt_value(v)}" for k, v in given.items())
  base = config_lib.load_config(spec)
  base.progress = False
  base.student.init.vocab_size = base.teacher.init.vocab_size = 320
  base.total_steps, base.ckpt_every, base.eval_every = 2, 2, 2
  base.keep_final_only = bool(grid.base.get("keep_final_only", False))
  grid.base = base
  grid.base_spec = spec
  grid.local_assets = True
  if not (arg is not None and "seeds" in arg and arg.given("seeds")):
    grid.seeds = (0,)
  if "task" in given:
    eval_spec += f",task={given['task']}"
  grid.eval = dict(spec=eval_spec, updates=dict(progress=False), baseline=True)
  grid.axes = tuple((n, f, lrs if n == "lr" else v) for n, f, v in grid.axes)
