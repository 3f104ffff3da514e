"""Checkpoints and data sets by local directory or Hugging Face hub name.

  local_dir, info = hub.resolve("Qwen/Qwen2.5-0.5B-Instruct")       # main
  local_dir, info = hub.resolve("Qwen/Qwen2.5-0.5B-Instruct@<commit>")
  info   # {'id': 'Qwen/Qwen2.5-0.5B-Instruct', 'revision': 'main', 'commit': <40 hex>}
  hub.checkpoint_dir(spec, "config.student.path")   # + the training-workdir rule

A spec is a local directory or a hub repo id `org/name`, optionally with a
revision after `@` (a branch, tag or 40-hex commit). A directory that exists
always wins over a hub id of the same spelling. Hub repos go through
huggingface_hub's cache (HF_HOME / HF_HUB_CACHE, HF_HUB_OFFLINE, HF_TOKEN):
only the files loading needs are downloaded (MODEL_FILES), with a progress
bar on process 0 only; on several hosts each host resolves from its own
cache. Every failure is a one-line HubError (a ValueError): a repo missing
from the cache while offline, a gated repo without a token or licence, an
unknown revision.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re

import huggingface_hub
from huggingface_hub import constants as hf_constants
from huggingface_hub import errors as hf_errors
from huggingface_hub import file_download
import jax

from jaxdistill import storage

# What loading a checkpoint reads: its config, weights (one file or shards and
# their index), generation settings and tokenizer with its chat template.
# Repos may hold more (Llama's original/ consolidated weights): not fetched.
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors",
               "model-*.safetensors", "model.safetensors.index.json",
               "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "added_tokens.json", "vocab.json",
               "merges.txt", "tokenizer.model", "chat_template.jinja",
               "chat_template.json")

# What a model's shapes need (compile-only, and every check made before the
# weights are loaded): its config, and its tokenizer for the vocabulary.
CONFIG_FILES = ("config.json", "generation_config.json", "tokenizer.json",
                "tokenizer_config.json", "special_tokens_map.json",
                "added_tokens.json", "vocab.json", "merges.txt",
                "tokenizer.model", "chat_template.jinja", "chat_template.json")

# Where a training workdir keeps its Hugging Face export of the student.
EXPORT_DIR = "hf_student"

_REPO = r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*"
_SPEC = re.compile(rf"^(?P<id>{_REPO})(?:@(?P<rev>[\w./-]+))?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# Online look-ups cost a request each: one per spec and process is enough.
_RESOLVED: dict[tuple, tuple[str, dict]] = {}
_LOGGED: set[tuple] = set()


class HubError(ValueError):
  """A hub name that cannot be resolved; the message is one line."""


class NotFound(FileNotFoundError, ValueError):
  """No checkpoint where a field points: a missing file, and a bad value of
  the field (callers catch either)."""


def parse(spec) -> tuple[str, str | None] | None:
  """(repo id, revision or None) of `org/name[@rev]`; None for anything else
  (a path, an empty value)."""
  m = _SPEC.match(str(spec or ""))
  return (m.group("id"), m.group("rev")) if m else None


def is_hub_id(spec) -> bool:
  """A hub name that no local directory shadows."""
  return (parse(spec) is not None
          and not os.path.isdir(os.path.expanduser(str(spec))))


def weights_spec(mcfg) -> str | None:
  """Where a model block of a config (student, teacher: path, preset, init)
  loads its weights from: its `path`, unless `preset` or `init` is given, in
  which case the model is randomly initialised with those shapes and `path`
  is not read (configs may default `path` to a hub id that a runlocal `init`
  or a `--config.student.preset=...` then never touches)."""
  if not mcfg or mcfg.get("preset") or mcfg.get("init"):
    return None
  return mcfg.get("path") or None


def repo_url(repo_id: str, repo_type: str = "model") -> str:
  prefix = "" if repo_type == "model" else f"{repo_type}s/"
  return f"https://huggingface.co/{prefix}{repo_id}"


def _storage(repo_id: str, repo_type: str) -> str:
  return os.path.join(hf_constants.HF_HUB_CACHE, file_download.repo_folder_name(
      repo_id=repo_id, repo_type=repo_type))


def _cached_revisions(repo_id, repo_type) -> list[str]:
  root = _storage(repo_id, repo_type)
  out = []
  for sub in ("refs", "snapshots"):
    d = os.path.join(root, sub)
    if os.path.isdir(d):
      out += sorted(os.listdir(d))
  return out


def _explain(e: Exception, repo_id: str, rev: str, repo_type: str) -> str:
  """One line saying what went wrong and what to do."""
  name = f"{repo_id}@{rev}" if rev != "main" else repo_id
  cache = hf_constants.HF_HUB_CACHE
  url = repo_url(repo_id, repo_type)
  if isinstance(e, hf_errors.GatedRepoError):
    return (f"{repo_id} is gated: accept its licence at {url} and set HF_TOKEN "
            "to a token of the account that accepted it")
  if isinstance(e, hf_errors.RevisionNotFoundError):
    return (f"{repo_id}: unknown revision {rev!r} (not a branch, tag or commit "
            "of the repository)")
  if isinstance(e, hf_errors.RepositoryNotFoundError):
    return (f"{repo_id}: no such {repo_type} repository on the Hugging Face hub "
            "(nor a local directory); a private one needs HF_TOKEN")
  # IncompleteSnapshotError: huggingface_hub >= 2 checks a cached snapshot.
  if isinstance(e, getattr(hf_errors, "IncompleteSnapshotError", ())):
    return (f"{name}: the cached snapshot in {cache} is incomplete and the hub "
            "cannot be reached: download it again with network access")
  if isinstance(e, (hf_errors.LocalEntryNotFoundError,
                    hf_errors.RevisionResolutionError)):
    if hf_constants.HF_HUB_OFFLINE:
      have = _cached_revisions(repo_id, repo_type)
      if not have:
        return (f"{repo_id} is not in the local Hugging Face cache ({cache}) and "
                "HF_HUB_OFFLINE=1 (nor is it a local directory): download it "
                "with network access, or pass a local directory")
      return (f"{repo_id}: revision {rev!r} is not in the local Hugging Face "
              f"cache ({cache}) and HF_HUB_OFFLINE=1; cached: {', '.join(have)}")
    cause = e.__cause__ or e
    first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
    return (f"{name}: cannot reach the Hugging Face hub ({first[:200]}) and it "
            f"is not in the local cache ({cache})")
  if isinstance(e, hf_errors.HfHubHTTPError):
    status = getattr(getattr(e, "response", None), "status_code", "?")
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{name}: the Hugging Face hub answered {status}: {first[:200]}"
  first = (str(e).strip().splitlines() or [""])[0]
  return f"{name}: {type(e).__name__}: {first[:200]}"


@contextlib.contextmanager
def _hub_errors(repo_id, rev, repo_type):
  try:
    yield
  except (hf_errors.HfHubHTTPError, hf_errors.LocalEntryNotFoundError,
          hf_errors.RevisionResolutionError, hf_errors.HFValidationError,
          OSError) as e:
    raise HubError(_explain(e, repo_id, rev, repo_type)) from None


def resolve(spec, *, repo_type: str = "model", allow_patterns=MODEL_FILES,
            local_only: bool = False) -> tuple[str, dict | None]:
  """(local directory, revision info) of a directory or a hub name.

  A directory (after `~` expansion) is returned as it is, with info None.
  `org/name[@rev]` is fetched into (or found in) the Hugging Face cache,
  only the files matching `allow_patterns`; info is {'id', 'revision',
  'commit'}: the 40-hex commit of the snapshot returned. Raises HubError
  (one line) when the name cannot be resolved, FileNotFoundError when
  `spec` is neither a directory nor a hub name. `local_only`: never
  download (HubError when the cache lacks it).
  """
  path = os.path.expanduser(str(spec or ""))
  if path and os.path.isdir(path):
    return path, None
  parsed = parse(spec)
  if parsed is None:
    raise FileNotFoundError(f"{spec!r} is neither a directory nor a Hugging "
                            "Face hub name (org/name or org/name@revision)")
  repo_id, rev = parsed
  rev = rev or "main"
  offline = hf_constants.HF_HUB_OFFLINE
  key = (repo_id, rev, repo_type, tuple(allow_patterns or ()),
         hf_constants.HF_HUB_CACHE)
  offline = offline or local_only
  if not offline and key in _RESOLVED:
    return _RESOLVED[key]
  # Several hosts resolve at once, each from its own cache: one progress bar.
  quiet = (huggingface_hub.utils.disable_progress_bars()
           if jax.process_index() != 0 else contextlib.nullcontext())
  with _hub_errors(repo_id, rev, repo_type), quiet:
    local = huggingface_hub.snapshot_download(
        repo_id, repo_type=repo_type, revision=rev,
        allow_patterns=list(allow_patterns) if allow_patterns else None,
        local_files_only=local_only)
  commit = os.path.basename(os.path.normpath(local))
  if not _COMMIT.match(commit):
    raise HubError(f"{repo_id}@{rev}: the cache returned {local}, not a "
                   "snapshot directory named by its commit")
  info = {"id": repo_id, "revision": rev, "commit": commit}
  if jax.process_index() == 0 and (key, commit) not in _LOGGED:
    _LOGGED.add((key, commit))
    logging.info("%s@%s: commit %s (%s)", repo_id, rev, commit, local)
  if not offline:
    _RESOLVED[key] = (local, info)
  return local, info


def commit(spec, *, repo_type: str = "model") -> str:
  """The 40-hex commit a hub name resolves to now, without downloading its
  files (the hub's answer, or the cache's refs/ offline). HubError if it
  cannot be resolved."""
  parsed = parse(spec)
  if parsed is None:
    raise ValueError(f"{spec!r} is not a Hugging Face hub name")
  repo_id, rev = parsed
  if rev and _COMMIT.match(rev):
    return rev
  with _hub_errors(repo_id, rev or "main", repo_type):
    r = huggingface_hub.HfApi().resolve_revision(
        repo_id, repo_type=repo_type, revision=rev,
        local_files_only=hf_constants.HF_HUB_OFFLINE)
  return r.resolved


def pin(spec, *, repo_type: str = "model") -> str:
  """`org/name@<commit>` for a hub name (its revision resolved now); a local
  directory or an already pinned name as given."""
  if not is_hub_id(spec):
    return spec
  repo_id, rev = parse(spec)
  if rev and _COMMIT.match(rev):
    return spec
  return f"{repo_id}@{commit(spec, repo_type=repo_type)}"


# -- the one rule for a path where a checkpoint is expected ------------------

def is_workdir(path: str) -> bool:
  """A training workdir (jaxdistill.train / rl.train) rather than a
  checkpoint: no weights of its own, and its export, its checkpoints, its
  metrics log or its run config (a config.json with a `student` block)."""
  if any(os.path.isfile(os.path.join(path, f)) for f in
         ("model.safetensors", "model.safetensors.index.json")):
    return False
  if (os.path.isdir(os.path.join(path, EXPORT_DIR))
      or os.path.isdir(os.path.join(path, "checkpoints"))
      or os.path.isfile(os.path.join(path, "metrics.jsonl"))):
    return True
  try:
    with open(os.path.join(path, "config.json")) as f:
      d = json.load(f)
  except (OSError, ValueError):
    return False
  return isinstance(d, dict) and "student" in d and "model_type" not in d


def checkpoint_dir(spec, field: str, *, workdir_ok: bool = False,
                   need_config: bool = True, files=MODEL_FILES) -> str:
  """The local directory a checkpoint spec names, or a one-line error naming
  `field` (e.g. 'config.student.path', '--checkpoint'): NotFound when
  nothing is there, ValueError for a hub name that cannot be resolved or a
  training workdir where a checkpoint is expected.

  A hub name is resolved (resolve). A training workdir stands for its
  hf_student/ export where the command says so (`workdir_ok`: evaluate's
  --checkpoint / --baseline, rl.train's student and KL reference); anywhere
  else it is refused, naming that export. `need_config`: the directory must
  hold a config.json (a model; a tokenizer needs none). `files`: what a hub
  name's snapshot must hold (CONFIG_FILES: no weights are downloaded).
  """
  if not spec:
    raise ValueError(f"{field}: not set (a Hugging Face checkpoint directory "
                     "or hub name org/name[@revision])")
  if storage.looks_remote(spec):  # gs:// mirrored; other URLs refused
    return _gs_checkpoint(spec, field, workdir_ok=workdir_ok,
                          need_config=need_config)
  try:
    path, _ = resolve(spec, allow_patterns=files)
  except FileNotFoundError:
    raise NotFound(
        f"{field}: checkpoint directory {spec!r} not found (nor is it a "
        "Hugging Face hub name org/name[@revision])") from None
  except HubError as e:
    raise ValueError(f"{field}: {e}") from None
  if is_workdir(path):
    export = os.path.join(path, EXPORT_DIR)
    if not os.path.isfile(os.path.join(export, "config.json")):
      raise NotFound(
          f"{field}: {path} is a training workdir with no {EXPORT_DIR}/ export "
          "yet (its run has not finished): it holds no checkpoint to load")
    if workdir_ok:
      return export
    raise ValueError(f"{field}: {path} is a training workdir, not a checkpoint: "
                     f"use its exported student, {export}")
  if need_config and not os.path.isfile(os.path.join(path, "config.json")):
    also = (f" nor a training workdir with an {EXPORT_DIR}/ export"
            if workdir_ok else "")
    raise NotFound(f"{field}: {path} is not a Hugging Face checkpoint "
                            f"directory (no config.json){also}")
  return path


def _gs_checkpoint(spec, field: str, *, workdir_ok: bool,
                   need_config: bool) -> str:
  """checkpoint_dir of a gs:// URL: a local mirror (storage.mirror) of the
  Hugging Face directory it names or, where `workdir_ok`, of a gs://
  training workdir's hf_student/ export (uploaded with config.json last)."""
  url = storage.check(spec, field, gs_ok=True)
  has = lambda name: storage.isfile(f"{url}/{name}")
  weights = has("model.safetensors") or has("model.safetensors.index.json")
  if not weights and (has(f"{EXPORT_DIR}/config.json")
                      or storage.isdir(f"{url}/checkpoints")
                      or has("metrics.jsonl")):
    export = f"{url}/{EXPORT_DIR}"
    if not has(f"{EXPORT_DIR}/config.json"):
      raise NotFound(
          f"{field}: {url} is a training workdir with no finished "
          f"{EXPORT_DIR}/ export yet: it holds no checkpoint to load")
    if not workdir_ok:
      raise ValueError(f"{field}: {url} is a training workdir, not a "
                       f"checkpoint: use its exported student, {export}")
    url = export
  marker = ("config.json" if need_config or has("config.json")
            else "tokenizer.json")
  try:
    return storage.mirror(url, field, marker=marker)
  except FileNotFoundError as e:
    raise NotFound(str(e)) from None
