"""Countdown answers as step equations (the paper's format, Table 1).

An answer is comma-separated steps ``x op y = z``, e.g. ``2+3=5,5*4=20``::

  answer := step (',' step)*
  step   := INT OP INT '=' INT
  OP     := '+' | '-' | '*' | '/' | '×' | '÷'
  INT    := ASCII digits, no leading zero, at most expr.MAX_DIGITS long

Spaces, tabs and newlines may stand between any two tokens. `×` and `÷` are
read as `*` and `/` (the paper's Table 1 typesets the multiplication sign as
×; a model may copy it). Numbers are unsigned: a step whose result would be
negative ("3-5=-2") is malformed, which loses no right answer, since every
non-negative target reachable through negative intermediates is reachable
without them (jaxdistill.tasks.countdown.solve's docstring).

`check(steps, numbers, target)` replays the steps on a pool, the multiset of
the problem's numbers: each step takes its two operands out of the pool (an
initial number or an earlier result, each usable once), its arithmetic must
be exact (division only when it leaves no remainder, never by zero), and its
result goes back in. The answer is right when the pool ends as exactly one
number, the target: every original number was used.

Every limit bounds the cost of hostile text: the answer is capped at
MAX_CHARS characters after stripping, literals at expr.MAX_DIGITS digits, and
the step count at the number of numbers minus one, so the arithmetic stays on
Python ints of a few dozen digits.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from jaxdistill.tasks import expr as expr_lib

MAX_CHARS = 512   # Five steps of 9-digit numbers with spaces need < 250.
_SPACE = " \t\r\n"
_DIGITS = "0123456789"
_OPS = {"+": "+", "-": "-", "*": "*", "/": "/", "×": "*", "÷": "/"}

Step = tuple[int, str, int, int]  # (x, op, y, z): x op y = z


def parse(text: str) -> list[Step]:
  """The steps of an answer; raises expr.ExprError on anything else."""
  text = text.strip(_SPACE)
  if not text:
    raise expr_lib.ExprError("empty answer")
  if len(text) > MAX_CHARS:
    raise expr_lib.ExprError(f"answer longer than {MAX_CHARS} characters")
  return [_step(part) for part in text.split(",")]


def _step(part: str) -> Step:
  toks = _tokens(part)
  if (len(toks) != 5 or not isinstance(toks[0], int) or toks[1] not in "+-*/"
      or not isinstance(toks[2], int) or toks[3] != "="
      or not isinstance(toks[4], int)):
    raise expr_lib.ExprError(f"step {part.strip()[:40]!r} is not 'x op y = z'")
  return toks[0], toks[1], toks[2], toks[4]


def _tokens(part: str) -> list:
  out, i, n = [], 0, len(part)
  while i < n:
    ch = part[i]
    if ch in _SPACE:
      i += 1
    elif ch in _DIGITS:
      j = i
      while j < n and part[j] in _DIGITS:
        j += 1
      lit = part[i:j]
      if len(lit) > expr_lib.MAX_DIGITS:
        raise expr_lib.ExprError(f"literal {lit[:12]}... too long")
      if len(lit) > 1 and lit[0] == "0":
        raise expr_lib.ExprError(f"literal {lit} has a leading zero")
      out.append(int(lit))
      i = j
    elif ch in _OPS:
      out.append(_OPS[ch])
      i += 1
    elif ch == "=":
      out.append("=")
      i += 1
    else:
      raise expr_lib.ExprError(f"character {ch!r} is not allowed in a step")
    if len(out) > 5:
      break
  return out


def apply(x: int, op: str, y: int) -> int | None:
  """x op y when it is a non-negative integer (exact division), else None."""
  if op == "+":
    return x + y
  if op == "*":
    return x * y
  if op == "-":
    return x - y if x >= y else None
  if y == 0 or x % y:
    return None
  return x // y


def check(steps: Sequence[Step], numbers: Sequence[int], target: int) -> bool:
  """True iff `steps` reduce the pool `numbers` to exactly [target]."""
  if len(steps) != len(numbers) - 1:
    return False  # Each step shrinks the pool by one.
  pool = Counter(int(n) for n in numbers)
  for x, op, y, z in steps:
    pool[x] -= 1
    pool[y] -= 1
    if pool[x] < 0 or pool[y] < 0:
      return False  # Not in the pool (or used twice).
    if apply(x, op, y) != z:
      return False
    pool[z] += 1
  left = +pool  # Drops zero counts.
  return left == Counter([int(target)])


def render(steps: Sequence[Step]) -> str:
  """The compact form of Table 1's example: '2+3=5,5*4=20'."""
  return ",".join(f"{x}{op}{y}={z}" for x, op, y, z in steps)
