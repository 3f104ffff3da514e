"""What a training run shows: a progress bar, JSON lines, TensorBoard events.

Only process 0 writes. metrics.jsonl gets one object per logged step
({"step": n, "time": unix, <namespaced metrics>}); TensorBoard events go to
<workdir>/tb. The progress bar shows step, loss, tokens/s and the ETA.

The JSON lines are the run's record: failing to write them stops the run
with one line naming the file. TensorBoard is a convenience: its events are
written synchronously (tensorboardX's background writer blocks the caller
forever once its thread has died on a full disk), and the first error
disables it with a warning while training goes on.

On a gs:// workdir (an object cannot be appended to) metrics.jsonl is
uploaded whole: at most every SYNC_S seconds, at every checkpoint (`sync`,
so the lines up to the step a resume starts from are never lost) and at the
end; TensorBoard events go through tensorboardX's own GCS writer.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time

import jax
from tqdm.auto import tqdm

from jaxdistill import storage

# A gs:// metrics.jsonl is uploaded at most this often between checkpoints.
SYNC_S = 30.0


class Logger:

  def __init__(self, workdir: str, *, total: int, start: int = 0,
               progress: bool = True, log_every: int = 1, prefix: str = "train"):
    self.active = jax.process_index() == 0
    self.log_every = max(int(log_every), 1)
    self._jsonl = self._tb = self._bar = None
    if not self.active:
      return
    self._jsonl_path = os.path.join(workdir, "metrics.jsonl")
    try:
      self._jsonl = (_ObjectLog(self._jsonl_path) if storage.is_gs(workdir)
                     else open(self._jsonl_path, "a"))
    except OSError as e:
      raise OSError(e.errno, f"{self._jsonl_path}: cannot open the metrics "
                    f"log ({e.strerror or e})") from None
    self._tb = _tb_sink(os.path.join(workdir, "tb"))
    if progress:
      self._bar = tqdm(total=total, initial=start, desc=prefix, unit="step",
                       dynamic_ncols=True, file=sys.stderr,
                       mininterval=0.5 if sys.stderr.isatty() else 10.0)

  def write(self, step: int, metrics: dict):
    if not self.active:
      return
    if self._bar is not None:
      self._bar.update(step - self._bar.n)
      post = {}
      for key, short in (("train/loss", "loss"), ("rl/reward_mean", "reward"),
                         ("perf/tokens_per_s", "tok/s")):
        if key in metrics:
          post[short] = f"{metrics[key]:.4g}"
      self._bar.set_postfix(post, refresh=False)
    if step % self.log_every and step != getattr(self._bar, "total", None):
      return
    rec = {"step": int(step), "time": time.time()}
    rec.update({k: float(v) for k, v in metrics.items()})
    try:
      self._jsonl.write(json.dumps(rec) + "\n")
      self._jsonl.flush()
    except OSError as e:
      raise OSError(e.errno, f"{self._jsonl_path}: cannot write the metrics "
                    f"log ({e.strerror or e})") from None
    if self._tb is not None:
      try:
        self._tb.write(step, metrics)
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("TensorBoard events in %s: %s: %s; disabled, "
                        "training goes on (metrics.jsonl has every metric)",
                        self._tb.logdir, type(e).__name__, e)
        self._tb = None

  def sync(self):
    """The metrics so far made durable (an upload on gs://)."""
    if self.active:
      try:
        if isinstance(self._jsonl, _ObjectLog):
          self._jsonl.flush(force=True)
        else:
          self._jsonl.flush()
      except OSError as e:
        raise OSError(e.errno, f"{self._jsonl_path}: cannot write the "
                      f"metrics log ({e.strerror or e})") from None

  def close(self):
    if not self.active:
      return
    if self._bar is not None:
      self._bar.close()
    if self._tb is not None:
      try:
        self._tb.close()
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("TensorBoard events in %s: %s", self._tb.logdir, e)
    try:
      self._jsonl.close()
    except OSError as e:
      logging.error("%s: %s", self._jsonl_path, e)


class _ObjectLog:
  """metrics.jsonl on an object store: its earlier lines (a resumed run) and
  the new ones, uploaded whole every SYNC_S seconds and when forced."""

  def __init__(self, path: str):
    self.path = path
    self._text = storage.read_text(path) if storage.exists(path) else ""
    if self._text and not self._text.endswith("\n"):
      self._text += "\n"  # read_metrics skips a cut line; do not extend it
    self._dirty, self._last = False, time.monotonic()

  def write(self, line: str):
    self._text += line
    self._dirty = True

  def flush(self, force: bool = False):
    if self._dirty and (force or time.monotonic() - self._last > SYNC_S):
      try:
        storage.write_text(self.path, self._text)
      except Exception as e:  # pylint: disable=broad-except
        if isinstance(e, OSError):
          raise
        raise OSError(None, f"{type(e).__name__}: {e}") from None
      self._dirty, self._last = False, time.monotonic()

  def close(self):
    self.flush(force=True)


class _TensorBoard:
  """Scalar events written in the caller's thread (errors raise here)."""

  def __init__(self, logdir: str):
    from tensorboardX import event_file_writer  # pylint: disable=g-import-not-at-top
    storage.makedirs(logdir)
    self.logdir = logdir
    self._w = event_file_writer.EventsWriter(os.path.join(logdir, "events"))
    self._last_flush = 0.0

  def write(self, step: int, metrics: dict):
    from tensorboardX import summary  # pylint: disable=g-import-not-at-top
    from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
    now = time.time()
    for k, v in metrics.items():
      self._w.write_event(event_pb2.Event(
          wall_time=now, step=int(step), summary=summary.scalar(k, float(v))))
    if now - self._last_flush > 10.0:
      self._w.flush()
      self._last_flush = now

  def close(self):
    self._w.flush()
    self._w.close()


def _tb_sink(logdir: str):
  try:
    return _TensorBoard(logdir)
  except ImportError:  # TensorBoard is optional; the JSON lines are not.
    return None
  except Exception as e:  # pylint: disable=broad-except
    logging.warning("TensorBoard events in %s: %s: %s; disabled", logdir,
                    type(e).__name__, e)
    return None


def read_metrics(workdir: str) -> list[dict]:
  """The JSON-lines records of a run, last record per step wins (resumes)."""
  path = os.path.join(workdir, "metrics.jsonl")
  by_step = {}
  if storage.exists(path):
    with storage.open(path) as f:
      for line in f:
        line = line.strip()
        if line:
          try:
            rec = json.loads(line)
          except json.JSONDecodeError:  # a line cut by a kill
            continue
          by_step[rec["step"]] = rec
  return [by_step[s] for s in sorted(by_step)]
