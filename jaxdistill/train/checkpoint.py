"""Orbax checkpoints of the training state, with fallback past broken ones.

A checkpoint holds the train state pytree (params, optimizer state, step), the
RNG key, and a small JSON record (step, data position, config fingerprint).
Saves are atomic, so a run killed mid-save leaves the previous checkpoint
intact: Orbax writes to a temporary directory and renames it, or on gs://
(no rename there) writes commit_success.txt last and ignores a step without
it. A checkpoint that fails to restore (truncated, corrupted) is reported
and the one before it is tried. A save that fails (a full disk, ...) is found at the next step at the
latest (`check`) and stops the run with one line: the step, the directory,
the bytes a checkpoint needs and the free space for a full disk, and the
checkpoints actually kept.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import socket
import time

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxdistill import storage


class Checkpointer:
  """Thin wrapper over ocp.CheckpointManager for {state, meta} checkpoints."""

  def __init__(self, directory: str, *, keep: int = 3):
    self.directory = storage.abspath(directory)
    if int(keep) < 1:
      raise ValueError(f"config.keep_ckpts: must be >= 1, got {keep}")
    check_writable_dir(self.directory)
    self._mngr = ocp.CheckpointManager(
        self.directory,
        # A failed save leaves <step>.orbax-checkpoint-tmp: the next run
        # removes it.
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                             cleanup_tmp_directories=True),
        item_names=("state", "meta"))
    self._pending = None  # the step of the save in flight
    self._nbytes = None   # the state's array bytes (what a save writes)
    self._failed = False  # a failure was raised: close() stays quiet

  def steps(self) -> list[int]:
    return sorted(self._mngr.all_steps())

  def save(self, step: int, state, meta: dict, *, wait: bool = False):
    """Starts an (async) save; raises CheckpointWriteError, one line naming
    the step and the directory, if the previous save or this one failed."""
    self.wait()
    self._nbytes = sum(int(getattr(x, "nbytes", 0))
                       for x in jax.tree.leaves(state))
    self._pending = step
    try:
      self._mngr.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
          force=True)
    except Exception as e:  # pylint: disable=broad-except
      self._raise(e)
    if wait:
      self.wait()

  def check(self):
    """Raises CheckpointWriteError if the save in flight has already failed
    (without waiting for one still writing): called every step, so a run
    stops at its first failed save."""
    if self._pending is None:
      return
    try:
      self._mngr.check_for_errors()
    except Exception as e:  # pylint: disable=broad-except
      self._raise(e)

  def _raise(self, error: BaseException):
    step, self._pending, self._failed = self._pending, None, True
    raise CheckpointWriteError(self.directory, step, error,
                               nbytes=self._nbytes) from None

  def restore_latest(self, abstract_state):
    """-> (state, meta, step) from the newest checkpoint that restores, else None.

    `abstract_state` is a pytree of jax.ShapeDtypeStruct with shardings, so
    arrays come back already placed on the mesh. Checkpoints newer than the
    one restored failed to restore: they are moved (not deleted) into
    <directory>/../broken_checkpoints/ so the run can save those steps again.
    """
    broken = []
    for step in reversed(self.steps()):
      try:
        out = self._mngr.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            meta=ocp.args.JsonRestore()))
        state = out["state"]
        jax.block_until_ready(state)
        self._set_aside(broken)
        return state, dict(out["meta"]), step
      except Exception as e:  # pylint: disable=broad-except
        logging.warning(
            "checkpoint at step %d in %s failed to restore (%s: %s); "
            "falling back to the previous one", step, self.directory,
            type(e).__name__, str(e)[:300])
        broken.append(step)
    self._set_aside(broken)
    return None

  def _set_aside(self, steps):
    if not steps or jax.process_index() != 0:
      return
    aside = os.path.join(os.path.dirname(self.directory), "broken_checkpoints")
    storage.makedirs(aside)
    for step in steps:
      dst = os.path.join(aside, f"{step}-{int(time.time())}")
      # On gs:// a copy then a delete: killed in between, the step is still
      # there, still broken, and is set aside again by the next run.
      storage.move(os.path.join(self.directory, str(step)), dst)
      logging.warning("moved the unreadable checkpoint %d to %s", step, dst)
    self._mngr.reload()

  def wait(self):
    """Waits for the save in flight; CheckpointWriteError if it failed."""
    try:
      self._mngr.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      self._raise(e)
    self._pending = None

  def close(self):
    """Waits for the last save and releases Orbax's threads. Never raises
    (it runs in `finally` blocks): a failed last save not yet reported is
    logged."""
    reported = self._failed
    try:
      self.wait()
    except Exception as e:  # pylint: disable=broad-except
      if not reported:
        logging.error("%s", e)
    try:
      self._mngr.close()
    except Exception as e:  # pylint: disable=broad-except
      logging.error("closing the checkpoints in %s: %s: %s", self.directory,
                    type(e).__name__, str(e)[:200])

  def param_norms(self, abstract_state) -> list[tuple[int, float | None]]:
    """[(step, global L2 norm of the saved params, None if unreadable)] for
    every kept checkpoint, oldest first (used after a NaN stop)."""
    out = []
    for step in self.steps():
      try:
        restored = self._mngr.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state)))
        sq = 0.0
        for leaf in jax.tree.leaves(restored["state"]["params"]):
          x = np.asarray(jax.device_get(leaf), np.float64)
          sq += float(np.sum(x * x))
        out.append((step, float(np.sqrt(sq))))
        del restored
      except Exception:  # pylint: disable=broad-except
        out.append((step, None))
    return out


def _root_cause(e: BaseException) -> BaseException:
  """The innermost exception of a chain (Orbax wraps the OSError)."""
  seen = set()
  while id(e) not in seen:
    seen.add(id(e))
    nxt = e.__cause__ or e.__context__
    if nxt is None:
      break
    e = nxt
  return e


def _size(n: float) -> str:
  for unit in ("bytes", "KiB", "MiB", "GiB"):
    if n < 1024 or unit == "GiB":
      return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
    n /= 1024
  return ""


def kept_steps(directory: str) -> list[int]:
  """The steps of the complete checkpoints in `directory` (on gs://, those
  with Orbax's commit marker: it writes a step in place there)."""
  try:
    steps = [int(n) for n in storage.listdir(directory) if n.isdigit()]
    if storage.is_gs(directory):
      steps = [s for s in steps if storage.exists(
          os.path.join(directory, str(s), ORBAX_COMMITTED))]
    return sorted(steps)
  except OSError:
    return []


# What Orbax writes last into a step on an object store (its commit there).
ORBAX_COMMITTED = "commit_success.txt"

# A local step being deleted is first renamed to this (Orbax lists only
# integer names), so a kill part way never leaves half a step behind.
_PRUNING = ".pruning-"


def prune(directory: str, keep: int) -> list[int]:
  """Deletes every checkpoint of `directory` but step `keep`: a finished
  run's older checkpoints (config.keep_final_only). Nothing is deleted
  unless step `keep` is complete. Locally each step is renamed aside, then
  removed; on gs:// its commit marker goes first, so a kill part way leaves
  a step Orbax ignores. Returns the steps deleted."""
  steps = kept_steps(directory)
  if keep not in steps:
    logging.warning("%s: no complete checkpoint of step %d (have %s); none "
                    "deleted", directory, keep, steps)
    return []
  if not storage.is_gs(directory):  # left by a kill during an earlier prune
    for name in storage.listdir(directory):
      if name.startswith(_PRUNING):
        storage.rmtree(os.path.join(directory, name))
  gone = [s for s in storage.listdir(directory)
          if s.isdigit() and int(s) != keep]
  for name in gone:
    path = os.path.join(directory, name)
    if storage.is_gs(directory):
      storage.remove(os.path.join(path, ORBAX_COMMITTED))
      storage.rmtree(path)
    else:
      aside = os.path.join(directory, _PRUNING + name)
      os.replace(path, aside)
      storage.rmtree(aside)
  return sorted(int(s) for s in gone)


class CheckpointWriteError(OSError):
  """A checkpoint could not be written; the message is one line: the step,
  the directory, why, for a full disk what a checkpoint needs (`nbytes`,
  the state's arrays) and what is free, and the checkpoints kept."""

  def __init__(self, directory: str, step, error: BaseException, *,
               nbytes: int | None = None):
    cause = _root_cause(error)
    code = getattr(cause, "errno", None)
    if code is None:  # errno is sometimes only in the message (tensorstore)
      for c in (errno.ENOSPC, errno.EACCES, errno.EROFS, errno.EDQUOT):
        if os.strerror(c) in str(error) or os.strerror(c) in str(cause):
          code = c
          break
    why = (os.strerror(code) if code else
           f"{type(cause).__name__}: {str(cause).splitlines()[0][:200] if str(cause) else ''}")
    if code in (errno.ENOSPC, errno.EDQUOT) and nbytes:
      try:
        st = os.statvfs(directory)
        free = f", {_size(st.f_bavail * st.f_frsize)} free"
      except OSError:
        free = ""
      why += f" (a checkpoint needs about {_size(nbytes)}{free})"
    what = f"checkpoint of step {step}" if step is not None else "checkpoint"
    kept = kept_steps(directory)
    kept = (f"kept: checkpoint{'s' if len(kept) > 1 else ''} "
            f"{', '.join(map(str, kept))}; the same command resumes from "
            f"step {kept[-1]}" if kept else
            "no checkpoint is kept: the same command starts from step 0")
    super().__init__(code or errno.EIO,
                     f"{what} could not be written to {directory}: {why}; "
                     f"stopped; {kept}")

  def __str__(self):
    return self.args[1]


check_writable_dir = storage.check_writable_dir


class WorkdirLock:
  """<workdir>/.lock holding {"pid", "host"}: one process per workdir.

  A lock left by a process that no longer runs on this host is taken over;
  a live holder (or one on another host, which cannot be checked) makes
  `acquire` raise a one-line ValueError naming it. A lock file that is not
  JSON, or whose pid is not a positive integer (a lock this class did not
  write: its holder cannot be checked), is refused the same way, never taken
  over: removing it is the user's call.
  """
  NAME = ".lock"

  def __init__(self, workdir: str):
    self.path = os.path.join(storage.abspath(workdir), self.NAME)
    self._held = False

  def _holder(self):
    try:
      with storage.open(self.path) as f:
        return json.load(f)
    except (OSError, ValueError):
      return None

  def acquire(self):
    me = {"pid": os.getpid(), "host": socket.gethostname()}
    for _ in range(3):
      try:
        storage.create_exclusive(self.path, json.dumps(me))
      except FileExistsError:
        holder = self._holder()
        if holder is None:  # being written by its creator, or garbage
          time.sleep(0.1)
          holder = self._holder()
        if isinstance(holder, dict) and not _is_pid(holder.get("pid")):
          raise ValueError(
              f"{self.path}: the workdir is locked, but the lock's pid "
              f"{holder.get('pid')!r} is not a process id; remove the lock if "
              "no run uses this workdir")
        if isinstance(holder, dict) and holder.get("host") == me["host"]:
          pid = holder["pid"]
          if pid == me["pid"] or not _pid_alive(pid):
            logging.warning("taking over the stale lock %s of pid %s (not "
                            "running)", self.path, pid)
            _remove(self.path)
            continue
        if not isinstance(holder, dict):
          raise ValueError(f"{self.path}: the workdir is locked (unreadable "
                           "lock file); remove it if no run uses this workdir")
        raise ValueError(
            f"{os.path.dirname(self.path)}: in use by pid {holder.get('pid')} "
            f"on host {holder.get('host')} (lock {self.path}); wait for it, "
            "or remove the lock if that process is gone")
      self._held = True
      return self
    raise ValueError(f"{self.path}: could not take the workdir lock")

  def release(self):
    if self._held:
      holder = self._holder()
      if isinstance(holder, dict) and holder.get("pid") == os.getpid():
        _remove(self.path)
      self._held = False

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *exc):
    self.release()


def _is_pid(pid) -> bool:
  return isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < 2**31


def _pid_alive(pid: int) -> bool:
  if pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # alive, owned by someone else
    return True
  return True


_remove = storage.remove
