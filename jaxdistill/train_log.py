"""What a training run shows: a progress bar, JSON lines, TensorBoard events.

Only process 0 writes. metrics.jsonl gets one object per logged step
({"step": n, "time": unix, <namespaced metrics>}); TensorBoard events go to
<workdir>/tb. The progress bar shows step, loss, tokens/s and the ETA.
"""
from __future__ import annotations

import json
import os
import sys
import time

import jax


class Logger:

  def __init__(self, workdir: str, *, total: int, start: int = 0,
               progress: bool = True, log_every: int = 1, prefix: str = "train"):
    self.active = jax.process_index() == 0
    self.log_every = max(int(log_every), 1)
    self._jsonl = self._tb = self._bar = None
    if not self.active:
      return
    self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")
    try:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      self._tb = SummaryWriter(os.path.join(workdir, "tb"))
    except ImportError:  # TensorBoard is optional; the JSON lines are not.
      self._tb = None
    if progress:
      from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
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
    self._jsonl.write(json.dumps(rec) + "\n")
    self._jsonl.flush()
    if self._tb is not None:
      for k, v in metrics.items():
        self._tb.add_scalar(k, float(v), step)

  def close(self):
    if not self.active:
      return
    if self._bar is not None:
      self._bar.close()
    if self._tb is not None:
      self._tb.close()
    self._jsonl.close()


def read_metrics(workdir: str) -> list[dict]:
  """The JSON-lines records of a run, last record per step wins (resumes)."""
  path = os.path.join(workdir, "metrics.jsonl")
  by_step = {}
  if os.path.exists(path):
    with open(path) as f:
      for line in f:
        line = line.strip()
        if line:
          try:
            rec = json.loads(line)
          except json.JSONDecodeError:  # a line cut by a kill
            continue
          by_step[rec["step"]] = rec
  return [by_step[s] for s in sorted(by_step)]
