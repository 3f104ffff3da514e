"""The paper's Countdown sets (App. D.1, D.6), Table 1 prompts and the step
verifier, against hand-written verdicts and an independent brute force."""
from collections import Counter
import itertools
import time

import pytest

from jaxdistill import tasks
from jaxdistill.tasks import countdown as cd
from jaxdistill.tasks import mcq

POOL = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 20, 25, 50, 75}


def reachable(nums):
  """Every value of combining ALL of `nums` with + - * and exact /, keeping
  intermediates positive integers (brute force over pairs of a multiset)."""
  if len(nums) == 1:
    return {nums[0]}
  out = set()
  for i, j in itertools.permutations(range(len(nums)), 2):
    a, b = nums[i], nums[j]
    rest = [nums[k] for k in range(len(nums)) if k not in (i, j)]
    for v in (a + b, a * b, a - b, a // b if a % b == 0 else 0):
      if v > 0:
        out |= reachable(rest + [v])
  return out


@pytest.mark.parametrize("name,split,count,n,pool,hi", [
    ("countdown3", "train", 5000, 3, POOL, 1000),
    ("countdown3", "test", 500, 3, POOL, 1000),
    ("countdown4e", "test", 500, 4, set(range(1, 11)), 10_000),
    ("countdown4", "train", 5000, 4, POOL, 10_000),
])
def test_paper_sets_counts_pool_targets_and_solvable(name, split, count, n,
                                                     pool, hi):
  probs = cd.paper_problems(name, split)
  assert len(probs) == count
  assert len({(tuple(sorted(p.numbers)), p.target) for p in probs}) == count
  for p in probs[:150]:  # The brute force costs ~1 ms per problem.
    assert len(p.numbers) == n
    assert p.target in reachable(list(p.numbers)), p
  for p in probs:
    assert set(p.numbers) <= pool and 1 <= p.target <= hi
    assert cd.paper_reward(f"<answer>{p.solution}</answer>", p.numbers,
                           p.target) == 1.0
  assert cd.paper_problems(name, split) == probs  # Deterministic.


def test_seeds_and_presets():
  assert cd.PRESETS["countdown3"].splits == {"train": (5000, 42),
                                             "test": (500, 43)}
  assert cd.PRESETS["countdown4"].splits == {"train": (5000, 42)}
  a = cd.paper_problems("countdown3", "train", count=50)
  assert a == cd.paper_problems("countdown3", "train")[:50]
  assert cd.paper_problems("countdown3", "train", count=50, seed=43) == (
      cd.paper_problems("countdown3", "test")[:50])
  assert cd.paper_problems("countdown3", "train", count=50, seed=7) != a
  # With replacement: repeated operands occur.
  assert any(len(set(p.numbers)) < 3 for p in a)
  with pytest.raises(ValueError, match="split"):
    cd.paper_problems("countdown4e", "train")
  with pytest.raises(ValueError, match="preset"):
    cd.paper_problems("countdown5", "train")


def test_overlap_counts_shared_problems():
  train = cd.paper_problems("countdown3", "train")
  test = cd.paper_problems("countdown3", "test")
  got = cd.overlap(train, test)
  keys = {(tuple(sorted(p.numbers)), p.target) for p in train}
  assert got["problems"] == sum((tuple(sorted(p.numbers)), p.target) in keys
                                for p in test)
  assert got["test"] == 500 and 0 < got["problems"] < 500
  fresh = cd.unseen(train, test)
  assert len(fresh) == 500 - got["problems"]
  assert all((tuple(sorted(p.numbers)), p.target) not in keys for p in fresh)
  # Repeats are kept on request.
  rep = cd.paper_problems("countdown3", "train", distinct=False)
  assert len(rep) == 5000
  assert len({(tuple(sorted(p.numbers)), p.target) for p in rep}) < 5000


A = "<answer>{}</answer>"
# (answer, numbers, target, verdict): verdicts written by hand.
STEP_CASES = [
    ("2+3=5,5*4=20", [2, 3, 4], 20, 1.0),
    ("3+2=5,4*5=20", [2, 3, 4], 20, 1.0),           # Operand order free.
    (" 2 + 3 = 5 , 5 * 4 = 20 ", [2, 3, 4], 20, 1.0),
    ("2+3=5,\n5*4=20", [2, 3, 4], 20, 1.0),
    ("2+3=5,5×4=20", [2, 3, 4], 20, 1.0),           # Unicode times.
    ("12÷4=3,3×5=15", [12, 4, 5], 15, 1.0),         # Unicode divide.
    ("75/25=3,3*3=9", [75, 25, 3], 9, 1.0),         # Duplicate value used twice:
    ("3*3=9,75/25=3,9+3=12", [3, 3, 75, 25], 12, 1.0),  # ... from two sources.
    ("5-5=0,0+7=7", [5, 5, 7], 7, 1.0),             # Zero intermediate.
    ("1*1=1,1*1=1", [1, 1, 1], 1, 1.0),
    ("50+25=75,75-75=0,0+1=1", [50, 25, 75, 1], 1, 1.0),
    ("(3+5)*2", [3, 5, 2], 16, 1.0),                # Old expression form.
    ("(3+5)*2 = 16", [3, 5, 2], 16, 1.0),
    ("3×(10÷2)", [3, 10, 2], 15, 1.0),
    ("12/4*5", [12, 4, 5], 15, 1.0),
    # Wrong arithmetic in a step.
    ("2+3=6,6*4=24", [2, 3, 4], 24, 0.0),
    ("2+3=5,5*4=21", [2, 3, 4], 21, 0.0),
    ("2+3=5,5*4=20", [2, 3, 4], 21, 0.0),            # Never the target.
    # An operand used twice / not in the pool.
    ("2+3=5,5*5=25", [2, 3, 4], 25, 0.0),
    ("2+2=4,4*3=12", [2, 3, 4], 12, 0.0),
    ("2+3=5,5*4=20,20-2=18", [2, 3, 4], 18, 0.0),   # 2 reused after use.
    ("6+3=9,9*4=36", [2, 3, 4], 36, 0.0),           # 6 not in the pool.
    ("2+3=5,5*4=20,20+0=20", [2, 3, 4], 20, 0.0),   # 0 not in the pool.
    ("5*4=20", [2, 3, 4], 20, 0.0),                 # 5 before it is made.
    ("5*4=20,2+3=5", [2, 3, 4], 20, 0.0),           # Out of order.
    # Inexact or zero division.
    ("7/2=3,3*4=12", [7, 2, 4], 12, 0.0),
    ("7/2=3.5,3.5*4=14", [7, 2, 4], 14, 0.0),
    ("7/2*4", [7, 2, 4], 14, 0.0),                  # Exact over Q, not integer.
    ("5-5=0,7/0=0", [5, 5, 7], 0, 0.0),
    # Unused numbers / extra steps / no steps.
    ("2+3=5", [2, 3, 4], 5, 0.0),
    ("2*3=6", [2, 3], 6, 1.0),
    ("20", [2, 3, 4], 20, 0.0),
    ("2+3+4", [2, 3, 4], 9, 1.0),                   # One expression, fine.
    ("2+3=5,5+4=9,9*1=9", [2, 3, 4], 9, 0.0),       # 1 not in the pool.
    # Negative intermediates are not written in step form.
    ("3-5=-2,-2*-2=4", [3, 5, 2], 4, 0.0),
    ("5-3=2,2*2=4", [3, 5, 2], 4, 1.0),
    ("3-5=2,2*2=4", [3, 5, 2], 4, 0.0),             # 3-5 is not 2.
    # Malformed.
    ("", [2, 3, 4], 20, 0.0),
    ("2+3=5,,5*4=20", [2, 3, 4], 20, 0.0),
    ("2+3=5,5*4=20,", [2, 3, 4], 20, 0.0),
    ("2+3=5;5*4=20", [2, 3, 4], 20, 0.0),
    ("2+3==5,5*4=20", [2, 3, 4], 20, 0.0),
    ("2+3=5,5*4", [2, 3, 4], 20, 0.0),
    ("2+3=5,5*4=20=20", [2, 3, 4], 20, 0.0),
    ("2+3+4=9,9=9", [2, 3, 4], 9, 0.0),
    ("02+3=5,5*4=20", [2, 3, 4], 20, 0.0),
    ("2+3=5,5**4=625", [2, 3, 4], 625, 0.0),
    ("2+3=5,5^4=625", [2, 3, 4], 625, 0.0),
    ("٢+3=5,5*4=20", [2, 3, 4], 20, 0.0),            # Arabic-Indic digit.
    ("２+3=5,5*4=20", [2, 3, 4], 20, 0.0),           # Fullwidth digit.
    ("2+3=5,5x4=20", [2, 3, 4], 20, 0.0),
    ("__import__('os')", [2, 3, 4], 20, 0.0),
    # Huge.
    ("9" * 100_000 + "+1=1", [1, 1, 1], 1, 0.0),
    ("999999999*999999999=999999998000000001,1*1=1", [999999999] * 2 + [1],
     999999998000000001, 0.0),                       # Result past 9 digits.
    (",".join(["1*1=1"] * 5000), [1] * 3, 1, 0.0),
    ("(" * 10_000 + "2+3" + ")" * 10_000, [2, 3], 5, 0.0),
]


@pytest.mark.parametrize("answer,numbers,target,expected", STEP_CASES,
                         ids=[f"case{i}" for i in range(len(STEP_CASES))])
def test_step_verifier_table(answer, numbers, target, expected):
  start = time.perf_counter()
  assert cd.paper_reward(A.format(answer), numbers, target) == expected
  assert time.perf_counter() - start < 2.0


def test_step_verifier_reads_the_last_answer_only():
  right, wrong = A.format("2+3=5,5*4=20"), A.format("2+3=5,5*4=21")
  assert cd.paper_reward("<think>..</think>" + wrong + right, [2, 3, 4], 20) == 1.0
  assert cd.paper_reward(right + wrong, [2, 3, 4], 20) == 0.0
  assert cd.paper_reward("2+3=5,5*4=20", [2, 3, 4], 20) == 0.0  # No tags.
  assert cd.paper_reward("x" * 1_000_000 + right, [2, 3, 4], 20) == 1.0
  assert cd.paper_reward("<answer>" * 100_000, [2, 3, 4], 20) == 0.0


def test_paper_format_score_and_key():
  assert cd.paper_format_score("none") == 0.0
  assert cd.paper_format_score(A.format("2+3=5,5*4=21")) == 1.0  # Form only.
  assert cd.paper_format_score(A.format("(2+3)*4")) == 1.0
  assert cd.paper_format_score(A.format("2+3=5;5*4=20")) == 0.5
  key = cd.paper_normalize_answer
  assert key(A.format(" 2 + 3 = 5, 5×4=20")) == key(A.format("2+3=5,5*4=20"))
  assert key(A.format("3+2=5,5*4=20")) != key(A.format("2+3=5,5*4=20"))


COUNTDOWN3_USER = (
    "Solve the Countdown arithmetic problem. Using the provided numbers, create "
    "an equation that equals the target. You may use the operations +, -, *, "
    "and /, and each number must be used exactly once; every division must "
    "have an integer result. Show your work in <think>...</think> tags and "
    "return the solution as compact, comma-separated equations in "
    "<answer>...</answer> tags. For example, <answer>2+3=5,5*4=20</answer>."
    "\n\nNumbers: [25, 5, 3]\nTarget: 40")


def test_table1_prompts_exact():
  assert cd.table1_prompt([25, 5, 3], 40) == (
      "You are a careful arithmetic solver.", COUNTDOWN3_USER)
  assert mcq.science_prompt("Which gas?", ["O2", "N2", "CO2", "He"]) == (
      "You are a careful solver of multiple-choice science questions.",
      "Given a question and four options, select the correct answer. Reason "
      "step by step in <think>...</think> tags and place only the "
      "corresponding option letter (A, B, C, or D) in <answer>...</answer> "
      "tags.\n\nWhich gas?\n\nA. O2\nB. N2\nC. CO2\nD. He")
  assert mcq.medreason_prompt("Drug?", ["a", "b", "c", "d"]) == (
      "You are a careful medical reasoning assistant.",
      "Given a medical multiple-choice question and its answer choices, "
      "select the correct answer. Reason step by step in <think>...</think> "
      "tags and place only the letter corresponding to the correct option in "
      "<answer>...</answer> tags; do not repeat the answer text.\n\nDrug?\n\n"
      "A. a\nB. b\nC. c\nD. d")


def test_records_route_to_table1_prompt_and_step_verifier():
  rec = {"numbers": [25, 5, 3], "target": 40, "solution": "5*3=15,25+15=40",
         "variant": "countdown3"}
  assert tasks.task_of(rec) == tasks.COUNTDOWN_STEPS
  assert tasks.prompt_messages(rec) == ("You are a careful arithmetic solver.",
                                        COUNTDOWN3_USER)
  old = {k: rec[k] for k in ("numbers", "target")}
  assert tasks.prompt_messages(old)[0] is None  # The old generator's prompt.
  ref = tasks.reference_response(rec)
  assert ref.endswith("<answer>5*3=15,25+15=40</answer>")
  batch = {"task": [tasks.COUNTDOWN_STEPS, tasks.COUNTDOWN],
           "numbers": [[25, 5, 3, -1, -1, -1]] * 2, "target": [40, 40],
           "gold": [-1, -1]}
  import numpy as np
  batch = {k: np.asarray(v) for k, v in batch.items()}
  got = tasks.score_batch([ref, A.format("5*3=15,25+15=40"),
                           A.format("25+5*3"), A.format("5*3=15,25+15=40")],
                          batch)
  assert list(got["reward"]) == [1.0, 1.0, 1.0, 0.0]  # Old task: old verifier.
  with pytest.raises(ValueError, match="variant"):
    tasks.task_of(dict(rec, variant="countdown9"))


@pytest.mark.parametrize("text,letter", [
    ("<think>..</think>\n<answer>B</answer>", "B"),
    ("<answer> C </answer>", "C"),
    ("<answer>(D)</answer>", "D"),
    ("The answer is A. <answer>B</answer>", "B"),   # The last statement wins.
    ("<answer>E</answer>", None),                   # Not offered.
    ("<answer>Aspirin</answer>", None),
    ("<answer>B</answer", None),
])
def test_mcq_reads_answer_tags(text, letter):
  assert mcq.extract_answer(text, 4) == letter
