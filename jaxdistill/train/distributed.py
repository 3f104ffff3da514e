"""`--distributed`: joining a multi-host cluster, with a bounded wait.

jax.distributed.initialize waits for the coordinator (process 0) and for
every process to register. With a wrong or unreachable address it waits
its `initialization_timeout` and then aborts the process from C++ (a stack
trace, status 134), which Python cannot catch or interrupt. So a watchdog
thread prints a progress line on stderr while the process waits

  waiting for coordinator 10.0.0.1:1234 (process 1 of 2), 30 s ...

and after `timeout` seconds one error line naming the address and this
process, then ends the process with status 1. JAX's own timeout is set
past ours so that the watchdog speaks first.
"""
from __future__ import annotations

import os
import sys
import threading
import time

from absl import flags
import jax
from jax._src import distributed as jax_distributed
from jax.experimental import multihost_utils

DEFAULT_TIMEOUT_S = 300
PROGRESS_EVERY_S = 30


def check_address(address: str) -> None:
  """Refuses a coordinator address that is not HOST:PORT (JAX would raise an
  IndexError on 'localhost')."""
  host, sep, port = address.rpartition(":")
  if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
    raise ValueError(f"--coordinator_address: {address!r} is not HOST:PORT "
                     "(e.g. 10.0.0.1:1234); give the port process 0's "
                     "coordinator listens on")


def _where(given: dict) -> tuple[str, str, str]:
  """(address, process id, process count) as given or as JAX found them."""
  state = getattr(jax_distributed, "global_state", None)
  addr = (given.get("coordinator_address") or
          getattr(state, "coordinator_address", None) or "(found by JAX)")
  pid = given.get("process_id")
  n = given.get("num_processes") or getattr(state, "num_processes", None)
  return str(addr), "?" if pid is None else str(pid), "?" if n is None else str(n)


def _watch(done: threading.Event, timeout: float, given: dict) -> None:
  every = min(PROGRESS_EVERY_S, max(timeout / 3, 0.5))
  t0 = time.monotonic()
  while True:
    left = timeout - (time.monotonic() - t0)
    if done.wait(max(0.0, min(every, left))):
      return
    waited = time.monotonic() - t0
    addr, pid, n = _where(given)
    if waited >= timeout:
      print(f"error: --distributed: process {pid} of {n} could not join the "
            f"cluster of the coordinator {addr} within {timeout:g} s (is it "
            "process 0's address, is process 0 running, are all "
            f"{n} processes started?); --coordinator_timeout sets the wait",
            file=sys.stderr, flush=True)
      os._exit(1)  # the main thread is blocked inside JAX's C++ client
    print(f"waiting for coordinator {addr} (process {pid} of {n}), "
          f"{waited:.0f} s ...", file=sys.stderr, flush=True)


def initialize(given: dict, timeout: float = DEFAULT_TIMEOUT_S) -> None:
  """jax.distributed.initialize(**given), waiting at most `timeout` seconds
  (module docstring). `given`: coordinator_address, num_processes,
  process_id, each optional (JAX finds them on a TPU VM, SLURM, ...)."""
  if not timeout > 0:
    raise ValueError(f"--coordinator_timeout: must be > 0, got {timeout}")
  if given.get("coordinator_address") is not None:
    check_address(given["coordinator_address"])
  n, pid = given.get("num_processes"), given.get("process_id")
  if n is not None and n < 1:
    raise ValueError(f"--num_processes: must be >= 1, got {n}")
  if pid is not None and not (0 <= pid and (n is None or pid < n)):
    raise ValueError(f"--process_id: must be in [0, --num_processes={n}), "
                     f"got {pid}")
  done = threading.Event()
  threading.Thread(target=_watch, args=(done, float(timeout), given),
                   name="coordinator-watchdog", daemon=True).start()
  try:
    jax.distributed.initialize(**given,
                               initialization_timeout=int(timeout) + 60)
  finally:
    done.set()


FLAG_NAMES = ("coordinator_address", "num_processes", "process_id")


def define_flags(flag_values=None) -> None:
  """--distributed and its cluster flags, for every command that runs on a
  multi-host slice (train, rl.train, evaluate, sweep)."""
  fv = flags.FLAGS if flag_values is None else flag_values
  flags.DEFINE_bool("distributed", False,
                    "Call jax.distributed.initialize() (multi-host TPU/GPU).",
                    flag_values=fv)
  flags.DEFINE_string("coordinator_address", None,
                      "--distributed: host:port of process 0's coordinator "
                      "(default: found by JAX on a TPU VM / SLURM / MPI).",
                      flag_values=fv)
  flags.DEFINE_integer("num_processes", None,
                       "--distributed: number of processes (default: found "
                       "by JAX).", flag_values=fv)
  flags.DEFINE_integer("process_id", None,
                       "--distributed: this process's index (default: found "
                       "by JAX).", flag_values=fv)
  flags.DEFINE_float("coordinator_timeout", DEFAULT_TIMEOUT_S,
                     "--distributed: seconds to wait for the coordinator and "
                     "every process, with progress lines, then a one-line "
                     "error.", flag_values=fv)


def initialize_from_flags(f) -> None:
  """--distributed: jax.distributed.initialize(), before any JAX computation.
  On a TPU VM (or SLURM, Open MPI, Kubernetes) JAX finds the coordinator and
  this process's id itself; elsewhere pass --coordinator_address,
  --num_processes and --process_id. The wait for the cluster is bounded by
  --coordinator_timeout (initialize)."""
  given = {k: getattr(f, k) for k in FLAG_NAMES if getattr(f, k) is not None}
  if given and not f.distributed:
    raise ValueError(f"--{next(iter(given))} needs --distributed")
  if f.distributed:
    initialize(given, f.coordinator_timeout)


BARRIER_TIMEOUT_S = 3600


def barrier(name: str, timeout: float = BARRIER_TIMEOUT_S) -> None:
  """Every process waits here for the others (nothing on one process): what
  process 0 writes before it is seen by all after it. Through the cluster's
  coordination service, not a device collective: process 0 may be writing an
  export or preparing data for minutes, longer than a CPU collective (gloo)
  waits for its peers."""
  if jax.process_count() == 1:
    return
  client = getattr(jax_distributed.global_state, "client", None)
  if client is None:  # a cluster JAX joined by itself: a device collective
    multihost_utils.sync_global_devices(name)
    return
  client.wait_at_barrier(name, int(timeout * 1000))
