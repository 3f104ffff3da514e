"""Arithmetic task: generated problems vs Python's own evaluator, reward table."""
import ast
import re

import numpy as np
import pytest

from jaxdistill import tasks
from jaxdistill.data import pipeline
from jaxdistill.tasks import arith


def _py_value(text):
  """Independent evaluation with Python's parser (integers, + - *)."""
  def ev(n):
    if isinstance(n, ast.Expression):
      return ev(n.body)
    if isinstance(n, ast.Constant) and isinstance(n.value, int):
      return n.value
    if isinstance(n, ast.BinOp):
      a, b = ev(n.left), ev(n.right)
      return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}[type(n.op)]
    raise ValueError(ast.dump(n))
  return ev(ast.parse(text, mode="eval"))


@pytest.mark.parametrize("n", [3, 4, 6])
def test_problems_are_correct_split_and_deterministic(n):
  train = arith.generate_problems(n, 300, 0)
  test = arith.generate_problems(n, 100, 0, split="test")
  assert train == arith.generate_problems(n, 300, 0)
  for p in train + test:
    assert _py_value(p.expression) == p.value
    assert 0 <= p.value <= 99
    assert len(re.findall(r"\d+", p.expression)) == n
    assert all(1 <= int(d) <= 9 for d in re.findall(r"\d+", p.expression))
    # Every intermediate value of the worked steps is in range too.
    steps = tasks.reference_response(p.to_record())
    for a, op, b, c in re.findall(r"(\d+) ([-+*]) (\d+) = (\d+)\.", steps):
      assert _py_value(f"{a}{op}{b}") == int(c) and 0 <= int(c) <= 99
    assert steps.endswith(f"<answer>{p.value}</answer>")
  assert len({p.expression for p in train}) == len(train)
  assert not {p.expression for p in train} & {p.expression for p in test}
  with pytest.raises(ValueError, match="n_numbers"):
    arith.generate_problems(1, 3, 0)


@pytest.mark.parametrize("text, value, want", [
    ("2 * 3 = 6.\n<answer>6</answer>", 6, 1.0),
    ("<answer> 6 </answer>", 6, 1.0),
    ("<answer>+6</answer>", 6, 1.0),
    ("<answer>06</answer>", 6, 1.0),
    ("<answer>5</answer> no, <answer>6</answer>", 6, 1.0),
    ("<answer>6</answer> no, <answer>5</answer>", 6, 0.0),
    ("<answer>6.0</answer>", 6, 0.0),
    ("<answer>2*3</answer>", 6, 0.0),
    ("<answer>-6</answer>", 6, 0.0),
    ("<answer>6", 6, 0.0),
    ("the answer is 6", 6, 0.0),
    ("<answer>" + "9" * 5000 + "</answer>", 6, 0.0),
    ("<answer>٦</answer>", 6, 0.0),
])
def test_reward_table(text, value, want):
  assert arith.reward(text, value) == want


def test_score_batch_and_records_carry_the_gold_value(tmp_path):
  recs = [p.to_record() for p in arith.generate_problems(4, 3, 0)]
  path = str(tmp_path / "a.jsonl")
  pipeline.write_records(recs, path)
  assert pipeline.read_records(path) == recs
  bad = dict(recs[0], value=recs[0]["value"] + 1)
  pipeline.write_records([bad], str(tmp_path / "bad.jsonl"))
  with pytest.raises(ValueError, match="bad.jsonl:1"):
    pipeline.read_records(str(tmp_path / "bad.jsonl"))
  batch = {"task": np.full(3, tasks.ARITH), "numbers": np.full((3, 6), -1),
           "target": np.asarray([r["value"] for r in recs]),
           "gold": np.full(3, -1)}
  texts = [tasks.reference_response(r) for r in recs]
  texts[1] = "<answer>x</answer>"
  out = tasks.score_batch(texts, batch)
  np.testing.assert_array_equal(out["reward"], [1, 0, 1])
  np.testing.assert_array_equal(out["format"], [1, .5, 1])
