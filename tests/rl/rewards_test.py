"""The teachers' formatting rewards (rl/rewards.py) on hand-written responses."""
import numpy as np
import pytest

from jaxdistill.rl import rewards

GOOD = "<think>\nCells need energy, so the answer is B.\n</think>\n<answer>B</answer>"


@pytest.mark.parametrize("text,want", [
    # (tags, order, strict): tags 0.125 per tag present exactly once.
    (GOOD, (0.5, 0.5, 0.5)),
    ("  <think>x</think><answer> c </answer>\n", (0.5, 0.5, 0.5)),
    # Text after the answer: structure broken, tags and order kept.
    (GOOD + " Hope this helps!", (0.5, 0.5, 0.0)),
    # Text before the reasoning.
    ("Sure. " + GOOD, (0.5, 0.5, 0.0)),
    # A word, not a letter, in the answer.
    ("<think>x</think><answer>Mitochondria</answer>", (0.5, 0.5, 0.0)),
    # Answer before the reasoning: every tag once, wrong order.
    ("<answer>B</answer><think>x</think>", (0.5, 0.0, 0.0)),
    # Two answers: <answer> and </answer> twice (0.25 for the think pair).
    ("<think>x</think><answer>A</answer><answer>B</answer>", (0.25, 0.5, 0.0)),
    # A tag inside the reasoning.
    ("<think>x <answer>A</answer></think><answer>A</answer>", (0.25, 0.0, 0.0)),
    # No reasoning tags: only the answer pair.
    ("<answer>B</answer>", (0.25, 0.0, 0.0)),
    # Unclosed think.
    ("<think>x <answer>B</answer>", (0.375, 0.0, 0.0)),
    ("The answer is B.", (0.0, 0.0, 0.0)),
    ("", (0.0, 0.0, 0.0)),
])
def test_think_answer_terms_by_hand(text, want):
  assert rewards.think_answer_terms(text) == pytest.approx(want)


def test_strict_structure_needs_an_offered_letter():
  text = "<think>x</think><answer>E</answer>"
  assert rewards.think_answer_terms(text, num_options=5)[2] == 0.5
  assert rewards.think_answer_terms(text, num_options=4)[2] == 0.0


def test_format_bonus_sums_the_terms_per_prompt_options():
  texts = [GOOD, "<answer>B</answer>", "<think>x</think><answer>D</answer>",
           "<think>x</think><answer>D</answer>"]
  got = rewards.format_bonus(texts, np.array([4, 3]), group=2)
  # Prompt 1 offers 3 options: D is not one of them.
  np.testing.assert_allclose(got, [1.5, 0.25, 1.0, 1.0])
  # -1: not a multiple-choice prompt (data.pipeline's num_options): any letter.
  np.testing.assert_allclose(
      rewards.format_bonus(texts, np.array([-1, -1]), group=2),
      [1.5, 0.25, 1.5, 1.5])
  assert got.dtype == np.float32
  # At most 0.5 per component (App. D.2.2): 1.5 at most in all.
  assert rewards.format_bonus([GOOD]).max() == pytest.approx(3 * rewards.PART)
