"""Batch scoring maps each completion back to its prompt's verifier."""
import numpy as np
import pytest

from jaxdistill import tasks


def _batch():
  numbers = np.full((2, 6), -1, np.int32)
  numbers[0, :3] = [25, 5, 3]
  return {"task": np.array([tasks.COUNTDOWN, tasks.MCQ], np.int32),
          "numbers": numbers, "target": np.array([40, -1], np.int32),
          "gold": np.array([-1, 2], np.int32)}


def test_score_batch_prompt_major_groups():
  texts = ["<answer>25+5*3</answer>", "<answer>25+5+3</answer>", "nothing",
           "The answer is: C", "The answer is: A", "hmm"]
  out = tasks.score_batch(texts, _batch())  # G = 3 samples per prompt.
  np.testing.assert_array_equal(out["reward"], [1, 0, 0, 1, 0, 0])
  np.testing.assert_array_equal(out["parsed"], [1, 1, 0, 1, 1, 0])
  np.testing.assert_array_equal(out["format"], [1, 1, 0, 1, 1, 0])
  assert out["reward"].dtype == np.float32
  np.testing.assert_array_equal(tasks.reward_batch(texts[::3], _batch()), [1, 1])


def test_score_batch_rejects_mismatched_counts_and_records():
  with pytest.raises(ValueError, match="texts"):
    tasks.score_batch(["a", "b", "c"], _batch())
  with pytest.raises(ValueError, match="record"):
    tasks.task_of({"foo": 1})
