"""Math answers: the last \\boxed{} of a response, scored by symbolic
equivalence with the reference (the paper's Numina-MATH / MATH-500 verifier,
App. A.3).

Extraction is ours: the content of the response's last balanced \\boxed{...}
(or \\fbox{...}); none, an unbalanced or an empty box scores 0, so an answer
stated outside the box never counts. Equivalence is math-verify's (Hugging
Face's maintained LaTeX -> SymPy checker: 1/2 = 0.5 = \\frac12, 10\\% = 0.1,
set order, expanded polynomials, `x=3` = `3`); an answer it cannot parse
scores 0. math-verify is an optional dependency (`pip install
jaxdistill[math]`), imported on first use.

The prompt is Qwen2.5-Math's recommended one (the paper's, A.3): SYSTEM as
the system message, the problem as the user message.
"""
from __future__ import annotations

import threading

SYSTEM = ("Please reason step by step, and put your final answer within "
          "\\boxed{}.")
_OPENERS = ("\\boxed{", "\\fbox{")


def last_boxed(text: str) -> str | None:
  """The content of the last balanced \\boxed{...} / \\fbox{...} of `text`;
  None if there is none, or the last one is unbalanced or empty."""
  start = max(text.rfind(o) for o in _OPENERS)
  if start < 0:
    return None
  i = text.index("{", start) + 1
  depth = 1
  for j in range(i, len(text)):
    ch = text[j]
    if ch == "{":
      depth += 1
    elif ch == "}":
      depth -= 1
      if depth == 0:
        inner = text[i:j].strip()
        return inner or None
  return None


def _math_verify():
  try:
    import math_verify  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("math answers need math-verify: pip install "
                      "'jaxdistill[math]' (or pip install math-verify)") from e
  return math_verify


def _parse(mv, latex: str, timeout):
  cfg = [mv.LatexExtractionConfig(boxed_match_priority=0)]
  return mv.parse(f"${latex}$", extraction_config=cfg,
                  parsing_timeout=timeout)


def reference_answer(reference: str) -> str:
  """A reference as stored: a bare answer, or a worked solution whose last
  \\boxed{} is the answer (NuminaMath-CoT, MATH)."""
  boxed = last_boxed(reference)
  if boxed is not None:
    return boxed
  if any(o in reference for o in _OPENERS):
    raise ValueError(f"reference {reference[:80]!r}: its last \\boxed{{}} is "
                     "unbalanced or empty")
  if not reference.strip():
    raise ValueError("reference: empty")
  return reference.strip()


def score(response: str, reference: str) -> float:
  """1.0 if the response's last \\boxed{} is equivalent to the reference's
  answer, else 0.0."""
  answer = last_boxed(response)
  if answer is None:
    return 0.0
  mv = _math_verify()
  # math-verify's timeouts use SIGALRM, which only the main thread can set.
  timeout = 5 if threading.current_thread() is threading.main_thread() else None
  gold = _parse(mv, reference_answer(reference), timeout)
  pred = _parse(mv, answer, timeout)
  if not gold or not pred:
    return 0.0
  return float(mv.verify(gold, pred, timeout_seconds=timeout))
