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

Decoding ahead (rollout.decode_ahead = k > 1, teacher-policy runs): a teacher
rollout does not depend on the student, so the steps of an aligned chunk
[c k, c k + k) are decoded in one call of k B rows, each row with its own
step's key and its row id within its step (rollout/loop.py: the keys a
one-step call gives it), and kept until their step. The decode loop reads
the teacher's weights once per token for k B rows instead of B: on a TPU,
where a decode step is bound by those reads, the rollout's time per step
falls towards 1/k of it. Chunks are aligned to multiples of k from step 0,
so a resumed run decodes the same chunks; the last one may be shorter (one
more compilation). The rows' logits are computed in a k-times larger batch:
the tokens equal the one-step calls' where a row's logits do not depend on
the batch (tested on CPU meshes, tests/train/decode_ahead_test.py); a
different matmul tiling can flip a near-tie elsewhere, which is why
decode_ahead is part of the shared rollouts' key.
"""
from __future__ import annotations

import functools

import jax
from jax.experimental import multihost_utils
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


def decode_ahead(config) -> int:
  """The steps one rollout call serves: rollout.decode_ahead (default 1,
  checked: a positive int) for rollouts that are the teacher's alone
  (policy 'teacher', the spectrum's lam = -1), 1 for any other policy, whose
  rollouts depend on the student's weights at their own step (so a grid can
  set it for all its arms). A teacher cache reads its rollouts: 1."""
  k = config.rollout.get("decode_ahead")
  k = 1 if k is None else k
  if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
    raise ValueError(f"rollout.decode_ahead must be a positive int, got {k!r}")
  if (k == 1 or config.rollout.get("policy") not in ("teacher", "spectrum")
      or rollout_lib.sampling_policy(config.rollout)[0] != "teacher"
      or config.loss.get("teacher_cache")):
    return 1
  if config.data.get("bucket"):
    raise ValueError("rollout.decode_ahead > 1 needs data.bucket unset "
                     "(the steps' prompt widths must match)")
  return int(k)


def _to_host(x):
  """A (global) device array as one host numpy array."""
  if jax.process_count() > 1:
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))


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
    self.ahead = decode_ahead(config)
    self._source = None  # (batches, seed key, total steps): ahead_from
    self._kept = {}  # step -> (batch, metrics) decoded ahead
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

  def ahead_from(self, batches, seed_key, total_steps: int) -> None:
    """Where decode_ahead finds the other steps of a chunk: their host
    batches `batches[s]` and keys fold_in(seed_key, s) (train/loop.py's)."""
    self._source = (batches, seed_key, int(total_steps))

  def chunk(self, step: int) -> range:
    """The steps decoded in one call with `step` (decode_ahead)."""
    if self.ahead == 1:
      return range(step, step + 1)
    lo = step - step % self.ahead
    return range(lo, min(lo + self.ahead, self._source[2]))

  def __call__(self, host_batch, params, teacher_params, rng, step=None):
    if self.ahead > 1 and step is None:
      raise ValueError("rollout.decode_ahead: calls need their step")
    if self.ahead > 1 and self._source is None:
      raise ValueError("rollout.decode_ahead: call ahead_from first")

    def make():  # {step: (batch, metrics)} of the call's chunk
      if self.ahead == 1:
        return {step: self._sequences(host_batch, params, teacher_params, rng)}
      batches, seed_key, _ = self._source
      steps = list(self.chunk(step))
      hosts = [host_batch if s == step else batches[s] for s in steps]
      keys = [rng if s == step else jax.random.fold_in(seed_key, s)
              for s in steps]
      return dict(zip(steps, self._sequences_many(hosts, params,
                                                  teacher_params, keys)))

    if step is not None and step in self._kept:
      batch, stats = self._kept.pop(step)
    elif self.shared is not None and step is not None:
      batch, stats = self.shared.sequences(step, make, self.put,
                                           keep=self._kept)
    else:
      made = make()
      batch, stats = made.pop(step) if step is not None else made.popitem()[1]
      self._kept.update(made)
    if self.fresh:
      shard = (None if self.mesh is None
               else sharding.batch_sharding(self.mesh, 2, self.rules))
      batch["fresh_uniforms"] = _uniforms(
          jax.random.fold_in(rng, 0xF5E5), tuple(batch["tokens"].shape), shard)
    return batch, stats

  def _sequences_many(self, host_batches, params, teacher_params, keys):
    """[(batch, metrics)] of several steps' teacher rollouts, decoded in one
    call: their prompts stacked, row b of step i keyed by keys[i] and row
    id b; the result split back per step on the host and placed like the
    store's reads (shared_rollouts.Store.sequences)."""
    b = len(host_batches[0]["prompt"])
    names = [k for k in ("prompt", "prompt_mask", "teacher_prompt",
                         "teacher_prompt_mask") if k in host_batches[0]]
    for h in host_batches[1:]:
      for k in names:
        if np.shape(h[k]) != np.shape(host_batches[0][k]):
          raise ValueError(
              f"rollout.decode_ahead: the steps' {k!r} shapes differ "
              f"({np.shape(h[k])} vs {np.shape(host_batches[0][k])}); "
              "prompt widths must not vary by step (data.bucket unset)")
    stacked = {k: np.concatenate([np.asarray(h[k]) for h in host_batches])
               for k in names}
    rows = np.concatenate([np.full((b,), i, np.int64)
                           for i in range(len(host_batches))])
    row_keys = jnp.stack(keys)[rows]  # [k B] keys: row r has its step's
    row_ids = np.tile(np.arange(b, dtype=np.int32), len(host_batches))
    batch, per_row = self._sequences(stacked, params, teacher_params, row_keys,
                                     row_ids=row_ids, trim=False)
    host = {k: _to_host(v) for k, v in batch.items()}
    per_row = {k: _to_host(v) for k, v in per_row.items()}
    out = []
    for i in range(len(host_batches)):
      rows_i = slice(i * b, (i + 1) * b)
      part = {k: v[rows_i] for k, v in host.items()}
      r = {k: v[rows_i] for k, v in per_row.items()}
      # The one-step call's float32 reductions (exact: integer sums).
      mean = lambda n, d: float(np.float32(n) / np.float32(d))
      stats = {"len": mean(r["lengths"].sum(), b),
               "frac": mean(r["from_student"].sum(),
                            max(int(r["lengths"].sum()), 1)),
               "ended": mean(r["ended"].sum(), b),
               "longest": int(r["lengths"].max()),
               "tokens": int(part["attention_mask"].sum())}
      out.append(self._trimmed({k: self.put(v) for k, v in part.items()},
                               stats))
    return out

  def _sequences(self, host_batch, params, teacher_params, rng, row_ids=None,
                 trim=True):
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
        decode_layout=ro.get("decode_layout") or "auto", row_ids=row_ids,
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
    if not trim:  # _sequences_many splits, then reduces per step
      return batch, {"lengths": r.lengths, "ended": r.ended,
                     "from_student": r.from_student & (r.response_mask > 0)}
    stats = jax.device_get({"len": r.lengths.mean(), "frac": r.student_fraction,
                            "ended": r.ended.mean(), "longest": r.lengths.max(),
                            "tokens": batch["attention_mask"].sum()})
    return self._trimmed(batch, stats)

  def _trimmed(self, batch, stats):
    if self.bucket:  # drop the columns after the longest response (bucketed)
      n = int(self.ro.max_new_tokens)
      keep = pipeline.bucketed(int(stats["longest"]), self.bucket, n)
      if keep < n:  # every key ends with the same n response columns
        batch = {k: v[:, :v.shape[1] - n + keep] for k, v in batch.items()}
    return batch, {"rollout/len": float(stats["len"]),
                   "rollout/student_fraction": float(stats["frac"]),
                   "rollout/ended_frac": float(stats["ended"]),
                   "rollout/tokens": float(stats["tokens"])}


