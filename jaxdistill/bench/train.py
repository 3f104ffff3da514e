r"""Distillation-step throughput: jaxdistill vs the same step in PyTorch.

  python -m jaxdistill.bench.train            # the default small config
  python -m jaxdistill.bench.train --quick    # a smaller one, for a smoke run
  python -m jaxdistill.bench.train --preset qwen-0.5b-1.5b   # an accelerator
  python -m jaxdistill.bench.train --profile  # + time per source op (bench.profile)

With --preset NAME (bench/presets.py): the preset's student and teacher with
random weights in its dtype, its batch and sequence length, MFU against the
matmul rate measured in that dtype (presets.matmul_rate); the PyTorch step
runs only for the tiny preset, and only when torch is installed.

One step = teacher forward (no gradient) + student forward/backward + exact
token-level forward KL over the vocabulary + AdamW update, on a fixed batch
of sequences (the rollout is benchmarked separately: bench.rollout). The
PyTorch reference is transformers' LlamaForCausalLM for both models with the
same shapes, the same loss written in torch (as TRL's GKD computes it:
log-softmax of both, sum p (log p - log q) over the vocabulary, mean over
response tokens) and torch.optim.AdamW; both run on the same CPU in this
process, in alternating rounds (below).

Model FLOPs per step: 6 N_s T (student forward + backward) + 2 N_t T (teacher
forward), N = matmul parameters (all but the embedding lookup, lm_head
included), plus the attention score/value matmuls (12 L T^2 d per sequence for
the student's forward+backward, 4 L T^2 d for the teacher; causal masking
not discounted, as is customary). MFU = achieved model FLOP/s / the FLOP/s of
a plain jnp.matmul in the models' dtype measured in the same run. Prints one
JSON object.

Timing: after a warm-up, rounds of one JAX step, one PyTorch step and one
sample of the matmul rate; each figure is the median over the rounds. The
rate is sampled beside the steps because the host is shared: sampled once
before them (0.3 s of matmuls), load from another process in that moment
lowered it and MFU read 1.137 (2026-12-07), more than any step can reach
(one core kept busy during that moment only: 1.18).

The exact loss takes the plain-logits path (losses.divergence, closed-form
gradient, row-blocked on CPU) unless --fused.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from jaxdistill import bench
from jaxdistill import losses
from jaxdistill import models
from jaxdistill.models import flops
from jaxdistill.bench import presets
from jaxdistill.bench import profile
from jaxdistill.train import step as step_lib


def _log(*a):
  print(*a, file=sys.stderr, flush=True)


def _configs(quick: bool):
  if quick:
    s = models.ModelConfig(family="llama", vocab_size=4096, hidden_size=128,
                           intermediate_size=384, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2,
                           head_dim=32, max_position_embeddings=1024)
    t = dataclasses.replace(s, hidden_size=256, intermediate_size=768,
                            num_attention_heads=8, num_key_value_heads=4)
    return s, t, 4, 128
  s = models.ModelConfig(family="llama", vocab_size=32000, hidden_size=256,
                         intermediate_size=768, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4,
                         head_dim=32, max_position_embeddings=1024)
  t = dataclasses.replace(s, hidden_size=512, intermediate_size=1536,
                          num_attention_heads=8, num_key_value_heads=4,
                          head_dim=64)
  return s, t, 8, 256


def step_flops(s, t, b, l) -> float:
  """Student forward + backward and teacher forward over b x l tokens."""
  return flops.train_step_flops(s, t, b * l, l)


def _batch(b, l, v, seed=0):
  rs = np.random.default_rng(seed)
  tokens = rs.integers(3, v, size=(b, l)).astype(np.int32)
  attn = np.ones((b, l), np.int32)
  loss_mask = np.zeros((b, l), np.int32)
  loss_mask[:, l // 4:] = 1  # first quarter is "prompt"
  return tokens, attn, loss_mask


def jax_step(s, t, b, l, fused):
  """(update, state, teacher params, batch): the jitted, donated step and
  its arguments."""
  sp = models.init(s, jax.random.key(0))
  tp = models.init(t, jax.random.key(1))
  tokens, attn, lm = _batch(b, l, s.vocab_size)
  batch = {"tokens": jnp.asarray(tokens), "attention_mask": jnp.asarray(attn),
           "loss_mask": jnp.asarray(lm)}
  batch["weights"] = losses.reduction_weights(batch["loss_mask"], "token_mean")
  loss_cfg = ml_collections.ConfigDict(dict(
      kind="forward", beta=0.5, fused=fused, chunk_size=512))
  loss_fn = functools.partial(step_lib.distill_loss, student_cfg=s,
                              teacher_cfg=t, loss_cfg=loss_cfg,
                              vocab_size=s.vocab_size)
  opt = optax.adamw(1e-4)
  state = {"params": sp, "opt_state": opt.init(sp), "step": jnp.int32(0)}
  update = jax.jit(functools.partial(
      step_lib.train_step, optimizer=opt, schedule=lambda _: 1e-4,
      loss_fn=loss_fn), donate_argnums=0)
  return update, state, tp, batch


def bench_jax(s, t, b, l, fused):
  """(run one step, compile seconds)."""
  update, state, tp, batch = jax_step(s, t, b, l, fused)
  t0 = time.perf_counter()
  compiled = update.lower(state, tp, batch).compile()
  compile_s = time.perf_counter() - t0
  box = [state]

  def run():
    box[0], m = compiled(box[0], tp, batch)
    jax.block_until_ready(m["train/loss"])
  return run, compile_s


def bench_torch(s, t, b, l):
  """(run one step, torch's thread count)."""
  import torch  # pylint: disable=g-import-not-at-top
  student, teacher = bench.torch_llama(s), bench.torch_llama(t).eval()
  opt = torch.optim.AdamW(student.parameters(), lr=1e-4)
  tokens, attn, lm = _batch(b, l, s.vocab_size)
  tok = torch.from_numpy(tokens).long()
  am = torch.from_numpy(attn).long()
  w = torch.from_numpy(lm[:, 1:]).float()

  def run():
    with torch.no_grad():
      tl = teacher(input_ids=tok, attention_mask=am).logits[:, :-1]
    sl = student(input_ids=tok, attention_mask=am).logits[:, :-1]
    logp = torch.log_softmax(tl.float(), -1)
    logq = torch.log_softmax(sl.float(), -1)
    fkl = (logp.exp() * (logp - logq)).sum(-1)
    loss = (fkl * w).sum() / w.sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
  return run, torch.get_num_threads()


def rounds(steps: dict, rate, iters: int, warmup: int = 1):
  """Times `iters` rounds of every step in `steps` ({name: run}) once, then
  one sample of the reference rate (`rate()`, FLOP/s), after `warmup`
  untimed calls of each step: {name: [seconds]} and the rate samples. Load
  from other processes then falls on the steps and the reference alike."""
  for run in steps.values():
    for _ in range(warmup):
      run()
  times, rates = {k: [] for k in steps}, []
  for i in range(iters):
    for k, run in steps.items():
      t0 = time.perf_counter()
      run()
      times[k].append(time.perf_counter() - t0)
    rates.append(rate())
    _log(f"round {i}: " + " ".join(f"{k} {v[-1]:.3f}s" for k, v in times.items())
         + f" matmul {rates[-1] / 1e9:.1f} GFLOP/s")
  return times, rates


def _has_torch() -> bool:
  try:
    import torch  # pylint: disable=g-import-not-at-top,unused-import
    return True
  except ImportError:
    return False


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--quick", action="store_true")
  ap.add_argument("--iters", type=int, default=5)
  ap.add_argument("--fused", action="store_true",
                  help="use the fused hidden-state loss path")
  ap.add_argument("--no-torch", action="store_true")
  ap.add_argument("--preset", default=None, choices=sorted(presets.PRESETS),
                  help="student/teacher/batch/seq/dtype from bench/presets.py")
  ap.add_argument("--profile", action="store_true",
                  help="also profile one step: time per source op "
                  "('profile' in the JSON)")
  args = ap.parse_args(argv)
  dump = bench.profile_dump(args.profile)
  if args.preset:
    p = presets.get(args.preset)
    s, t, b, l, dtype = p.student, p.teacher, p.batch, p.seq, p.dtype
    if p.name != "tiny" or not _has_torch():
      args.no_torch = True
  else:
    (s, t, b, l), dtype = _configs(args.quick), "float32"
  step_fl = step_flops(s, t, b, l)
  _log("compiling the jaxdistill step ...")
  steps = {}
  steps["jax"], compile_s = bench_jax(s, t, b, l, args.fused)
  if not args.no_torch:
    steps["torch"], threads = bench_torch(s, t, b, l)
  times, rates = rounds(steps, lambda: presets.matmul_rate(dtype), args.iters)
  prof = bench.profile_section(dump and dump.name, lambda d: profile.summary(
      profile.op_times(steps["jax"], d), groups=("teacher",)))
  mm = float(np.median(rates))
  jsec = float(np.median(times["jax"]))
  tokens = b * l
  out = {
      "config": {"student": dataclasses.asdict(s), "teacher": dataclasses.asdict(t),
                 "batch": b, "seq_len": l, "fused_loss": args.fused,
                 "preset": args.preset, "dtype": dtype,
                 "backend": jax.default_backend(),
                 "device": str(jax.devices()[0].device_kind)},
      # The median of the samples taken beside the steps (rounds()).
      "matmul_flops_per_s": mm, "matmul_dtype": dtype,
      "matmul_flops_per_s_samples": rates,
      "model_flops_per_step": step_fl,
      "jax": {"step_s": jsec, "step_times_s": times["jax"],
              "compile_s": compile_s, "tokens_per_s": tokens / jsec,
              "mfu": step_fl / jsec / mm},
      "profile": prof,
  }
  headline_value, goal = None, ">= 2.0x PyTorch and MFU >= 0.55"
  if not args.no_torch:
    tsec = float(np.median(times["torch"]))
    out["torch"] = {"step_s": tsec, "step_times_s": times["torch"],
                    "threads": threads, "tokens_per_s": tokens / tsec,
                    "mfu": step_fl / tsec / mm}
    headline_value = tsec / jsec
  mfu = out["jax"]["mfu"]
  if headline_value is not None:
    out["headline"] = {
        "name": "distill step speedup vs PyTorch (same CPU, same run)",
        "value": round(headline_value, 3), "unit": "x", "goal": goal,
        "mfu": round(mfu, 3),
        "meets_goal": bool(headline_value >= 2.0 and mfu >= 0.55)}
  else:
    # Without the PyTorch step: MFU alone (an accelerator preset's goal is
    # 0.45, the CPU step's 0.55).
    want = 0.45 if jax.default_backend() != "cpu" else 0.55
    out["headline"] = {
        "name": f"distill step MFU vs the measured {dtype} matmul rate",
        "value": round(mfu, 3), "unit": "fraction", "goal": f">= {want}",
        "meets_goal": bool(mfu >= want)}
  print(json.dumps(out))


if __name__ == "__main__":
  main()
