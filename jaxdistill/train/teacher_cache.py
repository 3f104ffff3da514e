r"""A teacher cache: the teacher's top-k log-probs of every training step, on disk.

Rollouts from the teacher (rollout.policy='teacher') or fixed dataset text
('dataset') do not depend on the student, so one pass of the teacher can
produce, for each step of a run, its sequences and the teacher's top-k at
every position. A run with `loss.teacher_cache=DIR` then reads them by step
and trains without the teacher's weights in memory (no teacher forward, no
teacher rollout), and equals the live-teacher run at the same k:

  python -m jaxdistill.train.teacher_cache \
    --config configs/distill.py:policy=teacher,topk=64 \
    --config.student.path=... --config.teacher.path=... --out /data/t64
  python -m jaxdistill.train --config configs/distill.py:policy=teacher,topk=64 \
    --config.student.path=... --config.teacher.path=... \
    --config.loss.teacher_cache=/data/t64 --workdir /runs/t64

DIR holds `topk.array_record` (one record per step: an .npz of `tokens`,
`attention_mask`, `loss_mask` [B, L], `teacher_topk_ids`,
`teacher_topk_logprobs` [B, L, K], `teacher_topk_tail` [B, L], and the
rollout metrics) and `meta.json`: what the cache was made from (the data and
rollout settings, the seed, the tokenizer's fingerprint, the teacher, k, the
loss temperature, the real vocabulary, the number of steps). A run whose
settings differ in any of these is refused, naming what differs. meta.json is
written last: a cache without it is incomplete and is refused.
"""
from __future__ import annotations

import hashlib
import io
import json
import os

from absl import flags
from array_record.python import array_record_module
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np

from jaxdistill import cli
from jaxdistill import config_lib
from jaxdistill import losses
from jaxdistill import models
from jaxdistill import sharding
from jaxdistill.train import batches as train_batches
from jaxdistill.train import setup as train_setup
from jaxdistill.train import step as step_lib

META = "meta.json"
RECORDS = "topk.array_record"
ARRAYS = ("tokens", "attention_mask", "loss_mask") + step_lib.CACHE_KEYS


def tokenizer_fingerprint(tokenizer) -> str | None:
  """sha256 of the tokenizer's vocabulary (token -> id) and special tokens."""
  if tokenizer is None:
    return None
  vocab = sorted(tokenizer.get_vocab().items())
  special = sorted(str(t) for t in getattr(tokenizer, "all_special_tokens", []))
  blob = json.dumps([vocab, special, len(tokenizer)]).encode()
  return hashlib.sha256(blob).hexdigest()[:16]


def describe(config, tokenizer, vocab: int) -> dict:
  """What a cache is made from, grouped by what a mismatch is named as."""
  ro = config.rollout
  data = config.data.to_dict()
  rollout = dict(policy=ro.policy)
  if ro.policy != "dataset":
    rollout.update(max_new_tokens=ro.max_new_tokens, temperature=ro.temperature,
                   top_k=ro.get("top_k"), top_p=ro.get("top_p"),
                   eos_token_ids=ro.get("eos_token_ids"))
  teacher = {k: v for k, v in config.teacher.to_dict().items()}
  out = {
      "data": {"data": data, "seed": int(config.seed), "rollout": rollout},
      "tokenizer": tokenizer_fingerprint(tokenizer),
      "teacher": teacher,
      "k": int(config.loss.teacher_topk),
      "temperature": float(config.loss.temperature),
      "vocab": int(vocab),
  }
  # As meta.json will read back (tuples become lists).
  return json.loads(json.dumps(out, sort_keys=True, default=str))


def _differences(old: dict, new: dict) -> list[str]:
  out = []
  for name in ("data", "tokenizer", "teacher", "k", "temperature", "vocab"):
    a, b = old.get(name), new.get(name)
    if a == b:
      continue
    if isinstance(a, dict) and isinstance(b, dict):
      detail = "; ".join(config_lib.diff(a, b)[:5])
      out.append(f"{name} ({detail})")
    else:
      out.append(f"{name} (cache {a!r}, run {b!r})")
  return out


class TeacherCache:
  """Random access to a cache's steps: `cache[step]` is a host batch (dict)."""

  def __init__(self, directory: str):
    self.directory = os.path.expanduser(directory)
    meta = os.path.join(self.directory, META)
    if not os.path.isfile(meta):
      raise ValueError(f"config.loss.teacher_cache: {self.directory} is not a "
                       f"complete teacher cache (no {META}); build it with "
                       "python -m jaxdistill.train.teacher_cache")
    with open(meta) as f:
      self.meta = json.load(f)
    self._reader = array_record_module.ArrayRecordReader(
        os.path.join(self.directory, RECORDS))
    self.num_steps = int(self._reader.num_records())

  def __len__(self):
    return self.num_steps

  def __getitem__(self, step: int) -> dict:
    (raw,) = self._reader.read([int(step)])
    with np.load(io.BytesIO(raw), allow_pickle=False) as z:
      return {k: z[k] for k in z.files}

  def check(self, config, tokenizer, vocab: int) -> None:
    """Refuses a cache that does not match the run, naming what differs."""
    diffs = _differences(self.meta["made_from"],
                         describe(config, tokenizer, vocab))
    if diffs:
      raise ValueError(
          f"config.loss.teacher_cache: {self.directory} was made for another "
          "run; it differs in " + ", ".join(diffs))
    if int(config.total_steps) > self.num_steps:
      raise ValueError(
          f"config.loss.teacher_cache: {self.directory} holds "
          f"{self.num_steps} steps, the run needs total_steps="
          f"{config.total_steps}")


class CachedSequences:
  """The SequenceMaker of a cached run: places a cache record on the mesh."""

  def __init__(self, put):
    self._put = put

  def __call__(self, host_batch, params, teacher_params, rng):
    del params, teacher_params, rng
    batch = {k: self._put(host_batch[k]) for k in ARRAYS}
    metrics = {k[len("m/"):]: float(v) for k, v in host_batch.items()
               if k.startswith("m/")}
    return batch, metrics


def topk_from_hidden(hidden, head, *, k, temperature, vocab, chunk=128):
  """TeacherTopK of hidden @ head, [B, L, K], computed `chunk` positions at a
  time (never the whole [B, L, V] logits); the same einsum as the fused loss."""
  b, l, d = hidden.shape
  n = -(-l // chunk)
  h = jnp.pad(hidden, [(0, 0), (0, n * chunk - l), (0, 0)])
  h = jnp.moveaxis(h.reshape(b, n, chunk, d), 1, 0)  # [N, B, C, D]

  def one(hc):
    u = jnp.einsum("bcd,dv->bcv", hc, head, preferred_element_type=jnp.float32)
    return losses.topk.topk_of_scaled(u[..., :vocab] / temperature, k)

  out = jax.lax.map(one, h)
  return jax.tree.map(
      lambda x: jnp.moveaxis(x, 0, 1).reshape((b, n * chunk) + x.shape[3:])[:, :l],
      out)


def build(config, out_dir: str, *, devices=None) -> str:
  """One teacher pass over a run's steps; writes out_dir (module docstring)."""
  if config.loss.get("teacher_topk") is None:
    raise ValueError("config.loss.teacher_topk: set the k to cache")
  if config.rollout.policy not in ("teacher", "dataset"):
    raise ValueError("config.rollout.policy: only 'teacher' and 'dataset' "
                     f"rollouts can be cached, got {config.rollout.policy!r}")
  if config.loss.get("teacher_cache"):
    raise ValueError("config.loss.teacher_cache: must be None when building")
  config_lib.validate(config)
  mesh = sharding.make_mesh(dict(config.mesh), devices=devices)
  rules = sharding.rules_from_config(config)
  scfg, tcfg, tokenizer, vocab, batches = train_setup.pair_and_batches(config)
  seed_key = jax.random.key(config.seed)
  _, t_key = train_setup.init_keys(config.seed)
  tparams = train_setup.load_params(tcfg, config.teacher, mesh, rules, t_key,
                                    "teacher")
  make_sequences = train_batches.SequenceMaker(config, scfg, tcfg, mesh, rules,
                                            tokenizer, vocab_size=vocab)
  k = int(config.loss.teacher_topk)
  losses.topk.check_k(k, vocab, "config.loss.teacher_topk")

  @jax.jit
  def teacher_topk(tp, tokens, attn):
    h = models.apply(tcfg, tp, tokens, attn, return_hidden=True)
    return topk_from_hidden(h, models.output_head(tcfg, tp), k=k,
                            temperature=float(config.loss.temperature),
                            vocab=vocab,
                            chunk=int(config.loss.get("chunk_size") or 128))

  os.makedirs(out_dir, exist_ok=True)
  for stale in (META, RECORDS):
    if os.path.exists(os.path.join(out_dir, stale)):
      os.remove(os.path.join(out_dir, stale))
  tmp = os.path.join(out_dir, RECORDS + ".tmp")
  writer = array_record_module.ArrayRecordWriter(tmp, "group_size:1")
  try:
    for step in range(int(config.total_steps)):
      rng = jax.random.fold_in(seed_key, step)
      batch, ro_metrics = make_sequences(batches[step], None, tparams, rng)
      t = teacher_topk(tparams, batch["tokens"], batch["attention_mask"])
      arrays = dict(zip(step_lib.CACHE_KEYS, t))
      arrays.update((n, batch[n]) for n in ("tokens", "attention_mask",
                                            "loss_mask"))
      arrays = {n: np.asarray(jax.device_get(x)) for n, x in arrays.items()}
      arrays.update((f"m/{n}", np.float64(v)) for n, v in ro_metrics.items())
      buf = io.BytesIO()
      np.savez(buf, **arrays)
      writer.write(buf.getvalue())
  finally:
    writer.close()
  os.replace(tmp, os.path.join(out_dir, RECORDS))
  with open(os.path.join(out_dir, META), "w") as f:
    json.dump({"made_from": describe(config, tokenizer, vocab),
               "num_steps": int(config.total_steps)}, f, indent=2,
              sort_keys=True, default=str)
  return out_dir


def main(argv):
  del argv
  out = build(flags.FLAGS.config, flags.FLAGS.out)
  print(f"teacher cache written to {out}")


def define_flags():
  config_flags.DEFINE_config_file(
      "config", None, "Training config (configs/*.py[:arg]) of the run to "
      "cache for.", lock_config=True)
  flags.DEFINE_string("out", None, "Cache directory to write.")
  flags.mark_flags_as_required(["config", "out"])


if __name__ == "__main__":
  cli.run_absl(main, define_flags)
