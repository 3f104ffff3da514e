r"""Distillation training loop.

  python -m jaxdistill.train --config configs/distill.py:runlocal --workdir /tmp/jd
  python -m jaxdistill.train --config configs/distill.py:kl=reverse,lr=5e-5 \
      --config.student.path=/ckpt/Qwen2.5-0.5B-Instruct \
      --config.teacher.path=/ckpt/Qwen2.5-7B-Instruct --workdir /runs/qwen_rkl

Reads top to bottom: config -> mesh -> models (sharded) -> data ->
jax.eval_shape(init) -> shardings -> jit(init) or restore -> jit(update) ->
loop (rollout, update, log, checkpoint) -> export as a Hugging Face directory.
Re-running with the same --workdir resumes from the newest good checkpoint.

--compile_only=SLICE (e.g. v5e-8) compiles the run's programs for that TPU
slice on this host instead, without weights, data or a TPU, and reports
their per-chip memory (jaxdistill/compile_only.py); on a TPU the run makes
the same check before it loads any weight.

--shared_rollouts=DIR (teacher-policy runs): each step's teacher rollout is
read from DIR when another run with the same key wrote it, else decoded
and written there; the run trains on the same arrays either way
(train/shared_rollouts.py; a sweep passes it with grid.share_teacher_rollouts).

SIGTERM (a TPU VM preemption) or SIGINT: the step in flight finishes, a
checkpoint is written, and the run stops with `Preempted` (the CLI exits with
status 128 + signal); the same command resumes it. One process per workdir
(<workdir>/.lock names the holder).

--workdir may be gs://bucket/run (jaxdistill/storage.py, docs/cloud_storage.md):
checkpoints, logs, the export and the lock are written there, and no path
of the config may be a URL yet (refused before any compute).

jaxdistill.rl.train runs through the same pieces (init_or_restore, run_steps,
main) with its own step.
"""
from __future__ import annotations

import functools
import json
import logging
import math
import os
import shutil
import sys
import time

from absl import flags
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
from ml_collections import config_flags
import optax

from jaxdistill import cli
from jaxdistill import compile_only
from jaxdistill import config_lib
from jaxdistill import losses
from jaxdistill import models
from jaxdistill import sharding
from jaxdistill import sparsity
from jaxdistill import storage
from jaxdistill.data import tokenizer as tok_lib
from jaxdistill.models import hub
from jaxdistill.models import lora
from jaxdistill.train import batches as train_batches
from jaxdistill.train import checkpoint as ckpt_lib
from jaxdistill.train import disk
from jaxdistill.train import distributed
from jaxdistill.train import log as train_log
from jaxdistill.train import programs
from jaxdistill.train import preempt
from jaxdistill.train import seen as seen_lib
from jaxdistill.train import setup as train_setup
from jaxdistill.train import shared_rollouts as shared_lib
from jaxdistill.train import step as step_lib
from jaxdistill.train import teacher_cache

# Fields that may change when a run is resumed (they do not change its result).
RESUMABLE_FIELDS = ("total_steps", "log_every", "eval_every", "ckpt_every",
                    "keep_ckpts", "keep_final_only", "progress", "export_hf",
                    "export_every", "wandb")

# config.export_every's exports: <workdir>/exports/step_000100, ...
EXPORTS = "exports"


REVISIONS = "revisions.json"

# Folded into the student's init key for its LoRA adapters' A.
LORA_KEY = 0x10A


def _read_json(path: str) -> dict:
  try:
    with storage.open(path) as f:
      return json.load(f)
  except ValueError as e:
    raise ValueError(f"{path}: not valid JSON ({e}); move the workdir "
                     "aside or pass --overwrite") from None


def _read_revisions(path: str) -> dict:
  """A workdir's revisions.json, checked: {field: {'id', 'commit', ...}}."""
  revisions = _read_json(path)
  if not isinstance(revisions, dict):
    raise ValueError(f"{path}: expected a JSON object of fields; move the "
                     "workdir aside or pass --overwrite")
  for field, info in revisions.items():
    if not (isinstance(info, dict) and isinstance(info.get("id"), str)
            and isinstance(info.get("commit"), str)):
      raise ValueError(f"{path}: entry {field!r} needs string 'id' and "
                       "'commit'; move the workdir aside or pass --overwrite")
  return revisions


def _unknown_commits(old: dict, revisions: dict, workdir: str) -> list[str]:
  """The hub names of a trained workdir whose commits are unknown: its
  revisions.json is gone and its config.json does not pin them."""
  ckpts = os.path.join(workdir, "checkpoints")
  if not (storage.isdir(ckpts) and storage.listdir(ckpts)):
    return []  # nothing trained yet: the commits resolved now are the run's
  pinned = _pinned(old, revisions)
  return [f for f in revisions if _value(old, f) != _value(pinned, f)]


def _value(config: dict, field: str):
  node = config
  for p in field.split("."):
    node = node.get(p) if isinstance(node, dict) else None
  return node


def _pinned(config: dict, revisions: dict) -> dict:
  """`config` with each hub name of `revisions` written as org/name@<commit>:
  'Q' and 'Q@<its commit>' name the same weights, another commit does not."""
  config = json.loads(json.dumps(config))
  for field, info in revisions.items():
    *parents, leaf = field.split(".")
    node = config
    for p in parents:
      node = node.get(p) or {}
    if leaf in node:
      node[leaf] = f"{info['id']}@{info['commit']}"
  return config


def prepare_workdir(config, workdir: str, overwrite: bool,
                    revisions: dict | None = None):
  """Writes config.json, and revisions.json: the commits of the checkpoints
  taken from the hub (train.setup.revisions), kept apart so that a hub name
  in the config stays as written. Refuses to reuse a workdir of a different
  config, or whose hub names now resolve to other commits."""
  storage.makedirs(workdir)
  path = os.path.join(workdir, "config.json")
  rev_path = os.path.join(workdir, REVISIONS)
  new = config_lib.without_lora_off(json.loads(config_lib.to_json(config)))
  if storage.exists(path):
    old = config_lib.without_lora_off(_read_json(path))
    if storage.exists(rev_path):
      old, new = (_pinned(old, _read_revisions(rev_path)),
                  _pinned(new, revisions or {}))
    changed = [d for d in config_lib.diff(old, new)
               if d.split(":")[0].split(".")[0] not in RESUMABLE_FIELDS]
    if not storage.exists(rev_path):
      unknown = _unknown_commits(old, revisions or {}, workdir)
      if unknown and not overwrite:
        raise ValueError(
            f"{rev_path}: missing, so the commits {workdir} trained from are "
            f"unknown for {', '.join(unknown)}; restore it, pin the names in "
            "the config (org/name@<commit>), or pass --overwrite to move the "
            "old run aside")
      changed += [f"{f}: commit unknown" for f in unknown]
    if changed and not overwrite:
      raise ValueError(
          f"--workdir {workdir} holds a run of a different config:\n  " +
          "\n  ".join(changed[:20]) +
          "\nUse another --workdir, or pass --overwrite to move the old run "
          "aside (into <workdir>/replaced-<time>/) and start fresh.")
    if changed and overwrite:
      aside = os.path.join(workdir, time.strftime("replaced-%Y%m%d-%H%M%S"))
      storage.makedirs(aside)
      # config.json last: a kill part way (a move on gs:// copies object by
      # object) leaves it in place, so the next run refuses again, or with
      # --overwrite moves the rest, rather than resuming another config's
      # checkpoints.
      entries = [e for e in storage.listdir(workdir)
                 if not e.startswith("replaced-") and
                 e != ckpt_lib.WorkdirLock.NAME]
      for entry in sorted(entries, key=lambda e: e == "config.json"):
        storage.move(os.path.join(workdir, entry), os.path.join(aside, entry))
      logging.warning("moved the previous run of %s into %s", workdir, aside)
  storage.write_text(path, config_lib.to_json(config))
  if revisions:
    storage.write_text(rev_path, json.dumps(revisions, indent=2,
                                            sort_keys=True))
  elif storage.exists(rev_path):
    storage.remove(rev_path)


def config_mesh(config, devices=None):
  """The mesh of config.mesh over `devices` (default: all)."""
  try:
    return sharding.make_mesh(dict(config.mesh), devices=devices)
  except ValueError as e:
    raise ValueError(f"config.mesh: {e}") from None


def init_or_restore(config, workdir, scfg, optimizer, params0, mesh, rules,
                    *, base=None, lcfg=None):
  """The checkpointer of <workdir>/checkpoints and the train state {params,
  opt_state, step}, sharded: restored from its latest checkpoint if there is
  one, else built from `params0`. LoRA (`lcfg`, a lora.LoraConfig):
  `params0` are the fresh adapters and `base` the frozen model, which the
  state holds as 'base' and no checkpoint saves (step.SAVED).

  Returns (ckpt, state, state_shardings, meta, start): `meta` is the
  checkpoint's metadata ({} when starting fresh) and `start` the step to run
  next.
  """
  ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"),
                               keep=config.keep_ckpts)
  make_state = functools.partial(step_lib.new_state, optimizer)
  state_shard = step_lib.state_shardings(scfg, optimizer, params0, mesh, rules,
                                         lcfg)
  saved_shard = step_lib.saved(state_shard)
  abstract = jax.tree.map(
      lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
      jax.eval_shape(make_state, params0), saved_shard)
  restored = ckpt.restore_latest(abstract)
  if restored is None:
    state = jax.jit(make_state, out_shardings=saved_shard)(params0)
    meta, start = {}, 0
  else:
    state, meta, start = restored
    logging.warning("resuming %s from step %d", workdir, start)
    if int(meta.get("step", start)) != start:
      raise ValueError(f"checkpoint {start}: meta step {meta.get('step')}")
  if base is not None:
    state = {**state, "base": base}
  return ckpt, state, state_shard, meta, start


def step_export(step: int) -> str:
  """The directory, relative to the workdir, of config.export_every's export
  at `step`."""
  return os.path.join(EXPORTS, f"step_{int(step):06d}")


step_exports = disk.step_exports  # the steps config.export_every exports


def export_hf(scfg, params, tokenizer, workdir: str, seen=None,
              name: str = "hf_student") -> str | None:
  """Saves the trained student as a Hugging Face directory <workdir>/<name>
  (default hf_student; with its tokenizer, and `seen`, the host mask of the token ids training
  processed, as train.seen.SEEN_FILE). Sharded params are gathered on every
  host; host 0 writes. Returns the directory on host 0, else None.

  On gs:// the directory is built locally and uploaded, config.json last
  (a Hugging Face directory without it does not load); its earlier
  config.json is removed first, so a kill during a re-export leaves none."""
  if jax.process_count() > 1:
    params = multihost_utils.process_allgather(params, tiled=True)
  else:
    params = jax.device_get(params)
  if jax.process_index() != 0:
    return None
  out = os.path.join(workdir, name)
  if not storage.is_gs(out):
    models.save_pretrained(scfg, params, out)
    tok_lib.save_tokenizer(tokenizer, out)
    _write_seen(out, seen)
    return out
  local = storage.local_staging()
  try:
    models.save_pretrained(scfg, params, local)
    tok_lib.save_tokenizer(tokenizer, local)
    _write_seen(local, seen)
    storage.remove(os.path.join(out, "config.json"))
    storage.upload_dir(local, out, last="config.json")
  finally:
    shutil.rmtree(local, ignore_errors=True)
  logging.info("exported the student to %s", out)
  return out


def export_adapters(lcfg, adapters, workdir: str, info: dict) -> str | None:
  """Writes the LoRA adapters as a peft directory <workdir>/hf_adapter
  (lora.save_peft; `info`: the base's 'base' and 'revision'), host 0."""
  adapters = jax.device_get(adapters if jax.process_count() == 1 else
                            multihost_utils.process_allgather(adapters,
                                                              tiled=True))
  if jax.process_index() != 0:
    return None
  out = os.path.join(workdir, "hf_adapter")
  kw = dict(base_model=info.get("base"), revision=info.get("revision"))
  if not storage.is_gs(out):
    return lora.save_peft(out, lcfg, adapters, **kw)
  local = storage.local_staging()
  try:
    lora.save_peft(local, lcfg, adapters, **kw)
    storage.upload_dir(local, out, last=lora.PEFT_CONFIG)
  finally:
    shutil.rmtree(local, ignore_errors=True)
  return out


def lora_meta(config, lcfg, revisions) -> dict:
  """The checkpoint metadata of a LoRA run: the adapters' settings and the
  base they adapt (config.student's path, and its hub commit if any)."""
  if lcfg is None:
    return {}
  rev = (revisions or {}).get("student.path") or {}
  quantised = {} if lcfg.base_quant is None else {"base_quant": lcfg.base_quant}
  return {"lora": {"rank": lcfg.rank, "alpha": float(lcfg.alpha),
                   "targets": list(lcfg.targets), "dtype": lcfg.dtype,
                   "base": hub.weights_spec(config.student),
                   "revision": rev.get("commit"), **quantised}}


def _write_seen(directory, seen):
  if seen is not None:
    seen_lib.write_seen(directory, seen)
  elif os.path.isfile(os.path.join(directory, seen_lib.SEEN_FILE)):
    os.remove(os.path.join(directory, seen_lib.SEEN_FILE))  # not this run's


def run_steps(config, workdir, *, step_fn, state, start, ckpt, scfg, params0,
              tokenizer, name="train", meta=None, lcfg=None, seen=None) -> dict:
  """The loop both training commands share; returns the last step's metrics.

  `step_fn(step, state) -> (state, metrics)` runs one step (metrics: floats
  with 'train/loss' and 'rollout/tokens'). Around it: timing, the NaN stop,
  update sparsity against `params0` (None: not tracked) every eval_every
  steps, the log (progress bar `name`), checkpoints (metadata: step, data
  position, seed and `meta`), the SIGTERM/SIGINT stop (raises Preempted after
  its checkpoint), closing the checkpointer and log, and the final
  <workdir>/hf_student export (config.export_hf), after which, with
  config.keep_final_only, only the final checkpoint is kept. With
  config.export_every = N > 0, the student is also exported every N steps
  before the last, to <workdir>/exports/step_<step> (step_export), each
  before that step's checkpoint: a run killed between the two redoes the
  step and its export on resume. LoRA (`lcfg`):
  the checkpoints hold the adapters only (step.SAVED), hf_student/ the merged
  weights and hf_adapter/ the adapters in peft's format. `seen` (a
  train.seen.SeenTokens that step_fn updates, or None) splits the embedding
  rows' sparsity, rides in each checkpoint's metadata and is exported.
  """
  log = train_log.Logger(workdir, total=config.total_steps, start=start,
                         progress=config.get("progress", True),
                         log_every=config.log_every, prefix=name,
                         config=config)
  init_norm = param_norm(state["params"]) if start == 0 else None
  last = {}
  exports = set(step_exports(config))
  if exports and tokenizer is None and config.get("tokenizer_build"):
    tokenizer = tok_lib.runlocal_tokenizer(config, workdir)  # runlocal
  scale = None if lcfg is None else lcfg.scale
  stop = StopOnSignal()
  try:
    for step in stop.steps(start, config.total_steps):
      ckpt.check()  # a failed save stops the run at once
      t0 = time.perf_counter()
      state, metrics = step_fn(step, state)
      if not math.isfinite(metrics["train/loss"]):
        raise FloatingPointError(nan_stop_message(
            step + 1, metrics["train/loss"], ckpt, state, init_norm))
      dt = time.perf_counter() - t0
      metrics["perf/step_time_s"] = dt
      metrics["perf/tokens_per_s"] = metrics["rollout/tokens"] / dt
      done = step + 1
      if params0 is not None and (done % config.eval_every == 0 or
                                  done == config.total_steps):
        # S_tau on the float32 values training produced (docs/method.md).
        metrics.update(sparsity.metrics_from_params(
            params0, state["params"], None if seen is None else seen.mask()))
      log.write(done, metrics)
      last = metrics
      stopping = stop.requested(done)  # every step: a multi-host sync point
      if done in exports:
        export_hf(scfg, step_lib.export_params(state, scale, scfg), tokenizer,
                  workdir, None if seen is None else seen.mask(),
                  name=step_export(done))
      if (done % config.ckpt_every == 0 or done == config.total_steps
          or stopping):
        ckpt.save(done, step_lib.saved(state),
                  {"step": done, "data_position": done,
                   "seed": int(config.seed), **(meta or {}),
                   **(seen.meta() if seen is not None else {})})
        log.sync()
    ckpt.wait()
    stop.raise_if_stopped(ckpt)
  finally:
    stop.restore()
    ckpt.close()
    log.close()
  if config.get("export_hf", True):
    if tokenizer is None and config.get("tokenizer_build"):  # runlocal
      tokenizer = tok_lib.runlocal_tokenizer(config, workdir)
    export_hf(scfg, step_lib.export_params(state, scale, scfg), tokenizer, workdir,
              None if seen is None else seen.mask())
    if lcfg is not None:
      export_adapters(lcfg, state["params"], workdir,
                      (meta or {}).get("lora", {}))
  if config.get("keep_final_only", False) and jax.process_index() == 0:
    ckpts = os.path.join(workdir, "checkpoints")
    if ckpt_lib.prune(ckpts, int(config.total_steps)):
      logging.info("finished: kept checkpoint %d of %s (keep_final_only)",
                   config.total_steps, ckpts)
  return last


def train(config, workdir: str, *, overwrite: bool = False,
          devices=None, shared_rollouts: str | None = None) -> dict:
  """Runs (or resumes) one distillation run; returns the last metrics.

  `devices` restricts the mesh to these devices (default: all).
  `shared_rollouts` (--shared_rollouts DIR): teacher-policy rollouts read
  from DIR where another run with the same key wrote them, else decoded and
  written there (train/shared_rollouts.py).
  """
  workdir = check_paths(config, workdir)
  config_lib.validate(config)
  config_lib.validate_run(config)
  if shared_rollouts:
    check_shared(config, shared_rollouts)
  train_log.check_wandb(config)
  mesh = config_mesh(config, devices)
  rules = sharding.rules_from_config(config)
  config_lib.validate_run(config, mesh, rules)
  with locked_workdir(workdir):
    return _train(config, workdir, overwrite, mesh, rules, shared_rollouts)


def check_shared(config, directory: str) -> None:
  """Refuses, in one line, a --shared_rollouts a run cannot use."""
  storage.check(directory, shared_lib.FLAG)  # local only
  if not shared_lib.shareable(config):
    raise ValueError(
        f"{shared_lib.FLAG}: only teacher-policy rollouts are shared "
        f"(rollout.policy='teacher', or 'spectrum' at lam -1; no "
        f"loss.teacher_cache); this run has "
        f"rollout.policy={config.rollout.policy!r}"
        + (" and a teacher cache" if config.loss.get("teacher_cache") else ""))
  if jax.process_count() > 1:
    raise ValueError(f"{shared_lib.FLAG}: single-host runs only")


# Config fields that may name gs:// inputs: read through a local mirror
# (storage.mirror, models.hub.checkpoint_dir), re-downloaded only when their
# upload changed.
GS_FIELDS = ("student.path", "teacher.path", "tokenizer", "kl.reference",
             "loss.teacher_cache", "data.data_dir")


def check_paths(config, workdir: str) -> str:
  """The workdir as the run uses it (local or gs://), after refusing, in one
  line, a workdir of another scheme and any URL among the config's fields
  but GS_FIELDS (shared rollouts, a manual_dir: local only)."""
  workdir = storage.check(workdir, "--workdir", gs_ok=True)

  def walk(node, prefix):
    for k, v in node.items():
      if isinstance(v, dict):
        walk(v, f"{prefix}{k}.")
      elif isinstance(v, str) and storage.looks_remote(v):
        storage.check(v, f"config.{prefix}{k}",
                      gs_ok=f"{prefix}{k}" in GS_FIELDS)
  walk(json.loads(config_lib.to_json(config)), "")
  return workdir


def model_configs(config):
  """(student cfg, teacher cfg, cached) of a distillation config. A teacher
  cache (jaxdistill.train.teacher_cache) replaces the teacher: its records
  are the run's batches and no teacher weights are loaded; supervised
  fine-tuning ('ce') needs no teacher. Without a teacher, its cfg is the
  student's."""
  scfg = train_setup.model_config(config.student, "student")
  train_setup.lora_config(config.student, cfg=scfg)  # a bad block fails here
  cached = bool(config.loss.get("teacher_cache"))
  no_teacher = config.loss.kind == losses.CE or cached
  tcfg = scfg if no_teacher else train_setup.model_config(config.teacher, "teacher")
  return scfg, tcfg, cached


def trained_dtype(config, scfg) -> str:
  """The dtype of what the optimizer updates (make_optimizer's param_dtype):
  the student's params, or its LoRA adapters'."""
  lcfg = train_setup.lora_config(config.student)
  return scfg.param_dtype if lcfg is None else lcfg.dtype


def run_programs(config, scfg, tcfg, vocab, mesh, rules, cached):
  """The run's compiled programs (train/programs.py), abstract."""
  optimizer, schedule = step_lib.make_optimizer(
      config.optim, config.total_steps, trained_dtype(config, scfg))
  return programs.train_programs(
      config, scfg, tcfg, mesh, rules, vocab, optimizer=optimizer,
      schedule=schedule, cached=cached,
      track_sparsity=bool(config.get("track_sparsity", True)))


def compile_for(config, slice_name: str) -> dict:
  """--compile_only: the run's programs compiled for a TPU slice on this
  host (no weights, data or TPU) -> compile_only's report."""
  config_lib.validate(config)
  config_lib.validate_run(config)
  target = compile_only.target(slice_name)
  mesh = config_mesh(config, target.devices)
  rules = sharding.rules_from_config(config)
  config_lib.validate_run(config, mesh, rules)
  scfg, tcfg, cached = model_configs(config)
  vocab = train_setup.compile_vocab(config, scfg, tcfg)
  with sharding.compiling_for(target.chip.platform):
    report = compile_only.compile_programs(
        run_programs(config, scfg, tcfg, vocab, mesh, rules, cached), target)
  report["disk"] = disk.need(config, scfg)
  report["disk_lines"] = [disk.describe(report["disk"])]
  return report


def _train(config, workdir, overwrite, mesh, rules, shared_rollouts=None):
  # Everything that can be checked without weights is checked first.
  scfg, tcfg, cached = model_configs(config)
  sft = config.loss.kind == losses.CE
  tokenizer = _tokenizer(config, workdir)
  vocab = train_setup.shared_vocab(config, scfg, tcfg, tokenizer)
  config_lib.check_fits(config, {"student": scfg} if sft or cached else
                        {"student": scfg, "teacher": tcfg}, vocab)
  disk.check_run(config, scfg, workdir)
  train_batches.decode_ahead(config)  # refused here, before any weight
  # On a TPU: the run's programs compiled before any weight is loaded.
  compile_only.check_on_devices(
      run_programs(config, scfg, tcfg, vocab, mesh, rules, cached),
      list(mesh.devices.flat), functools.partial(programs.advice, config))
  if cached:
    batches = teacher_cache.TeacherCache(config.loss.teacher_cache)
    batches.check(config, tokenizer, vocab)
  else:
    batches = train_batches.make_batches(config, tokenizer, vocab)
  report_dropped(batches)
  make_sequences = train_batches.SequenceMaker(config, scfg, tcfg, mesh, rules,
                                               tokenizer, vocab_size=vocab)
  if shared_rollouts and not cached:  # opened (and checked) before any write
    make_sequences.shared = shared_lib.Store(
        shared_rollouts, shared_lib.describe(
            config, tokenizer, vocab=vocab, eos=make_sequences.eos,
            pad=make_sequences.pad, mesh_shape=dict(mesh.shape)),
        expect=shared_lib.expected(config))
  revisions = train_setup.revisions(
      config, ("student", "tokenizer") if sft or cached else
      ("student", "teacher", "tokenizer"))
  if not (sft or cached):
    train_setup.check_weights(config.teacher, "teacher")
  train_setup.check_weights(config.student, "student")
  if jax.process_index() == 0:
    prepare_workdir(config, workdir, overwrite, revisions)
  ckpt_lib.check_writable_dir(os.path.join(workdir, "checkpoints"))

  seed_key = jax.random.key(config.seed)
  s_key, t_key = train_setup.init_keys(config.seed)
  tparams = None if sft or cached else train_setup.load_params(
      tcfg, config.teacher, mesh, rules, t_key, "teacher")
  params0 = train_setup.load_params(scfg, config.student, mesh, rules, s_key)
  lcfg = train_setup.lora_config(config.student)
  base = scale = None
  if lcfg is not None:  # train fresh adapters on the frozen student
    base, scale = train_setup.frozen_base(scfg, lcfg, params0, mesh,
                                          rules), lcfg.scale
    params0 = train_setup.init_adapters(scfg, lcfg, mesh, rules,
                                        jax.random.fold_in(s_key, LORA_KEY))

  optimizer, schedule = step_lib.make_optimizer(
      config.optim, config.total_steps, trained_dtype(config, scfg))
  ckpt, state, state_shard, restored, start = init_or_restore(
      config, workdir, scfg, optimizer, params0, mesh, rules, base=base,
      lcfg=lcfg)
  seen = seen_lib.SeenTokens.resume(scfg.vocab_size, mesh, restored, start)
  if lcfg is not None or not config.get("track_sparsity", True):
    del params0  # LoRA: the update of the base is low-rank; not tracked
    params0 = None

  loss_fn = step_lib.make_loss_fn(config, scfg, tcfg, vocab,
                                  shard=sharding.Activations(mesh, rules))
  update = step_lib.jit_update(functools.partial(
      step_lib.train_step, optimizer=optimizer, schedule=schedule,
      loss_fn=loss_fn, grad_accum=int(config.optim.grad_accum),
      lora_scale=scale), state_shard)
  make_sequences = train_batches.SequenceMaker(config, scfg, tcfg, mesh, rules,
                                               tokenizer, vocab_size=vocab)
  if cached:
    make_sequences = teacher_cache.CachedSequences(make_sequences.put)
  else:  # rollout.decode_ahead: the chunk's other steps
    make_sequences.ahead_from(batches, seed_key, config.total_steps)
  if shared_rollouts and not cached:
    make_sequences.shared = shared_lib.Store(
        shared_rollouts, shared_lib.describe(
            config, tokenizer, vocab=vocab, eos=make_sequences.eos,
            pad=make_sequences.pad, mesh_shape=dict(mesh.shape)))

  def step_fn(step, state):
    rng = jax.random.fold_in(seed_key, step)
    kw = {} if cached else {"step": step}
    batch, ro_metrics = make_sequences(
        batches[step], step_lib.policy_params(state, scale), tparams, rng,
        **kw)
    if seen is not None:
      seen.add(batch)
    batch["weights"] = losses.reduction_weights(batch["loss_mask"],
                                                config.loss.reduction)
    state, metrics = update(state, tparams, batch)
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    metrics.update(ro_metrics)
    return state, metrics

  out = run_steps(config, workdir, step_fn=step_fn, state=state, start=start,
                  ckpt=ckpt, scfg=scfg, params0=params0, tokenizer=tokenizer,
                  meta=lora_meta(config, lcfg, revisions), lcfg=lcfg,
                  seen=seen)
  shared = getattr(make_sequences, "shared", None)
  if shared is not None:
    logging.info("shared rollouts %s: %d step(s) decoded, %d read",
                 shared.directory, shared.generated, shared.read)
  return out


def _tokenizer(config, workdir):
  """tok_lib.run_tokenizer; a runlocal config (tokenizer_build) of a text task
  with no tokenizer to load builds its tiny one first (the synthetic task's
  is built with the export)."""
  if (config.get("tokenizer_build") and config.data.task != "synthetic"
      and not config.get("tokenizer") and not hub.weights_spec(config.student)):
    return tok_lib.runlocal_tokenizer(config, workdir)
  return tok_lib.run_tokenizer(config)


# Kept here for callers that name them as loop.Preempted / loop.StopOnSignal.
Preempted = preempt.Preempted
StopOnSignal = preempt.StopOnSignal


class locked_workdir:  # pylint: disable=invalid-name
  """Holds <workdir>/.lock (process 0) for the duration of a run."""

  def __init__(self, workdir: str):
    self._lock = None
    if jax.process_index() == 0:
      ckpt_lib.check_writable_dir(workdir)
      self._lock = ckpt_lib.WorkdirLock(workdir)

  def __enter__(self):
    if self._lock is not None:
      self._lock.acquire()
    return self

  def __exit__(self, *exc):
    if self._lock is not None:
      self._lock.release()


def report_dropped(batches) -> None:
  """Says, visibly, how many training examples the length limits dropped."""
  n = getattr(batches, "num_dropped", 0)
  if n:
    total = len(getattr(batches, "records", ())) or "?"
    by = getattr(batches, "dropped_by", None)  # prompt batches: per limit
    msg = (f"data: dropped {n} of {total} training examples: " + (
        ", ".join(f"{v} longer than data.{k}" for k, v in by.items() if v)
        if by else "longer than rollout.max_new_tokens (dataset responses) "
        "or data.max_prompt_len"))
    logging.warning(msg)
    if jax.process_index() == 0:
      print(msg, file=sys.stderr, flush=True)


@jax.jit
def _norm_f32(params):
  return optax.global_norm(jax.tree.map(lambda x: x.astype(jnp.float32), params))


def param_norm(params) -> float:
  """The float32 global norm of sharded params, in one compiled program (not
  one eager op per leaf: on CPU meshes eager ops on leaves of several
  meshes in one process met an IndivisibleError in JAX's output-sharding
  conversion, once, in tests/train/loop_test.py)."""
  return float(jax.device_get(_norm_f32(params)))


# A kept checkpoint looks sane when its weights are finite and their norm is
# within this factor of the initial weights' norm.
SANE_NORM_FACTOR = 10.0


def nan_stop_message(step, loss, ckpt, state, init_norm) -> str:
  """The NaN stop's message: the kept checkpoints with their parameter norms
  and the last one whose weights look sane."""
  ckpt.wait()
  abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      step_lib.saved(state))
  norms = ckpt.param_norms(abstract)
  if init_norm is None and norms and norms[0][1] is not None:
    init_norm = norms[0][1]  # resumed: the oldest kept one is the yardstick
  sane = [s for s, n in norms if n is not None and math.isfinite(n) and
          (init_norm is None or n <= SANE_NORM_FACTOR * max(init_norm, 1e-6))]
  kept = ", ".join(f"{s} (param norm {n:.4g})" if n is not None else
                   f"{s} (unreadable)" for s, n in norms) or "none"
  if sane:
    verdict = f"resume from step {sane[-1]}, the last whose weights look sane"
  else:
    verdict = "no kept checkpoint has sane weights: start again"
  ref = f"; initial norm {init_norm:.4g}" if init_norm else ""
  return (f"step {step}: loss is {loss}; stopping. Kept checkpoints in "
          f"{ckpt.directory}: {kept}{ref}; {verdict}.")


def main(argv, train_fn=None, compile_fn=None, advice_fn=None):
  """The CLI of `train_fn` (default: train): jaxdistill.train, rl.train.
  With --compile_only: `compile_fn(config, slice)` (default compile_for)
  and `advice_fn(config, row)` (default programs.advice) instead of a run."""
  del argv
  f = flags.FLAGS
  if f.compile_only:
    report = (compile_fn or compile_for)(f.config, f.compile_only)
    compile_only.emit(report, f.json)
    compile_only.check(report, advice=functools.partial(
        advice_fn or programs.advice, f.config))
    return
  initialize_distributed(f)
  kw = {}
  if "shared_rollouts" in f and f.shared_rollouts:
    kw["shared_rollouts"] = f.shared_rollouts  # python -m jaxdistill.train
  try:
    (train_fn or train)(f.config, f.workdir, overwrite=f.overwrite, **kw)
  except Preempted as e:
    print(e, file=sys.stderr, flush=True)
    sys.exit(e.exit_code)


def initialize_distributed(f) -> None:
  """--distributed (train/distributed.py: initialize_from_flags)."""
  distributed.initialize_from_flags(f)


def define_flags():
  """The flags of `python -m jaxdistill.train` (and of jaxdistill.rl.train)."""
  config_flags.DEFINE_config_file(
      "config", None, "Experiment config file (configs/*.py[:arg]).",
      lock_config=True)
  flags.DEFINE_string("workdir", None, "Run directory (resumes if it exists).")
  flags.DEFINE_bool("overwrite", False,
                    "Move an existing run of a different config aside.")
  distributed.define_flags()
  compile_only.define_flags()
  flags.mark_flags_as_required(["config", "workdir"])


def define_train_flags():
  """define_flags, and those of `python -m jaxdistill.train` alone."""
  define_flags()
  flags.DEFINE_string(
      "shared_rollouts", None, "Directory of teacher-policy rollouts shared "
      "with other runs of the same key (train/shared_rollouts.py): read "
      "where there, else decoded and written there.")
