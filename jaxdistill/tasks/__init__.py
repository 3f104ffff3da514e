"""Tasks: prompts and verifiers, and the glue from a batch row to its verifier.

A record is a plain dict. Countdown records carry `numbers`, `target` (and
`solution`), and those of the paper's Countdown sets also `variant` (a key
of countdown.PRESETS: Table 1's prompt, step-equation answers, the paper's
verifier; task id COUNTDOWN_STEPS); multiple-choice records carry
`question`, `options`, `answer` (and optionally `prompt`, a key of
mcq.PROMPTS: Table 1's science or MedReason prompt); arithmetic records carry
`expression` and `value`; math records (App. A.3's Numina-MATH and
MATH-500, data.numina_math) carry `problem` and `answer` (a LaTeX answer,
or a solution whose last \\boxed{} is one), optionally `solution`.
`task_of(record)` tells them apart, and batches from
jaxdistill.data.pipeline carry the same information as arrays ('task',
'numbers', 'target', 'gold'; 'reference', the math answer text), so `score_batch(texts, batch)` needs nothing
else to score completions.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from jaxdistill.tasks import arith
from jaxdistill.tasks import countdown
from jaxdistill.tasks import math_answer
from jaxdistill.tasks import mcq

COUNTDOWN, MCQ, ARITH, COUNTDOWN_STEPS, MATH = 0, 1, 2, 3, 4
TASK_NAMES = {COUNTDOWN: "countdown", MCQ: "mcq", ARITH: "arith",
              COUNTDOWN_STEPS: "countdown_steps", MATH: "math"}


def task_of(record: Mapping) -> int:
  """The task id of a record from its fields; ValueError if none fits."""
  if "numbers" in record and "target" in record:
    variant = record.get("variant")
    if variant is None:
      return COUNTDOWN
    if variant not in countdown.PRESETS:
      raise ValueError(f"record: Countdown variant {variant!r} is not one of "
                       f"{sorted(countdown.PRESETS)}")
    return COUNTDOWN_STEPS
  if "question" in record and "options" in record and "answer" in record:
    return MCQ
  if "expression" in record and "value" in record:
    return ARITH
  if "problem" in record and "answer" in record:
    return MATH
  raise ValueError(
      "record: expected Countdown fields (numbers, target), multiple-choice "
      "fields (question, options, answer), arithmetic fields (expression, "
      f"value) or math fields (problem, answer), got keys {sorted(record)}")


def prompt_messages(record: Mapping) -> tuple[str | None, str]:
  """(system, user) messages of a record before the chat template: the
  task's own system line (Table 1 for the paper's variants), else None."""
  t = task_of(record)
  if t == COUNTDOWN_STEPS:
    return countdown.table1_prompt(record["numbers"], record["target"])
  if t == MATH:  # Qwen2.5-Math's prompt, the paper's (App. A.3)
    return math_answer.SYSTEM, str(record["problem"])
  if t == MCQ and record.get("prompt") is not None:
    mcq.check_prompt(record["prompt"], "record: field 'prompt'")
    return mcq.PROMPTS[record["prompt"]](record["question"], record["options"])
  return None, prompt_text(record)


def prompt_text(record: Mapping) -> str:
  """The user message for a record (before the chat template)."""
  t = task_of(record)
  if t == COUNTDOWN_STEPS:
    return countdown.table1_prompt(record["numbers"], record["target"])[1]
  if t == COUNTDOWN:
    return countdown.build_prompt(record["numbers"], record["target"])
  if t == ARITH:
    return arith.build_prompt(record["expression"])
  if t == MATH:
    return str(record["problem"])
  if record.get("prompt") is not None:
    return prompt_messages(record)[1]
  return mcq.build_prompt(record["question"], record["options"])


def reference_response(record: Mapping) -> str:
  """Fixed response text for off-policy/SFT data: `record['response']` if
  present, else the Countdown solution's worked steps, else the MCQ answer line."""
  if record.get("response") is not None:
    return str(record["response"])
  t = task_of(record)
  if t == COUNTDOWN_STEPS:
    if not record.get("solution"):
      raise ValueError("record: Countdown record has no 'solution' or 'response'")
    return countdown.paper_reference_completion(
        record["numbers"], record["target"], record["solution"])
  if t == COUNTDOWN:
    if not record.get("solution"):
      raise ValueError("record: Countdown record has no 'solution' or 'response'")
    return countdown.reference_completion(
        record["numbers"], record["target"], record["solution"])
  if t == ARITH:
    return arith.reference_completion(record["expression"])
  if t == MATH:  # the data set's worked solution (it ends in the box)
    if not str(record.get("solution") or "").strip():
      raise ValueError("record: math record has no 'solution' or 'response'")
    return str(record["solution"])
  if record.get("prompt") is not None:  # Table 1's: the letter in <answer>.
    mcq.letter_index(record["answer"])
    return f"<answer>{record['answer']}</answer>"
  return mcq.reference_completion(record["answer"])


def score_batch(texts: Sequence[str], batch: Mapping[str, np.ndarray]) -> dict:
  """Rewards for completions of a prompt batch.

  `texts` has B * G entries for a batch of B prompts, prompt-major: text i
  answers prompt i // G (G samples per prompt, as for GRPO or pass@k).
  Returns float32 'reward' [B*G], 'format' [B*G] (the task's format score)
  and bool 'parsed' [B*G] (an answer could be extracted). Math rows need
  batch['reference'] (their answers, text).
  """
  task = np.asarray(batch["task"])
  b = task.shape[0]
  if b == 0 or len(texts) % b:
    raise ValueError(f"texts: {len(texts)} completions for {b} prompts; "
                     "need a positive multiple of the batch size")
  g = len(texts) // b
  numbers, target, gold = (np.asarray(batch[k]) for k in ("numbers", "target", "gold"))
  # Only the offered letters count as answers (absent: any of A..Z).
  n_opts = batch.get("num_options")
  out = {"reward": np.zeros(len(texts), np.float32),
         "format": np.zeros(len(texts), np.float32),
         "parsed": np.zeros(len(texts), bool)}
  for i, text in enumerate(texts):
    row = i // g
    if task[row] == COUNTDOWN:
      nums = [int(n) for n in numbers[row] if n >= 0]
      out["reward"][i] = countdown.reward(text, nums, int(target[row]))
      out["format"][i] = countdown.format_score(text)
      out["parsed"][i] = out["format"][i] == 1.0
    elif task[row] == COUNTDOWN_STEPS:
      nums = [int(n) for n in numbers[row] if n >= 0]
      out["reward"][i] = countdown.paper_reward(text, nums, int(target[row]))
      out["format"][i] = countdown.paper_format_score(text)
      out["parsed"][i] = out["format"][i] == 1.0
    elif task[row] == ARITH:
      out["reward"][i] = arith.reward(text, int(target[row]))
      out["format"][i] = arith.format_score(text)
      out["parsed"][i] = out["format"][i] == 1.0
    elif task[row] == MATH:
      if "reference" not in batch:
        raise ValueError("batch: math rows need 'reference' (their answers)")
      out["reward"][i] = math_answer.score(text, str(batch["reference"][row]))
      out["parsed"][i] = math_answer.last_boxed(text) is not None
      out["format"][i] = float(out["parsed"][i])
    elif task[row] == MCQ:
      letter = mcq.LETTERS[int(gold[row])]
      k = None if n_opts is None else int(n_opts[row])
      out["reward"][i] = mcq.reward(text, letter, k)
      out["format"][i] = mcq.format_score(text, k)
      out["parsed"][i] = out["format"][i] == 1.0
    else:
      raise ValueError(f"batch['task'][{row}] = {task[row]} is not a known task id")
  return out


def reward_batch(texts: Sequence[str], batch: Mapping[str, np.ndarray]) -> np.ndarray:
  """float32 [B*G] rewards; see `score_batch`."""
  return score_batch(texts, batch)["reward"]
