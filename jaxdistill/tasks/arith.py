"""Arithmetic: evaluate an expression step by step, a verifiable task that
small models learn.

A problem is an expression over N single-digit numbers with + - * and
parentheses, e.g. `7*(3+5)-9`; its answer is the integer value, written
inside <answer></answer> after the worked steps ("3 + 5 = 8. 7 * 8 = 56.
56 - 9 = 47."). It is the checking half of Countdown (whose steps have the
same form) without the search, so a model of a few hundred thousand
parameters learns it in minutes, and N sets the length of the reasoning
chain: the harder variants have more numbers.

Problems are generated like Countdown's (a random expression tree, every
intermediate value a non-negative integer no larger than `max_value`) and
split by PROBLEM: a hash of the expression decides train or test, so no test
expression is ever trained on. `reward` reads the last <answer>...</answer>
and never raises on hostile text.
"""
from __future__ import annotations

import dataclasses
import random

from jaxdistill.tasks import countdown
from jaxdistill.tasks import expr as expr_lib

MIN_NUMBERS, MAX_NUMBERS = 2, 8
MAX_ANSWER_DIGITS = 6


@dataclasses.dataclass(frozen=True)
class Problem:
  expression: str  # e.g. "7*(3+5)-9"
  value: int

  def to_record(self) -> dict:
    return {"expression": self.expression, "value": self.value}


def build_prompt(expression: str) -> str:
  """The user message of an arithmetic problem."""
  return (f"Compute {expression}. Work it out step by step, then write only "
          "the result inside <answer></answer> tags.")


def problem_split(expression: str, test_fraction: float = 0.1) -> str:
  """'test' for a fixed, seed-independent subset of expressions, else 'train'."""
  return countdown.hash_split(f"arith:{expression}", test_fraction)


def generate_problems(n_numbers: int, count: int, seed: int, *,
                      split: str = "train", max_number: int = 9,
                      max_value: int = 99, test_fraction: float = 0.1,
                      ops: str = "+-*", chain: bool = False) -> list[Problem]:
  """`count` distinct problems of one split, deterministic in the arguments.

  `ops` are the operators drawn from; `chain` makes every expression a
  left-to-right chain ((a op b) op c ...), whose worked steps each take the
  running value and the next number, the easiest shape to learn.
  """
  if not MIN_NUMBERS <= n_numbers <= MAX_NUMBERS:
    raise ValueError(f"n_numbers must be in [{MIN_NUMBERS}, {MAX_NUMBERS}], "
                     f"got {n_numbers}")
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  if count < 0:
    raise ValueError(f"count must be >= 0, got {count}")
  if not 1 <= max_number <= max_value:
    raise ValueError(f"need 1 <= max_number <= max_value, got {max_number}, "
                     f"{max_value}")
  if not 0.0 < test_fraction < 1.0:
    raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
  if not ops or any(o not in "+-*" for o in ops):
    raise ValueError(f"ops: a non-empty subset of '+-*', got {ops!r}")
  rng = random.Random(f"arith/{n_numbers}/{split}/{seed}/{ops}/{chain}")
  seen, out = set(), []
  attempts, max_attempts = 0, 1000 + 200 * count
  while len(out) < count:
    attempts += 1
    if attempts > max_attempts:
      raise RuntimeError(f"generated only {len(out)} of {count} arithmetic "
                         f"problems with {n_numbers} numbers; raise max_value "
                         "or lower count")
    nums = [rng.randint(1, max_number) for _ in range(n_numbers)]
    tree = _random_tree(rng, nums, max_value, ops, chain)
    if tree is None:
      continue
    value, (text, _) = tree
    if text in seen or problem_split(text, test_fraction) != split:
      continue
    seen.add(text)
    out.append(Problem(text, value))
  return out


def _random_tree(rng, nums, cap, ops, chain):
  """A random expression over `nums` in order; (value, (text, prec)) or None.
  Subtraction keeps the larger operand on the left (values stay >= 0); in a
  chain it is drawn only where the running value is at least the number."""
  if len(nums) == 1:
    return nums[0], (str(nums[0]), 3)
  k = len(nums) - 1 if chain else rng.randint(1, len(nums) - 1)
  left = _random_tree(rng, nums[:k], cap, ops, chain)
  right = _random_tree(rng, nums[k:], cap, ops, chain)
  if left is None or right is None:
    return None
  (a, ta), (b, tb) = left, right
  options = [("+", a + b, ta, tb), ("*", a * b, ta, tb)]
  if a >= b:
    options.append(("-", a - b, ta, tb))
  elif not chain:
    options.append(("-", b - a, tb, ta))
  options = [o for o in options if o[1] <= cap and o[0] in ops]
  if not options:
    return None
  op, value, x, y = rng.choice(options)
  return value, expr_lib.combine(op, x, y)


def reference_completion(expression: str) -> str:
  """SFT / off-policy text: the worked steps, then the tagged value."""
  tree = expr_lib.parse(expression)
  value = expr_lib.evaluate(tree)
  if value.denominator != 1:
    raise ValueError(f"expression {expression!r}: value {value} is not an integer")
  steps = countdown.worked_steps(tree)
  return " ".join(steps) + f"\n<answer>{value.numerator}</answer>"


def extract_answer(completion: str) -> str | None:
  """The last <answer>...</answer> as a canonical integer string, or None
  when there is none or it is not one integer (optional sign, <= 6 digits)."""
  answer = countdown.extract_answer(completion)
  if answer is None:
    return None
  s = answer.strip()
  body = s[1:] if s[:1] in "+-" else s
  if not body or len(body) > MAX_ANSWER_DIGITS or any(
      c not in "0123456789" for c in body):
    return None
  return str(int(s))


def reward(completion: str, value: int) -> float:
  """1.0 if the last answer is the integer `value`, else 0.0."""
  return 1.0 if extract_answer(completion) == str(int(value)) else 0.0


def format_score(completion: str) -> float:
  """0.0: no complete <answer> tag; 0.5: a tag without one integer; 1.0: an integer."""
  if countdown.extract_answer(completion) is None:
    return 0.0
  return 1.0 if extract_answer(completion) is not None else 0.5
