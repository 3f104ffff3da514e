"""Failure modes of long runs (issue 20): preemption, full disks, stale sweep
arms, values that used to be accepted silently, late or misleading errors, a
second process on a workdir, and what a user must be told.

Every expected value comes from outside the code under test: an uninterrupted
run's checkpoint (read with Orbax directly), a NumPy norm, the errno given to
the injected fault, the pid of a process the test started.
"""
import errno
import json
import logging
import os
import pathlib
import re
import signal
import socket
import struct
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxdistill import config_lib
from jaxdistill import models
from jaxdistill.data import tokenizer as tok_lib
from jaxdistill.models import safetensors_io as st
from jaxdistill.rl import train as rl_train
from jaxdistill.sweep import runner
from jaxdistill.train import checkpoint as ckpt_lib
from jaxdistill.train import log as train_log
from jaxdistill.train import loop as train_loop
from jaxdistill.train import step as step_lib

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from orbax.checkpoint._src.handlers import json_checkpoint_handler as jh

from configs import \
    distill as distill_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from configs import grpo_countdown  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests import config_util
from tests import tiny_hf

ONE_DEVICE = [jax.devices()[0]]


def _config(arg="runlocal", **updates):
  c = distill_config.get_config(arg)
  c.progress = False
  c.export_hf = False
  return config_util.set_fields(c, updates)


def _rl_config(**updates):
  c = grpo_countdown.get_config("runlocal")
  return config_util.set_fields(c, {"progress": False, "export_hf": False,
                                    "eval_every": 3, "optim.weight_decay": 0.1,
                                    **updates})


def _ckpt_steps(workdir):
  d = pathlib.Path(workdir) / "checkpoints"
  return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit())


def _params(workdir, step):
  """A checkpoint's params as numpy, read with Orbax directly."""
  mngr = ocp.CheckpointManager(os.path.join(workdir, "checkpoints"),
                               item_names=("state", "meta"))
  out = mngr.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore()))
  mngr.close()
  return jax.tree.map(np.asarray, out["state"]["params"])


def _signal_at(monkeypatch, step, signum=signal.SIGTERM):
  """Sends `signum` to this process while step `step` is being logged, i.e.
  during a step, as a preemption notice would arrive."""
  real = train_log.Logger.write

  def write(self, n, metrics):
    if n == step:
      os.kill(os.getpid(), signum)
    return real(self, n, metrics)
  monkeypatch.setattr(train_log.Logger, "write", write)


# -- 1. preemption --------------------------------------------------------------

@pytest.mark.slow
def test_sigterm_checkpoints_stops_and_resumes_bitwise(tmp_path, monkeypatch):
  upd = {"total_steps": 5, "ckpt_every": 100, "eval_every": 100}
  train_loop.train(_config(**upd), str(tmp_path / "ref"), devices=ONE_DEVICE)
  handler = signal.getsignal(signal.SIGTERM)
  _signal_at(monkeypatch, 2)
  with pytest.raises(train_loop.Preempted, match="SIGTERM after step 2") as e:
    train_loop.train(_config(**upd), str(tmp_path / "run"), devices=ONE_DEVICE)
  assert e.value.exit_code == 128 + signal.SIGTERM
  assert signal.getsignal(signal.SIGTERM) == handler  # restored
  assert _ckpt_steps(tmp_path / "run") == [2]  # nothing lost but the signal step
  assert not (tmp_path / "run" / ".lock").exists()
  monkeypatch.undo()
  train_loop.train(_config(**upd), str(tmp_path / "run"), devices=ONE_DEVICE)
  jax.tree.map(np.testing.assert_array_equal, _params(tmp_path / "ref", 5),
               _params(tmp_path / "run", 5))
  steps = [r["step"] for r in train_log.read_metrics(str(tmp_path / "run"))]
  assert steps == [1, 2, 3, 4, 5]


def test_sigint_checkpoints_and_stops(tmp_path, monkeypatch):
  # Python's default handler, or SIG_IGN in a pytest-xdist worker.
  handler = signal.getsignal(signal.SIGINT)
  _signal_at(monkeypatch, 1, signal.SIGINT)
  with pytest.raises(train_loop.Preempted, match="SIGINT after step 1") as e:
    train_loop.train(_config(total_steps=3, ckpt_every=100), str(tmp_path),
                devices=ONE_DEVICE)
  assert e.value.exit_code == 128 + signal.SIGINT
  assert _ckpt_steps(tmp_path) == [1]
  assert signal.getsignal(signal.SIGINT) == handler  # restored


@pytest.mark.slow
def test_grpo_sigterm_resume_is_bitwise_identical(tmp_path, monkeypatch):
  upd = {"total_steps": 3, "ckpt_every": 100}
  rl_train.train(_rl_config(**upd), str(tmp_path / "ref"), devices=ONE_DEVICE)
  _signal_at(monkeypatch, 1)
  with pytest.raises(train_loop.Preempted, match="after step 1"):
    rl_train.train(_rl_config(**upd), str(tmp_path / "run"),
                   devices=ONE_DEVICE)
  assert _ckpt_steps(tmp_path / "run") == [1]
  monkeypatch.undo()
  rl_train.train(_rl_config(**upd), str(tmp_path / "run"), devices=ONE_DEVICE)
  jax.tree.map(np.testing.assert_array_equal, _params(tmp_path / "ref", 3),
               _params(tmp_path / "run", 3))


def _grid():
  g = config_lib.load_config(str(ROOT / "configs" / "grid_main.py") +
                        ":runlocal,axes=policy+lr")
  g.base.total_steps = 3
  g.base.ckpt_every = 100
  g.base.progress = False
  return g


ONLY = "policy=student,lr=0.001"


def _no_eval(grid, run, run_dir):
  del grid, run, run_dir
  return None


@pytest.mark.slow
def test_sweep_preempted_then_resumed_matches_uninterrupted(tmp_path,
                                                            monkeypatch):
  kw = dict(only=ONLY, devices=ONE_DEVICE, evaluate_fn=_no_eval,
            summarize=False)
  runner.run_sweep(_grid(), str(tmp_path / "ref"), **kw)
  _signal_at(monkeypatch, 2)
  with pytest.raises(train_loop.Preempted):
    runner.run_sweep(_grid(), str(tmp_path / "run"), **kw)
  (arm,) = [d for d in os.listdir(tmp_path / "run") if ONLY in d]
  assert not (tmp_path / "run" / arm / "results.json").exists()
  assert _ckpt_steps(tmp_path / "run" / arm) == [2]
  monkeypatch.undo()
  runner.run_sweep(_grid(), str(tmp_path / "run"), **kw)
  jax.tree.map(np.testing.assert_array_equal,
               _params(tmp_path / "ref" / arm, 3),
               _params(tmp_path / "run" / arm, 3))


@pytest.mark.slow
def test_cli_sigterm_exits_nonzero_with_one_line_and_a_checkpoint(tmp_path):
  work = tmp_path / "w"
  cmd = [sys.executable, "-m", "jaxdistill.train", "--config",
         str(ROOT / "configs" / "distill.py") + ":runlocal", "--workdir",
         str(work), "--config.total_steps=1000", "--config.ckpt_every=500",
         "--config.progress=False", "--config.export_hf=False"]
  env = dict(os.environ, PYTHONPATH=str(ROOT),
             XLA_FLAGS="--xla_force_host_platform_device_count=1")
  proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
  log = work / "metrics.jsonl"
  while proc.poll() is None and not (log.exists() and log.read_text()):
    try:
      proc.wait(0.2)
    except subprocess.TimeoutExpired:
      pass
  assert proc.poll() is None, "run ended before the signal"
  proc.send_signal(signal.SIGTERM)
  err = proc.communicate(timeout=300)[1]
  assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
  last = err.strip().splitlines()[-1]
  assert last.startswith("stopped by SIGTERM after step"), last
  logged = max(r["step"] for r in train_log.read_metrics(str(work)))
  # The signal came after `logged` steps were done; at most the step in
  # flight (if any) is added, none is lost.
  assert _ckpt_steps(work)[-1] in (logged, logged + 1)


# -- 2. full disk, unwritable directories, failing metric sinks -------------------

def test_checkpoints_path_that_is_a_file_fails_before_compute(tmp_path):
  tmp_path.joinpath("checkpoints").write_text("not a directory")
  with pytest.raises(ValueError, match="checkpoints: exists and is not a dir"):
    train_loop.train(_config(total_steps=1), str(tmp_path), devices=ONE_DEVICE)
  assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.slow
def test_cli_checkpoints_path_that_is_a_file_exits(tmp_path):
  tmp_path.joinpath("checkpoints").write_text("x")
  cmd = [sys.executable, "-m", "jaxdistill.train", "--config",
         str(ROOT / "configs" / "distill.py") + ":runlocal", "--workdir",
         str(tmp_path), "--config.progress=False"]
  env = dict(os.environ, PYTHONPATH=str(ROOT),
             XLA_FLAGS="--xla_force_host_platform_device_count=1")
  # The timeout only keeps a hang from blocking the suite; it asserts nothing.
  res = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
  assert res.returncode != 0
  assert str(tmp_path / "checkpoints") in res.stderr


def test_failing_tensorboard_warns_and_training_goes_on(tmp_path, monkeypatch,
                                                        caplog):
  def broken(self, step, metrics):
    raise OSError(errno.EIO, "Input/output error")
  monkeypatch.setattr(train_log._TensorBoard, "write", broken)  # pylint: disable=protected-access
  caplog.set_level(logging.WARNING)
  train_loop.train(_config(total_steps=3, ckpt_every=100), str(tmp_path),
              devices=ONE_DEVICE)
  assert "TensorBoard events" in caplog.text and "disabled" in caplog.text
  assert [r["step"] for r in train_log.read_metrics(str(tmp_path))] == [1, 2, 3]
  assert _ckpt_steps(tmp_path) == [3]


@pytest.mark.parametrize("fault_from,kept", [
    (4, [2]), pytest.param(2, [], marks=pytest.mark.slow)])
def test_full_disk_stops_at_the_failed_save_naming_it_and_what_is_kept(
    tmp_path, monkeypatch, fault_from, kept):
  """ENOSPC from TensorBoard's event writes (always) and from Orbax's writes
  of every checkpoint from step `fault_from` on, in its background thread
  (the real failure path). Checkpoints every 2 steps of 8: the message names
  the failed save's step (it used to name the next save's) and the
  checkpoints on disk (it used to say "Earlier checkpoints are kept" when
  there were none)."""
  from tensorboardX import event_file_writer  # pylint: disable=g-import-not-at-top

  def enospc(*a, **k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  monkeypatch.setattr(event_file_writer.EventsWriter, "write_event", enospc)
  real = jh.JsonCheckpointHandler._save_fn  # pylint: disable=protected-access

  async def save_fn(self, x, directory):
    if x.get("step", 0) >= fault_from:
      enospc()
    return await real(self, x, directory)
  monkeypatch.setattr(jh.JsonCheckpointHandler, "_save_fn", save_fn)
  with pytest.raises(ckpt_lib.CheckpointWriteError) as e:
    train_loop.train(_config(total_steps=8, ckpt_every=2), str(tmp_path),
                     devices=ONE_DEVICE)
  monkeypatch.undo()
  assert e.value.errno == errno.ENOSPC
  assert _ckpt_steps(tmp_path) == kept
  need = r"[\d.]+ KiB"
  if kept:  # what a save writes: the state's arrays, as Orbax reads them back
    mngr = ocp.CheckpointManager(os.path.join(tmp_path, "checkpoints"),
                                 item_names=("state", "meta"))
    state = mngr.restore(2, args=ocp.args.Composite(
        state=ocp.args.StandardRestore()))["state"]
    mngr.close()
    nbytes = sum(np.asarray(x).nbytes for x in jax.tree.leaves(state))
    assert nbytes < 1 << 20
    need = re.escape(f"{nbytes / 1024:.1f} KiB")
  what = ("kept: checkpoint 2; the same command resumes from step 2" if kept
          else "no checkpoint is kept: the same command starts from step 0")
  assert re.fullmatch(
      rf"checkpoint of step {fault_from} could not be written to "
      rf"{re.escape(str(tmp_path / 'checkpoints'))}: No space left on device "
      rf"\(a checkpoint needs about {need}, [\d.]+ \w+ free\); stopped; "
      rf"{what}", str(e.value)), str(e.value)
  logged = [r["step"] for r in train_log.read_metrics(str(tmp_path))]
  assert max(logged) < 8  # stopped, at the next save at the latest
  assert not (tmp_path / ".lock").exists()


# -- 3. stale sweep arms ----------------------------------------------------------

@pytest.mark.slow
def test_sweep_reuses_only_arms_with_the_same_config(tmp_path, monkeypatch):
  kw = dict(only=ONLY, devices=ONE_DEVICE, evaluate_fn=_no_eval,
            summarize=False)
  work = tmp_path / "a"
  runner.run_sweep(_grid(), str(work), **kw)
  (arm,) = [d for d in os.listdir(work) if ONLY in d]
  calls = []
  real = train_loop.train
  monkeypatch.setattr(train_loop, "train",
                      lambda *a, **k: calls.append(a) or real(*a, **k))
  # Identical (display settings aside), and after moving the sweep directory
  # (local assets' absolute paths change): reused, nothing trains.
  g = _grid()
  g.base.log_every = 2
  os.rename(work, tmp_path / "b")
  work = tmp_path / "b"
  runner.run_sweep(g, str(work), **kw)
  assert calls == []
  # A setting outside the axes changed: refused, naming the field.
  g = _grid()
  g.base.optim.weight_decay = 0.01
  with pytest.raises(ValueError, match=r"optim\.weight_decay: 0\.0 -> 0\.01"):
    runner.run_sweep(g, str(work), **kw)
  assert calls == []
  old = json.loads((work / arm / "results.json").read_text())
  runner.run_sweep(g, str(work), rerun_stale=True, **kw)
  assert len(calls) == 1
  assert json.loads((work / arm / "config.json").read_text())[
      "optim"]["weight_decay"] == 0.01
  (moved,) = os.listdir(work / "stale")
  assert json.loads((work / "stale" / moved / "results.json").read_text()
                    ) == old


def test_stale_fields_ignore_display_settings_and_moved_workdirs(tmp_path):
  old = {"progress": True, "log_every": 1, "tokenizer": "/old/sw/assets/tok",
         "optim": {"lr": 1e-3}, "teacher": {"path": "/ckpt/t"}}
  new = {"progress": False, "log_every": 5,
         "tokenizer": str(tmp_path / "assets" / "tok"),
         "optim": {"lr": 2e-3}, "teacher": {"path": "/ckpt/t2"}}
  changes = [c for c in runner._config_changes(old, new, str(tmp_path))  # pylint: disable=protected-access
             if c.split(":")[0] not in runner.DISPLAY_FIELDS]
  assert changes == ["optim.lr: 0.001 -> 0.002",
                     "teacher.path: '/ckpt/t' -> '/ckpt/t2'"]


# -- 4./5. values refused before compute, naming the field -------------------------

@pytest.mark.parametrize("field,value", [
    ("keep_ckpts", 0), ("loss.iw_clip", -1.0), ("loss.iw_clip", 0.0),
    ("optim.b1", 1.0), ("optim.b2", 1.5), ("optim.b1", -0.1),
    ("optim.eps", -1e-8), ("optim.weight_decay", -0.1),
    ("optim.final_lr_frac", 1.5), ("optim.final_lr_frac", -0.5),
    ("ckpt_every", 0), ("eval_every", 0), ("log_every", 0), ("log_every", -3),
    ("data.task", "countdwn"), ("data.batch_size", 0),
    # issue 62: an NF4 base without LoRA trained the whole float32 model; a
    # teacher system message without a teacher prompt was ignored.
    ("student.lora.base_quant", "nf4"),
    ("data.teacher_system", "You are a careful teacher."),
    # ... a float16 student trained with inf gradients to the end.
    ("student.dtype", "float16"), ("student.param_dtype", "float16"),
])
def test_silently_accepted_values_are_refused(tmp_path, field, value):
  c = _config(**{field: value})
  if field == "loss.iw_clip":
    c.loss.kind = "sampled"
  with pytest.raises(ValueError, match="config." + field.replace(".", r"\.")):
    train_loop.train(c, str(tmp_path), devices=ONE_DEVICE)
  assert not (tmp_path / "config.json").exists()


@pytest.mark.parametrize("train", ["distill", "grpo"])
def test_nf4_base_of_a_tiny_model_names_base_quant(tmp_path, train):
  # runlocal's student has hidden_size 32: NF4's 64-input blocks do not fit
  # (this failed in quantisation, naming no field).
  fields = {"student.lora.rank": 4, "student.lora.base_quant": "nf4"}
  with pytest.raises(ValueError, match=(
      r"^config\.student\.lora\.base_quant: 'nf4' quantises blocks of 64 "
      r"inputs, and this model's q_proj projection has 32 inputs")):
    if train == "distill":
      train_loop.train(_config(**fields), str(tmp_path), devices=ONE_DEVICE)
    else:
      rl_train.train(_rl_config(**fields), str(tmp_path), devices=ONE_DEVICE)
  assert not (tmp_path / "config.json").exists()


def test_batch_not_divisible_by_the_data_axes_names_data_batch_size(tmp_path):
  c = _config(**{"data.batch_size": 3, "mesh": {"data": 2, "fsdp": 1,
                                                "tensor": 1}})
  with pytest.raises(ValueError, match=r"config\.data\.batch_size: 3 .*2"):
    train_loop.train(c, str(tmp_path), devices=jax.devices()[:2])
  assert not (tmp_path / "config.json").exists()


@pytest.mark.parametrize("field,value", [
    ("keep_ckpts", 0), ("optim.b1", 1.0), ("ckpt_every", 0),
    ("optim.final_lr_frac", 2.0), ("student.dtype", "float16")])
def test_grpo_refuses_the_same_values(tmp_path, field, value):
  with pytest.raises(ValueError, match="config." + field.replace(".", r"\.")):
    rl_train.train(_rl_config(**{field: value}), str(tmp_path),
                   devices=ONE_DEVICE)


def test_training_workdir_as_student_path_says_use_hf_student(tmp_path):
  (tmp_path / "run" / "hf_student").mkdir(parents=True)
  (tmp_path / "run" / "hf_student" / "config.json").write_text("{}")
  c = _config(**{"student.path": str(tmp_path / "run"), "student.init": None})
  with pytest.raises(ValueError, match=r"config\.student\.path: .*hf_student"):
    train_loop.train(c, str(tmp_path / "w"), devices=ONE_DEVICE)


def test_corrupt_workdir_config_json_names_the_file(tmp_path):
  tmp_path.joinpath("config.json").write_text('{"seed": 0,')
  with pytest.raises(ValueError, match="config.json: not valid JSON"):
    train_loop.train(_config(total_steps=1), str(tmp_path), devices=ONE_DEVICE)


def test_garbled_safetensors_header_names_the_file(tmp_path):
  p = tmp_path / "model.safetensors"
  header = b'{"w": \xff\xfe}'
  p.write_bytes(struct.pack("<Q", len(header)) + header)
  with pytest.raises(ValueError, match=f"{p}: corrupt safetensors header"):
    st.read_header(str(p))


@pytest.mark.parametrize("damage", ["truncated", "shape"])
def test_bad_student_weights_are_refused_before_the_workdir(tmp_path, damage):
  """A truncated model.safetensors, or tensors that do not match config.json,
  used to be found by load_params, after the workdir was written."""
  ckpt = tmp_path / "student"
  tiny_hf.make_tiny_checkpoint("llama", ckpt, vocab_size=320)
  weights = ckpt / "model.safetensors"
  if damage == "truncated":
    weights.write_bytes(weights.read_bytes()[:-100])
    match = rf"config\.student\.path: {weights}: tensor .* byte range"
  else:
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (ckpt / "config.json").write_text(json.dumps(cfg))
    match = (rf"config\.student\.path: {ckpt}: tensor .* has shape "
             r"\(128, 64\), expected \(96, 64\)")
  c = _config(**{"student.path": str(ckpt), "student.init": None,
                 "student.dtype": "float32", "student.param_dtype": "float32"})
  with pytest.raises(ValueError, match=match):
    train_loop.train(c, str(tmp_path / "w"), devices=ONE_DEVICE)
  assert not (tmp_path / "w" / "config.json").exists()


def test_a_truncated_kl_reference_is_refused_before_the_workdir(tmp_path):
  ckpt = tmp_path / "reference"
  tiny_hf.make_tiny_checkpoint("llama", ckpt, vocab_size=320)
  weights = ckpt / "model.safetensors"
  weights.write_bytes(weights.read_bytes()[:-100])
  c = _rl_config(**{"kl.reference": str(ckpt), "kl.coef": 0.1})
  with pytest.raises(ValueError, match=(
      rf"^config\.kl\.reference: {weights}: tensor .* byte range")):
    rl_train.train(c, str(tmp_path / "w"), devices=ONE_DEVICE)
  assert not (tmp_path / "w" / "config.json").exists()


def test_tokenizer_errors_name_the_directory_or_file(tmp_path):
  (tmp_path / "empty").mkdir()
  with pytest.raises(ValueError, match="empty: no tokenizer files"):
    tok_lib.load_tokenizer(str(tmp_path / "empty"))
  (tmp_path / "bad").mkdir()
  (tmp_path / "bad" / "tokenizer.json").write_text('{"model": ')
  with pytest.raises(ValueError, match=r"bad/tokenizer\.json: malformed JSON"):
    tok_lib.load_tokenizer(str(tmp_path / "bad"))


# -- 6. flags -----------------------------------------------------------------------

def _parse(*overrides):
  script = ("import sys; from absl import flags; from jaxdistill import cli; from jaxdistill.train import loop as train_loop;"
            "train_loop.define_flags(); cli.parse_flags(sys.argv);"
            "c = flags.FLAGS.config; print(repr(c.optim.clip_norm), "
            "repr(c.rollout.lam))")
  cmd = [sys.executable, "-c", script, "--config",
         str(ROOT / "configs" / "distill.py"), "--workdir", "/tmp/x",
         *overrides]
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True,
                        text=True, timeout=600)


@pytest.mark.parametrize("flags_given", [
    ["--config.student.lora.targets=('q_proj', 'v_proj')"],
    ["--config.student.lora.targets=q_proj,v_proj"],
    ["--config.student.lora.targets=q_proj",
     "--config.student.lora.targets=v_proj"]])
def test_lora_targets_can_be_set_from_the_command_line(flags_given):
  # The field was a list, which no command-line spelling could override.
  script = ("import sys; from absl import flags; from jaxdistill import cli;"
            "from jaxdistill.train import loop as train_loop;"
            "from jaxdistill.models import lora;"
            "train_loop.define_flags(); cli.parse_flags(sys.argv);"
            "c = flags.FLAGS.config.student.lora; c.rank = 4;"
            "print(*lora.from_config(c).targets)")
  res = subprocess.run(
      [sys.executable, "-c", script, "--config",
       str(ROOT / "configs" / "distill.py"), "--workdir", "/tmp/x",
       *flags_given], env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
      capture_output=True, text=True, timeout=600)
  assert res.returncode == 0, res.stderr[-2000:]
  assert res.stdout.split() == ["q_proj", "v_proj"]


def test_config_flags_none_and_unknown_fields():
  res = _parse("--config.optim.clip_norm=None", "--config.rollout.lam=0.25")
  assert res.returncode == 0, res.stderr[-2000:]
  assert res.stdout.split() == ["None", "0.25"]
  for bad in ("--config.foo=1", "--config.foo=None"):
    res = subprocess.run(
        [sys.executable, "-m", "jaxdistill.train", "--config",
         str(ROOT / "configs" / "distill.py"), "--workdir", "/tmp/x", bad],
        env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
        capture_output=True, text=True, timeout=600)
    assert res.returncode != 0
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --config.foo: the config has no field 'foo'"), last


# -- 7. one process per workdir --------------------------------------------------------

def test_workdir_in_use_is_refused_naming_pid_and_host(tmp_path):
  holder = subprocess.Popen([sys.executable, "-c",
                             "import time; time.sleep(600)"])
  try:
    tmp_path.joinpath(".lock").write_text(json.dumps(
        {"pid": holder.pid, "host": socket.gethostname()}))
    with pytest.raises(ValueError, match=f"in use by pid {holder.pid} on host "
                       f"{socket.gethostname()}"):
      train_loop.train(_config(total_steps=1), str(tmp_path), devices=ONE_DEVICE)
    assert not (tmp_path / "config.json").exists()
  finally:
    holder.kill()
    holder.wait()


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path, caplog):
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  tmp_path.joinpath(".lock").write_text(json.dumps(
      {"pid": dead.pid, "host": socket.gethostname()}))
  caplog.set_level(logging.WARNING)
  with ckpt_lib.WorkdirLock(str(tmp_path)):
    held = json.loads(tmp_path.joinpath(".lock").read_text())
    assert held == {"pid": os.getpid(), "host": socket.gethostname()}
  assert "stale lock" in caplog.text and str(dead.pid) in caplog.text
  assert not (tmp_path / ".lock").exists()


@pytest.mark.parametrize("pid", ["abc", None, True, 1.5, -3, "123", 10**30])
def test_lock_with_a_non_numeric_pid_is_refused_in_one_line(tmp_path, pid):
  lock = tmp_path / ".lock"
  lock.write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))
  with pytest.raises(ValueError) as e:
    ckpt_lib.WorkdirLock(str(tmp_path)).acquire()
  assert str(e.value) == (
      f"{lock}: the workdir is locked, but the lock's pid {pid!r} is not a "
      "process id; remove the lock if no run uses this workdir")
  assert json.loads(lock.read_text())["pid"] == pid  # left as it was


# -- 8. what a user should see -----------------------------------------------------------

def test_nan_weights_in_a_checkpoint_are_named_at_load(tmp_path, caplog):
  path = tmp_path / "m"
  tiny_hf.make_tiny_checkpoint("llama", path, vocab_size=64)
  cfg, params = models.load_pretrained(str(path), dtype="float32")
  params = jax.tree.map(np.array, params)
  params["layers"]["mlp"]["down_proj"]["kernel"][0, 0, 0] = np.nan
  models.save_pretrained(cfg, params, str(tmp_path / "nan"))
  caplog.set_level(logging.WARNING)
  models.load_pretrained(str(tmp_path / "nan"), dtype="float32")
  assert "hold NaN or inf" in caplog.text
  assert "model.layers.0.mlp.down_proj.weight" in caplog.text


def test_nan_stop_keeps_good_checkpoints_and_reports_their_norms(tmp_path,
                                                         monkeypatch):
  real = step_lib.train_step

  def poisoned(state, *a, **k):
    new, m = real(state, *a, **k)
    m["train/loss"] = jax.numpy.where(state["step"] >= 2, jax.numpy.nan,
                                      m["train/loss"])
    return new, m
  monkeypatch.setattr(step_lib, "train_step", poisoned)
  with pytest.raises(FloatingPointError) as e:
    train_loop.train(_config(total_steps=6, ckpt_every=1), str(tmp_path),
                devices=ONE_DEVICE)
  msg = str(e.value)
  assert "step 3" in msg, msg
  steps = sorted(int(d) for d in os.listdir(tmp_path / "checkpoints")
                 if d.isdigit())
  assert steps[-1] == 2  # the NaN step wrote no checkpoint
  norms = {s: np.sqrt(sum(np.sum(np.asarray(x, np.float64) ** 2) for x in
                          jax.tree.leaves(_params(tmp_path, s))))
           for s in (1, 2)}
  for s, n in norms.items():
    assert f"{s} (param norm {n:.4g})" in msg, msg
  assert "resume from step 2, the last whose weights look sane" in msg


def test_dropped_long_prompts_are_counted_visibly(capsys):
  class Batches:
    num_dropped = 7
    records = list(range(50))
  train_loop.report_dropped(Batches())
  assert "dropped 7 of 50 training examples" in capsys.readouterr().err
