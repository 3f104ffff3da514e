"""jaxdistill.evaluate.harness against lm-eval's own `hf` model (HFLM).

Both load the same tiny random transformers checkpoint (a Llama whose
tokenizer adds BOS, as Llama 3's does, and a Qwen2 whose tokenizer adds
nothing), float32 on CPU, and answer the same lm-eval Instances. max_length 32
so that long requests are left-truncated and documents span several rolling
windows on both sides. The end-to-end test runs a task defined from local
JSON files through `python -m jaxdistill.evaluate.harness` offline.
"""
import importlib.util
import json
import os
import pathlib
import site
import subprocess
import sys

import pytest

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # pylint: disable=g-import-not-at-top

from jaxdistill.evaluate import harness  # pylint: disable=g-import-not-at-top
from tests import tiny_hf  # pylint: disable=g-import-not-at-top

MAX_LEN = 32
TOL = 1e-4
NO_TORCH = ("torch", "functorch", "torchgen")

CONTEXTS = [
    "Question: 3 + 4 =",
    "Answer: ",  # trailing space moves into the continuation
    "Which organ pumps blood? A) Heart B) Liver\nAnswer:",
    # longer than MAX_LEN tokens: left-truncated
    "Using the numbers 1 2 3 4 5 6 7 8 9 create an equation that equals 24. "
    "Using the numbers 9 8 7 6 5 4 3 2 1 create an equation that equals 42.",
]
CONTINUATIONS = [" 7", "B", " Heart", " 9 * 8 - 7 = 65"]
DOCS = ["Oxygen", "Which gas do plants absorb for photosynthesis? Carbon dioxide.",
        " ".join(f"{i} + {i} = {2 * i}." for i in range(12))]  # several windows


def _add_bos(path):
  """Makes the saved tokenizer prepend <|bos|> to every encoding."""
  f = path / "tokenizer.json"
  tj = json.loads(f.read_text())
  bos = next(t for t in tj["added_tokens"] if t["content"] == "<|bos|>")
  tj["post_processor"] = {
      "type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<|bos|>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [{"SpecialToken": {"id": "<|bos|>", "type_id": 0}},
               {"Sequence": {"id": "A", "type_id": 0}},
               {"Sequence": {"id": "B", "type_id": 1}}],
      "special_tokens": {"<|bos|>": {"id": "<|bos|>", "ids": [bos["id"]],
                                     "tokens": ["<|bos|>"]}}}
  f.write_text(json.dumps(tj))


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def ckpt(request, tmp_path_factory, tokenizer):
  from jaxdistill.data import tokenizer as tok_lib
  path = tmp_path_factory.mktemp(f"harness_{request.param}")
  vocab = len(tokenizer)
  for _ in range(2):
    # The checkpoint's vocabulary is the tokenizer's length as loaded from the
    # directory (transformers' Qwen2 class adds <|endoftext|>): no logit rows
    # beyond the tokenizer, so HF's argmax and ours range over the same ids.
    tiny_hf.make_tiny_checkpoint(request.param, path, vocab_size=vocab,
                                 eos_token_id=tokenizer.eos_token_id,
                                 bos_token_id=tokenizer.bos_token_id)
    tokenizer.save_pretrained(str(path))
    if len(tok_lib.load_tokenizer(str(path))) == vocab:
      break
    vocab = len(tok_lib.load_tokenizer(str(path)))
  if request.param == "llama":
    _add_bos(path)
  return path


@pytest.fixture(scope="module")
def models_pair(ckpt):
  from lm_eval.models.huggingface import HFLM
  ref = HFLM(pretrained=str(ckpt), device="cpu", dtype="float32",
             batch_size=1, max_length=MAX_LEN)
  ours = harness.JaxLM(pretrained=str(ckpt), dtype="float32", batch_size=3,
                       max_length=MAX_LEN)
  return ours, ref


def _reqs(kind, args):
  return [Instance(request_type=kind, doc={}, arguments=a, idx=i)
          for i, a in enumerate(args)]


GEN_KW = {"until": ["\n", "."], "max_gen_toks": 8, "do_sample": False}
GEN_PROMPTS = ["Question: 3 + 4 =", "<|user|>Which organ pumps blood?<|assistant|>",
               "Using the numbers 1 2 3", "Answer:"]


def test_bos_handling_differs_between_families(models_pair, ckpt):
  ours, ref = models_pair
  ids = ours.tok_encode("Answer:")
  assert ids == ref.tok_encode("Answer:")
  assert (ids[0] == ours.tokenizer.bos_token_id) == ("llama" in ckpt.name)


def test_loglikelihood_matches_hf(models_pair):
  ours, ref = models_pair
  args = list(zip(CONTEXTS, CONTINUATIONS)) + [("", "Heart of gold")]
  a = ours.loglikelihood(_reqs("loglikelihood", args))
  b = ref.loglikelihood(_reqs("loglikelihood", args))
  for (lp_a, g_a), (lp_b, g_b), req in zip(a, b, args):
    assert abs(lp_a - lp_b) < TOL, req
    assert g_a == g_b, req
    assert lp_a < 0


def test_is_greedy_on_the_reference_argmax(models_pair):
  """Continuations that are the HF model's own greedy tokens (and the same
  with the last token changed): is_greedy True, then False, on both sides."""
  import torch
  ours, ref = models_pair
  reqs = []
  for c in CONTEXTS[:3]:
    ctx = ref.tok_encode(c)[-(MAX_LEN - 4):]  # fits: no truncation
    with torch.no_grad():
      out = ref.model.generate(torch.tensor([ctx]), max_new_tokens=3,
                               do_sample=False, eos_token_id=None,
                               pad_token_id=0)
    cont = out[0, len(ctx):].tolist()
    wrong = cont[:-1] + [(cont[-1] + 1) % len(ours.tokenizer)]
    reqs += [((c, "g"), ctx, cont), ((c, "w"), ctx, wrong)]
  a = ours._loglikelihood_tokens(reqs)  # pylint: disable=protected-access
  b = ref._loglikelihood_tokens(reqs)  # pylint: disable=protected-access
  assert [g for _, g in b] == [True, False] * 3
  assert [g for _, g in a] == [g for _, g in b]
  for (lp_a, _), (lp_b, _) in zip(a, b):
    assert abs(lp_a - lp_b) < TOL


def test_loglikelihood_rolling_matches_hf(models_pair):
  ours, ref = models_pair
  assert len(ours.tok_encode(DOCS[-1])) > 2 * MAX_LEN  # several windows
  a = ours.loglikelihood_rolling(_reqs("loglikelihood_rolling", [(d,) for d in DOCS]))
  b = ref.loglikelihood_rolling(_reqs("loglikelihood_rolling", [(d,) for d in DOCS]))
  assert len(a) == len(b) == len(DOCS)
  for x, y, d in zip(a, b, DOCS):
    assert abs(x - y) < TOL, d


def test_greedy_generate_until_matches_hf(models_pair):
  ours, ref = models_pair
  reqs = [(p, GEN_KW) for p in GEN_PROMPTS] + [
      (GEN_PROMPTS[0], {"until": ["3"], "max_gen_toks": 5})]
  a = ours.generate_until(_reqs("generate_until", reqs))
  b = ref.generate_until(_reqs("generate_until", reqs))
  assert a == b
  assert any(a), "every generation is empty: the comparison shows nothing"


def test_generate_until_cuts_at_stop_strings(models_pair):
  """A stop string taken from the middle of an unstopped generation: both
  cut there (the rollout itself runs on; the cut is on the text)."""
  ours, ref = models_pair
  free = {"until": [], "max_gen_toks": 8, "do_sample": False}
  full = ref.generate_until(_reqs("generate_until", [(GEN_PROMPTS[0], free)]))[0]
  stop = full[len(full) // 2:len(full) // 2 + 1]
  assert stop
  req = [(GEN_PROMPTS[0], dict(free, until=[stop]))]
  a = ours.generate_until(_reqs("generate_until", req))
  assert a == ref.generate_until(_reqs("generate_until", req))
  assert a[0] == full.split(stop)[0] and len(a[0]) < len(full)


def test_chat_template_hooks(models_pair):
  ours, ref = models_pair
  chat = [{"role": "system", "content": "Be brief."},
          {"role": "user", "content": "Which organ pumps blood?"}]
  assert ours.apply_chat_template(chat) == ref.apply_chat_template(chat)
  assert ours.apply_chat_template(chat, add_generation_prompt=False) == \
      ref.apply_chat_template(chat, add_generation_prompt=False)
  assert ours.chat_template(True) == ref.chat_template(True)
  assert ours.tokenizer_name == ref.tokenizer_name


def test_bad_model_args(ckpt):
  with pytest.raises(ValueError, match="batch_size 'auto'"):
    harness.JaxLM(pretrained=str(ckpt), batch_size="auto")
  with pytest.raises(ValueError, match="max_gen_toks"):
    harness.JaxLM(pretrained=str(ckpt), max_gen_toks="0")
  with pytest.raises(ValueError, match="unknown model args"):
    harness.JaxLM(pretrained=str(ckpt), temprature=1)


def test_registered():
  from lm_eval.api import registry
  assert registry.get_model("jaxdistill") is harness.JaxLM


# -- end to end: lm-eval's CLI on a task from local files ----------------------

MCQ_DOCS = [
    {"question": "Which organ pumps blood?", "choices": ["Heart", "Liver", "Lung"],
     "label": 0},
    {"question": "Which gas do plants absorb?", "choices": ["Oxygen", "Carbon dioxide"],
     "label": 1},
    {"question": "What is 3 + 4?", "choices": ["6", "7", "8"], "label": 1},
]

TASK_YAML = """\
task: tiny_mcq
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

GEN_YAML = """\
task: tiny_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{choices[label]}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 6
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def _local_tasks(tmp_path):
  """A directory of two lm-eval tasks (tiny_mcq, tiny_gen) over MCQ_DOCS."""
  data = tmp_path / "docs.jsonl"
  data.write_text("".join(json.dumps(d) + "\n" for d in MCQ_DOCS))
  tasks = tmp_path / "tasks"
  tasks.mkdir()
  (tasks / "tiny_mcq.yaml").write_text(TASK_YAML.format(data=data))
  (tasks / "tiny_gen.yaml").write_text(GEN_YAML.format(data=data))
  return tasks


def test_cli_end_to_end(ckpt, models_pair, tmp_path):
  """`python -m jaxdistill.evaluate.harness` (lm-eval's CLI) offline, without
  torch installed: every request in the logged samples gets HFLM's answer,
  and the results JSON's metrics follow from them. The Qwen2 run goes
  through --apply_chat_template."""
  _, ref = models_pair
  tasks = _local_tasks(tmp_path)
  out = tmp_path / "out"
  # The child runs where torch is not installed: `python -S` (no site dir)
  # over a copy of site-packages made of links to all but torch's packages,
  # as an install of the `lmeval` extra alone would be. (transformers and
  # lm-eval import torch whenever it is installed, which here it is, for HFLM.)
  farm = tmp_path / "site"
  farm.mkdir()
  for site_dir in site.getsitepackages():
    for entry in os.listdir(site_dir):
      if entry.split("-")[0] not in NO_TORCH and not entry.endswith(".pth"):
        (farm / entry).symlink_to(os.path.join(site_dir, entry))
  env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
             HF_DATASETS_CACHE=str(tmp_path / "ds_cache"),
             PYTHONPATH=f"{pathlib.Path(__file__).parents[2]}{os.pathsep}{farm}")
  no_torch = subprocess.run([sys.executable, "-S", "-c", "import torch"],
                            env=env, capture_output=True, check=False)
  assert no_torch.returncode != 0
  cmd = [sys.executable, "-S", "-m", "jaxdistill.evaluate.harness",
         "--model", "jaxdistill",
         "--model_args", f"pretrained={ckpt},dtype=float32,max_length={MAX_LEN}",
         "--tasks", "tiny_mcq,tiny_gen", "--include_path", str(tasks),
         "--batch_size", "2", "--output_path", str(out), "--log_samples"]
  chat = "qwen2" in ckpt.name  # one family through lm-eval's chat path
  if chat:
    cmd.append("--apply_chat_template")
  p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600,
                     check=False)
  assert p.returncode == 0, p.stderr[-3000:]
  res = json.loads(next(out.rglob("results_*.json")).read_text())["results"]

  def samples(task):
    f = next(out.rglob(f"samples_{task}_*.jsonl"))
    return [json.loads(line) for line in f.read_text().splitlines()]

  # Every request lm-eval made, answered by HFLM: the same numbers.
  hits = []
  for smp in samples("tiny_mcq"):
    args = [(a["arg_0"], a["arg_1"]) for a in smp["arguments"].values()]
    if chat:
      assert args[0][0].startswith("<|bos|><|user|>Question:"), args[0][0]
    want = [lp for lp, _ in ref.loglikelihood(_reqs("loglikelihood", args))]
    got = [float(r[0][0]) for r in smp["resps"]]
    assert got == pytest.approx(want, abs=TOL)
    hits.append(want.index(max(want)) == smp["doc"]["label"])
  assert len(hits) == len(MCQ_DOCS)
  assert res["tiny_mcq"]["acc,none"] == pytest.approx(sum(hits) / len(hits))
  gen = samples("tiny_gen")
  args = [tuple(smp["arguments"]["gen_args_0"].values()) for smp in gen]
  want = ref.generate_until(_reqs("generate_until", args))
  assert [smp["resps"][0][0] for smp in gen] == want
  assert any(want)
  assert res["tiny_gen"]["exact_match,none"] == pytest.approx(
      sum(smp["exact_match"] for smp in gen) / len(gen))


def test_without_lm_eval_one_line_error():
  """`import jaxdistill` never needs lm-eval; the harness says what to install."""
  env = dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).parents[2]))
  hide = "import sys; sys.modules['lm_eval'] = None; "
  p = subprocess.run(
      [sys.executable, "-c", hide + "import jaxdistill, jaxdistill.evaluate, "
       "jaxdistill.evaluate.run; print('lm_eval' in sys.modules and "
       "sys.modules['lm_eval'] is not None)"],
      env=env, capture_output=True, text=True, check=False)
  assert p.returncode == 0 and p.stdout.strip() == "False", p.stderr[-2000:]
  p = subprocess.run(
      [sys.executable, "-c", hide + "import runpy; runpy.run_module("
       "'jaxdistill.evaluate.harness', run_name='__main__')"],
      env=env, capture_output=True, text=True, check=False)
  assert p.returncode == 1
  assert p.stderr.strip() == ("error: jaxdistill.evaluate.harness needs "
                              "lm-evaluation-harness: pip install "
                              "'jaxdistill[lmeval]'")


def test_sampled_generation_is_seeded_per_request(models_pair, ckpt):
  """Sampling (do_sample, temperature 1): the same seed gives the same texts
  whatever the batch size; another seed other texts."""
  ours, _ = models_pair
  kw = {"until": [], "max_gen_toks": 8, "do_sample": True, "temperature": 1.0}
  prompts = GEN_PROMPTS[:2]
  reqs = _reqs("generate_until", [(p, kw) for p in prompts])
  one = harness.JaxLM(pretrained=str(ckpt), dtype="float32", batch_size=1,
                      max_length=MAX_LEN)
  a = ours.generate_until(reqs)
  assert a == one.generate_until(reqs)
  one.seed = 1
  assert a != one.generate_until(reqs)
  greedy = ours.generate_until(_reqs("generate_until", [
      (p, dict(kw, do_sample=False)) for p in prompts]))
  assert a != greedy


# -- the paper's seven-benchmark suite (App. D.1.2) -----------------------------

PAPER_TASKS = ["mmlu_pro", "truthfulqa_mc1", "ifeval", "humaneval_instruct",
               "eq_bench", "bbq", "toxigen"]


def _fake_results():
  """An lm-eval results JSON for the seven tasks (keys as lm-eval writes them)."""
  return {"results": {
      "mmlu_pro": {"alias": "mmlu_pro", "exact_match,custom-extract": 0.30,
                   "exact_match_stderr,custom-extract": 0.01},
      "mmlu_pro_law": {"exact_match,custom-extract": 0.9},  # a subject: unused
      "truthfulqa_mc1": {"acc,none": 0.28, "acc_stderr,none": 0.03},
      "ifeval": {"prompt_level_strict_acc,none": 0.55,
                 "prompt_level_loose_acc,none": 0.6},
      "humaneval_instruct": {"pass@1,create_test": 0.35},
      "eq_bench": {"eqbench,none": 42.0, "percent_parseable,none": 98.0},
      "bbq": {"acc,none": 0.5, "accuracy_amb,none": 0.2},
      "toxigen": {"acc,none": 0.45, "acc_norm,none": 0.43}}}


def test_ood_scores_mean_of_seven():
  got = harness.ood_scores(_fake_results())
  per_task = [0.30, 0.28, 0.55, 0.35, 0.42, 0.5, 0.45]  # EQ-Bench: 42 / 100
  assert sorted(got) == sorted([f"ood/{t}" for t in PAPER_TASKS] + ["ood/mean"])
  assert [got[f"ood/{t}"] for t in PAPER_TASKS] == pytest.approx(per_task)
  assert got["ood/mean"] == pytest.approx(sum(per_task) / 7)
  assert harness.ood_scores(_fake_results()["results"]) == got
  res = _fake_results()
  del res["results"]["bbq"]
  with pytest.raises(ValueError, match="'acc,none' for task 'bbq'"):
    harness.ood_scores(res)


def test_ood_tasks_exist_in_lm_eval():
  """The seven names are tasks (or, MMLU-Pro, the group of 14 subjects that
  --limit caps one by one) in the installed lm-eval's task files."""
  import lm_eval
  root = pathlib.Path(lm_eval.__file__).parent / "tasks"
  names = set()
  for f in root.rglob("*.yaml"):
    for line in f.read_text(encoding="utf-8", errors="replace").splitlines():
      if line.startswith(("task: ", "group: ")):
        names.add(line.split(":", 1)[1].strip())
  assert set(PAPER_TASKS) <= names
  assert len(list((root / "mmlu_pro").glob("mmlu_pro_*.yaml"))) == 14
  assert harness.ood_args() == ["--tasks", ",".join(PAPER_TASKS), "--limit", "200"]


def test_cli_ood_flag_and_score(monkeypatch, tmp_path, capsys):
  from lm_eval import __main__ as lm_main
  seen = []
  monkeypatch.setattr(lm_main, "cli_evaluate", lambda: seen.append(sys.argv[1:]))
  harness.main(["--model", "jaxdistill", "--ood", "--apply_chat_template"])
  assert seen == [["--model", "jaxdistill", "--apply_chat_template",
                   "--tasks", ",".join(PAPER_TASKS), "--limit", "200"]]
  f = tmp_path / "results.json"
  f.write_text(json.dumps(_fake_results()))
  harness.main(["ood-score", str(f)])
  assert json.loads(capsys.readouterr().out) == harness.ood_scores(_fake_results())
  with pytest.raises(SystemExit, match="no 'exact_match,custom-extract' for "
                     "task 'mmlu_pro'"):
    f.write_text(json.dumps({"results": {"mmlu_pro": {}}}))
    harness.main(["ood-score", str(f)])


# -- the `lmeval` suite of python -m jaxdistill.evaluate -----------------------


# One family is enough for the wiring (the parity tests above run both).
@pytest.mark.parametrize("ckpt", ["qwen2"], indirect=True)
def test_evaluate_harness_suite_scores_and_forgetting(ckpt, tmp_path, tokenizer):
  """jaxdistill.evaluate with a 'harness' suite as the OOD group: its task
  scores, mean and forgetting equal those lm-eval computes with its own `hf`
  model on the checkpoint and on a baseline of other random weights."""
  from lm_eval import evaluator  # pylint: disable=g-import-not-at-top
  from lm_eval import tasks as lm_tasks  # pylint: disable=g-import-not-at-top
  from lm_eval.models.huggingface import HFLM  # pylint: disable=g-import-not-at-top
  from jaxdistill import config_lib  # pylint: disable=g-import-not-at-top
  from jaxdistill.data import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  from jaxdistill.evaluate import report  # pylint: disable=g-import-not-at-top
  from jaxdistill.evaluate import run as evaluate_run  # pylint: disable=g-import-not-at-top
  tasks = _local_tasks(tmp_path)
  base = tiny_hf.make_tiny_checkpoint(
      "qwen2", tmp_path / "base", seed=1,
      vocab_size=len(tok_lib.load_tokenizer(str(ckpt))),
      eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
  tokenizer.save_pretrained(str(base))
  c = config_lib.load_config("configs/eval.py:runlocal")
  c.suites.lmeval.update(tasks="tiny_mcq+tiny_gen", include_path=str(tasks),
                         limits={"tiny_gen": 2}, max_length=MAX_LEN,
                         metrics={"tiny_mcq": "acc,none",
                                  "tiny_gen": "exact_match,none"})
  c.eval_suites, c.in_distribution, c.ood = (
      ("countdown3", "lmeval"), ("countdown3",), ("lmeval",))
  out = tmp_path / "eval.json"
  res = evaluate_run.run(c, str(ckpt), str(base), str(out))
  m = res["metrics"]

  manager = lm_tasks.TaskManager(include_path=str(tasks))
  want = {}
  for role, path in (("after", ckpt), ("before", base)):
    ref = HFLM(pretrained=str(path), device="cpu", dtype="float32",
               batch_size=1, max_length=MAX_LEN)
    scores = {}
    for task, key, limit in (("tiny_mcq", "acc,none", None),
                             ("tiny_gen", "exact_match,none", 2)):
      r = evaluator.simple_evaluate(model=ref, tasks=[task], limit=limit,
                                    task_manager=manager,
                                    apply_chat_template=True,
                                    log_samples=False, bootstrap_iters=0)
      scores[task] = r["results"][task][key]
    want[role] = scores
  for task in ("tiny_mcq", "tiny_gen"):
    assert m[f"lmeval/{task}"] == pytest.approx(want["after"][task], abs=1e-9)
    assert m[f"baseline/lmeval/{task}"] == pytest.approx(want["before"][task],
                                                         abs=1e-9)
  mean = lambda d: (d["tiny_mcq"] + d["tiny_gen"]) / 2
  assert m["lmeval/score"] == pytest.approx(mean(want["after"]))
  drop = 100 * (mean(want["before"]) - mean(want["after"]))
  assert m["forgetting/lmeval_pp"] == pytest.approx(drop)
  assert m["forgetting/mean_pp"] == pytest.approx(drop)
  assert "countdown3/greedy_acc" in m
  assert "baseline/countdown3/greedy_acc" not in m  # OOD suites only
  saved = json.loads(out.read_text())
  assert set(saved["lmeval"]) == {"checkpoint", "baseline"}
  assert saved["lmeval"]["checkpoint"]["lmeval"]["tiny_mcq"]["acc,none"] == (
      pytest.approx(want["after"]["tiny_mcq"]))
  text = report.format_report(res)
  assert "## lmeval (ood, lm-eval" in text and "tiny_gen" in text


def test_harness_suite_config_errors(monkeypatch):
  from jaxdistill import config_lib  # pylint: disable=g-import-not-at-top
  from jaxdistill.evaluate import run as evaluate_run  # pylint: disable=g-import-not-at-top
  monkeypatch.delenv("HF_ALLOW_CODE_EVAL", raising=False)
  spec = "configs/eval.py:task=countdown"  # forgetting=lmeval, the default
  c = config_lib.load_config(spec)
  assert c.ood == ("lmeval",) and "science" not in c.eval_suites
  assert tuple(c.suites.lmeval.tasks.split("+")) == tuple(harness.OOD_TASKS)
  with pytest.raises(ValueError, match="humaneval_instruct executes the code"):
    evaluate_run.check_config(c)
  # --compile_only runs no lm-eval task: it needs neither the opt-in nor lm-eval.
  evaluate_run.check_config(c, runnable=False)
  # The opt-in alone is not enough: code_eval itself needs the variable,
  # and would refuse only after every completion had been generated.
  with pytest.raises(ValueError, match="only with HF_ALLOW_CODE_EVAL=1"):
    evaluate_run.check_config(config_lib.load_config(spec + ",unsafe_code=True"))
  # Without lm-eval installed, refused before anything loads.
  real_find_spec = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if
                      name == "lm_eval" else real_find_spec(name, *a))
  c = config_lib.load_config(spec)
  c.suites.lmeval.tasks = "mmlu_pro+bbq"  # no code to run
  with pytest.raises(ImportError, match=r"pip install 'jaxdistill\[lmeval\]'"):
    evaluate_run.check_config(c)
  monkeypatch.setattr(importlib.util, "find_spec", real_find_spec)
  evaluate_run.check_config(c)
  # forgetting=suites: no lm-eval, no opt-in.
  evaluate_run.check_config(config_lib.load_config(spec + ",forgetting=suites"))
  # The variable is the opt-in as well (the config reads it when it loads).
  monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
  c = config_lib.load_config(spec)
  assert c.suites.lmeval.confirm_run_unsafe_code
  evaluate_run.check_config(c)
  for field, value, match in (("tasks", "", "task names"),
                              ("limit", 0, "positive int"),
                              ("max_gen_toks", 0, "positive int"),
                              ("max_length", -8, "positive int"),
                              ("limits", {"bogus": 3}, "not one of")):
    bad = config_lib.load_config(spec + ",unsafe_code=True")
    bad.suites.lmeval[field] = value
    with pytest.raises(ValueError, match=f"config.suites.lmeval.{field}.*{match}"):
      evaluate_run.check_config(bad)
  with pytest.raises(ValueError, match="no score key for lm-eval task 'x'"):
    harness.score_key("x")
  assert harness.score_key("x", {"x": "eqbench,none*0.01"}) == (
      "eqbench,none", 0.01)
  with pytest.raises(ValueError, match="forgetting: expected"):
    config_lib.load_config("configs/eval.py:forgetting=bogus")


def test_unknown_lm_eval_task_is_refused_before_any_suite_runs(ckpt, tmp_path):
  """A task name lm-eval does not know (a typo) was found by lm-eval after
  the other suites had run; now evaluate refuses it first, naming the
  field, and writes nothing."""
  from jaxdistill import config_lib  # pylint: disable=g-import-not-at-top
  from jaxdistill.evaluate import run as evaluate_run  # pylint: disable=g-import-not-at-top
  tasks = _local_tasks(tmp_path)
  c = config_lib.load_config("configs/eval.py:runlocal")
  c.suites.lmeval.update(tasks="tiny_mcq+tiny_gne", include_path=str(tasks),
                         metrics={"tiny_mcq": "acc,none",
                                  "tiny_gne": "exact_match,none"})
  c.eval_suites, c.in_distribution, c.ood = (
      ("countdown3", "lmeval"), ("countdown3",), ("lmeval",))
  out = tmp_path / "eval.json"
  with pytest.raises(ValueError, match=(
      r"^config\.suites\.lmeval\.tasks: lm-eval \S+ has no task 'tiny_gne' "
      r"\(close: tiny_gen.*\), nor has include_path ")):
    evaluate_run.run(c, str(ckpt), None, str(out))
  assert not out.exists()
  harness.check_tasks("x", {"tasks": "truthfulqa_mc1+tiny_gen",
                            "include_path": str(tasks)})


def test_base_model_without_chat_template(ckpt, tmp_path):
  """A checkpoint whose tokenizer has no chat template (a base model) is
  scored as lm-eval's HFLM scores it (the template is opt-in there); only
  --apply_chat_template is refused, in one line. Before, loading failed
  ("tokenizer has no chat_template")."""
  import shutil  # pylint: disable=g-import-not-at-top
  from lm_eval.models.huggingface import HFLM  # pylint: disable=g-import-not-at-top
  base = tmp_path / "base"
  shutil.copytree(ckpt, base)
  (base / "chat_template.jinja").unlink(missing_ok=True)
  cfg = json.loads((base / "tokenizer_config.json").read_text())
  cfg.pop("chat_template", None)
  (base / "tokenizer_config.json").write_text(json.dumps(cfg))
  ours = harness.JaxLM(pretrained=str(base), dtype="float32", batch_size=2,
                       max_length=MAX_LEN)
  assert not getattr(ours.tokenizer, "chat_template", None)
  ref = HFLM(pretrained=str(base), device="cpu", dtype="float32",
             batch_size=1, max_length=MAX_LEN)
  args = list(zip(CONTEXTS, CONTINUATIONS))
  a = ours.loglikelihood(_reqs("loglikelihood", args))
  b = ref.loglikelihood(_reqs("loglikelihood", args))
  for (lp_a, g_a), (lp_b, g_b), req in zip(a, b, args):
    assert abs(lp_a - lp_b) < TOL and g_a == g_b, req
  with pytest.raises(ValueError, match="has no chat template"):
    ours.apply_chat_template([{"role": "user", "content": "hi"}])
