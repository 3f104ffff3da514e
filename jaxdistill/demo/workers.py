"""The demo's models and arms trained side by side by worker processes.

On a CPU one arm's programs are small (a decode step is a few products of
width 96 to 384), so one process keeps about 1.6 of 2 cores busy. Two
processes, each pinned to its own core, train two arms at once: 1.4x the
throughput of one process with both cores, measured on the 2-core CI machine
(two 100-step arms in 122 s side by side, one alone in 87 s).

`student_beside` trains the student in a worker on one core while the
teacher trains here on the others (1.4x, as for arms, while both run).
`run_arms` is the sweep's `train_runs` hook (jaxdistill.sweep.runner): it
starts `python -m jaxdistill.demo <the run's own arguments> --worker-runs
I,J,...` for each group of arms, pinned to its cores, and waits. A worker
finds the teacher, the student and their evaluations cached, trains and
evaluates its arms with `runner.run_one` (each arm's directory holds its own
lock) and writes what it spent to a report file; the sweep then reads every
arm's results.json as if it had trained them itself. Workers log to the same
stderr. SIGTERM or Ctrl-C stops the workers after their step in flight, with
a checkpoint, as a single run stops.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile

import jaxdistill

STOP_TIMEOUT_S = 120  # a worker writes a checkpoint, then exits


def available_cores() -> list[int]:
  """The CPU cores this process may run on."""
  if hasattr(os, "sched_getaffinity"):
    return sorted(os.sched_getaffinity(0))
  return list(range(os.cpu_count() or 1))


def pin(cores: list[int]) -> None:
  """Runs this process on `cores` only (before JAX starts its thread pools,
  which are sized by the cores a process may use). A no-op off Linux."""
  if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, set(cores))


def default_workers(n_arms: int) -> int:
  """One worker per core, at most one per arm."""
  return max(1, min(len(available_cores()), n_arms))


def groups(indices: list[int], workers: int,
           cores: list[int]) -> list[tuple[list[int], list[int]]]:
  """(arm indices, cores) per worker: arms dealt round-robin (arms of a grid
  cost about the same), cores split into contiguous blocks as evenly as
  possible. More workers than cores share them."""
  workers = max(1, min(workers, len(indices)))
  out = []
  for k in range(workers):
    if len(cores) >= workers:
      lo, hi = k * len(cores) // workers, (k + 1) * len(cores) // workers
      mine = cores[lo:hi]
    else:
      mine = [cores[k % len(cores)]]
    out.append((indices[k::workers], mine))
  return out


def worker_env() -> dict:
  """This environment, with jaxdistill importable in the worker wherever it
  was imported from here (an installed copy or a checkout on sys.path)."""
  env = dict(os.environ)
  root = os.path.dirname(os.path.dirname(os.path.abspath(jaxdistill.__file__)))
  env["PYTHONPATH"] = os.pathsep.join(
      p for p in (root, env.get("PYTHONPATH")) if p)
  return env


class Workers:
  """Worker processes, each `python -m jaxdistill.demo *argv <its flags>`;
  a context manager: leaving it with an exception (SIGTERM or Ctrl-C in
  this process, an error) stops the live ones after their step in flight,
  with a checkpoint, and waits for them."""

  def __init__(self, argv: list[str],
               jobs: list[tuple[str, list[str], list[int]]], log=print):
    """jobs: (what it does, its flags, its cores) per worker, e.g. ('arms [1,
    3]', ['--worker-runs', '0,2'], [0])."""
    self.what = [what for what, _, _ in jobs]
    self._tmp = tempfile.TemporaryDirectory(prefix="jaxdistill-workers-")
    self.reports = [os.path.join(self._tmp.name, f"{k}.json")
                    for k in range(len(jobs))]
    self.procs = []
    try:
      for k, (what, flags, cores) in enumerate(jobs):
        name = f"{k + 1}/{len(jobs)}"
        log(f"worker {name}: {what} on core"
            f"{'s' if len(cores) > 1 else ''} {','.join(map(str, cores))}")
        self.procs.append(subprocess.Popen(
            [sys.executable, "-m", "jaxdistill.demo", *argv, *flags,
             "--worker-cores", ",".join(map(str, cores)),
             "--worker-report", self.reports[k], "--worker-name", name],
            env=worker_env()))
    except BaseException:
      self.stop()
      raise

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.stop()
    self._tmp.cleanup()

  def wait(self) -> list[int]:
    """Their exit statuses, once all have ended."""
    return [p.wait() for p in self.procs]

  def spent(self) -> list[dict]:
    """What each worker reported ({'arms', 'arms_eval'}), {} for one that
    did not."""
    out = []
    for path in self.reports:
      if os.path.isfile(path):
        with open(path) as f:
          out.append(json.load(f))
      else:
        out.append({})
    return out

  def stop(self):
    live = [p for p in self.procs if p.poll() is None]
    for p in live:
      p.send_signal(signal.SIGTERM)
    for p in live:
      try:
        p.wait(timeout=STOP_TIMEOUT_S)
      except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def _failure(k: int, n: int, what: str, code: int) -> str:
  # Popen's status is -N for a worker killed by signal N: it printed no
  # error (the OOM killer's SIGKILL gives it no chance), so the message says
  # where its log is instead of pointing at an error above.
  name = f"worker {k + 1}/{n} ({what})"
  if code >= 0:
    return f"{name} exited with status {code}"
  try:
    sig = signal.Signals(-code).name
  except ValueError:
    sig = f"signal {-code}"
  hint = " (out of memory?)" if -code == signal.SIGKILL else ""
  return (f"{name} was killed by {sig}{hint} and printed no error: its log "
          f"is the lines marked [demo worker {k + 1}/{n}] above")


def check_codes(codes: list[int], what: list[str]) -> None:
  """RuntimeError naming every worker that failed (its number, the arms or
  model it held) and how: an exit status (its error is in the log above) or
  a signal (by name, and where its log is), once all have ended."""
  bad = [_failure(k, len(codes), w, c)
         for k, (c, w) in enumerate(zip(codes, what)) if c]
  if bad:
    above = " (its error is above)" if any(c > 0 for c in codes) else ""
    raise RuntimeError("; ".join(bad) + above + "; what finished is kept: "
                       "run the same command to resume")


def run_arms(argv: list[str], indices: list[int], workers: int,
             log=print) -> dict:
  """Trains the arms `indices` (into the grid's expanded runs) in `workers`
  processes (`--worker-runs I,J,...`); returns what they spent: {'arms':
  count, 'arms_eval': seconds summed over the workers, 'workers': how many
  ran}. A failed worker raises (check_codes) after the others have finished
  their arms."""
  plan = groups(indices, workers, available_cores())
  jobs = [(f"arms {[i + 1 for i in mine]}",
           ["--worker-runs", ",".join(map(str, mine))], cores)
          for mine, cores in plan]
  with Workers(argv, jobs, log=log) as w:
    codes = w.wait()
    got = w.spent()
  check_codes(codes, w.what)
  return {"arms": sum(int(g.get("arms", 0)) for g in got),
          "arms_eval": sum(float(g.get("arms_eval", 0.0)) for g in got),
          "workers": len(plan)}


@contextlib.contextmanager
def student_beside(argv: list[str], log=print):
  """The student trained by a worker on the last core (`--worker-model
  student`) while this process, pinned to the other cores, trains the
  teacher in the body; then this process gets every core back. A failed
  worker raises (check_codes) after the body."""
  cores = available_cores()
  with Workers(argv, [("the student", ["--worker-model", "student"],
                        cores[-1:])], log=log) as w:
    pin(cores[:-1])
    try:
      yield
    finally:
      pin(cores)
    codes = w.wait()
  check_codes(codes, w.what)
