"""GRPO learns a toy verifiable task: answer the prompt's target token."""
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import models
from jaxdistill.rl import step as rl_step
from jaxdistill.train import step as step_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from configs import grpo_countdown  # pylint: disable=g-import-not-at-top,wrong-import-position

V = 16
CFG = models.ModelConfig(vocab_size=V, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16,
                         max_position_embeddings=16)
# Prompt [1, c]; the only rewarded answer is TARGET[c] (a fixed permutation).
CONTEXTS = np.array([3, 4, 5, 6, 7, 8], np.int32)
TARGETS = np.array([11, 9, 14, 3, 12, 10], np.int32)


def _config(steps):
  c = grpo_countdown.get_config("runlocal")
  c.data.batch_size = len(CONTEXTS)
  c.rollout.update(group_size=8, max_new_tokens=1, temperature=1.0)
  c.grpo.update(ppo_epochs=2, num_minibatches=2, reduction="token_mean")
  c.kl.update(coef=0.0, monitor=False)
  c.optim.update(lr=3e-3, warmup_steps=0, clip_norm=1.0, grad_accum=1)
  c.total_steps = steps
  return c


def _reward_fn(ro, host_batch):
  g = ro.tokens.shape[0] // len(host_batch["target"])
  first = ro.tokens[:, ro.prompt_mask.shape[1]]  # [R]
  return {"reward": (first == np.repeat(host_batch["target"], g)).astype(
      np.float32)}


def _p_correct(params, prompts):
  """Exact expected reward: the mean probability of the target token."""
  logits = models.apply(CFG, params, prompts)[:, -1]  # [B, V]
  p = jax.nn.softmax(logits, axis=-1)
  return float(np.mean(np.asarray(p)[np.arange(len(TARGETS)), TARGETS]))


def test_grpo_raises_the_reward_of_a_tiny_model():
  steps = 30
  config = _config(steps)
  prompts = np.stack([np.ones_like(CONTEXTS), CONTEXTS], 1)  # [B, 2]
  host = {"prompt": prompts, "prompt_mask": np.ones_like(prompts),
          "target": TARGETS}
  key = jax.random.key(0)
  params = models.init(CFG, jax.random.fold_in(key, 1))
  optimizer, schedule = step_lib.make_optimizer(config.optim, steps * 4)
  state = {"params": params, "opt_state": optimizer.init(params),
           "step": jnp.zeros((), jnp.int32)}
  collect = rl_step.Collector(config, CFG, _reward_fn, eos_ids=())
  update = jax.jit(rl_step.make_update(config, CFG, optimizer, schedule),
                   donate_argnums=0)
  start = _p_correct(params, prompts)
  rewards = []
  for i in range(steps):
    r_roll, r_upd = jax.random.split(jax.random.fold_in(key, i))
    batch, metrics = collect(host, state["params"], r_roll)
    state, upd = update(state, batch, r_upd)
    rewards.append(metrics["rl/reward_mean"])
    assert np.isfinite(float(upd["train/loss"]))
  end = _p_correct(state["params"], prompts)
  print(f"p(correct) {start:.3f} -> {end:.3f}; sampled rewards {rewards}")
  assert start < 0.15, start
  assert end > 0.5, (start, end, rewards)
  assert np.mean(rewards[-5:]) > 0.4, rewards
  # Mini-batches x epochs optimizer steps per rollout batch.
  assert int(state["step"]) == steps * 4


def test_collector_and_update_use_the_real_vocabulary():
  """Padding ids (>= the tokenizer's size) are never sampled, and the policy
  log-probs are over the same vocabulary, so the ratio is 1 on a fresh batch."""
  real = 10
  config = _config(1)
  config.rollout.update(max_new_tokens=3, temperature=0.8)
  config.kl.update(coef=0.1, monitor=True, estimator="k3", direction="forward")
  prompts = np.stack([np.ones_like(CONTEXTS), CONTEXTS], 1)
  host = {"prompt": prompts, "prompt_mask": np.ones_like(prompts),
          "target": TARGETS}
  params = models.init(CFG, jax.random.key(2))
  # Make the padding columns of the head dominate.
  head = np.array(params["lm_head"]["kernel"])
  head[:, real:] += 3.0
  params = dict(params, lm_head={"kernel": jnp.asarray(head)})
  collect = rl_step.Collector(config, CFG, _reward_fn, eos_ids=(),
                              reference=(CFG, params), vocab_size=real)
  batch, _ = collect(host, params, jax.random.key(3))
  resp = np.asarray(batch["tokens"])[:, 2:]
  assert resp.max() < real
  # Float64 reference: log softmax(logits / T) over the real vocabulary.
  logits = np.asarray(models.apply(CFG, params, batch["tokens"],
                                   batch["attention_mask"]), np.float64)
  x = logits[:, 1:-1, :real] / 0.8
  lp = x - np.logaddexp.reduce(x, axis=-1, keepdims=True)
  want = np.take_along_axis(lp, resp[..., None], -1)[..., 0]
  np.testing.assert_allclose(np.asarray(batch["old_logp"]), want, atol=2e-5)
  np.testing.assert_allclose(np.asarray(batch["ref_logp"]), want, atol=2e-5)
  optimizer, schedule = step_lib.make_optimizer(config.optim, 4)
  state = {"params": params, "opt_state": optimizer.init(params),
           "step": jnp.zeros((), jnp.int32)}
  config.grpo.update(ppo_epochs=1, num_minibatches=1)
  update = jax.jit(rl_step.make_update(config, CFG, optimizer, schedule,
                                       vocab_size=real))
  _, m = update(state, batch, jax.random.key(4))
  assert float(m["rl/abs_log_ratio"]) < 1e-5
