"""A small, safe arithmetic language for Countdown answers.

Grammar (recursive descent, no exponent)::

  expr    := term (('+' | '-') term)*
  term    := factor (('*' | '/') factor)*
  factor  := primary | '-' primary          (the '-' only with unary_minus)
  primary := INT | '(' expr ')'
  INT     := ASCII digits, no leading zero, at most MAX_DIGITS long

Unary minus is off by default (worked steps and arithmetic records have none);
the Countdown verifier turns it on, so "-(3-5)*2" = 4 and "3*-2+10" = 4 are
equations over their literals like any other. It negates one number or one
parenthesised expression: "--3" is refused, "-(-3)" is not.

Only ASCII digits count as digits: '٣' or '３' are rejected rather than read as
3, because `str.isdigit` would accept them and a model could then "use" a
number that is not in the prompt. Evaluation is exact (`fractions.Fraction`).

Every limit exists so that hostile text costs bounded time: the text is capped
at MAX_CHARS characters once leading and trailing whitespace is stripped
(spaces inside an expression count), parentheses at MAX_DEPTH levels and
literals at MAX_DIGITS digits, so the parser touches at most a few hundred
tokens and the rational arithmetic stays on small numbers. Nothing here calls
`eval`.

A parse returns a tree of tuples: `('num', int)`, `('neg', operand)` or
`(op, left, right)`.
"""
from __future__ import annotations

from fractions import Fraction

MAX_CHARS = 256   # An equation over 6 numbers needs < 60; leave room for spaces.
MAX_DEPTH = 32    # Parenthesis nesting.
MAX_DIGITS = 9    # Countdown numbers and targets are small.

_OPS = "+-*/"
_SPACE = " \t\r\n"
_DIGITS = "0123456789"
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "num": 3}
NEG = "neg"


class ExprError(ValueError):
  """The text is not an expression of the Countdown language."""


def tokenize(text: str) -> list[str | int]:
  """Splits text into ints, operators and parentheses; raises ExprError."""
  text = text.strip(_SPACE)
  if len(text) > MAX_CHARS:
    raise ExprError(f"expression longer than {MAX_CHARS} characters")
  toks: list[str | int] = []
  i, n = 0, len(text)
  while i < n:
    ch = text[i]
    if ch in _SPACE:
      i += 1
    elif ch in _DIGITS:
      j = i
      while j < n and text[j] in _DIGITS:
        j += 1
      lit = text[i:j]
      if len(lit) > MAX_DIGITS:
        raise ExprError(f"literal {lit[:12]}... has more than {MAX_DIGITS} digits")
      if len(lit) > 1 and lit[0] == "0":
        raise ExprError(f"literal {lit} has a leading zero")
      toks.append(int(lit))
      i = j
    elif ch in _OPS or ch in "()":
      toks.append(ch)
      i += 1
    else:
      raise ExprError(f"character {ch!r} at {i} is not allowed")
  return toks


class _Parser:
  """Recursive descent over a token list; recursion depth <= MAX_DEPTH."""

  def __init__(self, toks, unary_minus):
    self.toks, self.pos, self.depth = toks, 0, 0
    self.unary_minus = unary_minus

  def peek(self):
    return self.toks[self.pos] if self.pos < len(self.toks) else None

  def take(self):
    tok = self.peek()
    self.pos += 1
    return tok

  def expr(self):
    node = self.term()
    while self.peek() in ("+", "-"):
      op = self.take()
      node = (op, node, self.term())
    return node

  def term(self):
    node = self.factor()
    while self.peek() in ("*", "/"):
      op = self.take()
      node = (op, node, self.factor())
    return node

  def factor(self):
    if self.unary_minus and self.peek() == "-":
      self.take()
      return (NEG, self.primary())
    return self.primary()

  def primary(self):
    tok = self.take()
    if isinstance(tok, int):
      return ("num", tok)
    if tok == "(":
      self.depth += 1
      if self.depth > MAX_DEPTH:
        raise ExprError(f"parentheses nested deeper than {MAX_DEPTH}")
      node = self.expr()
      if self.take() != ")":
        raise ExprError("unbalanced parentheses")
      self.depth -= 1
      return node
    raise ExprError(f"expected a number or '(' at token {self.pos - 1}, got {tok!r}")


def parse(text: str, *, unary_minus: bool = False):
  """Parses `text` into a tree; raises ExprError on anything else (on any
  unary minus unless `unary_minus`)."""
  toks = tokenize(text)
  if not toks:
    raise ExprError("empty expression")
  p = _Parser(toks, unary_minus)
  node = p.expr()
  if p.pos != len(toks):
    raise ExprError(f"unexpected token {toks[p.pos]!r} at {p.pos}")
  return node


def evaluate(node) -> Fraction:
  """Exact value of a tree; raises ExprError on division by zero."""
  if node[0] == "num":
    return Fraction(node[1])
  if node[0] == NEG:
    return -evaluate(node[1])
  a, b = evaluate(node[1]), evaluate(node[2])
  op = node[0]
  if op == "+":
    return a + b
  if op == "-":
    return a - b
  if op == "*":
    return a * b
  if b == 0:
    raise ExprError("division by zero")
  return a / b


def literals(node) -> list[int]:
  """The integer literals of a tree, left to right."""
  if node[0] == "num":
    return [node[1]]
  return [n for child in node[1:] for n in literals(child)]


def render(node) -> str:
  """Prints a tree with the fewest parentheses that keep its meaning."""
  return _render(node)[0]


def _render(node) -> tuple[str, int]:
  if node[0] == "num":
    return str(node[1]), _PREC["num"]
  if node[0] == NEG:
    s, p = _render(node[1])
    return (f"-{s}" if p == _PREC["num"] else f"-({s})"), _PREC["num"]
  return combine(node[0], _render(node[1]), _render(node[2]))


def combine(op: str, a: tuple[str, int], b: tuple[str, int]) -> tuple[str, int]:
  """Renders `a op b` from already-rendered (text, precedence) operands."""
  p = _PREC[op]
  (ls, lp), (rs, rp) = a, b
  if lp < p:
    ls = f"({ls})"
  # Right operands of '-' and '/' need parentheses at equal precedence too:
  # a-(b+c), a/(b*c).
  if rp < p or (rp == p and op in "-/"):
    rs = f"({rs})"
  return f"{ls}{op}{rs}", p


def canonical(node) -> str:
  """A normal form modulo commutativity and associativity of + and *.

  Sums are flattened into signed terms and products into factors with
  exponent +-1; both are sorted. So `3+4*5`, `5*4+3` and `(4*5)+3` agree, and
  `a-(b-c)` equals `a+c-b` and `-(a-b)` equals `b-a`, while `(a+b)*c` and
  `a*c+b*c` stay distinct (they are different equations a student can write).
  """
  return _canon(node)


def _canon(node) -> str:
  op = node[0]
  if op == "num":
    return str(node[1])
  if op in ("+", "-", NEG):
    pos, neg = [], []
    _flatten(node, True, pos, neg, "+-")
    body = "+".join(sorted(pos))
    if neg:
      body += "-" + "-".join(sorted(neg))
    return f"({body})"
  num, den = [], []
  _flatten(node, True, num, den, "*/")
  body = "*".join(sorted(num))
  if den:
    body += "/" + "/".join(sorted(den))
  return f"({body})"


def _flatten(node, sign, pos, neg, ops):
  op = node[0]
  if op == NEG and ops == "+-":  # A negation is a term of the sum, sign flipped.
    _flatten(node[1], not sign, pos, neg, ops)
  elif op in ops:
    _flatten(node[1], sign, pos, neg, ops)
    # The second op of the pair ('-' or '/') inverts its right operand.
    _flatten(node[2], sign if op == ops[0] else not sign, pos, neg, ops)
  else:
    (pos if sign else neg).append(_canon(node))
