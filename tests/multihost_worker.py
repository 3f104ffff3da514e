"""One process of tests/multihost_test.py's data-path check (not a test file).

  python tests/multihost_worker.py PROCESS_ID PORT OUT_JSON

Joins a 2-process JAX cluster on 127.0.0.1:PORT, places a known global batch
with sharding.put_global (the path of train_data.SequenceMaker and
rl.step.Collector) on three meshes, and writes, per mesh, the rows each of
its devices holds, their values, and a global sum computed on the mesh.
"""
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import sharding


def main(pid, port, out):
  jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2,
                             process_id=pid)
  devs = sorted(jax.devices(), key=lambda d: d.id)
  # Each process's devices at alternate positions of the fsdp axis.
  interleaved = [d for pair in zip(*[[d for d in devs if d.process_index == p]
                                     for p in (0, 1)]) for d in pair]
  meshes = {
      "fsdp": sharding.make_mesh({"data": 1, "fsdp": -1, "tensor": 1}),
      "data2_fsdp2_tensor2": sharding.make_mesh(
          {"data": 2, "fsdp": 2, "tensor": 2}),
      "tensor_only": sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": -1}),
      "interleaved": sharding.make_mesh({"data": 1, "fsdp": -1, "tensor": 1},
                                        devices=interleaved),
  }
  x = np.arange(8 * 3, dtype=np.int32).reshape(8, 3) * 7 + 1  # the batch
  res = {}
  for name, mesh in meshes.items():
    arr = sharding.put_global(
        x, sharding.batch_sharding(mesh, 2, sharding.DEFAULT_RULES))
    shards = []
    for s in arr.addressable_shards:
      rows = list(range(8))[s.index[0]]
      shards.append({"device": s.device.id, "rows": rows,
                     "data": np.asarray(s.data).tolist()})
    total = jax.jit(lambda a: jnp.sum(a * a),
                    out_shardings=sharding.replicated(mesh))(arr)
    res[name] = {"shards": shards, "sum_sq": int(total.addressable_data(0)),
                 "to_host": sharding.to_host(arr).tolist()}
  with open(out, "w") as f:
    json.dump({"process_index": jax.process_index(),
               "process_count": jax.process_count(),
               "local_devices": [d.id for d in jax.local_devices()],
               "meshes": res}, f)


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
