"""gs:// workdirs against a local GCS emulator (tests/gcs_emulator.py), and
the one-line refusals of what cannot be written as given."""
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from jaxdistill import cli
from jaxdistill import storage
from jaxdistill.train import checkpoint as ckpt_lib
from jaxdistill.train import log as train_log
from jaxdistill.train import loop as train_loop

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from configs import distill as distill_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests import config_util  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests import gcs_emulator  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests.gcs_emulator import gcs  # pylint: disable=g-import-not-at-top,wrong-import-position,unused-import  # a fixture

GS = f"gs://{gcs_emulator.BUCKET}"


# --- refusals: no emulator needed ------------------------------------------

@pytest.mark.parametrize("path, words", [
    ("s3://b/run", "s3:// scheme is not supported"),
    ("hdfs://nn/run", "hdfs:// scheme is not supported"),
    ("gs:/b/run", "is not a gs:// URL"),
    ("GS:b", "is not a gs:// URL"),
    ("gs://B_ad/run", "is not a bucket name"),
])
def test_bad_urls_are_refused_in_one_line(path, words):
  with pytest.raises(ValueError, match=words) as e:
    storage.check(path, "--workdir", gs_ok=True)
  assert "\n" not in str(e.value) and str(e.value).startswith("--workdir: ")


def test_paths_are_normalised():
  assert storage.check("gs://bkt1/run/", "x", gs_ok=True) == "gs://bkt1/run"
  assert storage.check("~/run", "x") == os.path.expanduser("~/run")
  assert storage.abspath("gs://bkt1/run") == "gs://bkt1/run"  # not ./gs:/bkt1/run
  assert storage.check("runs/a:b", "x") == "runs/a:b"  # a colon is not a URL


@pytest.mark.parametrize("check", [
    lambda p: cli.check_out_file(p, "--out"),        # without gs_ok=True
    lambda p: cli.check_out_dir(p, "--out"),         # analysis
    cli.check_writable_dir,                          # prepared data, sweep
])
def test_commands_without_gs_support_refuse_it(check, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(ValueError, match="gs:// is not supported here yet"):
    check("gs://bkt1/out")
  assert not os.listdir(tmp_path)  # nothing named gs: was made here


def _config(arg="runlocal", **updates):
  c = distill_config.get_config(arg)
  c.progress = False
  return config_util.set_fields(c, updates)


@pytest.mark.parametrize("field, value", [
    ("data.manual_dir", "gs://bkt1/files"),
    ("student.path", "s3://bkt1/student"),
])
def test_train_refuses_url_fields_before_compute(field, value, tmp_path,
                                                 monkeypatch):
  monkeypatch.chdir(tmp_path)
  c = _config(**{field: value})
  t0 = time.time()
  with pytest.raises(ValueError, match=f"config.{field}: ") as e:
    train_loop.train(c, str(tmp_path / "run"))
  assert time.time() - t0 < 5 and "\n" not in str(e.value)
  assert not os.listdir(tmp_path)  # not even the workdir


def test_cli_refuses_an_unknown_scheme_in_one_line(tmp_path):
  r = subprocess.run(
      [sys.executable, "-m", "jaxdistill.train", "--config",
       str(ROOT / "configs" / "distill.py") + ":runlocal",
       "--workdir", "s3://bkt1/run"], capture_output=True, text=True,
      cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)))
  assert r.returncode == 1
  assert r.stderr.strip().splitlines()[-1].startswith(
      "error: --workdir: s3://bkt1/run: the s3:// scheme is not supported")
  assert not os.listdir(tmp_path)


def _cfg(name):
  return str(ROOT / "configs" / name)


# Each command that cannot write gs:// yet, as a user would type it.
REFUSING = {
    "demo": ["jaxdistill.demo", "--workdir", "gs://bkt1/demo"],
    "analysis": ["jaxdistill.analysis", "--config",
                 _cfg("distill.py") + ":runlocal", "--out", "gs://bkt1/kl"],
    "bench": ["jaxdistill.bench.suite", "--preset", "tiny", "--out",
              "gs://bkt1/bench.json"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REFUSING))
def test_commands_refuse_gs_in_one_line_and_write_nothing(name, tmp_path):
  r = subprocess.run([sys.executable, "-m", *REFUSING[name]],
                     capture_output=True, text=True, cwd=tmp_path,
                     env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
  assert r.returncode == 1, r.stderr[-2000:]
  last = r.stderr.strip().splitlines()[-1]
  assert "gs:// is not supported here yet" in last
  # The benchmarks end with a traceback; the other commands in one line.
  assert last.startswith("ValueError: --out" if name == "bench" else "error: --")
  assert not os.listdir(tmp_path)


# --- against the emulator ---------------------------------------------------

def test_files_and_lock_on_gs(gcs):
  del gcs
  d = f"{GS}/files"
  storage.check_writable_dir(d)
  storage.write_text(f"{d}/a.json", "{}")
  assert storage.listdir(d) == ["a.json"] and storage.isfile(f"{d}/a.json")
  storage.move(f"{d}/a.json", f"{d}/sub/b.json")
  assert storage.listdir(d) == ["sub"] and storage.isdir(f"{d}/sub")

  lock = ckpt_lib.WorkdirLock(f"{GS}/locked")
  with lock:
    # What makes two processes racing for one workdir safe: the upload's
    # precondition (ifGenerationMatch=0), not a look first.
    with pytest.raises(FileExistsError):
      storage.create_exclusive(lock.path, "{}")
  assert not storage.exists(lock.path)
  storage.write_text(lock.path, json.dumps({"pid": 12345, "host": "tpu-vm-1"}))
  with pytest.raises(ValueError, match="in use by pid 12345 on host tpu-vm-1"):
    ckpt_lib.WorkdirLock(f"{GS}/locked").acquire()


def test_an_unwritable_bucket_is_refused_in_one_line(gcs):
  del gcs
  with pytest.raises(ValueError, match="gs://no-such-bucket/run: cannot "
                     "write there") as e:
    storage.check_writable_dir("gs://no-such-bucket/run")
  assert "\n" not in str(e.value)


def test_overwrite_on_gs_moves_the_old_run_aside(gcs):
  del gcs
  w = f"{GS}/overwrite"
  train_loop.prepare_workdir(_config(), w, False)
  storage.write_text(f"{w}/metrics.jsonl", '{"step": 1}\n')
  other = _config(**{"optim.lr": 1e-2})
  with pytest.raises(ValueError, match="holds a run of a different config"):
    train_loop.prepare_workdir(other, w, False)
  train_loop.prepare_workdir(other, w, True)
  aside = [e for e in storage.listdir(w) if e.startswith("replaced-")]
  assert len(aside) == 1
  assert sorted(storage.listdir(f"{w}/{aside[0]}")) == ["config.json",
                                                       "metrics.jsonl"]
  new = json.loads(storage.read_text(f"{w}/config.json"))
  assert new["optim"]["lr"] == 1e-2 and not storage.exists(f"{w}/metrics.jsonl")


def _cli(workdir, url=None):
  cmd = [sys.executable, "-m", "jaxdistill.train",
         "--config", str(ROOT / "configs" / "distill.py") + ":runlocal",
         "--workdir", str(workdir), "--config.total_steps=8",
         "--config.ckpt_every=2", "--config.progress=False"]
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1",
             PYTHONPATH=str(ROOT))
  if url:
    env.update(gcs_emulator.env(url))
  return cmd, env


def _student(directory):
  from safetensors import numpy as st_np  # pylint: disable=g-import-not-at-top
  return st_np.load_file(os.path.join(directory, "model.safetensors"))


@pytest.mark.slow
def test_gs_run_killed_and_resumed_exports_the_same_student(gcs, tmp_path):
  cmd, env = _cli(tmp_path / "ref")
  subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=ROOT)

  w = f"{GS}/killed"
  cmd, env = _cli(w, gcs)
  proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  ckpts = f"{w}/checkpoints"
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None:
    if any(s >= 4 for s in ckpt_lib.kept_steps(ckpts)):
      break
    time.sleep(0.1)
  assert proc.poll() is None, "run finished before it could be killed"
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  killed_at = max(ckpt_lib.kept_steps(ckpts))
  assert 4 <= killed_at < 8
  assert not storage.exists(f"{w}/hf_student/config.json")
  lock = json.loads(storage.read_text(f"{w}/.lock"))  # left by the kill
  assert lock == {"pid": proc.pid, "host": socket.gethostname()}

  r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
  assert r.returncode == 0, r.stderr[-2000:]
  assert f"resuming {w} from step {killed_at}" in r.stderr
  assert not storage.exists(f"{w}/.lock")
  local = tmp_path / "export"
  storage.download_dir(f"{w}/hf_student", str(local))
  ref, res = _student(tmp_path / "ref" / "hf_student"), _student(local)
  assert sorted(ref) == sorted(res)
  for k in ref:
    np.testing.assert_array_equal(ref[k], res[k], err_msg=k)
  assert [m["step"] for m in train_log.read_metrics(w)] == list(range(1, 9))
  assert not os.path.exists(ROOT / "gs:")


@pytest.mark.slow
def test_grpo_runs_to_gs(gcs):
  w = f"{GS}/grpo"
  cmd = [sys.executable, "-m", "jaxdistill.rl.train", "--config",
         str(ROOT / "configs" / "grpo_countdown.py") + ":runlocal",
         "--workdir", w, "--config.total_steps=2", "--config.ckpt_every=2",
         "--config.progress=False"]
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1",
             PYTHONPATH=str(ROOT), **gcs_emulator.env(gcs))
  r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
  assert r.returncode == 0, r.stderr[-2000:]
  assert ckpt_lib.kept_steps(f"{w}/checkpoints") == [2]
  assert storage.isfile(f"{w}/hf_student/config.json")
  assert storage.isfile(f"{w}/hf_student/model.safetensors")
  assert [m["step"] for m in train_log.read_metrics(w)] == [1, 2]


@pytest.mark.slow
def test_a_finished_gs_run_keeps_only_its_final_checkpoint(gcs):
  w = f"{GS}/final_only"
  cmd = [sys.executable, "-m", "jaxdistill.train",
         "--config", str(ROOT / "configs" / "distill.py") + ":runlocal",
         "--workdir", w, "--config.total_steps=3", "--config.ckpt_every=1",
         "--config.keep_final_only=True", "--config.progress=False"]
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1",
             PYTHONPATH=str(ROOT), **gcs_emulator.env(gcs))
  r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
  assert r.returncode == 0, r.stderr[-2000:]
  assert f"{w}: free space on gs:// is not checked" in r.stderr
  assert storage.listdir(f"{w}/checkpoints") == ["3"]
  assert ckpt_lib.kept_steps(f"{w}/checkpoints") == [3]
  assert storage.isfile(f"{w}/hf_student/model.safetensors")
  # The kept checkpoint still restores: the same command trains nothing.
  r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
  assert r.returncode == 0, r.stderr[-2000:]
  assert f"resuming {w} from step 3" in r.stderr
  assert [m["step"] for m in train_log.read_metrics(w)] == [1, 2, 3]
