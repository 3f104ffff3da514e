"""Loading straight onto an 8-device (fsdp x tensor) CPU mesh."""
import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import torch

from jaxdistill import models
from jaxdistill import sharding


def test_sharded_load_gives_same_logits(tiny_ckpt, hf_model):
  assert jax.device_count() == 8  # tests/conftest.py
  mesh = sharding.make_mesh({"fsdp": 2, "tensor": 4})
  path = tiny_ckpt("qwen2_untied")
  # A small chunk_bytes streams the biggest leaves (embedding, head, MLP)
  # through donated block updates; the rest is assembled on the host.
  cfg, params = models.load_pretrained(path, mesh=mesh, chunk_bytes=50_000)

  q = params["layers"]["self_attn"]["q_proj"]["kernel"]  # [L, D, N, H]
  assert q.sharding.spec == P(None, "fsdp", "tensor", None)
  head = params["lm_head"]["kernel"]  # [D, V]
  assert head.sharding.spec == P("fsdp", "tensor")
  # Each device holds only its shard: 1/8 of the head.
  assert head.addressable_shards[0].data.size * 8 == head.size
  # 2 KV heads do not divide the 4-way tensor axis: replicated there.
  assert params["layers"]["self_attn"]["k_proj"]["kernel"].sharding.spec == P(
      None, "fsdp", None, None)

  tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (2, 24))
  tokens = jax.device_put(tokens.astype(np.int32),
                          sharding.batch_sharding(mesh, 2, sharding.DEFAULT_RULES))
  ours = np.asarray(jax.jit(models.apply, static_argnums=0)(cfg, params, tokens))
  with torch.no_grad():
    ref = hf_model(path)(torch.tensor(np.asarray(tokens), dtype=torch.long)).logits
  assert np.abs(ours - ref.numpy()).max() <= 1e-4

  # Same values as an unsharded load.
  _, local = models.load_pretrained(path)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(local)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert all(isinstance(x.sharding, NamedSharding)
             for x in jax.tree.leaves(params))
