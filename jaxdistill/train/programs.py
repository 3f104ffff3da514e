"""The programs a distillation run compiles, built from its config alone.

No weights and no data: parameters, optimizer state and batches are
abstract (jax.ShapeDtypeStruct with the shardings the run gives them), so
the same function serves `--compile_only` on any host (compile_only.py:
compiled for a TPU slice's devices) and the fit check a run makes on its
own devices before it loads weights. The functions are the run's own
(rollout.generate's program, the jitted update of train/loop.py), at the
run's largest shapes: rollouts of data.batch_size prompts of
data.max_prompt_len tokens plus rollout.max_new_tokens, the update on
[batch, prompt + new tokens] sequences.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxdistill import compile_only
from jaxdistill import config_lib
from jaxdistill import losses
from jaxdistill import models
from jaxdistill import rollout as rollout_lib
from jaxdistill import sharding
from jaxdistill.models import flops
from jaxdistill.models import lora
from jaxdistill.train import batches as train_batches
from jaxdistill.train import setup as train_setup
from jaxdistill.train import step as step_lib

# Bytes per parameter an AdamW update moves: params read and written (their
# dtype), float32 gradients written and read, float32 m and v read and written.
_ADAM_F32_BYTES = 4 * 2 + 4 * 4


def abstract_params(cfg, mesh, rules):
  """The params of `cfg` as ShapeDtypeStructs placed by the run's rules."""
  shapes = models.param_shapes(cfg)
  shard = sharding.tree_shardings(models.logical_axes(cfg), mesh, rules, shapes)
  return jax.tree.map(
      lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
      shapes, shard)


def abstract_state(cfg, optimizer, mesh, rules, lcfg=None):
  """(train state, its shardings, the policy's params as rollouts take
  them) of a model of `cfg`, abstract. LoRA (`lcfg`): the state trains
  adapters on a frozen 'base', and the policy is the base with them attached."""
  base = abstract_params(cfg, mesh, rules)
  trained, frozen, policy = base, None, base
  if lcfg is not None and lcfg.base_quant is not None:  # an NF4 base
    base = with_shardings(lora.base_shapes(cfg, lcfg), sharding.tree_shardings(
        lora.base_logical_axes(cfg, lcfg), mesh, rules,
        lora.base_shapes(cfg, lcfg)))
  if lcfg is not None:
    trained = with_shardings(lora.shapes(cfg, lcfg), sharding.tree_shardings(
        lora.logical_axes(cfg, lcfg), mesh, rules, lora.shapes(cfg, lcfg)))
    frozen, policy = base, lora.attach(base, trained, None)
  state_shard = step_lib.state_shardings(cfg, optimizer, trained, mesh, rules,
                                         lcfg)
  state = with_shardings(jax.eval_shape(
      functools.partial(step_lib.new_state, optimizer), trained, frozen),
                         state_shard)
  return state, state_shard, policy


def with_shardings(shapes, shardings):
  return jax.tree.map(
      lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
      shapes, shardings)


def batch_struct(shape, dtype, mesh, rules):
  return jax.ShapeDtypeStruct(
      shape, dtype, sharding=sharding.batch_sharding(mesh, len(shape), rules))


def rollout_program(name, scfg, tcfg, student, teacher, mesh, rules, vocab,
                    *, rows, policy, prompt_len, max_new_tokens, temperature,
                    teacher_temperature=None, top_k=None, top_p=None, lam=None,
                    resident=0, teacher_prompt_len=None,
                    decode_layout="auto", steps=1):
  """compile_only.Program of rollout.generate: `rows` prompts of
  `prompt_len` tokens, `max_new_tokens` more; `student`/`teacher` abstract
  params (None when the policy does not sample from it);
  `teacher_prompt_len`: the teacher's own prompt width (data.teacher_prompt),
  None when it reads the student's; `steps` > 1: the call of a rollout
  decoded ahead (rollout.decode_ahead), one key per row, serving that many
  steps."""
  p, n = int(prompt_len), int(max_new_tokens)
  prompts = batch_struct((rows, p), jnp.int32, mesh, rules)
  own = (policy != "student" and teacher_prompt_len is not None)
  t_prompts = (batch_struct((rows, int(teacher_prompt_len)), jnp.int32, mesh,
                            rules) if own else None)
  used = {"student": (scfg,), "teacher": (tcfg,), "coin_mixture": (scfg, tcfg),
          "spectrum": (scfg, tcfg)}[policy]
  fn, args, kwargs = rollout_lib.program(
      (scfg, student) if student is not None else None,
      (tcfg, teacher) if teacher is not None else None, prompts, prompts,
      policy=policy, lam=lam, max_new_tokens=n, temperature=float(temperature),
      teacher_temperature=teacher_temperature,
      top_k=top_k, top_p=top_p, mesh=mesh, rules=rules, vocab_size=vocab,
      eos_token_ids=(0,), teacher_prompts=t_prompts,
      decode_layout=decode_layout, row_rngs=steps > 1)
  # Per decode step (and the prefill): each sampling model's weights as its
  # decode layout holds them on a chip, and the chip's rows of its KV cache.
  widths = [int(teacher_prompt_len) if own and i == len(used) - 1
            else p for i in range(len(used))]
  # The physical limit reads only the chip's share of each weight.
  n_dev = mesh.devices.size
  kv = sum(flops.kv_cache_bytes(c, rows / n_dev, w + n - 1)
           for c, w in zip(used, widths))
  weights = sum(rollout_lib.decode_weight_bytes(c, layout, mesh)
                for c, layout in zip(used, kwargs["layouts"]))
  # ... in the dtype the decode steps read them in: a layout other than
  # 'train' casts a copy to the compute dtype once per rollout (a float32
  # student is read in bfloat16), so its limit reads that copy's share.
  in_place = sum(rollout_lib.decode_weight_bytes(
      c, "train" if layout == "train" else "replicated", mesh)
                 for c, layout in zip(used, kwargs["layouts"])) / n_dev
  return compile_only.Program(
      name, fn, args, kwargs,
      model_flops=flops.rollout_flops(scfg, tcfg, policy, rows * (p + n), p + n),
      bytes_accessed=n * (weights + kv), resident_bytes=resident,
      while_trips=n - 1, limit_bytes=n * (in_place + kv),
      steps=int(steps))


def update_bytes(scfg, tcfg, *, passes: int, micro: int, n_dev: int,
                 in_place: bool = False, trained: int | None = None) -> float:
  """HBM traffic lower bound per chip of one update: each micro-batch reads
  the student's weights `passes` times and the teacher's once (whole:
  gathered under FSDP; `in_place`: only the chip's share, the physical
  limit), then AdamW reads and writes the chip's share of the state: of all
  the student's parameters, or of `trained` many (LoRA's adapters)."""
  share = 1 / n_dev if in_place else 1
  out = micro * passes * flops.weight_bytes(scfg) * share
  if tcfg is not None:
    out += micro * flops.weight_bytes(tcfg) * share
  n = flops.weight_bytes(scfg) / flops._itemsize(scfg.param_dtype)  # pylint: disable=protected-access
  if trained is not None:
    n = trained
  return out + n * _ADAM_F32_BYTES / n_dev


def trained_count(state) -> int | None:
  """The number of parameters the optimizer updates in a LoRA state, None
  for a state that trains the whole model (update_bytes' `trained`)."""
  return models.num_params(state["params"]) if "base" in state else None


def student_passes(cfg) -> int:
  """Passes over the student's weights per micro-batch: forward, backward,
  and the forward again that rematerialisation recomputes."""
  return 3 if cfg.remat != "none" else 2


def train_programs(config, scfg, tcfg, mesh, rules, vocab, *, optimizer,
                   schedule, cached: bool, track_sparsity: bool):
  """[rollout (unless the rollouts come from data or a teacher cache),
  update] of a distillation run: compile_only.Programs, laid out as
  train/loop.py lays the run out."""
  ro, d = config.rollout, config.data
  b = int(d.batch_size)
  seq = int(d.max_prompt_len) + int(ro.max_new_tokens)
  n_dev = mesh.devices.size
  no_teacher = config.loss.kind == losses.CE or cached
  lcfg = train_setup.lora_config(config.student)
  state, state_shard, student = abstract_state(scfg, optimizer, mesh, rules,
                                               lcfg)
  teacher = None if no_teacher else abstract_params(tcfg, mesh, rules)
  size = compile_only.tree_bytes_per_device
  # What stays on the chips for the whole run: the train state (with a LoRA
  # run's frozen base), the teacher and the initial weights (kept for update
  # sparsity; not with LoRA).
  run_b = (size(state) + size(teacher)
           + (size(student) if track_sparsity and lcfg is None else 0))

  out = []
  if ro.policy != "dataset" and not cached:
    # The spectrum's endpoints run the pure policy's program (batches.py).
    policy, lam, top_k, top_p = rollout_lib.sampling_policy(ro)
    s_in = student if policy != "teacher" else None
    t_in = teacher if policy != "student" else None
    ahead = train_batches.decode_ahead(config)  # steps per call
    out.append(rollout_program(
        "rollout", scfg, tcfg, s_in, t_in, mesh, rules, vocab, rows=b * ahead,
        steps=ahead,
        policy=policy, prompt_len=d.max_prompt_len,
        max_new_tokens=ro.max_new_tokens,
        temperature=config_lib.rollout_temperatures(config)[0],
        teacher_temperature=config_lib.rollout_temperatures(config)[1],
        top_k=top_k, top_p=top_p, lam=lam,
        resident=run_b - size(s_in) - size(t_in),
        teacher_prompt_len=config_lib.teacher_prompt_len(config),
        decode_layout=ro.get("decode_layout") or "auto"))

  batch = {k: batch_struct((b, seq), jnp.int32, mesh, rules)
           for k in ("tokens", "attention_mask", "loss_mask")}
  batch["weights"] = batch_struct((b, seq), jnp.float32, mesh, rules)
  pt = config_lib.teacher_prompt_len(config)
  if pt is not None and not no_teacher:  # the teacher's own sequence
    for k in step_lib.TEACHER_KEYS:
      batch[k] = batch_struct((b, pt + int(ro.max_new_tokens)), jnp.int32,
                              mesh, rules)
  if config.loss.kind == losses.SAMPLED:
    name = ("fresh_uniforms" if config.loss.estimator in losses.FRESH
            else "behaviour_logprobs" if ro.policy != "student" else None)
    if name:
      batch[name] = batch_struct((b, seq), jnp.float32, mesh, rules)
  if cached:
    k = int(config.loss.teacher_topk)
    ids, lps, tail = step_lib.CACHE_KEYS
    batch[ids] = batch_struct((b, seq, k), jnp.int32, mesh, rules)
    batch[lps] = batch_struct((b, seq, k), jnp.float32, mesh, rules)
    batch[tail] = batch_struct((b, seq), jnp.float32, mesh, rules)
  loss_fn = step_lib.make_loss_fn(config, scfg, tcfg, vocab,
                                  shard=sharding.Activations(mesh, rules))
  accum = int(config.optim.grad_accum)
  update = step_lib.jit_update(functools.partial(
      step_lib.train_step, optimizer=optimizer, schedule=schedule,
      loss_fn=loss_fn, grad_accum=accum,
      lora_scale=None if lcfg is None else lcfg.scale), state_shard)
  t_model = None if no_teacher else tcfg
  out.append(compile_only.Program(
      "update", update, (state, teacher, batch),
      model_flops=flops.train_step_flops(scfg, t_model, b * seq, seq),
      bytes_accessed=update_bytes(scfg, t_model, passes=student_passes(scfg),
                                  micro=accum, n_dev=n_dev,
                                  trained=trained_count(state)),
      # The limit: forward and backward (no recomputation), weights in place.
      limit_bytes=update_bytes(scfg, t_model, passes=2, micro=accum,
                               n_dev=n_dev, in_place=True,
                               trained=trained_count(state)),
      resident_bytes=run_b - size(state) - size(teacher)))
  return out


def advice(config, row) -> str:
  """What would help a distillation program that does not fit."""
  tips = []
  if row["name"] == "update":
    if config.student.get("remat", "none") != "full":
      tips.append("config.student.remat='full' (recompute each layer's "
                  "activations in the backward pass)")
    tips.append("a larger config.optim.grad_accum (micro-batches: the rows per "
                "chip must divide by it)")
    if config.loss.get("fused") is False:
      tips.append("config.loss.fused=True")
    else:
      tips.append("a smaller config.loss.chunk_size")
  else:
    tips.append("a smaller config.data.batch_size or rollout.max_new_tokens")
  tips.append("a slice with more chips")
  return "try " + "; ".join(tips)
