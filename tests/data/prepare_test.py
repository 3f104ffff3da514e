"""`python -m jaxdistill.data.prepare NAME --data_dir DIR` against a seeded
Hugging Face cache (tests/hub_cache.py), offline.

References: the records converted from the same hub files given by path
(data.sources.convert_file, the route a user's own files take) and, for a
few rows, the answer a person reads off the row (SciQ's correct_answer,
MedMCQA's 0-based cop); the source commit is the seeded cache's ref."""
import fcntl
import json
import os
import shutil
import subprocess
import sys

import ml_collections
import pytest

from jaxdistill.data import builders
from jaxdistill.data import pipeline
from jaxdistill.data import prepare
from jaxdistill.data import sources
from jaxdistill.evaluate import suites as suites_lib
from tests import hub_cache

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _snapshot(cache, repo, commit):
  return os.path.join(cache, "datasets--" + repo.replace("/", "--"),
                      "snapshots", commit)


def _by_question(records):
  return sorted(records, key=lambda r: r["question"])


@pytest.mark.parametrize("name,splits", [
    ("sciq", ("train", "validation", "test")),
    ("medmcqa", ("train", "validation")),
    ("gpqa", ("test",))])
def test_prepare_by_name_equals_converting_the_same_files_by_path(
    name, splits, hf_cache, seeded_hub, tmp_path):
  repo = builders.HUB_DATASETS[name].repo
  commit = hf_cache["datasets"][repo]
  record = prepare.prepare(name, str(tmp_path), log=lambda m: None)
  assert record["commit"] == commit and record["repo"] == repo
  assert sorted(record["records"]) == sorted(splits)
  snap = _snapshot(seeded_hub[0], repo, commit)
  builder = builders.mcq_builder(dict(data_dir=str(tmp_path), source=name), "data")
  for split, files in record["files"].items():
    by_path = [r for f in files
               for r in sources.convert_file(os.path.join(snap, f), name)]
    got = builders.load_records(builder, split)
    assert _by_question(got) == _by_question(by_path)
    assert record["records"][split] == len(got) > 0
  # GPQA: only the diamond set (gpqa_main.csv is in the repo too).
  if name == "gpqa":
    assert record["files"] == {"test": ["gpqa_diamond.csv"]}


def test_rows_read_as_a_person_reads_them(hf_cache, tmp_path):
  for name in ("sciq", "medmcqa"):
    prepare.prepare(name, str(tmp_path), log=lambda m: None)
  data = ml_collections.ConfigDict(dict(task="mcq", source="sciq",
                                        data_dir=str(tmp_path), split="train"))
  sciq = {r["question"]: r for r in pipeline.records_from_config(data)}
  for q, *_, correct in hub_cache.SCIQ_SPLITS["train"]:
    r = sciq[q]
    assert r["options"][ord(r["answer"]) - ord("A")] == correct
  data.source, data.split = "medmcqa", "validation"
  med = {r["question"]: r for r in pipeline.records_from_config(data)}
  for q, a, b, c, d, cop, _ in hub_cache.MEDMCQA_SPLITS["validation"]:
    assert med[q]["options"] == [a, b, c, d] and med[q]["answer"] == "ABCD"[cop]


def test_idempotent_another_revision_refused_unless_overwrite(
    seeded_hub, tmp_path, monkeypatch):
  cache = str(tmp_path / "hf")
  shutil.copytree(seeded_hub[0], cache, symlinks=True)
  hub_cache.use(monkeypatch, cache)
  out, log = str(tmp_path / "data"), []
  first = prepare.prepare("sciq", out, log=log.append)
  stamp = os.path.getmtime(builders.record_path(out, "sciq"))
  assert prepare.prepare("sciq", out, log=log.append) == first
  assert "nothing to do" in log[-1]
  assert os.path.getmtime(builders.record_path(out, "sciq")) == stamp
  shutil.rmtree(os.path.join(out, "mcq_files", "sciq"))  # data lost, record kept
  assert prepare.prepare("sciq", out, log=log.append) == first
  assert builders.is_prepared(out, "sciq")
  # The hub's main moves to a commit with one more training row.
  rows = hub_cache.sciq_rows("train") + [dict(
      hub_cache.sciq_rows("train")[0], question="Which gas do we exhale most?")]
  files = {f"data/{s}-00000-of-00001.parquet": hub_cache._parquet(  # pylint: disable=protected-access
      rows if s == "train" else hub_cache.sciq_rows(s))
           for s in hub_cache.SCIQ_SPLITS}
  new = hub_cache.add_repo(cache, "allenai/sciq", files, repo_type="dataset")
  with pytest.raises(ValueError) as e:
    prepare.prepare("sciq", out, log=log.append)
  assert str(e.value) == (
      f"--data_dir {out} holds sciq from allenai/sciq at commit "
      f"{first['commit']}; allenai/sciq is commit {new}: pass --revision "
      f"{first['commit']} to keep it, or --overwrite to replace it")
  assert builders.read_record(out, "sciq") == first  # nothing changed
  # Pinned to the old commit: nothing to do; --overwrite: the new data.
  assert prepare.prepare("sciq", out, revision=first["commit"],
                         log=log.append) == first
  second = prepare.prepare("sciq", out, overwrite=True, log=log.append)
  assert second["commit"] == new and second["records"]["train"] == 7
  assert not [d for d in os.listdir(out) if d.startswith(".prepare")]


def _train_shard(out):
  builder = builders.mcq_builder(dict(data_dir=out, source="sciq"), "data")
  return builder.info.splits["train"].filepaths[0]


@pytest.mark.parametrize("damage", ["truncated", "deleted"])
def test_damaged_prepared_data_is_prepared_again(hf_cache, tmp_path, damage):
  """Both used to be 'already prepared; nothing to do', the data left
  broken ("deleted": what the damaged-data error says to delete)."""
  out, log = str(tmp_path / "data"), []
  first = prepare.prepare("sciq", out, log=log.append)
  shard = _train_shard(out)
  want = builders.load_records(
      builders.mcq_builder(dict(data_dir=out, source="sciq"), "data"), "train")
  if damage == "truncated":
    data = open(shard, "rb").read()
    with open(shard, "wb") as f:
      f.write(data[:len(data) // 2])
  else:
    shutil.rmtree(os.path.dirname(shard))
    with pytest.raises(ValueError, match="jaxdistill.data.prepare sciq"):
      builders.mcq_builder(dict(data_dir=out, source="sciq"), "data")
  assert prepare.prepare("sciq", out, log=log.append) == first
  assert "not whole" in log[-3] and "preparing it again" in log[-3]
  got = builders.load_records(
      builders.mcq_builder(dict(data_dir=out, source="sciq"), "data"), "train")
  assert got == want
  prepare.prepare("sciq", out, log=log.append)
  assert "nothing to do" in log[-1]


@pytest.mark.parametrize("text,words", [
    ("garbage", "not valid JSON"),
    ('["sciq"]', "not a JSON object"),
    ('{"name": "sciq", "repo": "allenai/sciq", "records": {}}',
     "field 'commit' missing"),
])
def test_a_broken_record_asks_for_overwrite_which_then_works(
    hf_cache, tmp_path, text, words):
  out = str(tmp_path / "data")
  first = prepare.prepare("sciq", out, log=lambda m: None)
  path = builders.record_path(out, "sciq")
  with open(path, "w") as f:
    f.write(text)
  with pytest.raises(ValueError, match=(
      f"^{path}: {words}.*; prepare sciq again with --overwrite$")):
    prepare.prepare("sciq", out, log=lambda m: None)
  assert prepare.prepare("sciq", out, overwrite=True,
                         log=lambda m: None) == first
  assert builders.read_record(out, "sciq") == first


def test_a_second_prepare_into_the_same_data_dir_is_refused(hf_cache, tmp_path):
  """Two prepares of different revisions both succeeded, the first one's
  data silently replaced."""
  out = str(tmp_path / "data")
  lock = builders.record_path(out, "sciq") + ".lock"
  os.makedirs(os.path.dirname(lock))
  with open(lock, "a") as f:  # what a running prepare holds
    fcntl.flock(f, fcntl.LOCK_EX)
    with pytest.raises(ValueError, match=(
        f"--data_dir {out}: another prepare of sciq is running there")):
      prepare.prepare("sciq", out, log=lambda m: None)
    assert builders.read_record(out, "sciq") is None
    assert not os.path.exists(os.path.join(out, "mcq_files"))
  prepare.prepare("sciq", out, log=lambda m: None)  # released: it runs


def test_a_data_dir_that_cannot_be_written_is_named(hf_cache, tmp_path):
  afile = tmp_path / "afile"
  afile.write_text("x")
  with pytest.raises(ValueError, match=(
      f"^--data_dir {afile}: exists and is not a directory$")):
    prepare.prepare("sciq", str(afile), log=lambda m: None)
  with pytest.raises(ValueError, match=(
      rf"^--data_dir {afile}/sub: cannot create it \(Not a directory\)$")):
    prepare.prepare("countdown", str(afile / "sub"), log=lambda m: None)
  if os.geteuid() != 0:  # root writes anywhere
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    with pytest.raises(ValueError, match=f"^--data_dir {ro}: not writable$"):
      prepare.prepare("sciq", str(ro), log=lambda m: None)
  assert afile.read_text() == "x"


def test_missing_data_says_which_command_to_run(hf_cache, tmp_path):
  data = ml_collections.ConfigDict(dict(task="mcq", source="medmcqa",
                                        data_dir=str(tmp_path), split="train"))
  with pytest.raises(ValueError) as e:
    pipeline.records_from_config(data)
  assert str(e.value) == (
      f"data.manual_dir: not set, and {tmp_path} holds no prepared 'medmcqa': "
      f"run `python -m jaxdistill.data.prepare medmcqa --data_dir {tmp_path}` "
      "(or set manual_dir to your own files)")
  suite = ml_collections.ConfigDict(dict(kind="mcq", source="sciq",
                                         data_dir=str(tmp_path), split="test"))
  with pytest.raises(ValueError, match=r"^config.suites.science.manual_dir: .*"
                     r"jaxdistill.data.prepare sciq"):
    suites_lib.suite_records("science", suite)
  prepare.prepare("sciq", str(tmp_path), log=lambda m: None)
  assert len(suites_lib.suite_records("science", suite)) == len(
      hub_cache.SCIQ_SPLITS["test"])


def test_countdown_is_what_a_run_with_a_data_dir_reads(tmp_path):
  prepare.prepare("countdown", str(tmp_path), n_numbers=(3,), num_problems=40,
                  log=lambda m: None)
  data = ml_collections.ConfigDict(dict(task="countdown", n_numbers=3,
                                        num_problems=40, data_seed=0,
                                        split="train"))
  in_memory = pipeline.records_from_config(data)
  data.data_dir = str(tmp_path)
  prepared = pipeline.records_from_config(data)
  key = lambda r: (tuple(r["numbers"]), r["target"])
  assert sorted(map(key, prepared)) == sorted(map(key, in_memory))
  assert builders.read_record(str(tmp_path), "countdown")["configs"] == [
      "n3_train40_seed0"]


@pytest.mark.slow  # a subprocess that imports JAX and TFDS (~20 s)
def test_the_command_line(hf_cache, tmp_path):
  """The exact command scripts and docs use."""
  cmd = [sys.executable, "-m", "jaxdistill.data.prepare", "gpqa", "--data_dir",
         str(tmp_path)]
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path,
                     check=False)
  assert r.returncode == 0, r.stderr
  assert "gpqa: prepared in" in r.stdout
  rec = json.loads((tmp_path / "prepared" / "gpqa.json").read_text())
  assert rec["commit"] == hf_cache["datasets"]["Idavidrein/gpqa"]
  r = subprocess.run(cmd[:3] + ["mmlu", "--data_dir", str(tmp_path)],
                     capture_output=True, text=True, env=env, check=False)
  assert r.returncode != 0 and "invalid choice: 'mmlu'" in r.stderr
