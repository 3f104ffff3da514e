r"""Distillation training loop.

  python -m jaxdistill.train --config configs/distill.py:runlocal --workdir /tmp/jd
  python -m jaxdistill.train --config configs/distill.py:kl=reverse,lr=5e-5 \
      --config.student.path=/ckpt/Qwen2.5-0.5B-Instruct \
      --config.teacher.path=/ckpt/Qwen2.5-7B-Instruct --workdir /runs/qwen_rkl

Reads top to bottom: config -> mesh -> models (sharded) -> data ->
jax.eval_shape(init) -> shardings -> jit(init) or restore -> jit(update) ->
loop (rollout, update, log, checkpoint) -> export as a Hugging Face directory.
Re-running with the same --workdir resumes from the newest good checkpoint.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import shutil
import time

import jax
import jax.numpy as jnp

from jaxdistill import checkpoint as ckpt_lib
from jaxdistill import config_lib
from jaxdistill import models
from jaxdistill import sharding
from jaxdistill import step as step_lib
from jaxdistill import train_data
from jaxdistill import train_log

# Fields that may change when a run is resumed (they do not change its result).
RESUMABLE_FIELDS = ("total_steps", "log_every", "eval_every", "ckpt_every",
                    "keep_ckpts", "progress", "export_hf")


def _dtype(name):
  return jnp.dtype(name)


def model_config(mcfg, name: str) -> models.ModelConfig:
  """The ModelConfig of config.student / config.teacher, without any weights."""
  overrides = dict(mcfg.get("overrides") or {})
  if mcfg.get("path"):
    path = os.path.expanduser(mcfg.path)
    if not os.path.isdir(path):
      raise ValueError(
          f"config.{name}.path: checkpoint directory {path!r} does not exist")
    cfg = models.checkpoint.read_config(path)
  elif mcfg.get("preset") or mcfg.get("init"):
    cfg = (models.get_preset(mcfg.preset) if mcfg.get("preset")
           else models.ModelConfig())
    cfg = dataclasses.replace(cfg, **dict(mcfg.get("init") or {}))
  else:
    raise ValueError(f"config.{name}.path: set it to a Hugging Face checkpoint "
                     f"directory (or set config.{name}.preset/.init for a "
                     "randomly initialised model)")
  return dataclasses.replace(cfg, dtype=mcfg.dtype, param_dtype=mcfg.param_dtype,
                             **overrides)


def load_params(cfg, mcfg, mesh, rules, rng):
  """Params placed on the mesh: streamed from the checkpoint, or random init."""
  if mcfg.get("path"):
    loaded_cfg, params = models.load_pretrained(
        os.path.expanduser(mcfg.path), dtype=cfg.param_dtype, mesh=mesh,
        rules=rules)
    del loaded_cfg
    return params
  shapes = jax.eval_shape(functools.partial(models.init, cfg), rng)
  shard = sharding.tree_shardings(models.logical_axes(cfg), mesh, rules, shapes)
  return jax.jit(functools.partial(models.init, cfg), out_shardings=shard)(rng)


def shared_vocab(config, scfg, tcfg, tokenizer) -> int:
  """The real vocabulary both models' logits are compared over."""
  explicit = config.loss.get("vocab_size")
  if explicit:
    v = int(explicit)
  elif tokenizer is not None:
    v = len(tokenizer)
  elif scfg.vocab_size == tcfg.vocab_size:
    v = scfg.vocab_size
  else:
    raise ValueError(
        f"config.loss.vocab_size: student vocab {scfg.vocab_size} and teacher "
        f"vocab {tcfg.vocab_size} differ and no tokenizer gives the real "
        "vocabulary; set loss.vocab_size to the shared real vocabulary size")
  if v > min(scfg.vocab_size, tcfg.vocab_size):
    raise ValueError(
        f"config.loss.vocab_size: the real vocabulary ({v}) is larger than "
        f"the student ({scfg.vocab_size}) or teacher ({tcfg.vocab_size}) "
        "vocabulary: the models do not share a tokenizer")
  return v


def prepare_workdir(config, workdir: str, overwrite: bool):
  """Writes config.json; refuses to reuse a workdir of a different config."""
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, "config.json")
  new = json.loads(config_lib.to_json(config))
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    changed = [d for d in config_lib.diff(old, new)
               if d.split(":")[0] not in RESUMABLE_FIELDS]
    if changed and not overwrite:
      raise ValueError(
          f"--workdir {workdir} holds a run of a different config:\n  " +
          "\n  ".join(changed[:20]) +
          "\nUse another --workdir, or pass --overwrite to move the old run "
          "aside (into <workdir>/replaced-<time>/) and start fresh.")
    if changed and overwrite:
      aside = os.path.join(workdir, time.strftime("replaced-%Y%m%d-%H%M%S"))
      os.makedirs(aside)
      for entry in os.listdir(workdir):
        if not entry.startswith("replaced-"):
          shutil.move(os.path.join(workdir, entry), aside)
      logging.warning("moved the previous run of %s into %s", workdir, aside)
  with open(path, "w") as f:
    f.write(config_lib.to_json(config))


def opt_shardings(optimizer, abstract_opt, param_shardings, mesh):
  """Shardings of an optax state: each param-shaped leaf like its param, the
  rest (counts, scalars) replicated."""
  import optax  # pylint: disable=g-import-not-at-top
  return optax.tree_map_params(
      optimizer, lambda _, s: s, abstract_opt, param_shardings,
      transform_non_params=lambda _: sharding.replicated(mesh))


def init_or_restore(optimizer, params0, param_shardings, mesh, ckpt, workdir):
  """The train state {params, opt_state, step}, sharded: restored from the
  latest checkpoint in `ckpt` if there is one, else built from `params0`.

  Returns (state, state_shardings, meta, start): `meta` is the checkpoint's
  metadata ({} when starting fresh) and `start` the step to run next.
  """
  make_state = lambda p: {"params": p, "opt_state": optimizer.init(p),
                          "step": jnp.zeros((), jnp.int32)}
  state_shard = {"params": param_shardings,
                 "opt_state": opt_shardings(
                     optimizer, jax.eval_shape(optimizer.init, params0),
                     param_shardings, mesh),
                 "step": sharding.replicated(mesh)}
  abstract = jax.tree.map(
      lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
      jax.eval_shape(make_state, params0), state_shard)
  restored = ckpt.restore_latest(abstract)
  if restored is None:
    state = jax.jit(make_state, out_shardings=state_shard)(params0)
    return state, state_shard, {}, 0
  state, meta, start = restored
  logging.warning("resuming %s from step %d", workdir, start)
  if int(meta.get("step", start)) != start:
    raise ValueError(f"checkpoint {start}: meta step {meta.get('step')}")
  return state, state_shard, meta, start


def export_hf(scfg, params, tokenizer, workdir: str) -> str | None:
  """Saves the trained student as a Hugging Face directory <workdir>/hf_student
  (with its tokenizer). Sharded params are gathered on every host; host 0
  writes. Returns the directory on host 0, else None."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    params = multihost_utils.process_allgather(params, tiled=True)
  else:
    params = jax.device_get(params)
  if jax.process_index() != 0:
    return None
  out = os.path.join(workdir, "hf_student")
  models.save_pretrained(scfg, params, out)
  train_data.save_tokenizer(tokenizer, out)
  return out


def train(config, workdir: str, *, overwrite: bool = False,
          devices=None) -> dict:
  """Runs (or resumes) one distillation run; returns the last metrics.

  `devices` restricts the mesh to these devices (default: all).
  """
  config_lib.validate(config)
  try:
    mesh = sharding.make_mesh(dict(config.mesh), devices=devices)
  except ValueError as e:
    raise ValueError(f"config.mesh: {e}") from None
  rules = tuple((k, tuple(v) if isinstance(v, list) else v)
                for k, v in config.get("rules", sharding.DEFAULT_RULES))
  # Everything that can be checked without weights is checked first.
  scfg = model_config(config.student, "student")
  # Supervised fine-tuning ('ce') needs no teacher.
  sft = config.loss.kind == "ce"
  tcfg = scfg if sft else model_config(config.teacher, "teacher")
  tokenizer = train_data.load_tokenizer(config)
  vocab = shared_vocab(config, scfg, tcfg, tokenizer)
  batches = train_data.make_batches(config, tokenizer, vocab)
  if jax.process_index() == 0:
    prepare_workdir(config, workdir, overwrite)

  seed_key = jax.random.key(config.seed)
  s_key, t_key = jax.random.split(jax.random.fold_in(seed_key, 1 << 20))
  tparams = None if sft else load_params(tcfg, config.teacher, mesh, rules,
                                          t_key)
  params0 = load_params(scfg, config.student, mesh, rules, s_key)

  # Shardings, from shapes alone.
  optimizer, schedule = step_lib.make_optimizer(config.optim, config.total_steps)
  p_shard = sharding.tree_shardings(models.logical_axes(scfg), mesh, rules,
                                    params0)
  ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"),
                               keep=config.keep_ckpts)
  state, state_shard, _, start = init_or_restore(optimizer, params0, p_shard,
                                                 mesh, ckpt, workdir)
  track_sparsity = bool(config.get("track_sparsity", True))
  if not track_sparsity:
    del params0
    params0 = None
  else:  # compared in the dtype the base student is stored in
    sparsity_dtype = train_data.base_dtype(config.student, scfg)

  loss_fn = step_lib.make_loss_fn(config, scfg, tcfg, vocab)
  update = jax.jit(
      functools.partial(step_lib.train_step, optimizer=optimizer,
                        schedule=schedule, loss_fn=loss_fn,
                        grad_accum=int(config.optim.grad_accum)),
      in_shardings=(state_shard, None, None),
      out_shardings=(state_shard, None),
      donate_argnums=0)
  make_sequences = train_data.SequenceMaker(config, scfg, tcfg, mesh, rules,
                                            tokenizer, vocab_size=vocab)

  log = train_log.Logger(workdir, total=config.total_steps, start=start,
                         progress=config.get("progress", True),
                         log_every=config.log_every)
  last = {}
  try:
    for step in range(start, config.total_steps):
      rng = jax.random.fold_in(seed_key, step)
      t0 = time.perf_counter()
      batch, ro_metrics = make_sequences(
          batches[step], state["params"], tparams, rng)
      batch["weights"] = step_lib.loss_weights(batch["loss_mask"],
                                               config.loss.reduction)
      state, metrics = update(state, tparams, batch)
      metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
      metrics.update(ro_metrics)
      if not math.isfinite(metrics["train/loss"]):
        raise FloatingPointError(
            f"step {step + 1}: loss is {metrics['train/loss']}; stopping. "
            f"The last good checkpoint (step {ckpt.steps()[-1] if ckpt.steps() else 'none'}) "
            "is kept in the workdir.")
      dt = time.perf_counter() - t0
      metrics["perf/step_time_s"] = dt
      metrics["perf/tokens_per_s"] = metrics["rollout/tokens"] / dt
      done = step + 1
      if params0 is not None and (done % config.eval_every == 0 or
                                  done == config.total_steps):
        metrics.update(train_data.sparsity_metrics(params0, state["params"],
                                                   scfg, sparsity_dtype))
      log.write(done, metrics)
      last = metrics
      if done % config.ckpt_every == 0 or done == config.total_steps:
        ckpt.save(done, state, {"step": done, "data_position": done,
                                "seed": int(config.seed)})
    ckpt.wait()
  finally:
    ckpt.close()
    log.close()
  if config.get("export_hf", True):
    export_hf(scfg, state["params"], tokenizer, workdir)
  return last


def main(argv):
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top
  f = flags.FLAGS
  if f.distributed:
    jax.distributed.initialize()
  train(f.config, f.workdir, overwrite=f.overwrite)


def define_flags():
  """The flags of `python -m jaxdistill.train` (and of jaxdistill.rl.train)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file(
      "config", None, "Experiment config file (configs/*.py[:arg]).",
      lock_config=True)
  flags.DEFINE_string("workdir", None, "Run directory (resumes if it exists).")
  flags.DEFINE_bool("overwrite", False,
                    "Move an existing run of a different config aside.")
  flags.DEFINE_bool("distributed", False,
                    "Call jax.distributed.initialize() (multi-host TPU/GPU).")
  flags.mark_flags_as_required(["config", "workdir"])


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top
  define_flags()
  app.run(main)
