"""Forward+backward throughput: jaxdistill vs transformers/PyTorch, same machine.

  python -m jaxdistill.bench.models                       # 4 x 512, V 32k, 8 x 256
  python -m jaxdistill.bench.models --batch 2 --seq 64 --steps 3   # quick
  python -m jaxdistill.bench.models --preset qwen-0.5b-1.5b  # an accelerator

With --preset NAME (bench/presets.py) the model is the preset's student with
random weights in the preset's dtype, at the preset's batch and sequence
length, and the matmul rate is measured in that dtype; the PyTorch comparison
runs only for the tiny preset (and only when torch is installed).

Both sides train-step the same Llama-style weights (the transformers model is
saved, then loaded with load_pretrained) on the same tokens: next-token
cross-entropy, mean over all positions, value and gradients w.r.t. all
parameters. Steps alternate between the two frameworks so that load from other
processes hits both alike; the median step time is used.

Also times a plain jitted jnp.matmul (N x N x N) in the same run and reports the
model's achieved FLOP/s as a fraction of it (model FLOPs counted analytically:
3 x forward matmul FLOPs, attention over all T x T scores as computed).

Headline: jaxdistill tokens/s / PyTorch tokens/s (goal >= 1.5).
One JSON object on stdout; progress on stderr.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import bench
from jaxdistill import models
from jaxdistill.models import flops
from jaxdistill.bench import presets


def _log(*a):
  print(*a, file=sys.stderr, flush=True)


def model_flops_per_token(cfg: models.ModelConfig, seq: int) -> float:
  """Training FLOPs per token: 3 x the forward (models.flops)."""
  return 3 * flops.forward_flops_per_token(cfg, seq)


def _timed(fn):
  t0, c0 = time.perf_counter(), time.process_time()
  fn()
  return time.perf_counter() - t0, time.process_time() - c0


def _has_torch() -> bool:
  try:
    import torch  # pylint: disable=g-import-not-at-top,unused-import
    return True
  except ImportError:
    return False


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--layers", type=int, default=4)
  ap.add_argument("--hidden", type=int, default=512)
  ap.add_argument("--intermediate", type=int, default=1536)
  ap.add_argument("--heads", type=int, default=8)
  ap.add_argument("--kv-heads", type=int, default=4)
  ap.add_argument("--vocab", type=int, default=32000)
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--seq", type=int, default=256)
  ap.add_argument("--steps", type=int, default=10)
  ap.add_argument("--remat", default="none")
  ap.add_argument("--scan-unroll", type=int, default=1)
  ap.add_argument("--matmul-n", type=int, default=2048)
  ap.add_argument("--matmul-reps", type=int, default=4)
  ap.add_argument("--no-torch", action="store_true")
  ap.add_argument("--preset", default=None, choices=sorted(presets.PRESETS),
                  help="the preset's student, random weights, its dtype, "
                       "batch and seq (overrides the shape flags)")
  args = ap.parse_args(argv)

  preset = presets.get(args.preset) if args.preset else None
  if preset is not None:
    args.batch, args.seq, args.vocab = (preset.batch, preset.seq,
                                        preset.student.vocab_size)
    use_torch = not args.no_torch and preset.name == "tiny" and _has_torch()
    args.no_torch = not use_torch
  if args.no_torch:
    tmodel = None
  else:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
    if preset is not None:
      tmodel = bench.torch_llama(preset.student).train()
    else:
      hf_cfg = transformers.LlamaConfig(
          vocab_size=args.vocab, hidden_size=args.hidden,
          intermediate_size=args.intermediate, num_hidden_layers=args.layers,
          num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
          max_position_embeddings=max(2048, args.seq), rope_theta=500000.0,
          tie_word_embeddings=False)
      torch.manual_seed(0)
      tmodel = transformers.LlamaForCausalLM(hf_cfg).float().train()
  if tmodel is not None:
    with tempfile.TemporaryDirectory() as tmp:
      tmodel.save_pretrained(tmp)
      cfg, params = models.load_pretrained(tmp)
  elif preset is not None:
    cfg = preset.student
    params = models.init(cfg, jax.random.key(0))
  else:
    cfg = models.ModelConfig(
        vocab_size=args.vocab, hidden_size=args.hidden,
        intermediate_size=args.intermediate, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        max_position_embeddings=max(2048, args.seq))
    params = models.init(cfg, jax.random.key(0))
  cfg = dataclasses.replace(cfg, remat=args.remat, scan_unroll=args.scan_unroll)

  rs = np.random.RandomState(0)
  tokens = rs.randint(0, args.vocab, (args.batch, args.seq)).astype(np.int32)
  targets = rs.randint(0, args.vocab, (args.batch, args.seq)).astype(np.int32)

  def loss_fn(p, tok, tgt):
    logits = models.apply(cfg, p, tok)  # [B, T, V] float32
    # Target logit by compare-and-sum: take_along_axis would differentiate
    # into a scatter, which XLA:CPU runs serially.
    hit = jnp.arange(logits.shape[-1]) == tgt[..., None]
    picked = jnp.sum(jnp.where(hit, logits, 0.0), -1)
    return jnp.mean(jax.nn.logsumexp(logits, -1) - picked)

  step = jax.jit(jax.value_and_grad(loss_fn))
  jtok, jtgt = jnp.asarray(tokens), jnp.asarray(targets)

  def jax_step():
    loss, grads = step(params, jtok, jtgt)
    jax.block_until_ready(grads)
    return loss.item()

  def torch_step():
    ttok, ttgt = (torch.tensor(x, dtype=torch.long) for x in (tokens, targets))
    tmodel.zero_grad(set_to_none=True)
    logits = tmodel(ttok).logits  # [B, T, V]
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, args.vocab), ttgt.reshape(-1))
    loss.backward()
    return loss.item()

  _log("compiling jax step ...")
  t0 = time.perf_counter()
  jloss = jax_step()
  compile_s = time.perf_counter() - t0
  tloss = torch_step() if not args.no_torch else float("nan")
  jax_step()
  if not args.no_torch:
    torch_step()
  _log(f"compiled in {compile_s:.1f}s; loss jax {jloss:.6f} torch {tloss:.6f}")

  # Rounds of: one jax step, one torch step, the reference matmul rate
  # (presets.matmul_rate, the model's dtype), so that load from other
  # processes affects all three alike. Wall time is the measure; process CPU
  # time (all threads) of the steps is reported as a load-robust aid.
  jt, tt, mt = [], [], []
  for i in range(args.steps):
    jt.append(_timed(jax_step))
    if not args.no_torch:
      tt.append(_timed(torch_step))
    t0 = time.perf_counter()
    mt.append(presets.matmul_rate(cfg.dtype, n=args.matmul_n,
                                  reps=args.matmul_reps))
    mt_s = time.perf_counter() - t0
    _log(f"step {i}: jax {jt[-1][0]:.3f}s" +
         ("" if args.no_torch else f" torch {tt[-1][0]:.3f}s") +
         f" matmul {mt[-1] / 1e9:.1f} GFLOP/s ({mt_s:.2f}s)")

  med = lambda xs, k: statistics.median(x[k] for x in xs)
  ntok = args.batch * args.seq
  jax_tps = ntok / med(jt, 0)
  mm = statistics.median(mt)  # FLOP/s in the model's dtype
  flops_tok = model_flops_per_token(cfg, args.seq)
  frac = jax_tps * flops_tok / mm
  report = {
      "config": {**vars(args), "dtype": cfg.dtype,
                 "model": dataclasses.asdict(cfg),
                 "backend": jax.default_backend(),
                 "device": str(jax.devices()[0].device_kind)},
      "jax": {"tokens_per_s": round(jax_tps, 1),
              "median_step_s": round(med(jt, 0), 4),
              "median_step_cpu_s": round(med(jt, 1), 4),
              "step_s": [round(x[0], 4) for x in jt],
              "compile_s": round(compile_s, 2),
              "model_gflops_per_s": round(jax_tps * flops_tok / 1e9, 2),
              "fraction_of_matmul_flops": round(frac, 3)},
      "matmul": {"n": args.matmul_n, "dtype": cfg.dtype,
                 "gflops_per_s": round(mm / 1e9, 2)},
      "model_flops_per_token": flops_tok,
      "loss_abs_diff": None if args.no_torch else abs(jloss - tloss),
      "threads": {"torch": None if args.no_torch else torch.get_num_threads(),
                  "cpus": os.cpu_count()},
  }
  if not args.no_torch:
    torch_tps = ntok / med(tt, 0)
    ratio = jax_tps / torch_tps
    report["cpu_time_ratio_torch_over_jax"] = round(med(tt, 1) / med(jt, 1), 3)
    report["torch"] = {"tokens_per_s": round(torch_tps, 1),
                       "median_step_s": round(med(tt, 0), 4),
                       "median_step_cpu_s": round(med(tt, 1), 4),
                       "step_s": [round(x[0], 4) for x in tt],
                       "attn_implementation": tmodel.config._attn_implementation}  # pylint: disable=protected-access
    report["headline"] = {
        "name": "forward+backward tokens/s, jaxdistill / transformers-PyTorch",
        "value": round(ratio, 3), "unit": "x", "goal": ">= 1.5",
        "meets_goal": ratio >= 1.5}
  else:
    report["headline"] = {
        "name": "achieved FLOP/s / jnp.matmul FLOP/s", "value": round(frac, 3),
        "unit": "fraction", "goal": ">= 0.4", "meets_goal": frac >= 0.4}
  report["flops_goal"] = {"name": "achieved FLOP/s / jnp.matmul FLOP/s",
                          "value": round(frac, 3), "goal": ">= 0.4",
                          "meets_goal": frac >= 0.4}
  print(json.dumps({"headline": report.pop("headline"), **report}, indent=1))


if __name__ == "__main__":
  main()
