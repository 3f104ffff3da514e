"""evaluate_suites with a stub generator of known completions.

Every completion below is hand-labelled (correct?, answer class, parsed?,
format score); the expected metrics are computed from those labels by brute
force (pass@k by enumerating k-subsets), never by the code under test.
"""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdistill import models
from jaxdistill import tasks
from jaxdistill.data import tokenizer as tok_lib
from jaxdistill.evaluate import core
from tests.evaluate.conftest import MCQ
from tests.evaluate.conftest import TINY

A = "<answer>{}</answer>"
# (text, correct, answer class among correct ones, parsed, format score)
CD_PROBLEMS = [
    {"numbers": [2, 3, 4], "target": 10, "solution": "2*3+4"},
    {"numbers": [1, 5, 6], "target": 30, "solution": "5*6*1"},
    {"numbers": [7, 8, 9], "target": 65, "solution": "8*7+9"},
]
CD_SAMPLES = [
    [(A.format("2*3+4"), 1, "a", 1, 1.0), (A.format("4+3*2"), 1, "a", 1, 1.0),
     (A.format("3*4-2"), 1, "b", 1, 1.0), ("I give up", 0, None, 0, 0.0)],
    [(A.format("5*6*1"), 1, "a", 1, 1.0), (A.format("6*5/1"), 1, "b", 1, 1.0),
     (A.format("1*(6*5)"), 1, "a", 1, 1.0), (A.format("5+6+1"), 0, None, 1, 1.0)],
    [(A.format("7+8+"), 0, None, 0, 0.5), (A.format("7*8"), 0, None, 1, 1.0),
     ("<answer>65", 0, None, 0, 0.0), (A.format("8*7+9 = 64"), 0, None, 1, 1.0)],
]
CD_GREEDY = [(A.format("(2*3)+4"), 1, "a", 1, 1.0),
             (A.format("5*6"), 0, None, 1, 1.0),
             (A.format("9+7*8 = 65"), 1, "a", 1, 1.0)]
MC_SAMPLES = [
    [("The answer is: B", 1, "B", 1, 1.0), ("\\boxed{B}", 1, "B", 1, 1.0),
     ("The answer is: A", 0, None, 1, 1.0), ("no idea", 0, None, 0, 0.0)],
    [("The answer is A, then the answer is: D", 0, None, 1, 1.0),
     ("blah", 0, None, 0, 0.0), ("Answer: **A**", 1, "A", 1, 1.0),
     ("The answer is: A", 1, "A", 1, 1.0)],
    [("none", 0, None, 0, 0.0)] * 4,
]
MC_GREEDY = [("The answer is: B", 1, "B", 1, 1.0), ("the answer is a bit", 0, None, 0, 0.0),
             ("\\boxed{C}", 1, "C", 1, 1.0)]
SUITES = {"cd": CD_PROBLEMS, "mc": MCQ}
TABLES = {"cd": (CD_GREEDY, CD_SAMPLES), "mc": (MC_GREEDY, MC_SAMPLES)}


def brute_pass_at_k(labels, k):
  subsets = list(itertools.combinations(range(len(labels)), k))
  return sum(any(labels[i] for i in s) for s in subsets) / len(subsets)


def expected(suite, ks):
  greedy, sampled = TABLES[suite]
  out = {f"{suite}/num_problems": len(greedy), f"{suite}/num_dropped": 0}
  for mode, rows in (("greedy", [[g] for g in greedy]), ("sampled", sampled)):
    flat = [r for row in rows for r in row]
    out[f"{suite}/{mode}_acc"] = np.mean([r[1] for r in flat])
    out[f"{suite}/{mode}_parse_rate"] = np.mean([r[3] for r in flat])
    out[f"{suite}/{mode}_format"] = np.mean([r[4] for r in flat])
    out[f"{suite}/{mode}_len"] = np.mean([len(r[0]) for r in flat])
  for k in ks:
    out[f"{suite}/pass@{k}"] = np.mean([brute_pass_at_k([r[1] for r in row], k)
                                        for row in sampled])
  out[f"{suite}/distinct_correct"] = np.mean(
      [len({r[2] for r in row if r[1]}) for row in sampled])
  out[f"{suite}/greedy_truncated"] = 0.0
  out[f"{suite}/sampled_truncated"] = 0.5  # odd sample ids "hit the limit"
  return out


class Stub:
  """Returns the tables' completions; checks the prompts it is given."""

  def __init__(self, tokenizer):
    self.tok, self.calls, self.rows = tokenizer, [], 0
    self.suite = None

  def __call__(self, prompts, prompt_mask, *, problem_ids, sample_ids, row_ids,
               temperature, rng):
    del rng
    assert prompts.shape == prompt_mask.shape and len(prompts) == len(row_ids)
    records = SUITES[self.suite]
    greedy, sampled = TABLES[self.suite]
    texts = []
    for p, m, i, j in zip(prompts, prompt_mask, problem_ids, sample_ids):
      want = tok_lib.chat_prompt(self.tok, tasks.prompt_text(records[i]))
      assert self.tok.decode(p[m.astype(bool)]) == want
      texts.append(greedy[i][0] if temperature == 0 else sampled[i][j][0])
    self.calls.append((len(prompts), float(temperature)))
    self.rows += len(prompts)
    ended = np.asarray([temperature == 0 or j % 2 == 0 for j in sample_ids])
    return texts, np.asarray([len(t) for t in texts]), ended


def run(stub, tokenizer, suite, **kw):
  stub.suite = suite
  args = dict(greedy=True, num_samples=4, temperature=0.7, ks=(1, 2, 4),
              batch_size=8, seed=0, max_prompt_len=512, prompt_bucket=16,
              progress=False)
  return core.evaluate_suites(stub, tokenizer, {suite: SUITES[suite]},
                              **{**args, **kw})


@pytest.mark.parametrize("suite", ["cd", "mc"])
@pytest.mark.parametrize("batch_size", [1, 3, 16])
def test_metrics_equal_brute_force(tokenizer, suite, batch_size):
  got = run(Stub(tokenizer), tokenizer, suite, batch_size=batch_size)
  want = expected(suite, (1, 2, 4))
  assert set(got) == set(want)
  for k, v in want.items():
    assert got[k] == pytest.approx(v, abs=1e-12), k


def test_labels_agree_with_the_verifiers():
  # Guards the hand labels themselves: a mislabelled row would make the test
  # above compare against a wrong reference.
  for suite, (greedy, sampled) in TABLES.items():
    for recs, rows in ((SUITES[suite], [[g] for g in greedy]),
                       (SUITES[suite], sampled)):
      for rec, row in zip(recs, rows):
        for text, correct, *_ in row:
          batch = {"task": np.array([tasks.task_of(rec)]),
                   "numbers": np.array([rec.get("numbers", [-1]) + [-1] * (
                       6 - len(rec.get("numbers", [-1])))]),
                   "target": np.array([rec.get("target", -1)]),
                   "gold": np.array(["ABCD".find(rec.get("answer", "?"))])}
          assert tasks.score_batch([text], batch)["reward"][0] == correct, text


def test_sample_layout_and_batching(tokenizer):
  stub = Stub(tokenizer)
  run(stub, tokenizer, "cd", batch_size=8)
  # Greedy: one call of 8 rows (3 problems + 5 padding rows); sampling: 8 // 4
  # = 2 prompts x 4 samples per call, two calls for 3 problems.
  assert stub.calls == [(8, 0.0), (8, 0.7), (8, 0.7)]


def test_greedy_only_and_sampled_only(tokenizer):
  want = expected("cd", (1, 2))
  got = run(Stub(tokenizer), tokenizer, "cd", num_samples=0, ks=())
  assert all(not k.startswith("cd/sampled") and "pass@" not in k for k in got)
  assert got["cd/greedy_acc"] == pytest.approx(want["cd/greedy_acc"])
  got = run(Stub(tokenizer), tokenizer, "cd", greedy=False, ks=(1, 2))
  assert "cd/greedy_acc" not in got
  assert got["cd/pass@2"] == pytest.approx(want["cd/pass@2"])


def test_too_long_prompts_are_dropped_and_counted(tokenizer):
  lens = [len(tok_lib.encode(tokenizer, [tok_lib.chat_prompt(
      tokenizer, tasks.prompt_text(r))])[0]) for r in MCQ]
  limit = sorted(lens)[1]  # keeps the two shortest
  got = run(Stub(tokenizer), tokenizer, "mc", max_prompt_len=limit)
  kept = [i for i, n in enumerate(lens) if n <= limit]
  assert got["mc/num_problems"] == len(kept) == 2
  assert got["mc/num_dropped"] == 1
  assert got["mc/greedy_acc"] == pytest.approx(np.mean([MC_GREEDY[i][1] for i in kept]))


@pytest.mark.parametrize("kw, match", [
    (dict(num_samples=2), r"ks: .*num_samples=2"),
    (dict(greedy=False, num_samples=0, ks=()), "nothing to evaluate"),
    (dict(temperature=0.0), "temperature"),
    (dict(batch_size=0), "batch_size"),
    (dict(seed=-1), "seed"),
])
def test_bad_settings_name_the_argument(tokenizer, kw, match):
  stub = Stub(tokenizer)
  with pytest.raises(ValueError, match=match):
    run(stub, tokenizer, "cd", **kw)
  assert stub.rows == 0  # nothing generated before the check


def test_bad_records_name_the_suite(tokenizer):
  with pytest.raises(ValueError, match=r"suites\['x'\]\[1\]"):
    core.evaluate_suites(Stub(tokenizer), tokenizer,
                         {"x": [CD_PROBLEMS[0], {"question": "q"}]},
                         batch_size=2, seed=0, num_samples=0, ks=())
  with pytest.raises(ValueError, match=r"suites\['y'\]: no problems"):
    core.evaluate_suites(Stub(tokenizer), tokenizer, {"y": []}, batch_size=2,
                         seed=0, num_samples=0, ks=())


def test_rollout_generator_samples_only_the_tokenizers_vocabulary(
    tokenizer, monkeypatch):
  cfg = models.ModelConfig(**TINY)
  real = len(tokenizer)
  assert real < cfg.vocab_size
  params = models.init(cfg, jax.random.key(0))
  emb = np.array(params["embed_tokens"]["embedding"])  # tied head [V, D]
  # Padding rows aligned with the final hidden state's scale: they dominate.
  emb[real:] = 3.0 * np.asarray(params["norm"]["scale"])[None]
  params["embed_tokens"]["embedding"] = jnp.asarray(emb)
  seen = []
  real_generate = core.rollout_lib.generate

  def spy(*a, **kw):
    r = real_generate(*a, **kw)
    seen.append(np.asarray(r.tokens)[:, np.asarray(r.prompt_mask).shape[1]:]
                [np.asarray(r.response_mask) > 0])
    return r
  monkeypatch.setattr(core.rollout_lib, "generate", spy)
  gen = core.rollout_generator(cfg, params, tokenizer, max_new_tokens=6,
                               eos_token_ids=(2,))
  prompts = np.array([[0, 5, 6, 7], [0, 0, 8, 9]], np.int32)
  gen(prompts, (prompts > 0).astype(np.int32), row_ids=np.arange(2),
      temperature=1.0, rng=jax.random.key(1))
  toks = np.concatenate(seen)
  assert toks.size and toks.max() < real


def test_mcq_distinct_correct_uses_the_questions_options(tokenizer):
  # Both samples answer A (the gold letter); "E" is not among the four
  # options, so the second states nothing more and is not a second answer.
  texts = ["The answer is: A",
           "The answer is: A\n\nThe answer is: E (none of these)"]

  def gen(prompts, prompt_mask, *, problem_ids, sample_ids, row_ids,
          temperature, rng):
    del prompt_mask, problem_ids, row_ids, temperature, rng
    out = [texts[j] for j in sample_ids]
    return out, np.full(len(prompts), 4), np.ones(len(prompts), bool)

  got = core.evaluate_suites(gen, tokenizer, {"mc": [MCQ[1]]}, greedy=False,
                             num_samples=2, temperature=1.0, ks=(1, 2),
                             batch_size=2, seed=0, max_prompt_len=512,
                             prompt_bucket=16, progress=False)
  assert got["mc/sampled_acc"] == 1.0
  assert got["mc/distinct_correct"] == 1.0


def test_mcq_records_with_null_options_name_the_suite_and_record(tokenizer):
  bad = dict(MCQ[1], options=[None, "Liver", "Lung", "Kidney"])
  with pytest.raises(ValueError, match=(
      r"suites\['mc'\]\[1\]: 'options'\[0\] \(option A\) must be text, got "
      "null")):
    core.evaluate_suites(Stub(tokenizer), tokenizer, {"mc": [MCQ[0], bad]},
                         batch_size=2, seed=0, num_samples=0, ks=(),
                         progress=False)


class SingleStub:
  """One answer per (problem, temperature): 'single' rows answer by a table of
  their own, every call records its temperature, new tokens and key."""

  SINGLE = {0.5: [(A.format("2*3+4"), 1), ("no", 0), (A.format("8*7+9"), 1)]}

  def __init__(self):
    self.calls = []

  def __call__(self, prompts, prompt_mask, *, problem_ids, sample_ids, row_ids,
               temperature, rng, max_new_tokens=None):
    del prompt_mask, row_ids
    self.calls.append((float(temperature), max_new_tokens, len(prompts),
                       tuple(np.asarray(jax.random.key_data(rng)).ravel())))
    if temperature in self.SINGLE:
      texts = [self.SINGLE[temperature][i][0] for i in problem_ids]
    else:
      texts = [CD_SAMPLES[i][j][0] for i, j in zip(problem_ids, sample_ids)]
    return texts, np.full(len(prompts), 3), np.ones(len(prompts), bool)


def test_single_sample_accuracy_and_per_suite_settings(tokenizer):
  # The paper's protocol: one sample at T 0.5 (accuracy) and n at T 1.0
  # (coverage); one suite decodes longer, its samples at T 0.5 too.
  stub = SingleStub()
  got = core.evaluate_suites(
      stub, tokenizer, {"cd": CD_PROBLEMS, "cd4e": CD_PROBLEMS}, greedy=False,
      single_temperature=0.5, num_samples=4, temperature=1.0, ks=(1, 4),
      batch_size=8, seed=42, max_prompt_len=512, prompt_bucket=16,
      progress=False, per_suite={"cd4e": dict(max_new_tokens=4096)})
  want = np.mean([c for _, c in SingleStub.SINGLE[0.5]])
  assert got["cd/single_acc"] == pytest.approx(want)
  assert got["cd4e/single_acc"] == pytest.approx(want)
  assert "cd/greedy_acc" not in got
  sampled = np.mean([s[1] for row in CD_SAMPLES for s in row])
  assert got["cd/sampled_acc"] == pytest.approx(sampled)
  assert got["cd/pass@4"] == pytest.approx(np.mean(
      [brute_pass_at_k([s[1] for s in row], 4) for row in CD_SAMPLES]))
  # cd: defaults (no max_new_tokens keyword); cd4e: 4096 for both modes.
  # (3 prompts in padded batches of 8 rows: one single call, two sampled
  # calls of 2 prompts x 4 samples.)
  assert [(t, m, r) for t, m, r, _ in stub.calls] == [
      (0.5, None, 8), (1.0, None, 8), (1.0, None, 8),
      (0.5, 4096, 8), (1.0, 4096, 8), (1.0, 4096, 8)]
  # The single sample draws from a key of its own, not sampled mode's.
  assert stub.calls[0][3] != stub.calls[1][3] == stub.calls[2][3]

  stub = SingleStub()
  core.evaluate_suites(
      stub, tokenizer, {"cd": CD_PROBLEMS}, greedy=False,
      single_temperature=0.5, num_samples=4, temperature=1.0, ks=(1,),
      batch_size=8, seed=42, max_prompt_len=512, prompt_bucket=16,
      progress=False, per_suite={"cd": dict(temperature=0.5)})
  assert {t for t, *_ in stub.calls} == {0.5}


@pytest.mark.parametrize("kw, match", [
    (dict(single_temperature=0.0), "single_temperature: one sampled"),
    (dict(per_suite={"cd": dict(top_p=0.9)}), "top_p: not a per-suite"),
    (dict(per_suite={"cd": dict(max_new_tokens=0)}), "max_new_tokens: must be"),
    (dict(per_suite={"other": dict(temperature=0.5)}), "no such suite"),
])
def test_single_and_per_suite_errors(tokenizer, kw, match):
  with pytest.raises(ValueError, match=match):
    core.evaluate_suites(SingleStub(), tokenizer, {"cd": CD_PROBLEMS},
                         greedy=False, num_samples=2, temperature=1.0, ks=(1,),
                         batch_size=8, seed=0, progress=False, **kw)


# Hand-written completions of known language (the style evaluation, App.
# A.11 / D.7): Spanish or English prose around the format tags and answers.
ES = ("<think>Primero calculamos el producto de los dos primeros números y "
      "después sumamos el tercero para llegar al objetivo.</think>"
      "<answer>2*3+4</answer>")
EN = ("<think>First we multiply the first two numbers and then we add the "
      "third one to reach the target value.</think><answer>5*6*1</answer>")


def language_stub(prompts, prompt_mask, *, problem_ids, sample_ids, row_ids,
                  temperature, rng, max_new_tokens=None):
  """Problem 0 Spanish, 1 English, 2 the answer alone (no prose)."""
  del prompt_mask, sample_ids, row_ids, temperature, rng, max_new_tokens
  texts = [ES, EN, "<answer>8*7+9</answer>"]
  return ([texts[i] for i in problem_ids], np.full(len(prompts), 3),
          np.ones(len(prompts), bool))


def test_language_share_per_suite_and_pooled(tokenizer):
  pytest.importorskip("langdetect")
  kw = dict(num_samples=0, ks=(), batch_size=4, seed=0, max_prompt_len=512,
            progress=False)
  got = core.evaluate_suites(
      language_stub, tokenizer, {"cd": CD_PROBLEMS, "cd2": CD_PROBLEMS[:2]},
      greedy=False, single_temperature=0.5, language="es", **kw)
  assert got["cd/single_lang_es"] == pytest.approx(1 / 3)
  assert got["cd2/single_lang_es"] == pytest.approx(1 / 2)
  # Pooled over both suites' completions: 2 of 5.
  assert got["style/single_lang_es"] == pytest.approx(2 / 5)
  # Judging adds its keys and changes no other.
  plain = core.evaluate_suites(
      language_stub, tokenizer, {"cd": CD_PROBLEMS, "cd2": CD_PROBLEMS[:2]},
      greedy=False, single_temperature=0.5, **kw)
  assert not any("lang" in k for k in plain)
  assert {k: v for k, v in got.items() if "lang" not in k} == plain


def test_mcq_distinct_correct_is_at_most_one_whatever_letters_the_text_holds():
  # Both samples are correct (gold A); the second also states E, which a
  # key reading all 26 letters took for a second answer (2.0 before).
  texts = [["The answer is: A", "The answer is: A\n\nThe answer is: E"]]
  res = {"texts": texts, "reward": np.ones((1, 2)), "format": np.ones((1, 2)),
         "parsed": np.ones((1, 2), bool), "length": np.full((1, 2), 5),
         "ended": np.ones((1, 2), bool)}
  got = core.summarize(np.array([tasks.MCQ]), None, res, (1,))
  assert got["distinct_correct"] == 1.0
  # The old call, with the option counts, still works and agrees.
  assert core.summarize(np.array([tasks.MCQ]), None, res, (1,), [4]) == got
  assert core.summarize(np.array([tasks.MCQ]), None, res, (1,),
                        num_options=None) == got
  res["reward"] = np.zeros((1, 2))
  assert core.summarize(np.array([tasks.MCQ]), None, res, (1,))[
      "distinct_correct"] == 0.0
