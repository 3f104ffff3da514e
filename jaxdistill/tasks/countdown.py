"""Countdown: reach a target with + - * / and parentheses, each number once.

Problems (`generate_problems`) are built forwards: draw N numbers, join them
in a random binary expression tree with random operators and take its value as
the target, so every problem is solvable by construction and carries the tree
as a reference solution. The generator keeps every intermediate value a
positive integer no larger than `max_intermediate` (division only when exact,
no subtraction reaching zero or below), like the TV game. The verifier is more
permissive: any equation that evaluates exactly (over the rationals) to the
target with the right multiset of numbers earns the reward, e.g. `(7/2)*4`,
and so does one with a unary minus, e.g. `-(3-5)*2` for 3, 5, 2 -> 4 (it
negates a number or a parenthesis; `--3` is malformed).

Splits keep evaluation targets disjoint from training ones: a hash of the
TARGET value decides its split (`target_split`), so no test target is ever seen
in training, whatever the seed. Roughly `test_fraction` of target values are
test targets. Small spaces (numbers up to ~10) can instead be enumerated whole
(`enumerate_problems`) and split by PROBLEM (`problem_split`): a test problem
is a combination of numbers and target never trained on.

`reward` reads the last `<answer>...</answer>` in the final MAX_SCAN_CHARS
characters of a completion (an answer has to close there; generation budgets in
the study are far shorter), optionally followed by `= target`, and never
raises or loops on hostile text; the arithmetic limits live in `expr` (the
length cap applies after whitespace around the answer is stripped).
"""
from __future__ import annotations

from collections.abc import Sequence
import dataclasses
from fractions import Fraction
import hashlib
import itertools
import random

from jaxdistill.tasks import expr as expr_lib

MAX_SCAN_CHARS = 32_768
MIN_NUMBERS, MAX_NUMBERS = 3, 6
OPEN, CLOSE = "<answer>", "</answer>"


@dataclasses.dataclass(frozen=True)
class Problem:
  numbers: tuple[int, ...]
  target: int
  solution: str  # A reference equation, e.g. "(3+5)*7-4".

  def to_record(self) -> dict:
    return {"numbers": list(self.numbers), "target": self.target,
            "solution": self.solution}


def build_prompt(numbers: Sequence[int], target: int) -> str:
  """The user message of a Countdown problem (the chat template wraps it)."""
  nums = ", ".join(str(int(n)) for n in numbers)
  return (
      f"Using the numbers [{nums}], create an equation that equals {int(target)}. "
      "You may use +, -, * and / and parentheses, and must use each number "
      "exactly once. Think step by step, then write only the final equation "
      "inside <answer></answer> tags, for example <answer>(1 + 2) * 3</answer>.")


def hash_split(key: str, test_fraction: float) -> str:
  """'test' for a fixed, seed-independent `test_fraction` of keys, else
  'train': the first 8 bytes of sha256(key) read as a number in [0, 1)."""
  u = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2.0**64
  return "test" if u < test_fraction else "train"


def target_split(target: int, test_fraction: float = 0.1) -> str:
  """'test' for a fixed, seed-independent subset of target values, else 'train'."""
  return hash_split(f"countdown-target:{int(target)}", test_fraction)


def _check_split_and_limits(split, min_number, max_number, max_target,
                            max_intermediate, test_fraction):
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  if max_target < 1 or max_intermediate < max_target:
    raise ValueError(f"need 1 <= max_target <= max_intermediate, got "
                     f"{max_target}, {max_intermediate}")
  if not 0.0 < test_fraction < 1.0:
    raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")


def generate_problems(n_numbers: int, count: int, seed: int, *,
                      split: str = "train", min_number: int = 1,
                      max_number: int = 100, max_target: int = 1000,
                      max_intermediate: int = 100_000,
                      test_fraction: float = 0.1) -> list[Problem]:
  """`count` distinct solvable Countdown-`n_numbers` problems of one split.

  Deterministic in (n_numbers, seed, split, limits). Numbers are drawn
  uniformly from [min_number, max_number] (repeats allowed) and targets lie in
  [1, max_target].
  """
  if not MIN_NUMBERS <= n_numbers <= MAX_NUMBERS:
    raise ValueError(f"n_numbers must be in [{MIN_NUMBERS}, {MAX_NUMBERS}], "
                     f"got {n_numbers}")
  _check_split_and_limits(split, min_number, max_number, max_target,
                          max_intermediate, test_fraction)
  if count < 0:
    raise ValueError(f"count must be >= 0, got {count}")
  if not 1 <= min_number <= max_number:
    raise ValueError(f"need 1 <= min_number <= max_number, got "
                     f"{min_number}, {max_number}")
  rng = random.Random(f"countdown/{n_numbers}/{split}/{seed}")
  seen, out = set(), []
  attempts, max_attempts = 0, 1000 + 2000 * count
  while len(out) < count:
    attempts += 1
    if attempts > max_attempts:
      raise RuntimeError(
          f"generated only {len(out)} of {count} Countdown-{n_numbers} "
          f"{split} problems; loosen max_target/max_number or lower count")
    numbers = [rng.randint(min_number, max_number) for _ in range(n_numbers)]
    order = numbers[:]
    rng.shuffle(order)
    tree = _random_tree(rng, order, max_intermediate)
    if tree is None:
      continue
    target, (text, _) = tree
    if not 1 <= target <= max_target or target_split(target, test_fraction) != split:
      continue
    key = (tuple(sorted(numbers)), target)
    if key in seen:
      continue
    seen.add(key)
    out.append(Problem(tuple(numbers), target, text))
  return out


def problem_split(numbers: Sequence[int], target: int,
                  test_fraction: float = 0.1) -> str:
  """'test' for a fixed, seed-independent subset of PROBLEMS (the multiset of
  numbers with the target), else 'train'. Unlike `target_split`, a test
  problem's target and numbers occur in training, only never together."""
  return hash_split(
      f"countdown-problem:{sorted(int(n) for n in numbers)}->{int(target)}",
      test_fraction)


def enumerate_problems(n_numbers: int, seed: int, *, split: str = "train",
                       min_number: int = 1, max_number: int = 9,
                       max_target: int = 100, max_intermediate: int = 100_000,
                       test_fraction: float = 0.1) -> list[Problem]:
  """Every Countdown-`n_numbers` problem of a small space, split by problem.

  A problem is a multiset of numbers in [min_number, max_number] and a target
  in [1, max_target] that some expression reaches under the generator's rules
  (positive integer intermediates up to max_intermediate, exact division, no
  division by 1). All of a split's problems are returned, in an order
  shuffled by `seed`, each with one of its solutions drawn by `seed`. Meant for
  spaces small enough to enumerate (3-4 numbers up to ~10); it is what lets a
  test split hold out problems rather than whole targets.
  """
  if not MIN_NUMBERS <= n_numbers <= 4:
    raise ValueError(f"n_numbers: enumeration is for 3 or 4 numbers, got {n_numbers}")
  _check_split_and_limits(split, min_number, max_number, max_target,
                          max_intermediate, test_fraction)
  if not 1 <= min_number <= max_number <= 20:
    raise ValueError(f"need 1 <= min_number <= max_number <= 20, got "
                     f"{min_number}, {max_number}")
  rng = random.Random(f"countdown-enum/{n_numbers}/{split}/{seed}")
  out = []
  for nums in itertools.combinations_with_replacement(
      range(min_number, max_number + 1), n_numbers):
    sols: dict[int, set[str]] = {}
    for value, text in _all_trees([(n, (str(n), 3)) for n in nums],
                                  max_intermediate):
      if value <= max_target and problem_split(nums, value, test_fraction) == split:
        sols.setdefault(value, set()).add(text)
    for target in sorted(sols):
      order = list(nums)
      rng.shuffle(order)
      out.append(Problem(tuple(order), target, rng.choice(sorted(sols[target]))))
  rng.shuffle(out)
  return out


def _all_trees(items, cap):
  """(value, text) of every expression over `items` ((value, rendered) pairs),
  with the operator options of `_random_tree`."""
  if len(items) == 1:
    yield items[0][0], items[0][1][0]
    return
  for i, j in itertools.combinations(range(len(items)), 2):
    (a, ta), (b, tb) = items[i], items[j]
    rest = items[:i] + items[i + 1:j] + items[j + 1:]
    options = [("+", a + b, ta, tb), ("*", a * b, ta, tb)]
    if a != b:
      options.append(("-", a - b, ta, tb) if a > b else ("-", b - a, tb, ta))
    if b > 1 and a % b == 0:
      options.append(("/", a // b, ta, tb))
    if a > 1 and b % a == 0 and a != b:
      options.append(("/", b // a, tb, ta))
    for op, value, x, y in options:
      if value <= cap:
        yield from _all_trees(rest + [(value, expr_lib.combine(op, x, y))], cap)


def _random_tree(rng, nums, cap):
  """Random expression over `nums` in order; (value, (text, prec)) or None."""
  if len(nums) == 1:
    return nums[0], (str(nums[0]), 3)
  k = rng.randint(1, len(nums) - 1)
  left, right = _random_tree(rng, nums[:k], cap), _random_tree(rng, nums[k:], cap)
  if left is None or right is None:
    return None
  (a, ta), (b, tb) = left, right
  options = [("+", a + b, ta, tb)]
  if a != b:
    options.append(("-", a - b, ta, tb) if a > b else ("-", b - a, tb, ta))
  options.append(("*", a * b, ta, tb))
  # Division by 1 is legal but teaches nothing; skip it.
  if b > 1 and a % b == 0:
    options.append(("/", a // b, ta, tb))
  if a > 1 and b % a == 0 and a != b:
    options.append(("/", b // a, tb, ta))
  options = [o for o in options if o[1] <= cap]
  if not options:
    return None
  op, value, x, y = rng.choice(options)
  return value, expr_lib.combine(op, x, y)


def solve(numbers: Sequence[int], target: int) -> str | None:
  """An equation using each number once that equals `target`, or None.

  Exhaustive depth-first search over pairs of remaining values, memoising
  multisets of values that cannot reach the target. A first pass stays in
  non-negative integers (exact division only), where generated problems
  always have a solution and Python ints are fast; if it fails, a second pass
  searches the rationals with exact Fractions, so None means "no equation".
  Only non-negative intermediates are needed for a non-negative target:
  replacing every node by its absolute value (swapping + with -, or the
  operands of -, where signs differ) keeps a valid equation.
  """
  numbers = _check_numbers(numbers)
  target = int(target)
  if target < 0:
    raise ValueError(f"target must be >= 0, got {target}")
  for rational in (False, True):
    leaves = [(Fraction(n) if rational else n, ("num", n)) for n in numbers]
    found = _search(leaves, Fraction(target) if rational else target, rational)
    if found is not None:
      return expr_lib.render(found)
  return None


def _search(items, goal, rational):
  dead = set()

  def search(items):
    if len(items) == 1:
      return items[0][1] if items[0][0] == goal else None
    key = tuple(sorted(v for v, _ in items))
    if key in dead:
      return None
    last = len(items) == 2
    for i in range(len(items)):
      for j in range(i + 1, len(items)):
        (a, ta), (b, tb) = items[i], items[j]
        rest = items[:i] + items[i + 1:j] + items[j + 1:]
        for value, node in _pair_results(a, ta, b, tb, rational):
          if last:
            if value == goal:
              return node
          else:
            found = search(rest + [(value, node)])
            if found is not None:
              return found
    dead.add(key)
    return None

  return search(items)


def _pair_results(a, ta, b, tb, rational):
  """Values of a op b (non-negative only), each with its tree."""
  yield a + b, ("+", ta, tb)
  yield a * b, ("*", ta, tb)
  if a >= b:
    yield a - b, ("-", ta, tb)
  else:
    yield b - a, ("-", tb, ta)
  if rational:
    if b != 0:
      yield a / b, ("/", ta, tb)
    if a != 0:
      yield b / a, ("/", tb, ta)
  else:
    if b > 1 and a % b == 0:
      yield a // b, ("/", ta, tb)
    if a > 1 and b % a == 0:
      yield b // a, ("/", tb, ta)


def _check_numbers(numbers) -> list[int]:
  try:
    out = [int(n) for n in numbers]
  except (TypeError, ValueError) as e:
    raise ValueError(f"numbers must be a sequence of ints, got {numbers!r}") from e
  if not out or any(n < 0 for n in out) or any(
      int(n) != n for n in numbers):
    raise ValueError(f"numbers must be non-negative ints, got {numbers!r}")
  return out


def extract_answer(completion: str) -> str | None:
  """The text of the last complete <answer>...</answer>, or None.

  Only the final MAX_SCAN_CHARS characters are searched, with plain `rfind`
  (linear time, no regex backtracking). Tags are case-sensitive.
  """
  if not isinstance(completion, str):
    raise ValueError(f"completion must be a str, got {type(completion).__name__}")
  tail = completion[-MAX_SCAN_CHARS:]
  end = tail.rfind(CLOSE)
  if end < 0:
    return None
  start = tail.rfind(OPEN, 0, end)
  if start < 0:
    return None
  return tail[start + len(OPEN):end]


def _parse_answer(answer: str):
  """Tree of an answer; `expr = N` is allowed and returns N too (ExprError).

  Whitespace around the answer is stripped before the length cap (a right
  equation after 300 newlines is right); unary minus is allowed.
  """
  answer = answer.strip(" \t\r\n")
  if len(answer) > expr_lib.MAX_CHARS:
    raise expr_lib.ExprError("answer too long")
  lhs, eq, rhs = answer.partition("=")
  stated = None
  if eq:
    rhs = rhs.strip()
    digits = rhs[1:] if rhs.startswith("-") else rhs
    if not digits or any(c not in "0123456789" for c in digits) or len(
        digits) > expr_lib.MAX_DIGITS:
      raise expr_lib.ExprError("right-hand side of '=' must be one integer")
    stated = int(rhs)
  return expr_lib.parse(lhs, unary_minus=True), stated


def reward(completion: str, numbers: Sequence[int], target: int) -> float:
  """1.0 if the last answer uses exactly `numbers` and equals `target`, else 0.0."""
  numbers = _check_numbers(numbers)
  target = int(target)
  answer = extract_answer(completion)
  if answer is None:
    return 0.0
  try:
    tree, stated = _parse_answer(answer)
    if stated is not None and stated != target:
      return 0.0
    # Check the multiset before evaluating: it also bounds the arithmetic.
    if sorted(expr_lib.literals(tree)) != sorted(numbers):
      return 0.0
    return 1.0 if expr_lib.evaluate(tree) == target else 0.0
  except (expr_lib.ExprError, RecursionError):
    return 0.0


def format_score(completion: str) -> float:
  """A loggable format score, independent of correctness.

  0.0: no complete <answer> tag; 0.5: a tag whose content is not a well-formed
  equation of the Countdown language; 1.0: a well-formed equation.
  """
  answer = extract_answer(completion)
  if answer is None:
    return 0.0
  try:
    _parse_answer(answer)
  except (expr_lib.ExprError, RecursionError):
    return 0.5
  return 1.0


def normalize_answer(completion: str) -> str | None:
  """A key equal for equations that differ only by commutativity/associativity.

  Used to count distinct correct answers; None if there is no parsable answer.
  """
  answer = extract_answer(completion)
  if answer is None:
    return None
  try:
    return expr_lib.canonical(_parse_answer(answer)[0])
  except (expr_lib.ExprError, RecursionError):
    return None


def reference_completion(numbers: Sequence[int], target: int, solution: str) -> str:
  """SFT / off-policy text: the solution's steps, then the tagged equation."""
  tree = expr_lib.parse(solution)
  if sorted(expr_lib.literals(tree)) != sorted(_check_numbers(numbers)) or (
      expr_lib.evaluate(tree) != int(target)):
    raise ValueError(f"solution {solution!r} does not solve {list(numbers)} -> {target}")
  steps = worked_steps(tree)
  return ("Let me combine the numbers step by step. " + " ".join(steps) +
          f" This reaches {int(target)} using each number once.\n"
          f"<answer>{solution}</answer>")


def worked_steps(tree) -> list[str]:
  """["a op b = c.", ...] for every operation of a parsed expression, in
  evaluation order (left operand first)."""
  out: list[str] = []
  _steps(tree, out)
  return out


def _steps(node, out) -> Fraction:
  if node[0] == "num":
    return Fraction(node[1])
  a, b = _steps(node[1], out), _steps(node[2], out)
  op = node[0]
  v = a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a / b
  out.append(f"{_fmt(a)} {node[0]} {_fmt(b)} = {_fmt(v)}.")
  return v


def _fmt(x: Fraction) -> str:
  return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"
