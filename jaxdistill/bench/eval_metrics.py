"""Benchmark: update sparsity (jitted, leaf by leaf) vs a NumPy float32 count,
plus verifier cost on typical vs hostile completions.

  python -m jaxdistill.bench.eval_metrics [--layers 8 --hidden 1024]

Prints one JSON object. Headline: NumPy time / jaxdistill time for
`update_sparsity` on a synthetic stacked bf16 decoder (both in this run, same
data, results checked equal). Details: Countdown verifier microseconds per
completion on solver reference completions and on hostile ones (1 MB text,
10,000-deep parentheses, 9**9**9), and their ratio, which stays small
because the scan is capped.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import ml_dtypes
import numpy as np

from jaxdistill import sparsity
from jaxdistill.tasks import countdown


def _params(rng, layers, d, f, vocab):
  bf16 = ml_dtypes.bfloat16
  w = lambda *s: rng.normal(0, 0.02, s).astype(bf16)
  return {"embed_tokens": {"embedding": w(vocab, d)},
          "norm": {"scale": np.ones(d, bf16)},
          "layers": {"self_attn": {n: {"kernel": w(layers, d, d)}
                                   for n in ("q_proj", "k_proj", "v_proj", "o_proj")},
                     "mlp": {n: {"kernel": w(layers, d, f)}
                             for n in ("gate_proj", "up_proj", "down_proj")},
                     "input_layernorm": {"scale": np.ones((layers, d), bf16)}}}


def _update(rng, p, frac_changed=0.4):
  def one(x):
    changed = rng.random(x.shape) < frac_changed
    step = rng.normal(0, 1e-3, x.shape)
    return (x.astype(np.float32) + np.where(changed, step, 0.0)).astype(x.dtype)
  return jax.tree.map(one, p)


def _numpy_sparsity(p0, p1, tau=1e-6):
  """(entries, S_tau in float32, share equal): the bf16 leaves' S_1e-6_f32
  and equal_bf16."""
  total = close = exact = 0
  for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(p1)):
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    total += a.size
    close += int((np.abs(b32 - a32) < np.float32(tau)).sum())
    exact += int((a32 == b32).sum())
  return total, close / total, exact / total


def _best_time(fn, repeats):
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    out = fn()
    best = min(best, time.perf_counter() - t)
  return best, out


def main(argv=None):
  ap = argparse.ArgumentParser()
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--hidden", type=int, default=512)
  ap.add_argument("--mlp", type=int, default=1408)
  ap.add_argument("--vocab", type=int, default=8192)
  ap.add_argument("--repeats", type=int, default=3)
  args = ap.parse_args(argv)
  rng = np.random.default_rng(0)
  p0 = _params(rng, args.layers, args.hidden, args.mlp, args.vocab)
  p1 = _update(rng, p0)
  n_params = sum(x.size for x in jax.tree.leaves(p0))
  print(f"update_sparsity on {n_params / 1e6:.1f}M bf16 params", file=sys.stderr)
  d0, d1 = jax.device_put(p0), jax.device_put(p1)  # Checkpoints load to device.
  sparsity.update_sparsity(d0, d1)  # Compile.
  t_jax, ours = _best_time(lambda: sparsity.update_sparsity(d0, d1), args.repeats)
  t_np, ref = _best_time(lambda: _numpy_sparsity(p0, p1), args.repeats)
  if (ours["num_params"], ours["S_1e-6_f32"], ours["equal_bf16"]) != ref:
    raise SystemExit(f"mismatch: {ours['S_1e-6_f32']} vs {ref}")

  print("verifier timings", file=sys.stderr)
  probs = countdown.generate_problems(4, 200, seed=0)
  typical = [(countdown.reference_completion(p.numbers, p.target, p.solution),
              p.numbers, p.target) for p in probs]
  nums, tgt = [25, 5, 3], 40
  hostile = [("x" * 1_000_000 + "<answer>25+5*3</answer>", nums, tgt),
             ("<answer>" + "(" * 10_000 + "25+5*3" + ")" * 10_000 + "</answer>",
              nums, tgt),
             ("<answer>9**9**9</answer>", [9, 9, 9], tgt),
             ("<answer>" * 100_000 + "</answer>" * 100_000, nums, tgt)] * 50

  def per_call(cases):
    t = time.perf_counter()
    for text, n, target in cases:
      countdown.reward(text, n, target)
    return (time.perf_counter() - t) / len(cases)

  t_typ = min(per_call(typical) for _ in range(args.repeats))
  t_host = min(per_call(hostile) for _ in range(args.repeats))
  speedup = t_np / t_jax
  print(json.dumps({
      "headline": {"name": "update_sparsity speedup vs NumPy float32 count",
                   "value": round(speedup, 2), "unit": "x", "goal": ">= 1.0",
                   "meets_goal": bool(speedup >= 1.0)},
      "sparsity": {"params": int(n_params), "backend": jax.default_backend(),
                   "jax_s": round(t_jax, 4), "numpy_s": round(t_np, 4),
                   "S_1e-6_f32": ours["S_1e-6_f32"],
                   "equal_bf16": ours["equal_bf16"],
                   "dtype": ours["values_dtype"]},
      "verifier": {"typical_us": round(t_typ * 1e6, 1),
                   "hostile_us": round(t_host * 1e6, 1),
                   "hostile_over_typical": round(t_host / t_typ, 2)},
  }))


if __name__ == "__main__":
  main()
