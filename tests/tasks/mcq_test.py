"""Multiple-choice answer extraction and reward."""
import time

import pytest

from jaxdistill.tasks import mcq

# (text, expected letter or None)
EXTRACT = [
    ("The answer is: B", "B"),
    ("the answer is C.", "C"),
    ("The answer is D", "D"),
    ("So the answer is (A).", "A"),
    ("answer is (E)", "E"),
    ("Final Answer: C", "C"),
    ("The correct answer is: **B**", "B"),
    ("The answer is [D]", "D"),
    (r"Therefore \boxed{A}", "A"),
    (r"\boxed{(C)}", "C"),
    (r"\boxed{\text{B}}", "B"),
    (r"\boxed{ D }", "D"),
    # Last occurrence wins, across both forms.
    ("The answer is: A. Hmm, re-checking... The answer is: C", "C"),
    (r"\boxed{B} but the answer is D", "D"),
    (r"The answer is D, i.e. \boxed{B}", "B"),
    # Not answers.
    ("The answer is Aspirin", None),
    ("the answer is a bit unclear", None),
    ("I am not sure.", None),
    ("", None),
    (r"\boxed{Both}", None),
    ("The answer is: b", None),        # Lower-case letters are not options.
    ("answers: many", None),
    ("answer" + " " * 50_000 + "x", None),
    ("The answer is: B" + "z" * 1_000_000, None),  # Beyond the scan window.
    ("z" * 1_000_000 + "The answer is: B", "B"),
]


@pytest.mark.parametrize("text,expected", EXTRACT,
                         ids=[f"case{i}" for i in range(len(EXTRACT))])
def test_extract_answer_table(text, expected):
  start = time.perf_counter()
  assert mcq.extract_answer(text) == expected
  assert time.perf_counter() - start < 2.0


def test_reward_and_format_score():
  assert mcq.reward("The answer is: B", "B") == 1.0
  assert mcq.reward("The answer is: C", "B") == 0.0
  assert mcq.reward("no idea", "B") == 0.0
  assert mcq.format_score("no idea") == 0.0
  assert mcq.format_score("The answer is: C") == 1.0
  with pytest.raises(ValueError, match="letter"):
    mcq.reward("The answer is: B", "b")


def test_prompt_letters_options():
  text = mcq.build_prompt("Which is a noble gas?", ["Neon", "Iron", "Salt"])
  assert "A. Neon\nB. Iron\nC. Salt" in text
  assert "The answer is: X" in text
  with pytest.raises(ValueError, match="options"):
    mcq.build_prompt("q", [])
