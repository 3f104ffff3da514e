r"""Teacher support: a distillation step with the full teacher, its top-64, and
from a teacher cache, at Qwen2.5's 151,936-entry vocabulary.

  python -m jaxdistill.bench.topk            # small models, short sequences (CPU)
  python -m jaxdistill.bench.topk --tokens 1024 --batch 8 --d_teacher 1024

Three arms of one step (student forward/backward, the loss, AdamW), all with
the fused loss (the configs' default) and reverse KL:
  live_full:   teacher forward + the exact loss over the whole vocabulary;
  live_topk:   teacher forward + the loss on the teacher's top-k (`--k`);
  cache_topk:  the top-k read from the batch (a teacher cache): no teacher
               forward and no teacher weights among the step's arguments.
Peak memory is XLA's compiled memory analysis of each jitted step
(arguments + outputs + temporaries - aliased), so it counts the teacher's
weights where the step holds them; time is the median wall time over
interleaved rounds. Every figure is a ratio against live_full, measured in
this run. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from jaxdistill import losses
from jaxdistill import models
from jaxdistill.train import step as step_lib


def _log(*a):
  print(*a, file=sys.stderr, flush=True)


def _configs(args):
  s = models.ModelConfig(family="qwen2", vocab_size=args.vocab,
                         hidden_size=args.d_student,
                         intermediate_size=2 * args.d_student,
                         num_hidden_layers=args.layers, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=args.d_student // 2,
                         max_position_embeddings=max(2 * args.tokens, 128),
                         tie_word_embeddings=True, dtype="float32",
                         param_dtype="float32")
  t = dataclasses.replace(s, hidden_size=args.d_teacher,
                          intermediate_size=2 * args.d_teacher,
                          num_hidden_layers=args.layers + 1,
                          num_attention_heads=4, num_key_value_heads=2,
                          head_dim=args.d_teacher // 4)
  return s, t


def _batch(args):
  rs = np.random.default_rng(0)
  b, l = args.batch, args.tokens
  tokens = rs.integers(3, args.vocab, size=(b, l)).astype(np.int32)
  attn = np.ones((b, l), np.int32)
  loss = np.zeros((b, l), np.int32)
  loss[:, l // 4:] = 1  # a quarter prompt, the rest response
  batch = {"tokens": jnp.asarray(tokens), "attention_mask": jnp.asarray(attn),
           "loss_mask": jnp.asarray(loss)}
  batch["weights"] = losses.reduction_weights(batch["loss_mask"], "token_mean")
  return batch


def _step_fn(scfg, tcfg, args, topk, cached):
  loss_cfg = ml_collections.ConfigDict(dict(
      kind="reverse", beta=0.5, fused=True,
      chunk_size=args.chunk_size, teacher_topk=topk, topk_variant=args.variant))
  loss_fn = functools.partial(step_lib.distill_loss, student_cfg=scfg,
                              teacher_cfg=tcfg, loss_cfg=loss_cfg,
                              vocab_size=args.vocab)
  opt = optax.adamw(1e-4)
  step = functools.partial(step_lib.train_step, optimizer=opt,
                           schedule=lambda s: 1e-4, loss_fn=loss_fn)
  if cached:  # the teacher is not an argument of the step
    return opt, jax.jit(lambda state, batch: step(state, None, batch),
                        donate_argnums=0)
  return opt, jax.jit(step, donate_argnums=0)


def _memory(fn, *args):
  ma = fn.lower(*args).compile().memory_analysis()
  return int(ma.argument_size_in_bytes + ma.output_size_in_bytes
             + ma.temp_size_in_bytes - ma.alias_size_in_bytes)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--vocab", type=int, default=151_936)
  p.add_argument("--batch", type=int, default=2)
  p.add_argument("--tokens", type=int, default=64)
  p.add_argument("--d_student", type=int, default=64)
  p.add_argument("--d_teacher", type=int, default=128)
  p.add_argument("--layers", type=int, default=1)
  p.add_argument("--k", type=int, default=64)
  p.add_argument("--variant", default="renorm", choices=losses.TOPK_VARIANTS)
  p.add_argument("--chunk_size", type=int, default=64)
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--iters", type=int, default=2)
  args = p.parse_args(argv)

  scfg, tcfg = _configs(args)
  sp = models.init(scfg, jax.random.key(0))
  tp = models.init(tcfg, jax.random.key(1))
  batch = _batch(args)
  # What a teacher cache holds for this batch (made once, as the cache is).
  t_logits = models.apply(tcfg, tp, batch["tokens"], batch["attention_mask"])
  cache = losses.teacher_topk(t_logits, args.k, vocab_size=args.vocab)
  del t_logits
  cached_batch = dict(batch, **dict(zip(step_lib.CACHE_KEYS, cache)))

  arms = {"live_full": (None, False), "live_topk": (args.k, False),
          "cache_topk": (args.k, True)}
  fns, states, mem, compile_s, loss = {}, {}, {}, {}, {}
  for name, (k, cached) in arms.items():
    opt, fn = _step_fn(scfg, tcfg, args, k, cached)
    make = lambda: {"params": jax.tree.map(jnp.copy, sp),
                    "opt_state": opt.init(sp), "step": jnp.int32(0)}
    b = cached_batch if cached else batch
    call = (lambda fn=fn, b=b: lambda st: fn(st, b))() if cached else (
        lambda fn=fn, b=b: lambda st: fn(st, tp, b))()
    mem[name] = (_memory(fn, make(), b) if cached else
                 _memory(fn, make(), tp, b))
    t0 = time.perf_counter()
    st, m = call(make())
    jax.block_until_ready(st)
    compile_s[name] = time.perf_counter() - t0
    loss[name] = float(m["train/loss"])
    fns[name], states[name] = call, st
    _log(f"{name}: compiled peak {mem[name] / 2**20:.1f} MiB, first call "
         f"{compile_s[name]:.1f} s, loss {loss[name]:.5g}")

  times = {n: [] for n in arms}
  for _ in range(args.rounds):  # interleaved: load changes hit every arm
    for name in arms:
      for _ in range(args.iters):
        t0 = time.perf_counter()
        states[name], m = fns[name](states[name])
        jax.block_until_ready(m["train/loss"])
        times[name].append(time.perf_counter() - t0)
  med = {n: statistics.median(ts) for n, ts in times.items()}
  mem_ratio = {n: mem[n] / mem["live_full"] for n in arms}
  time_ratio = {n: med[n] / med["live_full"] for n in arms}
  out = {
      "headline": {
          "name": f"cache top-{args.k} / live full teacher: peak memory of a "
                  "distillation step (XLA compiled)",
          "value": round(mem_ratio["cache_topk"], 4), "unit": "ratio",
          "goal": "< 1", "meets_goal": mem_ratio["cache_topk"] < 1},
      "memory_ratio_vs_live_full": {n: round(v, 4) for n, v in mem_ratio.items()},
      "time_ratio_vs_live_full": {n: round(v, 4) for n, v in time_ratio.items()},
      "peak_bytes": mem, "median_step_s": med, "step_times_s": times,
      "first_call_s": compile_s,
      "loss": loss,
      "live_and_cache_agree": abs(loss["live_topk"] - loss["cache_topk"])
                              <= 1e-4 * max(1.0, abs(loss["live_topk"])),
      "load_average": os.getloadavg(),
      "config": {**vars(args), "loss": "reverse KL, fused, token_mean",
                 "student_params": int(sum(x.size for x in jax.tree.leaves(sp))),
                 "teacher_params": int(sum(x.size for x in jax.tree.leaves(tp))),
                 "cpu_count": os.cpu_count()},
  }
  print(json.dumps(out, indent=1))


if __name__ == "__main__":
  main()
