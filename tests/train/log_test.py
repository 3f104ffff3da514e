"""Weights & Biases beside TensorBoard (train/log.py): off unless configured,
and, with wandb in offline mode, the metrics and the run's config and
revisions in the offline run's file, read back with a reader of its own
(wandb's record log: 32 KiB blocks of CRC'd chunks holding Record protos)."""
import json
import pathlib
import struct
import sys
import time

import jax
import pytest

from jaxdistill.train import log as train_log
from jaxdistill.train import loop as train_loop

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests import config_util  # pylint: disable=g-import-not-at-top,wrong-import-position

ONE_DEVICE = [jax.devices()[0]]


_config = config_util.runlocal_distill


def _records(path) -> list:
  """The Record protos of a .wandb file: a 7-byte header (':W&B', magic,
  version), then chunks of [crc32 u32, length u16, type u8] + data that
  never cross a 32 KiB block (a block's last < 7 bytes are padding); type
  1 is a whole record, 2/3/4 its first/middle/last part."""
  from wandb.proto import wandb_internal_pb2 as pb  # pylint: disable=g-import-not-at-top
  data = pathlib.Path(path).read_bytes()
  assert data[:4] == b":W&B", data[:8]
  block, pos, part, out = 32768, 7, b"", []
  while pos + 7 <= len(data):
    left = block - pos % block
    if left < 7:
      pos += left
      continue
    _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
    if n == 0 and kind == 0:  # zero padding to the block's end
      pos += left
      continue
    part += data[pos + 7:pos + 7 + n]
    pos += 7 + n
    if kind in (1, 4):
      r = pb.Record()
      r.ParseFromString(part)
      out.append(r)
      part = b""
  return out


def _finished_records(path, timeout=120.0):
  """The records of a run's .wandb file once it holds the run's exit record:
  wandb's service process may still be writing it after finish() returns
  (on a loaded machine the last history record came later)."""
  deadline = time.monotonic() + timeout
  while True:
    records = _records(path)
    if any(r.WhichOneof("record_type") == "exit" for r in records):
      return records
    if time.monotonic() > deadline:
      raise AssertionError(f"{path}: no exit record after {timeout} s")
    time.sleep(0.2)


def _offline_runs(workdir):
  """[(run id, config {key: value}, {step: {metric: value}})] of the offline
  runs under <workdir>/wandb, oldest first."""
  out = []
  for f in sorted(pathlib.Path(workdir, "wandb").rglob("offline-run-*/run-*.wandb")):
    run_id, config, history = None, {}, {}
    for r in _finished_records(f):
      kind = r.WhichOneof("record_type")
      if kind == "run":
        run_id = r.run.run_id
        config.update({i.key: json.loads(i.value_json)
                       for i in r.run.config.update})
      elif kind == "config":
        config.update({i.key: json.loads(i.value_json) for i in r.config.update})
      elif kind == "history":
        items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                 for i in r.history.item}
        history[int(items["_step"])] = items
    # The directory is offline-run-<time>-<run id>; a file whose run record
    # is not flushed yet (a loaded machine) still names its run there.
    out.append((run_id or f.parent.name.rsplit("-", 1)[-1], config, history))
  return out


@pytest.fixture
def offline(tmp_path, monkeypatch):
  pytest.importorskip("wandb")
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
  monkeypatch.setenv("WANDB_SILENT", "true")
  monkeypatch.delenv("WANDB_API_KEY", raising=False)


@pytest.mark.slow
def test_a_run_logs_its_metrics_and_config_to_wandb_offline(tmp_path, offline):
  del offline
  work = tmp_path / "run"
  c = _config(total_steps=2, ckpt_every=2, eval_every=2,
              **{"wandb.project": "jd-test", "wandb.mode": "offline"})
  train_loop.train(c, str(work), devices=ONE_DEVICE)
  (run_id, config, history), = _offline_runs(work)
  assert run_id == (work / train_log.WANDB_ID).read_text().strip()
  assert config["total_steps"] == 2 and config["wandb"]["project"] == "jd-test"
  assert config["student"]["init"]["hidden_size"] == 32
  assert config["revisions"] == {}  # random models: nothing from the hub
  logged = {r["step"]: r for r in train_log.read_metrics(str(work))}
  assert sorted(history) == sorted(logged) == [1, 2]
  for step, rec in logged.items():
    for k, v in rec.items():
      if k not in ("step", "time"):
        assert history[step][k] == pytest.approx(v, rel=1e-12), (step, k)


def test_revisions_are_attached_and_a_resume_logs_into_the_same_run(
    tmp_path, offline):
  del offline
  (tmp_path / "revisions.json").write_text(json.dumps(
      {"student.path": {"id": "Qwen/Qwen2.5-0.5B-Instruct", "revision": "main",
                        "commit": "a" * 40}}))
  data = tmp_path / "data"
  (data / "prepared").mkdir(parents=True)
  (data / "prepared" / "sciq.json").write_text(json.dumps(
      {"repo": "allenai/sciq", "revision": "main", "commit": "b" * 40,
       "records": {"train": 1}}))
  c = _config(**{"wandb.project": "jd-test", "data.data_dir": str(data),
                 "data.source": "sciq"})
  for step in (1, 2):  # a run, then its resume
    if step == 2:
      # wandb names an offline run's directory by the second it started and
      # the run id: a resume within the same second would reuse the first
      # run's file. Real resumes come later than that.
      time.sleep(1.1)
    log = train_log.Logger(str(tmp_path), total=2, start=step - 1,
                           progress=False, config=c)
    log.write(step, {"train/loss": 0.5 * step})
    log.close()
  (id1, config, h1), (id2, _, h2) = _offline_runs(tmp_path)
  assert id1 == id2
  assert config["revisions"] == {
      "student.path": {"id": "Qwen/Qwen2.5-0.5B-Instruct", "revision": "main",
                       "commit": "a" * 40},
      "data/sciq": {"repo": "allenai/sciq", "revision": "main",
                    "commit": "b" * 40}}
  assert h1[1]["train/loss"] == 0.5 and h2[2]["train/loss"] == 1.0


def test_off_unless_configured_and_never_imported(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb fails
  c = _config()
  train_log.check_wandb(c)
  log = train_log.Logger(str(tmp_path), total=1, progress=False, config=c)
  log.write(1, {"train/loss": 1.0})
  log.close()
  assert not (tmp_path / "wandb").exists()
  assert not (tmp_path / train_log.WANDB_ID).exists()


def test_enabled_without_wandb_is_refused_in_one_line_before_compute(
    tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)
  c = _config(**{"wandb.project": "jd-test"})
  with pytest.raises(ValueError) as e:
    train_loop.train(c, str(tmp_path / "w"), devices=ONE_DEVICE)
  assert str(e.value) == (
      "config.wandb.project is set but wandb is not installed: pip install "
      "wandb (or pip install -e '.[wandb]')")
  assert not (tmp_path / "w").exists()


def test_an_unknown_mode_is_refused(monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)
  c = _config(**{"wandb.project": "p", "wandb.mode": "ofline"})
  with pytest.raises(ValueError, match=r"config\.wandb\.mode: 'ofline'"):
    train_log.check_wandb(c)
