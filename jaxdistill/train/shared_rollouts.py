r"""Teacher rollouts shared by runs that would sample the same ones, on disk.

A teacher-policy rollout (rollout.policy='teacher') depends on the teacher,
the step's prompts, the rollout key fold_in(key(seed), step) and the sampler's
settings, never on the student's weights, the loss or the optimizer: arms of
a sweep that differ only in KL direction, learning rate or student sample
the very same tokens at every step. With `--shared_rollouts DIR`

  python -m jaxdistill.train --config configs/distill.py:policy=teacher \
      --workdir /runs/a --shared_rollouts /runs/shared_rollouts

the first run that reaches step N generates its rollout and writes it to
DIR/<key>/step_<N>.npz; a later run with the same key reads it instead of
decoding (no teacher rollout), and trains on bitwise the same arrays.
`key` is the sha256 of `describe`: every field of the config the sequences
depend on (data, seed, the rollout block, the teacher's config and sampling
temperature, the mesh and its rules, whether the behaviour log-probs are
kept), and what the run resolves from files (the tokenizer's fingerprint,
the teacher's weight files and the data files, as train/teacher_cache.py
takes them; the vocabulary sampled over, the EOS and pad ids, the mesh's
resolved shape), with the platform and the JAX version. DIR/<key>/meta.json holds that description.

Writes are atomic and the first writer wins: a step is written to a
temporary file and hard-linked into place, so two workers of one sweep that
race on a step each keep a complete file (the same bytes). A step file that
does not read back is refused, naming it.

Single-host runs only (each host would need its rows of the global batch).
"""
from __future__ import annotations

import hashlib
import io
import json
import os

import jax
import numpy as np

from jaxdistill import config_lib
from jaxdistill import losses
from jaxdistill import rollout as rollout_lib
from jaxdistill import sharding
from jaxdistill.models import hub
from jaxdistill.train import teacher_cache

META = "meta.json"
# The arrays a SequenceMaker's rollout can hand the update; a run stores
# those it made.
ARRAYS = ("tokens", "attention_mask", "loss_mask", "teacher_tokens",
          "teacher_attention_mask", "behaviour_logprobs")
FLAG = "--shared_rollouts"


def shareable(config) -> bool:
  """Whether a run's rollouts can be shared: teacher-policy rollouts (and the
  spectrum's teacher endpoint, lam = -1, which decodes with the teacher's
  program), live (a teacher cache already replaces them)."""
  return (config.rollout.get("policy") in ("teacher", "spectrum")
          and rollout_lib.sampling_policy(config.rollout)[0] == "teacher"
          and not config.loss.get("teacher_cache"))


def behaviour(config) -> bool:
  """Whether the run keeps the rollout's behaviour log-probs (batches.py:
  the sampled estimators' importance weights)."""
  return (config.loss.kind == losses.SAMPLED
          and config.loss.get("estimator") not in losses.FRESH)


def config_key(config) -> dict:
  """The config fields a teacher-policy rollout depends on (no files read):
  what arms must share to share rollouts."""
  return {"data": config.data.to_dict(), "seed": int(config.seed),
          "rollout": config.rollout.to_dict(),
          "teacher": config.teacher.to_dict(),
          "temperature": config_lib.rollout_temperatures(config)[1],
          "mesh": dict(config.mesh),
          "rules": [list(r) for r in sharding.rules_from_config(config)],
          "behaviour_logprobs": behaviour(config)}


def group(config) -> str | None:
  """The sha256 of config_key for a shareable run, else None: runs of one
  group share their rollouts when their files match too (sweep/cost.py
  counts one generation per group)."""
  if not shareable(config):
    return None
  return _digest(config_key(config))


def _teacher_weights(config):
  spec = hub.weights_spec(config.teacher)
  try:
    path = hub.resolve(spec, local_only=True)[0] if spec else None
  except (hub.HubError, FileNotFoundError):
    path = None
  return (teacher_cache.weights_fingerprint(path)
          if path and os.path.isdir(path) else None)


def describe(config, tokenizer, *, vocab: int, eos, pad: int,
             mesh_shape: dict) -> dict:
  """What a run's teacher rollouts are made from (module docstring);
  `mesh_shape`: the run's mesh, resolved ({axis: size})."""
  out = dict(config_key(config), mesh_shape=dict(mesh_shape),
             tokenizer=teacher_cache.tokenizer_fingerprint(tokenizer),
             teacher_weights=_teacher_weights(config),
             data_files=teacher_cache.data_fingerprint(config),
             vocab=int(vocab), eos=[int(e) for e in eos], pad=int(pad),
             platform=jax.devices()[0].platform, jax=jax.__version__)
  return json.loads(json.dumps(out, sort_keys=True, default=str))


def _digest(obj) -> str:
  blob = json.dumps(obj, sort_keys=True, default=str).encode()
  return hashlib.sha256(blob).hexdigest()[:16]


def _link_new(tmp: str, path: str) -> None:
  """Puts `tmp` at `path` unless a file is there already (first writer
  wins), and removes `tmp`."""
  try:
    os.link(tmp, path)
  except FileExistsError:
    pass
  finally:
    os.remove(tmp)


class Store:
  """DIR/<key>/: `get(step)` a stored rollout or None, `put(step, ...)`.

  `generated` and `read` count the steps this run decoded and read."""

  def __init__(self, directory: str, made_from: dict):
    if jax.process_count() > 1:
      raise ValueError(f"{FLAG}: single-host runs only")
    self.key = _digest(made_from)
    self.directory = os.path.join(os.path.expanduser(directory), self.key)
    self.generated = self.read = 0
    os.makedirs(self.directory, exist_ok=True)
    meta = os.path.join(self.directory, META)
    tmp = f"{meta}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
      json.dump(made_from, f, indent=2, sort_keys=True)
    _link_new(tmp, meta)
    try:
      with open(meta) as f:
        have = json.load(f)
    except ValueError as e:
      raise ValueError(f"{FLAG}: {meta}: not valid JSON ({e}); delete "
                       f"{self.directory}") from None
    if have != made_from:  # a digest collision, or an edited meta.json
      raise ValueError(f"{FLAG}: {meta} describes other rollouts than this "
                       f"run's; delete {self.directory}")

  def path(self, step: int) -> str:
    return os.path.join(self.directory, f"step_{int(step):06d}.npz")

  def get(self, step: int):
    """(arrays, metrics) of a stored step (host numpy), or None."""
    path = self.path(step)
    if not os.path.isfile(path):
      return None
    try:
      with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if not k.startswith("m/")}
        metrics = {k[2:]: float(z[k]) for k in z.files if k.startswith("m/")}
    except Exception as e:  # pylint: disable=broad-except
      raise ValueError(f"{FLAG}: {path} is unreadable ({e}); delete it") from None
    return arrays, metrics

  def put(self, step: int, batch: dict, metrics: dict) -> None:
    """Writes a step's arrays (device or host) and rollout metrics."""
    arrays = {k: np.asarray(jax.device_get(v)) for k, v in batch.items()
              if k in ARRAYS}
    arrays.update((f"m/{k}", np.float64(v)) for k, v in metrics.items())
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    path = self.path(step)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
      f.write(buf.getvalue())
    _link_new(tmp, path)

  def sequences(self, step: int, make, put, keep=None):
    """The step's (batch, metrics): read and placed with `put`, or made by
    `make()` and stored. `make()` gives {step: (batch, metrics)} for this
    step and any others decoded with it (rollout.decode_ahead): every one
    is stored, and the others go into `keep` (a dict) for their own calls."""
    got = self.get(step)
    if got is None:
      made = make()
      for s, (batch, metrics) in made.items():
        self.put(s, batch, metrics)
      self.generated += len(made)
      batch, metrics = made.pop(step)
      if keep is not None:
        keep.update(made)
      return batch, metrics
    self.read += 1
    arrays, metrics = got
    return {k: put(v) for k, v in arrays.items()}, metrics


# np.savez's zip and .npy headers per array, and the metrics: an allowance.
STEP_OVERHEAD_BYTES = 8 * 1024


def step_bytes(config) -> int:
  """Bytes of one stored step at the rollout's compiled width (prompt
  width data.max_prompt_len, every row decoded to max_new_tokens): three
  int32 [B, P+N] arrays, the teacher's own two with data.teacher_prompt, the
  float32 behaviour log-probs where kept."""
  b = int(config.data.batch_size)
  n_new = int(config.rollout.max_new_tokens)
  width = int(config.data.max_prompt_len) + n_new
  own = 0
  if config.data.get("teacher_prompt"):  # [B, Pt+N] tokens and mask
    pt = config.data.get("max_teacher_prompt_len") or config.data.max_prompt_len
    own = 2 * (int(pt) + n_new)
  n = 3 + int(behaviour(config))
  return 4 * b * (n * width + own) + STEP_OVERHEAD_BYTES


def store_bytes(configs) -> int:
  """Bytes the store keeps for these runs' configs: one copy of each group's
  steps (the longest run of a group decides)."""
  steps = {}
  for c in configs:
    key = group(c)
    if key is not None:
      steps[key] = max(steps.get(key, 0),
                       int(c.total_steps) * step_bytes(c))
  return sum(steps.values())
