"""Multiple-choice answer extraction and reward."""
import time

import numpy as np
import pytest

from jaxdistill import tasks
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
    ("The answer is: b", "B"),         # Lower-case, ending the statement.
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


# Completions as models write them, each with the letter a person marking it
# would take as its answer (None: no answer), and the options offered.
# (text, num_options, expected)
GRADED = [
    # The four cases of issue 31: a later mention is not an answer.
    ("The answer is: B. Note that answer A is a common distractor.", 4, "B"),
    ("The answer is: B (answer D would need more data)", 4, "B"),
    ("Answer: B\nAnswer A is wrong because it ignores friction.", 4, "B"),
    ("Answer: $B$", 4, "B"),
    # Distractors discussed after the answer.
    ("Neon is inert, so the answer is C. Option A (iron) reacts with oxygen "
     "and option D is a compound.", 4, "C"),
    ("The answer is (D). Choice B might look right, but B is a salt.", 4, "D"),
    ("Answer: A\n\nWhy not C? C only holds at low pressure.", 4, "A"),
    ("The correct answer is B, not A.", 4, "B"),
    # Hedges and revisions: the last statement.
    ("It could be A or B. Checking the units, the answer is B.", 4, "B"),
    ("I first thought the answer is A. Re-reading the question, the answer is "
     "D.", 4, "D"),
    ("The answer is probably C.", 4, "C"),
    ("Between B and C, I'd go with C.\nThe answer is: C", 4, "C"),
    ("The answer is B or C.", 4, None),            # Two letters: no answer.
    ("The answer is A/B", 4, None),
    ("The answer is not B.", 4, None),
    ("Both A and C seem plausible; I cannot decide.", 4, None),
    # Markdown.
    ("**Answer:** **(B)**", 4, "B"),
    ("The correct answer is: **C) Mitochondria**", 4, "C"),
    ("### Final Answer\nThe answer is *D*.", 4, "D"),
    ("Step 1: ...\nStep 2: ...\n\n**B**", 4, "B"),    # A last line of its own.
    ("Options A and B are wrong.\nC", 4, "C"),
    ("The answer is `A`", 4, "A"),
    # LaTeX.
    (r"Therefore, the final answer is $\boxed{C}$.", 4, "C"),
    (r"**Final Answer:** $\boxed{\text{C}}$", 4, "C"),
    (r"The answer is \textbf{D}.", 4, "D"),
    (r"Answer: $\mathrm{A}$", 4, "A"),
    (r"\boxed{B) 12 mg} since 3 \times 4 = 12", 4, "B"),
    (r"The answer is \(\boxed{A}\), and \(B\) is the distractor.", 4, "A"),
    # Lower case: a letter, never a word.
    ("the answer is: b", 4, "B"),
    ("answer: c", 4, "C"),
    ("so the answer is (a) because of the dose", 4, "A"),
    ("the answer is a bit unclear", 4, None),
    ("the answer is a mix of both", 4, None),
    # Options beyond D, when the question offers them.
    ("The answer is (F) 12 mg/kg", 6, "F"),
    ("The answer is (F) 12 mg/kg", 4, None),
    ("Answer: J", 10, "J"),
    ("The answer is I", 10, "I"),
    ("The answer is I think C", 4, None),          # I is not offered.
    # No statement at all.
    ("Option B seems right but I am not sure.", 4, None),
    ("The mitochondria is the powerhouse of the cell.", 4, None),
    ("The answer is Aspirin.", 4, None),
]


@pytest.mark.parametrize("text,num_options,expected", GRADED,
                         ids=[f"graded{i}" for i in range(len(GRADED))])
def test_extract_answer_grades_as_a_person(text, num_options, expected):
  assert mcq.extract_answer(text, num_options) == expected
  gold = expected or "A"
  assert mcq.reward(text, gold, num_options) == (1.0 if expected else 0.0)


# Realistic completions (Qwen2.5 / Llama 3 chat, MedMCQA explanations), each
# with the letter a careful person marking it would take. The first twelve are
# issue 44's: every one was graded wrongly before.
# (text, num_options, expected)
REALISTIC = [
    # The cases.
    ("The answer is: A, C", 4, None),
    ("The answer is A,C", 4, None),
    ("The answer is A and/or C", 4, None),
    ("The answer is: C.\n\nA", 4, "C"),
    ("So the answer to this question is (B).", 4, "B"),
    ("The correct answer here is C.", 4, "C"),
    ("Therefore, option B is the correct answer.", 4, "B"),
    ("B is the correct answer.", 4, "B"),
    ("Ans. is 'b' i.e., Thiamine", 4, "B"),
    ("Ans: B. Thiamine", 4, "B"),
    ("Correct Answer - C", 4, "C"),
    ("The answer is b) Hypothyroidism", 4, "B"),
    # Qwen2.5 chat style.
    ("To determine the correct answer, let's analyze each option:\n\n"
     "A. Oxygen - released, not absorbed.\nB. Carbon dioxide - absorbed.\n"
     "C. Nitrogen - not used directly.\n\nTherefore, the correct answer is:\n\n"
     "**B. Carbon dioxide**", 4, "B"),
    ("Let's evaluate each option:\n- **Option A**: incorrect.\n- **Option C**: "
     "correct, since the enzyme needs zinc.\n\nSo, the answer is **C**.", 4, "C"),
    ("Given the symptoms, the most likely diagnosis is hypothyroidism.\n\n"
     "The answer is: D", 4, "D"),
    ("The correct answer is **(A) Heart**.", 4, "A"),
    ("Thus, the correct choice is **C**.", 4, "C"),
    ("Hence, option (D) is correct.", 4, "D"),
    ("Option A is correct only in a vacuum, so the answer is C.", 4, "C"),
    ("The answer is B.\n\nA. Oxygen\nB. Carbon", 4, "B"),   # cut re-listing
    # Llama 3 chat style.
    ("## Step 1: Recall the symbol of sodium\nSodium is Na.\n\n## Step 2: "
     "Match the options\nOption C is Na.\n\nThe final answer is: $\\boxed{C}$",
     4, "C"),
    ("The final answer is: $\\boxed{(B)}$", 4, "B"),
    ("The best answer is A.", 4, "A"),
    ("Answer: (c) Vitamin K deficiency", 4, "C"),
    # MedMCQA explanation style.
    ("Ans. is 'c' i.e., 5 mg Ref: KDT 6th ed p. 123", 4, "C"),
    ("Ans. (a) Hepatitis B virus", 4, "A"),
    ("Ans. D. Oxytocin", 4, "D"),
    ("Ans is 'd' ie Pernicious anemia", 4, "D"),
    ("Ans. is b i.e. Thiamine", 4, "B"),
    ("Ans. is a ie. Iron", 4, "A"),
    ("Correct Answer - A\nThe thyroid is the gland involved.", 4, "A"),
    ("Ans: c", 4, "C"),
    # Both cases, markdown, LaTeX.
    ("the correct option is (b).", 4, "B"),
    ("**Answer: C. Mitochondria**", 4, "C"),
    ("The correct answer is option **D**.", 4, "D"),
    (r"So the answer is $\text{(A)}$.", 4, "A"),
    (r"So the correct choice is \textbf{(A)}.", 4, "A"),
    (r"Hence \(\boxed{\mathrm{D}}\)", 4, "D"),
    ("**B** is the correct answer because it lowers the pressure.", 4, "B"),
    # Last explicit statement wins; a lone letter is only a fallback.
    ("I think the answer is B. Wait, re-reading it: the answer is C.", 4, "C"),
    ("The answer is: A. Hmm, no. The answer is not A.", 4, None),
    ("The answer is: D\n\n**Answer: D**\n\nB", 4, "D"),
    ("Answer: B\n\nQuestion 2. Which of these is a gas?\nA", 4, "B"),
    ("It is not A or D.\n\n**C**", 4, "C"),
    ("the answer is a bit unclear without the dose.\n\n**B**", 4, "B"),
    # Two letters, hedges, words that only look like letters.
    ("The answer is (B) or (C), depending on the age.", 4, None),
    ("The answer is A, B and C.", 4, None),
    ("The answers are: A, C", 4, None),
    ("The answer is C, not A.", 4, "C"),
    ("The answer is C, I believe.", 10, "C"),
    ("The answer is A, but only at low doses.", 4, "A"),
    ("Vitamin B is the correct answer.", 4, None),
    ("Hepatitis B is the correct answer, so the answer is C.", 4, "C"),
    ("Which is the correct answer? Let's think.", 4, None),
    ("This is the correct answer: none of them fits.", 4, None),
    ("Option B is not the correct answer.", 4, None),
    ("The answer is a) Aspirin", 4, "A"),
]


@pytest.mark.parametrize("text,num_options,expected", REALISTIC,
                         ids=[f"real{i}" for i in range(len(REALISTIC))])
def test_extract_answer_realistic_completions(text, num_options, expected):
  assert mcq.extract_answer(text, num_options) == expected
  gold = expected or "A"
  assert mcq.reward(text, gold, num_options) == (1.0 if expected else 0.0)


# Table 1's format: the last non-empty <answer> block is the answer, and
# nothing outside it is read; inside it one offered letter (in markup, after
# "option", before its text) or the block's own statement. Negations withdraw
# only the letter they name; "A; C" and "A C" list two letters. Each case in
# the first group was graded otherwise before (the old code took statements
# outside the block, or the first of two letters).
# (text, num_options, expected)
ANSWER_BLOCK = [
    ("<think>The answer is A</think><answer>A, C</answer>", 4, None),
    ("<think>The answer is A</think><answer>A or C</answer>", 4, None),
    ("<think>the answer is A</think><answer>E</answer>", 4, None),
    ("<think>x</think><answer>B</answer>\nThe answer is C", 4, "B"),
    ("<answer>Option C</answer>", 4, "C"),
    ("<think>Option (b) fits.</think>\n<answer>choice: b</answer>", 4, "B"),
    ("<think>So the answer is C.</think><answer>Thiamine</answer>", 4, None),
    ("The answer is B.\n\nThe answer is not A because A is a base.", 4, "B"),
    ("The answer is A; C", 4, None),
    ("The answer is: A C", 4, None),
    # Unchanged.
    ("<think>x</think><answer> C </answer>", 4, "C"),
    ("<think>x</think><answer>**D**</answer>", 4, "D"),
    ("<think>x</think><answer>B. Thiamine</answer>", 4, "B"),
    ("<answer>B</answer><answer>C</answer>", 4, "C"),
    ("<answer>The answer is C</answer>", 4, "C"),
    ("<answer>$\\boxed{C}$</answer>", 4, "C"),
    ("<think>The answer is B.</think><answer></answer>", 4, "B"),
    ("The answer is A. Wait, the answer is not A.", 4, None),
    ("The answer is not A.", 4, None),
    ("The answer is B; C is a distractor.", 4, "B"),
    ("The answer is A C-reactive protein", 4, "A"),
]


@pytest.mark.parametrize("text,num_options,expected", ANSWER_BLOCK,
                         ids=[f"block{i}" for i in range(len(ANSWER_BLOCK))])
def test_extract_answer_answer_block_negation_and_lists(text, num_options,
                                                        expected):
  assert mcq.extract_answer(text, num_options) == expected


def test_graded_table_covers_the_rule():
  assert len(GRADED) >= 30
  assert sum(e is None for _, _, e in GRADED) >= 8
  assert any(n > 4 and e and e > "D" for _, n, e in GRADED)


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


# Completions with four options (A-D) offered: (text, expected letter or None).
# Hand-written expectations: a letter counts only if the question offers it
# and it stands alone as a word.
TRICKY_4 = [
    ("The answer is I think C", None),          # 'I' is a word, not an option
    ("The answer is I", None),
    ("The answer is: E", None),                 # not offered
    ("The answer is: D", "D"),
    ("answer isB", None),                       # glued to 'is'
    ("The answer isn't clear; the answer is: A", "A"),
    ("The answer is: C. Wait, the answer is X", "C"),  # X not offered
    ("The answer is: B. Hmm, the answer is: D", "D"),
    (r"\boxed{Z} so \boxed{B}", "B"),
    (r"\boxed{E}", None),
    ("Answer: **A** and more", "A"),
    ("The answer is A.", "A"),
    ("The answer is AB", None),
    ("The answer is (C)", "C"),
]


@pytest.mark.parametrize("text,expected", TRICKY_4,
                         ids=[f"tricky{i}" for i in range(len(TRICKY_4))])
def test_extract_answer_only_offered_letters(text, expected):
  assert mcq.extract_answer(text, num_options=4) == expected
  gold = expected or "A"
  assert mcq.reward(text, gold, 4) == (1.0 if expected else 0.0)
  assert mcq.format_score(text, 4) == (1.0 if expected else 0.0)


def test_extract_answer_rejects_bad_num_options():
  for bad in (0, 27, 2.0, True):
    with pytest.raises(ValueError, match="num_options"):
      mcq.extract_answer("The answer is: A", num_options=bad)


def test_score_batch_uses_offered_options():
  batch = {"task": np.array([tasks.MCQ], np.int32),
           "numbers": np.full((1, 6), -1, np.int32),
           "target": np.array([-1], np.int32), "gold": np.array([2], np.int32),
           "num_options": np.array([4], np.int32)}
  out = tasks.score_batch(["The answer is I think C", "The answer is: C"], batch)
  np.testing.assert_array_equal(out["parsed"], [False, True])
  np.testing.assert_array_equal(out["reward"], [0, 1])


# A completion that answers, then runs on into a question of its own (with its
# own options and answer), is graded on its answer to this question: each of
# the first five was graded by the run-on's letter before. (text, expected)
RUN_ON = [
    ("So the answer is: B\n\nQuestion: Which gas is inert?\nA. O2\nB. N2\n"
     "C. Ar\nD. H2\nThe answer is: C", "B"),
    ("The answer is B.\n\n**Question 2:** 2+2?\nA) 3\nB) 4\nAnswer: D", "B"),
    ("<answer>B</answer>\nQ: and this one?\n<answer>D</answer>", "B"),
    ("The answer is A\nUser: what about this?\nThe answer is D", "A"),
    ("The answer is A\n<|im_start|>user\nnext\n<|im_start|>assistant\n"
     "The answer is D", "A"),
    # No answer before the new question's line: nothing is cut.
    ("Question: restated here.\nThe answer is C", "C"),
    ("Problem: find the organ.\nSo the answer is D", "D"),
    # A revision is not a new question.
    ("The answer is B. Wait, actually the answer is C.", "C"),
    ("The answer is B.\nQuestion is whether B holds; the answer is C", "C"),
]


@pytest.mark.parametrize("text,expected", RUN_ON,
                         ids=[f"runon{i}" for i in range(len(RUN_ON))])
def test_extract_answer_stops_at_a_run_on_question(text, expected):
  assert mcq.extract_answer(text, 4) == expected
  assert mcq.reward(text, expected, 4) == 1.0
