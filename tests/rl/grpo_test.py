"""GRPO advantages, objective and gradient against float64 NumPy references."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxdistill import config_lib
from jaxdistill import losses
from jaxdistill import models
from jaxdistill import rollout
from jaxdistill import sharding
from jaxdistill.rl import grpo
from jaxdistill.rl import step as rl_step
from jaxdistill.train import step as step_lib


def np_advantages(r, g, scale, eps):
  r = np.asarray(r, np.float64).reshape(-1, g)
  c = r - r.mean(1, keepdims=True)
  std = r.std(1, keepdims=True)  # ddof 0
  return (c / (std + eps) if scale else c).reshape(-1)


@pytest.mark.parametrize("scale", [True, False])
def test_group_advantages_match_numpy(scale):
  r = np.array([1, 0, 0, 1, 1, 1, 1, 1, 0.5, 0.0, 0.25, 1.0, 0, 0, 0, 0],
               np.float32)
  adv, stats = grpo.group_advantages(r, 4, scale_by_std=scale, eps=1e-6)
  np.testing.assert_allclose(np.asarray(adv), np_advantages(r, 4, scale, 1e-6),
                             rtol=1e-5, atol=1e-6)
  # Groups 1 and 3 are constant: exactly zero advantages.
  assert np.all(np.asarray(adv)[4:8] == 0) and np.all(np.asarray(adv)[12:] == 0)
  assert float(stats["rl/zero_var_groups"]) == 0.5
  assert float(stats["rl/solved_groups"]) == 0.75
  with pytest.raises(ValueError, match="rewards"):
    grpo.group_advantages(r[:6], 4)


def _hand_batch():
  """2 groups x 2 samples, 5 slots; ratios on both sides of both clip edges."""
  rewards = np.array([1.0, 0.0, 0.0, 1.0])
  adv = np_advantages(rewards, 2, True, 1e-6)  # [+1, -1, -1, +1]
  old = np.log(np.array([
      [0.30, 0.20, 0.50, 0.10, 0.40],
      [0.25, 0.60, 0.10, 0.70, 0.35],
      [0.50, 0.50, 0.20, 0.05, 0.90],
      [0.10, 0.30, 0.45, 0.20, 0.60]]))
  # Multiplicative ratio changes: inside, above 1.2, below 0.8.
  rho = np.array([
      [1.05, 1.50, 0.60, 1.10, 0.90],   # A>0: 1.50 clipped (high)
      [0.50, 1.30, 0.95, 1.01, 0.70],   # A<0: 0.50, 0.70 clipped (low)
      [1.40, 0.90, 0.30, 1.00, 1.00],   # A<0: 1.40 not clipped, 0.30 clipped
      [1.25, 0.75, 1.00, 3.00, 0.50]])  # A>0: 1.25 clipped; 3.0 masked out
  logp = old + np.log(rho)
  mask = np.array([[1, 1, 1, 1, 0],
                   [1, 1, 1, 0, 0],
                   [1, 1, 1, 1, 1],
                   [1, 1, 1, 0, 0]], bool)
  ref = old + np.array([[0.1, -0.2, 0.3, 0.05, 0.4]] * 4)
  return adv, old, logp, ref, mask


def np_grpo(logp, old, ref, adv, w, mask, lo, hi, beta, est):
  """Loss and d loss / d logp, float64, closed form."""
  rho = np.exp(np.where(mask, logp - old, 0.0))
  a = adv[:, None]
  clipped = np.clip(rho, 1 - lo, 1 + hi)
  pg = -np.minimum(rho * a, clipped * a)
  active = ((a > 0) & (rho <= 1 + hi)) | ((a < 0) & (rho >= 1 - lo))
  d_pg = np.where(active, -rho * a, 0.0)
  lr = np.where(mask, ref - logp, 0.0)  # log r
  k = {"k1": -lr, "k2": 0.5 * lr**2, "k3": np.exp(lr) - 1 - lr}[est]
  dk = {"k1": np.ones_like(lr), "k2": -lr, "k3": 1 - np.exp(lr)}[est]
  w = np.where(mask, w, 0.0)
  loss = np.sum(w * (pg + beta * k))
  grad = w * (d_pg + beta * dk)
  clip = mask & (((a > 0) & (rho > 1 + hi)) | ((a < 0) & (rho < 1 - lo)))
  return loss, grad, clip.sum() / mask.sum()


@pytest.mark.parametrize("reduction", ["token_mean", "sequence_mean"])
@pytest.mark.parametrize("est,beta", [("k3", 0.1), ("k2", 0.3), ("k1", 0.0)])
def test_objective_and_gradient_match_numpy(reduction, est, beta):
  adv, old, logp, ref, mask = _hand_batch()
  w = np.asarray(losses.reduction_weights(jnp.asarray(mask, jnp.int32),
                                         reduction), np.float64)
  # Garbage off the response must not leak (no nan, no gradient).
  old_j = np.where(mask, old, np.inf)
  ref_j = np.where(mask, ref, -np.inf)
  f = lambda lp: grpo.grpo_objective(
      lp, jnp.asarray(old_j, jnp.float32), jnp.asarray(adv, jnp.float32),
      jnp.asarray(w, jnp.float32), jnp.asarray(mask), clip_low=0.2,
      clip_high=0.2, ref_logp=jnp.asarray(ref_j, jnp.float32), kl_coef=beta,
      kl_estimator=est)
  (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(
      jnp.asarray(logp, jnp.float32))
  want_loss, want_grad, want_clip = np_grpo(logp, old, ref, adv, w, mask, 0.2,
                                            0.2, beta, est)
  np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(grad)[~mask] == 0)
  np.testing.assert_allclose(float(metrics["rl/clip_frac"]), want_clip,
                             rtol=1e-6)
  # The hand batch clips on both sides.
  assert float(metrics["rl/clip_frac_low"]) > 0
  assert float(metrics["rl/clip_frac_high"]) > 0
  lr = np.where(mask, ref - logp, 0.0)
  np.testing.assert_allclose(float(metrics["rl/kl_ref"]),
                             np.sum((np.exp(lr) - 1 - lr) * mask) / mask.sum(),
                             rtol=1e-5)


def _kl_grads_np(z, zr):
  """Closed-form logit gradients of KL(pi||ref), KL(ref||pi), pi=softmax(z)."""
  pi = np.exp(z - np.logaddexp.reduce(z))
  ref = np.exp(zr - np.logaddexp.reduce(zr))
  rkl = np.sum(pi * (np.log(pi) - np.log(ref)))
  return pi * (np.log(pi) - np.log(ref) - rkl), pi - ref


@pytest.mark.parametrize("est,direction", [("k2", "reverse"), ("k3", "forward"),
                                           ("k1", "none")])
def test_kl_estimator_expected_gradient_is_the_stated_direction(est, direction):
  """E_{y~pi}[d k(y) / dz], summed exactly over the vocabulary."""
  rs = np.random.default_rng(0)
  z, zr = rs.normal(size=7), rs.normal(size=7)

  def expected(z):
    lp_all = jax.nn.log_softmax(z)
    ys = jnp.arange(7)
    pen, _ = grpo.kl_terms(lp_all[ys], jax.nn.log_softmax(jnp.asarray(zr))[ys],
                           est)
    # Weight each sample by its (constant) probability: the expectation.
    return jnp.sum(jax.lax.stop_gradient(jnp.exp(lp_all)) * pen)
  g = np.asarray(jax.grad(expected)(jnp.asarray(z, jnp.float32)), np.float64)
  rkl_grad, fkl_grad = _kl_grads_np(z, zr)
  want = {"reverse": rkl_grad, "forward": fkl_grad,
          "none": np.zeros_like(z)}[direction]
  np.testing.assert_allclose(g, want, atol=2e-6)
  assert grpo.KL_DIRECTIONS[est] == direction


def test_check_kl_refuses_a_wrong_direction():
  grpo.check_kl("k3", "forward", 0.1)
  grpo.check_kl("k2", "reverse", 0.1)
  grpo.check_kl("k1", "reverse", 0.0)  # coef 0: only monitored
  with pytest.raises(ValueError, match="config.kl.direction"):
    grpo.check_kl("k3", "reverse", 0.1)
  with pytest.raises(ValueError, match="config.kl.estimator"):
    grpo.check_kl("k1", "none", 0.1)
  with pytest.raises(ValueError, match="config.kl.estimator"):
    grpo.check_kl("k4", "forward", 0.1)
  with pytest.raises(ValueError, match="config.kl.coef"):
    grpo.check_kl("k3", "forward", -1.0)


TINY = models.ModelConfig(vocab_size=24, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=16,
                          max_position_embeddings=64)


@pytest.fixture(scope="module")
def tiny_rollout():
  params = models.init(TINY, jax.random.key(0))
  prompts = np.array([[0, 5, 6, 7], [8, 9, 10, 11], [0, 0, 3, 4],
                      [0, 12, 13, 14]] * 2, np.int32)
  pmask = (prompts > 0).astype(np.int32)
  ro = rollout.generate((TINY, params), None, prompts, pmask,
                        rng=jax.random.key(1), max_new_tokens=5,
                        temperature=0.7, eos_token_ids=[2])
  return params, ro


@pytest.mark.parametrize("chunk_size", [None, 2])
def test_policy_logprobs_are_the_samplers_tempered_logprobs(tiny_rollout,
                                                            chunk_size):
  """rho = 1 on a fresh batch: the loss uses the sampling distribution; also
  when the response's logits are formed 2 positions at a time (5 = 2 + 2 +
  1: the last block padded)."""
  params, ro = tiny_rollout
  logp, ent = grpo.token_logprobs(TINY, params, ro.tokens, ro.attention_mask, 5,
                                  temperature=0.7, chunk_size=chunk_size)
  m = np.asarray(ro.response_mask) > 0
  np.testing.assert_allclose(np.asarray(logp)[m], np.asarray(ro.logprobs)[m],
                             atol=2e-5)
  # Entropy of softmax(z / T) from an independent float64 forward.
  logits = np.asarray(models.apply(TINY, params, ro.tokens, ro.attention_mask),
                      np.float64)[:, 3:-1] / 0.7
  lp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
  np.testing.assert_allclose(np.asarray(ent)[m], -(np.exp(lp) * lp).sum(-1)[m],
                             rtol=1e-4)


def test_blocked_logprobs_gradient_matches_full_logits(tiny_rollout):
  """The gradient through log-probs formed 2 positions at a time (each
  block's logits recomputed in the backward pass) equals the gradient
  through the model's full logits and jax.nn.log_softmax."""
  params, ro = tiny_rollout
  w = jax.random.normal(jax.random.key(3), (8, 5))

  def blocked(prm):
    lp, _ = grpo.token_logprobs(TINY, prm, ro.tokens, ro.attention_mask, 5,
                                temperature=0.7, chunk_size=2)
    return jnp.sum(lp * w)

  def full(prm):
    z = models.apply(TINY, prm, ro.tokens, ro.attention_mask)[:, 3:-1] / 0.7
    lp = jax.nn.log_softmax(z.astype(jnp.float32), axis=-1)
    return jnp.sum(jnp.take_along_axis(lp, ro.tokens[:, 4:, None], -1)[..., 0]
                   * w)

  got, want = jax.grad(blocked)(params), jax.grad(full)(params)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4,
                               atol=1e-6)


def test_reference_logprobs_in_strided_row_blocks(tiny_rollout):
  """rl.step.reference_logprobs in 2 row blocks (rows 0, 2, 4, ... and 1, 3,
  5, ...) puts every row's log-probs back in its place: against an
  independent float64 log-softmax of the model's logits."""
  params, ro = tiny_rollout
  got = rl_step.reference_logprobs(params, ro.tokens, ro.attention_mask,
                                   jnp.float32(0.7), cfg=TINY, num_response=5,
                                   chunks=2)
  logits = np.asarray(models.apply(TINY, params, ro.tokens, ro.attention_mask),
                      np.float64)[:, 3:-1] / 0.7
  lp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
  want = np.take_along_axis(lp, np.asarray(ro.tokens)[:, 4:, None], -1)[..., 0]
  np.testing.assert_allclose(np.asarray(got), want, atol=2e-5)


def _batch(ro, rewards, g):
  adv, _ = grpo.group_advantages(rewards, g)
  mask = ro.response_mask
  return {"tokens": ro.tokens, "attention_mask": ro.attention_mask,
          "loss_mask": mask, "old_logp": ro.logprobs, "advantages": adv,
          "weights": losses.reduction_weights(mask, "token_mean")}


def _loss(params, batch):
  grpo_cfg = ml_collections.ConfigDict(dict(clip_low=0.2, clip_high=0.2))
  kl_cfg = ml_collections.ConfigDict(dict(coef=0.0, estimator="k3"))
  return grpo.grpo_loss(params, None, batch, cfg=TINY, grpo_cfg=grpo_cfg,
                        kl_cfg=kl_cfg, temperature=0.7)


@pytest.mark.parametrize("value", [0.0, 1.0])
def test_equal_reward_groups_give_zero_gradient_and_no_nan(tiny_rollout, value):
  params, ro = tiny_rollout
  # Two groups of 4; both constant.
  batch = _batch(ro, np.full(8, value, np.float32), 4)
  (loss, metrics), grads = jax.jit(jax.value_and_grad(_loss, has_aux=True))(
      params, batch)
  assert float(loss) == 0.0
  leaves = jax.tree.leaves(grads)
  assert all(np.all(np.asarray(x) == 0) for x in leaves)
  assert all(np.all(np.isfinite(np.asarray(v))) for v in metrics.values())


def test_equal_reward_group_adds_nothing_to_a_mixed_batch(tiny_rollout):
  """Group 0 (rows 0..3) constant: its log-probs get exactly zero gradient."""
  params, ro = tiny_rollout
  batch = _batch(ro, np.array([1, 1, 1, 1, 0, 1, 0, 0], np.float32), 4)
  def on_logp(lp):
    return grpo.grpo_objective(lp, batch["old_logp"], batch["advantages"],
                               batch["weights"], batch["loss_mask"],
                               clip_low=0.2, clip_high=0.2)[0]
  g = np.asarray(jax.grad(on_logp)(ro.logprobs))
  assert np.all(g[:4] == 0) and np.any(g[4:] != 0)
  assert np.all(np.isfinite(g))


@pytest.mark.slow
def test_sharded_update_matches_single_device(tiny_rollout):
  """ppo_update (2 epochs x 2 mini-batches) on fsdp x tensor == 1 device."""
  params, ro = tiny_rollout
  config = config_lib.load_config("configs/grpo_countdown.py:runlocal")
  config.grpo.update(ppo_epochs=2, num_minibatches=2)
  config.kl.coef = 0.05
  config.rollout.temperature = 0.7
  batch = _batch(ro, np.array([1, 0, 1, 1, 0, 0, 1, 0], np.float32), 4)
  del batch["weights"]
  wiggle = jnp.sin(jnp.arange(ro.logprobs.size, dtype=jnp.float32))
  batch["ref_logp"] = ro.logprobs + 0.1 * wiggle.reshape(ro.logprobs.shape)
  opt, sched = step_lib.make_optimizer(config.optim, 4)

  def run(mesh):
    p = params
    b = batch
    if mesh is not None:
      p = jax.device_put(params, sharding.tree_shardings(
          models.logical_axes(TINY), mesh, sharding.DEFAULT_RULES, params))
      b = {k: jax.device_put(v, sharding.batch_sharding(
          mesh, v.ndim, sharding.DEFAULT_RULES))
           for k, v in batch.items()}
    state = {"params": p, "opt_state": opt.init(p),
             "step": jnp.zeros((), jnp.int32)}
    upd = jax.jit(rl_step.make_update(config, TINY, opt, sched, mesh=mesh,
                                      rules=sharding.DEFAULT_RULES))
    return upd(state, b, jax.random.key(3))

  s1, m1 = run(None)
  s8, m8 = run(sharding.make_mesh({"data": 1, "fsdp": 4, "tensor": 2}))
  assert float(m1["rl/kl_ref"]) > 0 and float(m1["train/grad_norm"]) > 0
  for k in ("train/loss", "rl/clip_frac", "rl/kl_ref", "rl/entropy"):
    np.testing.assert_allclose(float(m8[k]), float(m1[k]), rtol=1e-4, atol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(
      np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5), s1["params"],
               s8["params"])
