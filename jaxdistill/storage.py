"""Where runs are written: a local path, or a Google Cloud Storage URL.

A path is local, or `gs://bucket/dir`. Any other URL (s3://, hdfs://, ...)
and anything that only looks like one (`gs:/bucket`, what os.path.abspath
makes of a gs URL) is refused in one line: it must never become a local
directory named `gs:`. Commands and config fields that cannot take gs:// yet
refuse it the same way (`check(path, what)`); docs/cloud_storage.md lists
which take it.

Object stores have no rename of a directory, so nothing here renames on
gs://: a file is uploaded whole (an object appears complete or not at all), a
directory of files is uploaded with its marker file last, and a "move" is a
copy then a delete, which callers order so that a kill part way is safe.

Local paths go through os; gs:// through gcsfs (fsspec), which reads
STORAGE_EMULATOR_HOST as Google's own clients do. Orbax writes checkpoints
to gs:// itself, through tensorstore (its own commit marker, no rename).
"""
from __future__ import annotations

import builtins
import contextlib
import fcntl
import json
import os
import re
import shutil
import tempfile
import uuid

import fsspec

GS = "gs://"
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")


def looks_remote(path) -> bool:
  """A URL of any scheme, or a path that starts like a gs one."""
  path = os.fspath(path)
  return bool(_URL.match(path)) or path.lower().startswith("gs:")


def is_gs(path) -> bool:
  return os.fspath(path).startswith(GS)


def check(path, what: str, *, gs_ok: bool = False) -> str:
  """`path` as the project will use it (gs:// without a trailing slash, a
  local path with ~ expanded), or ValueError in one line: an unknown scheme,
  a malformed gs URL, or a gs:// path where `what` does not take one."""
  path = os.fspath(path)
  if not looks_remote(path):
    return os.path.expanduser(path)
  if not is_gs(path):
    scheme = path.split(":", 1)[0]
    if scheme.lower() == "gs":
      raise ValueError(f"{what}: {path} is not a gs:// URL (write "
                       f"gs://bucket/path)")
    raise ValueError(f"{what}: {path}: the {scheme}:// scheme is not "
                     "supported (a local path, or gs:// where "
                     "docs/cloud_storage.md says so)")
  bucket = path[len(GS):].split("/", 1)[0]
  if not _BUCKET.match(bucket):
    raise ValueError(f"{what}: {path}: {bucket!r} is not a bucket name")
  if not gs_ok:
    raise ValueError(f"{what}: {path}: gs:// is not supported here yet "
                     "(docs/cloud_storage.md says what is); give a local path")
  return path.rstrip("/")


def abspath(path) -> str:
  path = os.fspath(path)
  if looks_remote(path):
    return check(path, path, gs_ok=True)
  return os.path.abspath(os.path.expanduser(path))


def _fs():
  # Listings are not cached: Orbax and other hosts write behind our back.
  return fsspec.filesystem("gcs", use_listings_cache=False)


def _key(path: str) -> str:
  return path[len(GS):]


def exists(path) -> bool:
  return _fs().exists(_key(path)) if is_gs(path) else os.path.exists(path)


def isdir(path) -> bool:
  return _fs().isdir(_key(path)) if is_gs(path) else os.path.isdir(path)


def isfile(path) -> bool:
  return _fs().isfile(_key(path)) if is_gs(path) else os.path.isfile(path)


def listdir(path) -> list[str]:
  """The names in a directory ([] for a gs:// prefix with no object under
  it: object stores have no empty directories)."""
  if not is_gs(path):
    return os.listdir(path)
  try:
    entries = _fs().ls(_key(path), detail=False)
  except FileNotFoundError:
    return []
  return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries} - {""})


def makedirs(path) -> None:
  """A local directory and its parents; nothing on gs:// (no directories)."""
  if not is_gs(path):
    os.makedirs(path, exist_ok=True)


def open(path, mode: str = "r"):  # pylint: disable=redefined-builtin
  """A file object. On gs:// a file opened for writing is uploaded when it
  is closed, whole, and replaces any earlier object; there is no "a"."""
  if not is_gs(path):
    return builtins.open(path, mode)
  if "a" in mode or "+" in mode:
    raise ValueError(f"{path}: mode {mode!r}: objects cannot be appended to")
  return _fs().open(_key(path), mode)


def read_text(path) -> str:
  with open(path) as f:
    return f.read()


def write_text(path, text: str) -> None:
  """The whole file, atomically: on gs:// one upload, locally a sibling
  temporary file renamed over `path`."""
  if is_gs(path):
    with open(path, "w") as f:
      f.write(text)
    return
  tmp = f"{path}.tmp.{os.getpid()}"
  with builtins.open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def create_exclusive(path, text: str) -> None:
  """Writes a new file; FileExistsError if `path` exists. On GCS the
  upload carries ifGenerationMatch=0, so of two racing writers one fails."""
  if not is_gs(path):
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    with os.fdopen(fd, "w") as f:
      f.write(text)
    return
  fs = _fs()
  try:
    fs.pipe_file(_key(path), text.encode(), mode="create")  # 412: exists
  except TypeError:  # a gcsfs before mode="create": checked, not atomic
    if fs.exists(_key(path)):
      raise FileExistsError(path) from None
    fs.pipe_file(_key(path), text.encode())


def remove(path) -> None:
  """Removes a file; no error if it is gone."""
  try:
    if is_gs(path):
      _fs().rm_file(_key(path))
    else:
      os.remove(path)
  except FileNotFoundError:
    pass


def rmtree(path) -> None:
  if is_gs(path):
    try:
      _fs().rm(_key(path), recursive=True)
    except FileNotFoundError:
      pass
  else:
    shutil.rmtree(path, ignore_errors=True)


def move(src, dst, *, last: str | None = None) -> None:
  """A file or directory moved. On gs:// a copy, then a delete of `src`:
  killed part way, both may hold part of it. `last` (a file name in a
  directory `src`, e.g. the config.json that marks a run) is deleted after
  every other object, so a kill part way leaves it in place."""
  if not is_gs(src):
    shutil.move(src, dst)
    return
  fs = _fs()
  if fs.isdir(_key(src)):
    fs.copy(_key(src), _key(dst), recursive=True)
    keys = fs.find(_key(src))
    marker = f"{_key(src)}/{last}" if last else None
    rest = [k for k in keys if k != marker]
    if rest:
      fs.rm(rest)
    if marker in keys:
      fs.rm_file(marker)
  else:
    fs.copy(_key(src), _key(dst))
    fs.rm_file(_key(src))


def upload_dir(local: str, remote: str, *, last: str | None = None) -> None:
  """Copies the files under `local` into `remote`, the file `last` (a name
  relative to `local`) after every other one: its presence says the copy
  is complete."""
  fs = _fs()
  names = sorted(os.path.relpath(os.path.join(d, n), local)
                 for d, _, ns in os.walk(local) for n in ns)
  names.sort(key=lambda n: n == last)
  for name in names:
    fs.put_file(os.path.join(local, name), f"{_key(remote)}/{name}")


def download_dir(remote: str, local: str) -> None:
  fs = _fs()
  root = _key(remote).rstrip("/")
  for key in fs.find(root):
    dst = os.path.join(local, os.path.relpath(key, root))
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    fs.get_file(key, dst)


def local_staging(prefix: str = "jaxdistill-") -> str:
  """A fresh local directory to build files in before their upload."""
  return tempfile.mkdtemp(prefix=prefix)


def check_writable_dir(path) -> None:
  """Raises ValueError (one line naming `path`) unless `path` is, or can be
  created as, a writable directory; on gs:// unless its bucket can be
  written (a small object written and removed: credentials, bucket name and
  permission all checked before any compute)."""
  path = os.fspath(path)
  if looks_remote(path):
    path = check(path, path, gs_ok=True)
    probe = f"{path}/.write-check-{uuid.uuid4().hex[:12]}"
    try:
      fs = _fs()
      if fs.isfile(_key(path)):
        raise ValueError(f"{path}: exists and is not a directory")
      fs.pipe_file(_key(probe), b"")
      fs.rm_file(_key(probe))
    except ValueError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
      raise ValueError(
          f"{path}: cannot write there ({type(e).__name__}: {why}); check the "
          "bucket name and the credentials (gcloud auth application-default "
          "login, or the TPU VM's service account)") from None
    return
  if os.path.exists(path) and not os.path.isdir(path):
    raise ValueError(f"{path}: exists and is not a directory")
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise ValueError(f"{path}: cannot create it "
                     f"({os.strerror(e.errno) if e.errno else e})") from None
  if not os.access(path, os.W_OK | os.X_OK):
    raise ValueError(f"{path}: not writable")


def scratch(url) -> str:
  """The local directory a gs:// sweep keeps what it reads as local files
  in (its prepared data, its shared rollouts): <mirror_root()>/_sweeps/
  <bucket>/<path>, one per host."""
  return os.path.join(mirror_root(), "_sweeps", _key(check(url, url,
                                                            gs_ok=True)))


MIRROR_ENV = "JAXDISTILL_GS_MIRROR"  # where gs:// inputs are mirrored
_STAMP = ".jaxdistill-mirror.json"


def mirror_root() -> str:
  return os.path.expanduser(os.environ.get(MIRROR_ENV)
                            or "~/.cache/jaxdistill/gs")


def _stamp_matches(path: str, stamp: dict) -> bool:
  """Whether the local stamp file at `path` records `stamp` (a missing or
  unreadable one does not)."""
  try:
    with builtins.open(path) as f:
      return json.load(f) == stamp
  except (OSError, ValueError):
    return False


def _stamp(fs, key: str) -> dict:
  info = fs.info(key)
  return {k: str(info.get(k)) for k in ("generation", "md5Hash", "size")}


def mirror(url, what: str, *, marker: str) -> str:
  """A local copy of the gs:// directory `url` (its files, not its
  subdirectories), for inputs that are read as local files: checkpoints,
  tokenizers, teacher caches. `marker` is the file uploads write last: a
  directory without it is refused as unfinished (FileNotFoundError naming
  `what`). The copy lives at <mirror_root()>/<bucket>/<path> (environment
  variable JAXDISTILL_GS_MIRROR, default ~/.cache/jaxdistill/gs), and is
  downloaded again only when the marker object's generation changed (a new
  upload). A local disk too small for it is refused before the download."""
  url = check(url, what, gs_ok=True)
  fs, key = _fs(), _key(url)
  marker_key = f"{key}/{marker}"
  if not fs.isfile(marker_key):
    raise FileNotFoundError(f"{what}: {url} holds no {marker}: not there, or "
                            "its upload is unfinished (it is written last)")
  stamp = {"url": url, **_stamp(fs, marker_key)}
  local = os.path.join(mirror_root(), key)
  stamp_path = os.path.join(local, _STAMP)
  if _stamp_matches(stamp_path, stamp):
    return local
  files = [e for e in fs.ls(key, detail=True) if e.get("type") == "file"]
  need = sum(int(e.get("size") or 0) for e in files)
  os.makedirs(os.path.dirname(local), exist_ok=True)
  free = shutil.disk_usage(os.path.dirname(local)).free
  if need > free:
    raise ValueError(f"{what}: {url} is {need / 1e9:.1f} GB, {os.path.dirname(local)} "
                     f"has {free / 1e9:.1f} GB free (set {MIRROR_ENV} to a "
                     "larger disk)")
  part = f"{local}.part-{os.getpid()}-{uuid.uuid4().hex[:6]}"
  os.makedirs(part)
  try:
    for e in files:
      name = e["name"].rstrip("/").rsplit("/", 1)[-1]
      fs.get_file(e["name"], os.path.join(part, name))
    if _stamp(fs, marker_key) != {k: stamp[k] for k in stamp if k != "url"}:
      raise FileNotFoundError(f"{what}: {url} changed during its download "
                              "(an upload in progress); run again when done")
    with builtins.open(os.path.join(part, _STAMP), "w") as f:
      json.dump(stamp, f)
    old = f"{local}.old-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    if os.path.isdir(local):
      os.replace(local, old)  # local renames: the mirror is a local disk
    os.replace(part, local)
    shutil.rmtree(old, ignore_errors=True)
  finally:
    shutil.rmtree(part, ignore_errors=True)
  return local


def mirror_dir(url) -> str:
  """Where mirror() and mirror_parts() keep their copy of gs:// `url`."""
  return os.path.join(mirror_root(), _key(check(url, url, gs_ok=True)))


def _parts_stamp(url, marker: str) -> str:
  return os.path.join(mirror_dir(url), ".jaxdistill-mirror",
                      marker.replace("/", "__") + ".json")


def mirror_parts(url, what: str, *, marker: str, parts,
                 missing_ok: bool = False) -> str:
  """A local copy of part of the gs:// directory `url`: the file `marker`
  and the trees `parts` (paths relative to `url`), for directories that
  hold several independently uploaded things side by side (prepared data:
  DIR/prepared/NAME.json beside DIR/mcq_files/NAME/...). Returns the local
  directory (mirror_dir(url)), laid out like `url`. As mirror(): `marker`
  is uploaded last (publish_parts), so without it the upload is unfinished
  (FileNotFoundError naming `what`); a copy is downloaded again only when
  the marker's generation changes; a disk too small is refused. One
  download per marker at a time on this host (a lock file beside its
  stamp), so processes that share a disk share the copy. With
  `missing_ok`, a `url` without `marker` gives the local directory with
  any old copy of the marker and parts removed (to build them in, then
  publish_parts)."""
  url = check(url, what, gs_ok=True)
  fs, key = _fs(), _key(url)
  marker_key = f"{key}/{marker}"
  local, stamp_path = mirror_dir(url), _parts_stamp(url, marker)
  os.makedirs(os.path.dirname(stamp_path), exist_ok=True)
  with builtins.open(stamp_path + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not fs.isfile(marker_key):
      if not missing_ok:
        raise FileNotFoundError(f"{what}: {url} holds no {marker}: not there, "
                                "or its upload is unfinished (it is written "
                                "last)")
      for p in (stamp_path, *(os.path.join(local, q) for q in (marker, *parts))):
        _remove_local(p)
      return local
    stamp = {"url": url, "marker": marker, **_stamp(fs, marker_key)}
    if _stamp_matches(stamp_path, stamp):
      return local
    found = {}
    for p in parts:
      found.update(fs.find(f"{key}/{p}", detail=True))
    need = sum(int(e.get("size") or 0) for e in found.values())
    free = shutil.disk_usage(local).free
    if need > free:
      raise ValueError(f"{what}: {url}'s {', '.join(parts)} are "
                       f"{need / 1e9:.1f} GB, {local} has {free / 1e9:.1f} GB "
                       f"free (set {MIRROR_ENV} to a larger disk)")
    part = os.path.join(local, f".part-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    try:
      for k in list(found) + [marker_key]:
        dst = os.path.join(part, os.path.relpath(k, key))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        fs.get_file(k, dst)
      if _stamp(fs, marker_key) != {k: stamp[k] for k in stamp
                                    if k not in ("url", "marker")}:
        raise FileNotFoundError(f"{what}: {url} changed during its download "
                                "(an upload in progress); run again when done")
      with contextlib.suppress(FileNotFoundError):
        os.remove(stamp_path)  # a kill during the swap: downloaded again
      for p in list(parts) + [marker]:
        src, dst = os.path.join(part, p), os.path.join(local, p)
        _remove_local(dst)
        if os.path.lexists(src):
          os.makedirs(os.path.dirname(dst), exist_ok=True)
          os.replace(src, dst)  # local renames: the mirror is a local disk
      write_text(stamp_path, json.dumps(stamp))
    finally:
      shutil.rmtree(part, ignore_errors=True)
  return local


def _remove_local(path: str) -> None:
  if os.path.isdir(path) and not os.path.islink(path):
    shutil.rmtree(path)
  elif os.path.lexists(path):
    os.remove(path)


def publish_parts(url, *, marker: str, parts) -> None:
  """Uploads mirror_dir(url)'s `parts` and then `marker` to gs:// `url`,
  replacing what `url` held of them: the old marker is deleted first, so a
  kill part way leaves no marker (unfinished; mirror_parts refuses it). The
  local copy is then stamped as current, so nothing is downloaded again."""
  url = check(url, url, gs_ok=True)
  fs, key, local = _fs(), _key(url), mirror_dir(url)
  with contextlib.suppress(FileNotFoundError):
    fs.rm_file(f"{key}/{marker}")
  for p in parts:
    rmtree(f"{url}/{p}")
    if os.path.isdir(os.path.join(local, p)):
      upload_dir(os.path.join(local, p), f"{url}/{p}")
    elif os.path.isfile(os.path.join(local, p)):
      fs.put_file(os.path.join(local, p), f"{key}/{p}")
  fs.put_file(os.path.join(local, marker), f"{key}/{marker}")
  stamp_path = _parts_stamp(url, marker)
  os.makedirs(os.path.dirname(stamp_path), exist_ok=True)
  write_text(stamp_path, json.dumps({"url": url, "marker": marker,
                                     **_stamp(fs, f"{key}/{marker}")}))
