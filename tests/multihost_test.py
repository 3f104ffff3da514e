"""The multi-host path (`--distributed`) run as 2 JAX processes on this machine.

Each process has 4 simulated CPU devices (8 in all) and joins a cluster whose
coordinator listens on 127.0.0.1; CPU collectives go through gloo (JAX's
default for CPU). This is how the commands run on a TPU pod, one process per
host, minus the interconnect and a shared bucket-backed workdir.

The subprocesses run with the persistent compilation cache off: JAX writes it
from process 0 only and its keys differ between processes, so process 0 would
load its programs while process 1 compiles them, and that skew can exceed
gloo's 30 s limit for joining the first collective on a loaded machine.

Every process is started in its own session and SIGKILLed (its group) when a
test ends, passes or fails; every wait has a timeout.
"""
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from tests import config_util
from safetensors.numpy import load_file

from jaxdistill.rl import train as rl_train
from jaxdistill.train import loop as train_loop
from tests import gcs_emulator
from tests.gcs_emulator import gcs  # pylint: disable=unused-import  # a fixture

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from configs import \
    distill as distill_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from configs import grpo_countdown  # pylint: disable=g-import-not-at-top,wrong-import-position

LOOPBACK = "127.0.0.1"
N_PROC, LOCAL_DEVICES = 2, 4
LAUNCH_TIMEOUT_S = 600


def _host_is_loopback() -> bool:
  # gloo binds to the address this host's name resolves to: keep the test on
  # machines where that is the loopback interface.
  try:
    return socket.gethostbyname(socket.gethostname()).startswith("127.")
  except OSError:
    return False


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _host_is_loopback(), reason=(
        "gloo (JAX's CPU collectives) binds to the address of this host's "
        "name, which is not a loopback address here; the test only uses "
        "127.0.0.1")),
]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind((LOOPBACK, 0))
    return s.getsockname()[1]


def _env(port: int) -> dict:
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  return dict(
      os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
      XLA_FLAGS=" ".join(
          flags + [f"--xla_force_host_platform_device_count={LOCAL_DEVICES}"]),
      JAX_COORDINATOR_BIND_ADDRESS=f"{LOOPBACK}:{port}",
      JAX_ENABLE_COMPILATION_CACHE="false")


class Cluster:
  """N_PROC processes of one command on 127.0.0.1; all killed on exit."""

  def __init__(self, logdir: pathlib.Path, name: str, argv):
    """`argv(process_id, port)` -> the command of one process."""
    self.logs = [logdir / f"{name}-{i}.log" for i in range(N_PROC)]
    self.procs = []
    port = _free_port()
    env = _env(port)
    for i in range(N_PROC):
      with open(self.logs[i], "w") as log:
        self.procs.append(subprocess.Popen(
            argv(i, port), env=env, cwd=ROOT, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True))

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.kill()

  def kill(self):
    for p in self.procs:
      if p.poll() is None:
        try:
          os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
    for p in self.procs:
      p.wait(timeout=60)

  def log(self, i: int) -> str:
    return self.logs[i].read_text(errors="replace")

  def tails(self) -> str:
    return "\n".join(f"--- process {i} ---\n{self.log(i)[-3000:]}"
                     for i in range(N_PROC))

  def wait(self, timeout=LAUNCH_TIMEOUT_S, until=None):
    """Until every process exits (or `until()` holds); returns exit codes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      if until is not None and until():
        return None
      if all(p.poll() is not None for p in self.procs):
        return [p.returncode for p in self.procs]
      time.sleep(0.05)
    self.kill()
    pytest.fail(f"the {N_PROC} processes did not finish within {timeout} s:\n"
                + self.tails())


def _cli(module, config, workdir, overrides):
  def argv(i, port):
    return [sys.executable, "-m", module, "--config", config,
            "--workdir", str(workdir), "--distributed",
            f"--coordinator_address={LOOPBACK}:{port}",
            f"--num_processes={N_PROC}", f"--process_id={i}"] + [
                f"--config.{k}={v}" for k, v in overrides.items()]
  return argv


def _ckpt_params(workdir, step):
  """The student params of a checkpoint, as NumPy, read by Orbax directly
  onto one local device (the saved shardings name the run's topology)."""
  item = os.path.join(workdir, "checkpoints", str(step), "state")
  ckptr = ocp.StandardCheckpointer()
  try:
    meta = ckptr.metadata(item)
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one),
        dict(getattr(meta, "item_metadata", meta)))
    out = ckptr.restore(item, target)
  finally:
    ckptr.close()
  return {jax.tree_util.keystr(k): np.asarray(v) for k, v in
          jax.tree_util.tree_flatten_with_path(out["params"])[0]}


def _assert_close(ref: dict, got: dict, what: str):
  assert sorted(ref) == sorted(got), what
  for k in ref:
    np.testing.assert_allclose(got[k], ref[k], rtol=RTOL, atol=ATOL,
                               err_msg=f"{what}: {k}")


def _one_run_written(workdir: pathlib.Path, steps):
  """One checkpoints/ (steps `steps`), one hf_student/, metrics once per step:
  process 0 writes, the others only their shards."""
  found = lambda name: sorted(
      str(p.relative_to(workdir)) for p in workdir.rglob(name) if p.is_dir())
  assert found("hf_student") == ["hf_student"]
  assert found("checkpoints") == ["checkpoints"]
  ck = sorted(int(d) for d in os.listdir(workdir / "checkpoints")
              if d.isdigit())
  assert ck == list(steps), os.listdir(workdir / "checkpoints")
  assert not [d for d in os.listdir(workdir / "checkpoints")
              if not d.isdigit()], os.listdir(workdir / "checkpoints")
  assert not (workdir / ".lock").exists()
  lines = [json.loads(l) for l in
           (workdir / "metrics.jsonl").read_text().splitlines()]
  logged = [r["step"] for r in lines]
  assert sorted(set(logged)) == list(range(1, max(steps) + 1)), logged
  return lines


# Float32 tolerance between 2 processes x 4 devices and 1 process x 8: the same
# SPMD programs on the same mesh; cross-process reductions go through gloo, so
# sums may be ordered differently (a few ulps per step, 2 steps of Adam).
RTOL, ATOL = 1e-5, 1e-6

# configs/distill.py:runlocal with student+teacher (mixture) rollouts and the
# reverse KL, fsdp over all 8 devices (the config's mesh: data=1, fsdp=-1), 8
# prompts (1 row per device), 2 steps with a checkpoint after each.
DISTILL_ARG = "runlocal,kl=reverse,policy=coin_mixture,lam=0.5"
DISTILL = {"data.batch_size": 8, "total_steps": 2, "ckpt_every": 1,
           "eval_every": 2, "progress": False}


def test_distributed_train_matches_one_process_and_resumes_after_sigkill(
    tmp_path):
  ref_dir, work = tmp_path / "one_process", tmp_path / "two_processes"
  c = config_util.set_fields(distill_config.get_config(DISTILL_ARG), DISTILL)
  assert dict(c.mesh) == {"data": 1, "fsdp": -1, "tensor": 1}
  assert jax.device_count() == N_PROC * LOCAL_DEVICES  # conftest: 8 devices
  train_loop.train(c, str(ref_dir))

  argv = _cli("jaxdistill.train",
              str(ROOT / "configs" / "distill.py") + ":" + DISTILL_ARG, work,
              DISTILL)
  ckdir = work / "checkpoints"
  # Both processes SIGKILLed once checkpoint 1 is on disk, in step 2.
  with Cluster(tmp_path, "killed", argv) as cl:
    codes = cl.wait(until=lambda: (ckdir / "1").is_dir())
    assert codes is None, f"exited {codes} before checkpoint 1:\n{cl.tails()}"
    cl.kill()
  assert [p.returncode for p in cl.procs] == [-signal.SIGKILL] * N_PROC
  assert not (work / "hf_student").exists(), "the run ended before the kill"
  assert max(int(d) for d in os.listdir(ckdir) if d.isdigit()) == 1

  with Cluster(tmp_path, "resumed", argv) as cl:
    codes = cl.wait()
    assert codes == [0] * N_PROC, cl.tails()
    assert re.search(r"resuming .* from step 1", cl.log(0)), cl.tails()

  lines = _one_run_written(work, [1, 2])
  assert [r["step"] for r in lines].count(1) == 1, "step 1 logged twice"
  assert sorted(os.listdir(work)) == sorted(os.listdir(ref_dir))
  _assert_close(_ckpt_params(ref_dir, 2), _ckpt_params(work, 2),
                "checkpoint 2")
  # The export gathers the fsdp shards of both processes.
  _assert_close(load_file(ref_dir / "hf_student" / "model.safetensors"),
                load_file(work / "hf_student" / "model.safetensors"),
                "hf_student")
  ref_cfg = json.loads((ref_dir / "hf_student" / "config.json").read_text())
  assert json.loads((work / "hf_student" / "config.json").read_text()) == ref_cfg
  # The same rollouts (a mixture of both models' samples) and losses.
  ref_lines = [json.loads(l) for l in
               (ref_dir / "metrics.jsonl").read_text().splitlines()]
  for key in ("rollout/student_fraction", "rollout/tokens", "train/loss",
              "sparsity/S_1e-6_f32"):
    np.testing.assert_allclose([r[key] for r in lines if r["step"] == 2],
                               [ref_lines[-1][key]], rtol=1e-4, err_msg=key)


# configs/grpo_countdown.py:runlocal: 2 prompts x group 4 = 8 rows, fsdp over
# the 8 devices. Weight decay moves the params even when every reward is 0.
GRPO = {"total_steps": 2, "ckpt_every": 1, "eval_every": 2, "progress": False,
        "optim.weight_decay": 0.1}


def test_distributed_grpo_matches_one_process(tmp_path):
  ref_dir, work = tmp_path / "one_process", tmp_path / "two_processes"
  c = config_util.set_fields(grpo_countdown.get_config("runlocal"), GRPO)
  rl_train.train(c, str(ref_dir))
  argv = _cli("jaxdistill.rl.train",
              str(ROOT / "configs" / "grpo_countdown.py") + ":runlocal", work,
              GRPO)
  with Cluster(tmp_path, "grpo", argv) as cl:
    codes = cl.wait()
    assert codes == [0] * N_PROC, cl.tails()
  lines = _one_run_written(work, [1, 2])
  assert [r["step"] for r in lines] == [1, 2]
  assert sorted(os.listdir(work)) == sorted(os.listdir(ref_dir))
  _assert_close(_ckpt_params(ref_dir, 2), _ckpt_params(work, 2),
                "checkpoint 2")
  _assert_close(load_file(ref_dir / "hf_student" / "model.safetensors"),
                load_file(work / "hf_student" / "model.safetensors"),
                "hf_student")
  ref_lines = [json.loads(l) for l in
               (ref_dir / "metrics.jsonl").read_text().splitlines()]
  for key in ("rollout/len", "rl/reward_mean", "train/loss"):
    np.testing.assert_allclose([r[key] for r in lines],
                               [r[key] for r in ref_lines], rtol=1e-4,
                               atol=1e-6, err_msg=key)


def test_each_host_places_its_own_rows_of_the_global_batch(tmp_path):
  """sharding.put_global (SequenceMaker / rl Collector): per host, the rows its
  devices hold are the global batch's rows there, disjoint from the other
  host's and together the whole batch; a replicated batch is whole on each."""
  outs = [tmp_path / f"rows-{i}.json" for i in range(N_PROC)]
  worker = str(ROOT / "tests" / "multihost_worker.py")
  with Cluster(tmp_path, "rows", lambda i, port: [
      sys.executable, worker, str(i), str(port), str(outs[i])]) as cl:
    codes = cl.wait(timeout=300)
    assert codes == [0] * N_PROC, cl.tails()
  res = [json.loads(o.read_text()) for o in outs]
  x = np.arange(8 * 3).reshape(8, 3) * 7 + 1
  assert [r["process_index"] for r in res] == [0, 1]
  assert not set(res[0]["local_devices"]) & set(res[1]["local_devices"])
  for mesh in ("fsdp", "data2_fsdp2_tensor2", "tensor_only", "interleaved"):
    held = []
    for r in res:
      m = r["meshes"][mesh]
      assert {s["device"] for s in m["shards"]} == set(r["local_devices"])
      for s in m["shards"]:
        np.testing.assert_array_equal(s["data"], x[s["rows"]], err_msg=mesh)
      held.append({row for s in m["shards"] for row in s["rows"]})
      # A reduction over the whole mesh and a gather see the global batch.
      assert m["sum_sq"] == int(np.sum(x.astype(np.int64) ** 2)), mesh
      np.testing.assert_array_equal(m["to_host"], x, err_msg=mesh)
    if mesh == "tensor_only":  # batch replicated: every host holds all rows
      assert held == [set(range(8))] * N_PROC
    else:
      assert not held[0] & held[1], (mesh, held)
      assert held[0] | held[1] == set(range(8)), (mesh, held)
      assert len(held[0]) == len(held[1]) == 4, (mesh, held)


# A runlocal grid of one arm (reverse KL, student rollouts), 8 rows per step
# over the 8 devices, evaluated over all 8 devices too (runlocal evaluates on
# one device: the mesh makes it the multi-host path).
SWEEP_CONFIG = '''
from jaxdistill import config_lib


def get_config(arg=None):
  c = config_lib.load_config("configs/grid_main.py:runlocal,axes=kl")
  c.base.data.batch_size = 8
  c.eval.updates.mesh = dict(data=1, fsdp=-1, tensor=1)
  return c
'''


def _sweep_argv(config, workdir, *extra):
  def argv(i, port):
    return [sys.executable, "-m", "jaxdistill.sweep", "--config", str(config),
            "--workdir", str(workdir), "--only", "kl=reverse", "--distributed",
            f"--coordinator_address={LOOPBACK}:{port}",
            f"--num_processes={N_PROC}", f"--process_id={i}", *extra]
  return argv


@pytest.fixture(scope="module")
def one_process_sweep(tmp_path_factory):
  """(grid config file, workdir, results) of the one-arm grid swept by one
  process over 8 devices: the reference of the multi-host sweeps."""
  from jaxdistill import config_lib  # pylint: disable=g-import-not-at-top
  from jaxdistill.sweep import runner  # pylint: disable=g-import-not-at-top
  d = tmp_path_factory.mktemp("one_process_sweep")
  config = d / "grid_test.py"
  config.write_text(SWEEP_CONFIG)
  ref = runner.run_sweep(config_lib.load_config(str(config)),
                         str(d / "one_process"), only="kl=reverse")
  assert len(ref) == 1
  return config, d / "one_process", ref


def _assert_same_arm(got: dict, want: dict, got_student, want_student):
  """results.json's evaluation (accuracies, response lengths, pass@k,
  forgetting, the checkpoints' update sparsity) and the exported student
  as on one process."""
  assert sorted(got["eval"]) == sorted(want["eval"])
  for k, v in want["eval"].items():
    np.testing.assert_allclose(got["eval"][k], v, rtol=1e-4, atol=1e-6,
                               err_msg=k)
  assert any(k.endswith("/sampled_len") for k in want["eval"])
  _assert_close(load_file(want_student), load_file(got_student), "hf_student")


def test_distributed_sweep_matches_one_process(tmp_path, one_process_sweep):
  """`python -m jaxdistill.sweep --distributed` on 2 processes: the arm trains
  and is evaluated over both hosts' devices, process 0 alone writes the
  sweep's files, and the results equal a 1-process 8-device sweep's."""
  config, ref_dir, ref = one_process_sweep
  work = tmp_path / "two_processes"
  with Cluster(tmp_path, "sweep", _sweep_argv(config, work)) as cl:
    codes = cl.wait()
    assert codes == [0] * N_PROC, cl.tails()
  assert "[sweep]" in cl.log(0) and "[sweep]" not in cl.log(1), cl.tails()
  arm = ref[0]["dirname"]
  assert sorted(os.listdir(work)) == sorted(os.listdir(ref_dir))
  assert not (work / ".lock").exists()
  assert sorted(os.listdir(work / arm)) == sorted(os.listdir(ref_dir / arm))
  _assert_same_arm(json.loads((work / arm / "results.json").read_text()),
                   json.loads((ref_dir / arm / "results.json").read_text()),
                   work / arm / "hf_student" / "model.safetensors",
                   ref_dir / arm / "hf_student" / "model.safetensors")
  assert (work / "summary" / "results.md").is_file()

  # --print_commands --distributed: commands for every host, which run.
  printed = subprocess.run(
      [sys.executable, "-m", "jaxdistill.sweep", "--config", str(config),
       "--workdir", str(tmp_path / "printed"), "--only", "kl=reverse",
       "--print_commands", "--distributed"], cwd=ROOT, env=_env(_free_port()),
      capture_output=True, text=True, timeout=600)
  assert printed.returncode == 0, printed.stderr[-3000:]
  commands = [l for l in printed.stdout.splitlines()
              if l.startswith("python -m jaxdistill.train ")]
  assert len(commands) == 1 and commands[0].endswith(" --distributed"), \
      printed.stdout
  run_dir = tmp_path / "printed" / arm
  line = commands[0].split()
  with Cluster(tmp_path, "printed", lambda i, port: [
      sys.executable, *line[1:],
      f"--coordinator_address={LOOPBACK}:{port}",
      f"--num_processes={N_PROC}", f"--process_id={i}"]) as cl:
    codes = cl.wait()
    assert codes == [0] * N_PROC, cl.tails()
  # (Its numbers are the training path's, checked against one process
  # above; a printed runlocal command starts from the config's own tiny init,
  # not the sweep's saved assets.)
  assert (run_dir / "hf_student" / "model.safetensors").is_file(), cl.tails()
  assert re.search(r"step 2\b", cl.log(0)) or (
      run_dir / "checkpoints" / "2").is_dir(), cl.tails()


def test_distributed_gs_sweep_matches_one_process(tmp_path, one_process_sweep,
                                                  gcs):
  """The same 2-process sweep with --workdir gs://... (the local GCS
  emulator, tests/gcs_emulator.py): the arm's files, results and summary in
  the bucket, each host's inputs in its own local mirror, the results as a
  1-process local sweep's."""
  del gcs
  from jaxdistill import storage  # pylint: disable=g-import-not-at-top
  config, ref_dir, ref = one_process_sweep
  url = f"gs://{gcs_emulator.BUCKET}/sweeps/two_processes"
  os.environ[storage.MIRROR_ENV] = str(tmp_path / "mirror")  # the subprocesses'
  try:
    with Cluster(tmp_path, "gs_sweep", _sweep_argv(config, url)) as cl:
      codes = cl.wait()
      assert codes == [0] * N_PROC, cl.tails()
  finally:
    del os.environ[storage.MIRROR_ENV]
  assert "[sweep]" in cl.log(0) and "[sweep]" not in cl.log(1), cl.tails()
  arm = ref[0]["dirname"]
  assert not os.path.exists(ROOT / "gs:") and not os.path.exists("gs:")
  # The bucket holds what a local sweep's workdir holds, but its prepared
  # data (in each host's mirror: storage.scratch) and its lock (released).
  local_top = set(os.listdir(ref_dir)) - {"data"}
  assert set(storage.listdir(url)) == local_top | {"assets"}, (
      storage.listdir(url))
  assert set(storage.listdir(f"{url}/{arm}")) == set(os.listdir(ref_dir / arm))
  got = json.loads(storage.read_text(f"{url}/{arm}/results.json"))
  student = tmp_path / "student.safetensors"
  storage._fs().get_file(  # pylint: disable=protected-access
      f"{url[5:]}/{arm}/hf_student/model.safetensors", str(student))
  _assert_same_arm(got, json.loads((ref_dir / arm / "results.json").read_text()),
                   student, ref_dir / arm / "hf_student" / "model.safetensors")
  assert storage.isfile(f"{url}/summary/results.md")
