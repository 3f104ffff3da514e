"""Benchmarks: `python -m jaxdistill.bench.NAME` prints one JSON object with a
`headline` {name, value, unit, goal, meets_goal} beside the details."""
import os
import sys
import tempfile
import time

import numpy as np

from jaxdistill import models as models_lib  # not `models`: bench.models is a module
from jaxdistill.bench import profile


def torch_llama(cfg):
  """transformers' LlamaForCausalLM with `cfg`'s shapes (our config written as
  HF's by models.config_to_hf), float32, sdpa attention, an untied head, and
  random weights from torch seed 0: the PyTorch reference the benchmarks time."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  c = transformers.LlamaConfig.from_dict(
      dict(models_lib.config_to_hf(cfg), tie_word_embeddings=False))
  c._attn_implementation = "sdpa"  # pylint: disable=protected-access
  torch.manual_seed(0)
  return transformers.LlamaForCausalLM(c).float()


def median_time(fn, warmup=1, iters=5):
  """(median seconds, all timings) of `fn()` over `iters` calls after `warmup`."""
  for _ in range(warmup):
    fn()
  ts = []
  for _ in range(iters):
    t0 = time.perf_counter()
    fn()
    ts.append(time.perf_counter() - t0)
  return float(np.median(ts)), ts


def profile_dump(enabled: bool):
  """For a benchmark's --profile: a temporary directory that XLA dumps the
  optimized HLO of every program into (bench.profile reads each op's source
  from it), or None. Call before JAX starts its backend: the flags are read
  then."""
  if not enabled:
    return None
  d = tempfile.TemporaryDirectory()
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " +
                             profile.dump_flags(d.name))
  return d


def profile_section(dump_dir, make):
  """The `profile` section of a benchmark's JSON: None without --profile
  (dump_dir None), else make(dump_dir), or the error it raised (a profile is
  an extra: a device whose trace cannot be read must not cost the benchmark
  its figures)."""
  if dump_dir is None:
    return None
  try:
    return make(dump_dir)
  except Exception as e:  # pylint: disable=broad-except
    print(f"profile failed: {e!r}", file=sys.stderr, flush=True)
    return {"error": repr(e)[:500]}
