r"""The teacher cache's check at open, against one read of its records file.

  python -m jaxdistill.bench.cache_check [--mib 256 --rounds 3]

Opening a teacher cache (train.teacher_cache.TeacherCache) streams its
records file once through sha256 and compares the digest with the one
meta.json recorded at the build, so a changed byte is found before the run
(JAXDISTILL_TEACHER_CACHE_CHECK=0 skips it). This writes a synthetic cache of
about `--mib` MiB in the build's format (records of batch 4 x 256 positions x
top-64 ids and log-probs), then, in interleaved rounds, each from disk (the
file evicted from the page cache first: posix_fadvise DONTNEED) and again
from the page cache:

  * read: the records file read once, 1 MiB at a time (no hashing);
  * open: TeacherCache(dir) with the check, and with
    JAXDISTILL_TEACHER_CACHE_CHECK=0 (everything else the open does).

The check's time is the median open with it minus the median open without.
Headline: that time / the median read, both from disk (a run's first open of
a cache). From the page cache the read is several times faster than sha256,
so that ratio (reported beside) is the check's worst case. Prints one JSON
object; progress to stderr.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time

from array_record.python import array_record_module
import numpy as np

from jaxdistill.train import teacher_cache

GOAL = 2.0  # the check within two reads of the file from disk


def _log(*a):
  print(*a, file=sys.stderr, flush=True)


def write_cache(directory: str, mib: int, batch=4, length=256, k=64) -> int:
  """A teacher cache of about `mib` MiB of records (random top-k), in the
  layout teacher_cache.build writes; returns its records file's size."""
  rng = np.random.default_rng(0)
  made_from = {"bench": "cache_check", "k": k}
  per_step = batch * length * k * 8  # int32 ids + float32 log-probs
  steps = max(2, (mib << 20) // per_step)
  os.makedirs(directory)
  records = os.path.join(directory, teacher_cache.RECORDS)
  writer = array_record_module.ArrayRecordWriter(records, "group_size:1")
  try:
    for _ in range(steps):
      arrays = {
          "tokens": rng.integers(0, 32000, (batch, length), np.int32),
          "attention_mask": np.ones((batch, length), np.int32),
          "loss_mask": np.ones((batch, length), np.int32),
          "teacher_topk_ids": rng.integers(0, 32000, (batch, length, k),
                                           np.int32),
          "teacher_topk_logprobs": rng.standard_normal(
              (batch, length, k)).astype(np.float32),
          "teacher_topk_tail": rng.random((batch, length), np.float32),
          teacher_cache.MADE_FROM: np.array(json.dumps(made_from,
                                                       sort_keys=True))}
      buf = io.BytesIO()
      np.savez(buf, **arrays)
      writer.write(buf.getvalue())
  finally:
    writer.close()
  with open(os.path.join(directory, teacher_cache.META), "w") as f:
    json.dump({"format": teacher_cache.FORMAT,
               teacher_cache.MADE_FROM: made_from, "num_steps": int(steps),
               teacher_cache.RECORDS_DIGEST: teacher_cache.file_digest(records)},
              f, sort_keys=True)
  return os.path.getsize(records)


def read_once(path: str) -> None:
  with open(path, "rb") as f:
    while f.read(1 << 20):
      pass


def evict(path: str) -> bool:
  """Drops `path` from the page cache (its pages are clean: written and
  synced); False where the OS has no posix_fadvise."""
  if not hasattr(os, "posix_fadvise"):
    return False
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
  finally:
    os.close(fd)
  return True


def _timed(fn, cold_path: str | None = None) -> float:
  if cold_path:
    evict(cold_path)
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


def _open(directory: str, check: str) -> None:
  old = os.environ.get(teacher_cache.CHECK_ENV)
  os.environ[teacher_cache.CHECK_ENV] = check
  try:
    teacher_cache.TeacherCache(directory)
  finally:
    if old is None:
      del os.environ[teacher_cache.CHECK_ENV]
    else:
      os.environ[teacher_cache.CHECK_ENV] = old


def _figures(times: dict, size: int) -> dict:
  med = {n: statistics.median(v) for n, v in times.items()}
  check = max(med["open_checked"] - med["open_unchecked"], 0.0)
  return {"ratio": check / med["read"], "check_s": round(check, 4),
          "check_gb_per_s": round(size / check / 1e9, 2) if check else None,
          "read_s": round(med["read"], 4),
          "read_gb_per_s": round(size / med["read"] / 1e9, 2),
          "open_checked_s": round(med["open_checked"], 4),
          "open_unchecked_s": round(med["open_unchecked"], 4),
          "rounds": {n: [round(t, 6) for t in v] for n, v in times.items()}}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--mib", type=int, default=256, help="records file size")
  ap.add_argument("--rounds", type=int, default=3)
  args = ap.parse_args(argv)
  kinds = ("read", "open_checked", "open_unchecked")
  times = {where: {n: [] for n in kinds} for where in ("disk", "page_cache")}
  with tempfile.TemporaryDirectory() as tmp:
    cache = os.path.join(tmp, "cache")
    t0 = time.perf_counter()
    size = write_cache(cache, args.mib)
    records = os.path.join(cache, teacher_cache.RECORDS)
    _log(f"wrote a {size / 2**20:.0f} MiB teacher cache in "
         f"{time.perf_counter() - t0:.1f} s")
    from_disk = evict(records)
    steps = {"read": lambda: read_once(records),
             "open_checked": lambda: _open(cache, "1"),
             "open_unchecked": lambda: _open(cache, "0")}
    for r in range(args.rounds):
      for n in kinds:
        if from_disk:
          times["disk"][n].append(_timed(steps[n], records))
        times["page_cache"][n].append(_timed(steps[n]))
      _log(f"round {r + 1}: " + "; ".join(
          f"{w}: " + ", ".join(f"{n} {v[-1]:.3f} s" for n, v in t.items() if v)
          for w, t in times.items()))
  got = {w: _figures(t, size) for w, t in times.items() if t["read"]}
  head = got["disk" if from_disk else "page_cache"]
  report = {
      "headline": {
          "name": "teacher cache sha256 check at open / one read of its "
                  "records file" + (" (from disk)" if from_disk else
                                    " (page cache: no posix_fadvise here)"),
          "value": round(head["ratio"], 2), "unit": "x",
          "goal": f"<= {GOAL:g}", "meets_goal": head["ratio"] <= GOAL},
      "records_bytes": size,
      **{w: dict(f, ratio=round(f["ratio"], 2)) for w, f in got.items()},
      "config": vars(args),
  }
  print(json.dumps(report, indent=1))
  return report


if __name__ == "__main__":
  main()
