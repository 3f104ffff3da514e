"""What a training run shows: a progress bar, JSON lines, TensorBoard events.

Only process 0 writes. metrics.jsonl gets one object per logged step
({"step": n, "time": unix, <namespaced metrics>}); TensorBoard events go to
<workdir>/tb. The progress bar shows step, loss, tokens/s and the ETA.

The JSON lines are the run's record: failing to write them stops the run
with one line naming the file. TensorBoard is a convenience: its events are
written synchronously (tensorboardX's background writer blocks the caller
forever once its thread has died on a full disk), and the first error
disables it with a warning while training goes on.

Weights & Biases (optional, off unless config.wandb.project is set; `pip
install wandb`, the "wandb" extra): every logged step goes to a W&B run too,
whose config is the run's config with the revisions it records (the hub
commits of revisions.json, the prepared data set's record) under
"revisions". The run's W&B id is kept in <workdir>/wandb_id, so a resumed
run logs into the same W&B run. wandb is imported only when enabled; like
TensorBoard, an error while logging disables it with a warning.

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
import uuid

import jax
from tqdm.auto import tqdm

from jaxdistill import config_lib
from jaxdistill import storage
from jaxdistill.data import builders

# A gs:// metrics.jsonl is uploaded at most this often between checkpoints.
SYNC_S = 30.0


class Logger:

  def __init__(self, workdir: str, *, total: int, start: int = 0,
               progress: bool = True, log_every: int = 1, prefix: str = "train",
               config=None):
    """`config`: the run's config; its `wandb` block turns W&B on."""
    self.active = jax.process_index() == 0
    self.log_every = max(int(log_every), 1)
    self._jsonl = self._tb = self._bar = self._wandb = None
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
    if config is not None and wandb_settings(config):
      self._wandb = _WandB(config, workdir)
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
    if self._wandb is not None:
      try:
        self._wandb.write(step, metrics)
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("W&B: %s: %s; disabled, training goes on "
                        "(metrics.jsonl has every metric)", type(e).__name__, e)
        self._wandb = None

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
    if self._wandb is not None:
      try:
        self._wandb.close()
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("W&B: %s: %s", type(e).__name__, e)
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
    # tensorboardX's GCS writer closes (uploads the whole file) again when it
    # is garbage-collected: once is enough, and a later upload can block.
    gcs = getattr(getattr(self._w, "_py_recordio_writer", None), "_writer",
                  None)
    if gcs is not None and hasattr(gcs, "blob"):
      gcs.close = lambda: None


WANDB_MODES = ("online", "offline", "disabled")
WANDB_ID = "wandb_id"


def wandb_settings(config) -> dict | None:
  """config.wandb as a dict when W&B is on (its project set), else None."""
  w = config.get("wandb") or {}
  return dict(w) if w.get("project") else None


def check_wandb(config) -> None:
  """Before any compute: with config.wandb.project set, wandb must import
  and config.wandb.mode be one W&B knows (ValueError, one line)."""
  w = wandb_settings(config)
  if w is None:
    return
  if w.get("mode") not in (None,) + WANDB_MODES:
    raise ValueError(f"config.wandb.mode: {w['mode']!r}; choose from "
                     f"{', '.join(WANDB_MODES)} (or None: wandb's default)")
  _import_wandb()


def _import_wandb():
  try:
    import wandb  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ValueError("config.wandb.project is set but wandb is not "
                     "installed: pip install wandb (or pip install -e "
                     "'.[wandb]')") from None
  return wandb


def run_record(config, workdir: str) -> dict:
  """The run's config as a dict, with `revisions`: what revisions.json
  records (the hub commits the run loaded) and, for a data set prepared by
  name, its record's repo, revision and commit."""
  out = json.loads(config_lib.to_json(config))
  revisions = {}
  path = os.path.join(workdir, "revisions.json")
  if storage.exists(path):
    revisions.update(json.loads(storage.read_text(path)))
  d = config.get("data") or {}
  if d.get("data_dir") and d.get("source"):
    rec = builders.read_record(d.data_dir, d.source)
    if rec and "repo" in rec:
      revisions[f"data/{d.source}"] = {k: rec.get(k) for k in
                                       ("repo", "revision", "commit")}
  out["revisions"] = revisions
  return out


class _WandB:
  """One W&B run per workdir (its id in <workdir>/wandb_id: a resume logs
  into the same run); its files under <workdir>/wandb for a local workdir,
  else where WANDB_DIR says."""

  def __init__(self, config, workdir: str):
    wandb = _import_wandb()
    w = wandb_settings(config)
    id_path = os.path.join(workdir, WANDB_ID)
    if storage.exists(id_path):
      run_id = storage.read_text(id_path).strip()
    else:
      run_id = uuid.uuid4().hex[:16]  # letters and digits, as W&B wants
      storage.write_text(id_path, run_id)
    local = None
    if not storage.is_gs(workdir):
      local = os.path.join(workdir, "wandb")
      os.makedirs(local, exist_ok=True)
    try:
      self._run = wandb.init(
          project=w["project"], entity=w.get("entity"), mode=w.get("mode"),
          name=w.get("name") or os.path.basename(workdir.rstrip("/")),
          group=w.get("group"), id=run_id, resume="allow", dir=local,
          config=run_record(config, workdir))
    except Exception as e:  # pylint: disable=broad-except
      why = str(e).splitlines()[0][:200] if str(e) else ""
      raise RuntimeError(
          f"W&B: cannot start the run of {workdir} ({type(e).__name__}: "
          f"{why}); run `wandb login`, or set config.wandb.mode='offline' "
          "(then `wandb sync`)") from None

  def write(self, step: int, metrics: dict):
    self._run.log({k: float(v) for k, v in metrics.items()}, step=int(step))

  def close(self):
    self._run.finish()


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
