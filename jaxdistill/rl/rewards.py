"""Formatting rewards added to the verifier's for the teachers' GRPO stage.

The paper refines its Science and MedReason teachers with GRPO on the sum of
a correctness reward (2.0 for the right option) and formatting rewards "for
exactly one pair of <think> and <answer> tags, the correct ordering of these
tags, and strict adherence to the required response structure", each at
most 0.5 (App. D.2.2). It gives no formula; `think_answer_terms` is ours:

  tags    0.125 for each of <think>, </think>, <answer>, </answer> that
          appears exactly once (0.5 when all four do)
  order   0.5 when all four appear and their first occurrences come in the
          order <think> </think> <answer> </answer>
  strict  0.5 when the whole response is <think>...</think>, then only
          whitespace, then <answer>X</answer> with X one option letter
          (whitespace allowed around X and the whole), and nothing else:
          Table 1's structure (the reasoning may not hold another tag)

So a response that is exactly in the required form gets 1.5 on top of its
correctness reward, and partial forms get partial credit (graded, as the
paper's "at most 0.5" suggests).
"""
from __future__ import annotations

from collections.abc import Sequence
import re

import numpy as np

from jaxdistill.tasks import mcq

# grpo.format_reward: None (the verifier's reward alone) or the above.
FORMAT_REWARDS = (None, "think_answer")
TAGS = ("<think>", "</think>", "<answer>", "</answer>")
PART = 0.5  # the most each formatting component contributes

_STRICT = re.compile(
    r"\A\s*<think>(?:(?!</?(?:think|answer)>).)*</think>\s*"
    r"<answer>\s*(?P<letter>[A-Za-z])\s*</answer>\s*\Z", re.DOTALL)


def think_answer_terms(text: str, num_options: int | None = None
                       ) -> tuple[float, float, float]:
  """(tags, order, strict) of one response; see the module docstring.
  `num_options`: the letters offered (A.. of that many; None: any A..Z)."""
  counts = [text.count(t) for t in TAGS]
  tags = PART / len(TAGS) * sum(c == 1 for c in counts)
  first = [text.find(t) for t in TAGS]
  order = PART if min(first) >= 0 and first == sorted(first) else 0.0
  m = _STRICT.match(text)
  k = mcq.MAX_OPTIONS if num_options is None else int(num_options)
  strict = PART if m and m["letter"].upper() in mcq.LETTERS[:k] else 0.0
  return tags, order, strict


def format_bonus(texts: Sequence[str], num_options=None, *, group: int = 1
                 ) -> np.ndarray:
  """[len(texts)] float32 sums of think_answer_terms; `num_options` [B] per
  prompt (text i answers prompt i // group; <= 0: not a multiple-choice
  prompt, any letter) or None."""
  out = np.zeros(len(texts), np.float32)
  for i, text in enumerate(texts):
    k = None if num_options is None else int(num_options[i // group])
    out[i] = sum(think_answer_terms(text, k if k and k > 0 else None))
  return out
