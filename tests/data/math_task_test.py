"""The math task end to end on the host: App. A.3's prompt through the chat
template, batches carrying the reference answers, and scoring by symbolic
equivalence (math-verify) of the last balanced \\boxed{}."""
import numpy as np
import pytest

pytest.importorskip("math_verify")

from jaxdistill import tasks  # pylint: disable=g-import-not-at-top
from jaxdistill.data import pipeline  # pylint: disable=g-import-not-at-top

# App. A.3, written here from the paper (Qwen2.5-Math's recommended prompt).
PAPER_SYSTEM = ("Please reason step by step, and put your final answer "
                "within \\boxed{}.")
RECORDS = [
    {"problem": "What is $1/2$ as a decimal?", "answer": "0.5",
     "solution": "It is $\\boxed{0.5}$.", "origin": "math"},
    {"problem": "Simplify $\\frac{2}{4}$.", "answer": "\\frac{1}{2}",
     "solution": "$\\boxed{\\frac{1}{2}}$", "origin": "math500"},
    {"problem": "Compute $\\{a\\}$ nested.", "answer": "\\frac{a}{\\sqrt{b}}",
     "solution": "", "origin": "math500"},
]


def test_record_is_math_with_the_papers_prompt():
  r = RECORDS[0]
  assert tasks.task_of(r) == tasks.MATH
  assert tasks.prompt_messages(r) == (PAPER_SYSTEM, r["problem"])
  assert tasks.reference_response(r) == r["solution"]
  with pytest.raises(ValueError, match="solution"):
    tasks.reference_response(RECORDS[2])


def test_prompt_batches_use_the_chat_template(tiny_tokenizer):
  tok = tiny_tokenizer
  b = pipeline.make_prompt_batches(RECORDS, tok, batch_size=3,
                                   max_prompt_len=512, seed=0, shuffle=False,
                                   num_epochs=1)[0]
  for row, r in enumerate(RECORDS):
    want = tok.apply_chat_template(
        [{"role": "system", "content": PAPER_SYSTEM},
         {"role": "user", "content": r["problem"]}],
        tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"]
    got = np.asarray(b["prompt"][row])[np.asarray(b["prompt_mask"][row]) == 1]
    assert got.tolist() == list(want)
  assert b["task"].tolist() == [tasks.MATH] * 3
  assert list(b["reference"]) == [r["answer"] for r in RECORDS]


@pytest.mark.parametrize("reference,texts,want", [
    # Equivalent forms of one half.
    ("0.5", ["\\boxed{\\frac{1}{2}}", "so \\boxed{1/2}.", "\\boxed{0.5}"],
     [1, 1, 1]),
    ("\\frac{1}{2}", ["\\boxed{0.5}", "\\boxed{\\dfrac12}"], [1, 1]),
    # Unbalanced, empty, unboxed, and an earlier right box overridden.
    ("0.5", ["\\boxed{0.5", "\\boxed{}", "0.5", "\\boxed{0.5} no, \\boxed{2}"],
     [0, 0, 0, 0]),
    # Nested braces inside the box.
    ("\\frac{a}{\\sqrt{b}}", ["\\boxed{\\frac{a}{\\sqrt{b}}}",
                              "\\boxed{\\frac{a}{b}}"], [1, 0]),
])
def test_score_batch_by_equivalence(reference, texts, want):
  batch = {"task": np.array([tasks.MATH], np.int32),
           "numbers": np.full((1, 6), -1, np.int32),
           "target": np.array([-1], np.int32), "gold": np.array([-1], np.int32),
           "reference": np.array([reference], object)}
  got = tasks.score_batch(texts, batch)
  assert got["reward"].tolist() == want
  # An answer was extracted: a balanced, non-empty last box (by hand).
  parsed = [t.rstrip(".").endswith("}") and "\\boxed{}" not in t
            and t.count("{") == t.count("}") for t in texts]
  assert got["parsed"].tolist() == parsed


def test_math_rows_without_references_are_refused():
  batch = {"task": np.array([tasks.MATH], np.int32),
           "numbers": np.full((1, 6), -1, np.int32),
           "target": np.array([-1], np.int32), "gold": np.array([-1], np.int32)}
  with pytest.raises(ValueError, match="reference"):
    tasks.score_batch(["\\boxed{1}"], batch)
