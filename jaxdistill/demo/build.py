"""The demo's assets: a tokenizer, a teacher and a student, built once.

Each asset lives in a directory named by a hash of the settings that made it
(`cache_key`), so a second run with the same settings reuses it and a change
of any setting builds a new one. The teacher and student are trained from
scratch by the real training loop (jaxdistill.train, loss.kind='ce' on fixed
reference responses) and exported as Hugging Face directories.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys

from jaxdistill import config_lib
from jaxdistill import models
from jaxdistill.data import pipeline
from jaxdistill.data import tokenizer as tok_lib
from jaxdistill.train import loop as train_loop


PREFIX = "[demo]"  # a worker process's is "[demo worker K/N]"


def log(msg: str):
  print(f"{PREFIX} {msg}", file=sys.stderr, flush=True)


def cache_key(*parts, root: str | None = None) -> str:
  """A short hash of `parts` (as JSON). With `root`, a path inside it counts
  by its part relative to `root`: what lives in a workdir is named by its
  content, so a copied or moved workdir keeps every key."""
  if root:
    parts = _relative(parts, os.path.abspath(root) + os.sep)
  text = json.dumps(parts, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:12]


def _relative(obj, prefix: str):
  if isinstance(obj, str):
    return obj[len(prefix):] if obj.startswith(prefix) else obj
  if isinstance(obj, dict):
    return {k: _relative(v, prefix) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_relative(v, prefix) for v in obj]
  return obj


def _done(path: str) -> bool:
  return os.path.isfile(os.path.join(path, "DONE"))


def _mark_done(path: str, info: dict):
  with open(os.path.join(path, "DONE"), "w") as f:
    json.dump(info, f, indent=2, sort_keys=True, default=str)


def write_records(records, root: str, name: str) -> str:
  """Writes `records` as <root>/data/<name>-<hash>.jsonl (once); returns the
  path, which training configs read with data.task='records'."""
  path = os.path.join(root, "data", f"{name}-{cache_key(records)}.jsonl")
  if not os.path.isfile(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pipeline.write_records(records, path)
  return path


# --------------------------------------------------------------- tokenizer

def build_tokenizer(out_dir: str, texts, vocab_size: int):
  """The demo's byte-level BPE (tok_lib.train_bpe_tokenizer with
  split_words=False): merges may cross word boundaries but not digits, so the
  fixed task instruction costs a few tokens while every digit stays its own
  token (which keeps arithmetic learnable). Special tokens and chat template
  are the shared ones, so loading and prompting follow the real-checkpoint
  path. Built into a temporary directory, marked DONE, renamed into place.
  """
  if _done(out_dir):
    return tok_lib.load_tokenizer(out_dir)
  tmp = out_dir + ".tmp"
  shutil.rmtree(tmp, ignore_errors=True)
  tok_lib.train_bpe_tokenizer(list(texts), vocab_size, tmp, split_words=False,
                              max_token_length=48, model_max_length=512)
  _mark_done(tmp, {"vocab_size": vocab_size})
  shutil.rmtree(out_dir, ignore_errors=True)
  os.replace(tmp, out_dir)
  return tok_lib.load_tokenizer(out_dir)


# ------------------------------------------------------------------ models

MAX_POSITIONS = 256  # of the demo's models: prompt + response must fit


def model_init(arch: dict, tokenizer) -> dict:
  """ModelConfig fields of a Llama 3 model sized `arch` for `tokenizer`."""
  return dict(arch, family="llama", vocab_size=len(tokenizer),
              bos_token_id=int(tokenizer.bos_token_id),
              eos_token_id=(int(tokenizer.eos_token_id),),
              max_position_embeddings=MAX_POSITIONS,
              tie_word_embeddings=True)


# How an arm stores and updates the student's weights (config.grid.precisions):
# float32 master weights, or bfloat16 weights and moments (train/optim.py);
# the demo computes in float32 either way.
PRECISIONS = ("float32", "bfloat16")


def base_train_config(cfg, *, tok_dir: str, records: str, seed: int):
  """configs/distill.py shrunk to the demo: one CPU device, float32, quiet;
  `records` is a records file (write_records)."""
  c = config_lib.load_config("configs/distill.py")
  c.seed = int(seed)
  c.tokenizer = tok_dir
  c.progress = False
  c.log_every = 10
  c.eval_every = c.ckpt_every = 1 << 20
  c.keep_ckpts = 1
  # remat 'none': tiny models on a CPU have memory to spare, and recomputing
  # costs time.
  c.student.update(dtype="float32", param_dtype="float32", remat="none")
  c.teacher.update(dtype="float32", param_dtype="float32")
  # Padded to each batch's longest prompt and response (multiples of 8):
  # the demo's responses end well before max_new_tokens.
  c.data.update(task="records", records_file=records,
                batch_size=int(cfg.batch_size),
                max_prompt_len=int(cfg.max_prompt_len), bucket=8)
  c.rollout.update(max_new_tokens=int(cfg.max_new_tokens))
  c.loss.update(chunk_size=256, fused=False)
  c.optim.update(grad_accum=1)  # one device: micro-batches would only cost time
  c.mesh = dict(data=1, fsdp=1, tensor=1)
  return c


def sft_config(cfg, *, init: dict, tok_dir: str, records: str, steps: int,
               lr: float, seed: int, warmup: float = 0.05):
  """A configs/distill.py training config for supervised fine-tuning: AdamW,
  linear warm-up over the fraction `warmup` of `steps`, then cosine decay."""
  c = base_train_config(cfg, tok_dir=tok_dir, records=records, seed=seed)
  c.student.update(path=None, init=init)
  c.teacher.update(path=None)
  c.loss.kind = "ce"
  # Every demonstration token weighs the same (the distillation grid keeps
  # the paper's per-completion mean).
  c.loss.reduction = "token_mean"
  c.rollout.policy = "dataset"
  c.total_steps = int(steps)
  c.progress = True  # minutes of training: show step, loss and ETA
  c.ckpt_every = min(int(steps), 100)
  c.track_sparsity = False
  c.optim.update(lr=float(lr), schedule="cosine", warmup_steps=max(1, round(steps * warmup)),
                 final_lr_frac=0.1, weight_decay=0.01)
  return c


def grpo_config(cfg, *, tok_dir: str, records: str):
  """configs/grpo_countdown.py shrunk to the demo's RLVR stage (cfg.rlvr):
  GRPO on `records` (the distillation prompts) with the arithmetic verifier,
  one CPU device, float32; the student's path is each arm's (study.rlvr)."""
  r = cfg.rlvr
  c = config_lib.load_config("configs/grpo_countdown.py")
  c.tokenizer = tok_dir
  c.progress = False
  c.total_steps = int(r.iterations)
  c.eval_every = c.ckpt_every = int(r.iterations)  # sparsity at the end
  c.keep_ckpts = 1
  c.student.update(dtype="float32", param_dtype="float32", remat="none")
  c.data.update(task="records", records_file=records,
                batch_size=int(r.prompts),
                max_prompt_len=int(cfg.max_prompt_len), bucket=8)
  c.rollout.update(group_size=int(r.group_size),
                   max_new_tokens=int(cfg.max_new_tokens),
                   temperature=float(cfg.grid.student_temperature))
  c.grpo.update(num_minibatches=int(r.minibatches))
  c.optim.update(lr=float(r.lr), warmup_steps=0, grad_accum=1)
  c.mesh = dict(data=1, fsdp=1, tensor=1)
  return c


def model_job(name: str, cfg, root: str, *, arch: dict, tokenizer,
              tok_dir: str, records: list[dict], steps: int, lr: float,
              seed: int, warmup: float = 0.05):
  """(its directory, its training config) of one model (train_model)."""
  init = model_init(arch, tokenizer)
  data = write_records(records, root, name)
  config = sft_config(cfg, init=init, tok_dir=tok_dir, records=data,
                      steps=steps, lr=lr, seed=seed, warmup=warmup)
  # Named by every training setting; the data and tokenizer by their content
  # (the records file's name is its hash), not by where the workdir is.
  settings = config.to_dict()
  settings["tokenizer"] = open(os.path.join(tok_dir, "tokenizer.json")).read()
  settings["data"]["records_file"] = os.path.basename(data)
  return os.path.join(root, f"{name}-{cache_key(name, settings)}"), config


def is_built(name: str, cfg, root: str, **job) -> bool:
  """Whether train_model(name, cfg, root, **job) would find it cached."""
  return _done(model_job(name, cfg, root, **job)[0])


def train_model(name: str, cfg, root: str, *, devices, **job) -> str:
  """Trains (or finds in the cache) one model; returns its HF directory.
  `job`: model_job's settings (arch, tokenizer, tok_dir, records, steps, lr,
  seed, warmup)."""
  out, config = model_job(name, cfg, root, **job)
  steps = config.total_steps
  hf = os.path.join(out, models.checkpoint.EXPORT_DIR)
  if _done(out):
    log(f"{name}: cached at {hf}")
    return hf
  resuming = os.path.isdir(os.path.join(out, "checkpoints"))
  log(f"{name}: {'resuming' if resuming else 'training from scratch'} "
      f"({steps} steps) in {out}")
  # A killed run resumes from its last checkpoint; a run of other settings
  # (an older jaxdistill) is moved aside by overwrite.
  last = train_loop.train(config, out, overwrite=True, devices=devices)
  _mark_done(out, {"final_loss": last.get("train/loss"), "steps": steps})
  # Checkpoints are only needed to resume; the HF export is what is reused.
  shutil.rmtree(os.path.join(out, "checkpoints"), ignore_errors=True)
  return hf
