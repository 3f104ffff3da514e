"""Teacher cache: a run from the cache equals the live-teacher run at the same
k, loads no teacher weights, and a mismatching cache is refused by name."""
import json

import jax
import pytest

from jaxdistill import config_lib
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
