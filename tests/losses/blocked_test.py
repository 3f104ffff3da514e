"""The CPU row-blocked divergence (several [rows, V] blocks in a lax.map) gives
the float64 reference values and closed-form gradients, like one block."""
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdistill import losses
from jaxdistill.losses import _common as c
from tests.losses import reference as ref

# The module (jaxdistill.losses exports a function of the same name).
div_lib = importlib.import_module("jaxdistill.losses.divergence")

B, T, V = 2, 6, 7


@pytest.fixture
def blocked(monkeypatch):
  # 2 rows of [V] float32 per block: 6 blocks of the 12 rows.
  monkeypatch.setattr(div_lib, "_CPU_UNBLOCKED_BYTES", 0)
  monkeypatch.setattr(div_lib, "_CPU_BLOCK_BYTES", 2 * 4 * V)


@pytest.mark.parametrize("kind,beta", [("forward", 0.5), ("reverse", 0.5),
                                       ("jsd", 0.3)])
def test_blocked_matches_reference(blocked, kind, beta):
  del blocked
  assert div_lib._row_block(B * T, V) == 2  # pylint: disable=protected-access
  rng = np.random.default_rng(0)
  z = (2 * rng.standard_normal((B, T, V))).astype(np.float32)
  u = (2 * rng.standard_normal((B, T, V))).astype(np.float32)
  mask = rng.random((B, T)) < 0.7
  mask[0, 0] = True
  z[1, -1] = np.nan  # garbage at a masked position stays out
  mask[1, -1] = False
  f = jax.jit(jax.value_and_grad(
      lambda z: losses.divergence(z, u, mask, kind=kind, beta=beta,
                                  temperature=0.8, reduction="sequence_mean"),
      has_aux=True))
  (loss, metrics), g = f(jnp.asarray(z))
  zc = np.where(mask[..., None], z, 0.0)
  d = ref.divergences(zc, u, 0.8, beta)
  w = ref.weights(mask, "sequence_mean")
  np.testing.assert_allclose(loss, np.sum(w * np.where(mask, d[kind], 0.0)),
                             rtol=2e-6)
  n = mask.sum()
  np.testing.assert_allclose(metrics["distill/fkl"],
                             np.sum(np.where(mask, d["forward"], 0.0)) / n,
                             rtol=2e-6)
  assert np.all(np.isfinite(g)) and np.all(g[~mask] == 0.0)
  if kind != "jsd":
    want = ref.grad_closed_form(zc, u, mask, kind, "sequence_mean", 0.8)
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=2e-7)


# The fused path on CPU: chunks of 3 positions of T = 7 (the last one moved
# back over positions 4 and 5, which the second chunk took), 2 of the chunk's
# 2 x 3 rows per block of the per-token terms, and head-gradient slabs of 24
# of the 64 head columns (the last one moved back over columns 40-47).
fused_lib = importlib.import_module("jaxdistill.losses.fused")
FT, D_S, D_T, W, VOCAB = 7, 16, 8, 64, 60


@pytest.fixture
def fused_blocked(monkeypatch):
  monkeypatch.setattr(fused_lib, "_CPU_UNBLOCKED_BYTES", 0)
  monkeypatch.setattr(fused_lib, "_CPU_BLOCK_BYTES", 2 * 4 * W)
  monkeypatch.setattr(fused_lib, "_CPU_SLAB_BYTES", 24 * 4 * D_S)


def _fused_inputs(seed):
  rng = np.random.default_rng(seed)
  hs = rng.standard_normal((B, FT, D_S)).astype(np.float32)
  ws = (rng.standard_normal((D_S, W)) / 2).astype(np.float32)
  ht = rng.standard_normal((B, FT, D_T)).astype(np.float32)
  wt = (rng.standard_normal((D_T, W + 8)) / 2).astype(np.float32)
  mask = rng.random((B, FT)) < 0.7
  mask[:, 4:6] = True  # the positions both of the last two chunks hold
  mask[1, 0] = False
  hs[~mask] = np.nan  # garbage at masked positions stays out
  return hs, ws, ht, wt, mask


@pytest.mark.parametrize("kind,beta", [("forward", 0.5), ("reverse", 0.5),
                                       ("jsd", 0.3)])
def test_fused_blocked_matches_reference(fused_blocked, kind, beta):
  del fused_blocked
  assert c.cpu_row_block(B * 3, W, fused_lib._CPU_BLOCK_BYTES,  # pylint: disable=protected-access
                         fused_lib._CPU_UNBLOCKED_BYTES) == 2  # pylint: disable=protected-access
  assert fused_lib._cpu_slab(D_S, W) == 24  # pylint: disable=protected-access
  hs, ws, ht, wt, mask = _fused_inputs(1)
  kw = dict(kind=kind, beta=beta, temperature=0.8, reduction="sequence_mean",
            vocab_size=VOCAB, chunk_size=3)
  f = lambda hs, ws: losses.fused_divergence(hs, ws, ht, wt, mask, **kw)
  (loss, metrics), (gh, gw) = jax.jit(jax.value_and_grad(
      f, argnums=(0, 1), has_aux=True))(hs, ws)
  value_only = jax.jit(f)(hs, ws)[0]
  # Float64 references: masked positions do not enter at all.
  h64 = np.where(mask[..., None], hs, 0.0).astype(np.float64)
  z = (h64 @ ws.astype(np.float64))[..., :VOCAB]
  u = (ht.astype(np.float64) @ wt.astype(np.float64))[..., :VOCAB]
  d = ref.divergences(z, u, 0.8, beta)
  w = ref.weights(mask, "sequence_mean")
  want = np.sum(w * np.where(mask, d[kind], 0.0))
  np.testing.assert_allclose(loss, want, rtol=2e-6)
  np.testing.assert_allclose(value_only, want, rtol=2e-6)
  np.testing.assert_allclose(metrics["distill/rkl"],
                             np.sum(np.where(mask, d["reverse"], 0.0)) / mask.sum(),
                             rtol=2e-6)
  assert np.all(np.isfinite(gh)) and np.all(gh[~mask] == 0.0)
  np.testing.assert_array_equal(gw[:, VOCAB:], 0.0)
  if kind == "jsd":
    return  # its closed form is checked against autodiff in divergence_test
  dz = ref.grad_closed_form(z, u, mask, kind, "sequence_mean", 0.8)
  dz = np.where(mask[..., None], dz, 0.0)
  want_w = np.einsum("btd,btv->dv", h64, dz)
  want_h = np.einsum("btv,dv->btd", dz, ws[:, :VOCAB].astype(np.float64))
  np.testing.assert_allclose(gw[:, :VOCAB], want_w,
                             atol=1e-5 * np.abs(want_w).max())
  np.testing.assert_allclose(gh, want_h, atol=1e-5 * np.abs(want_h).max())


def test_fused_cpu_keeps_two_chunk_products(monkeypatch):
  # Value and gradient of a chunk of N = 16 rows x V = 8192 columns hold the
  # student's and the teacher's products [N, V] (the logit gradient is
  # written over the student's) and row-sized blocks: no third [N, V] array.
  n_rows, vocab, d = 16, 8192, 16
  monkeypatch.setattr(fused_lib, "_CPU_UNBLOCKED_BYTES", 0)
  monkeypatch.setattr(fused_lib, "_CPU_BLOCK_BYTES", 4 * vocab)
  monkeypatch.setattr(fused_lib, "_CPU_SLAB_BYTES", 4 * d * 256)
  f = jax.value_and_grad(lambda hs, ws, ht, wt, m: losses.fused_divergence(
      hs, ws, ht, wt, m, chunk_size=n_rows)[0], argnums=(0, 1))
  sd = jax.ShapeDtypeStruct
  f32 = jnp.float32
  args = (sd((1, 4 * n_rows, d), f32), sd((d, vocab), f32),
          sd((1, 4 * n_rows, d), f32), sd((d, vocab), f32),
          sd((1, 4 * n_rows), jnp.bool_))
  temp = jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes
  block = n_rows * vocab * 4
  assert 2 * block <= temp < 2.5 * block, temp / block
