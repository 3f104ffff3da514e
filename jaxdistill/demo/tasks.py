"""The miniature study's data: small-number Countdown and a second task.

Countdown here is the study's task with small numbers (1..9) and targets up to
MAX_TARGET, so that a model trained for minutes on a CPU solves a useful share
of it. Problems, splits (test targets never seen in training), prompts,
reference solutions and the verifier are jaxdistill.tasks.countdown's.

The second task, the student's out-of-distribution suite for forgetting, is
single-digit addition asked as a multiple-choice question, so the
multiple-choice verifier and every evaluation path apply unchanged: "Is 7 + 5
even or odd?", options even / odd. Its reference response works the sum out
before the answer line.
"""
from __future__ import annotations

import random

from jaxdistill.tasks import countdown
from jaxdistill.tasks import mcq

MAX_NUMBER = 9
MAX_TARGET = 100
ADD_RANGE = (0, 9)
CHANCE = 0.5  # accuracy of guessing on the addition suite


def countdown_records(n_numbers: int, count: int, seed: int,
                      split: str = "train") -> list[dict]:
  """Small-number Countdown-`n_numbers` problems (with solver solutions)."""
  problems = countdown.generate_problems(
      n_numbers, count, seed, split=split, max_number=MAX_NUMBER,
      max_target=MAX_TARGET)
  return [p.to_record() for p in problems]


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
  from jaxdistill import tasks  # pylint: disable=g-import-not-at-top
  return [t for r in records for t in (tasks.prompt_text(r),
                                       tasks.reference_response(r))]
