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
`teacher_topk_logprobs` [B, L, K], `teacher_topk_tail` [B, L], the rollout
metrics and `made_from`) and `meta.json`: what the cache was made from
(`describe`: the data and rollout settings with a digest of the data files,
the seed, the tokenizer's fingerprint with its chat template, the teacher's
config and a fingerprint of its weight files (`weights_fingerprint`: what
it detects), k, the loss temperature, the real vocabulary) and the number of
steps. A run whose settings differ in any of these is refused, naming what
differs. Every record holds made_from too, and meta.json the records file's
sha256 (checked when the cache is opened, unless
JAXDISTILL_TEACHER_CACHE_CHECK=0): a meta.json edited after the build, a
truncated or corrupted records file are refused, naming the file.

The build checks everything it can first, writes into the sibling
DIR.building-<pid>, and swaps it in when complete: an existing cache (only
replaced with --overwrite) stays intact through an error, SIGTERM or SIGINT
(which stop after the step in flight, discard the partial cache and exit
with 128 + the signal, saying so). A build killed with SIGKILL leaves its
DIR.building-<pid>, which can be deleted.

DIR may be gs://bucket/path: the cache is built in a local temporary
directory and uploaded with meta.json last (an old meta.json is deleted
before the upload starts), so an unfinished upload has no meta.json and is
refused. A run given `loss.teacher_cache=gs://...` reads a local mirror
(storage.mirror: downloaded once per upload, into JAXDISTILL_GS_MIRROR,
default ~/.cache/jaxdistill/gs); the records' sha256 is checked on the copy.
"""
from __future__ import annotations

import ctypes
import hashlib
import io
import json
import logging
import os
import shutil
import signal

from absl import flags
from array_record.python import array_record_module
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np

from jaxdistill import cli
from jaxdistill import compile_only
from jaxdistill import config_lib
from jaxdistill import losses
from jaxdistill import models
from jaxdistill import sharding
from jaxdistill import storage
from jaxdistill.models import flops
from jaxdistill.models import hub
from jaxdistill.train import batches as train_batches
from jaxdistill.train import preempt
from jaxdistill.train import programs as train_programs
from jaxdistill.train import setup as train_setup
from jaxdistill.train import step as step_lib

META = "meta.json"
RECORDS_DIGEST = "records_sha256"  # in meta.json: the records file's sha256
# "0" skips that sha256 at open (one pass over the file, several times the
# time to read it: jaxdistill/bench/cache_check.py); a changed byte is then
# found only at the step that reads its record.
CHECK_ENV = "JAXDISTILL_TEACHER_CACHE_CHECK"
RECORDS = "topk.array_record"
ARRAYS = ("tokens", "attention_mask", "loss_mask") + step_lib.CACHE_KEYS
# meta.json's layout: 'made_from' with the fingerprints below. Every record
# also holds made_from (as JSON), so an edited meta.json is found.
FORMAT = 2
MADE_FROM = "made_from"
# A weight file's content is sampled (SAMPLES blocks of BLOCK bytes, evenly
# spaced) rather than read whole: 2 MiB per file, however large.
SAMPLES, BLOCK = 32, 1 << 16
FIELDS = ("data", "tokenizer", "teacher", "teacher_weights", "k",
          "temperature", "vocab")


def tokenizer_fingerprint(tokenizer) -> str | None:
  """sha256 of the tokenizer's vocabulary (token -> id), special tokens and
  chat template (which formats the prompts)."""
  if tokenizer is None:
    return None
  vocab = sorted(tokenizer.get_vocab().items())
  special = sorted(str(t) for t in getattr(tokenizer, "all_special_tokens", []))
  template = getattr(tokenizer, "chat_template", None)
  blob = json.dumps([vocab, special, len(tokenizer), str(template)]).encode()
  return hashlib.sha256(blob).hexdigest()[:16]


def _sha(f, start: int, length: int) -> str:
  """sha256 of `length` bytes of an open file from `start`, streamed."""
  h = hashlib.sha256()
  f.seek(start)
  while length > 0:
    chunk = f.read(min(length, 1 << 20))
    if not chunk:
      break
    h.update(chunk)
    length -= len(chunk)
  return h.hexdigest()[:16]


def file_digest(path: str) -> str:
  """sha256 of a whole file, streamed."""
  with open(path, "rb") as f:
    return _sha(f, 0, os.path.getsize(path))


def safetensors_fingerprint(path: str) -> dict:
  """{size, header, content} of a safetensors file: its size, the sha256 of
  its JSON header (every tensor's name, dtype, shape and offsets) and of its
  tensor data: whole up to SAMPLES x BLOCK bytes, else SAMPLES blocks evenly
  spaced from the first byte to the last."""
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    n = int.from_bytes(f.read(8).ljust(8, b"\0"), "little")
    start = min(8 + n, size)
    header = _sha(f, 8, start - 8)
    data = size - start
    if data <= SAMPLES * BLOCK:
      content = _sha(f, start, data)
    else:
      h = hashlib.sha256()
      for i in range(SAMPLES):
        f.seek(start + i * (data - BLOCK) // (SAMPLES - 1))
        h.update(f.read(BLOCK))
      content = h.hexdigest()[:16]
  return {"size": size, "header": header, "content": content}


def weights_fingerprint(directory: str) -> dict:
  """What loading a Hugging Face directory reads: config.json and the
  safetensors index (sha256 each), every *.safetensors file
  (safetensors_fingerprint). Detects another architecture or config, other
  files, any change of a tensor's dtype, shape or offset, and other weights
  of the same shapes (retrained or fine-tuned weights change nearly every
  sampled byte); an edit confined to bytes between the samples of a file
  larger than 2 MiB is not detected."""
  out = {}
  for name in sorted(os.listdir(directory)):
    path = os.path.join(directory, name)
    if name.endswith(".safetensors"):
      out[name] = safetensors_fingerprint(path)
    elif name in ("config.json", "model.safetensors.index.json"):
      out[name] = file_digest(path)
  return out


def prepared_fingerprint(root: str) -> dict:
  """sha256 of what a data_dir says of its prepared data sets: each
  prepared/NAME.json (its source and revision) and each dataset_info.json
  (splits, shard lengths), by path under `root`; the array_record shards
  themselves are not read. {} for a directory that does not exist."""
  out = {}
  for d, _, names in os.walk(root):
    for n in names:
      path = os.path.join(d, n)
      if n == "dataset_info.json" or (
          n.endswith(".json") and os.path.basename(d) == "prepared"):
        out[os.path.relpath(path, root)] = file_digest(path)
  return dict(sorted(out.items()))


def data_fingerprint(config) -> dict:
  """sha256 of the data files a run reads: data.records_file, the files
  in data.manual_dir (the user's MCQ files), and the data sets prepared
  under data.data_dir (prepared_fingerprint; a gs:// one through its local
  mirror), so that data prepared again at another revision is not taken for
  the old."""
  data, out = config.data, {}
  if data.get("data_dir"):
    root = (storage.mirror_dir(data.data_dir)
            if storage.looks_remote(data.data_dir)
            else os.path.expanduser(data.data_dir))
    out["data_dir"] = prepared_fingerprint(root)
  if data.get("task") == "records" and data.get("records_file"):
    path = os.path.expanduser(data.records_file)
    if os.path.isfile(path):
      out["records_file"] = file_digest(path)
  if data.get("task") == "mcq" and data.get("manual_dir"):
    root = os.path.expanduser(data.manual_dir)
    if os.path.isdir(root):
      out["manual_dir"] = {n: file_digest(os.path.join(root, n))
                           for n in sorted(os.listdir(root))
                           if os.path.isfile(os.path.join(root, n))}
  return out


def describe(config, tokenizer, vocab: int) -> dict:
  """What a cache is made from, grouped by what a mismatch is named as: the
  data and rollout settings with the data files' digests, the seed, the
  tokenizer (and chat template), the teacher's config and weights, k, the
  teacher's temperature and the real vocabulary."""
  ro = config.rollout
  data = config.data.to_dict()
  rollout = dict(policy=ro.policy)
  if ro.policy != "dataset":
    rollout.update(max_new_tokens=ro.max_new_tokens,
                   top_k=ro.get("top_k"), top_p=ro.get("top_p"),
                   eos_token_ids=ro.get("eos_token_ids"))
  teacher = {k: v for k, v in config.teacher.to_dict().items()}
  # The directory the teacher's weights are read from: a hub name as found
  # in this machine's cache (never downloaded for this).
  spec = hub.weights_spec(config.teacher)
  try:
    if spec and storage.is_gs(spec):  # its mirror, as the run loads it
      path = hub.checkpoint_dir(spec, "config.teacher.path")
    else:
      path = hub.resolve(spec, local_only=True)[0] if spec else None
  except (hub.HubError, FileNotFoundError):
    path = None
  out = {
      "data": {"data": data, "seed": int(config.seed), "rollout": rollout,
               "files": data_fingerprint(config)},
      "tokenizer": tokenizer_fingerprint(tokenizer),
      "teacher": teacher,
      # None when there is no directory (a random init, or a teacher no
      # longer on this machine: TeacherCache.check then says it cannot tell).
      "teacher_weights": (weights_fingerprint(path)
                          if path and os.path.isdir(path) else None),
      "k": int(config.loss.teacher_topk),
      "temperature": config_lib.temperatures(config)[1],
      "vocab": int(vocab),
  }
  # As meta.json will read back (tuples become lists).
  return json.loads(json.dumps(out, sort_keys=True, default=str))


def _differences(old: dict, new: dict, a_name="cache", b_name="run"
                 ) -> list[str]:
  out = []
  for name in FIELDS:
    a, b = old.get(name), new.get(name)
    if a == b:
      continue
    if isinstance(a, dict) and isinstance(b, dict):
      detail = "; ".join(config_lib.diff(a, b)[:5])
      out.append(f"{name} ({detail})")
    else:
      out.append(f"{name} ({a_name} {a!r}, {b_name} {b!r})")
  return out


def _refuse(msg: str):
  raise ValueError(f"config.loss.teacher_cache: {msg}")


class TeacherCache:
  """Random access to a cache's steps: `cache[step]` is a host batch (dict).

  Opening it checks meta.json against the records (an edited meta.json, a
  truncated or unreadable records file are refused, naming the file)."""

  def __init__(self, directory: str):
    self.source = directory  # as given: a gs:// cache is read from a mirror
    if storage.looks_remote(directory):
      try:
        directory = storage.mirror(
            storage.check(directory, "config.loss.teacher_cache", gs_ok=True),
            "config.loss.teacher_cache", marker=META)
      except FileNotFoundError as e:
        raise ValueError(f"{e}; build it with python -m "
                         "jaxdistill.train.teacher_cache") from None
    self.directory = os.path.expanduser(directory)
    self.meta_path = os.path.join(self.directory, META)
    self.records_path = os.path.join(self.directory, RECORDS)
    rebuild = "; rebuild it with python -m jaxdistill.train.teacher_cache"
    if not os.path.isdir(self.directory):
      _refuse(f"{self.directory} does not exist")
    if not os.path.isfile(self.meta_path):
      _refuse(f"{self.directory} is not a complete teacher cache (no {META})"
              f"{rebuild}")
    try:
      with open(self.meta_path) as f:
        self.meta = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
      _refuse(f"{self.meta_path}: not valid JSON ({e}){rebuild}")
    if not (isinstance(self.meta, dict) and self.meta.get("format") == FORMAT
            and isinstance(self.meta.get(MADE_FROM), dict)):
      _refuse(f"{self.meta_path}: not the meta.json of a cache of this "
              f"version (format {FORMAT}, with its fingerprints){rebuild}")
    if not os.path.isfile(self.records_path):
      _refuse(f"{self.records_path}: missing{rebuild}")
    try:
      self._reader = array_record_module.ArrayRecordReader(self.records_path)
      self.num_steps = int(self._reader.num_records())
    except Exception as e:  # pylint: disable=broad-except
      _refuse(f"{self.records_path}: unreadable ({_first_line(e)}){rebuild}")
    if self.num_steps != self.meta.get("num_steps"):
      _refuse(f"{self.records_path} holds {self.num_steps} records, "
              f"{self.meta_path} says {self.meta.get('num_steps')} (truncated "
              f"or edited){rebuild}")
    self._check_digest(rebuild)
    for step in {0, self.num_steps - 1} if self.num_steps else ():
      built = json.loads(str(self[step].get(MADE_FROM, "null")))
      if built != self.meta[MADE_FROM]:
        diffs = (_differences(built, self.meta[MADE_FROM], "records", "meta")
                 if isinstance(built, dict) else ["every field"])
        _refuse(f"{self.meta_path} was edited after the build: it differs "
                f"from what the records were built from in "
                f"{', '.join(diffs)}{rebuild}")

  def _check_digest(self, rebuild: str) -> None:
    """The records file against the digest meta.json took at the build: a
    byte changed on disk is found here, not at the step that reads it (one
    streamed pass over the file, about a second a GB), unless CHECK_ENV is
    0."""
    check = os.environ.get(CHECK_ENV, "1")
    if check not in ("0", "1"):
      _refuse(f"{CHECK_ENV}={check!r}: must be 1 (check the sha256 of "
              f"{self.records_path} at open, the default) or 0 (do not)")
    want = self.meta.get(RECORDS_DIGEST)
    if want is None:  # a cache built before digests were recorded
      _warn_once(f"{self.meta_path} records no {RECORDS_DIGEST} (a cache "
                 "built before they were): the records' bytes cannot be "
                 f"checked at open{rebuild} to have them checked")
      return
    if check == "0":
      _warn_once(f"{CHECK_ENV}=0: the sha256 of {self.records_path} is not "
                 "checked; a changed byte is found only at the step that "
                 "reads its record")
      return
    have = file_digest(self.records_path)
    if have != want:
      _refuse(f"{self.records_path}: sha256 {have} is not the {want} that "
              f"{self.meta_path} recorded at the build (the file changed on "
              f"disk){rebuild}")

  def __len__(self):
    return self.num_steps

  def __getitem__(self, step: int) -> dict:
    try:
      (raw,) = self._reader.read([int(step)])
      with np.load(io.BytesIO(raw), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}
    except Exception as e:  # pylint: disable=broad-except
      _refuse(f"{self.records_path}: record {step} is unreadable "
              f"({_first_line(e)}); rebuild it with python -m "
              "jaxdistill.train.teacher_cache")

  def check(self, config, tokenizer, vocab: int) -> None:
    """Refuses a cache that does not match the run, naming what differs.
    A teacher directory no longer on this machine cannot be compared: a
    warning says so (the run loads no teacher weights)."""
    run = describe(config, tokenizer, vocab)
    path = config.teacher.get("path")
    if path and run["teacher_weights"] is None:
      logging.warning("config.teacher.path: %s is not here: cannot check that "
                      "the teacher cache %s was made from its weights", path,
                      self.directory)
      run["teacher_weights"] = self.meta[MADE_FROM].get("teacher_weights")
    diffs = _differences(self.meta[MADE_FROM], run)
    if diffs:
      _refuse(f"{self.directory} was made for another run; it differs in "
              + ", ".join(diffs))
    if int(config.total_steps) > self.num_steps:
      _refuse(f"{self.directory} holds {self.num_steps} steps, the run needs "
              f"total_steps={config.total_steps}")


_WARNED = set()


def _warn_once(msg: str) -> None:
  """A warning logged once per process (a cache opened again says it once)."""
  if msg not in _WARNED:
    _WARNED.add(msg)
    logging.warning("%s", msg)


def _first_line(e: BaseException) -> str:
  return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


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

  # The head is cut (to whole 128-lane blocks, padding columns masked), never
  # the [B, C, V] product: slicing the product below the padded embedding
  # fails to compile on a TPU (see losses/fused.py).
  width = min(-(-vocab // 128) * 128, head.shape[1])
  head = head[:, :width]

  def one(hc):
    u = jnp.einsum("bcd,dv->bcv", hc, head, preferred_element_type=jnp.float32)
    if width != vocab:
      col = jax.lax.broadcasted_iota(jnp.int32, u.shape, 2)
      u = jnp.where(col < vocab, u, -jnp.inf)
    return losses.topk.topk_of_scaled(u / temperature, k)

  out = jax.lax.map(one, h)
  return jax.tree.map(
      lambda x: jnp.moveaxis(x, 0, 1).reshape((b, n * chunk) + x.shape[3:])[:, :l],
      out)


def topk_fn(config, tcfg, vocab, shard=None):
  """The jitted teacher pass of a cache build: (teacher params, tokens,
  attention mask) -> the teacher's top-k (TeacherTopK) at every position.
  `shard`: a sharding.Activations (the run's mesh), or None."""
  k = int(config.loss.teacher_topk)

  def teacher_topk(tp, tokens, attn):
    h = models.apply(tcfg, tp, tokens, attn, return_hidden=True, shard=shard)
    head = models.output_head(tcfg, tp)
    if shard is not None:  # FSDP: gathered where it is used
      head = shard(head, None, "vocab")
    return topk_from_hidden(h, head, k=k,
                            temperature=config_lib.temperatures(config)[1],
                            vocab=vocab,
                            chunk=int(config.loss.get("chunk_size") or 128))
  return jax.jit(teacher_topk)


def programs(config, scfg, tcfg, vocab, mesh, rules):
  """compile_only.Programs of a cache build: the teacher's rollouts (unless
  the data's own text is cached) and the top-k pass over their sequences."""
  b = int(config.data.batch_size)
  seq = int(config.data.max_prompt_len) + int(config.rollout.max_new_tokens)
  teacher = train_programs.abstract_params(tcfg, mesh, rules)
  ro = config.rollout
  out = []
  if ro.policy == "teacher":
    out.append(train_programs.rollout_program(
        "rollout", scfg, tcfg, None, teacher, mesh, rules, vocab, rows=b,
        policy="teacher", prompt_len=config.data.max_prompt_len,
        max_new_tokens=ro.max_new_tokens,
        temperature=config_lib.temperatures(config)[0],
        teacher_temperature=config_lib.temperatures(config)[1],
        top_k=ro.get("top_k"), top_p=ro.get("top_p")))
  tokens = train_programs.batch_struct((b, seq), jnp.int32, mesh, rules)
  out.append(compile_only.Program(
      "teacher_topk", topk_fn(config, tcfg, vocab,
                              sharding.Activations(mesh, rules)),
      (teacher, tokens, tokens),
      model_flops=flops.forward_flops_per_token(tcfg, seq) * b * seq,
      bytes_accessed=flops.weight_bytes(tcfg),
      limit_bytes=flops.weight_bytes(tcfg) / mesh.devices.size))
  return out


def compile_for(config, slice_name: str) -> dict:
  """--compile_only: the cache build's programs compiled for a TPU slice on
  this host (no weights, data or TPU) -> compile_only's report."""
  _check_buildable(config)
  config_lib.validate(config)
  config_lib.validate_run(config)
  target = compile_only.target(slice_name)
  mesh = sharding.make_mesh(dict(config.mesh), devices=target.devices)
  rules = sharding.rules_from_config(config)
  scfg = train_setup.model_config(config.student, "student")
  tcfg = train_setup.model_config(config.teacher, "teacher")
  vocab = train_setup.compile_vocab(config, scfg, tcfg)
  with sharding.compiling_for(target.chip.platform):
    return compile_only.compile_programs(
        programs(config, scfg, tcfg, vocab, mesh, rules), target)


def _advice(row) -> str:
  del row
  return ("try a smaller config.data.batch_size or config.loss.chunk_size, "
          "or a slice with more chips")


def _check_buildable(config) -> None:
  if config.loss.get("teacher_topk") is None:
    raise ValueError("config.loss.teacher_topk: set the k to cache")
  if config.rollout.policy not in ("teacher", "dataset"):
    raise ValueError("config.rollout.policy: only 'teacher' and 'dataset' "
                     f"rollouts can be cached, got {config.rollout.policy!r}")
  if config.loss.get("teacher_cache") is not None:
    raise ValueError("config.loss.teacher_cache: must be None when building")


def _check_out(out_dir: str, overwrite: bool) -> bool:
  """Whether out_dir holds a cache to replace; refuses what must not be."""
  if storage.is_gs(out_dir):
    storage.check_writable_dir(out_dir)
  else:
    cli.check_out_dir(out_dir, "--out")
  entries = (storage.listdir(out_dir) if storage.isdir(out_dir) else [])
  if not entries:
    return False
  own = {META, RECORDS}
  other = sorted(set(entries) - own)
  if other:
    raise ValueError(f"--out: {out_dir} holds {other[0]!r}, which is not "
                     "part of a teacher cache; choose a new or empty directory")
  if not overwrite:
    raise ValueError(f"--out: {out_dir} holds a teacher cache; pass "
                     "--overwrite to replace it (the old one is kept until "
                     "the new one is complete)")
  return True


def _swap_in(new: str, out_dir: str) -> None:
  """Puts the complete cache `new` at out_dir, replacing what is there in
  one step (renameat2 RENAME_EXCHANGE where the OS has it; else two renames,
  between which the old cache waits at <out_dir>.old-<pid>)."""
  if not os.path.isdir(out_dir):
    os.replace(new, out_dir)
    return
  libc = ctypes.CDLL(None, use_errno=True)
  exchange = getattr(libc, "renameat2", None)
  at_fdcwd, rename_exchange = -100, 2
  if exchange is not None and exchange(at_fdcwd, os.fsencode(new), at_fdcwd,
                                       os.fsencode(out_dir),
                                       rename_exchange) == 0:
    shutil.rmtree(new)  # now the old cache
    return
  old = f"{out_dir}.old-{os.getpid()}"
  os.replace(out_dir, old)
  os.replace(new, out_dir)
  shutil.rmtree(old)


def _upload(local: str, out_dir: str) -> None:
  """The complete cache `local` uploaded to gs:// `out_dir`: an old cache's
  meta.json is deleted first and the new one uploaded last, so a kill part
  way leaves a directory without meta.json, which is refused as incomplete
  (rebuild it), never an old meta.json beside new records."""
  storage.remove(f"{out_dir}/{META}")
  storage.upload_dir(local, out_dir, last=META)


def build(config, out_dir: str, *, overwrite: bool = False,
          devices=None) -> str:
  """One teacher pass over a run's steps; writes out_dir (module docstring).

  Every check comes first; the cache is built in <out_dir>.building-<pid>
  (on gs://, a local temporary directory, then uploaded: _upload) and moved
  into place when complete, so an existing cache (replaced only
  with `overwrite`) is intact until then. An error, SIGTERM or SIGINT
  during the build removes the partial one (SIGTERM / SIGINT after the step
  in flight, then train.preempt.Preempted saying what is kept).
  """
  _check_buildable(config)
  config_lib.validate(config)
  config_lib.validate_run(config)
  out_dir = storage.check(out_dir, "--out", gs_ok=True)
  gs = storage.is_gs(out_dir)
  if not gs:
    out_dir = os.path.realpath(out_dir)
  replacing = _check_out(out_dir, overwrite)
  mesh = sharding.make_mesh(dict(config.mesh), devices=devices)
  rules = sharding.rules_from_config(config)
  scfg, tcfg, tokenizer, vocab, batches = train_setup.pair_and_batches(config)
  config_lib.check_fits(config, {"student": scfg, "teacher": tcfg}, vocab)
  made_from = describe(config, tokenizer, vocab)
  kept = (f"the old cache in {out_dir} is kept unchanged" if replacing else
          f"nothing was written to {out_dir}")
  total = int(config.total_steps)
  stop = preempt.StopOnSignal()
  # Built locally; on gs:// then uploaded (_upload), no directory renamed.
  tmp = (storage.local_staging("jaxdistill-teacher-cache-") if gs
         else f"{out_dir}.building-{os.getpid()}")
  compile_only.check_on_devices(programs(config, scfg, tcfg, vocab, mesh, rules),
                                list(mesh.devices.flat), _advice)
  try:
    _, t_key = train_setup.init_keys(config.seed)
    tparams = train_setup.load_params(tcfg, config.teacher, mesh, rules, t_key,
                                      "teacher")
    make_sequences = train_batches.SequenceMaker(
        config, scfg, tcfg, mesh, rules, tokenizer, vocab_size=vocab)
    teacher_topk = topk_fn(config, tcfg, vocab, sharding.Activations(mesh, rules))

    seed_key = jax.random.key(config.seed)
    os.makedirs(tmp, exist_ok=True)
    writer = array_record_module.ArrayRecordWriter(
        os.path.join(tmp, RECORDS), "group_size:1")
    try:
      for step in range(total):
        if stop.requested(step):
          break
        rng = jax.random.fold_in(seed_key, step)
        batch, ro_metrics = make_sequences(batches[step], None, tparams, rng)
        t = teacher_topk(tparams, batch["tokens"], batch["attention_mask"])
        arrays = dict(zip(step_lib.CACHE_KEYS, t))
        arrays.update((n, batch[n]) for n in ("tokens", "attention_mask",
                                              "loss_mask"))
        arrays = {n: np.asarray(jax.device_get(x)) for n, x in arrays.items()}
        arrays.update((f"m/{n}", np.float64(v)) for n, v in ro_metrics.items())
        arrays[MADE_FROM] = np.array(json.dumps(made_from, sort_keys=True))
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        writer.write(buf.getvalue())
    finally:
      writer.close()
    if stop.stopped_at is not None:
      raise preempt.Preempted(
          f"stopped by {signal.Signals(stop.signum).name} after {stop.stopped_at}"
          f" of {total} steps of the teacher cache: the partial cache was "
          f"discarded and {kept}; run the same command to build it", stop.signum)
    with open(os.path.join(tmp, META), "w") as f:
      json.dump({"format": FORMAT, MADE_FROM: made_from, "num_steps": total,
                 RECORDS_DIGEST: file_digest(os.path.join(tmp, RECORDS))},
                f, indent=2, sort_keys=True, default=str)
    if gs:
      _upload(tmp, out_dir)
      shutil.rmtree(tmp, ignore_errors=True)
    else:
      _swap_in(tmp, out_dir)
    if stop.signum is not None:  # arrived while the last records were saved
      raise preempt.Preempted(
          f"stopped by {signal.Signals(stop.signum).name} once the teacher "
          f"cache was complete: it is in {out_dir}", stop.signum)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)  # gone once swapped in
    raise
  finally:
    stop.restore()
  return out_dir


def main(argv):
  del argv
  f = flags.FLAGS
  if f.compile_only:
    rep = compile_for(f.config, f.compile_only)
    compile_only.emit(rep, f.json)
    compile_only.check(rep, advice=_advice)
    return
  out = build(f.config, f.out, overwrite=f.overwrite)
  print(f"teacher cache written to {out}")


def define_flags():
  config_flags.DEFINE_config_file(
      "config", None, "Training config (configs/*.py[:arg]) of the run to "
      "cache for.", lock_config=True)
  flags.DEFINE_string("out", None, "Cache directory to write.")
  flags.DEFINE_bool("overwrite", False, "Replace the cache in --out (kept "
                    "until the new one is complete).")
  compile_only.define_flags()
  flags.mark_flags_as_required(["config", "out"])


if __name__ == "__main__":
  cli.run_absl(main, define_flags)
