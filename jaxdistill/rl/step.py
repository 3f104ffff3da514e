"""One GRPO iteration: sample G answers per prompt, score them, update.

  collect = Collector(config, cfg, reward_fn, mesh=mesh, reference=(rcfg, rp))
  batch, metrics = collect(host_batch, state["params"], rng)
  state, metrics = update(state, batch, rng)                         # jitted

`Collector` repeats each prompt G times (prompt-major: row i answers prompt
i // G), samples them with rollout.generate(policy='student') under row ids
0..R-1 so every sample has its own RNG stream, keeps the sampler's log-probs
(recorded at sampling time, tempered: see grpo.py; with rollout.top_p < 1
rescored on the untruncated tempered distribution), scores the responses
with `reward_fn`, turns rewards into group advantages, and adds the frozen
reference's log-probs when a reference is given.

`ppo_update` then runs `ppo_epochs` passes over the rollout batch, each
shuffled into `num_minibatches` mini-batches, one optimizer step
(jaxdistill.train.step.train_step, with its gradient accumulation) per mini-batch.
The loss weights are normalised over each mini-batch before it is split into
micro-batches, so 'token_mean' (the DAPO loss) divides by the completion
tokens of the whole optimizer step's batch, whatever optim.grad_accum is.

Shapes: B prompts, G samples each, R = B G rows, P prompt width, N new tokens.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
import functools

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
from jax.sharding import NamedSharding
import numpy as np

from jaxdistill import losses
from jaxdistill import rollout as rollout_lib
from jaxdistill import sharding
from jaxdistill import tasks
from jaxdistill.models import lora
from jaxdistill.rl import grpo
from jaxdistill.rl import rewards
from jaxdistill.train import step as step_lib

# reward_fn(rollout with host arrays, host prompt batch) -> {'reward': [R],
# optionally 'format': [R] (logged), 'format_bonus': [R] (added to the
# scaled reward)} (NumPy).
RewardFn = Callable[[rollout_lib.Rollout, Mapping[str, np.ndarray]], dict]


def task_reward_fn(tokenizer, format_reward: str | None = None) -> RewardFn:
  """Rewards from the task verifiers (tasks.score_batch) on decoded answers;
  with format_reward 'think_answer' also rl.rewards' formatting rewards."""
  if format_reward not in rewards.FORMAT_REWARDS:
    raise ValueError(f"config.grpo.format_reward: unknown {format_reward!r}; "
                     f"choose from {rewards.FORMAT_REWARDS}")

  def reward_fn(ro, host_batch):
    texts = rollout_lib.decode_responses(ro, tokenizer)
    scores = tasks.score_batch(texts, host_batch)
    if format_reward is not None:
      b = np.asarray(host_batch["task"]).shape[0]
      scores["format_bonus"] = rewards.format_bonus(
          texts, host_batch.get("num_options"), group=len(texts) // b)
    return scores
  return reward_fn


def nucleus(rollout_cfg) -> float | None:
  """rollout.top_p when it truncates (< 1), else None."""
  top_p = rollout_cfg.get("top_p")
  return None if top_p is None or float(top_p) >= 1 else float(top_p)


def concat_rollouts(parts):
  """One host rollout of the rows of `parts` (host rollouts, in order): the
  per-row fields concatenated, the batch's student_fraction their
  response-token weighted mean."""
  tokens = [float(np.sum(p.response_mask)) for p in parts]

  def one(*xs):
    if np.ndim(xs[0]):
      return np.concatenate(xs, 0)
    total = sum(tokens)
    return np.asarray(sum(float(x) * t for x, t in zip(xs, tokens))
                      / total if total else float(xs[0]), np.asarray(xs[0]).dtype)
  return jax.tree.map(one, *parts)


def to_host(x):
  """NumPy copy of a (possibly multi-host sharded) array, on every host."""
  if jax.process_count() == 1 or x.is_fully_addressable:
    return np.asarray(jax.device_get(x))
  if x.is_fully_replicated:
    return np.asarray(x.addressable_data(0))
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


@functools.partial(jax.jit, static_argnames=("cfg", "num_response", "chunks",
                                             "vocab_size"))
def reference_logprobs(params, tokens, attention_mask, temperature, *, cfg,
                        num_response, chunks, vocab_size=None):
  """[R, N] log-probs of the response tokens, in `chunks` blocks of rows:
  block j holds rows j, chunks + j, 2 chunks + j, ..., so that each device
  keeps its share of every block (rows are split over devices in order)."""
  split = lambda x: jnp.moveaxis(x.reshape((-1, chunks) + x.shape[1:]), 1, 0)

  def one(xs):
    return grpo.token_logprobs(cfg, params, xs[0], xs[1], num_response,
                               temperature=temperature,
                               vocab_size=vocab_size)[0]
  out = jax.lax.map(one, (split(tokens), split(attention_mask)))  # [A, R/A, N]
  return jnp.moveaxis(out, 0, 1).reshape(tokens.shape[0], num_response)


def _check_rules(mesh, rules):
  if mesh is not None and rules is None:
    raise ValueError("rules: pass the run's logical-axis rules with the mesh "
                     "(sharding.rules_from_config)")


def _rows(mesh, rules, shape):
  """Rows over the data axes (replicated if they do not divide the rows)."""
  return NamedSharding(mesh, sharding.logical_to_spec(
      ("batch",) + (None,) * (len(shape) - 1), shape, mesh, rules))


class Collector:
  """Host prompt batch + current params -> GRPO batch on the mesh, metrics."""

  def __init__(self, config, cfg, reward_fn: RewardFn, *, mesh=None,
               rules=None, reference=None, pad_id: int = 0,
               eos_ids=None, vocab_size=None):
    """`rules`: the run's logical-axis rules (needed with `mesh`).
    `vocab_size`: the real vocabulary (len(tokenizer)) samples are drawn
    from; pass the same to make_update. Default: the model's width."""
    _check_rules(mesh, rules)
    self.cfg, self.reward_fn = cfg, reward_fn
    self.ro, self.grpo = config.rollout, config.grpo
    self.g = int(config.rollout.group_size)
    self.mesh, self.rules = mesh, rules
    self.reference, self.pad = reference, int(pad_id)
    self.eos = None if eos_ids is None else tuple(int(e) for e in eos_ids)
    self.chunks = int(config.optim.grad_accum)
    self.vocab = None if vocab_size is None else int(vocab_size)
    self.top_p = nucleus(config.rollout)

  def _put(self, x):
    x = np.asarray(x)
    if self.mesh is None:
      return jnp.asarray(x)
    # Every host holds all rows; each places its devices' (all of them when
    # the data axes do not divide the rows and they are replicated).
    return sharding.put_global(x, _rows(self.mesh, self.rules, x.shape))

  def __call__(self, host_batch, params, rng, reference_params=None):
    """`reference_params`: the reference's params now, in place of those
    given at construction (a LoRA run's base: the update donates it)."""
    g, temp = self.g, float(self.ro.temperature)
    prompts = np.repeat(np.asarray(host_batch["prompt"]), g, axis=0)  # [R, P]
    pmask = np.repeat(np.asarray(host_batch["prompt_mask"]), g, axis=0)
    rows = prompts.shape[0]

    def sample(lo, hi):
      return rollout_lib.generate(
          (self.cfg, params), None, self._put(prompts[lo:hi]),
          self._put(pmask[lo:hi]), rng=rng, policy="student",
          max_new_tokens=int(self.ro.max_new_tokens), temperature=temp,
          top_p=self.top_p, pad_token_id=self.pad, eos_token_ids=self.eos,
          row_ids=self._put(np.arange(lo, hi, dtype=np.int32)), mesh=self.mesh,
          rules=self.rules, return_logprobs=True, vocab_size=self.vocab,
          decode_layout=self.ro.get("decode_layout") or "auto")

    gen = int(self.ro.get("generation_batch") or rows)
    if gen == rows:
      ro = sample(0, rows)
      host_ro = jax.tree.map(to_host, ro)
    else:
      # rollout.generation_batch rows per decode call (the KV cache and the
      # decode's temporaries scale with it). Each row's sampling stream is
      # keyed by its row id, so the samples are those of one call.
      host_ro = concat_rollouts([jax.tree.map(to_host, sample(lo, lo + gen))
                                 for lo in range(0, rows, gen)])
      ro = jax.tree.map(lambda x: self._put(x) if np.ndim(x) else
                        jnp.asarray(x), host_ro)
    scores = self.reward_fn(host_ro, host_batch)
    # The verifiers score 1 for right; grpo.reward_scale 2 is the paper's
    # RLVR reward (App. D.6: 2 if correct, else 0). The advantages barely
    # change (scale_by_std), the logged rl/reward_mean does.
    reward = np.asarray(scores["reward"], np.float32) * np.float32(
        self.grpo.get("reward_scale", 1.0))
    if "format_bonus" in scores:  # the teachers' GRPO (rl/rewards.py)
      reward = reward + np.asarray(scores["format_bonus"], np.float32)
    if reward.shape != (rows,):
      raise ValueError(
          f"reward_fn: expected {rows} rewards, got shape {reward.shape}")
    adv, stats = grpo.group_advantages(
        reward, g, scale_by_std=bool(self.grpo.scale_by_std),
        eps=float(self.grpo.adv_eps))
    old = ro.logprobs
    n = ro.response_mask.shape[1]
    if self.top_p is not None:
      # The sampler's log-probs are the nucleus's; the ratio is taken on the
      # untruncated tempered distribution (grpo.py), scored here under the
      # params that sampled, by the loss's own forward pass.
      old = reference_logprobs(
          params, ro.tokens, ro.attention_mask, jnp.float32(temp),
          cfg=self.cfg, num_response=n, chunks=self.chunks,
          vocab_size=self.vocab)
    batch = {"tokens": ro.tokens, "attention_mask": ro.attention_mask,
             "loss_mask": ro.response_mask, "old_logp": old,
             "advantages": self._put(np.asarray(adv))}
    if self.reference is not None:
      rcfg, rparams = self.reference
      if reference_params is not None:
        rparams = reference_params
      batch["ref_logp"] = reference_logprobs(
          rparams, ro.tokens, ro.attention_mask, jnp.float32(temp), cfg=rcfg,
          num_response=n, chunks=self.chunks,
          vocab_size=self.vocab)
    metrics = {k: float(v) for k, v in jax.device_get(stats).items()}
    lengths = host_ro.lengths
    metrics.update({
        "rl/reward_mean": float(reward.mean()),
        "rl/reward_std": float(reward.std()),
        "rollout/len": float(lengths.mean()),
        "rollout/len_max": float(lengths.max()),
        "rollout/ended_frac": float(host_ro.ended.mean()),
        "rollout/tokens": float(host_ro.prompt_mask.sum() + lengths.sum())})
    if "format" in scores:
      metrics["rl/format"] = float(np.mean(scores["format"]))
    if "format_bonus" in scores:
      metrics["rl/format_bonus"] = float(np.mean(scores["format_bonus"]))
    if self.top_p is not None:
      # Mean log of the nucleus mass the sampled tokens were drawn from (<= 0).
      m = host_ro.response_mask > 0
      gap = to_host(old) - host_ro.logprobs
      metrics["rollout/log_nucleus_mass"] = float(
          gap[m].mean()) if m.any() else 0.0
    return batch, metrics


def ppo_update(state, batch, rng, *, optimizer, schedule, loss_fn,
               ppo_epochs: int, num_minibatches: int, grad_accum: int,
               reduction: str, mesh=None, rules=None, lora_scale=None):
  """`ppo_epochs` x `num_minibatches` optimizer steps on one rollout batch.

  Returns the new state and the metrics averaged over those steps (their
  'train/*' and 'rl/*' entries; rl/clip_frac is 0 on the first step of a
  fresh batch up to sampler/trainer numerics). A LoRA state (with a
  'base') trains its adapters (train.step.train_step, `lora_scale`).
  """
  rows = batch["advantages"].shape[0]
  size = rows // num_minibatches
  perms = jax.vmap(lambda k: jax.random.permutation(k, rows))(
      jax.random.split(rng, ppo_epochs))  # [E, R]
  order = perms.reshape(ppo_epochs * num_minibatches, size)

  def constrain(x):
    if mesh is None:
      return x
    return jax.lax.with_sharding_constraint(x, _rows(mesh, rules, x.shape))

  def body(state, ids):
    mb = jax.tree.map(lambda x: constrain(jnp.take(x, ids, axis=0)), batch)
    mb["weights"] = losses.reduction_weights(mb["loss_mask"], reduction)
    return step_lib.train_step(state, None, mb, optimizer=optimizer,
                               schedule=schedule, loss_fn=loss_fn,
                               grad_accum=grad_accum, lora_scale=lora_scale)

  state, metrics = jax.lax.scan(body, state, order)
  return state, jax.tree.map(lambda m: m.mean(0), metrics)


def make_loss_fn(config, cfg, vocab_size=None, shard=None):
  return functools.partial(
      grpo.grpo_loss, cfg=cfg, grpo_cfg=config.grpo, kl_cfg=config.kl,
      temperature=float(config.rollout.temperature), vocab_size=vocab_size,
      shard=shard)


def make_update(config, cfg, optimizer, schedule, *, mesh=None,
                rules=None, vocab_size=None):
  """The un-jitted ppo_update of a config (the loop jits it with shardings).

  `rules`: the run's logical-axis rules (needed with `mesh`). `vocab_size`:
  the vocabulary the Collector sampled over (len(tokenizer)), so that the
  policy log-probs are those of the distribution sampled. With
  config.student.lora the state it updates holds adapters on a frozen base."""
  _check_rules(mesh, rules)
  lcfg = lora.from_config(config.student.get("lora"), "config.student.lora")
  return functools.partial(
      ppo_update, optimizer=optimizer, schedule=schedule,
      loss_fn=make_loss_fn(
          config, cfg, vocab_size,
          None if mesh is None else sharding.Activations(mesh, rules)),
      ppo_epochs=int(config.grpo.ppo_epochs),
      num_minibatches=int(config.grpo.num_minibatches),
      grad_accum=int(config.optim.grad_accum),
      reduction=config.grpo.reduction, mesh=mesh, rules=rules,
      lora_scale=None if lcfg is None else lcfg.scale)
