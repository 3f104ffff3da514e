"""configs/eval.py carries the paper's evaluation protocol (App. D.3), and the
sweep's table reports the accuracy that protocol defines.

The expected values are written here from the paper, not read from the code.
"""
import json

import jax
import numpy as np
import pytest

from jaxdistill import config_lib
from jaxdistill import models
from jaxdistill import sharding
from jaxdistill.evaluate import core
from jaxdistill.evaluate import programs
from jaxdistill.evaluate import run as evaluate_run
from jaxdistill.sweep import table
from tests.evaluate.core_test import CD_PROBLEMS

# App. D.3: the first 200 evaluation problems; accuracy from one completion at
# T 0.5, top-p 1.0, up to 2,048 tokens; coverage pass@1 / pass@10 from 10
# completions at T 1.0; Countdown-4E at T 0.5 with 4,096 tokens; seed 42.
PAPER = dict(num_problems=200, acc_temperature=0.5, top_p=1.0,
             max_new_tokens=2048, coverage_samples=10, coverage_temperature=1.0,
             ks=(1, 10), hard_temperature=0.5, hard_new_tokens=4096, seed=42)


@pytest.mark.parametrize("task", ["countdown", "science", "medical"])
def test_eval_config_is_the_papers_protocol(task, monkeypatch):
  monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")  # HumanEval's opt-in
  c = config_lib.load_config(f"configs/eval.py:task={task}")
  evaluate_run.check_config(c)
  # Forgetting (App. D.1.2): the seven lm-eval benchmarks, 200 of each (of
  # each MMLU-Pro subject; HumanEval-Instruct's 164 and EQ-Bench's 171 are
  # fewer), and nothing else out of distribution.
  assert c.ood == ("lmeval",) and c.suites.lmeval.kind == "harness"
  assert set(c.suites.lmeval.tasks.split("+")) == {
      "mmlu_pro", "truthfulqa_mc1", "ifeval", "humaneval_instruct",
      "eq_bench", "bbq", "toxigen"}
  assert c.suites.lmeval.limit == 200 and not c.suites.lmeval.limits
  assert c.suites.lmeval.confirm_run_unsafe_code
  s = c.sampler
  assert c.seed == PAPER["seed"]
  assert not s.greedy and s.single_temperature == PAPER["acc_temperature"]
  assert (s.top_p or 1.0) == PAPER["top_p"] and s.top_k is None
  assert s.max_new_tokens == PAPER["max_new_tokens"]
  assert s.num_samples == PAPER["coverage_samples"]
  assert s.temperature == PAPER["coverage_temperature"]
  assert tuple(s.ks) == PAPER["ks"]
  for name in c.in_distribution + c.harder:
    assert c.suites[name].num_problems == PAPER["num_problems"], name
    if c.suites[name].kind == "mcq":  # the first 200, not a random 200
      assert c.suites[name].data_seed is None, name
  hard = dict(s.per_suite["countdown4e"])
  assert hard == dict(temperature=PAPER["hard_temperature"],
                      single_temperature=PAPER["hard_temperature"],
                      max_new_tokens=PAPER["hard_new_tokens"])
  assert c.forgetting.metric == "single_acc"
  want = PAPER["hard_new_tokens"] if "countdown4e" in c.eval_suites else \
      PAPER["max_new_tokens"]
  assert evaluate_run.max_new_tokens(c, c.eval_suites) == want


def test_compile_only_covers_each_suites_decode_length(monkeypatch):
  # The programs a --compile_only evaluation compiles (no weights): the
  # accuracy sample and the coverage samples at 2,048 tokens, and both again
  # at Countdown-4E's 4,096 and T 0.5.
  c = config_lib.load_config("configs/eval.py:task=countdown")
  seen = []
  monkeypatch.setattr(
      programs.train_programs, "rollout_program",
      lambda name, *a, rows, max_new_tokens, temperature, **kw: seen.append(
          (name, rows, temperature, max_new_tokens)))
  mesh = programs.mesh_of(config_lib.load_config("configs/eval.py:runlocal"),
                          jax.devices())
  programs.eval_programs(c, models.get_preset("qwen2.5-0.5b"), 151665, mesh,
                         sharding.rules_from_config(c))
  assert seen == [("single", 80, 0.5, 2048), ("sampled", 80, 1.0, 2048),
                  ("single, 4096 new tokens", 80, 0.5, 4096),
                  ("sampled, 4096 new tokens", 80, 0.5, 4096)]


def test_table_accuracy_is_the_single_sample_where_evaluated():
  base = {"name": "kl=forward,seed=42", "factors": {"kl": "forward", "seed": 42},
          "study": {}, "train": {}, "compute": {}}
  paper = table.row_of({**base, "eval": {
      "id/single_acc": 0.4, "id/greedy_acc": 0.9, "harder/single_acc": 0.1,
      "countdown3_paper/single_acc": 0.4, "countdown3_paper/greedy_acc": 0.9}})
  assert paper["accuracy"] == 0.4 and paper["harder_acc"] == 0.1
  assert paper["acc/countdown3_paper"] == 0.4
  greedy = table.row_of({**base, "eval": {"id/greedy_acc": 0.9,
                                          "countdown3/greedy_acc": 0.9}})
  assert greedy["accuracy"] == 0.9 and greedy["acc/countdown3"] == 0.9
  assert not any(k.startswith("lang_") for k in greedy)
  # The style transfer's share of Spanish completions, of the accuracy's mode.
  style = table.row_of({**base, "eval": {
      "id/single_acc": 0.4, "style/single_lang_es": 0.75,
      "style/greedy_lang_es": 0.1, "science/single_lang_es": 0.5}})
  assert style["lang_es"] == 0.75
  assert "lang_es" in table.metric_columns([style])


def test_mcq_suite_keeps_the_first_problems_without_a_seed(tmp_path):
  from jaxdistill.evaluate import suites  # pylint: disable=g-import-not-at-top
  rows = [{"question": f"q{i}", "options": ["a", "b", "c", "d"], "answer": "A"}
          for i in range(10)]
  path = tmp_path / "mcq.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  c = config_lib.load_config("configs/eval.py:task=science")
  spec = c.suites.science
  spec.update(path=str(path), source="generic", num_problems=4)
  assert [r["question"] for r in suites.suite_records("science", spec)] == [
      "q0", "q1", "q2", "q3"]
  spec.data_seed = 3  # a seeded random subset instead, in file order
  got = [r["question"] for r in suites.suite_records("science", spec)]
  want = sorted(np.random.default_rng(3).permutation(10)[:4])
  assert got == [f"q{i}" for i in want]


def test_decode_calls_are_the_calls_the_evaluation_makes(tokenizer):
  # sweep/cost.py counts an evaluation's decodes from its config: here the
  # count is the calls evaluate_suites makes to a generator, per mode and
  # decode length (2 prompts a call: the accuracy sample 2 prompts, the 10
  # coverage samples 1 prompt a call).
  c = config_lib.load_config("configs/eval.py:task=countdown")
  c.eval_suites = ("countdown3_paper", "countdown4e")
  c.sampler.batch_size = 2
  sizes = {"countdown3_paper": 3, "countdown4e": 2}
  for name, n in sizes.items():
    c.suites[name].num_problems = n
  calls = []

  def gen(prompts, prompt_mask, *, problem_ids, sample_ids, row_ids,
          temperature, rng, max_new_tokens=2048):
    del prompt_mask, sample_ids, row_ids, temperature, rng
    mode = "sampled" if len(prompts) == 10 else "single"
    calls.append(mode if max_new_tokens == 2048
                 else f"{mode}, {max_new_tokens} new tokens")
    return ([f"<answer>{CD_PROBLEMS[i]['solution']}</answer>"
             for i in problem_ids], np.full(len(prompts), 3),
            np.ones(len(prompts), bool))
  s = c.sampler
  core.evaluate_suites(
      gen, tokenizer, {k: CD_PROBLEMS[:n] for k, n in sizes.items()},
      greedy=False, single_temperature=0.5, num_samples=10, temperature=1.0,
      ks=(1, 10), batch_size=2, seed=42, max_prompt_len=512, prompt_bucket=16,
      progress=False,
      per_suite={k: v for k, v in s.per_suite.items() if k in sizes})
  want = {m: calls.count(m) for m in set(calls)}
  # By hand: 2 + 1 single calls, 3 + 2 sampled ones.
  assert want == {"single": 2, "sampled": 3, "single, 4096 new tokens": 1,
                  "sampled, 4096 new tokens": 2}
  assert programs.decode_calls(c, c.eval_suites) == (want, [])
  # The baseline: the accuracy sample of the OOD suites alone.
  assert programs.decode_calls(c, ("countdown4e",), samples=False) == (
      {"single, 4096 new tokens": 1}, [])
