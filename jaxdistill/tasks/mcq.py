"""Multiple-choice science and medical questions: prompt, answer extraction, reward.

A record is `{question: str, options: list[str], answer: 'A'..}` (see
jaxdistill.data.sources). The model is asked to reason and finish with
"The answer is: X". `extract_answer` accepts, case-insensitively for the
phrase but only with an upper-case letter (so "the answer is a bit" is not
read as A) that stands alone as a word and is one of the question's options
(`num_options`: with four options, "The answer is I think C" has no answer,
rather than the answer I):

  The answer is: X    The answer is X    answer is (X)    Answer: **X**
  \\boxed{X}           \\boxed{(X)}        \\boxed{\\text{X}}

When a completion contains several, the LAST one (by position) wins: models
often restate or revise their choice, and the final statement is the answer.
Only the final MAX_SCAN_CHARS characters are searched, so hostile megabyte
completions cost bounded time. An unparseable completion yields None, which
scores 0 and is counted separately (`parsed` in `score`).
"""
from __future__ import annotations

from collections.abc import Sequence
import re
import string

MAX_SCAN_CHARS = 32_768
MAX_OPTIONS = 26
LETTERS = string.ascii_uppercase

# The letter must be a word of its own: neither preceded ("answer isA") nor
# followed ("The answer is Aspirin" is not A) by another letter or digit. Wrappers like ** or ( ) or [ ] around it are tolerated.
# Whitespace runs are bounded ({0,4}) so that adjacent optional pieces cannot
# backtrack quadratically on hostile runs of spaces.
_PHRASE = re.compile(
    r"(?i:answer)\s{0,4}(?:(?i:is)\s{0,4})?[:：]?\s{0,4}[\*_]{0,2}\s{0,4}[\(\[]?"
    r"\s{0,4}(?:\\text\{)?(?<![A-Za-z0-9])([A-Z])(?![A-Za-z0-9])")
_BOXED = re.compile(
    r"\\boxed\{\s{0,4}(?:\\text(?:bf)?\{)?\s{0,4}\(?([A-Z])\)?\s{0,4}\}?\s{0,4}\}")


def build_prompt(question: str, options: Sequence[str]) -> str:
  """The user message: question, lettered options, answer-format instruction."""
  if not options or len(options) > MAX_OPTIONS:
    raise ValueError(f"options: need 1..{MAX_OPTIONS} options, got {len(options)}")
  lines = [question.strip(), ""]
  lines += [f"{LETTERS[i]}. {str(o).strip()}" for i, o in enumerate(options)]
  lines += ["", "Think step by step, then finish with a line of the form "
            "'The answer is: X', where X is the letter of the correct option."]
  return "\n".join(lines)


def _check_num_options(num_options) -> int:
  if num_options is None:
    return MAX_OPTIONS
  if (isinstance(num_options, bool) or not isinstance(num_options, int)
      or not 1 <= num_options <= MAX_OPTIONS):
    raise ValueError(f"num_options must be an int in [1, {MAX_OPTIONS}], "
                     f"got {num_options!r}")
  return num_options


def extract_answer(text: str, num_options: int | None = None) -> str | None:
  """The letter of the last answer statement in `text`, or None.

  Only the first `num_options` letters (the options the question offers;
  default all 26) count as answers: a statement naming any other letter is
  ignored.
  """
  if not isinstance(text, str):
    raise ValueError(f"text must be a str, got {type(text).__name__}")
  offered = LETTERS[:_check_num_options(num_options)]
  tail = text[-MAX_SCAN_CHARS:]
  best_pos, best = -1, None
  for pattern in (_PHRASE, _BOXED):
    for m in pattern.finditer(tail):
      if m.group(1) in offered and m.start() > best_pos:
        best_pos, best = m.start(), m.group(1)
  return best


def letter_index(letter: str) -> int:
  """'A' -> 0; ValueError for anything that is not one upper-case letter."""
  if not isinstance(letter, str) or len(letter) != 1 or letter not in LETTERS:
    raise ValueError(f"answer letter must be one of A..Z, got {letter!r}")
  return LETTERS.index(letter)


def reward(completion: str, gold_letter: str,
           num_options: int | None = None) -> float:
  """1.0 if the extracted letter equals `gold_letter`, else 0.0 (incl. unparseable)."""
  letter_index(gold_letter)
  return 1.0 if extract_answer(completion, num_options) == gold_letter else 0.0


def format_score(completion: str, num_options: int | None = None) -> float:
  """1.0 if an answer letter (one of the options) can be extracted, else 0.0."""
  return 0.0 if extract_answer(completion, num_options) is None else 1.0


def reference_completion(answer: str) -> str:
  """Minimal target text for a record whose answer is `answer`."""
  letter_index(answer)
  return f"The answer is: {answer}"
