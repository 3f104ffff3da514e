"""Orbax checkpoints of the training state, with fallback past broken ones.

A checkpoint holds the train state pytree (params, optimizer state, step), the
RNG key, and a small JSON record (step, data position, config fingerprint).
Saves are atomic (Orbax writes to a temporary directory and renames it), so a
run killed mid-save leaves the previous checkpoint intact. A checkpoint that
fails to restore (truncated, corrupted) is reported and the one before it is
tried.
"""
from __future__ import annotations

import logging
import os
import shutil
import time

import jax
import orbax.checkpoint as ocp


class Checkpointer:
  """Thin wrapper over ocp.CheckpointManager for {state, meta} checkpoints."""

  def __init__(self, directory: str, *, keep: int = 3):
    self.directory = os.path.abspath(directory)
    self._mngr = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        item_names=("state", "meta"))

  def steps(self) -> list[int]:
    return sorted(self._mngr.all_steps())

  def save(self, step: int, state, meta: dict, *, wait: bool = False):
    self._mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
        force=True)
    if wait:
      self._mngr.wait_until_finished()

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
    self._mngr.wait_until_finished()

  def close(self):
    self._mngr.wait_until_finished()
    self._mngr.close()
