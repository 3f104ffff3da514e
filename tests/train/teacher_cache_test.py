"""Teacher cache: a run from the cache equals the live-teacher run at the same
k, loads no teacher weights, and a mismatching cache is refused by name; an
edited, truncated or corrupted cache is refused naming the file; a rebuild
never loses the old cache (an error or SIGTERM during it keeps it)."""
import hashlib
import json
import logging
import os
import shutil
import signal

import jax
import pytest

from jaxdistill import config_lib
from jaxdistill import models
from jaxdistill.bench import cache_check
from jaxdistill.train import batches as train_batches
from jaxdistill.train import preempt
from jaxdistill.train import loop as train_loop
from jaxdistill.train import setup as train_setup
from jaxdistill.train import teacher_cache

ONE_DEVICE = [jax.devices()[0]]


def _config(**loss):
  c = config_lib.load_config("configs/distill.py:runlocal,policy=teacher,"
                           "kl=reverse,topk=8")
  c.total_steps, c.ckpt_every, c.eval_every = 2, 2, 2
  c.progress, c.export_hf = False, False
  c.loss.topk_variant = "tail"
  c.loss.update(loss)
  return c


def _metrics(workdir):
  with open(f"{workdir}/metrics.jsonl") as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow  # two 2-step runs and a cache build
def test_run_from_cache_equals_live_teacher(tmp_path, monkeypatch):
  live = _config()
  train_loop.train(live, str(tmp_path / "live"), devices=ONE_DEVICE)
  cache_dir = str(tmp_path / "cache")
  teacher_cache.build(_config(), cache_dir, devices=ONE_DEVICE)

  loaded = []
  real_load = train_setup.load_params
  monkeypatch.setattr(train_setup, "load_params",
                      lambda cfg, mcfg, *a: loaded.append(mcfg) or
                      real_load(cfg, mcfg, *a))
  cached = _config(teacher_cache=cache_dir)
  train_loop.train(cached, str(tmp_path / "cached"), devices=ONE_DEVICE)
  assert len(loaded) == 1 and loaded[0] == cached.student  # no teacher

  a, b = _metrics(tmp_path / "live"), _metrics(tmp_path / "cached")
  assert len(a) == len(b) == 2
  for ra, rb in zip(a, b):
    for key in ("train/loss", "train/grad_norm", "distill/rkl", "distill/fkl",
                "distill/topk_mass", "rollout/len", "rollout/tokens"):
      assert key in ra and key in rb, key
      assert rb[key] == pytest.approx(ra[key], rel=1e-5, abs=1e-7), key

  # A cache made for another run is refused, naming what differs.
  cache = teacher_cache.TeacherCache(cache_dir)
  cache.check(cached, None, 320)  # the run it was made for
  other = _config(teacher_cache=cache_dir, teacher_topk=4)
  with pytest.raises(ValueError, match=r"differs in k \(cache 8, run 4\)"):
    cache.check(other, None, 320)
  other = _config(teacher_cache=cache_dir)
  other.data.batch_size = 8
  with pytest.raises(ValueError, match=r"differs in data \(data.batch_size"):
    cache.check(other, None, 320)
  with pytest.raises(ValueError, match="differs in tokenizer"):
    cache.check(cached, _FakeTokenizer({"a": 0, "b": 1}), 320)
  other = _config(teacher_cache=cache_dir)
  other.total_steps = 3
  with pytest.raises(ValueError, match="holds 2 steps"):
    cache.check(other, None, 320)


class _FakeTokenizer:

  def __init__(self, vocab):
    self.vocab = vocab

  def get_vocab(self):
    return dict(self.vocab)

  def __len__(self):
    return len(self.vocab)


def test_tokenizer_fingerprint_tells_vocabularies_apart():
  a = teacher_cache.tokenizer_fingerprint(_FakeTokenizer({"a": 0, "b": 1}))
  b = teacher_cache.tokenizer_fingerprint(_FakeTokenizer({"a": 1, "b": 0}))
  assert a != b
  assert a == teacher_cache.tokenizer_fingerprint(
      _FakeTokenizer({"b": 1, "a": 0}))


def test_incomplete_cache_is_refused(tmp_path):
  with pytest.raises(ValueError, match="not a complete teacher cache"):
    teacher_cache.TeacherCache(str(tmp_path))


def test_cache_needs_topk_and_a_fixed_policy():
  c = _config(teacher_cache="/tmp/x")
  c.rollout.policy = "student"
  with pytest.raises(ValueError, match="config.loss.teacher_cache"):
    config_lib.validate(c)


def test_empty_teacher_cache_is_an_error_not_no_cache():
  with pytest.raises(ValueError, match="config.loss.teacher_cache: empty"):
    config_lib.validate(_config(teacher_cache=""))


def _save_teacher(path, seed):
  """The runlocal teacher's architecture with random weights of `seed`,
  as a Hugging Face directory (what a real teacher path is)."""
  cfg = train_setup.model_config(_config().teacher, "teacher")
  models.save_pretrained(cfg, models.init(cfg, jax.random.key(seed)),
                         str(path))


def _path_config(teacher_dir, **loss):
  c = _config(**loss)
  c.teacher.path, c.teacher.init = str(teacher_dir), None
  c.rollout.policy = "dataset"  # no rollout to compile: a faster build
  return c


# The tests below share one cache build (about 10 s on a quiet 2-core CPU,
# most of it compiling) and rebuild it twice: slow.
@pytest.fixture(scope="module")
def built(tmp_path_factory):
  """(root, build config): a 2-step cache of a teacher read from a directory,
  <root>/cache, and the bytes of its files."""
  root = tmp_path_factory.mktemp("cache")
  _save_teacher(root / "teacher", seed=0)
  c = _path_config(root / "teacher")
  teacher_cache.build(c, str(root / "cache"), devices=ONE_DEVICE)
  return root, c


def _files(d):
  return {n: (d / n).read_bytes() for n in sorted(os.listdir(d))}


def _copy(built, tmp_path):
  root, _ = built
  shutil.copytree(root / "cache", tmp_path / "cache")
  return tmp_path / "cache"


@pytest.mark.slow
def test_other_teacher_weights_at_the_same_path_are_refused(built):
  root, c = built
  teacher_cache.TeacherCache(str(root / "cache")).check(c, None, 320)
  saved = _files(root / "teacher")
  try:
    _save_teacher(root / "teacher", seed=1)  # same shapes, other values
    cache = teacher_cache.TeacherCache(str(root / "cache"))
    with pytest.raises(ValueError, match=r"config\.loss\.teacher_cache: .* "
                       r"differs in teacher_weights \(model\.safetensors\."
                       r"content: "):
      cache.check(c, None, 320)
  finally:
    for name, data in saved.items():
      (root / "teacher" / name).write_bytes(data)


@pytest.mark.slow
def test_a_teacher_no_longer_here_is_not_compared_and_says_so(built, caplog):
  root, c = built
  os.rename(root / "teacher", root / "away")
  try:
    caplog.set_level(logging.WARNING)
    teacher_cache.TeacherCache(str(root / "cache")).check(c, None, 320)
    assert "cannot check that the teacher cache" in caplog.text
  finally:
    os.rename(root / "away", root / "teacher")


@pytest.mark.slow
def test_edited_meta_json_is_refused_naming_the_field(built, tmp_path):
  cache = _copy(built, tmp_path)
  meta = json.loads((cache / "meta.json").read_text())
  assert meta["made_from"]["k"] == 8
  meta["made_from"]["k"] = 4
  (cache / "meta.json").write_text(json.dumps(meta))
  with pytest.raises(ValueError, match=r"meta\.json was edited after the "
                     r"build: .* k \(records 8, meta 4\)"):
    teacher_cache.TeacherCache(str(cache))


@pytest.mark.slow
def test_corrupted_cache_files_are_named(built, tmp_path):
  cache = _copy(built, tmp_path)
  good = _files(cache)
  meta, records = cache / "meta.json", cache / "topk.array_record"
  meta.write_text('{"format": 2, "made_')
  with pytest.raises(ValueError, match=f"{meta}: not valid JSON"):
    teacher_cache.TeacherCache(str(cache))
  meta.write_bytes(good["meta.json"])
  records.write_bytes(good["topk.array_record"][:len(good["topk.array_record"]) // 2])
  with pytest.raises(ValueError, match=f"{records} holds 0 records, {meta} "
                     "says 2"):
    teacher_cache.TeacherCache(str(cache))
  # One byte flipped anywhere (a record's chunk, the padding, the footer) is
  # found when the cache is opened, not at the step that reads it.
  size = len(good["topk.array_record"])
  for at in (size // 4, size // 2, size - 1):
    data = bytearray(good["topk.array_record"])
    data[at] ^= 0xFF
    records.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=(
        f"{records}(: unreadable| holds \\d+ records|: sha256 .* is not the "
        rf".* that {meta} recorded at the build \(the file changed on "
        r"disk\))")):
      teacher_cache.TeacherCache(str(cache))


def _fail_at_second_batch(monkeypatch, fault):
  real = train_batches.SequenceMaker.__call__
  calls = []

  def call(self, *a, **k):
    calls.append(1)
    if len(calls) == 2:
      fault()
    return real(self, *a, **k)
  monkeypatch.setattr(train_batches.SequenceMaker, "__call__", call)


def _siblings(cache):
  return sorted(n for n in os.listdir(cache.parent) if n != cache.name)


@pytest.mark.slow
def test_rebuild_that_fails_midway_keeps_the_old_cache(built, tmp_path,
                                                       monkeypatch):
  cache = _copy(built, tmp_path)
  before, siblings = _files(cache), _siblings(cache)
  c = built[1]

  def boom():
    raise RuntimeError("injected fault in step 2")
  _fail_at_second_batch(monkeypatch, boom)
  with pytest.raises(RuntimeError, match="injected fault"):
    teacher_cache.build(c, str(cache), overwrite=True, devices=ONE_DEVICE)
  assert _files(cache) == before
  assert _siblings(cache) == siblings  # no partial build left beside it


@pytest.mark.slow
def test_sigterm_during_a_rebuild_keeps_the_old_cache_and_says_so(
    built, tmp_path, monkeypatch):
  cache = _copy(built, tmp_path)
  before, siblings = _files(cache), _siblings(cache)
  c = _path_config(built[0] / "teacher")
  c.total_steps = 3
  handler = signal.getsignal(signal.SIGTERM)
  _fail_at_second_batch(monkeypatch,
                        lambda: os.kill(os.getpid(), signal.SIGTERM))
  with pytest.raises(preempt.Preempted) as e:
    teacher_cache.build(c, str(cache), overwrite=True, devices=ONE_DEVICE)
  assert e.value.exit_code == 128 + signal.SIGTERM
  assert str(e.value) == (
      "stopped by SIGTERM after 2 of 3 steps of the teacher cache: the partial "
      f"cache was discarded and the old cache in {cache} is kept unchanged; "
      "run the same command to build it")
  assert signal.getsignal(signal.SIGTERM) == handler
  assert _files(cache) == before
  assert _siblings(cache) == siblings


def test_existing_out_is_refused_before_any_work(tmp_path, monkeypatch):
  monkeypatch.setattr(train_setup, "pair_and_batches", None)  # never reached
  (tmp_path / "cache").mkdir()
  (tmp_path / "cache" / "meta.json").write_text("{}")
  with pytest.raises(ValueError, match="holds a teacher cache; pass "
                     "--overwrite"):
    teacher_cache.build(_config(), str(tmp_path / "cache"))
  (tmp_path / "cache" / "notes.txt").write_text("mine")
  with pytest.raises(ValueError, match="holds 'notes.txt', which is not part"):
    teacher_cache.build(_config(), str(tmp_path / "cache"), overwrite=True)
  (tmp_path / "file").write_text("x")
  with pytest.raises(ValueError, match="is a file; give a directory"):
    teacher_cache.build(_config(), str(tmp_path / "file"))
  assert (tmp_path / "cache" / "notes.txt").read_text() == "mine"


# A synthetic cache in the build's layout (bench.cache_check.write_cache):
# the checks at open without building one (fast).
@pytest.fixture
def synthetic(tmp_path):
  d = tmp_path / "cache"
  cache_check.write_cache(str(d), 2)
  meta = json.loads((d / "meta.json").read_text())
  records = d / "topk.array_record"
  # meta.json's digest is the sha256 of the records file (first 16 hex digits)
  assert meta["records_sha256"] == hashlib.sha256(
      records.read_bytes()).hexdigest()[:16]
  assert meta["num_steps"] == 4  # 2 MiB of 512 KiB records
  return d


def _flip_a_byte(path):
  data = bytearray(path.read_bytes())
  # In the second of four records (open reads the first and the last), off
  # the 64 KiB block boundaries of the records format.
  at = (3 * len(data) // 8) // (1 << 16) * (1 << 16) + 30000
  data[at] ^= 0xFF
  path.write_bytes(bytes(data))


def test_a_flipped_byte_is_refused_at_open_unless_the_check_is_off(
    synthetic, monkeypatch, caplog):
  records = synthetic / "topk.array_record"
  _flip_a_byte(records)
  monkeypatch.delenv("JAXDISTILL_TEACHER_CACHE_CHECK", raising=False)
  with pytest.raises(ValueError, match=(
      f"^config.loss.teacher_cache: {records}: sha256 [0-9a-f]{{16}} is not "
      f"the [0-9a-f]{{16}} that {synthetic / 'meta.json'} recorded at the "
      r"build \(the file changed on disk\)")):
    teacher_cache.TeacherCache(str(synthetic))
  monkeypatch.setenv("JAXDISTILL_TEACHER_CACHE_CHECK", "0")
  caplog.set_level(logging.WARNING)
  for _ in range(2):  # opened again: said once
    teacher_cache.TeacherCache(str(synthetic))
  said = [r.getMessage() for r in caplog.records
          if "JAXDISTILL_TEACHER_CACHE_CHECK=0" in r.getMessage()]
  assert said == [f"JAXDISTILL_TEACHER_CACHE_CHECK=0: the sha256 of {records} "
                  "is not checked; a changed byte is found only at the step "
                  "that reads its record"]


def test_a_check_setting_other_than_0_or_1_is_refused(synthetic, monkeypatch):
  monkeypatch.setenv("JAXDISTILL_TEACHER_CACHE_CHECK", "no")
  with pytest.raises(ValueError, match=(
      r"^config.loss.teacher_cache: JAXDISTILL_TEACHER_CACHE_CHECK='no': "
      r"must be 1 .* or 0 \(do not\)$")):
    teacher_cache.TeacherCache(str(synthetic))
  monkeypatch.setenv("JAXDISTILL_TEACHER_CACHE_CHECK", "1")
  assert len(teacher_cache.TeacherCache(str(synthetic))) == 4


def test_a_cache_without_a_digest_opens_saying_so_once(synthetic, caplog):
  meta = json.loads((synthetic / "meta.json").read_text())
  del meta["records_sha256"]  # as caches built before digests were recorded
  (synthetic / "meta.json").write_text(json.dumps(meta))
  _flip_a_byte(synthetic / "topk.array_record")  # cannot be found at open
  caplog.set_level(logging.WARNING)
  for _ in range(2):
    teacher_cache.TeacherCache(str(synthetic))
  said = [r.getMessage() for r in caplog.records
          if "records no records_sha256" in r.getMessage()]
  assert len(said) == 1 and str(synthetic / "meta.json") in said[0], said
