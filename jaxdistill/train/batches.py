"""Data for the training loop: prompt/sequence batches and rollouts.

`make_batches(config, tokenizer, vocab)` returns a random-access sequence:
`batches[step]` is the host batch of that step (a dict of numpy arrays), so
the data position of a run is just its step and resuming needs no iterator
state. Prompt batches hold {'prompt', 'prompt_mask', ...task metadata};
sequence batches (policy='dataset', fixed teacher/reference text) hold
{'tokens', 'attention_mask', 'response_mask'}. With data.teacher_prompt,
prompt batches also hold the teacher's own {'teacher_prompt',
'teacher_prompt_mask'}; the training batch then carries the teacher's
sequence [teacher prompt | the same response] as 'teacher_tokens' /
'teacher_attention_mask' (jaxdistill.train.step.TEACHER_KEYS).

`SequenceMaker` turns a host batch into the [B, L] training sequences of
jaxdistill.train.step: by sampling rollouts from the configured policy, or, for a
fixed dataset, by placing the stored sequences on the mesh.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import config_lib
from jaxdistill import losses
from jaxdistill import rollout as rollout_lib
from jaxdistill import sharding
from jaxdistill.data import pipeline


class SyntheticPrompts:
  """Random left-padded prompts (and sequences) from a seed: for tests/benchmarks."""

  def __init__(self, *, batch_size, prompt_len, vocab, seed, fixed=False,
               response_len=0, min_token=3):
    self.b, self.p, self.v, self.seed = batch_size, prompt_len, vocab, seed
    self.fixed, self.n, self.lo = fixed, response_len, min_token

  def __len__(self):
    return 1 << 30

  def __getitem__(self, step):
    rs = np.random.default_rng([self.seed, 0 if self.fixed else int(step)])
    lens = rs.integers(max(1, self.p // 2), self.p + 1, size=self.b)
    mask = (np.arange(self.p)[None] >= (self.p - lens)[:, None]).astype(np.int32)
    prompt = rs.integers(self.lo, self.v, size=(self.b, self.p)) * mask
    out = {"prompt": prompt.astype(np.int32), "prompt_mask": mask}
    if self.n:  # a fixed "reference response" per row, for policy='dataset'
      resp = rs.integers(self.lo, self.v, size=(self.b, self.n)).astype(np.int32)
      rmask = np.ones((self.b, self.n), np.int32)
      out = {"tokens": np.concatenate([out["prompt"], resp], 1),
             "attention_mask": np.concatenate([mask, rmask], 1),
             "response_mask": np.concatenate([np.zeros_like(mask), rmask], 1)}
    return out


@functools.partial(jax.jit, static_argnames=("shape", "shard"))
def _uniforms(key, shape, shard):
  """[B, L] float32 uniforms in [0, 1), rows over the batch axes."""
  u = jax.random.uniform(key, shape)
  return u if shard is None else jax.lax.with_sharding_constraint(u, shard)


def make_batches(config, tokenizer, vocab):
  d = config.data
  if d.task == "synthetic":
    return SyntheticPrompts(
        batch_size=d.batch_size, prompt_len=d.max_prompt_len, vocab=vocab,
        seed=config.seed, fixed=bool(d.get("fixed_batch", False)),
        response_len=(config.rollout.max_new_tokens
                      if config.rollout.policy == "dataset" else 0))
  return pipeline.batches_from_config(config, tokenizer)


class SequenceMaker:
  """Host batch + current params -> device batch of sequences, rollout metrics."""

  def __init__(self, config, student_cfg, teacher_cfg, mesh, rules,
               tokenizer=None, vocab_size=None):
    """`vocab_size`: the shared real vocabulary rollouts sample over (train.py
    passes the one the loss compares over); default len(tokenizer), else the
    models' smallest embedding width. `shared` (None, or a
    train.shared_rollouts.Store the loop sets) gives calls with a `step`
    their sequences from the store, decoding only the steps it lacks."""
    self.shared = None
    self.ro = config.rollout
    # data.bucket: rollouts are cut after their longest response, rounded up
    # to a multiple of it (the loss then runs on [B, P + that] columns).
    self.bucket = config.data.get("bucket")
    if vocab_size is None and tokenizer is not None:
      vocab_size = len(tokenizer)
    self.vocab = None if vocab_size is None else int(vocab_size)
    # Only the sampled estimators' importance weights need the mixture's
    # log-probs (exact KLs take the full vocabulary at every prefix).
    self.behaviour = (config.loss.kind == losses.SAMPLED
                      and config.loss.estimator not in losses.FRESH
                      and config.rollout.policy != "student")
    # The paper's sampled KL draws a fresh token at every position: one
    # uniform per position, made here so that the loss stays pure.
    self.fresh = (config.loss.kind == losses.SAMPLED
                  and config.loss.estimator in losses.FRESH)
    self.temps = config_lib.rollout_temperatures(config)
    self.scfg, self.tcfg = student_cfg, teacher_cfg
    self.mesh, self.rules = mesh, rules
    # Pad with what the data pipeline pads with; stop on the models' EOS ids
    # and the tokenizer's (chat templates end turns with their own token).
    self.pad = getattr(tokenizer, "pad_token_id", None) or 0
    self.eos = rollout_lib.eos_ids(
        student_cfg, teacher_cfg, tokenizer=tokenizer,
        override=config.rollout.get("eos_token_ids"))

  def put(self, x):
    """A host array of the global batch on the mesh, rows over the batch axes
    (every host holds the global batch; each places its devices' rows)."""
    return sharding.put_global(
        x, sharding.batch_sharding(self.mesh, np.ndim(x), self.rules))

  def __call__(self, host_batch, params, teacher_params, rng, step=None):
    make = lambda: self._sequences(host_batch, params, teacher_params, rng)
    if self.shared is not None and step is not None:
      batch, stats = self.shared.sequences(step, make, self.put)
    else:
      batch, stats = make()
    if self.fresh:
      shard = (None if self.mesh is None
               else sharding.batch_sharding(self.mesh, 2, self.rules))
      batch["fresh_uniforms"] = _uniforms(
          jax.random.fold_in(rng, 0xF5E5), tuple(batch["tokens"].shape), shard)
    return batch, stats

  def _sequences(self, host_batch, params, teacher_params, rng):
    ro = self.ro
    if ro.policy == "dataset":
      batch = {"tokens": self.put(host_batch["tokens"]),
               "attention_mask": self.put(host_batch["attention_mask"]),
               "loss_mask": self.put(host_batch["response_mask"])}
      n_resp = float(np.sum(host_batch["response_mask"]))
      n_tok = float(np.sum(host_batch["attention_mask"]))
      return batch, {"rollout/tokens": n_tok,
                     "rollout/len": n_resp / len(host_batch["tokens"])}
    prompts = self.put(host_batch["prompt"])
    pmask = self.put(host_batch["prompt_mask"])
    own = {}  # the teacher's own prompt: its cache starts from it
    if "teacher_prompt" in host_batch:
      own = dict(teacher_prompts=self.put(host_batch["teacher_prompt"]),
                 teacher_prompt_mask=self.put(
                     host_batch["teacher_prompt_mask"]))
    # The spectrum's endpoints decode with the pure policy's program.
    policy, lam, top_k, top_p = rollout_lib.sampling_policy(ro)
    r = rollout_lib.generate(
        (self.scfg, params), (self.tcfg, teacher_params), prompts, pmask,
        rng=rng, policy=policy, lam=lam,
        max_new_tokens=int(ro.max_new_tokens), temperature=self.temps[0],
        teacher_temperature=self.temps[1],
        top_k=top_k, top_p=top_p, pad_token_id=self.pad,
        eos_token_ids=self.eos, mesh=self.mesh, rules=self.rules,
        return_logprobs=self.behaviour, vocab_size=self.vocab,
        decode_layout=ro.get("decode_layout") or "auto",
        **(own if policy != "student" else {}))
    batch = {"tokens": r.tokens, "attention_mask": r.attention_mask,
             "loss_mask": r.loss_mask}
    if own:  # [teacher prompt | the rollout's response columns]
      resp = r.tokens[:, prompts.shape[1]:]
      batch["teacher_tokens"] = jnp.concatenate(
          [own["teacher_prompts"].astype(jnp.int32), resp], axis=1)
      batch["teacher_attention_mask"] = jnp.concatenate(
          [own["teacher_prompt_mask"].astype(jnp.int32), r.response_mask],
          axis=1)
    if self.behaviour:  # [B, P+N], aligned with tokens (0 on the prompt)
      batch["behaviour_logprobs"] = jnp.concatenate(
          [jnp.zeros(r.prompt_mask.shape, jnp.float32), r.behaviour_logprobs],
          axis=1)
    stats = jax.device_get({"len": r.lengths.mean(), "frac": r.student_fraction,
                            "ended": r.ended.mean(), "longest": r.lengths.max(),
                            "tokens": batch["attention_mask"].sum()})
    if self.bucket:  # drop the columns after the longest response (bucketed)
      n = int(ro.max_new_tokens)
      keep = pipeline.bucketed(int(stats["longest"]), self.bucket, n)
      if keep < n:  # every key ends with the same n response columns
        batch = {k: v[:, :v.shape[1] - n + keep] for k, v in batch.items()}
    return batch, {"rollout/len": float(stats["len"]),
                   "rollout/student_fraction": float(stats["frac"]),
                   "rollout/ended_frac": float(stats["ended"]),
                   "rollout/tokens": float(stats["tokens"])}


