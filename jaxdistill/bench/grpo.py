r"""Benchmark: one GRPO update step, jaxdistill vs the same step in PyTorch.

  python -m jaxdistill.bench.grpo             # R=16 rows, prompt 64 + 192 new
  python -m jaxdistill.bench.grpo --quick     # a smaller one, for a smoke run
  python -m jaxdistill.bench.grpo --profile   # + time per source op (bench.profile)

One update = policy forward/backward over [R, P+N] sequences + the clipped
GRPO objective with a k3 KL term and the entropy metric over the full
vocabulary at the N response positions + gradient clipping + AdamW, on a fixed
batch (old / reference log-probs perturbed so that the clip is active). The
PyTorch reference is transformers' LlamaForCausalLM with the same shapes, the
same objective written in torch (TRL's GRPO loss, sequence-mean averaging),
clip_grad_norm_ and torch.optim.AdamW, in this process after the JAX side.
The headline is the ratio of step times (same CPU, same run).

Context, JAX only: the rest of an iteration, i.e. the rollout of the same R
rows (KV-cache sampling, EOS disabled so that all N tokens are generated) and
the frozen reference's log-probs, as shares of the iteration time.

Prints one JSON object on stdout; progress goes to stderr.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxdistill import bench
from jaxdistill import models
from jaxdistill import rollout as rollout_lib
from jaxdistill.bench import profile
from jaxdistill.rl import grpo
from jaxdistill.rl import step as rl_step
from jaxdistill.train import step as step_lib

CLIP, BETA, TEMP, LR = 0.2, 0.04, 1.0, 1e-5


def _log(*a):
  print(*a, file=sys.stderr, flush=True)


def _setup(quick: bool):
  if quick:
    cfg = models.ModelConfig(vocab_size=4096, hidden_size=128,
                             intermediate_size=384, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2,
                             head_dim=32, max_position_embeddings=1024)
    return cfg, 8, 32, 64
  cfg = models.ModelConfig(vocab_size=32000, hidden_size=256,
                           intermediate_size=768, num_hidden_layers=4,
                           num_attention_heads=8, num_key_value_heads=4,
                           head_dim=32, max_position_embeddings=1024)
  return cfg, 16, 64, 192


def _batch(cfg, r, p, n, g=4, seed=0):
  """Host arrays of a rollout batch; response lengths vary in [N/2, N]."""
  rs = np.random.default_rng(seed)
  tokens = rs.integers(3, cfg.vocab_size, size=(r, p + n)).astype(np.int32)
  lens = rs.integers(n // 2, n + 1, size=r)
  mask = (np.arange(n)[None] < lens[:, None]).astype(np.int32)  # [R, N]
  attn = np.concatenate([np.ones((r, p), np.int32), mask], 1)
  rewards = rs.integers(0, 2, size=r).astype(np.float32)
  adv = np.asarray(grpo.group_advantages(rewards, g)[0])
  # Sampler / reference log-probs: around a plausible value, perturbed so
  # that ratios land on both sides of the clip range.
  old = (-np.log(cfg.vocab_size) + rs.normal(0, 0.3, (r, n))).astype(np.float32)
  ref = (old + rs.normal(0, 0.1, (r, n))).astype(np.float32)
  return {"tokens": tokens, "attention_mask": attn, "loss_mask": mask,
          "old_logp": old * mask, "ref_logp": ref * mask, "advantages": adv}


def _config():
  return ml_collections.ConfigDict(dict(
      rollout=dict(temperature=TEMP),
      grpo=dict(clip_low=CLIP, clip_high=CLIP, ppo_epochs=1, num_minibatches=1,
                reduction="sequence_mean"),
      kl=dict(coef=BETA, estimator="k3"),
      optim=dict(lr=LR, schedule="constant", warmup_steps=0, weight_decay=0.0,
                 b1=0.9, b2=0.999, eps=1e-8, clip_norm=1.0, grad_accum=1)))


def bench_jax(cfg, params, host, iters, dump_dir=None):
  config = _config()
  opt, sched = step_lib.make_optimizer(config.optim, 1000)
  state = {"params": params, "opt_state": opt.init(params),
           "step": jnp.zeros((), jnp.int32)}
  batch = jax.tree.map(jnp.asarray, host)
  update = jax.jit(rl_step.make_update(config, cfg, opt, sched),
                   donate_argnums=0)
  rng = jax.random.key(1)
  t0 = time.perf_counter()
  compiled = update.lower(state, batch, rng).compile()
  compile_s = time.perf_counter() - t0
  box, seen = [state], []

  def run():
    box[0], m = compiled(box[0], batch, rng)
    seen.append({k: float(v) for k, v in jax.device_get(m).items()})
  sec, ts = bench.median_time(run, iters=iters)
  prof = bench.profile_section(
      dump_dir, lambda d: profile.summary(profile.op_times(run, d)))
  return sec, ts, compile_s, seen[0], box[0], prof


def bench_iteration_parts(cfg, params, host, iters):
  """Rollout and reference log-probs of the same rows (JAX only)."""
  r, n = host["loss_mask"].shape
  p = host["tokens"].shape[1] - n
  prompts = jnp.asarray(host["tokens"][:, :p])
  pmask = jnp.ones_like(prompts)
  gen = functools.partial(
      rollout_lib.generate, (cfg, params), None, prompts, pmask,
      max_new_tokens=n, temperature=TEMP, eos_token_ids=(),
      row_ids=jnp.arange(r, dtype=jnp.int32))
  roll_s, _ = bench.median_time(lambda: jax.block_until_ready(
      gen(rng=jax.random.key(2)).tokens), iters=max(iters // 2, 2))
  ref = functools.partial(rl_step.reference_logprobs, cfg=cfg,
                          num_response=n, chunks=1)
  toks, attn = jnp.asarray(host["tokens"]), jnp.asarray(host["attention_mask"])
  ref_s, _ = bench.median_time(lambda: jax.block_until_ready(
      ref(params, toks, attn, jnp.float32(TEMP))), iters=iters)
  return roll_s, ref_s


def bench_torch(model, host, iters):
  import torch  # pylint: disable=g-import-not-at-top
  opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
  t = {k: torch.from_numpy(np.array(v)) for k, v in host.items()}
  n = t["loss_mask"].shape[1]
  tok, am = t["tokens"].long(), t["attention_mask"].long()
  m = t["loss_mask"].float()
  w = m / m.sum(-1, keepdim=True).clamp(min=1) / (m.sum(-1) > 0).sum()
  adv = t["advantages"][:, None]

  def run():
    logits = model(input_ids=tok, attention_mask=am).logits[:, -n - 1:-1]
    logp_all = torch.log_softmax(logits.float() / TEMP, -1)
    logp = logp_all.gather(-1, tok[:, -n:, None])[..., 0]
    ratio = torch.exp(logp - t["old_logp"])
    pg = -torch.minimum(ratio * adv, ratio.clamp(1 - CLIP, 1 + CLIP) * adv)
    log_r = t["ref_logp"] - logp
    k3 = torch.expm1(log_r) - log_r
    loss = (w * (pg + BETA * k3)).sum()
    with torch.no_grad():
      entropy = -(logp_all.exp() * logp_all).sum(-1)
      (entropy * m).sum() / m.sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    losses.append(float(loss.detach()))
  losses = []
  sec, ts = bench.median_time(run, iters=iters)
  return sec, ts, torch.get_num_threads(), losses[0]


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--quick", action="store_true")
  ap.add_argument("--iters", type=int, default=5)
  ap.add_argument("--no-torch", action="store_true")
  ap.add_argument("--profile", action="store_true",
                  help="also profile one update: time per source op "
                  "('profile' in the JSON)")
  args = ap.parse_args(argv)
  dump = bench.profile_dump(args.profile)
  cfg, r, p, n = _setup(args.quick)
  host = _batch(cfg, r, p, n)
  resp_tokens = int(host["loss_mask"].sum())
  # Both sides start from the same weights: transformers' init, read back
  # with models.load_pretrained (first-step losses must agree).
  model = bench.torch_llama(cfg)
  with tempfile.TemporaryDirectory() as d:
    model.save_pretrained(d)
    cfg, params = models.load_pretrained(d, dtype="float32")
  _log("jaxdistill GRPO update ...")
  jsec, jts, compile_s, metrics, state, prof = bench_jax(
      cfg, params, host, args.iters, dump and dump.name)
  _log("rollout and reference log-probs ...")
  roll_s, ref_s = bench_iteration_parts(cfg, state["params"], host, args.iters)
  it = roll_s + ref_s + jsec
  out = {
      "config": {"model": {k: getattr(cfg, k) for k in (
          "vocab_size", "hidden_size", "intermediate_size",
          "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
          "head_dim")}, "rows": r, "prompt_len": p, "new_tokens": n,
                 "response_tokens": resp_tokens,
                 "backend": jax.default_backend()},
      "jax": {"update_s": jsec, "update_times_s": jts, "compile_s": compile_s,
              "response_tokens_per_s": resp_tokens / jsec,
              "clip_frac": metrics.get("rl/clip_frac"),
              "kl_ref": metrics.get("rl/kl_ref")},
      "iteration_jax": {"rollout_s": roll_s, "reference_logprobs_s": ref_s,
                        "update_s": jsec,
                        "rollout_share": roll_s / it,
                        "update_share": jsec / it},
      "profile": prof,
  }
  value = None
  if not args.no_torch:
    _log("PyTorch GRPO update ...")
    tsec, tts, threads, loss0 = bench_torch(model, host, args.iters)
    out["torch"] = {"update_s": tsec, "update_times_s": tts,
                    "threads": threads,
                    "response_tokens_per_s": resp_tokens / tsec,
                    "first_loss": loss0}
    out["jax"]["first_loss"] = metrics["train/loss"]
    value = tsec / jsec
  out["headline"] = {
      "name": "GRPO update step speedup vs PyTorch/transformers (same CPU, "
              "same run)",
      "value": None if value is None else round(value, 3), "unit": "x",
      "goal": ">= 2.0x", "meets_goal": bool(value is not None and value >= 2.0)}
  print(json.dumps(out))


if __name__ == "__main__":
  main()
