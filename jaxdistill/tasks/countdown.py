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
from jaxdistill.tasks import steps as steps_lib

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


# -- The paper's Countdown variants (arXiv 2609.35259, App. D.1, D.6, Table 1) --

# Operands are drawn with replacement from this pool (App. D.1).
PAPER_POOL = tuple(range(1, 11)) + (12, 15, 20, 25, 50, 75)


@dataclasses.dataclass(frozen=True)
class Preset:
  """One of the paper's Countdown data sets: `splits` maps a split to its
  (count, seed); targets lie in [min_target, max_target]."""
  name: str
  pool: tuple[int, ...]
  n_numbers: int
  splits: dict
  min_target: int
  max_target: int


PRESETS = {
    # 5,000 train / 500 eval candidates, seeds 42 / 43 (D.1). The target range
    # is not given; 1..1,000 is ours (the game's three digits).
    "countdown3": Preset("countdown3", PAPER_POOL, 3,
                         {"train": (5000, 42), "test": (500, 43)}, 1, 1000),
    # Evaluation only: four operands from 1-10 (D.1). With replacement, 500
    # problems, seed 43 and targets 1..10,000 are ours.
    "countdown4e": Preset("countdown4e", tuple(range(1, 11)), 4,
                          {"test": (500, 43)}, 1, 10_000),
    # RLVR (D.6): 5,000 problems, four operands from the pool, targets
    # 1..10,000, seed 42.
    "countdown4": Preset("countdown4", PAPER_POOL, 4, {"train": (5000, 42)},
                         1, 10_000),
}

TABLE1_SYSTEM = "You are a careful arithmetic solver."
TABLE1_INSTRUCTION = (
    "Solve the Countdown arithmetic problem. Using the provided numbers, create "
    "an equation that equals the target. You may use the operations +, -, *, "
    "and /, and each number must be used exactly once; every division must "
    "have an integer result. Show your work in <think>...</think> tags and "
    "return the solution as compact, comma-separated equations in "
    "<answer>...</answer> tags. For example, <answer>2+3=5,5*4=20</answer>.")


def table1_prompt(numbers: Sequence[int], target: int) -> tuple[str, str]:
  """(system, user) of the paper's Countdown prompt (Table 1), verbatim.

  The table typesets the multiplication sign as ×; we write `*`, the
  character the instruction's list of operations stands for and what a model
  types (the verifier reads × and ÷ too). The question is appended after a
  blank line as "Numbers: [a, b, c]" and "Target: t" on two lines (the
  paper gives the two fields, not the layout).
  """
  nums = ", ".join(str(int(n)) for n in numbers)
  return TABLE1_SYSTEM, (f"{TABLE1_INSTRUCTION}\n\nNumbers: [{nums}]\n"
                         f"Target: {int(target)}")


def paper_problems(name: str, split: str, *, count: int | None = None,
                   seed: int | None = None,
                   distinct: bool = True) -> list[Problem]:
  """The problems of preset `name`'s `split`, each with a reference solution
  in the paper's step format ('3+5=8,8*2=16').

  Deterministic in (name, split, count, seed); `count` and `seed` default to
  the preset's. Each problem: `n_numbers` operands drawn independently and
  uniformly from the pool (with replacement), then a random combination of
  ALL of them: pick two values of the working pool uniformly (without
  order), an operation uniformly among those whose result is a positive
  integer (a+b, a*b, the larger minus the smaller when they differ, the
  larger divided by the smaller when exact, by 1 included), put the result
  back, until one value is left: the target. A draw whose target falls
  outside [min_target, max_target] is discarded and drawn again (operands
  included), and so is one that repeats a problem (same multiset of numbers
  and target) of the split: the candidates are distinct within a split
  (`distinct=False` keeps repeats; the paper does not say). Train and test
  splits are drawn independently from their own seeds, as the paper does, so
  they can share problems (`overlap`; `unseen` drops the shared ones).

  Measured with this function and `overlap`:
  Countdown-3's 5,000 distinct training problems take 7,774 draws (2,258
  repeats, 516 targets above 1,000 discarded); 277 of its 500 test problems
  also occur in training (487 of 500 test targets do). Targets are skewed
  small: median 40 (Countdown-3), 20 (-4E), 68 (-4).
  """
  if name not in PRESETS:
    raise ValueError(f"Countdown preset: expected one of {sorted(PRESETS)}, "
                     f"got {name!r}")
  p = PRESETS[name]
  if split not in p.splits:
    raise ValueError(f"{name} has split(s) {sorted(p.splits)}, got {split!r}")
  n, s = p.splits[split]
  n = n if count is None else int(count)
  s = s if seed is None else int(seed)
  if n < 0:
    raise ValueError(f"count must be >= 0, got {n}")
  rng = random.Random(s)
  seen, out = set(), []
  attempts = 0
  while len(out) < n:
    attempts += 1
    if attempts > 1000 + 100 * n:
      raise RuntimeError(f"{name}: only {len(out)} of {n} distinct problems")
    numbers = [rng.choice(p.pool) for _ in range(p.n_numbers)]
    target, steps = _random_steps(rng, numbers)
    key = (tuple(sorted(numbers)), target)
    if not p.min_target <= target <= p.max_target or (distinct and key in seen):
      continue
    seen.add(key)
    out.append(Problem(tuple(numbers), target, steps_lib.render(steps)))
  return out


def _random_steps(rng, numbers):
  work, steps = list(numbers), []
  while len(work) > 1:
    i, j = sorted(rng.sample(range(len(work)), 2))
    a, b = max(work[i], work[j]), min(work[i], work[j])
    ops = ["+", "*"] + (["-"] if a != b else []) + (["/"] if a % b == 0 else [])
    op = rng.choice(ops)
    value = steps_lib.apply(a, op, b)
    del work[j], work[i]
    work.append(value)
    steps.append((a, op, b, value))
  return work[0], steps


def overlap(train: Sequence[Problem], test: Sequence[Problem]) -> dict:
  """How many test problems also occur in training: same multiset of numbers
  and target ('problems'), or same target only ('targets')."""
  key = lambda q: (tuple(sorted(q.numbers)), q.target)
  seen = {key(q) for q in train}
  targets = {q.target for q in train}
  return {"problems": sum(key(q) in seen for q in test),
          "targets": sum(q.target in targets for q in test), "test": len(test)}


def unseen(train: Sequence[Problem], test: Sequence[Problem]) -> list[Problem]:
  """The test problems whose (multiset of numbers, target) is not in train."""
  seen = {(tuple(sorted(q.numbers)), q.target) for q in train}
  return [q for q in test if (tuple(sorted(q.numbers)), q.target) not in seen]


def _paper_verdict(answer: str, numbers, target) -> bool:
  """The paper's verifier on an answer's text (see `paper_reward`)."""
  answer = answer.translate(_UNICODE_OPS)
  try:
    return steps_lib.check(steps_lib.parse(answer), numbers, target)
  except expr_lib.ExprError:
    if "," in answer:
      return False
  # The single-expression form, with Table 1's rule that divisions are exact.
  tree, stated = _parse_answer(answer)
  if stated is not None and stated != target:
    return False
  if sorted(expr_lib.literals(tree)) != sorted(numbers):
    return False
  return _exact_divisions(tree) and expr_lib.evaluate(tree) == target


_UNICODE_OPS = str.maketrans({"×": "*", "÷": "/"})


def _exact_divisions(node) -> bool:
  if node[0] == "num":
    return True
  if node[0] == "/":
    den = expr_lib.evaluate(node[2])
    if den == 0 or (expr_lib.evaluate(node[1]) / den).denominator != 1:
      return False
  return all(_exact_divisions(child) for child in node[1:])


def paper_reward(completion: str, numbers: Sequence[int], target: int) -> float:
  """1.0 if the last <answer> solves the problem under the paper's rules.

  The answer is comma-separated steps 'x op y = z' (tasks.steps: each
  operand from the current pool, used once, exact arithmetic, the pool left
  as [target]); or, as the project's older prompts asked, one expression
  over all numbers ('(3+5)*2', optionally '= 16'), which here must also keep
  every division exact. × and ÷ read as * and /. Never raises on any text.
  """
  numbers = _check_numbers(numbers)
  answer = extract_answer(completion)
  if answer is None:
    return 0.0
  try:
    return 1.0 if _paper_verdict(answer, numbers, int(target)) else 0.0
  except (expr_lib.ExprError, RecursionError):
    return 0.0


def paper_format_score(completion: str) -> float:
  """0.0 no <answer>; 0.5 one that is neither steps nor an expression; 1.0."""
  answer = extract_answer(completion)
  if answer is None:
    return 0.0
  answer = answer.translate(_UNICODE_OPS)
  try:
    steps_lib.parse(answer)
    return 1.0
  except expr_lib.ExprError:
    pass
  try:
    if "," not in answer:
      _parse_answer(answer)
      return 1.0
  except (expr_lib.ExprError, RecursionError):
    pass
  return 0.5


def paper_normalize_answer(completion: str) -> str | None:
  """A key for counting distinct answers: the steps in compact form (as
  written, in order), or the expression's `normalize_answer` key."""
  answer = extract_answer(completion)
  if answer is None:
    return None
  try:
    return steps_lib.render(steps_lib.parse(answer.translate(_UNICODE_OPS)))
  except expr_lib.ExprError:
    return normalize_answer(completion)


def paper_reference_completion(numbers: Sequence[int], target: int,
                               solution: str) -> str:
  """SFT / off-policy text in Table 1's format for a step-form solution."""
  steps = steps_lib.parse(solution)
  if not steps_lib.check(steps, _check_numbers(numbers), int(target)):
    raise ValueError(f"solution {solution!r} does not solve {list(numbers)} "
                     f"-> {target}")
  said = " ".join(f"{x} {op} {y} = {z}." for x, op, y, z in steps)
  return (f"<think>Combine the numbers step by step: {said} This reaches "
          f"{int(target)} using each number once.</think>\n"
          f"<answer>{steps_lib.render(steps)}</answer>")
