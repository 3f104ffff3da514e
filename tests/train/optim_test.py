"""AdamW for weights stored in bfloat16 (train/optim.py), against a NumPy
emulation written from the update rule: float32 arithmetic, round to nearest
even into bfloat16 where a value is stored."""
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxdistill import config_lib
from jaxdistill import models
from jaxdistill.train import step as step_lib


def _bf16(x):
  """float32 -> the nearest bfloat16 (ties to even), as float32: the top 16
  bits of the float32 pattern after adding half a bfloat16 step."""
  bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
  bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
  return bits.astype(np.uint32).view(np.float32)


def _optim(**kw):
  return ml_collections.ConfigDict(dict(
      lr=3e-3, schedule="constant", warmup_steps=0, final_lr_frac=0.0,
      weight_decay=0.1, b1=0.9, b2=0.999, eps=1e-8, clip_norm=None,
      grad_accum=1, moment_dtype=None) | kw)


def _check_rounded(got, exact, stored_bf16=True, terms=None):
  """`got` (the stored values) is `exact` (float64, before storing) rounded
  to nearest even in bfloat16 (or kept in float32). float32 arithmetic
  differs from float64 by a few float32 roundings (XLA's CPU code also
  contracts multiply-adds and divides by reciprocals): tol = 1e-5 |exact|,
  plus 1e-6 of `terms` (the sum of the absolute values added up, where they
  can cancel). Where `exact` is within tol of a point halfway between two
  bfloat16 numbers, either neighbour is right; float32 storage: within tol."""
  got = np.asarray(got, np.float64)
  tol = 1e-5 * np.abs(exact) + (0 if terms is None else 1e-6 * terms)
  if not stored_bf16:
    assert (np.abs(got - exact) <= tol).all()
    return
  want = _bf16(exact.astype(np.float32)).astype(np.float64)
  lo = _bf16((exact - tol).astype(np.float32)).astype(np.float64)
  hi = _bf16((exact + tol).astype(np.float32)).astype(np.float64)
  ambiguous = lo != hi
  ok = (got == want) | (ambiguous & ((got == lo) | (got == hi)))
  assert ok.all(), (got[~ok], exact[~ok])
  assert (got == want).mean() > 0.98


@pytest.mark.parametrize("moment_dtype", [None, "float32"])
def test_bf16_adamw_step_by_step_against_numpy(moment_dtype):
  # Each step from the optimizer's own previous state: the new moments and
  # weights are the update rule's float64 values rounded as stored.
  rs = np.random.default_rng(0)
  # Weights of the study's scale (0.02-0.05) and norms near 1, gradients of
  # many magnitudes, so that some updates round away and others do not.
  w0 = _bf16(rs.normal(0, 0.05, (8, 64)).astype(np.float32))
  n0 = _bf16(1 + rs.normal(0, 0.1, (64,)).astype(np.float32))
  params = {"w": jnp.asarray(w0, jnp.bfloat16),
            "input_layernorm": {"scale": jnp.asarray(n0, jnp.bfloat16)}}
  cfg = _optim(moment_dtype=moment_dtype)
  opt, _ = step_lib.make_optimizer(cfg, 100, "bfloat16")
  state = opt.init(params)

  @jax.jit
  def step(params, state, g):
    updates, state = opt.update(g, state, params)
    return jax.tree.map(lambda p, u: (p.astype(jnp.float32) + u).astype(p.dtype),
                        params, updates), state

  f64 = lambda x: np.asarray(x, np.float64)
  f32 = lambda x: float(np.float32(x))  # a constant as the code's float32
  b1t = b2t = np.float32(1)
  moved = kept = 0
  bf = moment_dtype is None
  for _ in range(6):
    g = {"w": jnp.asarray(rs.normal(0, 1, (8, 64)) *
                          10.0 ** rs.uniform(-4, 0, (8, 64)), jnp.bfloat16),
         "input_layernorm": {"scale": jnp.asarray(rs.normal(0, 1e-2, (64,)),
                                                  jnp.bfloat16)}}
    adam = state[-1][0]
    new_params, state = step(params, state, g)
    new = state[-1][0]
    b1t = np.float32(b1t * np.float32(cfg.b1))
    b2t = np.float32(b2t * np.float32(cfg.b2))
    assert np.float32(new.b1_t) == b1t and np.float32(new.b2_t) == b2t
    c1, c2 = 1 - f64(b1t), 1 - f64(b2t)
    for path, decay in ((("w",), True), (("input_layernorm", "scale"), False)):
      get = lambda t, path=path: functools.reduce(lambda x, k: x[k], path, t)
      gv, m0, v0, p0 = (f64(get(t)) for t in (g, adam.mu, adam.nu, params))
      a, b = f32(cfg.b1) * m0, f32(1 - cfg.b1) * gv
      _check_rounded(get(new.mu), a + b, bf, terms=abs(a) + abs(b))
      _check_rounded(get(new.nu), f32(cfg.b2) * v0 + f32(1 - cfg.b2) * gv * gv,
                     bf)
      m, v = f64(get(new.mu)), f64(get(new.nu))  # read back as stored
      u = (m / c1) / (np.sqrt(v / c2) + f32(cfg.eps))
      if decay:  # no weight decay on norms (make_optimizer's mask)
        u = u + f32(cfg.weight_decay) * p0
      p1 = f64(get(new_params))
      _check_rounded(p1, p0 - f32(cfg.lr) * u,
                     terms=abs(p0) + abs(f32(cfg.lr) * u))
      moved += int((p1 != p0).sum())
      kept += int((p1 == p0).sum())
    params = new_params
  assert params["w"].dtype == jnp.bfloat16
  mu = state[-1][0].mu["w"]
  assert mu.dtype == (jnp.bfloat16 if bf else jnp.float32)
  # Both kinds occur: updates rounded away and updates kept.
  assert moved > 0 and kept > 0


def test_an_update_below_half_a_bf16_step_is_rounded_away():
  # Closed form: Adam's first steps move a weight by about lr (|m / sqrt(v)|
  # = 1 for a constant gradient); bfloat16 spacing at 1.0 is 2^-7, so steps
  # of 1e-4 leave 1.0 exactly where it is, and 1e-2 moves it.
  for lr, moves in ((1e-4, False), (1e-2, True)):
    params = {"w": jnp.ones((4,), jnp.bfloat16)}
    opt, _ = step_lib.make_optimizer(_optim(lr=lr, weight_decay=0.0), 10,
                                     "bfloat16")
    state = opt.init(params)
    for _ in range(10):
      u, state = opt.update({"w": jnp.full((4,), 0.5, jnp.bfloat16)}, state,
                            params)
      params = jax.tree.map(lambda p, d: (p.astype(jnp.float32) + d).astype(
          p.dtype), params, u)
    assert bool((params["w"] != 1.0).all()) == moves, lr


def test_float32_params_keep_optax_adamw():
  # The default path is unchanged: float32 params, no moment_dtype.
  import optax  # pylint: disable=g-import-not-at-top
  params = {"w": jnp.linspace(-1, 1, 8, dtype=jnp.float32)}
  g = {"w": jnp.linspace(0.5, -0.3, 8, dtype=jnp.float32)}
  cfg = _optim(weight_decay=0.0)
  opt, _ = step_lib.make_optimizer(cfg, 10, "float32")
  ref = optax.adamw(cfg.lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=0.0)
  u, _ = opt.update(g, opt.init(params), params)
  r, _ = ref.update(g, ref.init(params), params)
  np.testing.assert_array_equal(u["w"], r["w"])


def test_train_step_keeps_bf16_weights_and_moments():
  cfg = models.ModelConfig(family="llama", vocab_size=64, hidden_size=32,
                           intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2,
                           head_dim=8, max_position_embeddings=64,
                           param_dtype="bfloat16", dtype="bfloat16")
  params = models.init(cfg, jax.random.key(0))
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params))
  opt, sched = step_lib.make_optimizer(_optim(clip_norm=1.0), 10, "bfloat16")
  tokens = jnp.asarray(np.random.default_rng(0).integers(3, 64, (4, 10)),
                       jnp.int32)
  batch = {"tokens": tokens, "attention_mask": jnp.ones_like(tokens),
           "loss_mask": jnp.ones_like(tokens)}

  def loss_fn(p, _, b):
    logits = models.apply(cfg, p, b["tokens"], b["attention_mask"])
    lp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32))
    nll = -jnp.take_along_axis(lp, b["tokens"][:, 1:, None], -1).mean()
    return nll, {"_mean_weight": jnp.float32(1)}

  state = step_lib.new_state(opt, params)
  for accum in (1, 2):
    new, metrics = jax.jit(functools.partial(
        step_lib.train_step, optimizer=opt, schedule=sched, loss_fn=loss_fn,
        grad_accum=accum))(state, None, batch)
    leaves = jax.tree.leaves(new["params"])
    assert all(x.dtype == jnp.bfloat16 for x in leaves)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(
        new["opt_state"][-1][0].mu))
    assert np.isfinite(float(metrics["train/loss"]))
    moved = sum(int((a != b).sum()) for a, b in zip(
        leaves, jax.tree.leaves(params)))
    assert 0 < moved < sum(x.size for x in leaves)


def test_config_refuses_an_unknown_moment_dtype():
  config = config_lib.load_config("configs/distill.py:runlocal")
  config.optim.moment_dtype = "float16"
  with pytest.raises(ValueError, match="optim.moment_dtype"):
    config_lib.validate_run(config)
