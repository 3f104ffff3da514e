"""Benchmark: cost of the evaluation harness around the rollouts, and of the
streamed checkpoint sparsity.

  python -m jaxdistill.bench.evaluate [--problems 64 --samples 4 --hidden 256]

Prints one JSON object. Headline: evaluate_model wall time / the wall time of
the bare rollout.generate calls it makes (same model, prompts, batch shapes
and row ids, both compiled beforehand, interleaved, best of --repeats, in this
run): what prompt building, decoding, verifying and bookkeeping add. The
process-CPU-time ratio is reported too: on a shared CPU it is the steadier one. Details: problems/s,
generated tokens/s, and update_sparsity_from_checkpoints (streamed blocks)
against loading both safetensors files whole and counting S_1e-6 in NumPy:
time ratio, peak traced host memory ratio, results checked equal.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import tracemalloc

import jax
import numpy as np
from safetensors.numpy import load_file
from safetensors.numpy import save_file

from jaxdistill import models
from jaxdistill import rollout
from jaxdistill import sparsity
from jaxdistill import tasks
from jaxdistill.data import pipeline
from jaxdistill.data import tokenizer as tok_lib
from jaxdistill.evaluate import core
from jaxdistill.tasks import countdown


def _log(*a):
  print(*a, file=sys.stderr, flush=True)


def _model(args, vocab):
  cfg = models.ModelConfig(
      family="qwen2", vocab_size=vocab, hidden_size=args.hidden,
      intermediate_size=4 * args.hidden, num_hidden_layers=args.layers,
      num_attention_heads=4, num_key_value_heads=2, head_dim=args.hidden // 4,
      attention_bias=True, tie_word_embeddings=True, eos_token_id=(2,),
      max_position_embeddings=2048, rope_theta=1e6)
  rng = np.random.default_rng(0)
  fill = lambda path, s: np.asarray(
      rng.normal(0, 0.2, s.shape) + ("scale" in jax.tree_util.keystr(path)),
      s.dtype)
  params = jax.tree_util.tree_map_with_path(fill, models.param_shapes(cfg))
  return cfg, jax.device_put(params)


def _bare_generate(cfg, params, tok, records, args):
  """The rollout.generate calls evaluate_model makes, and nothing else."""
  tokens = 0
  for n, temp in ((1, 0.0), (args.samples, 1.0)):
    per_call = args.batch_size if n == 1 else max(1, args.batch_size // n)
    batches = pipeline.make_prompt_batches(
        records, tok, batch_size=per_call, max_prompt_len=args.max_prompt_len,
        seed=0, shuffle=False, num_epochs=1, bucket=64)
    for step in range(len(batches)):
      b = batches[step]
      pid = np.repeat(b["index"], n)
      sid = np.tile(np.arange(n), len(b["index"]))
      r = rollout.generate(
          (cfg, params), None, np.repeat(b["prompt"], n, 0),
          np.repeat(b["prompt_mask"], n, 0), rng=jax.random.key(0),
          policy="student", max_new_tokens=args.max_new_tokens,
          temperature=temp, eos_token_ids=(2,), pad_token_id=tok.pad_token_id,
          return_logprobs=False, row_ids=(pid * n + sid).astype(np.int32))
      tokens += int(jax.device_get(r.lengths).sum())
  return tokens


def _best(fn, repeats):
  best, out = float("inf"), None
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = fn()
    best = min(best, time.perf_counter() - t0)
  return best, out


def _timed(fn):
  """(wall s, process CPU s, result); CPU time is less hurt by other load."""
  w, c = time.perf_counter(), time.process_time()
  out = fn()
  return time.perf_counter() - w, time.process_time() - c, out


def _sparsity_bench(tmp, args):
  """Streamed checkpoint S_1e-6 vs a whole-file NumPy float32 count."""
  rng = np.random.default_rng(1)
  d, f = args.sparsity_hidden, 4 * args.sparsity_hidden
  shapes = {"model.embed_tokens.weight": (8 * d, d)}
  for i in range(args.layers):
    shapes.update({f"model.layers.{i}.mlp.up_proj.weight": (f, d),
                   f"model.layers.{i}.mlp.down_proj.weight": (d, f),
                   f"model.layers.{i}.self_attn.q_proj.weight": (d, d)})
  dirs = []
  for name, move in (("before", 0.0), ("after", 1e-3)):
    path = os.path.join(tmp, name)
    os.makedirs(path)
    r = np.random.default_rng(2)
    t = {k: r.normal(0, 0.02, s).astype(np.float32) for k, s in shapes.items()}
    if move:
      t = {k: v + move * (rng.random(v.shape) < 0.3) for k, v in t.items()}
      t = {k: v.astype(np.float32) for k, v in t.items()}
    save_file(t, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as fh:
      json.dump({"tie_word_embeddings": True}, fh)
    dirs.append(path)

  def naive():
    a, b = (load_file(os.path.join(p, "model.safetensors")) for p in dirs)
    n = close = 0
    for k in a:
      n += a[k].size
      close += int((np.abs(b[k] - a[k]) < np.float32(1e-6)).sum())  # float32
    return close / n

  def streamed():
    return sparsity.update_sparsity_from_checkpoints(
        *dirs, chunk_bytes=args.chunk_mb << 20)["S_1e-6_f32"]

  out = {}
  for name, fn in (("naive", naive), ("streamed", streamed)):
    fn()
    t, val = _best(fn, args.repeats)
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    out[name] = {"time_s": t, "peak_host_mb": peak / 2**20, "sparsity": val}
  if abs(out["naive"]["sparsity"] - out["streamed"]["sparsity"]) > 1e-12:
    raise AssertionError(f"sparsity mismatch: {out}")
  nbytes = sum(int(np.prod(s)) * 4 for s in shapes.values())
  out["checkpoint_mb"] = nbytes / 2**20
  out["time_ratio_streamed_over_naive"] = (out["streamed"]["time_s"] /
                                           out["naive"]["time_s"])
  out["peak_ratio_streamed_over_naive"] = (out["streamed"]["peak_host_mb"] /
                                           out["naive"]["peak_host_mb"])
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--problems", type=int, default=32)
  p.add_argument("--samples", type=int, default=4)
  p.add_argument("--batch_size", type=int, default=16)
  p.add_argument("--max_new_tokens", type=int, default=32)
  p.add_argument("--max_prompt_len", type=int, default=256)
  p.add_argument("--hidden", type=int, default=128)
  p.add_argument("--layers", type=int, default=2)
  p.add_argument("--repeats", type=int, default=4)
  p.add_argument("--sparsity_hidden", type=int, default=512)
  p.add_argument("--chunk_mb", type=int, default=4)
  args = p.parse_args(argv)

  with tempfile.TemporaryDirectory() as tmp:
    probs = countdown.generate_problems(3, 200, seed=0)
    corpus = [tasks.prompt_text(r.to_record()) + " " + tasks.reference_response(
        r.to_record()) for r in probs]
    tok = tok_lib.train_bpe_tokenizer(corpus, 512, os.path.join(tmp, "tok"))
    cfg, params = _model(args, len(tok))
    records = [r.to_record() for r in countdown.generate_problems(
        3, args.problems, seed=0, split="test")]
    kw = dict(greedy=True, num_samples=args.samples, temperature=1.0,
              ks=(1, args.samples), max_new_tokens=args.max_new_tokens,
              batch_size=args.batch_size, seed=0,
              max_prompt_len=args.max_prompt_len, prompt_bucket=64,
              eos_token_ids=(2,), progress=False)
    harness = lambda: core.evaluate_model(cfg, params, tok, {"cd3": records}, **kw)
    _log("compiling (first evaluate_model call) ...")
    harness()
    _bare_generate(cfg, params, tok, records, args)
    _log("timing ...")
    # Interleaved, best of each: the machine's load drifts between runs.
    t_gen = t_eval = c_gen = c_eval = float("inf")
    for _ in range(args.repeats):
      w, c, tokens = _timed(lambda: _bare_generate(cfg, params, tok, records, args))
      t_gen, c_gen = min(t_gen, w), min(c_gen, c)
      w, c, res = _timed(harness)
      t_eval, c_eval = min(t_eval, w), min(c_eval, c)
    _log("sparsity ...")
    sp = _sparsity_bench(tmp, args)

  ratio = t_eval / t_gen
  out = {
      "headline": {"name": "evaluate_model time / bare rollout.generate time",
                   "value": round(ratio, 4), "unit": "x", "goal": "<= 1.25",
                   "meets_goal": ratio <= 1.25},
      "harness": {"eval_s": t_eval, "generate_s": t_gen,
                  "eval_cpu_s": c_eval, "generate_cpu_s": c_gen,
                  "cpu_time_ratio": c_eval / c_gen,
                  "problems": args.problems, "samples": args.samples,
                  "problems_per_s": args.problems / t_eval,
                  "generated_tokens": tokens,
                  "generated_tokens_per_s": tokens / t_eval,
                  "metrics": {k: res[k] for k in sorted(res)}},
      "sparsity_from_checkpoints": sp,
      "settings": vars(args),
      "device": str(jax.devices()[0].platform),
  }
  print(json.dumps(out, indent=2))


if __name__ == "__main__":
  main()
