"""Peak host memory of load_pretrained, as a multiple of the checkpoint size.

  python -m jaxdistill.bench.loading [--hidden 1536 --layers 8 --dtype float32]

Writes a synthetic Llama-style checkpoint (>= 1 GB by default) with
save_pretrained in one subprocess, then loads it in fresh subprocesses and
reads each one's peak RSS (getrusage ru_maxrss):

  * jaxdistill: models.load_pretrained (streamed, donated block updates);
  * reference: the naive way, safetensors.numpy.load_file then jax.device_put
    of every tensor (measured in the same run for context).

Headline: (peak RSS - RSS after imports) / checkpoint bytes, goal <= 1.3.
The absolute peak / size ratio (imports included) is reported beside it.
Prints one JSON object to stdout; progress goes to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

_CHILD = r"""
import json, os, resource, sys, time
def rss_kb():
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith('VmRSS:'):
        return int(line.split()[1])
import jax, jax.numpy as jnp, numpy as np
from jaxdistill import models
import safetensors.numpy
jax.block_until_ready(jnp.ones(8) + 1)  # initialise the backend
base = rss_kb()
peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
path, mode = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
if mode == 'jaxdistill':
  cfg, params = models.load_pretrained(path)
  leaves = jax.tree.leaves(params)
else:
  tensors = safetensors.numpy.load_file(os.path.join(path, 'model.safetensors'))
  leaves = [jax.device_put(v) for v in tensors.values()]
jax.block_until_ready(leaves)
secs = time.perf_counter() - t0
print(json.dumps(dict(base_kb=base, peak_before_kb=peak_before,
                      peak_kb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      end_kb=rss_kb(), seconds=secs,
                      param_bytes=int(sum(x.nbytes for x in leaves)))))
"""

_WRITE = r"""
import dataclasses, sys, jax, numpy as np
from jaxdistill import models
hidden, layers, dtype = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cfg = dataclasses.replace(
    models.get_preset('llama-3.1-8b'), vocab_size=32000, hidden_size=hidden,
    intermediate_size=hidden * 8 // 3, num_hidden_layers=layers,
    num_attention_heads=hidden // 128, num_key_value_heads=max(1, hidden // 512),
    head_dim=128, dtype=dtype, param_dtype=dtype, bos_token_id=1,
    eos_token_id=(2,))
rng = np.random.default_rng(0)
params = jax.tree.map(
    lambda s: (0.02 * rng.standard_normal(s.shape, np.float32)).astype(s.dtype),
    models.param_shapes(cfg))
# One file, so the naive reference can read it too.
models.save_pretrained(cfg, params, sys.argv[1], max_shard_size=1 << 40)
"""


def _run(code, *args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", code, *map(str, args)],
                       check=True, capture_output=True, text=True, env=env)
  return out.stdout


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--hidden", type=int, default=1536)
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--dtype", default="float32")
  ap.add_argument("--no-reference", action="store_true")
  args = ap.parse_args(argv)

  with tempfile.TemporaryDirectory() as tmp:
    t0 = time.perf_counter()
    _run(_WRITE, tmp, args.hidden, args.layers, args.dtype)
    size = os.path.getsize(os.path.join(tmp, "model.safetensors"))
    print(f"wrote {size / 2**30:.2f} GiB checkpoint in "
          f"{time.perf_counter() - t0:.1f}s", file=sys.stderr)
    results = {}
    for mode in ["jaxdistill"] + ([] if args.no_reference else ["naive"]):
      r = json.loads(_run(_CHILD, tmp, mode))
      r["peak_over_size"] = r["peak_kb"] * 1024 / size
      r["delta_over_size"] = (r["peak_kb"] - r["base_kb"]) * 1024 / size
      results[mode] = r
      print(f"{mode}: peak {r['peak_kb'] / 2**20:.2f} GiB "
            f"(after imports {r['base_kb'] / 2**20:.2f} GiB), "
            f"{r['seconds']:.1f}s", file=sys.stderr)

  ours = results["jaxdistill"]
  report = {
      "headline": {
          "name": "load_pretrained peak RSS growth / checkpoint size",
          "value": round(ours["delta_over_size"], 3),
          "unit": "x",
          "goal": "<= 1.3",
          "meets_goal": ours["delta_over_size"] <= 1.3,
      },
      "checkpoint_bytes": size,
      "checkpoint_gib": round(size / 2**30, 3),
      "config": vars(args),
      "jaxdistill": {
          "peak_rss_over_size_incl_imports": round(ours["peak_over_size"], 3),
          "rss_after_imports_gib": round(ours["base_kb"] / 2**20, 3),
          "peak_rss_gib": round(ours["peak_kb"] / 2**20, 3),
          "load_seconds": round(ours["seconds"], 2),
          "param_bytes": ours["param_bytes"],
      },
  }
  if "naive" in results:
    ref = results["naive"]
    report["naive_reference"] = {
        "what": "safetensors.numpy.load_file + jax.device_put per tensor",
        "peak_rss_growth_over_size": round(ref["delta_over_size"], 3),
        "peak_rss_over_size_incl_imports": round(ref["peak_over_size"], 3),
        "load_seconds": round(ref["seconds"], 2),
    }
  print(json.dumps(report, indent=1))


if __name__ == "__main__":
  main()
