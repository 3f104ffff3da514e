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
race on a step each keep a complete file (the same bytes). Every step file
carries what it holds (`_entry`: its step, the store's key, each array's
dtype and shape, and a sha256 of them all), and is checked against it and
against the run's batch (rows, widths, which arrays) when read. Opening the
store checks every step file already there in the same way, so a damaged
store (a truncated or edited file, another step's file copied in, arrays of
another width, a malformed meta.json) is refused, naming the file, before
the run writes anything or computes a step.

Single-host runs only (each host would need its rows of the global batch).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re

import jax
import numpy as np

from jaxdistill import config_lib
from jaxdistill import losses
from jaxdistill import rollout as rollout_lib
from jaxdistill import sharding
from jaxdistill.models import hub
from jaxdistill.train import teacher_cache

META = "meta.json"
ENTRY = "_entry"  # in a step file: JSON of what it holds (Store.put)
# The arrays a SequenceMaker's rollout can hand the update; a run stores
# those it made.
ARRAYS = ("tokens", "attention_mask", "loss_mask", "teacher_tokens",
          "teacher_attention_mask", "behaviour_logprobs")
FLAG = "--shared_rollouts"
_STEP_FILE = re.compile(r"step_(\d+)\.npz")


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


def expected(config) -> dict:
  """{name: (rows, most columns)} of the arrays a run's stored steps hold:
  tokens and both masks [B, P+N]; the behaviour log-probs where kept,
  aligned with tokens; the teacher's own prompt and mask [B, Pt+N] with
  data.teacher_prompt (P, Pt: the widths data.max_prompt_len and
  data.max_teacher_prompt_len; N: rollout.max_new_tokens)."""
  b, n = int(config.data.batch_size), int(config.rollout.max_new_tokens)
  width = int(config.data.max_prompt_len) + n
  names = ["tokens", "attention_mask", "loss_mask"]
  names += ["behaviour_logprobs"] if behaviour(config) else []
  out = dict.fromkeys(names, (b, width))
  pt = config_lib.teacher_prompt_len(config)
  if pt is not None:
    out.update(dict.fromkeys(("teacher_tokens", "teacher_attention_mask"),
                             (b, pt + n)))
  return out


def _checksum(arrays: dict) -> str:
  h = hashlib.sha256()
  for k in sorted(arrays):
    a = np.ascontiguousarray(arrays[k])
    h.update(json.dumps([k, a.dtype.str, list(a.shape)]).encode())
    h.update(a.tobytes())
  return h.hexdigest()


def _entry(step: int, key: str, arrays: dict) -> dict:
  return {"step": int(step), "key": key, "sha256": _checksum(arrays),
          "arrays": {k: [np.asarray(v).dtype.str, list(np.shape(v))]
                     for k, v in sorted(arrays.items())}}


class Store:
  """DIR/<key>/: `get(step)` a stored rollout or None, `put(step, ...)`.

  `expect` ({name: (rows, most columns)}, `expected(config)`): the batch
  this run trains on; a stored step must hold exactly those arrays, each
  with those rows and at most those columns (tokens, masks and behaviour
  log-probs one width, the teacher's pair another). `generated` and `read`
  count the steps this run decoded and read."""

  def __init__(self, directory: str, made_from: dict, expect: dict | None = None):
    if jax.process_count() > 1:
      raise ValueError(f"{FLAG}: single-host runs only")
    self.key = _digest(made_from)
    self.expect = expect
    root = os.path.expanduser(directory)
    if os.path.exists(root) and not os.path.isdir(root):
      raise ValueError(f"{FLAG}: {root} is a file, not a directory")
    self.directory = os.path.join(root, self.key)
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
    for name in sorted(os.listdir(self.directory)):
      m = _STEP_FILE.fullmatch(name)
      if m:
        self._load(os.path.join(self.directory, name), int(m.group(1)))

  def path(self, step: int) -> str:
    return os.path.join(self.directory, f"step_{int(step):06d}.npz")

  def _load(self, path: str, step: int):
    """(arrays, metrics) of the step file at `path`, checked against its
    entry, this store and `expect`; ValueError naming the file otherwise."""
    def bad(why):
      return ValueError(f"{FLAG}: {path} {why}; delete it (the step is "
                        "decoded again)")
    try:
      with np.load(path, allow_pickle=False) as z:
        held = {k: z[k] for k in z.files}
      entry = json.loads(str(held.pop(ENTRY)))
    except KeyError:
      raise bad("has no entry (not written by this version's store)") from None
    except Exception as e:  # pylint: disable=broad-except
      raise bad(f"is unreadable ({type(e).__name__}: {e})") from None
    if entry.get("key") != self.key:
      raise bad(f"belongs to the rollouts {entry.get('key')!r}, not {self.key!r}")
    if entry.get("step") != step:
      raise bad(f"holds step {entry.get('step')!r}, not {step}")
    if entry != _entry(step, self.key, held):
      raise bad("does not match its entry (arrays edited or damaged)")
    arrays = {k: v for k, v in held.items() if not k.startswith("m/")}
    if self.expect is not None:
      self._check_shapes(arrays, bad)
    metrics = {k[2:]: float(v) for k, v in held.items() if k.startswith("m/")}
    return arrays, metrics

  def _check_shapes(self, arrays: dict, bad) -> None:
    if sorted(arrays) != sorted(self.expect):
      raise bad(f"holds the arrays {sorted(arrays)}; this run's batch has "
                f"{sorted(self.expect)}")
    widths = {}
    for k, (rows, most) in self.expect.items():
      shape = np.shape(arrays[k])
      if len(shape) != 2 or shape[0] != rows or not 0 < shape[1] <= most:
        raise bad(f"holds {k} of shape {shape}; this run's is [{rows}, at "
                  f"most {most}]")
      widths.setdefault(k.startswith("teacher_"), set()).add(shape[1])
    for teacher, seen in widths.items():
      if len(seen) > 1:
        raise bad(f"holds {'teacher ' if teacher else ''}arrays of widths "
                  f"{sorted(seen)}, which must be one")

  def get(self, step: int):
    """(arrays, metrics) of a stored step (host numpy), or None."""
    path = self.path(step)
    if not os.path.isfile(path):
      return None
    return self._load(path, step)

  def put(self, step: int, batch: dict, metrics: dict) -> None:
    """Writes a step's arrays (device or host) and rollout metrics, with
    their entry."""
    arrays = {k: np.asarray(jax.device_get(v)) for k, v in batch.items()
              if k in ARRAYS}
    arrays.update((f"m/{k}", np.float64(v)) for k, v in metrics.items())
    entry = json.dumps(_entry(step, self.key, arrays), sort_keys=True)
    buf = io.BytesIO()
    np.savez(buf, **arrays, **{ENTRY: np.array(entry)})
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


# np.savez's zip and .npy headers per array, the metrics and the entry: an
# allowance.
STEP_OVERHEAD_BYTES = 8 * 1024


def step_bytes(config) -> int:
  """Bytes of one stored step at the rollout's compiled width (every row
  decoded to max_new_tokens): the arrays of `expected`, 4 bytes each
  (int32 tokens and masks, float32 log-probs)."""
  return (sum(4 * rows * width for rows, width in expected(config).values())
          + STEP_OVERHEAD_BYTES)


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
