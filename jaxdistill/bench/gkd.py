r"""End-to-end race: one on-policy distillation step, jaxdistill vs TRL's GKDTrainer.

  pip install -e '.[bench]'               # TRL (and torch) for this benchmark
  python -m jaxdistill.bench.gkd          # vocab 8192, batch 8, 32 + 64 tokens
  python -m jaxdistill.bench.gkd --quick  # tiny, a smoke run

One step = the student samples a response to every prompt (temperature 1, no
top-k/top-p, no EOS: all N tokens), the teacher scores the sequences, the
loss is the exact token-level REVERSE KL, KL(q_student || p_teacher) summed
over the vocabulary and averaged over response tokens, and AdamW (lr 1e-5,
betas 0.9/0.999, eps 1e-8, no weight decay, constant schedule, gradient
clipping at global norm 1.0) updates the student.

jaxdistill: the training loop's own pieces, train_batches.SequenceMaker
(rollout.generate with policy='student') then step.train_step with
step.make_loss_fn (loss.kind='reverse') and step.make_optimizer, jitted and
donated as jaxdistill/train/loop.py does.

TRL 1.16 (trl.experimental.gkd.GKDTrainer), configured for the same thing:
lmbda=1.0 (student-generated data at every step), beta=1.0, temperature=1.0,
max_new_tokens=N, lr_scheduler_type='constant', weight_decay=0,
max_grad_norm=1.0, float32 on this CPU. TRL's divergence convention (read in
its generalized_jsd_loss): beta=0 is F.kl_div(student_log_probs,
teacher_log_probs) = KL(teacher || student), the forward KL; beta=1 is
F.kl_div(teacher_log_probs, student_log_probs) = KL(student || teacher), the
reverse KL; in between the generalized JSD. beta=1.0 is therefore the same
reverse KL as jaxdistill's kind='reverse' (loss temperature 1 on both sides;
TRL's compute_loss uses 1). Its loss is summed over the response tokens and
divided by their number (num_items_in_batch), as token_mean here. A step is
timed from the Trainer's on_step_begin to on_step_end (generation, both
forwards, backward, clipping, AdamW).

Both sides load the same tiny random Llama student and teacher, written once
with transformers' save_pretrained, and get the same prompts. The headline is
the ratio of median step times (same CPU, same run). One JSON object on
stdout; progress on stderr.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxdistill import losses as losses_lib
from jaxdistill import models
from jaxdistill import sharding
from jaxdistill.bench import torch_peer
from jaxdistill.train import batches as train_batches
from jaxdistill.train import step as step_lib

LR = 1e-5
INSTALL = ("bench.gkd needs TRL: pip install -e '.[bench]' (or "
           "pip install 'trl==1.16.0' next to torch==2.13.0)")


def _log(*a):
  print(*a, file=sys.stderr, flush=True)


def _shapes(quick: bool) -> dict:
  """Student/teacher HF Llama fields, batch, prompt and response lengths."""
  if quick:
    s = dict(vocab_size=512, hidden_size=32, intermediate_size=64,
             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    t = dict(s, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
    return dict(student=s, teacher=t, batch=2, prompt_len=8, new_tokens=8)
  s = dict(vocab_size=8192, hidden_size=128, intermediate_size=384,
           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
  t = dict(s, hidden_size=256, intermediate_size=768, num_hidden_layers=4)
  return dict(student=s, teacher=t, batch=8, prompt_len=32, new_tokens=64)


def save_models(shapes: dict, root: str) -> tuple[str, str]:
  """Random float32 HF Llama student and teacher saved under root; no EOS."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  dirs = []
  for i, name in enumerate(("student", "teacher")):
    cfg = transformers.LlamaConfig(
        **shapes[name], max_position_embeddings=1024, rope_theta=500000.0,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
        pad_token_id=0, initializer_range=0.1)
    torch.manual_seed(i)
    model = transformers.LlamaForCausalLM(cfg).float()
    model.generation_config.eos_token_id = None
    path = f"{root}/{name}"
    model.save_pretrained(path)
    dirs.append(path)
  return dirs[0], dirs[1]


def _prompts(shapes: dict, seed: int = 0) -> np.ndarray:
  rs = np.random.default_rng(seed)
  return rs.integers(3, shapes["student"]["vocab_size"],
                     size=(shapes["batch"], shapes["prompt_len"])).astype(np.int32)


def _config(n: int) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      # Both models at temperature 1.0 (config_lib.temperatures' default),
      # as TRL's GKDTrainer here.
      rollout=dict(policy="student", lam=None, max_new_tokens=n,
                   eos_token_ids=None),
      data=dict(),
      loss=dict(kind="reverse", beta=1.0, reduction="token_mean"),
      optim=dict(lr=LR, schedule="constant", warmup_steps=0, weight_decay=0.0,
                 b1=0.9, b2=0.999, eps=1e-8, clip_norm=1.0, grad_accum=1)))


def bench_jax(student_dir, teacher_dir, prompts, n, steps, warmup=2):
  """Per-step seconds of rollout + update, as jaxdistill/train/loop.py runs them
  (two warm-up steps: the second recompiles for the donated state's layout)."""
  scfg, sp = models.load_pretrained(student_dir)
  tcfg, tp = models.load_pretrained(teacher_dir)
  config = _config(n)
  mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1),
                            devices=jax.devices()[:1])
  vocab = scfg.vocab_size
  optimizer, schedule = step_lib.make_optimizer(config.optim, 1000)
  loss_fn = step_lib.make_loss_fn(config, scfg, tcfg, vocab)
  update = jax.jit(functools.partial(
      step_lib.train_step, optimizer=optimizer, schedule=schedule,
      loss_fn=loss_fn), donate_argnums=0)
  make = train_batches.SequenceMaker(config, scfg, tcfg, mesh,
                                  sharding.DEFAULT_RULES, vocab_size=vocab)
  host = {"prompt": prompts, "prompt_mask": np.ones_like(prompts)}
  state = {"params": sp, "opt_state": optimizer.init(sp),
           "step": jnp.zeros((), jnp.int32)}
  key = jax.random.key(0)
  times, losses = [], []
  for i in range(warmup + steps):
    t0 = time.perf_counter()
    batch, _ = make(host, state["params"], tp, jax.random.fold_in(key, i))
    batch["weights"] = losses_lib.reduction_weights(batch["loss_mask"], "token_mean")
    state, metrics = update(state, tp, batch)
    loss = float(metrics["train/loss"])  # the loop reads its metrics back
    dt = time.perf_counter() - t0
    _log(f"jax step {i}: {dt:.3f}s loss {loss:.4f}")
    if i >= warmup:
      times.append(dt)
      losses.append(loss)
  return times, losses, int(np.asarray(batch["loss_mask"]).sum())


def bench_trl(student_dir, teacher_dir, prompts, n, steps, warmup=1):
  """Per-step seconds of TRL's GKDTrainer.train (on_step_begin -> end)."""
  try:
    import datasets  # pylint: disable=g-import-not-at-top
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
    from trl.experimental.gkd import GKDConfig  # pylint: disable=g-import-not-at-top
    from trl.experimental.gkd import GKDTrainer
  except ImportError as e:
    raise ImportError(f"{INSTALL} ({e})") from e

  b, p = prompts.shape
  vocab = int(transformers.AutoConfig.from_pretrained(student_dir).vocab_size)
  tok, collate, times, timer = torch_peer.trl_pieces(vocab, p, n, "trl")

  with tempfile.TemporaryDirectory() as out:
    args = GKDConfig(
        output_dir=out, lmbda=1.0, beta=1.0, temperature=1.0,
        max_new_tokens=n, per_device_train_batch_size=b,
        gradient_accumulation_steps=1, max_steps=warmup + steps,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
        max_grad_norm=1.0, use_cpu=True, bf16=False, fp16=False,
        report_to=[], save_strategy="no", logging_steps=10**6,
        dataloader_num_workers=0, disable_dropout=True, seed=0,
        disable_tqdm=True,
        max_length=None)
    data = datasets.Dataset.from_dict(
        {"prompt": [list(map(int, r)) for r in prompts] * (warmup + steps)})
    student = transformers.AutoModelForCausalLM.from_pretrained(
        student_dir, dtype=torch.float32)
    teacher = transformers.AutoModelForCausalLM.from_pretrained(
        teacher_dir, dtype=torch.float32)
    for m in (student, teacher):
      m.generation_config.eos_token_id = None
    trainer = GKDTrainer(model=student, teacher_model=teacher, args=args,
                         train_dataset=data, data_collator=collate,
                         processing_class=tok, callbacks=[timer])
    trainer.generation_config.eos_token_id = None
    with contextlib.redirect_stdout(sys.stderr):  # Trainer prints a summary
      trainer.train()
  return times[warmup:], torch.get_num_threads()


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--quick", action="store_true")
  ap.add_argument("--steps", type=int, default=5)
  args = ap.parse_args(argv)
  try:
    import trl  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    sys.exit(INSTALL)
  shapes = _shapes(args.quick)
  prompts = _prompts(shapes)
  n = shapes["new_tokens"]
  with tempfile.TemporaryDirectory() as root:
    sdir, tdir = save_models(shapes, root)
    _log("jaxdistill on-policy step ...")
    jts, jlosses, resp = bench_jax(sdir, tdir, prompts, n, args.steps)
    _log("TRL GKDTrainer step ...")
    tts, threads = bench_trl(sdir, tdir, prompts, n, args.steps)
  jsec, tsec = statistics.median(jts), statistics.median(tts)
  ratio = tsec / jsec
  out = {
      "config": {**shapes, "steps": args.steps, "loss": "reverse KL, token mean",
                 "trl": {"lmbda": 1.0, "beta": 1.0, "temperature": 1.0,
                         "max_new_tokens": n, "lr": LR, "max_grad_norm": 1.0,
                         "lr_scheduler_type": "constant"},
                 "backend": jax.default_backend()},
      "jax": {"step_s": jsec, "step_times_s": jts, "steps_per_s": 1 / jsec,
              "losses": jlosses, "response_tokens": resp},
      "trl": {"step_s": tsec, "step_times_s": tts, "steps_per_s": 1 / tsec,
              "torch_threads": threads},
      "headline": {
          "name": "on-policy distillation steps/s, jaxdistill / TRL GKDTrainer "
                  "(same CPU, same run)",
          "value": round(ratio, 3), "unit": "x", "goal": ">= 3.0x",
          "meets_goal": bool(ratio >= 3.0)},
  }
  print(json.dumps(out))


if __name__ == "__main__":
  main()
