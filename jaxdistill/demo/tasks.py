"""The miniature study's data: small-number Countdown and a second task.

Countdown here is the study's task with small numbers (1..9) and targets up to
MAX_TARGET, so that a model trained for minutes on a CPU solves a useful share
of it. Problems, splits (test targets never seen in training), prompts,
reference solutions and the verifier are jaxdistill.tasks.countdown's.

The second task, the student's out-of-distribution suite for forgetting, is
two-number addition asked as a multiple-choice question, so the multiple-choice
verifier and every evaluation path apply unchanged: "What is 47 + 38?" with
four options, the gold being the true sum and the distractors off by one or
ten. Its reference response works the sum out before the answer line.
"""
from __future__ import annotations

import random

from jaxdistill.tasks import countdown
from jaxdistill.tasks import mcq

MAX_NUMBER = 9
MAX_TARGET = 100
ADD_RANGE = (10, 99)


def countdown_records(n_numbers: int, count: int, seed: int,
                      split: str = "train") -> list[dict]:
  """Small-number Countdown-`n_numbers` problems (with solver solutions)."""
  problems = countdown.generate_problems(
      n_numbers, count, seed, split=split, max_number=MAX_NUMBER,
      max_target=MAX_TARGET)
  return [p.to_record() for p in problems]


def addition_answer(question: str) -> int:
  """The true sum of an addition question, computed from its text."""
  body = question.removeprefix("What is ").removesuffix("?")
  a, sep, b = body.partition(" + ")
  if not sep:
    raise ValueError(f"question: not an addition question: {question!r}")
  return int(a) + int(b)


def addition_records(count: int, seed: int, split: str = "train") -> list[dict]:
  """Multiple-choice addition problems of one split (disjoint (a, b) pairs).

  A pair goes to 'test' when (7a + 3b) % 10 == 0, about a tenth of pairs, so
  test questions never occur in training.
  """
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  lo, hi = ADD_RANGE
  pairs = [(a, b) for a in range(lo, hi + 1) for b in range(lo, hi + 1)
           if ((7 * a + 3 * b) % 10 == 0) == (split == "test")]
  if count > len(pairs):
    raise ValueError(f"count: only {len(pairs)} {split} addition pairs, "
                     f"asked for {count}")
  rng = random.Random(f"demo-addition/{split}/{seed}")
  out = []
  for a, b in rng.sample(pairs, count):
    s = a + b
    options = [s, s + 1, s - 1, s + 10]
    rng.shuffle(options)
    gold = mcq.LETTERS[options.index(s)]
    question = f"What is {a} + {b}?"
    out.append({"question": question, "options": [str(o) for o in options],
                "answer": gold,
                "response": f"{a} + {b} = {s}.\nThe answer is: {gold}"})
  return out


def corpus(records) -> list[str]:
  """Prompt and response texts, for training the tokenizer."""
  from jaxdistill import tasks  # pylint: disable=g-import-not-at-top
  return [t for r in records for t in (tasks.prompt_text(r),
                                       tasks.reference_response(r))]
