"""`--distributed` with a bad coordinator: a bounded wait with progress lines,
then one error line naming the address and the process; an address without
a port is a one-line error. Two `python -m jaxdistill.train` processes on
127.0.0.1, as tests/multihost_test.py starts them (each in its own session,
killed when the test ends; every wait has a timeout). Process 0's
coordinator listens on one port, process 1 is told another, where nothing
listens: neither can form the cluster.
"""
import os
import pathlib
import signal
import socket
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
# Each process imports JAX and jaxdistill (seconds) before it waits; the
# subprocess timeout below only keeps a hang from blocking the suite.
TIMEOUT_S = 3


def _free_port() -> int:
  with socket.socket() as s:
    s.bind((LOOPBACK, 0))
    return s.getsockname()[1]


def _start(workdir, address, pid, bind_port=None, timeout=TIMEOUT_S):
  env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
  if bind_port is not None:
    env["JAX_COORDINATOR_BIND_ADDRESS"] = f"{LOOPBACK}:{bind_port}"
  cmd = [sys.executable, "-m", "jaxdistill.train", "--config",
         str(ROOT / "configs" / "distill.py") + ":runlocal", "--workdir",
         str(workdir), "--distributed", f"--coordinator_address={address}",
         "--num_processes=2", f"--process_id={pid}"]
  if timeout is not None:
    cmd.append(f"--coordinator_timeout={timeout}")
  return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True,
                          start_new_session=True)


def _finish(procs):
  try:
    return [p.communicate(timeout=300)[1] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


@pytest.mark.slow  # two processes, each importing JAX (about 10 s together)
def test_unreachable_coordinator_waits_with_progress_then_one_line(tmp_path):
  ports = _free_port(), _free_port()
  procs = [_start(tmp_path / "w", f"{LOOPBACK}:{ports[0]}", 0, ports[0]),
           _start(tmp_path / "w", f"{LOOPBACK}:{ports[1]}", 1)]
  errs = _finish(procs)
  for pid, (proc, err, port) in enumerate(zip(procs, errs, ports)):
    assert proc.returncode == 1, err[-3000:]
    lines = err.strip().splitlines()
    progress = [l for l in lines if l.startswith("waiting for coordinator")]
    assert progress and all(
        l.startswith(f"waiting for coordinator {LOOPBACK}:{port} (process "
                     f"{pid} of 2), ") and l.endswith(" s ...")
        for l in progress), err[-3000:]
    assert lines[-1] == (
        f"error: --distributed: process {pid} of 2 could not join the cluster "
        f"of the coordinator {LOOPBACK}:{port} within {TIMEOUT_S} s (is it "
        "process 0's address, is process 0 running, are all 2 processes "
        "started?); --coordinator_timeout sets the wait"), err[-3000:]
    assert "Check failure" not in err and "Traceback" not in err
  assert not (tmp_path / "w").exists()


@pytest.mark.slow  # two processes, each importing JAX
def test_coordinator_address_without_a_port_is_one_line(tmp_path):
  procs = [_start(tmp_path / "w", "localhost", pid, timeout=None)
           for pid in (0, 1)]
  for proc, err in zip(procs, _finish(procs)):
    assert proc.returncode == 1
    assert err.strip().splitlines() == [
        "error: --coordinator_address: 'localhost' is not HOST:PORT (e.g. "
        "10.0.0.1:1234); give the port process 0's coordinator listens on  "
        "(--verbose shows the traceback)"], err[-3000:]
  assert not (tmp_path / "w").exists()
