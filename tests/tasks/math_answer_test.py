"""The math verifier: last-box extraction (written here by hand) and
symbolic equivalence through math-verify, on hostile cases."""
import pytest

pytest.importorskip("math_verify")

from jaxdistill.tasks import math_answer  # pylint: disable=g-import-not-at-top


@pytest.mark.parametrize("text,want", [
    ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
    ("\\boxed{1} then \\boxed{2}", "2"),                 # the last box
    ("\\boxed{\\frac{a}{\\sqrt{b}}}", "\\frac{a}{\\sqrt{b}}"),  # nested braces
    ("\\fbox{7}", "7"),
    ("the answer is 3", None),
    ("\\boxed{}", None),
    ("\\boxed{  }", None),
    ("\\boxed{\\frac{1}{2}", None),                      # unbalanced
    ("\\boxed{4} and \\boxed{", None),                   # last one unbalanced
])
def test_last_boxed(text, want):
  assert math_answer.last_boxed(text) == want


@pytest.mark.parametrize("response,reference", [
    ("\\boxed{0.5}", "\\frac{1}{2}"),
    ("\\boxed{\\frac12}", "1/2"),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}"),
    ("\\boxed{(x+1)^2}", "x^2+2x+1"),
    ("\\boxed{\\{2, 1\\}}", "\\{1,2\\}"),
    ("\\boxed{10\\%}", "0.1"),
    ("wrong first \\boxed{3}, fixed: \\boxed{4}", "4"),
    # A worked solution as the reference: its last box is the answer.
    ("\\boxed{12}", "Adding, $5+7=\\boxed{12}$."),
])
def test_equivalent_forms_score(response, reference):
  assert math_answer.score(response, reference) == 1.0


@pytest.mark.parametrize("response,reference", [
    ("\\boxed{3}", "2"),
    ("\\boxed{0.50001}", "\\frac{1}{2}"),
    ("\\boxed{[0,1)}", "[0,1]"),
    ("\\boxed{(1,2)}", "(2,1)"),
    ("\\boxed{x^2+1}", "(x+1)^2"),
    ("the answer is 2", "2"),                           # not boxed
    ("2 \\boxed{}", "2"),                               # empty box
    ("\\boxed{2} but really \\boxed{3}", "2"),          # the last box counts
    ("\\boxed{2", "2"),                                 # unbalanced
    ("\\boxed{\\frac{}{}}", "1"),                       # unparseable
    ("\\boxed{banana}", "7"),
])
def test_wrong_answers_never_score(response, reference):
  assert math_answer.score(response, reference) == 0.0


@pytest.mark.parametrize("reference", ["", "  ", "see \\boxed{", "\\boxed{}"])
def test_a_bad_reference_is_refused(reference):
  with pytest.raises(ValueError, match="reference"):
    math_answer.score("\\boxed{1}", reference)
