"""The programs a GRPO run compiles, from its config alone (no weights):
for `python -m jaxdistill.rl.train --compile_only=SLICE` and the fit check
before a TPU run loads weights (train/programs.py does the same for
distillation; compile_only.py compiles and reports).

  rollout    data.batch_size x rollout.group_size samples of the policy
             (rollout.generation_batch of them per call: the program);
  reference  the frozen reference's log-probs of those samples (with a
             kl.coef or kl.monitor);
  rescore    the policy's own untruncated log-probs of them (with
             rollout.top_p < 1: the ratio's old log-probs, grpo.py);
  update     grpo.ppo_epochs x grpo.num_minibatches optimizer steps.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxdistill import compile_only
from jaxdistill.models import flops
from jaxdistill.rl import step as rl_step
from jaxdistill.train import programs as train_programs
from jaxdistill.train import setup as train_setup
from jaxdistill.train import step as step_lib


def _head_flops(cfg) -> float:
  """Forward FLOPs of the output head per token (in forward_flops_per_token),
  which GRPO's log-probs skip at the prompt's positions."""
  return 2.0 * cfg.hidden_size * cfg.vocab_size


def grpo_programs(config, cfg, rcfg, mesh, rules, vocab, *, optimizer,
                  schedule, use_ref: bool, track_sparsity: bool):
  """compile_only.Programs of a GRPO run. `rcfg`: the kl.reference's config,
  or None (the initial policy is the reference)."""
  ro, g = config.rollout, config.grpo
  top_p = rl_step.nucleus(ro)
  p, n = int(config.data.max_prompt_len), int(ro.max_new_tokens)
  rows = int(config.data.batch_size) * int(ro.group_size)
  seq = p + n
  size = compile_only.tree_bytes_per_device
  lcfg = train_setup.lora_config(config.student)
  state, state_shard, policy = train_programs.abstract_state(
      cfg, optimizer, mesh, rules, lcfg)
  ref = (None if rcfg is None or not use_ref
         else train_programs.abstract_params(rcfg, mesh, rules))
  # The initial policy stays on the chips as the reference (when none is
  # named) and for update sparsity; with LoRA it is the state's frozen base.
  keep0 = lcfg is None and ((use_ref and ref is None) or track_sparsity)
  run_b = size(state) + size(ref) + (size(policy) if keep0 else 0)

  # One decode call samples rollout.generation_batch rows (all by default).
  gen = int(ro.get("generation_batch") or rows)
  out = [train_programs.rollout_program(
      "rollout", cfg, None, policy, None, mesh, rules, vocab, rows=gen,
      policy="student", prompt_len=p, max_new_tokens=n,
      temperature=ro.temperature, top_p=top_p,
      resident=run_b - size(policy),
      decode_layout=ro.get("decode_layout") or "auto")]
  bs = functools.partial(train_programs.batch_struct, mesh=mesh, rules=rules)
  tokens = bs((rows, seq), jnp.int32)

  def scoring(name, m_cfg, m_params):
    fn = functools.partial(
        rl_step.reference_logprobs, cfg=m_cfg, num_response=n,
        chunks=int(config.optim.grad_accum), vocab_size=vocab)
    return compile_only.Program(
        name, jax.jit(fn), (m_params, tokens, tokens, jnp.float32(1.0)),
        # The head runs on the N response positions only.
        model_flops=(flops.forward_flops_per_token(m_cfg, seq) * rows * seq
                     - _head_flops(m_cfg) * rows * p),
        bytes_accessed=int(config.optim.grad_accum) * flops.weight_bytes(m_cfg),
        limit_bytes=(int(config.optim.grad_accum) * flops.weight_bytes(m_cfg)
                     / mesh.devices.size),
        resident_bytes=run_b - size(m_params))
  if use_ref:  # with LoRA the reference is the state's frozen base
    out.append(scoring("reference", rcfg or cfg, ref if ref is not None else (
        policy if lcfg is None else state["base"])))
  if top_p is not None:
    out.append(scoring("rescore", cfg, policy))
  batch = {"tokens": tokens, "attention_mask": tokens,
           "loss_mask": bs((rows, n), jnp.int32),
           "old_logp": bs((rows, n), jnp.float32),
           "advantages": bs((rows,), jnp.float32)}
  if use_ref:
    batch["ref_logp"] = bs((rows, n), jnp.float32)
  update = step_lib.jit_update(
      rl_step.make_update(config, cfg, optimizer, schedule, mesh=mesh,
                          rules=rules, vocab_size=vocab), state_shard)
  epochs, mbs = int(g.ppo_epochs), int(g.num_minibatches)
  steps = epochs * mbs
  out.append(compile_only.Program(
      "update", update,
      (state, batch, jax.ShapeDtypeStruct((), jax.random.key(0).dtype)),
      model_flops=(flops.train_step_flops(cfg, None, epochs * rows * seq, seq)
                   - 3 * _head_flops(cfg) * epochs * rows * p),
      bytes_accessed=steps * train_programs.update_bytes(
          cfg, None, passes=train_programs.student_passes(cfg),
          micro=int(config.optim.grad_accum), n_dev=mesh.devices.size,
          trained=train_programs.trained_count(state)),
      limit_bytes=steps * train_programs.update_bytes(
          cfg, None, passes=2, micro=int(config.optim.grad_accum),
          n_dev=mesh.devices.size, in_place=True,
          trained=train_programs.trained_count(state)),
      resident_bytes=run_b - size(state)))
  return out


def advice(config, row) -> str:
  """What would help a GRPO program that does not fit."""
  if row["name"] == "update":
    tips = ["config.student.remat='full'", "a larger grpo.num_minibatches or "
            "optim.grad_accum (fewer rows per step)"]
  else:
    tips = ["a smaller data.batch_size, rollout.group_size or "
            "rollout.max_new_tokens"]
  return "try " + "; ".join(tips + ["a slice with more chips"])
