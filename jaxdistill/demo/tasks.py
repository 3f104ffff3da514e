"""The miniature study's data: step-by-step arithmetic and a second task.

The in-distribution task is a chain of additions and subtractions over four
digits, "Compute 7+8+4-9", answered with worked steps ("7 + 8 = 15. 15 + 4 =
19. 19 - 9 = 10.") and the value inside <answer></answer>
(jaxdistill.tasks.arith). It is the arithmetic reasoning of the study's
Countdown without Countdown's search, which a model trained for minutes on a
CPU learns well, where Countdown stays near 20 % (see docs/demo.md). The harder
variant has six numbers: a longer reasoning chain, as Countdown-N grows with N.
Test problems are held out by problem: no test expression is trained on.

The second task, the student's out-of-distribution suite for forgetting, is
single-digit addition asked as a multiple-choice question, so the
multiple-choice verifier and every evaluation path apply unchanged: "Is 7 + 5
even or odd?", options even / odd. Its reference response works the sum out
before the answer line.
"""
from __future__ import annotations

import random

from jaxdistill import tasks
from jaxdistill.tasks import arith
from jaxdistill.tasks import mcq

MAX_NUMBER = 9
MAX_VALUE = 99  # of every running value of an arithmetic problem
ID_NUMBERS, HARDER_NUMBERS = 4, 6  # numbers per in-distribution / harder problem
ADD_RANGE = (0, 9)
CHANCE = 0.5  # accuracy of guessing on the addition suite


def arith_records(n_numbers: int, count: int, seed: int,
                  split: str = "train") -> list[dict]:
  """Left-to-right chains of + and - over `n_numbers` digits 1-9 (every
  running value in 0..MAX_VALUE), split by problem (jaxdistill.tasks.arith)."""
  return [p.to_record() for p in arith.generate_problems(
      n_numbers, count, seed, split=split, max_number=MAX_NUMBER,
      max_value=MAX_VALUE, ops="+-", chain=True)]


def addition_answer(question: str) -> int:
  """The true sum of an addition question, computed from its text."""
  body = question.removeprefix("Is ").removesuffix(" even or odd?")
  a, sep, b = body.partition(" + ")
  if not sep:
    raise ValueError(f"question: not an addition question: {question!r}")
  return int(a) + int(b)


def addition_records(count: int, seed: int, split: str = "train") -> list[dict]:
  """Multiple-choice questions on the single-digit addition facts.

  The facts (a + b for a, b in ADD_RANGE) are knowledge the student holds, as
  a real student holds what its out-of-distribution suite asks about. A
  question asks whether a sum is even or odd, options always "even" (A) and
  "odd" (B), so guessing scores CHANCE and the letter follows from the worked
  sum ("6 + 7 = 13, which is odd."): the skill tested is knowing the fact.
  Training cycles through every fact; the test suite asks `count` distinct
  facts, the same facts the student was trained on, because forgetting
  measures whether trained knowledge survives distillation (the split only
  changes the sampling stream).
  """
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  lo, hi = ADD_RANGE
  facts = [(a, b) for a in range(lo, hi + 1) for b in range(lo, hi + 1)]
  if split == "test" and count > len(facts):
    raise ValueError(f"count: only {len(facts)} addition facts to test, "
                     f"asked for {count}")
  rng = random.Random(f"demo-addition/{split}/{seed}")
  out, order = [], []
  while len(out) < count:
    if not order:  # every fact once per pass, in a fresh order
      order = rng.sample(facts, len(facts))
    a, b = order.pop()
    s = a + b
    parity = ("even", "odd")[s % 2]
    gold = mcq.LETTERS[s % 2]
    out.append({"question": f"Is {a} + {b} even or odd?",
                "options": ["even", "odd"], "answer": gold,
                "response": f"{a} + {b} = {s}, which is {parity}.\n"
                            f"The answer is: {gold}"})
  return out


def corpus(records) -> list[str]:
  """Prompt and response texts, for training the tokenizer."""
  return [t for r in records for t in (tasks.prompt_text(r),
                                       tasks.reference_response(r))]
