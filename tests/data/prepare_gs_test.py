"""`python -m jaxdistill.data.prepare NAME --data_dir gs://...` and runs and
evaluation suites reading a gs:// data_dir, against the local GCS emulator
(tests/gcs_emulator.py): what lands in the bucket is laid out as a local
prepare lays it out (the record last), what a config reads from the bucket
equals what it reads from a local prepare, a second prepare uploads nothing,
and a data set whose record is missing (an unfinished upload) is refused with
the command to run."""
import json
import os
import pathlib

import ml_collections
import pytest

from jaxdistill import storage
from jaxdistill.data import builders
from jaxdistill.data import pipeline
from jaxdistill.data import prepare
from jaxdistill.evaluate import suites
from tests import gcs_emulator
from tests import hub_cache
from tests.gcs_emulator import gcs  # pylint: disable=unused-import  # a fixture

GS = f"gs://{gcs_emulator.BUCKET}"
ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _mirror(tmp_path, monkeypatch):
  monkeypatch.setenv(storage.MIRROR_ENV, str(tmp_path / "mirror"))


def _objects(url):
  fs = storage._fs()  # pylint: disable=protected-access
  root = url[len("gs://"):]
  return sorted(os.path.relpath(k, root) for k in fs.find(root))


def _files(d):
  """The files a local prepare left, but its lock files and the tfds
  builder's default-config note (BUILDER/.config/metadata.json, which
  reading a named config never opens)."""
  return sorted(os.path.relpath(os.path.join(r, n), d)
                for r, _, ns in os.walk(d) for n in ns
                if not n.endswith(".lock") and not r.endswith("/.config"))


def _generation(url):
  return storage._fs().info(url[len("gs://"):])["generation"]  # pylint: disable=protected-access


def test_paper_countdown_on_gs_reads_as_the_local_one(gcs, tmp_path):
  del gcs
  local, url = str(tmp_path / "local"), f"{GS}/data"
  logs = []
  prepare.main(["countdown3", "--data_dir", local])
  rec = prepare.prepare("countdown3", url, log=logs.append)
  assert rec == json.load(open(builders.record_path(local, "countdown3")))
  assert any("uploaded to gs://" in m for m in logs)
  # The bucket holds what the local prepare wrote, nothing else.
  assert _objects(url) == _files(local)
  assert not os.path.exists(ROOT / "gs:") and not os.path.exists("gs:")
  assert builders.read_record(url, "countdown3") == rec

  data = ml_collections.ConfigDict(dict(task="countdown", source="countdown3",
                                        split="train", data_dir=url))
  got = pipeline.records_from_config(data)
  data.data_dir = local
  assert got == pipeline.records_from_config(data) and len(got) == 5000
  spec = ml_collections.ConfigDict(dict(kind="countdown", source="countdown3",
                                        data_dir=url, num_problems=200))
  spec_local = ml_collections.ConfigDict(dict(spec, data_dir=local))
  assert (suites.suite_records("cd3", spec)
          == suites.suite_records("cd3", spec_local))

  # Again: nothing uploaded (the record's generation stands), same record.
  marker = f"{url}/{builders.RECORDS}/countdown3.json"
  gen = _generation(marker)
  logs.clear()
  assert prepare.prepare("countdown3", url, log=logs.append) == rec
  assert _generation(marker) == gen
  assert not any("uploaded" in m for m in logs)

  # A fresh host (an empty mirror) downloads it again, whole.
  storage.rmtree(str(tmp_path / "mirror"))
  data.data_dir = url
  assert pipeline.records_from_config(data) == got

  # The record is written last: without it the data set is not there.
  storage.remove(marker)
  with pytest.raises(FileNotFoundError) as e:
    pipeline.records_from_config(data)
  assert str(e.value).startswith("data.data_dir: ") and (
      f"python -m jaxdistill.data.prepare countdown3 --data_dir {url}"
      in str(e.value))
  # Prepared again, the stale local copy is not taken for it.
  prepare.prepare("countdown3", url, log=lambda m: None)
  assert pipeline.records_from_config(data) == got


def test_hub_mcq_and_ensure_on_gs(gcs, tmp_path, monkeypatch):
  """A hub data set (the fake cache's sciq) prepared by a sweep's ensure
  into a bucket, then read by a data block and an mcq suite."""
  del gcs
  cache = str(tmp_path / "hf")
  files = {f"data/{s}-00000-of-00001.parquet":
           hub_cache._parquet(hub_cache.sciq_rows(s))  # pylint: disable=protected-access
           for s in hub_cache.SCIQ_SPLITS}
  hub_cache.add_repo(cache, "allenai/sciq", files, repo_type="dataset")
  hub_cache.use(monkeypatch, cache)
  local, url = str(tmp_path / "local"), f"{GS}/mcq"
  rec = prepare.ensure("sciq", url, log=lambda m: None)
  assert prepare.prepare("sciq", local, log=lambda m: None) == rec
  assert _objects(url) == _files(local)
  assert prepare.ensure("sciq", url, log=lambda m: None) == rec

  data = ml_collections.ConfigDict(dict(task="mcq", source="sciq",
                                        split="test", data_dir=url))
  got = pipeline.records_from_config(data)
  data.data_dir = local
  assert got == pipeline.records_from_config(data) and got
  spec = ml_collections.ConfigDict(dict(kind="mcq", source="sciq",
                                        data_dir=url, split="test"))
  assert [r["question"] for r in suites.suite_records("sci", spec)] == [
      r["question"] for r in got]
  # Files of one's own are built locally: refused on gs:// in one line.
  data = ml_collections.ConfigDict(dict(task="mcq", source="sciq", split="test",
                                        data_dir=url,
                                        manual_dir=str(tmp_path)))
  with pytest.raises(ValueError, match="^data.data_dir: gs://"):
    pipeline.records_from_config(data)
