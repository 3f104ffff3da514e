"""Running a grid: one run after another, each in <workdir>/<run name>/.

A run is finished when its results.json exists (written atomically, last):
finished runs are skipped, others are (re)started with train_loop.train, which
resumes from the run's newest good checkpoint by itself. results.json holds

  name, dirname, factors        as in study.grid.Run
  study                         kl, policy, lam (1 = on-policy, 0 = teacher),
                                lr, task, seed: the study's factors read from
                                the config, whatever the axes were called
  train                         the last logged training metrics (the last
                                sparsity/* values included)
  eval                          evaluation metrics (jaxdistill.evaluate), or None
  compute                       steps, tokens_generated (response tokens),
                                tokens_processed (prompt + response), model
                                FLOPs of training and of rollouts (models/flops.py)
  revisions                     what came from the hub: {'student.path':
                                {id, revision, commit}, ..., 'data/sciknoweval':
                                {repo, revision, commit}} (sweep/inputs.py
                                pins every hub name to its commit first)

With grid.share_teacher_rollouts, teacher-policy arms train with
--shared_rollouts <workdir>/shared_rollouts (train/shared_rollouts.py): the
first arm of a key decodes each step, the others read it (single host).

With an RLVR stage (grid.rlvr, study.rlvr) each chosen arm then gets
<run>/rlvr/ with its own results.json (run_rlvr_one).

Several hosts (`python -m jaxdistill.sweep --distributed`, the same command on
every host of a slice, the workdir one they all see): one arm at a time over
all chips, its training and its evaluation alike; process 0 alone holds the
workdir's lock, prepares the inputs and writes the sweep's files (snapshots,
results.json, sweep.json, the summary), and the others wait for it at the
points where they would read them (train.distributed.barrier).
"""
from __future__ import annotations

from collections.abc import Callable
import contextlib
import json
import os
import sys
import time

import jax

from jaxdistill import cli
from jaxdistill import config_lib
from jaxdistill import losses
from jaxdistill import rollout as rollout_lib
from jaxdistill import storage
from jaxdistill.evaluate import run as evaluate_run
from jaxdistill.rl import train as rl_train
from jaxdistill.sweep import baselines
from jaxdistill.sweep import disk as sweep_disk
from jaxdistill.sweep import figures
from jaxdistill.models import flops as flops_lib
from jaxdistill.sweep import grid as grid_lib
from jaxdistill.sweep import inputs
from jaxdistill.sweep import paper_figures
from jaxdistill.sweep import rlvr as rlvr_lib
from jaxdistill.sweep import runlocal
from jaxdistill.sweep import table
from jaxdistill.sweep import trajectory
from jaxdistill.train import checkpoint as ckpt_lib
from jaxdistill.train import distributed
from jaxdistill.train import log as train_log
from jaxdistill.train import loop as train_loop
from jaxdistill.train import preempt
from jaxdistill.train import setup as train_setup

RESULTS = "results.json"
SWEEP = "sweep.json"


def log(msg: str):
  if _primary():
    print(f"[sweep] {msg}", file=sys.stderr, flush=True)


def _primary() -> bool:
  """Process 0: the one that writes the sweep's own files (every process
  trains and evaluates)."""
  return jax.process_index() == 0


def write_json_atomic(path: str, obj) -> None:
  storage.write_text(path, json.dumps(obj, indent=2, sort_keys=True,
                                      default=str))


def is_finished(run_dir: str) -> bool:
  return storage.isfile(os.path.join(run_dir, RESULTS))


def study_factors(config) -> dict:
  """The study's factors of a run, read from its training config."""
  ro = config.rollout
  lam = {"student": 1.0, "teacher": 0.0}.get(ro.policy,
                                            rollout_lib.policy_lam(ro))
  task = config.data.task
  if task == "mcq" and config.data.get("source"):
    task = config.data.source
  if task == "countdown" and config.data.get("source"):
    task = config.data.source  # the paper's set: countdown3, countdown4, ...
  elif task == "countdown":
    task = f"countdown{int(config.data.get('n_numbers') or 3)}"
  return {"kl": config.loss.kind, "policy": ro.policy, "lam": lam,
          "lr": float(config.optim.lr), "task": task, "seed": int(config.seed),
          "clip": config.optim.clip_norm, "max_new_tokens":
          int(ro.max_new_tokens),
          # the weights' storage: float32 masters or bfloat16 (issue 41)
          "precision": str(config.student.get("param_dtype") or "float32")}


def compute_record(config, records: list[dict]) -> dict:
  """Tokens and model FLOPs of a run, from its metrics.jsonl records."""
  scfg = train_setup.model_config(config.student, "student")
  tcfg = (None if config.loss.kind == losses.CE
          else train_setup.model_config(config.teacher, "teacher"))
  b = int(config.data.batch_size)
  out = {"steps": len(records), "tokens_generated": 0.0,
         "tokens_processed": 0.0, "train_flops": 0.0, "rollout_flops": 0.0}
  for r in records:
    tok = float(r.get("rollout/tokens", 0.0))
    seq = tok / b
    out["tokens_generated"] += float(r.get("train/response_tokens", 0.0))
    out["tokens_processed"] += tok
    out["train_flops"] += flops_lib.train_step_flops(scfg, tcfg, tok, seq)
    out["rollout_flops"] += flops_lib.rollout_flops(  # as the arm decodes
        scfg, tcfg, rollout_lib.sampling_policy(config.rollout)[0], tok, seq)
  # With log_every > 1 not every step is logged: scale to all steps.
  total = int(config.total_steps)
  if records and len(records) < total:
    scale = total / len(records)
    for k in ("tokens_generated", "tokens_processed", "train_flops",
              "rollout_flops"):
      out[k] *= scale
    out["estimated_from_logged_steps"] = len(records)
  out["steps"] = total if records else 0
  out["flops"] = out["train_flops"] + out["rollout_flops"]
  out["student_matmul_params"] = flops_lib.matmul_params(scfg)
  if tcfg is not None:
    out["teacher_matmul_params"] = flops_lib.matmul_params(tcfg)
  return out


def default_evaluate(grid, run: grid_lib.Run, run_dir: str) -> dict | None:
  """jaxdistill.evaluate on the run's export (and the student it started
  from, its scores shared by the arms with the same baseline and config:
  sweep/baselines.py)."""
  cfg = inputs.eval_config(grid, run)
  if cfg is None:
    return None
  baseline = run.config.student.get("path") if grid.eval.get("baseline") else None
  # The sweep's workdir: run_dir is <workdir>/<arm> or, for an RLVR stage,
  # <workdir>/<arm>/rlvr (its baseline is the arm's: the same store file).
  arm_dir = run_dir
  while os.path.basename(arm_dir) != run.dirname and os.path.dirname(
      arm_dir) != arm_dir:
    arm_dir = os.path.dirname(arm_dir)
  workdir = os.path.dirname(arm_dir if os.path.basename(arm_dir) == run.dirname
                            else run_dir)
  k = baselines.key(cfg, baseline) if baseline else None
  stored = baselines.load(workdir, k) if k else None
  before, before_raw = stored or (None, None)

  def evaluate_one(ckpt, base, out, before):
    res = evaluate_run.run(cfg, ckpt, base, out=out, before=before,
                           before_raw=before_raw if before else None)
    if k and before is None and _primary():  # the baseline was evaluated
      baselines.save(workdir, k, res, baseline)
    return res

  if grid.eval.get("trajectory") is not None:  # every export, the best
    return trajectory.evaluate(
        run.config, run_dir, baseline or None, grid.eval.trajectory,
        primary=_primary(), evaluate_one=evaluate_one, before=before)
  res = evaluate_one(run_dir, baseline or None,
                     os.path.join(run_dir, "eval.json"), before)
  return res["metrics"]


def run_revisions(grid, run: grid_lib.Run, run_dir: str) -> dict:
  """The commits of what the run read from the hub: its checkpoints (the
  run's revisions.json) and its data sets prepared by name."""
  path = os.path.join(run_dir, train_loop.REVISIONS)
  out = {}
  if storage.isfile(path):
    out.update(table.read_json(path, fix=f"delete {run_dir} to rerun it"))
  out.update(inputs.data_revisions(grid, run))
  return out


def run_one(grid, run: grid_lib.Run, run_dir: str, *,
            evaluate_fn: Callable | None = None, devices=None) -> dict:
  """Trains (or resumes) one run, evaluates it, writes results.json."""
  t0 = time.time()
  if _primary():
    grid_lib.write_snapshot(run, run_dir)
  shared = (grid_lib.shared_rollouts_dir(grid, run,
                                         local_root(os.path.dirname(run_dir)))
            if jax.process_count() == 1 else None)  # single-host only yet
  train_loop.train(run.config, run_dir, devices=devices,
                   **({} if shared is None else {"shared_rollouts": shared}))
  # Process 0 writes the export and the metrics: every host reads them next.
  distributed.barrier(f"sweep: {run.name} trained")
  records = train_log.read_metrics(run_dir)
  last = {}
  for r in records:  # sparsity is logged only every eval_every steps
    last.update(r)
  evaluate_fn = evaluate_fn or default_evaluate
  ev = evaluate_fn(grid, run, run_dir)
  result = {"name": run.name, "dirname": run.dirname, "factors": run.factors,
            "study": study_factors(run.config), "train": last,
            "eval": ev, "compute": compute_record(run.config, records),
            "revisions": run_revisions(grid, run, run_dir),
            "elapsed_s": time.time() - t0, "finished": time.time()}
  if _primary():
    write_json_atomic(os.path.join(run_dir, RESULTS), result)
  distributed.barrier(f"sweep: {run.name} finished")
  return result


def run_rlvr_one(grid, run: grid_lib.Run, run_dir: str, *,
                 evaluate_fn: Callable | None = None, devices=None) -> dict:
  """GRPO from one finished arm (study.rlvr), evaluated; writes the stage's
  results.json. Resumes an interrupted stage from its checkpoints."""
  t0 = time.time()
  out = rlvr_lib.stage_dir(run_dir)
  config = rlvr_lib.stage_config(grid, run, run_dir)
  if _primary():
    grid_lib.write_config_snapshot(config, out)
  rl_train.train(config, out, devices=devices)
  distributed.barrier(f"sweep: {run.name} RLVR trained")
  records = train_log.read_metrics(out)
  last = {}
  for r in records:
    last.update(r)
  ev = (evaluate_fn or default_evaluate)(grid, run, out)
  arm = table.read_results(os.path.join(run_dir, RESULTS))
  result = {k: arm[k] for k in ("name", "dirname", "factors", "study")}
  # What the stage took from the hub (kl.reference, the tokenizer), pinned
  # by rlvr.stage_config: rl.train's revisions.json, written when any was.
  rev = os.path.join(out, train_loop.REVISIONS)
  result["revisions"] = (table.read_json(rev, fix=f"delete {out} to rerun "
                                         "the stage")
                         if storage.isfile(rev) else {})
  result.update({"stage": "rlvr", "train": last,
                 "rewards": rlvr_lib.rewards_of(records),
                 "reward_steps": rlvr_lib.reward_steps(records), "eval": ev,
                 "elapsed_s": time.time() - t0, "finished": time.time()})
  if _primary():
    write_json_atomic(os.path.join(out, RESULTS), result)
  distributed.barrier(f"sweep: {run.name} RLVR finished")
  return result


def _to_train(runs, workdir, rerun_stale, paths_root):
  """The runs that will train: unfinished ones, and with rerun_stale the
  finished ones trained under another config."""
  out = []
  for run in runs:
    run_dir = os.path.join(workdir, run.dirname)
    if not is_finished(run_dir) or (
        rerun_stale and stale_changes(run, run_dir, paths_root)):
      out.append(run)
  return out


def _check_configs(grid, runs):
  """Config errors of the runs to train (their training and evaluation),
  before anything is written."""
  evals = set()
  for run in runs:
    try:
      config_lib.validate(run.config)
      config_lib.validate_run(run.config)
    except ValueError as e:
      raise ValueError(f"run {run.name!r}: {e}") from None
    spec = grid_lib.eval_spec(grid, run)
    if spec is not None and grid.eval.get("trajectory") is not None:
      trajectory.check(grid.eval.trajectory)
      if rlvr_lib.declared(grid):
        raise ValueError("grid.eval.trajectory: not with an RLVR stage (grid."
                         "rlvr): the stage is evaluated at its end only")
      if not train_loop.step_exports(run.config):
        raise ValueError(f"run {run.name!r}: grid.eval.trajectory needs "
                         "export_every > 0 (and < total_steps): the "
                         "checkpoints it evaluates are the run's exports")
    if spec is not None and spec not in evals:
      evals.add(spec)
      cfg = config_lib.load_config(spec)
      grid_lib.merge(cfg, grid.eval.get("updates") or {}, "grid.eval.updates")
      try:
        evaluate_run.check_config(cfg)
      except ValueError as e:
        raise ValueError(f"grid.eval.spec {spec!r}: {e}") from None


def _check_runnable(runs):
  """What the models' config.json decide for the runs to train (positions,
  the teacher's top-k), before the first one starts."""
  for run in runs:
    c = run.config
    try:
      models = {"student": train_setup.model_config(c.student, "student")}
      if c.loss.kind != losses.CE and not c.loss.get("teacher_cache"):
        models["teacher"] = train_setup.model_config(c.teacher, "teacher")
      vocab = c.loss.get("vocab_size") or min(m.vocab_size
                                               for m in models.values())
      config_lib.check_fits(c, models, vocab)
    except ValueError as e:
      raise ValueError(f"run {run.name!r}: {e}") from None


# Settings that do not change a finished run's result: a finished arm whose
# config differs from the new one only in these is reused.
DISPLAY_FIELDS = ("progress", "log_every", "ckpt_every", "keep_ckpts",
                  "keep_final_only", "wandb")
STALE_DIR = "stale"


def _config_changes(old, new, workdir: str, prefix: str = "") -> list[str]:
  """Dotted fields whose values differ between two config dicts. A path
  inside `workdir` (the sweep's own, with e.g. local_assets' tokenizer and
  student, or the run_sweep's paths_root) matches the old run's path with the
  same relative part, so a moved sweep directory is not stale."""
  out = []
  roots = {storage.abspath(workdir).rstrip("/") + "/",
           local_root(workdir).rstrip(os.sep) + os.sep}
  for k in sorted(set(old) | set(new)):
    key = f"{prefix}{k}"
    a, b = old.get(k, "<missing>"), new.get(k, "<missing>")
    if isinstance(a, dict) and isinstance(b, dict):
      out += _config_changes(a, b, workdir, key + ".")
    elif a != b:
      if isinstance(a, str) and isinstance(b, str) and any(
          b.startswith(r) and a.endswith("/" + b[len(r):]) for r in roots):
        continue
      out.append(f"{key}: {a!r} -> {b!r}")
  return out


def stale_changes(run: grid_lib.Run, run_dir: str, workdir: str) -> list[str]:
  """How the config `run_dir` was trained with differs from `run.config`
  ([] when it matches, or nothing was trained there yet)."""
  return config_changes(run.config, run_dir, workdir)


def trained_config(run_dir: str) -> dict | None:
  """The config.json `run_dir` was trained with (None before its training
  starts); ValueError naming the file if it is not a JSON object."""
  path = os.path.join(run_dir, "config.json")
  if not storage.isfile(path):
    return None
  return table.read_json(path, fix=f"delete {run_dir} to rerun it from the "
                         "start (the config it was trained with is unknown)")


def config_changes(config, run_dir: str, workdir: str) -> list[str]:
  """How the config `run_dir` was trained with differs from `config`."""
  old = trained_config(run_dir)
  if old is None:
    return []
  new = json.loads(config_lib.to_json(config))
  # An unfinished run resumes, and may then change what resuming allows.
  ignore = DISPLAY_FIELDS if is_finished(run_dir) else train_loop.RESUMABLE_FIELDS
  return [c for c in _config_changes(old, new, workdir)
          if c.split(":")[0].split(".")[0] not in ignore]


def _handle_stale(grid, runs, workdir: str, rerun_stale: bool,
                  paths_root: str) -> None:
  """Refuses (or, with rerun_stale, moves aside) runs, and RLVR stages, done
  under another config (paths under `paths_root` compared by their relative
  part)."""
  stale = []  # (name, directory, changes)
  for run in runs:
    run_dir = os.path.join(workdir, run.dirname)
    changes = stale_changes(run, run_dir, paths_root)
    if changes:
      stale.append((run.name, run_dir, changes))
    elif rlvr_lib.declared(grid):
      out = rlvr_lib.stage_dir(run_dir)
      changes = config_changes(rlvr_lib.stage_config(grid, run, run_dir), out,
                               paths_root)
      if changes:
        stale.append((f"{run.name} (RLVR stage)", out, changes))
  if not stale:
    return
  if not rerun_stale:
    name, _, changes = stale[0]
    hint = ""
    if any("@" in c and c.split(":")[0].endswith(("path", "tokenizer",
                                                  "reference"))
           for c in changes):
      hint = ("; a hub name that now resolves to another commit can be "
              "pinned to the old one as org/name@<commit>")
    raise ValueError(
        f"{workdir}: {len(stale)} run(s) were trained under a different "
        f"config than the grid now gives, e.g. {name!r}: "
        f"{'; '.join(changes[:5])}; pass rerun_stale=True (--rerun_stale) to "
        f"move them into {os.path.join(workdir, STALE_DIR)}/ and rerun them"
        f"{hint}")
  if not _primary():  # process 0 moves them; the sweep waits for it
    return
  aside = os.path.join(workdir, STALE_DIR)
  storage.makedirs(aside)
  for name, path, changes in stale:
    rel = path[len(workdir):].strip("/").replace("/", "-")
    dst = os.path.join(aside, f"{rel}-{time.strftime('%Y%m%d-%H%M%S')}")
    if storage.is_gs(path):
      # Object by object, its config.json last: killed part way, what is
      # left is still refused as stale (or moved again), never resumed.
      storage.move(path, dst, last="config.json")
    else:
      os.replace(path, dst)
    log(f"{name}: config changed ({'; '.join(changes[:3])}); "
        f"old run moved to {dst}")


def _run_rlvr(grid, runs, workdir, results, *, devices, evaluate_fn):
  """The RLVR stage of every chosen arm (study.rlvr), skipping finished ones."""
  chosen = rlvr_lib.select(grid, runs, {r["name"]: r for r in results})
  for i, run in enumerate(chosen):
    run_dir = os.path.join(workdir, run.dirname)
    out = rlvr_lib.stage_dir(run_dir)
    if is_finished(out):
      log(f"RLVR {i + 1}/{len(chosen)} {run.name}: finished, skipped")
      continue
    state = ("resuming" if storage.isdir(os.path.join(out, "checkpoints"))
             else "starting")
    log(f"RLVR {i + 1}/{len(chosen)} {run.name}: {state}")
    run_rlvr_one(grid, run, run_dir, evaluate_fn=evaluate_fn, devices=devices)


def run_sweep(grid, workdir: str, *, only: str | None = None,
              evaluate_fn: Callable | None = None, devices=None,
              summarize: bool = True, rerun_stale: bool = False,
              rlvr_evaluate_fn: Callable | None = None,
              paths_root: str | None = None,
              train_runs: Callable | None = None) -> list[dict]:
  """Runs every unfinished run of `grid` in turn; returns all results.

  With grid.rlvr (study.rlvr), GRPO then runs from every chosen arm in
  <arm dir>/rlvr/ and is evaluated the same way. Then writes
  <workdir>/summary/: results.csv, results.md and the figures.
  `evaluate_fn(grid, run, run_dir) -> flat metrics | None` replaces the
  default evaluation (jaxdistill.evaluate with grid.eval); `rlvr_evaluate_fn`
  (default: evaluate_fn) that of the RLVR stages (run_dir: <arm dir>/rlvr).

  A run directory trained under a config other than the run's (a setting
  changed outside the grid's axes) is refused, naming the fields, unless
  `rerun_stale`, which moves it into <workdir>/stale/ and runs it again.
  Fields in DISPLAY_FIELDS, and paths inside `workdir` (or `paths_root`, a
  directory holding it and the grid's assets) that differ only by where that
  directory lives, are not differences.

  `train_runs(runs)`, when given, is called with the unfinished runs once the
  checks have passed and the lock is held, to train them another way (the
  demo's worker processes, each calling `run_one` for some of them); a run it
  leaves unfinished is trained here in turn.

  Every unfinished run's config (training, evaluation, RLVR stage) is checked
  before anything is written; then the sweep holds <workdir>/.lock (one
  sweep per workdir). SIGTERM / SIGINT stop it with train.preempt.Preempted
  (exit status 128 + signal): during an arm's training after its
  checkpoint, elsewhere at once; finished runs are kept.
  """
  workdir = storage.check(workdir, "--workdir", gs_ok=True)
  # Hub names pinned to their commits (nothing written yet), so that every
  # check below sees what the runs will train with.
  runs = inputs.plan(grid, workdir, only, prepare=False)
  if not runs:
    raise ValueError(f"--only {only!r}: no run of the grid matches")
  paths_root = paths_root or workdir
  read_finished(grid, runs, workdir)
  if summarize:  # every results.json the summary reads, the other arms' too
    table.aggregate(workdir)
  todo = _to_train(runs, workdir, rerun_stale, paths_root)
  _check_configs(grid, todo)
  if rlvr_lib.declared(grid):
    rlvr_lib.check(grid, runs, workdir)
  # A runlocal grid's student is its init until prepare_assets saves it: the
  # same ModelConfig either way.
  _check_runnable(todo)
  baselines.check(workdir)
  if storage.is_gs(workdir):
    storage.check_writable_dir(workdir)
  else:
    cli.check_writable_dir(workdir)
  if jax.process_count() > 1 and train_runs is not None:
    raise ValueError("train_runs: a hook of its own processes cannot run in "
                     "a multi-host sweep")
  # One sweep per workdir: a second one would race on the assets and arms.
  # On several hosts (--distributed) process 0 holds the lock and writes the
  # sweep's files; every process trains and evaluates each arm together.
  lock = (ckpt_lib.WorkdirLock(workdir) if _primary()
          else contextlib.nullcontext())
  with lock, preempt.stop_at_once(
      f"finished runs, and the checkpoints of the one in progress, are kept "
      f"in {workdir}"):
    return _run_locked(grid, runs, workdir, only=only, evaluate_fn=evaluate_fn,
                       devices=devices, summarize=summarize,
                       rerun_stale=rerun_stale,
                       rlvr_evaluate_fn=rlvr_evaluate_fn,
                       paths_root=paths_root, train_runs=train_runs)


def read_finished(grid, runs, workdir: str) -> dict:
  """{run name: results} of the finished runs, every results.json and
  config.json (the arms' and their RLVR stages') and sweep.json checked:
  ValueError naming the file, before anything trains or is written."""
  path = os.path.join(workdir, SWEEP)
  if storage.isfile(path):
    table.read_json(path, fix="delete it (the sweep writes it again from the "
                    "grid)")
  done = {}
  for run in runs:
    run_dir = os.path.join(workdir, run.dirname)
    stage = rlvr_lib.stage_dir(run_dir)
    dirs = [run_dir] + ([stage] if rlvr_lib.declared(grid) else [])
    for d in dirs:
      trained_config(d)  # compared with the grid's before anything resumes
      if is_finished(d):
        result = _results_of(run, d)
        if d == run_dir:
          done[run.name] = result
  return done


def _results_of(run: grid_lib.Run, run_dir: str) -> dict:
  """`run_dir`'s results.json (the run's or its RLVR stage's), checked to be
  `run`'s: one copied from another arm's directory is refused."""
  path = os.path.join(run_dir, RESULTS)
  result = table.read_results(path)
  if result["name"] != run.name:
    raise ValueError(f"{path}: field 'name' is {result['name']!r}, not this "
                     f"directory's run {run.name!r}; delete {run_dir} to "
                     "rerun it")
  return result


def _run_locked(grid, runs, workdir, *, only, evaluate_fn, devices, summarize,
                rerun_stale, rlvr_evaluate_fn, paths_root, train_runs):
  # Process 0 first: it writes the assets and the prepared data, which the
  # others then find in place.
  for turn in (True, False):
    if _primary() == turn:
      if grid.get("local_assets"):
        runlocal.prepare_assets(grid, workdir)
      # Again: the assets' paths are in the base; now the data is prepared
      # too.
      runs = inputs.plan(grid, workdir, only, is_finished=is_finished, log=log)
    distributed.barrier(f"sweep: inputs ready ({turn})")
  _handle_stale(grid, runs, workdir, rerun_stale, paths_root)
  sweep = {"base_spec": grid.get("base_spec"), "runs": [r.name for r in runs],
           "grid": json.loads(json.dumps(grid.to_dict(), default=str))}
  path = os.path.join(workdir, SWEEP)
  if _primary() and (not storage.isfile(path)
                     or table.read_json(path) != sweep):
    write_json_atomic(path, sweep)
  distributed.barrier("sweep: stale runs moved, sweep.json written")
  done = read_finished(grid, runs, workdir)
  todo = [r for r in runs if r.name not in done]
  for line in sweep_disk.lines(sweep_disk.arms(runs) +
                               sweep_disk.stages(grid, runs),
                               sweep_disk.shared(grid, runs)
                               if jax.process_count() == 1 else 0):
    log(line)
  if train_runs is not None and todo:
    train_runs(todo)
    done = read_finished(grid, runs, workdir)  # what the hook finished
  results = []
  for i, run in enumerate(runs):
    run_dir = os.path.join(workdir, run.dirname)
    if run.name in done:
      log(f"{i + 1}/{len(runs)} {run.name}: finished, skipped")
      results.append(done[run.name])
      continue
    state = ("resuming" if storage.isdir(os.path.join(run_dir, "checkpoints"))
             else "starting")
    log(f"{i + 1}/{len(runs)} {run.name}: {state}")
    results.append(run_one(grid, run, run_dir, evaluate_fn=evaluate_fn,
                           devices=devices))
  if rlvr_lib.declared(grid):
    _run_rlvr(grid, runs, workdir, results, devices=devices,
              evaluate_fn=rlvr_evaluate_fn or evaluate_fn)
  if summarize and _primary():
    rows = table.aggregate(workdir)
    out = os.path.join(workdir, "summary")
    local = storage.local_staging() if storage.is_gs(out) else out
    table.write_table(rows, local)
    figures.make_figures(rows, local)
    paper_figures.make(rows, local)
    if local != out:  # files replaced one by one: each whole
      storage.upload_dir(local, out)
  return results


def local_root(workdir: str) -> str:
  """Where a sweep keeps what it reads as local files (its prepared data,
  shared rollouts): the workdir itself, or for gs:// storage.scratch."""
  return (storage.scratch(workdir) if storage.is_gs(workdir)
          else os.path.abspath(workdir))
