"""gs:// inputs against the local GCS emulator (tests/gcs_emulator.py): a
teacher cache built to a bucket from a teacher read from a bucket holds the
same records as one built from local files, a run reads it back through its
local mirror and trains exactly as from the local cache, an unfinished
upload is refused, and checkpoints and workdirs on gs:// resolve as local
ones do (models.hub.checkpoint_dir)."""
import json
import os
import pathlib

import jax
import numpy as np
import pytest

from jaxdistill import models
from jaxdistill import storage
from jaxdistill.models import hub
from jaxdistill.train import loop as train_loop
from jaxdistill.train import teacher_cache
from tests import gcs_emulator
from tests.gcs_emulator import gcs  # pylint: disable=unused-import  # a fixture
from tests.train import teacher_cache_test as tc_test

GS = f"gs://{gcs_emulator.BUCKET}"
ONE_DEVICE = [jax.devices()[0]]
ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _mirror(tmp_path, monkeypatch):
  monkeypatch.setenv(storage.MIRROR_ENV, str(tmp_path / "mirror"))


def _arrays(cache):
  return [{k: v for k, v in cache[s].items() if k != teacher_cache.MADE_FROM}
          for s in range(len(cache))]


@pytest.mark.slow  # two cache builds and two 2-step runs
def test_teacher_cache_on_gs_equals_the_local_one(gcs, tmp_path):
  del gcs
  local_teacher = tmp_path / "teacher"
  tc_test._save_teacher(local_teacher, seed=0)  # pylint: disable=protected-access
  storage.upload_dir(str(local_teacher), f"{GS}/teacher", last="config.json")

  ref_dir = str(tmp_path / "cache")
  teacher_cache.build(tc_test._path_config(local_teacher), ref_dir,  # pylint: disable=protected-access
                      devices=ONE_DEVICE)
  url = f"{GS}/tc/cache"
  gs_config = tc_test._path_config(f"{GS}/teacher")  # pylint: disable=protected-access
  assert teacher_cache.build(gs_config, url, devices=ONE_DEVICE) == url
  assert storage.listdir(url) == sorted([teacher_cache.META,
                                         teacher_cache.RECORDS])
  assert not os.path.exists(ROOT / "gs:") and not os.path.exists("gs:")

  ref, got = teacher_cache.TeacherCache(ref_dir), teacher_cache.TeacherCache(url)
  assert got.source == url and got.directory.startswith(str(tmp_path / "mirror"))
  a, b = _arrays(ref), _arrays(got)
  assert len(a) == len(b) == 2
  for ra, rb in zip(a, b):
    assert sorted(ra) == sorted(rb)
    for k in ra:
      np.testing.assert_array_equal(ra[k], rb[k], err_msg=k)
  # The teacher's weights were fingerprinted through their mirror: the same
  # bytes as the local directory's.
  assert (got.meta[teacher_cache.MADE_FROM]["teacher_weights"]
          == ref.meta[teacher_cache.MADE_FROM]["teacher_weights"])

  # A second open reads the mirror as it is (no new download).
  records = os.path.join(got.directory, teacher_cache.RECORDS)
  before = os.stat(records).st_mtime_ns
  assert teacher_cache.TeacherCache(url).directory == got.directory
  assert os.stat(records).st_mtime_ns == before

  # A run from the gs:// cache trains as one from the local cache.
  runs = {}
  for name, cache, teacher in (("local", ref_dir, local_teacher),
                               ("gs", url, f"{GS}/teacher")):
    c = tc_test._path_config(teacher, teacher_cache=cache)  # pylint: disable=protected-access
    train_loop.train(c, str(tmp_path / name), devices=ONE_DEVICE)
    runs[name] = tc_test._metrics(tmp_path / name)  # pylint: disable=protected-access
  assert len(runs["local"]) == len(runs["gs"]) == 2
  for ra, rb in zip(runs["local"], runs["gs"]):
    for k in ("train/loss", "train/grad_norm", "distill/rkl"):
      assert ra[k] == pytest.approx(rb[k], rel=1e-6), k

  # Rebuilding over it needs --overwrite, as locally.
  with pytest.raises(ValueError, match="holds a teacher cache; pass "
                     "--overwrite"):
    teacher_cache.build(gs_config, url, devices=ONE_DEVICE)
  # An upload without its meta.json (written last) is not a cache.
  storage.remove(f"{url}/{teacher_cache.META}")
  with pytest.raises(ValueError, match="config.loss.teacher_cache: .*holds no "
                     "meta.json"):
    teacher_cache.TeacherCache(url)


def test_gs_checkpoints_and_workdirs_resolve_like_local_ones(gcs, tmp_path):
  del gcs
  cfg = models.ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                           num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=1,
                           head_dim=8)
  src = tmp_path / "ckpt"
  models.save_pretrained(cfg, models.init(cfg, jax.random.key(0)), str(src))
  storage.upload_dir(str(src), f"{GS}/hub/ckpt", last="config.json")
  local = hub.checkpoint_dir(f"{GS}/hub/ckpt", "config.student.path")
  assert sorted(os.listdir(local)) == sorted(os.listdir(src) + [
      ".jaxdistill-mirror.json"])
  for n in os.listdir(src):
    assert (src / n).read_bytes() == pathlib.Path(local, n).read_bytes(), n

  # A training workdir: its hf_student/ export, only where allowed.
  w = f"{GS}/hub/run"
  storage.write_text(f"{w}/config.json", json.dumps({"student": {}}))
  storage.write_text(f"{w}/metrics.jsonl", "")
  with pytest.raises(hub.NotFound, match="no finished hf_student/ export"):
    hub.checkpoint_dir(w, "config.kl.reference", workdir_ok=True)
  storage.upload_dir(str(src), f"{w}/hf_student", last="config.json")
  with pytest.raises(ValueError, match="is a training workdir, not a "
                     f"checkpoint: use its exported student, {w}/hf_student"):
    hub.checkpoint_dir(w, "config.student.path")
  export = hub.checkpoint_dir(w, "config.kl.reference", workdir_ok=True)
  assert "checkpoints" not in os.listdir(export)
  assert (src / "config.json").read_bytes() == pathlib.Path(
      export, "config.json").read_bytes()
  # An unfinished upload (no config.json yet) is refused by name.
  storage.upload_dir(str(src), f"{GS}/hub/partial", last="config.json")
  storage.remove(f"{GS}/hub/partial/config.json")
  with pytest.raises(hub.NotFound, match="config.teacher.path: "
                     f"{GS}/hub/partial holds no config.json"):
    hub.checkpoint_dir(f"{GS}/hub/partial", "config.teacher.path")
