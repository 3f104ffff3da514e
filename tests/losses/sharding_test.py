"""On 8 simulated CPU devices, sharded losses equal unsharded ones."""
import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from jaxdistill import losses
from jaxdistill.losses import fused as fused_lib
from jaxdistill.sharding import make_mesh

BATCH = ("data", "fsdp")


@pytest.fixture(scope="module")
def mesh():
  if jax.device_count() < 8:
    raise RuntimeError("tests/conftest.py should provide 8 CPU devices")
  return make_mesh({"data": 2, "fsdp": 2, "tensor": 2})


def _compare(mesh, fn, args, specs):
  """fn (value_and_grad) under jit with and without input shardings."""
  want = jax.jit(fn)(*args)
  shard = tuple(NamedSharding(mesh, s) for s in specs)
  placed = [jax.device_put(a, s) for a, s in zip(args, shard)]
  got = jax.jit(fn, in_shardings=shard)(*placed)
  assert placed[0].sharding.spec == specs[0]
  jax.tree.map(lambda g, w: np.testing.assert_allclose(
      g, w, rtol=1e-5, atol=1e-6 * max(1.0, float(np.abs(w).max()))), got, want)


KINDS = (("forward", 0.5), ("reverse", 0.5), ("jsd", 0.4))


def test_plain_sharded_batch_and_vocab(mesh):
  rng = np.random.default_rng(0)
  z = rng.standard_normal((4, 6, 32)).astype(np.float32)
  u = rng.standard_normal((4, 6, 40)).astype(np.float32)
  mask = rng.random((4, 6)) < 0.7

  def fn(z, u, mask):  # all kinds in one program: one compile per layout
    out = []
    for kind, beta in KINDS:
      f = lambda z: losses.divergence(z, u, mask, kind=kind, beta=beta,
                                      temperature=0.9, vocab_size=30,
                                      reduction="sequence_mean")
      out.append(jax.value_and_grad(f, has_aux=True)(z))
    return out

  _compare(mesh, fn, (z, u, mask),
           (P(BATCH, None, "tensor"), P(BATCH, None, "tensor"), P(BATCH, None)))


def test_fused_sharded_heads_on_tensor(mesh):
  rng = np.random.default_rng(1)
  hs = rng.standard_normal((4, 6, 16)).astype(np.float32)
  ws = (rng.standard_normal((16, 64)) / 4).astype(np.float32)
  ht = rng.standard_normal((4, 6, 8)).astype(np.float32)
  wt = (rng.standard_normal((8, 64)) / 3).astype(np.float32)
  mask = rng.random((4, 6)) < 0.7

  def fn(hs, ws, ht, wt, mask):
    out = []
    for kind, beta in KINDS[::2]:
      f = lambda hs, ws: losses.fused_divergence(
          hs, ws, ht, wt, mask, kind=kind, beta=beta, vocab_size=62,
          chunk_size=2)
      out.append(jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(hs, ws))
    return out

  # 4 x 2 tokens per chunk and D = 16: the head gradient runs in 2 slabs
  # (16 groups x 2 slabs x 2 columns), with the vocab axis split over 'tensor'.
  _compare(mesh, fn, (hs, ws, ht, wt, mask),
           (P(BATCH, None, None), P(None, "tensor"), P(BATCH, None, None),
            P(None, "tensor"), P(BATCH, None)))


def test_fused_vocab_parallel_equals_unsharded(mesh):
  """The accelerator path with `shard` (vocab-parallel: chunks gathered,
  heads, logits and head gradient split over the 8 devices) gives the
  numbers of the same path without constraints, from heads laid out as FSDP
  holds them (embed over 'fsdp')."""
  from jaxdistill import sharding  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(2)
  hs = rng.standard_normal((4, 6, 16)).astype(np.float32)
  ws = (rng.standard_normal((16, 64)) / 4).astype(np.float32)
  ht = rng.standard_normal((4, 6, 8)).astype(np.float32)
  wt = (rng.standard_normal((8, 72)) / 3).astype(np.float32)
  mask = rng.random((4, 6)) < 0.7
  shard = sharding.Activations(mesh, sharding.DEFAULT_RULES)

  def fn(hs, ws, ht, wt, mask, shard=None):
    out = []
    for kind, beta in KINDS:
      f = lambda hs, ws: losses.fused_divergence(
          hs, ws, ht, wt, mask, kind=kind, beta=beta, temperature=0.9,
          teacher_temperature=0.5, vocab_size=62, chunk_size=2,
          reduction="sequence_mean", shard=shard)
      out.append(jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(hs, ws))
    return out

  args = (hs, ws, ht, wt, mask)
  specs = (P(BATCH, None, None), P("fsdp", None), P(BATCH, None, None),
           P("fsdp", None), P(BATCH, None))
  with sharding.compiling_for("tpu"):
    want = jax.jit(fn)(*args)
    placed = [jax.device_put(a, NamedSharding(mesh, s))
              for a, s in zip(args, specs)]
    lowered = jax.jit(lambda *a: fn(*a, shard=shard)).lower(*placed)
    got = lowered.compile()(*placed)
  # 4 x 2 tokens per chunk, D = 16: 2 slabs of 16 groups, the groups split
  # over data x fsdp x tensor = 8 devices.
  assert fused_lib._layout(shard, 64, 16, 8).axes == ("data", "fsdp", "tensor")
  assert '{"data", "fsdp", "tensor"}]>' in lowered.as_text()  # a vocab dim
  assert "all-gather" in lowered.compile().as_text()  # the chunks
  jax.tree.map(lambda g, w: np.testing.assert_allclose(
      g, w, rtol=1e-5, atol=1e-6 * max(1.0, float(np.abs(w).max()))), got, want)
