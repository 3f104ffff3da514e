"""Stopping on SIGTERM / SIGINT with the state saved (a TPU VM preemption,
Ctrl-C, a cluster's kill): shared by train, rl.train, train.teacher_cache
and the sweep.

A long loop (`StopOnSignal`) finishes the step in flight, saves, and raises
`Preempted`, whose `exit_code` (128 + signal) the command line exits with
after printing its one-line message (jaxdistill.cli). Outside such a loop,
`stop_at_once` turns the signal into `Preempted` at once, with a message
saying what is kept.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading

import jax
from jax.experimental import multihost_utils


class Preempted(RuntimeError):
  """The run stopped on SIGTERM/SIGINT after writing a checkpoint."""

  def __init__(self, msg: str, signum: int):
    super().__init__(msg)
    self.exit_code = 128 + int(signum)


class StopOnSignal:
  """SIGTERM/SIGINT -> stop after the step in flight, with a checkpoint.

  Handlers are installed only in the main thread and restored by `restore()`
  (train() runs many times in one process in tests and the demo). On several
  hosts the decision comes from JAX's preemption sync point, so every host
  stops after the same step; a second SIGINT interrupts at once.
  """

  def __init__(self):
    self.signum = None
    self.stopped_at = None
    self._prev = {}
    self._multi = jax.process_count() > 1
    if threading.current_thread() is not threading.main_thread():
      return
    sigs = (signal.SIGINT,) if self._multi else (signal.SIGTERM, signal.SIGINT)
    for sig in sigs:
      self._prev[sig] = signal.signal(sig, self._handle)

  def _handle(self, signum, frame):
    del frame
    if self.signum is not None and signum == signal.SIGINT:
      raise KeyboardInterrupt
    self.signum = signum
    print(f"received {signal.Signals(signum).name}: finishing the step in "
          "flight, then writing a checkpoint (Ctrl-C again to stop at once)",
          file=sys.stderr, flush=True)

  def requested(self, done: int) -> bool:
    """True (once) when the run must stop after step `done`."""
    stop = self.signum is not None
    if self._multi:
      try:
        if multihost_utils.reached_preemption_sync_point(done):
          stop, self.signum = True, self.signum or signal.SIGTERM
      except RuntimeError:  # no preemption service: the local signal only
        pass
    if stop:
      self.stopped_at = done
    return stop

  def steps(self, start: int, total: int):
    for step in range(start, total):
      if self.stopped_at is not None:
        return
      yield step

  def raise_if_stopped(self, ckpt):
    if self.stopped_at is not None:
      raise Preempted(
          f"stopped by {signal.Signals(self.signum).name} after step "
          f"{self.stopped_at}; checkpoint {self.stopped_at} written to "
          f"{ckpt.directory}; run the same command to resume", self.signum)

  def restore(self):
    for sig, prev in self._prev.items():
      signal.signal(sig, prev)
    self._prev = {}


@contextlib.contextmanager
def stop_at_once(kept: str):
  """SIGTERM / SIGINT inside the body raise Preempted at once, its message
  saying what is kept (`kept`, e.g. 'finished runs and checkpoints are kept
  in /w'). A StopOnSignal inside the body takes over the signals while it
  runs. Only in the main thread (elsewhere the body runs as is)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def handle(signum, frame):
    del frame
    raise Preempted(f"stopped by {signal.Signals(signum).name}; {kept}; run "
                    "the same command to resume", signum)
  prev = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    yield
  finally:
    for s, h in prev.items():
      signal.signal(s, h)
