r"""GRPO with verifiable rewards (RLVR), e.g. after distillation.

  python -m jaxdistill.rl.train --config configs/grpo_countdown.py:runlocal \
      --workdir /tmp/grpo
  python -m jaxdistill.rl.train --config configs/grpo_countdown.py:n=3,g=8 \
      --config.student.path=/runs/qwen_rkl_on --workdir /runs/qwen_rkl_on_grpo

`config.student.path` is a Hugging Face directory or a distillation workdir
(its `hf_student/` export is used). The flags are those of jaxdistill.train
(--overwrite, --distributed, --config.x.y=...), and so is the run: the
model/params loading, workdir guard, checkpoints (state + iteration + RNG +
data position), resume, progress bar, JSONL/TensorBoard log, NaN stop,
SIGTERM stop and the final `hf_student/` export are train/loop.py's
(init_or_restore, run_steps); this module adds its config checks and the
step (collect + update). A loop step is one GRPO iteration: one rollout
batch (data.batch_size prompts x G samples) and ppo_epochs x num_minibatches
optimizer steps on it (state['step'] counts those).
"""
from __future__ import annotations

import functools
import logging
import os
import sys
import time

import jax
import jax.numpy as jnp
import ml_collections

from jaxdistill import cli
from jaxdistill import compile_only
from jaxdistill import config_lib
from jaxdistill import rollout
from jaxdistill import sharding
from jaxdistill.data import tokenizer as tok_lib
from jaxdistill.models import hub
from jaxdistill.rl import grpo
from jaxdistill.rl import programs as rl_programs
from jaxdistill.rl import rewards
from jaxdistill.rl import step as rl_step
from jaxdistill.train import batches as train_batches
from jaxdistill.train import checkpoint as ckpt_lib
from jaxdistill.train import disk
from jaxdistill.train import log as train_log
from jaxdistill.train import loop as train_loop
from jaxdistill.train import seen as seen_lib
from jaxdistill.train import setup as train_setup
from jaxdistill.train import step as step_lib


# When the first ZERO_VARIANCE_BATCHES iterations (or all of a shorter run)
# had equal rewards within every group, the run says so once.
ZERO_VARIANCE_BATCHES = 5


class ZeroVarianceWatch:
  """Warns once (stderr and the log) when a run's first iterations all had
  zero reward variance in every group: every advantage is then 0, so the
  rewards give GRPO no gradient at all, which reward 0 at every step would
  otherwise hide."""

  def __init__(self, total_steps: int):
    self.n = min(ZERO_VARIANCE_BATCHES, int(total_steps))
    self.rewards = []
    self.done = False

  def update(self, step: int, metrics: dict) -> None:
    if self.done or step >= self.n:
      return
    if metrics["rl/zero_var_groups"] < 1.0:
      self.done = True
      return
    self.rewards.append(metrics["rl/reward_mean"])
    if step == self.n - 1:
      self.done = True
      mean = sum(self.rewards) / len(self.rewards)
      why = ("no sample reached its target: the targets may be out of reach "
             "of this policy (check the task and data, rollout.max_new_tokens "
             "and the answer format the verifier expects)" if mean == 0 else
             "every sample was rewarded alike: the task may be too easy, or "
             "the reward does not tell samples apart")
      msg = (f"rl: the first {self.n} iterations had zero reward variance "
             f"within every group (mean reward {mean:.3g}): every advantage "
             "is 0, so the rewards give GRPO no gradient (only the KL penalty "
             f"and weight decay move the policy); {why}")
      logging.warning(msg)
      if jax.process_index() == 0:
        print(msg, file=sys.stderr, flush=True)


def resolve_init(spec: str, field: str = "config.student.path") -> str:
  """A distillation workdir -> its hf_student/ export; a checkpoint directory
  or hub name as given (a hub name is resolved when loaded)."""
  if hub.is_hub_id(spec):
    return spec
  return hub.checkpoint_dir(spec, field, workdir_ok=True, need_config=False)


def _err(field, msg):
  raise ValueError(f"config.{field}: {msg}")


def validate(config) -> None:
  """Checks a GRPO config before any compute; raises naming the field."""
  config_lib.check_trained_dtypes(config)
  ro, g, opt = config.rollout, config.grpo, config.optim
  if ro.get("policy", "student") != "student":
    _err("rollout.policy", f"GRPO samples the policy itself: must be "
         f"'student', got {ro.policy!r}")
  if int(ro.group_size) < 2:
    _err("rollout.group_size", f"must be >= 2 (advantages compare the samples "
         f"of a prompt), got {ro.group_size}")
  if not float(ro.temperature) > 0:
    _err("rollout.temperature", f"must be > 0 (the importance ratio needs a "
         f"sampling distribution), got {ro.temperature}")
  if ro.get("top_k") is not None:
    _err("rollout.top_k", "top-k sampling is not supported (top_p is: the "
         "ratio is taken on the untruncated tempered distribution, grpo.py)")
  top_p = ro.get("top_p")
  if top_p is not None and not 0 < float(top_p) <= 1:
    _err("rollout.top_p", f"must be in (0, 1] or None, got {top_p}")
  if int(ro.max_new_tokens) < 1:
    _err("rollout.max_new_tokens", f"must be >= 1, got {ro.max_new_tokens}")
  config_lib.check_decode_layout(ro.get("decode_layout"),
                                 "rollout.decode_layout")
  if config.data.task not in ("countdown", "mcq", "records"):
    _err("data.task", "GRPO needs a verifiable task ('countdown', 'mcq', or "
         "'records' of those and arithmetic: every record is checked), "
         f"got {config.data.task!r}")
  if not 0 <= float(g.clip_low) < 1:
    _err("grpo.clip_low", f"must be in [0, 1), got {g.clip_low}")
  if not float(g.clip_high) >= 0:
    _err("grpo.clip_high", f"must be >= 0, got {g.clip_high}")
  grpo.check_loss(g.get("loss", "grpo"), g.reduction, float(config.kl.coef))
  if g.get("format_reward") not in rewards.FORMAT_REWARDS:
    _err("grpo.format_reward", f"unknown {g.format_reward!r}; choose from "
         f"{rewards.FORMAT_REWARDS}")
  if not float(g.adv_eps) > 0:
    _err("grpo.adv_eps", f"must be > 0, got {g.adv_eps}")
  if not float(g.get("reward_scale", 1.0)) > 0:
    _err("grpo.reward_scale", f"must be > 0, got {g.reward_scale}")
  rows = int(config.data.batch_size) * int(ro.group_size)
  gen = ro.get("generation_batch")
  if gen is not None and (isinstance(gen, bool) or int(gen) < 1
                          or rows % int(gen)):
    _err("rollout.generation_batch", f"must divide the {rows} rollout rows "
         f"(data.batch_size x rollout.group_size) or be None, got {gen!r}")
  if int(g.ppo_epochs) < 1:
    _err("grpo.ppo_epochs", f"must be >= 1, got {g.ppo_epochs}")
  nmb = int(g.num_minibatches)
  if nmb < 1 or rows % nmb:
    _err("grpo.num_minibatches", f"must divide the {rows} rollout rows "
         "(data.batch_size x rollout.group_size)")
  if int(opt.grad_accum) < 1 or (rows // nmb) % int(opt.grad_accum):
    _err("optim.grad_accum",
         f"must divide the mini-batch of {rows // nmb} rows")
  grpo.check_kl(config.kl.estimator, config.kl.direction, float(config.kl.coef))
  if not float(opt.lr) > 0:
    _err("optim.lr", f"must be > 0, got {opt.lr}")
  if opt.schedule not in config_lib.SCHEDULES:
    _err("optim.schedule", f"unknown {opt.schedule!r}")
  if opt.clip_norm is not None and not float(opt.clip_norm) > 0:
    _err("optim.clip_norm", f"must be > 0 or None, got {opt.clip_norm}")
  if int(config.total_steps) < 1:
    _err("total_steps", f"must be >= 1, got {config.total_steps}")


def resolve_paths(config):
  """A copy of `config` whose model paths point at loadable HF directories."""
  config = config.copy_and_resolve_references()
  if hub.weights_spec(config.student):
    config.student.path = resolve_init(config.student.path)
  if config.kl.get("reference"):
    config.kl.reference = resolve_init(config.kl.reference,
                                       "config.kl.reference")
  return config


def train(config, workdir: str, *, overwrite: bool = False, devices=None,
          reward_fn: rl_step.RewardFn | None = None) -> dict:
  """Runs (or resumes) one GRPO run; returns the last metrics.

  `reward_fn` defaults to the task verifiers (rl.step.task_reward_fn).
  """
  workdir = train_loop.check_paths(config, workdir)  # before resolving them
  config = resolve_paths(config)
  validate(config)
  config_lib.validate_run(config)
  train_log.check_wandb(config)
  mesh = train_loop.config_mesh(config, devices)
  # No mesh check of data.batch_size here: GRPO trains on rows of
  # data.batch_size x group_size prompts-samples, not on the prompt batch, and
  # runs with prompt batches the data axes do not divide (2 prompts on 8
  # devices in tests/rl/train_test.py).
  rules = sharding.rules_from_config(config)
  with train_loop.locked_workdir(workdir):
    return _train(config, workdir, overwrite, mesh, rules, reward_fn)


def _models(config):
  """(policy cfg, kl.reference's model config block and cfg or None, whether
  a reference is used) of a GRPO config."""
  scfg = train_setup.model_config(config.student, "student")
  train_setup.lora_config(config.student, cfg=scfg)  # a bad block fails here
  # The frozen KL reference: the initial policy, unless kl.reference names one.
  use_ref = float(config.kl.coef) > 0 or config.kl.get("monitor", True)
  rmcfg = rcfg = None
  if use_ref and config.kl.get("reference"):
    rmcfg = ml_collections.ConfigDict(dict(
        path=config.kl.reference, dtype=scfg.dtype,
        param_dtype=scfg.param_dtype))
    rcfg = train_setup.model_config(rmcfg, "kl.reference")
  return scfg, rmcfg, rcfg, use_ref


def _programs(config, scfg, rcfg, use_ref, vocab, mesh, rules):
  per_batch = int(config.grpo.ppo_epochs) * int(config.grpo.num_minibatches)
  optimizer, schedule = step_lib.make_optimizer(
      config.optim, config.total_steps * per_batch,
      train_loop.trained_dtype(config, scfg))
  return rl_programs.grpo_programs(
      config, scfg, rcfg, mesh, rules, vocab, optimizer=optimizer,
      schedule=schedule, use_ref=use_ref,
      track_sparsity=bool(config.get("track_sparsity", True)))


def programs_for(config, devices):
  """The GRPO run's programs (rl/programs.py) on a mesh over `devices`,
  from its config alone (no weights)."""
  config = resolve_paths(config)
  validate(config)
  config_lib.validate_run(config)
  mesh = train_loop.config_mesh(config, devices)
  rules = sharding.rules_from_config(config)
  scfg, _, rcfg, use_ref = _models(config)
  vocab = train_setup.compile_vocab(config, scfg, rcfg or scfg)
  return _programs(config, scfg, rcfg, use_ref, vocab, mesh, rules)


def compile_for(config, slice_name: str) -> dict:
  """--compile_only: the GRPO run's programs compiled for a TPU slice on this
  host (no weights, data or TPU) -> compile_only's report."""
  target = compile_only.target(slice_name)
  with sharding.compiling_for(target.chip.platform):
    report = compile_only.compile_programs(
        programs_for(config, target.devices), target)
  report["disk"] = disk.need(config, _models(resolve_paths(config))[0])
  report["disk_lines"] = [disk.describe(report["disk"])]
  return report


def _train(config, workdir, overwrite, mesh, rules, reward_fn):
  scfg, rmcfg, rcfg, use_ref = _models(config)
  if hub.weights_spec(config.student) is None:
    logging.warning(
        "config.student has no path: a randomly initialised policy (runlocal). "
        "Its rewards and loss will be 0 at nearly every step: this run checks "
        "the plumbing (sampling, rewards, updates, checkpoints, export), not "
        "learning.")
  config_lib.check_fits(config, {"policy": scfg} if rcfg is None else
                        {"policy": scfg, "kl.reference": rcfg})
  disk.check_run(config, scfg, workdir)
  build_tok = config.get("tokenizer_build") and not config.get("tokenizer")
  tokenizer = None if build_tok else tok_lib.run_tokenizer(config)
  revisions = train_setup.revisions(
      config, ("student", "tokenizer") + (("kl.reference",) if rmcfg else ()))
  train_setup.check_weights(config.student, "student")
  if rmcfg is not None:
    train_setup.check_weights(rmcfg, "kl.reference")
  if jax.process_index() == 0:
    train_loop.prepare_workdir(config, workdir, overwrite, revisions)
  if build_tok:
    tokenizer = tok_lib.runlocal_tokenizer(config, workdir)
  # Sampled, scored and compared with the reference over this vocabulary.
  vocab = (train_setup.shared_vocab(config, scfg, scfg, tokenizer)
           if rcfg is None else
           train_setup.shared_vocab(config, scfg, rcfg, tokenizer, "kl.reference"))
  compile_only.check_on_devices(
      _programs(config, scfg, rcfg, use_ref, vocab, mesh, rules),
      list(mesh.devices.flat), functools.partial(rl_programs.advice, config))
  batches = train_batches.make_batches(config, tokenizer, vocab)
  train_loop.report_dropped(batches)
  ckpt_lib.check_writable_dir(os.path.join(workdir, "checkpoints"))
  eos = rollout.eos_ids(scfg, tokenizer=tokenizer,
                        override=config.rollout.get("eos_token_ids"))

  seed_key = jax.random.key(config.seed)
  params0 = train_setup.load_params(scfg, config.student, mesh, rules,
                                    jax.random.fold_in(seed_key, 1 << 20))
  lcfg = train_setup.lora_config(config.student)
  base = scale = None
  if lcfg is not None:  # fresh adapters on the frozen policy (App. D.6)
    base, scale = train_setup.frozen_base(scfg, lcfg, params0, mesh,
                                          rules), lcfg.scale
    params0 = train_setup.init_adapters(
        scfg, lcfg, mesh, rules,
        jax.random.fold_in(seed_key, train_loop.LORA_KEY))
  per_batch = int(config.grpo.ppo_epochs) * int(config.grpo.num_minibatches)
  optimizer, schedule = step_lib.make_optimizer(
      config.optim, config.total_steps * per_batch,
      train_loop.trained_dtype(config, scfg))
  ckpt, state, state_shard, meta, start = train_loop.init_or_restore(
      config, workdir, scfg, optimizer, params0, mesh, rules, base=base,
      lcfg=lcfg)
  if meta:
    seed_key = jax.random.wrap_key_data(
        jnp.asarray(meta["rng"], jnp.uint32),
        impl=jax.random.key_impl(seed_key))
  seen = seen_lib.SeenTokens.resume(scfg.vocab_size, mesh, meta, start)

  reference = None
  if rmcfg is not None:
    reference = (rcfg, train_setup.load_params(rcfg, rmcfg, mesh, rules, None,
                                                "kl.reference"))
  elif use_ref:  # the initial policy: under LoRA the base itself (B = 0)
    reference = (scfg, params0 if base is None else base)
  ref_is_base = rmcfg is None and use_ref and base is not None
  if lcfg is not None or not config.get("track_sparsity", True):
    params0 = None  # LoRA: the update of the base is low-rank; not tracked

  update = step_lib.jit_update(
      rl_step.make_update(config, scfg, optimizer, schedule, mesh=mesh,
                          rules=rules, vocab_size=vocab), state_shard)
  collect = rl_step.Collector(
      config, scfg, reward_fn or rl_step.task_reward_fn(
          tokenizer, config.grpo.get("format_reward")), mesh=mesh,
      rules=rules, reference=reference,
      pad_id=getattr(tokenizer, "pad_token_id", None) or 0, eos_ids=eos,
      vocab_size=vocab)

  watch = ZeroVarianceWatch(config.total_steps)

  def step_fn(step, state):
    t0 = time.perf_counter()
    r_roll, r_upd = jax.random.split(jax.random.fold_in(seed_key, step))
    batch, metrics = collect(
        batches[step], step_lib.policy_params(state, scale), r_roll,
        reference_params=state["base"] if ref_is_base else None)
    if seen is not None:
      seen.add(batch)
    watch.update(step, metrics)
    t1 = time.perf_counter()
    state, upd = update(state, batch, r_upd)
    metrics.update({k: float(v) for k, v in jax.device_get(upd).items()})
    metrics["perf/rollout_time_s"] = t1 - t0
    return state, metrics

  return train_loop.run_steps(
      config, workdir, step_fn=step_fn, state=state, start=start, ckpt=ckpt,
      scfg=scfg, params0=params0, tokenizer=tokenizer, name="grpo", seen=seen,
      meta={"rng": [int(x) for x in jax.random.key_data(seed_key).ravel()],
            **train_loop.lora_meta(config, lcfg, revisions)}, lcfg=lcfg)


def main(argv):
  train_loop.main(argv, train_fn=train, compile_fn=compile_for,
                  advice_fn=rl_programs.advice)


if __name__ == "__main__":
  cli.run_absl(main, train_loop.define_flags)
