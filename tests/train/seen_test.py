"""The training loop's seen token ids (jaxdistill/train/seen.py) on tiny
random models (configs/distill.py:runlocal, fixed dataset sequences): the
exported mask is the union, written here from the run's batches, of the
token ids at attention_mask 1 (padding excluded), it survives a resume, and
the logged sparsity splits the embedding rows by it.

What the split shows (float32 master weights, no weight decay): an untied
model's input-embedding rows of never-seen tokens stay exactly, its output
head's move (the softmax gives every row of the vocabulary gradient), so the
unseen embedding figure is about one half; tied, the shared rows move too,
all but the padding rows beyond the loss's vocabulary (loss.vocab_size, as a
Qwen2.5 embedding's rows past its tokenizer), which get no gradient at all.
"""
import json
import pathlib
import sys

import jax
import numpy as np
import pytest

from jaxdistill.train import batches as train_batches
from jaxdistill.train import log as train_log
from jaxdistill.train import seen as seen_lib
from jaxdistill.train import loop as train_loop

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from configs import \
    distill as distill_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests import config_util

ONE_DEVICE = [jax.devices()[0]]


REAL = 300  # tied: the loss's vocabulary, below the embedding's 320 rows


def _config(steps, tied):
  c = distill_config.get_config("runlocal,policy=dataset")
  c.progress = False
  c.student.init = dict(c.student.init, tie_word_embeddings=tied)
  return config_util.set_fields(c, {"total_steps": steps, "ckpt_every": 1,
                                    "eval_every": 1,
                                    "loss.vocab_size": REAL if tied else None})


def _reference(config, steps):
  """Token ids at attention_mask 1 in the first `steps` batches."""
  batches = train_batches.make_batches(
      config, None, config.loss.vocab_size or config.student.init["vocab_size"])
  seen = np.zeros(int(config.student.init["vocab_size"]), bool)
  for s in range(steps):
    b = batches[s]
    seen[np.asarray(b["tokens"])[np.asarray(b["attention_mask"]) > 0]] = True
  return seen


@pytest.mark.parametrize("tied", [False, True])
def test_seen_tokens_are_exported_resumed_and_split_the_embeddings(tmp_path,
                                                                   tied):
  if not tied:  # one step, then resumed to two: the mask rides the checkpoint
    train_loop.train(_config(1, tied), str(tmp_path), devices=ONE_DEVICE)
    with open(tmp_path / "hf_student" / seen_lib.SEEN_FILE) as f:
      ids = json.load(f)["ids"]
    assert ids == list(np.flatnonzero(_reference(_config(1, tied), 1)))
  c = _config(2, tied)
  train_loop.train(c, str(tmp_path), devices=ONE_DEVICE)
  want = _reference(c, 2)
  assert 0 < want.sum() < want.size and not want[0]  # pad id 0: never seen
  got = seen_lib.read_seen(str(tmp_path / "hf_student"))
  np.testing.assert_array_equal(got, want)
  last = train_log.read_metrics(str(tmp_path))[-1]
  assert last["sparsity/embeddings_seen/num_rows"] == want.sum()
  assert last["sparsity/embeddings_unseen/num_rows"] == want.size - want.sum()
  unseen = last["sparsity/embeddings_unseen/S_1e-6_f32"]
  assert last["sparsity/embeddings_seen/S_1e-6_f32"] < 0.05
  if tied:  # every row the softmax spans moves; the padding rows do not
    rows = want.size - want.sum()
    assert abs(unseen - (want.size - REAL) / rows) < 0.02, (unseen, rows)
  else:  # the input rows (half the entries) exactly, the head's not
    assert 0.5 <= unseen < 0.55
  for kind in ("attention", "mlp", "norms", "embeddings"):
    assert f"sparsity/{kind}/S_1e-8_f32" in last
