"""Fused hidden-state path == plain logits path (values and gradients)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdistill import losses
from jaxdistill import sharding
from jaxdistill.losses import fused as fused_lib
from tests.losses import reference as ref


def _inputs(seed, b=2, t=13, d_s=32, d_t=24, v_s=64, v_t=72):
  rng = np.random.default_rng(seed)
  hs = rng.standard_normal((b, t, d_s)).astype(np.float32)
  ws = (rng.standard_normal((d_s, v_s)) / np.sqrt(d_s)).astype(np.float32)
  ht = rng.standard_normal((b, t, d_t)).astype(np.float32)
  wt = (2 * rng.standard_normal((d_t, v_t)) / np.sqrt(d_t)).astype(np.float32)
  mask = rng.random((b, t)) < 0.7
  mask[0, :3] = False  # a prompt
  return hs, ws, ht, wt, mask


def _plain(hs, ws, ht, wt, mask, **kw):
  f = lambda hs, ws: losses.divergence(hs @ ws, ht @ wt, mask, **kw)
  return jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(hs, ws)


def _fused(hs, ws, ht, wt, mask, **kw):
  f = lambda hs, ws: losses.fused_divergence(hs, ws, ht, wt, mask, **kw)
  return jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(hs, ws)


# platform: the CPU program (chunks sliced from [B, T], the last one moved
# back to end at T), or the one for accelerators (a scan over zero-padded
# chunks), run here on CPU as a TPU program traced on a CPU host would be.
@pytest.mark.parametrize("kind,beta,reduction,chunk,platform", [
    ("forward", 0.5, "token_mean", 4, "cpu"),  # 4 chunks, the last partial
    ("forward", 0.5, "token_mean", 4, "tpu"),
    ("reverse", 0.5, "sequence_mean", 5, "cpu"),
    ("reverse", 0.5, "sequence_mean", 5, "tpu"),
    ("jsd", 0.3, "sum", 16, "cpu"),            # one chunk longer than T
    ("jsd", 0.3, "sum", 16, "tpu"),
    ("forward", 0.5, "sequence_sum", 4, "cpu"),
])
def test_fused_matches_plain(kind, beta, reduction, chunk, platform):
  hs, ws, ht, wt, mask = _inputs(0)
  kw = dict(kind=kind, beta=beta, temperature=0.8, reduction=reduction,
            vocab_size=60)  # both heads carry padding columns
  (l1, m1), (gh1, gw1) = _plain(hs, ws, ht, wt, mask, **kw)
  with sharding.compiling_for(platform):
    (l2, m2), (gh2, gw2) = _fused(hs, ws, ht, wt, mask, chunk_size=chunk,
                                  **kw)
  np.testing.assert_allclose(l2, l1, rtol=1e-5, atol=1e-6)
  scale_h, scale_w = np.abs(gh1).max(), np.abs(gw1).max()
  np.testing.assert_allclose(gh2, gh1, atol=1e-5 * scale_h)
  np.testing.assert_allclose(gw2, gw1, atol=1e-5 * scale_w)
  np.testing.assert_array_equal(gw2[:, 60:], 0.0)
  assert m1.keys() == m2.keys()
  for k in m1:
    np.testing.assert_allclose(m2[k], m1[k], rtol=1e-5, err_msg=k)
  # And against float64 NumPy directly.
  z = hs.astype(np.float64) @ ws.astype(np.float64)
  u = ht.astype(np.float64) @ wt.astype(np.float64)
  d = ref.divergences(z[..., :60], u[..., :60], 0.8, beta)
  want = np.sum(ref.weights(mask, reduction) * d[kind])
  np.testing.assert_allclose(l2, want, rtol=1e-5)


def test_head_gradient_slab_counts():
  # The accelerator cases above run both of its head-gradient paths: chunks
  # of 2 x 4 and 2 x 5 tokens with D = 32 use the slab loop, 2 x 16 tokens
  # the one-piece update.
  assert fused_lib._head_slabs(32, 64, 2 * 4) == 4
  assert fused_lib._head_slabs(32, 64, 2 * 5) == 4
  assert fused_lib._head_slabs(32, 64, 2 * 16) == 1
  assert fused_lib._head_slabs(32, 60, 8) == 1  # width not divisible by 16
  # Qwen2.5-0.5B head at the default chunk: 8 slabs of 16 x 1187 columns.
  assert fused_lib._head_slabs(896, 151936, losses.DEFAULT_CHUNK_SIZE) == 8


def test_value_only_call_cotangent_and_teacher_gradient():
  hs, ws, ht, wt, mask = _inputs(2)

  def fn(hs, ws, ht, wt):
    fused = lambda *a: losses.fused_divergence(*a, mask, kind="reverse",
                                               vocab_size=60, chunk_size=8)
    plain = lambda hs, ws, ht, wt: losses.reverse_kl(hs @ ws, ht @ wt, mask,
                                                     vocab_size=60)
    return (fused(hs, ws, ht, wt),  # no gradient requested: the primal scan
            plain(hs, ws, ht, wt)[0],
            # The custom VJP scales its stored gradients by the cotangent.
            jax.grad(lambda h: 3.0 * fused(h, ws, ht, wt)[0])(hs),
            jax.grad(lambda h: 3.0 * plain(h, ws, ht, wt)[0])(hs),
            jax.grad(lambda a, b: fused(hs, ws, a, b)[0], argnums=(0, 1))(ht, wt))

  (loss, metrics), want, g3, want_g3, g_teacher = jax.jit(fn)(hs, ws, ht, wt)
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  assert float(metrics["distill/tokens"]) == mask.sum()
  np.testing.assert_allclose(g3, want_g3, atol=1e-5 * np.abs(want_g3).max())
  for g in g_teacher:
    np.testing.assert_array_equal(g, 0.0)


def test_bfloat16_and_empty_mask():
  hs, ws, ht, wt, mask = _inputs(4)
  cast = lambda x: jnp.asarray(x, jnp.bfloat16)
  (loss, _), (gh, gw) = _fused(cast(hs), cast(ws), cast(ht), cast(wt), mask,
                               vocab_size=60, chunk_size=4)
  assert gh.dtype == jnp.bfloat16 and gw.dtype == jnp.bfloat16
  assert np.isfinite(loss)
  assert np.all(np.isfinite(np.asarray(gh, np.float32)))
  f64 = lambda x: np.asarray(cast(x), np.float64)
  d = ref.divergences((f64(hs) @ f64(ws))[..., :60], (f64(ht) @ f64(wt))[..., :60])
  want = np.sum(ref.weights(mask, "token_mean") * d["forward"])
  np.testing.assert_allclose(loss, want, rtol=1e-4)  # bf16 products, f32 sums
  (loss, metrics), (gh, gw) = _fused(hs, ws, ht, wt, np.zeros_like(mask),
                                     vocab_size=60, chunk_size=4)
  assert float(loss) == 0.0 and np.all(gh == 0) and np.all(gw == 0)
  assert all(float(v) == 0.0 for v in metrics.values())


@pytest.mark.parametrize("chunk,platform", [
    (4, "cpu"), (4, "tpu"), (16, "tpu")])  # tpu: slab loop, one-piece update
def test_nan_hidden_at_masked_positions_gives_finite_gradients(chunk, platform):
  hs, ws, ht, wt, mask = _inputs(5)
  hs, ht = hs.copy(), ht.copy()
  hs[~mask] = np.nan
  ht[~mask] = np.inf
  kw = dict(kind="forward", temperature=0.7, reduction="token_mean",
            vocab_size=60, chunk_size=chunk)
  with sharding.compiling_for(platform):
    (loss, _), (gh, gw) = _fused(hs, ws, ht, wt, mask, **kw)
  # Float64 reference: masked positions do not enter the loss at all, so the
  # head gradient is sum over response tokens of w h^T (q - p) / tau.
  h64 = np.where(mask[..., None], hs, 0.0).astype(np.float64)
  t64 = np.where(mask[..., None], ht, 0.0).astype(np.float64)
  z, u = h64 @ ws.astype(np.float64), t64 @ wt.astype(np.float64)
  d = ref.divergences(z[..., :60], u[..., :60], 0.7)
  w = ref.weights(mask, "token_mean")
  np.testing.assert_allclose(loss, np.sum(w * d["forward"]), rtol=1e-5)
  dz = w[..., None] * (d["q"] - d["p"]) / 0.7  # [B, T, 60]
  want_w = np.einsum("btd,btv->dv", h64, dz)
  want_h = np.einsum("btv,dv->btd", dz, ws[:, :60].astype(np.float64))
  assert np.all(np.isfinite(gw)) and np.all(np.isfinite(gh))
  np.testing.assert_allclose(gw[:, :60], want_w, atol=1e-5 * np.abs(want_w).max())
  np.testing.assert_array_equal(gw[:, 60:], 0.0)
  np.testing.assert_allclose(gh, want_h, atol=1e-5 * np.abs(want_h).max())
