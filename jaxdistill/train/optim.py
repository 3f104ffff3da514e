"""AdamW for weights stored in low precision, with every rounding explicit.

A model loaded in bfloat16 and trained without a float32 master copy (what
`torch.optim.AdamW` does to a bf16 model) keeps its weights, and its two Adam
moments, in bfloat16: an update smaller than half the bf16 spacing near a
weight is rounded away. optax's `adamw` on bf16 params leaves where the
rounding happens to the compiler (XLA may keep fused intermediates in
float32), so the study's precision axis uses this transformation instead:

  g      = float32(grad)                        (after clipping, in float32)
  m      = round_m(b1 * m_prev + (1 - b1) * g)  stored in `moment_dtype`
  v      = round_m(b2 * v_prev + (1 - b2) * g^2)
  update = -lr * (m / c1 / (sqrt(v / c2) + eps) + wd * float32(p))
  p      = round_p(float32(p) + update)         (optax.apply_updates)

all arithmetic in float32, `round_*` the conversion to the stored dtype
(round to nearest even), the moments read back as stored, as an in-place
torch update reads them. c1 = 1 - b1^t and c2 = 1 - b2^t come from running
products b1^t, b2^t kept in the state (one float32 multiply per step, so a
NumPy emulation reproduces them exactly). `moment_dtype` None stores each
moment in its parameter's dtype, as torch does; 'float32' keeps float32
moments beside bf16 weights.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxdistill.choices import MOMENT_DTYPES


class StoredAdamState(NamedTuple):
  b1_t: jax.Array  # b1 ** count, float32
  b2_t: jax.Array
  mu: optax.Params
  nu: optax.Params


def stored_adamw(learning_rate, *, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-8, weight_decay: float = 0.0, mask=None,
                 moment_dtype: str | None = None
                 ) -> optax.GradientTransformation:
  """The update rule of the module docstring as an optax transformation.

  `learning_rate`: a float or an optax schedule of the step count (the
  count before this update, as optax's schedules). `mask(params)`: a pytree
  of bools, True where weight decay applies (None: everywhere).
  """
  if moment_dtype not in MOMENT_DTYPES:
    raise ValueError(f"moment_dtype must be one of {MOMENT_DTYPES}, got "
                     f"{moment_dtype!r}")
  f32 = jnp.float32
  sched = learning_rate if callable(learning_rate) else (
      lambda _: learning_rate)

  def dtype_of(p):
    return jnp.dtype(moment_dtype) if moment_dtype else p.dtype

  def init(params):
    zeros = lambda p: jnp.zeros(p.shape, dtype_of(p))
    return (StoredAdamState(b1_t=jnp.ones((), f32), b2_t=jnp.ones((), f32),
                            mu=jax.tree.map(zeros, params),
                            nu=jax.tree.map(zeros, params)),
            optax.ScaleByScheduleState(count=jnp.zeros((), jnp.int32)))

  def update(grads, state, params):
    if params is None:
      raise ValueError("stored_adamw needs the params (weight decay, dtypes)")
    adam, count = state
    b1_t, b2_t = adam.b1_t * f32(b1), adam.b2_t * f32(b2)
    c1, c2 = f32(1) - b1_t, f32(1) - b2_t
    lr = jnp.asarray(sched(count.count), f32)
    decay = (jax.tree.map(lambda _: True, params) if mask is None
             else mask(params))

    def one(g, m, v, p, d):
      g = g.astype(f32)
      m = (f32(b1) * m.astype(f32) + f32(1 - b1) * g).astype(m.dtype)
      v = (f32(b2) * v.astype(f32) + f32(1 - b2) * g * g).astype(v.dtype)
      u = (m.astype(f32) / c1) / (jnp.sqrt(v.astype(f32) / c2) + f32(eps))
      if weight_decay and d:
        u = u + f32(weight_decay) * p.astype(f32)
      return -lr * u, m, v

    out = jax.tree.map(one, grads, adam.mu, adam.nu, params, decay)
    treedef = jax.tree.structure(grads)
    leaves = treedef.flatten_up_to(out)
    updates, mu, nu = (treedef.unflatten([x[i] for x in leaves])
                       for i in range(3))
    return updates, (StoredAdamState(b1_t, b2_t, mu, nu),
                     optax.ScaleByScheduleState(
                         count=optax.safe_increment(count.count)))

  return optax.GradientTransformation(init, update)


def to_float32() -> optax.GradientTransformation:
  """Casts the gradients to float32 (so that clipping and the moments see
  float32 values whatever the params' dtype)."""
  return optax.stateless(
      lambda updates, params=None: jax.tree.map(
          lambda g: g.astype(jnp.float32), updates))
