"""Benchmark: fused vs naive forward-KL value+gradient at Qwen2.5-0.5B scale.

  python -m jaxdistill.bench.losses                 # B=1, T=4096, V=151,936, D=896
  python -m jaxdistill.bench.losses --tokens 512 --rounds 1   # quick look

Both paths compute the forward KL between student and teacher heads applied
to hidden states, and its gradient w.r.t. the student hidden states and head:
  naive: logits = hidden @ head (both models) -> losses.forward_kl
  fused: losses.fused_divergence (chunks of `--chunk-size` positions)

Memory is measured two ways, both reported:
  * compiled: XLA's memory_analysis() of the jitted value-and-grad executable,
    argument + output + temp bytes (what the program needs; deterministic).
    This is the headline: fused total / naive total.
  * rss: peak resident set size of a separate worker process per path
    (ru_maxrss), also minus the RSS measured just before the compiled call
    (which already holds the inputs and the JAX runtime).
Time: the same workers time the compiled call (after compilation, which is
reported apart), as wall time and as process CPU time; naive and fused
workers alternate, `--rounds` times, and ratios of medians are reported. On a
shared machine the wall time also measures the other load (the load average
is reported), so the CPU-time ratio is the steadier of the two; absolute
times are context only. Inputs are float32 (CPU has no fast bfloat16 matmul).

If a timed worker dies (the naive program needs ~15 GB at T=4096, and the OOM
killer takes it on a small or shared machine), the timing and RSS pair is
rerun at half the tokens ('timed_at_tokens', 'timing_failures'); the compiled
memory is always at the full size.

Prints one JSON object on stdout; progress goes to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import losses
from jaxdistill.losses import DEFAULT_CHUNK_SIZE


def _log(*a):
  print(*a, file=sys.stderr, flush=True)


def _build(path, batch, tokens, vocab, d_model, chunk_size):
  """(jitted value_and_grad fn, argument ShapeDtypeStructs)."""


  def naive(hs, ws, ht, wt, mask):
    return losses.forward_kl(hs @ ws, ht @ wt, mask)[0]

  def fused(hs, ws, ht, wt, mask):
    return losses.fused_divergence(hs, ws, ht, wt, mask,
                                   chunk_size=chunk_size)[0]

  fn = jax.jit(jax.value_and_grad(naive if path == "naive" else fused,
                                  argnums=(0, 1)))
  f32 = jnp.float32
  shapes = (jax.ShapeDtypeStruct((batch, tokens, d_model), f32),
            jax.ShapeDtypeStruct((d_model, vocab), f32),
            jax.ShapeDtypeStruct((batch, tokens, d_model), f32),
            jax.ShapeDtypeStruct((d_model, vocab), f32),
            jax.ShapeDtypeStruct((batch, tokens), jnp.bool_))
  return fn, shapes


def compiled_memory(path, batch, tokens, vocab, d_model, chunk_size):
  fn, shapes = _build(path, batch, tokens, vocab, d_model, chunk_size)
  t0 = time.perf_counter()
  ma = fn.lower(*shapes).compile().memory_analysis()
  out = {
      "argument_bytes": int(ma.argument_size_in_bytes),
      "output_bytes": int(ma.output_size_in_bytes),
      "temp_bytes": int(ma.temp_size_in_bytes),
      "alias_bytes": int(ma.alias_size_in_bytes),
      "compile_s": time.perf_counter() - t0,
  }
  out["total_bytes"] = (out["argument_bytes"] + out["output_bytes"]
                        + out["temp_bytes"] - out["alias_bytes"])
  return out


def _rss_bytes():
  # Current RSS (ru_maxrss only gives the peak).
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(args):
  """Runs one path in this process; prints a JSON line with times and RSS."""

  fn, shapes = _build(args.worker, args.batch, args.tokens, args.vocab,
                      args.d_model, args.chunk_size)
  # Made on the device by jitted code: no host copies inflate the peak RSS.
  # Head scale 1/sqrt(D) keeps logits O(1), as for a trained model.
  scale = [1.0, args.d_model ** -0.5, 1.0, args.d_model ** -0.5]
  keys = jax.random.split(jax.random.key(0), 4)
  inputs = [jax.jit(lambda k, s=s, c=c: c * jax.random.normal(k, s.shape, s.dtype))(k)
            for k, s, c in zip(keys, shapes[:4], scale)]
  inputs.append(jax.numpy.ones(shapes[4].shape, bool))
  t0 = time.perf_counter()
  compiled = fn.lower(*shapes).compile()
  compile_s = time.perf_counter() - t0
  rss_before = _rss_bytes()
  times, cpu_times = [], []
  for _ in range(args.repeats):
    t0, c0 = time.perf_counter(), time.process_time()
    loss, grads = jax.block_until_ready(compiled(*inputs))
    times.append(time.perf_counter() - t0)
    cpu_times.append(time.process_time() - c0)
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  print(json.dumps({
      "path": args.worker, "times_s": times, "cpu_times_s": cpu_times,
      "compile_s": compile_s,
      "loss": float(loss), "grad_norm": float(np.sqrt(sum(
          float(np.sum(np.square(np.asarray(g, np.float64)))) for g in grads))),
      "peak_rss_bytes": peak, "rss_before_call_bytes": rss_before,
  }))


def _run_worker(path, args, tokens):
  cmd = [sys.executable, "-m", "jaxdistill.bench.losses", "--worker", path,
         "--batch", str(args.batch), "--tokens", str(tokens),
         "--vocab", str(args.vocab), "--d-model", str(args.d_model),
         "--chunk-size", str(args.chunk_size), "--repeats", str(args.repeats)]
  _log("running", " ".join(cmd[2:]))
  res = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if res.returncode:
    # -9 (SIGKILL) with no traceback is the kernel's OOM killer.
    raise RuntimeError(f"worker {path} failed with return code "
                       f"{res.returncode}:\n{res.stderr[-3000:]}")
  return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--batch", type=int, default=1)
  p.add_argument("--tokens", type=int, default=4096)
  p.add_argument("--vocab", type=int, default=151936)
  p.add_argument("--d-model", type=int, default=896)
  p.add_argument("--chunk-size", type=int, default=None,
                 help="default: losses.DEFAULT_CHUNK_SIZE")
  p.add_argument("--sweep", default="32,64,128,256,512",
                 help="chunk sizes whose compiled memory is reported")
  p.add_argument("--rounds", type=int, default=2,
                 help="alternating naive/fused worker pairs")
  p.add_argument("--repeats", type=int, default=1,
                 help="timed calls per worker")
  p.add_argument("--min-time-tokens", type=int, default=1024,
                 help="smallest T to fall back to when a timed worker dies")
  p.add_argument("--worker", choices=("naive", "fused"), help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.chunk_size is None:
    args.chunk_size = DEFAULT_CHUNK_SIZE
  if args.worker:
    return worker(args)

  dims = (args.batch, args.tokens, args.vocab, args.d_model)
  _log("compiled memory (no execution)")
  naive_mem = compiled_memory("naive", *dims, args.chunk_size)
  sweep = {}
  for c in sorted({int(x) for x in args.sweep.split(",") if x} | {args.chunk_size}):
    sweep[c] = compiled_memory("fused", *dims, c)
    _log(f"  chunk {c}: total {sweep[c]['total_bytes'] / 1e9:.3f} GB")
  fused_mem = sweep[args.chunk_size]

  # Executed runs. The naive program needs ~15 GB at T=4096; where a worker
  # dies (the OOM killer on a small or shared machine), both paths are timed
  # again at half the tokens, and the JSON says so. Compiled memory above is
  # always at the full size.
  failures, timed_tokens = [], args.tokens
  while True:
    runs = {"naive": [], "fused": []}
    try:
      for r in range(args.rounds):
        order = ("naive", "fused") if r % 2 == 0 else ("fused", "naive")
        for path in order:
          runs[path].append(_run_worker(path, args, timed_tokens))
          _log(f"  {path}: wall {runs[path][-1]['times_s']} "
               f"cpu {runs[path][-1]['cpu_times_s']}")
      break
    except RuntimeError as e:
      failures.append({"tokens": timed_tokens, "error": str(e)[:300]})
      _log(f"  failed at T={timed_tokens}: {str(e)[:200]}")
      if timed_tokens <= args.min_time_tokens:
        raise
      timed_tokens //= 2

  def summary(rs):
    times = [t for r in rs for t in r["times_s"]]
    cpu = [t for r in rs for t in r["cpu_times_s"]]
    return {
        "median_s": statistics.median(times), "times_s": times,
        "median_cpu_s": statistics.median(cpu), "cpu_times_s": cpu,
        "compile_s": [r["compile_s"] for r in rs], "loss": rs[0]["loss"],
        "grad_norm": rs[0]["grad_norm"],
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in rs),
        "peak_rss_minus_before_call_bytes": max(
            r["peak_rss_bytes"] - r["rss_before_call_bytes"] for r in rs),
    }

  naive, fused = summary(runs["naive"]), summary(runs["fused"])
  mem_ratio = fused_mem["total_bytes"] / naive_mem["total_bytes"]
  time_ratio = fused["median_s"] / naive["median_s"]
  cpu_ratio = fused["median_cpu_s"] / naive["median_cpu_s"]
  out = {
      "headline": {
          "name": "fused/naive peak memory (XLA compiled: args+outputs+temp)",
          "value": round(mem_ratio, 4), "unit": "ratio", "goal": "<= 0.15",
          "meets_goal": mem_ratio <= 0.15,
      },
      "time_ratio": {
          "name": f"fused/naive value+grad wall time (median, T={timed_tokens})",
          "value": round(time_ratio, 4), "unit": "ratio", "goal": "<= 1.3",
          "meets_goal": time_ratio <= 1.3,
      },
      "cpu_time_ratio": {
          "name": f"fused/naive value+grad process CPU time (median, "
                  f"T={timed_tokens}); steadier than wall time under other load",
          "value": round(cpu_ratio, 4), "unit": "ratio", "goal": "<= 1.3",
          "meets_goal": cpu_ratio <= 1.3,
      },
      "load_average": os.getloadavg(),
      "timed_at_tokens": timed_tokens,
      "timing_failures": failures,
      "config": {"batch": args.batch, "tokens": args.tokens,
                 "vocab": args.vocab, "d_model": args.d_model,
                 "dtype": "float32", "chunk_size": args.chunk_size,
                 "loss": "forward_kl, token_mean", "rounds": args.rounds,
                 "repeats": args.repeats, "cpu_count": os.cpu_count()},
      "compiled_memory": {"naive": naive_mem, "fused": fused_mem,
                          "temp_ratio": fused_mem["temp_bytes"]
                          / naive_mem["temp_bytes"]},
      "fused_chunk_sweep_total_bytes": {
          str(c): m["total_bytes"] for c, m in sweep.items()},
      "rss_ratio": fused["peak_rss_bytes"] / naive["peak_rss_bytes"],
      "rss_minus_before_call_ratio": (fused["peak_rss_minus_before_call_bytes"]
                                      / naive["peak_rss_minus_before_call_bytes"]),
      "naive": naive,
      "fused": fused,
      "values_agree": abs(naive["loss"] - fused["loss"])
                      <= 1e-4 * max(1.0, abs(naive["loss"])),
  }
  print(json.dumps(out, indent=1))


if __name__ == "__main__":
  main()
