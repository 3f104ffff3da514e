"""The DAPO loss (grpo.loss 'dapo') against a NumPy transcription of the DAPO
paper's objective (Yu et al., 2025, Eq. 8 without its dynamic-sampling
constraint), including normalisation over a gradient-accumulated batch, and
GRPO's nucleus sampling (rollout.top_p)."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from jaxdistill import config_lib
from jaxdistill import losses
from jaxdistill import models
from jaxdistill.rl import grpo
from jaxdistill.rl import step as rl_step
from jaxdistill.rl import train as rl_train
from jaxdistill.train import step as step_lib

EPS_LOW, EPS_HIGH = 0.2, 0.28  # the DAPO paper's clip-higher


def np_dapo(logp, old, rewards, mask, g, eps=1e-6):
  """float64 (loss, d loss / d logp), written from the DAPO paper:

    J = 1 / sum_i |o_i| * sum_i sum_t min(r_it A_i,
                                          clip(r_it, 1 - e_low, 1 + e_high) A_i)
    A_i = (R_i - mean(R_group)) / std(R_group),   loss = -J.
  """
  logp, old = np.float64(logp), np.float64(old)
  mask = np.asarray(mask, bool)
  r = np.float64(rewards).reshape(-1, g)
  std = r.std(1, keepdims=True)
  adv = np.where(std > 0, (r - r.mean(1, keepdims=True)) / (std + eps), 0.0)
  a = adv.reshape(-1)[:, None]
  ratio = np.exp(np.where(mask, logp - old, 0.0))
  surrogate = np.minimum(ratio * a, np.clip(ratio, 1 - EPS_LOW,
                                            1 + EPS_HIGH) * a)
  total = mask.sum()
  loss = -np.sum(np.where(mask, surrogate, 0.0)) / total
  # d/d logp of min(r A, clip(r) A): r A where the unclipped term is the
  # smaller one (r inside the range, or outside on the side that does not
  # help), 0 where the clipped constant wins.
  unclipped = np.where(a > 0, ratio <= 1 + EPS_HIGH, ratio >= 1 - EPS_LOW)
  grad = -np.where(mask & unclipped, ratio * a, 0.0) / total
  return loss, grad


def _random_batch(seed, prompts=6, g=4, n=12):
  rng = np.random.default_rng(seed)
  rows = prompts * g
  lengths = rng.integers(1, n + 1, rows)
  lengths[:3] = (1, n, 2)  # very different lengths side by side
  mask = np.arange(n)[None, :] < lengths[:, None]
  old = np.log(rng.uniform(0.02, 0.9, (rows, n)))
  # Ratios spread over both clip edges: exp(+-0.5).
  logp = old + rng.uniform(-0.5, 0.5, (rows, n))
  rewards = rng.integers(0, 3, rows).astype(np.float64)
  rewards[:g] = 1.0  # one group with equal rewards: A = 0
  return logp, old, rewards, mask, g


def test_numpy_gradient_is_the_derivative_of_the_numpy_loss():
  """The closed-form gradient above, by central finite differences."""
  logp, old, rewards, mask, g = _random_batch(0, prompts=2, n=5)
  _, grad = np_dapo(logp, old, rewards, mask, g)
  h = 1e-6
  fd = np.zeros_like(logp)
  for idx in np.ndindex(*logp.shape):
    up, down = logp.copy(), logp.copy()
    up[idx] += h
    down[idx] -= h
    fd[idx] = (np_dapo(up, old, rewards, mask, g)[0]
               - np_dapo(down, old, rewards, mask, g)[0]) / (2 * h)
  np.testing.assert_allclose(grad, fd, atol=1e-7)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dapo_loss_and_gradient_match_numpy(seed):
  logp, old, rewards, mask, g = _random_batch(seed)
  want_loss, want_grad = np_dapo(logp, old, rewards, mask, g)
  adv, _ = grpo.group_advantages(np.float32(rewards), g)
  w = losses.reduction_weights(jnp.asarray(mask), "token_mean")

  def loss(lp):
    return grpo.grpo_objective(lp, jnp.float32(old), adv, w, mask,
                               clip_low=EPS_LOW, clip_high=EPS_HIGH)[0]
  got_loss, got_grad = jax.value_and_grad(loss)(jnp.float32(logp))
  np.testing.assert_allclose(float(got_loss), want_loss, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(got_grad), want_grad, rtol=1e-4,
                             atol=1e-8)


def _logp_loss(params, unused_teacher, mb):
  """step.train_step's loss on a 'model' whose parameters are the log-probs
  themselves: row mb['rows'][k] of params['logp'] is micro-batch row k."""
  del unused_teacher
  lp = params["logp"][mb["rows"]]
  loss, metrics = grpo.grpo_objective(
      lp, mb["old_logp"], mb["advantages"], mb["weights"], mb["loss_mask"],
      clip_low=EPS_LOW, clip_high=EPS_HIGH)
  metrics[step_lib.MEAN_WEIGHT] = jnp.sum(mb["loss_mask"])
  return loss, metrics


@pytest.mark.parametrize("grad_accum", [1, 4, 8])
def test_accumulated_batch_is_normalised_by_all_its_tokens(grad_accum):
  """rl.step.ppo_update (1 mini-batch, `grad_accum` micro-batches after its
  shuffle): the summed micro-batch gradient is the DAPO gradient of the
  whole batch (one SGD step of rate 1 returns it), not a mean of the
  micro-batches' own token means."""
  logp, old, rewards, mask, g = _random_batch(3, prompts=4, g=4)
  rows = logp.shape[0]
  want_loss, want_grad = np_dapo(logp, old, rewards, mask, g)
  adv, _ = grpo.group_advantages(np.float32(rewards), g)
  batch = {"rows": jnp.arange(rows), "old_logp": jnp.float32(old),
           "advantages": adv, "loss_mask": jnp.asarray(mask, jnp.int32)}
  params = {"logp": jnp.float32(logp)}
  opt = optax.sgd(1.0)
  state = step_lib.new_state(opt, params)
  new, metrics = jax.jit(lambda s, b: rl_step.ppo_update(
      s, b, jax.random.key(0), optimizer=opt,
      schedule=optax.constant_schedule(1.0), loss_fn=_logp_loss,
      ppo_epochs=1, num_minibatches=1, grad_accum=grad_accum,
      reduction="token_mean"))(state, batch)
  grad = logp - np.asarray(new["params"]["logp"], np.float64)
  np.testing.assert_allclose(grad, want_grad, rtol=2e-4, atol=1e-7)
  np.testing.assert_allclose(float(metrics["train/loss"]), want_loss,
                             rtol=1e-5)
  if grad_accum > 1:
    # The mean of micro-batch token means (each micro-batch normalised by
    # its own tokens) is another, length-biased gradient: the check above
    # tells them apart.
    perm = np.asarray(jax.random.permutation(jax.random.split(
        jax.random.key(0), 1)[0], rows))  # ppo_update's row order
    per_micro = np.zeros_like(logp)
    for j in range(grad_accum):  # train_step's micro-batch j
      ids = perm[j::grad_accum]
      per_micro[ids] = (want_grad[ids] * mask.sum() / mask[ids].sum()
                        / grad_accum)
    assert np.abs(per_micro - want_grad).max() > 0.05 * np.abs(want_grad).max()


def test_check_loss_refuses_what_dapo_is_not():
  grpo.check_loss("dapo", "token_mean", 0.0)
  grpo.check_loss("grpo", "sequence_mean", 0.1)
  with pytest.raises(ValueError, match=r"config\.grpo\.loss: unknown 'ppo'"):
    grpo.check_loss("ppo", "token_mean", 0.0)
  with pytest.raises(ValueError, match=r"config\.grpo\.reduction: the DAPO"):
    grpo.check_loss("dapo", "sequence_mean", 0.0)
  with pytest.raises(ValueError, match=r"config\.kl\.coef: the DAPO loss"):
    grpo.check_loss("dapo", "token_mean", 0.05)
  with pytest.raises(ValueError, match=r"config\.grpo\.reduction: unknown"):
    grpo.check_loss("grpo", "sum", 0.0)


TINY = models.ModelConfig(vocab_size=24, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=16,
                          max_position_embeddings=64)


def test_nucleus_rollouts_keep_the_ratio_on_the_tempered_distribution():
  """rollout.top_p 0.5: every sampled token is in the tempered distribution's
  nucleus (NumPy), and old_logp is the token's log-prob under the
  UNTRUNCATED tempered distribution of the sampling params (float64 NumPy
  log-softmax of the model's logits), so rho = 1 on the fresh batch."""
  temp, top_p, n = 1.0, 0.5, 6
  config = ml_collections.ConfigDict(dict(
      rollout=dict(group_size=4, temperature=temp, max_new_tokens=n,
                   top_p=top_p),
      grpo=dict(scale_by_std=True, adv_eps=1e-6, reward_scale=2.0),
      optim=dict(grad_accum=2)))
  params = models.init(TINY, jax.random.key(0))
  prompts = np.array([[0, 5, 6, 7], [8, 9, 10, 11]], np.int32)
  host = {"prompt": prompts, "prompt_mask": (prompts > 0).astype(np.int32)}

  rows = np.arange(8)
  def reward_fn(unused_ro, unused_batch):
    return {"reward": np.float32(rows % 2),
            "format_bonus": np.float32(0.25 * (rows % 3))}
  collect = rl_step.Collector(config, TINY, reward_fn, eos_ids=[2])
  batch, metrics = collect(host, params, jax.random.key(1))
  tokens, mask = np.asarray(batch["tokens"]), np.asarray(batch["loss_mask"]) > 0
  logits = np.asarray(models.apply(TINY, params, batch["tokens"],
                                   batch["attention_mask"]),
                      np.float64)[:, 3:-1] / temp  # [R, N, V]
  lp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
  tok = tokens[:, 4:]
  want = np.take_along_axis(lp, tok[..., None], -1)[..., 0]
  np.testing.assert_allclose(np.asarray(batch["old_logp"])[mask], want[mask],
                             atol=2e-5)
  # In the nucleus: the mass of the strictly more likely tokens is < top_p.
  p = np.exp(lp)
  p_tok = np.take_along_axis(p, tok[..., None], -1)
  above = np.where(p > p_tok, p, 0.0).sum(-1)
  assert np.all(above[mask] < top_p + 1e-6)
  # reward_scale times the verifier's reward, plus the formatting rewards.
  assert metrics["rl/reward_mean"] == pytest.approx(
      np.mean(2.0 * (rows % 2) + 0.25 * (rows % 3)))
  assert metrics["rl/format_bonus"] == pytest.approx(np.mean(0.25 * (rows % 3)))
  # Truncation happened: the nucleus held less than all the mass.
  assert metrics["rollout/log_nucleus_mass"] < -0.05
  # rho = 1: the loss's log-probs equal old_logp on the fresh batch.
  logp, _ = grpo.token_logprobs(TINY, params, batch["tokens"],
                                batch["attention_mask"], n, temperature=temp)
  np.testing.assert_allclose(np.asarray(logp)[mask],
                             np.asarray(batch["old_logp"])[mask], atol=1e-5)


def test_a_nucleus_run_compiles_its_rescoring_program():
  """--compile_only and the fit check see the nucleus rollout and the
  policy's rescoring pass (configs/grpo_after_distill.py: top-p 0.95)."""
  c = config_lib.load_config("configs/grpo_after_distill.py:runlocal")
  c.tokenizer_build = None
  c.student.init.update(vocab_size=320)
  progs = {p.name: p for p in rl_train.programs_for(c, jax.devices()[:1])}
  assert list(progs) == ["rollout", "reference", "rescore", "update"]
  progs["rescore"].trace()  # traces with the policy's abstract params


@pytest.mark.parametrize("mesh_shape", [None, {"data": 2, "fsdp": 4}])
def test_generation_batches_sample_what_one_call_samples(mesh_shape):
  """rollout.generation_batch 4 of 8 rows (two decode calls) gives the batch
  of one call: tokens, masks, old log-probs, advantages and metrics (each
  row's sampling stream is keyed by its row id)."""
  from jaxdistill import sharding  # pylint: disable=g-import-not-at-top
  params = models.init(TINY, jax.random.key(0))
  prompts = np.array([[0, 5, 6, 7], [8, 9, 10, 11]], np.int32)
  host = {"prompt": prompts, "prompt_mask": (prompts > 0).astype(np.int32)}
  mesh = None if mesh_shape is None else sharding.make_mesh(mesh_shape)
  rules = None if mesh is None else sharding.DEFAULT_RULES

  def run(gen):
    config = ml_collections.ConfigDict(dict(
        rollout=dict(group_size=4, temperature=1.0, max_new_tokens=6,
                     top_p=0.9, generation_batch=gen),
        grpo=dict(scale_by_std=True, adv_eps=1e-6),
        optim=dict(grad_accum=2)))
    reward_fn = lambda ro, _: {"reward": np.float32(
        np.asarray(ro.tokens)[:, -1] % 3)}
    collect = rl_step.Collector(config, TINY, reward_fn, eos_ids=[2],
                                mesh=mesh, rules=rules)
    return collect(host, params, jax.random.key(1))

  ref, ref_m = run(None)
  got, got_m = run(4)
  assert set(got) == set(ref)
  for k in ref:
    np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(ref[k]), k)
  assert got_m == pytest.approx(ref_m)
  # The samples differ across rows: the comparison sees real sampling.
  assert len({tuple(r) for r in np.asarray(ref["tokens"]).tolist()}) > 4
