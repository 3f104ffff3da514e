"""Countdown generator, solver and verifier against independent references.

The reference evaluator below uses Python's own parser (`ast`) on trusted,
test-generated strings plus `fractions`, and the brute force enumerates every
expression tree over 3 numbers: neither shares code with jaxdistill.tasks.
"""
import ast
from collections import Counter
from fractions import Fraction
import itertools
import random
import time

import pytest

from jaxdistill.tasks import countdown as cd


def ref_eval(text):
  """(value, literals) of a + - * / expression, via Python's AST (trusted input)."""
  lits = []

  def ev(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
      lits.append(node.value)
      return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
      return -ev(node.operand)
    if isinstance(node, ast.BinOp):
      a, b = ev(node.left), ev(node.right)
      return {ast.Add: lambda: a + b, ast.Sub: lambda: a - b,
              ast.Mult: lambda: a * b, ast.Div: lambda: a / b}[type(node.op)]()
    raise AssertionError(f"unexpected node {ast.dump(node)}")

  return ev(ast.parse(text, mode="eval").body), lits


def brute_force_values(nums):
  """All values of expressions using each of 3 numbers once (any sign)."""
  ops = [lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b,
         lambda a, b: a / b if b else None]
  vals = set()
  for a, b, c in itertools.permutations([Fraction(n) for n in nums]):
    for f, g in itertools.product(ops, ops):
      left = f(a, b)  # (a f b) g c
      if left is not None and g(left, c) is not None:
        vals.add(g(left, c))
      right = g(b, c)  # a f (b g c)
      if right is not None and f(a, right) is not None:
        vals.add(f(a, right))
  return vals


@pytest.mark.parametrize("n", [3, 4, 5, 6])
def test_generated_problems_are_solvable_and_solutions_verify(n):
  train = cd.generate_problems(n, 60, seed=1)
  test = cd.generate_problems(n, 20, seed=1, split="test")
  assert len(train) == 60 and len(test) == 20
  for p in train + test:
    assert len(p.numbers) == n and 1 <= p.target <= 1000
    value, lits = ref_eval(p.solution)
    assert value == p.target, p
    assert Counter(lits) == Counter(p.numbers), p
    assert cd.reward(f"<answer>{p.solution}</answer>", p.numbers, p.target) == 1.0
    assert cd.reward(cd.reference_completion(p.numbers, p.target, p.solution),
                     p.numbers, p.target) == 1.0
  # Splits are disjoint in targets; generation is deterministic in the seed.
  assert not {p.target for p in train} & {p.target for p in test}
  assert cd.generate_problems(n, 60, seed=1) == train
  assert cd.generate_problems(n, 60, seed=2) != train
  assert len({(tuple(sorted(p.numbers)), p.target) for p in train}) == 60


def test_split_depends_only_on_target():
  for seed in range(3):
    for p in cd.generate_problems(3, 30, seed=seed, split="test"):
      assert cd.target_split(p.target) == "test"
  frac = sum(cd.target_split(t) == "test" for t in range(1, 1001)) / 1000
  assert 0.05 < frac < 0.15


@pytest.mark.parametrize("n,count", [(3, 40), (4, 30), (5, 15), (6, 8)])
def test_solver_solutions_check_with_reference(n, count):
  for p in cd.generate_problems(n, count, seed=7):
    sol = cd.solve(p.numbers, p.target)
    assert sol is not None, p
    value, lits = ref_eval(sol)
    assert value == p.target and Counter(lits) == Counter(p.numbers), (p, sol)


def test_solver_agrees_with_brute_force_on_three_numbers():
  rng = random.Random(0)
  found = missed = 0
  for _ in range(150):
    nums = [rng.randint(1, 12) for _ in range(3)]
    target = rng.randint(1, 80)
    sol = cd.solve(nums, target)
    reachable = Fraction(target) in brute_force_values(nums)
    assert (sol is not None) == reachable, (nums, target, sol)
    if sol is not None:
      value, lits = ref_eval(sol)
      assert value == target and Counter(lits) == Counter(nums)
      found += 1
    else:
      missed += 1
  assert found > 20 and missed > 20  # Both outcomes exercised.


def test_solver_needs_fractions_when_integers_fail():
  # 8 / (3 - 8/3) = 24 has no all-integer route.
  sol = cd.solve([3, 3, 8, 8], 24)
  value, lits = ref_eval(sol)
  assert value == 24 and sorted(lits) == [3, 3, 8, 8]
  assert cd.solve([1, 1, 1], 100) is None


A = "<answer>{}</answer>"
HOSTILE_DEEP = "(" * 10_000 + "25+5*3" + ")" * 10_000

# (completion, numbers, target, expected reward)
CASES = [
    # Correct, written differently.
    (A.format("25+5*3"), [25, 5, 3], 40, 1.0),
    (A.format("5*3+25"), [25, 5, 3], 40, 1.0),
    (A.format("3*5+25"), [25, 5, 3], 40, 1.0),
    (A.format("(3*5)+25"), [25, 5, 3], 40, 1.0),
    (A.format(" 25 + (5 * 3) "), [25, 5, 3], 40, 1.0),
    (A.format("((25)+(5*(3)))"), [25, 5, 3], 40, 1.0),
    (A.format("25+5*3 = 40"), [25, 5, 3], 40, 1.0),
    (A.format("\n25\t+ 5*3\n"), [25, 5, 3], 40, 1.0),
    (A.format("7/2*4"), [7, 2, 4], 14, 1.0),          # Fractional intermediate.
    (A.format("7*4/2"), [7, 2, 4], 14, 1.0),
    (A.format("4/(2/7)"), [7, 2, 4], 14, 1.0),
    (A.format("(" * 10 + "25+5*3" + ")" * 10), [25, 5, 3], 40, 1.0),
    ("I think... " + A.format("1+2") + " no wait " + A.format("25+5*3"),
     [25, 5, 3], 40, 1.0),                            # Last answer wins.
    ("<answer><answer>25+5*3</answer>", [25, 5, 3], 40, 1.0),
    ("x" * 1_000_000 + A.format("25+5*3"), [25, 5, 3], 40, 1.0),
    (A.format("10-(5-3)*4+2*1"), [10, 5, 3, 4, 2, 1], 4, 1.0),
    # Whitespace around the answer is stripped before the 256-character cap.
    (A.format(" " * 300 + "25+5*3"), [25, 5, 3], 40, 1.0),
    (A.format("\n" * 300 + "25+5*3 = 40" + " \t" * 200), [25, 5, 3], 40, 1.0),
    # Unary minus negates a number or a parenthesis; the value is exact.
    (A.format("-(3-5)*2"), [3, 5, 2], 4, 1.0),
    (A.format("2*-(3-5)"), [3, 5, 2], 4, 1.0),
    (A.format("-3*(2-5) = 9"), [3, 5, 2], 9, 1.0),
    (A.format("7--3"), [7, 3], 10, 1.0),
    (A.format("-(1+2) = -3"), [1, 2], -3, 1.0),
    # Wrong value or wrong numbers.
    (A.format("25+5+3"), [25, 5, 3], 40, 0.0),
    (A.format("25*5-3"), [25, 5, 3], 40, 0.0),
    (A.format("25+15"), [25, 5, 3], 40, 0.0),          # Missing number.
    (A.format("25+5*3*1"), [25, 5, 3], 40, 0.0),       # Extra number.
    (A.format("25+5*3+3-3"), [25, 5, 3], 40, 0.0),     # Reused number.
    (A.format("40"), [25, 5, 3], 40, 0.0),
    (A.format("25+5*3 = 41"), [25, 5, 3], 40, 0.0),    # Wrong stated result.
    (A.format("25+5*3 = 40 = 40"), [25, 5, 3], 40, 0.0),
    (A.format("40 = 25+5*3"), [25, 5, 3], 40, 0.0),
    (A.format("25+5*3 == 40"), [25, 5, 3], 40, 0.0),
    (A.format("25+5*3 = 40.0"), [25, 5, 3], 40, 0.0),
    (A.format("25+5*3") + " and finally " + A.format("25+5+3"), [25, 5, 3], 40, 0.0),
    # Malformed.
    (A.format(""), [25, 5, 3], 40, 0.0),
    (A.format("   "), [25, 5, 3], 40, 0.0),
    ("25+5*3", [25, 5, 3], 40, 0.0),                   # No tag.
    ("<answer>25+5*3", [25, 5, 3], 40, 0.0),           # Unclosed.
    ("25+5*3</answer>", [25, 5, 3], 40, 0.0),
    ("<ANSWER>25+5*3</ANSWER>", [25, 5, 3], 40, 0.0),  # Tags are case-sensitive.
    ("<answer>25+5*3</answer></answer>", [25, 5, 3], 40, 0.0),
    (A.format("(25+5*3"), [25, 5, 3], 40, 0.0),
    (A.format("25+5*3)"), [25, 5, 3], 40, 0.0),
    (A.format("25 5 3"), [25, 5, 3], 40, 0.0),
    (A.format("-3+25+5*3+3"), [25, 5, 3, 3], 40, 0.0),  # Reused 3.
    (A.format("-(3-5)*2"), [3, 5, 2], -4, 0.0),          # Wrong value.
    (A.format("-(3-5)*2*1"), [3, 5, 2], 4, 0.0),         # Extra number.
    (A.format("-(3-5)*2 = 5"), [3, 5, 2], 4, 0.0),       # Wrong stated result.
    (A.format("--(5-3)*2"), [3, 5, 2], 4, 0.0),          # Double negation.
    (A.format("-" * 10_000 + "4"), [4], 4, 0.0),
    (A.format("+4"), [4], 4, 0.0),                        # No unary plus.
    (A.format("25" + " " * 300 + "+5*3"), [25, 5, 3], 40, 0.0),  # Inner spaces count.
    (A.format(" " * 300 + "25+5*3" + " " * 300 + "*1"), [25, 5, 3, 1], 40, 0.0),
    (A.format("25.0+5*3"), [25, 5, 3], 40, 0.0),
    (A.format("025+5*3"), [25, 5, 3], 40, 0.0),        # Leading zero.
    (A.format("0x19+5*3"), [25, 5, 3], 40, 0.0),
    (A.format("25+5×3"), [25, 5, 3], 40, 0.0),         # Only ASCII operators.
    # Hostile.
    (A.format("٢٥+٥*٣"), [25, 5, 3], 40, 0.0),         # Arabic-Indic digits.
    (A.format("２５+5*3"), [25, 5, 3], 40, 0.0),        # Fullwidth digits.
    (A.format("9**9**9"), [9, 9, 9], 40, 0.0),
    (A.format("25+5**3"), [25, 5, 3], 150, 0.0),
    (A.format("__import__('os').system('rm -rf /')"), [25, 5, 3], 40, 0.0),
    (A.format("(lambda: 40)()"), [25, 5, 3], 40, 0.0),
    (A.format("25+5*3; import os"), [25, 5, 3], 40, 0.0),
    (A.format("5/(3-3)+25"), [25, 5, 3, 3], 40, 0.0),  # Division by zero.
    (A.format("25/(5-5)*3"), [25, 5, 5, 3], 40, 0.0),
    (A.format(HOSTILE_DEEP), [25, 5, 3], 40, 0.0),     # 10,000-deep parentheses.
    (A.format("(" * 40 + "25+5*3" + ")" * 40), [25, 5, 3], 40, 0.0),  # Depth > 32.
    (A.format("(" * 10_000), [25, 5, 3], 40, 0.0),
    (A.format("9" * 100_000), [25, 5, 3], 40, 0.0),    # Huge literal.
    (A.format("+".join(["1"] * 5000)), [1] * 5000, 5000, 0.0),
    (A.format("25+5*3") + "y" * 1_000_000, [25, 5, 3], 40, 0.0),  # Outside the window.
    ("<answer>" * 200_000 + "</answer>" * 200_000, [25, 5, 3], 40, 0.0),
    (A.format("inf"), [25, 5, 3], 40, 0.0),
    (A.format("1e3"), [25, 5, 3], 40, 0.0),
    (A.format("25+5*3\x00"), [25, 5, 3], 40, 0.0),
]


def test_verifier_table_has_at_least_forty_cases():
  assert len(CASES) >= 40
  assert sum(c[3] == 1.0 for c in CASES) >= 12


@pytest.mark.parametrize("completion,numbers,target,expected", CASES,
                         ids=[f"case{i}" for i in range(len(CASES))])
def test_verifier_table(completion, numbers, target, expected):
  start = time.perf_counter()
  assert cd.reward(completion, numbers, target) == expected
  # Generous bound: the scan is capped, so even megabyte inputs are quick.
  assert time.perf_counter() - start < 2.0


def test_verifier_never_raises_on_random_junk():
  rng = random.Random(0)
  alphabet = "0123456789+-*/()= <>answer/\\x٣"
  for _ in range(500):
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
    r = cd.reward(A.format(text), [1, 2, 3], 6)
    assert r in (0.0, 1.0)
    if r == 1.0:  # Then the reference evaluator agrees.
      value, lits = ref_eval(text.split("=")[0])
      assert value == 6 and sorted(lits) == [1, 2, 3]


def test_bad_arguments_raise():
  with pytest.raises(ValueError, match="numbers"):
    cd.reward("<answer>1</answer>", ["a"], 1)
  with pytest.raises(ValueError, match="completion"):
    cd.reward(None, [1, 2, 3], 6)
  with pytest.raises(ValueError, match="n_numbers"):
    cd.generate_problems(7, 1, 0)
  with pytest.raises(ValueError, match="split"):
    cd.generate_problems(3, 1, 0, split="val")
  with pytest.raises(ValueError, match="does not solve"):
    cd.reference_completion([1, 2, 3], 7, "1+2+3")


def test_format_score():
  assert cd.format_score("no tags") == 0.0
  assert cd.format_score(A.format("1+2+")) == 0.5
  assert cd.format_score(A.format("99+1")) == 1.0   # Format only, not correctness.
  assert cd.format_score(A.format("1+2 = 3")) == 1.0


def test_normalize_answer_identifies_reorderings_only():
  key = cd.normalize_answer
  assert key(A.format("3+4*5")) == key(A.format("5*4+3")) == key(A.format("(4*5)+3"))
  assert key(A.format("10-(6-2)")) == key(A.format("10+2-6"))
  assert key(A.format("8/(4/2)")) == key(A.format("8*2/4"))
  assert key(A.format("(1+2)*3")) != key(A.format("1*3+2*3"))
  assert key(A.format("6-2")) != key(A.format("2-6"))
  assert key(A.format("-(2-6)*3")) == key(A.format("(6-2)*3"))
  assert key("nothing") is None and key(A.format("1+")) is None


def test_prompt_mentions_numbers_target_and_format():
  text = cd.build_prompt([3, 17, 4], 55)
  assert "[3, 17, 4]" in text and "55" in text and "<answer>" in text


def test_enumerate_problems_splits_by_problem_and_is_deterministic():
  train = cd.enumerate_problems(3, 0, max_number=6, max_target=30)
  test = cd.enumerate_problems(3, 0, split="test", max_number=6,
                                      max_target=30, test_fraction=0.2)
  again = cd.enumerate_problems(3, 0, max_number=6, max_target=30)
  assert train == again
  assert cd.enumerate_problems(3, 1, max_number=6, max_target=30) != train
  key = lambda p: (tuple(sorted(p.numbers)), p.target)
  assert len({key(p) for p in train}) == len(train)
  for p in train[:50] + test[:50]:
    assert cd.reward(f"<answer>{p.solution}</answer>", p.numbers,
                            p.target) == 1.0
    assert cd.problem_split(p.numbers, p.target,
                                   0.2 if p in test else 0.1) == (
                                       "test" if p in test else "train")
  with pytest.raises(ValueError, match="n_numbers"):
    cd.enumerate_problems(5, 0)
  with pytest.raises(ValueError, match="split"):
    cd.enumerate_problems(3, 0, split="dev")


def _brute_force_problems(n, max_number=9, max_target=100):
  """Every (sorted numbers, target) reachable under the generator's rules
  (positive integer intermediates, exact division, no division by 1), by
  combining any two values of a multiset until one is left."""
  def values(vals):
    if len(vals) == 1:
      yield vals[0]
      return
    for i, j in itertools.permutations(range(len(vals)), 2):
      a, b = vals[i], vals[j]
      rest = [vals[k] for k in range(len(vals)) if k not in (i, j)]
      for v in (a + b, a - b, a * b, a // b if b > 1 and a % b == 0 else 0):
        if v > 0:
          yield from values(rest + [v])
  out = set()
  for nums in itertools.combinations_with_replacement(range(1, max_number + 1), n):
    out |= {(nums, v) for v in values(list(nums)) if v <= max_target}
  return out




def test_countdown3_enumeration_is_the_whole_space_split_by_problem():
  train = [p.to_record() for p in cd.enumerate_problems(3, 0)]
  test = [p.to_record() for p in cd.enumerate_problems(3, 0, split="test")]
  for r in train + test:
    assert cd.reward(f"<answer>{r['solution']}</answer>", r["numbers"],
                     r["target"]) == 1.0
  key = lambda r: (tuple(sorted(r["numbers"])), r["target"])
  assert len({key(r) for r in train}) == len(train)
  assert not {key(r) for r in train} & {key(r) for r in test}
  # Together the splits are every problem of the space (brute force).
  assert {key(r) for r in train + test} == _brute_force_problems(3)
  assert len(test) >= 200
  # Split by problem, not by target: test targets also occur in training.
  assert {r["target"] for r in test} <= {r["target"] for r in train}
