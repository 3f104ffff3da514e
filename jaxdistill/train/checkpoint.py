"""Orbax checkpoints of the training state, with fallback past broken ones.

A checkpoint holds the train state pytree (params, optimizer state, step), the
RNG key, and a small JSON record (step, data position, config fingerprint).
Saves are atomic (Orbax writes to a temporary directory and renames it), so a
run killed mid-save leaves the previous checkpoint intact. A checkpoint that
fails to restore (truncated, corrupted) is reported and the one before it is
tried.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import socket
import time

import jax
import numpy as np
import orbax.checkpoint as ocp


class Checkpointer:
  """Thin wrapper over ocp.CheckpointManager for {state, meta} checkpoints."""

  def __init__(self, directory: str, *, keep: int = 3):
    self.directory = os.path.abspath(directory)
    if int(keep) < 1:
      raise ValueError(f"config.keep_ckpts: must be >= 1, got {keep}")
    check_writable_dir(self.directory)
    self._mngr = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        item_names=("state", "meta"))

  def steps(self) -> list[int]:
    return sorted(self._mngr.all_steps())

  def save(self, step: int, state, meta: dict, *, wait: bool = False):
    """Starts an (async) save; raises CheckpointWriteError, one line naming
    the directory, if this save or the previous one failed to write."""
    try:
      self._mngr.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
          force=True)
      if wait:
        self._mngr.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      raise CheckpointWriteError(self.directory, step, e) from None

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
    os.makedirs(aside, exist_ok=True)
    for step in steps:
      dst = os.path.join(aside, f"{step}-{int(time.time())}")
      shutil.move(os.path.join(self.directory, str(step)), dst)
      logging.warning("moved the unreadable checkpoint %d to %s", step, dst)
    self._mngr.reload()

  def wait(self):
    try:
      self._mngr.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      raise CheckpointWriteError(self.directory, None, e) from None

  def close(self):
    """Waits for the last save and releases Orbax's threads. Never raises
    (it runs in `finally` blocks): a failed last save is logged."""
    try:
      self._mngr.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      logging.error("%s", CheckpointWriteError(self.directory, None, e))
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


class CheckpointWriteError(OSError):
  """A checkpoint could not be written; the message is one line."""

  def __init__(self, directory: str, step, error: BaseException):
    cause = _root_cause(error)
    code = getattr(cause, "errno", None)
    if code is None:  # errno is sometimes only in the message (tensorstore)
      for c in (errno.ENOSPC, errno.EACCES, errno.EROFS, errno.EDQUOT):
        if os.strerror(c) in str(error) or os.strerror(c) in str(cause):
          code = c
          break
    why = (os.strerror(code) if code else
           f"{type(cause).__name__}: {str(cause).splitlines()[0][:200] if str(cause) else ''}")
    what = f"checkpoint of step {step}" if step is not None else "checkpoint"
    super().__init__(code or errno.EIO,
                     f"{what} could not be written to {directory}: {why}. "
                     "Earlier checkpoints are kept.")

  def __str__(self):
    return self.args[1]


def check_writable_dir(path: str) -> None:
  """Raises ValueError (one line naming `path`) unless `path` is, or can be
  created as, a writable directory."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise ValueError(f"{path}: exists and is not a directory")
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise ValueError(f"{path}: cannot create the directory "
                     f"({os.strerror(e.errno) if e.errno else e})") from None
  if not os.access(path, os.W_OK | os.X_OK):
    raise ValueError(f"{path}: directory is not writable")


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
    self.path = os.path.join(os.path.abspath(workdir), self.NAME)
    self._held = False

  def _holder(self):
    try:
      with open(self.path) as f:
        return json.load(f)
    except (OSError, ValueError):
      return None

  def acquire(self):
    me = {"pid": os.getpid(), "host": socket.gethostname()}
    for _ in range(3):
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
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
      with os.fdopen(fd, "w") as f:
        json.dump(me, f)
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


def _remove(path):
  try:
    os.remove(path)
  except FileNotFoundError:
    pass
