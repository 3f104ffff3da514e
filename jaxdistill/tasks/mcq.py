"""Multiple-choice science and medical questions: prompt, answer extraction, reward.

A record is `{question: str, options: list[str], answer: 'A'..}` (see
jaxdistill.data.sources). `build_prompt` asks the model to reason and finish with
"The answer is: X"; the paper's prompts (Table 1: `science_prompt`,
`medreason_prompt`) ask for the letter inside <answer>...</answer>. The
grading rule, which reads both, is `extract_answer`'s docstring.
"""
from __future__ import annotations

from collections.abc import Sequence
import re
import string

MAX_SCAN_CHARS = 32_768
MAX_OPTIONS = 26
LETTERS = string.ascii_uppercase

# Runs of whitespace and markup are bounded ({0,4}, {0,12}) so that adjacent
# optional pieces cannot backtrack quadratically on hostile text.
_VERB = (r"(?:is|(?:would|should|must|will)\s{1,4}be)(?![a-z0-9'’])"
         r"\s{0,4}[:：]?")
# "the answer to this question is", "the correct answer here is".
_QUALIFIER = (r"(?:\s{1,4}(?:here|then|now|(?:to|for|of)\s{1,4}(?:this|the)"
              r"\s{1,4}(?:question|problem|mcq)))?")
_STATEMENT = re.compile(
    r"(?i)(?<![a-z])(?:"
    r"(?:answer|(?:correct|right|best)\s{1,4}(?:option|choice))"
    rf"{_QUALIFIER}[*_]{{0,2}}\s{{0,4}}(?:{_VERB}|[:：=]|-{{1,2}}(?!\w)|[–—])"
    # MedMCQA's "Ans. is 'b' i.e., ...", "Ans: B", "Ans. B".
    rf"|ans(?![a-z])(?:\.?[*_]{{0,2}}\s{{0,4}}(?:{_VERB}|[:：=]|-{{1,2}}(?!\w))"
    r"|\.))")
# Between the statement and the letter: "probably", "option", "letter".
_FILLER = re.compile(
    r"(?i)\s{0,4}(?:(?:therefore|thus|hence|clearly|definitely|probably|"
    r"likely|most\s{1,4}likely|indeed|then|so|actually)(?![a-z])[\s:,]{0,4})?"
    r"(?:[*_]{0,2}(?:option|choice|letter)(?![a-z])[*_]{0,2})?")
_OPEN = (r"(?:[\s*_`\"'‘(\[{$]|\\[(\[]|"
         r"\\(?:text|textbf|textrm|texttt|mathrm|mathbf|mathtt|mathit|emph)"
         r"\s?\{){0,12}")
_CLOSE = r"(?:[*_`\"'’)\]}$]|\\[)\]]){0,12}"
_LETTER = re.compile(f"(?P<open>{_OPEN})(?P<letter>[A-Za-z])(?P<close>{_CLOSE})")
# What may follow a bare lower-case letter for it to be an answer, not a word
# (also MedMCQA's "Ans. is b i.e. Thiamine").
_ENDS = re.compile(r"(?i)[ \t]{0,4}(?:\Z|\n|[.,;!?](?:\s|\Z)|i\.?\s?e\.?(?![a-z]))")
# A second letter after these makes a statement ambiguous.
_ALTERNATIVE = re.compile(
    r"(?i)[ \t]{0,4}(?:and\s{0,2}/\s{0,2}or|(?:or|and)(?![a-z])|/|&|\+|,|;)")
# Right after a letter: "B is the correct answer", "option B is correct."
_REVERSE = re.compile(
    r"(?i)[ \t]{0,4}(?:is|would\s{1,4}be)\s{1,4}(?:"
    r"the\s{1,4}(?:(?:correct|right|best|most\s{1,4}likely)\s{1,4})?"
    r"(?:answer|option|choice)(?![a-z])|(?:correct|right)[ \t]{0,4}(?:[.!\n]|\Z))")
# Before such a letter (and its opening markup): "option", or a clause start
# ("Therefore, B is ...").
_MARKUP_BEFORE = r"[\s*_`\"'‘(\[{$]{0,8}\Z"
_NAMED = re.compile(r"(?i)(?<![a-z])(?:option|choice|letter)" + _MARKUP_BEFORE)
_LEAD = re.compile(r"(?i)(?:\A|[.,;:!?\n]|(?<![a-z])(?:so|thus|therefore|"
                   r"hence|clearly|then|and))" + _MARKUP_BEFORE)
_BOXED = re.compile(r"\\boxed\s{0,2}\{")
_BOXED_MAX = 64
_LINE_MAX = 40
_BACK = 48
_GAP = re.compile(r"[ \t]{1,4}")
_CLAUSE = re.compile(r"[ \t]{1,4}(?!(?:and|or)(?![a-z]))[a-z]")
_OPEN_TAG, _CLOSE_TAG = "<answer>", "</answer>"
_NONE = "no letter"  # A statement that names letters but no answer.
_NOT = re.compile(r"(?i)not(?![a-z])")
_NOT_TAG = "not"  # ("not", X): "the answer is not X" withdraws X only.
# Before the letter inside an <answer> block: "<answer>Option C</answer>".
_BLOCK_NAME = re.compile(r"(?i)\s{0,4}(?:option|choice|letter)(?![a-z])[\s:]{0,4}")
# A line that starts a new question or turn ("Question:", "Q2.", "**Problem
# 3**:", "User:", a chat template's turn marker): a model that goes on after
# its answer into a question of its own invents that question's answer too.
_RUN_ON = re.compile(
    r"(?im)^[ \t>#*_]{0,8}(?:(?:question|problem|q)"
    r"(?:[ \t]{0,2}#?[ \t]{0,2}\d{1,4})?[ \t*_]{0,4}(?:[:.)]|$)"
    r"|(?:user|human)[ \t]{0,2}:|<\|(?:im_start|start_header_id|user)\|>)")


def build_prompt(question: str, options: Sequence[str]) -> str:
  """The user message: question, lettered options, answer-format instruction."""
  if not options or len(options) > MAX_OPTIONS:
    raise ValueError(f"options: need 1..{MAX_OPTIONS} options, got {len(options)}")
  lines = [question.strip(), ""]
  lines += [f"{LETTERS[i]}. {str(o).strip()}" for i, o in enumerate(options)]
  lines += ["", "Think step by step, then finish with a line of the form "
            "'The answer is: X', where X is the letter of the correct option."]
  return "\n".join(lines)


SCIENCE_SYSTEM = "You are a careful solver of multiple-choice science questions."
SCIENCE_INSTRUCTION = (
    "Given a question and four options, select the correct answer. Reason step "
    "by step in <think>...</think> tags and place only the corresponding option "
    "letter (A, B, C, or D) in <answer>...</answer> tags.")
MEDREASON_SYSTEM = "You are a careful medical reasoning assistant."
MEDREASON_INSTRUCTION = (
    "Given a medical multiple-choice question and its answer choices, select "
    "the correct answer. Reason step by step in <think>...</think> tags and "
    "place only the letter corresponding to the correct option in "
    "<answer>...</answer> tags; do not repeat the answer text.")


def _table1(system, instruction, question, options) -> tuple[str, str]:
  """(system, user): Table 1's instruction, a blank line, the question, a
  blank line, one 'A. option' line per choice (the paper does not give the
  layout of the appended question; this one is ours)."""
  if not options or len(options) > MAX_OPTIONS:
    raise ValueError(f"options: need 1..{MAX_OPTIONS} options, got {len(options)}")
  lines = [instruction, "", str(question).strip(), ""]
  lines += [f"{LETTERS[i]}. {str(o).strip()}" for i, o in enumerate(options)]
  return system, "\n".join(lines)


def science_prompt(question: str, options: Sequence[str]) -> tuple[str, str]:
  """(system, user) of the paper's Science prompt (Table 1), verbatim."""
  return _table1(SCIENCE_SYSTEM, SCIENCE_INSTRUCTION, question, options)


def medreason_prompt(question: str, options: Sequence[str]) -> tuple[str, str]:
  """(system, user) of the paper's MedReason prompt (Table 1), verbatim."""
  return _table1(MEDREASON_SYSTEM, MEDREASON_INSTRUCTION, question, options)


# Table 1's prompts by name: an MCQ record with field `prompt` set to one of
# these is asked with it (tasks.prompt_messages); data.prompt / a suite's
# `prompt` sets the field.
PROMPTS = {"science": science_prompt, "medreason": medreason_prompt}


def check_prompt(name, field: str) -> None:
  if name is not None and name not in PROMPTS:
    raise ValueError(f"{field}: expected None (the project's prompt) or one "
                     f"of Table 1's {sorted(PROMPTS)}, got {name!r}")


def _check_num_options(num_options) -> int:
  if num_options is None:
    return MAX_OPTIONS
  if (isinstance(num_options, bool) or not isinstance(num_options, int)
      or not 1 <= num_options <= MAX_OPTIONS):
    raise ValueError(f"num_options must be an int in [1, {MAX_OPTIONS}], "
                     f"got {num_options!r}")
  return num_options


def _letter_at(text: str, pos: int, offered: str):
  """(letter, close markup, end) of an answer letter at `pos`, or None.

  The letter must stand alone (no letter or digit touches it) and be offered;
  a lower-case one must be wrapped in markup, be an option label ("b)") or end
  the statement (rule 4).
  """
  m = _LETTER.match(text, pos)
  if m is None:
    return None
  i, j = m.start("letter"), m.end("letter")
  if (i > 0 and text[i - 1].isalnum()) or (j < len(text) and text[j].isalnum()):
    return None
  letter, close = m.group("letter"), m.group("close")
  if letter.islower() and not (
      (m.group("open").strip() and close) or close.startswith(")")
      or _ENDS.match(text, m.end())):
    return None
  if letter.upper() not in offered:
    return None
  return letter.upper(), close, m.end()


def _second(text: str, end: int, offered: str) -> str | None:
  """A further letter listed after the one ending at `end` ("A, C", "A or C")."""
  alt = _ALTERNATIVE.match(text, end)
  if alt is None:  # "A C" lists two letters when C ends the statement.
    gap = _GAP.match(text, end)
    other = _letter_at(text, gap.end(), offered) if gap else None
    if (other is None or not text[gap.end()].isupper()
        or not _ENDS.match(text, other[2])):
      return None
    return other[0]
  other = _letter_at(text, alt.end(), offered)
  if other is None:
    return None
  # After a comma or semicolon a letter followed by a word starts a clause
  # ("C, I think"; "B; C is a distractor").
  if alt.group().strip() in ",;" and _CLAUSE.match(text, other[2]):
    return None
  return other[0]


def _stated(text: str, pos: int, offered: str):
  """The letter a statement ending at `pos` names, _NONE, ("not", letter)
  for a negated one, or None.

  _NONE (two letters) still counts as the last statement; a negation
  withdraws only the letter it names (extract_answer).
  """
  pos = _FILLER.match(text, pos).end()
  negated = _NOT.match(text, pos)
  if negated:
    pos = _FILLER.match(text, negated.end()).end()
  found = _letter_at(text, pos, offered)
  if found is None:
    return None
  letter, _, end = found
  if negated:
    return (_NOT_TAG, letter)
  other = _second(text, end, offered)
  return _NONE if other is not None and other != letter else letter


def _stated_before(text: str, pos: int, offered: str) -> str | None:
  """The letter just before `pos` of "X is the correct answer", or None.

  It must start a clause or follow "option", so that "Vitamin B is the correct
  answer" names no letter.
  """
  start = max(0, pos - _BACK)
  m = re.search(f"(?P<open>{_OPEN})(?P<letter>[A-Za-z])(?P<close>{_CLOSE})\\Z",
                text[start:pos])
  if m is None:
    return None
  i = start + m.start("letter")
  if i > 0 and text[i - 1].isalnum():
    return None
  before = text[max(0, i - _BACK):i]
  named = _NAMED.search(before) is not None
  if not (named or _LEAD.search(before) or not before.strip(" \t*_")):
    return None
  letter = m.group("letter")
  if letter.islower() and not (named or (m.group("open").strip()
                                         and m.group("close"))):
    return None
  return letter.upper() if letter.upper() in offered else None


def _label(text: str, offered: str) -> str | None:
  """The letter if `text` is only a letter with markup, optionally followed
  (\\boxed{B) Paris}) by its option after '.', ':' or ')'."""
  found = _letter_at(text, 0, offered)
  if found is None:
    return None
  letter, close, end = found
  rest = text[end:].strip()
  return letter if not rest or rest[0] in ".:)" or close.endswith(")") else None


def _lone(line: str, offered: str) -> str | None:
  """The letter if `line` is nothing but a letter with markup (and a '.')."""
  found = _letter_at(line, 0, offered)
  return found[0] if found and line[found[2]:].strip() in ("", ".") else None


def _boxed(text: str, start: int) -> str | None:
  """The content of the braces opened just before `start`, or None."""
  depth = 1
  for i in range(start, min(len(text), start + _BOXED_MAX)):
    if text[i] == "{":
      depth += 1
    elif text[i] == "}":
      depth -= 1
      if depth == 0:
        return text[start:i]
  return None


def _statements(tail: str, offered: str) -> list[tuple[int, str]]:
  """(position, letter or _NONE) of every answer statement in `tail`."""
  found = []
  for m in _STATEMENT.finditer(tail):
    found.append((m.start(), _stated(tail, m.end(), offered)))
  for m in _REVERSE.finditer(tail):
    found.append((m.start(), _stated_before(tail, m.start(), offered)))
  for m in _BOXED.finditer(tail):
    content = _boxed(tail, m.end())
    found.append((m.start(), None if content is None else _label(content, offered)))
  return [f for f in found if f[1]]


def _answer_block(tail: str) -> str | None:
  """The stripped content of the last complete, non-empty <answer>...
  </answer> block, or None (rfind keeps it linear)."""
  end = tail.rfind(_CLOSE_TAG)
  start = tail.rfind(_OPEN_TAG, 0, end) if end >= 0 else -1
  content = tail[start + len(_OPEN_TAG):end].strip() if start >= 0 else ""
  return content or None


def _last(found) -> str | None:
  """The answer of statements (position, letter / _NONE / ("not", X)):
  the last one wins; a negation withdraws the letter it names and is
  otherwise no statement ("The answer is B. The answer is not A because")."""
  answer = None
  for _, letter in sorted(found, key=lambda f: f[0]):
    if isinstance(letter, tuple):
      if letter[1] == answer:
        answer = _NONE
    else:
      answer = letter
  return None if answer == _NONE else answer


def _cut_run_on(tail: str, offered: str) -> str:
  """`tail` up to the first new question (_RUN_ON) that starts on a line
  after its first answer (a complete <answer> block or a statement naming a
  letter); all of it when there is none."""
  first = [pos for pos, letter in _statements(tail, offered)
           if isinstance(letter, str) and letter != _NONE]
  close = tail.find(_CLOSE_TAG)
  if close > 0 and tail.rfind(_OPEN_TAG, 0, close) >= 0:
    first.append(close)
  if not first:
    return tail
  m = _RUN_ON.search(tail, min(first))
  return tail if m is None else tail[:m.start()]


def _block_answer(content: str, offered: str) -> str | None:
  """The letter an <answer> block holds: one offered letter in markup,
  optionally after "option" and before its text ("B. Thiamine"), or the
  block's own statements ("The answer is C", \\boxed{C}); two letters, an
  unoffered one or none is no answer."""
  named = _BLOCK_NAME.match(content)
  label = _label(content[named.end():] if named else content, offered)
  if label is not None:
    return label
  return _last(_statements(content, offered))


def extract_answer(text: str, num_options: int | None = None) -> str | None:
  """The letter a person marking `text` would take as its answer, or None.

  The grading rule:

  0. Table 1's format first: when the completion has a complete, non-empty
     <answer>...</answer> block, the last such block is the answer and
     nothing outside it is read (a statement after it or in <think> does not
     count). Its content must be one offered letter in markup, possibly after
     "option" and before its text ("Option C", "B. Thiamine"), or hold one
     statement of rules 1-5 ("The answer is C", \\boxed{C}); two letters, a
     letter not offered or no letter is no answer. Without such a block:
  1. Only an explicit answer statement counts: "answer" (or "Ans", "Ans.")
     followed by "is", "would/should/must be", ":", "=" or a dash (The answer
     is X, Final Answer: X, Correct Answer - X, Ans. is 'x'), possibly with
     "here" or "to this question" between; "the correct option/choice is X";
     "X is the correct answer/option" or "option X is correct." where X
     starts the clause or follows "option" ("Vitamin B is the correct answer"
     names no letter); or \\boxed{X}. A letter merely mentioned ("answer A is a
     common distractor", "Option D needs more data") is not an answer.
  2. Among the statements, the LAST one (by position) wins: models restate or
     revise their choice, and the final statement is the answer.
  3. X is a letter the question offers (`num_options`, default all 26; with
     four options "The answer is: E" states nothing and is skipped) standing
     alone as a word ("The answer is Aspirin" is not A), possibly in markup:
     **X**, *X*, (X), [X], X., X), $X$, \\text{X}, \\textbf{X}, \\mathrm{X},
     `X`, 'X'. A hedge or a noun may sit between ("the answer is probably B",
     "the answer is option B").
  4. Lower-case letters count where they cannot be an English word: wrapped
     in markup ((b), **b**, 'b', \\boxed{b}), an option label ("b) Thiamine")
     or ending the statement ("the answer is b.", "Answer: c", "Ans. is b i.e.
     ..."); "the answer is a bit unclear" has no answer.
  5. A statement naming two letters ("B or C", "B/C", "A, C", "A; C",
     "A and/or D", "A C") is no answer, and as the last statement leaves the
     completion without one. A negated statement ("the answer is not B")
     names no answer: it withdraws B if B was the answer so far ("The answer
     is B. Wait, the answer is not B." has none) and is otherwise not a
     statement ("The answer is B. The answer is not A because ..." is B).
  6. Only when no statement names any letter, a last line that is nothing but
     the letter ("**B**") is the answer; a stray letter on the last line (a
     completion cut while re-listing the options) never overrides a statement.
  7. A completion that, after its first answer (a statement naming a letter
     or a complete <answer> block), goes on into a new question of its own (a
     line starting "Question:", "Q2.", "Problem 3:", "User:" or a chat turn
     marker) is graded on the text before that line: the run-on question's
     answer is not this question's.

  Only the final MAX_SCAN_CHARS characters are searched, so hostile megabyte
  completions cost bounded time. An unparseable completion yields None, which
  scores 0 and is counted separately (`parsed` in `score`).
  """
  if not isinstance(text, str):
    raise ValueError(f"text must be a str, got {type(text).__name__}")
  offered = LETTERS[:_check_num_options(num_options)]
  scanned = text[-MAX_SCAN_CHARS:]
  tail = _cut_run_on(scanned, offered)
  block = _answer_block(tail)
  if block is not None:
    return _block_answer(block, offered)
  found = _statements(tail, offered)
  if found:
    return _last(found)
  body = tail.rstrip()
  line = body[body.rfind("\n") + 1:].strip()
  # (A line that starts before the scanned tail is not looked at.)
  if len(line) <= _LINE_MAX and ("\n" in body or len(scanned) == len(text)):
    return _lone(line, offered)
  return None


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
