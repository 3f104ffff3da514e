"""The `jaxdistill.evaluate` command: end to end, forgetting, sparsity, errors.

References: update sparsity is counted in NumPy over the tensors that
`safetensors.numpy` reads from the two files (the paper's S_tau: float32
difference, strict <; the former figure: float64, <= 1e-5); forgetting is the difference of
the two accuracies in the JSON, and, with a stub generator whose correct
answers are chosen by the test, the hand-computed drop.
"""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

from jax.sharding import PartitionSpec as P
import numpy as np
import pytest
from safetensors.numpy import load_file
from safetensors.numpy import save_file

from jaxdistill.evaluate import report
from jaxdistill.evaluate import run as evaluate_run
from jaxdistill.evaluate import suites
from tests.evaluate.conftest import MCQ
from tests.evaluate.suites_test import get_config
from tests.evaluate.suites_test import write_jsonl

ROOT = pathlib.Path(__file__).resolve().parents[2]
ATOL = 1e-5


@pytest.fixture(scope="module")
def perturbed(tiny_ckpt, tmp_path_factory):
  """A copy of tiny_ckpt with known changes, some within the tolerance."""
  out = tmp_path_factory.mktemp("perturbed")
  for f in os.listdir(tiny_ckpt):
    if f != "model.safetensors":
      shutil.copy(tiny_ckpt / f, out / f)
  t = load_file(str(tiny_ckpt / "model.safetensors"))
  rng = np.random.default_rng(1)
  t["model.embed_tokens.weight"][:10] += 1e-3
  w = t["model.layers.1.mlp.down_proj.weight"]
  w.reshape(-1)[::7] += 1e-6  # within atol, not exact
  b = t["model.layers.0.self_attn.q_proj.bias"]
  b[rng.random(b.shape) < 0.5] -= 5e-3
  t["model.layers.0.input_layernorm.weight"][3] += 2e-5
  save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
  return out


def numpy_sparsity(dir0, dir1):
  """sparsity/<key> -> value: S_1e-6 and S_1e-8 in float32 (strict <), whole
  model and per layer; the former float32 figures, whole model."""
  a, b = (load_file(str(pathlib.Path(d) / "model.safetensors")) for d in (dir0, dir1))
  assert set(a) == set(b) and "lm_head.weight" not in a  # tied: counted once
  out = {}
  def s_tau(names, tau):
    n = sum(a[k].size for k in names)
    return sum(int((np.abs(b[k].astype(np.float32) - a[k].astype(np.float32))
                    < np.float32(tau)).sum()) for k in names) / n
  for tau, name in ((1e-6, "S_1e-6_f32"), (1e-8, "S_1e-8_f32")):
    out[name] = s_tau(list(a), tau)
    for i in range(2):
      out[f"layer_{i:02d}/{name}"] = s_tau([k for k in a if f".layers.{i}." in k], tau)
  n = sum(v.size for v in a.values())
  diff = [np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)) for k in a]
  out["unchanged_1e-5_f32"] = sum(int((d <= ATOL).sum()) for d in diff) / n
  out["equal_f32"] = sum(int((d == 0).sum()) for d in diff) / n
  return out


@pytest.mark.slow
def test_cli_end_to_end(tiny_ckpt, perturbed, tmp_path):
  # The checkpoint is given as a training workdir (its hf_student/ is used).
  workdir = tmp_path / "run"
  shutil.copytree(tiny_ckpt, workdir / "hf_student")
  out = tmp_path / "results.json"
  cmd = [sys.executable, "-m", "jaxdistill.evaluate",
         "--config", "configs/eval.py:runlocal,samples=2",
         "--config.suites.countdown3.num_problems=3",
         "--config.suites.countdown5.num_problems=2",
         "--checkpoint", str(workdir), "--baseline", str(perturbed),
         "--out", str(out)]
  # One CPU device: the runlocal config evaluates without a mesh.
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  res = json.loads(out.read_text())
  assert res["checkpoint"] == str(workdir / "hf_student")
  assert res["baseline"] == str(perturbed)
  assert res["config"]["sampler"]["num_samples"] == 2
  m = res["metrics"]
  per_suite = ["num_problems", "num_dropped", "greedy_acc", "greedy_format",
               "greedy_parse_rate", "greedy_len", "greedy_truncated",
               "sampled_acc", "sampled_format", "sampled_parse_rate",
               "sampled_len", "sampled_truncated", "pass@1", "pass@2",
               "distinct_correct"]
  want = {f"{s}/{k}" for s in ("countdown3", "countdown5") for k in per_suite}
  want |= {f"baseline/countdown5/{k}" for k in per_suite[:7]}
  want |= {"forgetting/countdown5_pp", "forgetting/mean_pp", "id/greedy_acc",
           "ood/greedy_acc", "sparsity/S_1e-6_f32", "sparsity/S_1e-8_f32",
           "sparsity/layer_00/S_1e-6_f32", "sparsity/layer_01/S_1e-8_f32",
           "sparsity/unchanged_1e-5_bf16", "sparsity/equal_bf16",
           "sparsity/num_params"}
  assert want <= set(m), sorted(want - set(m))
  assert all(isinstance(v, float) for v in m.values())
  assert m["countdown3/num_problems"] == 3 and m["countdown5/num_problems"] == 2
  assert 0 < m["countdown3/greedy_len"] <= 8  # runlocal max_new_tokens
  # Forgetting is the accuracy difference, in percentage points.
  assert m["forgetting/countdown5_pp"] == pytest.approx(
      100 * (m["baseline/countdown5/greedy_acc"] - m["countdown5/greedy_acc"]))
  assert m["forgetting/mean_pp"] == m["forgetting/countdown5_pp"]
  # Sparsity equals a NumPy count over the two files, as stored.
  ref = numpy_sparsity(perturbed, tiny_ckpt)
  for k, v in ref.items():
    assert m[f"sparsity/{k}"] == pytest.approx(v, abs=1e-12), k
  # The 1e-6 moves: in float32 some come out below 1e-6 and some not.
  assert 0 < ref["equal_f32"] == ref["S_1e-8_f32"] < ref["S_1e-6_f32"]
  assert ref["S_1e-6_f32"] < ref["unchanged_1e-5_f32"] < 1
  assert 0 <= m["sparsity/equal_bf16"] <= m["sparsity/unchanged_1e-5_bf16"] <= 1
  assert res["sparsity"]["taus"] == [1e-6, 1e-8]
  assert res["sparsity"]["stored_dtype"] == {"before": "float32", "after": "float32"}
  # The readable tables.
  assert "## countdown3 (id, 3 problems)" in proc.stdout
  assert re.search(r"\| greedy accuracy +\| [\d.]+ % +\| [\d.]+ % +\|", proc.stdout)
  assert "update sparsity (S_tau: share of parameters" in proc.stdout
  assert "| S_1e-6_f32 | S_1e-8_f32 |" in proc.stdout
  assert "unchanged_1e-5_bf16" in proc.stdout


def stub_factory(tokenizer_answers):
  """Generators that answer the MCQ suite from a table: checkpoint vs baseline."""
  def factory(role, cfg, params, tokenizer, eos):
    del cfg, params, tokenizer, eos
    right = tokenizer_answers[role]

    def gen(prompts, prompt_mask, *, problem_ids, sample_ids, row_ids,
            temperature, rng):
      del prompt_mask, sample_ids, row_ids, temperature, rng
      texts = []
      for p in problem_ids:
        # Countdown rows never match; MCQ rows answer by the table.
        gold = MCQ[p]["answer"] if p < len(MCQ) else "A"
        texts.append(f"The answer is: {gold if right(p) else 'Z'}")
      return texts, np.full(len(prompts), 5), np.ones(len(prompts), bool)
    return gen
  return factory


def stub_config(tmp_path):
  c = get_config("runlocal,suites=countdown3+mcq,ood=mcq")
  c.suites.mcq = dict(kind="mcq", path=write_jsonl(tmp_path / "mcq.jsonl", MCQ),
                      source="generic", num_problems=None, data_seed=0)
  c.progress = False
  return c


def test_forgetting_with_known_answers(tiny_ckpt, perturbed, tmp_path):
  c = stub_config(tmp_path)
  # Checkpoint: right on MCQ problem 0 only (1/3); baseline: right on all.
  factory = stub_factory({"checkpoint": lambda p: p == 0,
                          "baseline": lambda p: True})
  out = tmp_path / "r.json"
  res = evaluate_run.run(c, str(tiny_ckpt), str(perturbed), str(out),
                     generator_factory=factory)
  m = res["metrics"]
  assert m["mcq/greedy_acc"] == pytest.approx(1 / 3)
  assert m["baseline/mcq/greedy_acc"] == 1.0
  assert m["forgetting/mcq_pp"] == pytest.approx(100 * (1 - 1 / 3))
  assert m["forgetting/mean_pp"] == pytest.approx(100 * 2 / 3)
  assert m["mcq/pass@4"] == pytest.approx(1 / 3)  # every sample alike
  assert m["countdown3/greedy_acc"] == 0.0
  assert "baseline/countdown3/greedy_acc" not in m  # baseline: OOD suites only
  assert "baseline/mcq/sampled_acc" not in m       # ... and greedy only
  assert json.loads(out.read_text())["metrics"] == m
  text = report.format_report(res)
  assert "## mcq (ood, 3 problems)" in text and "| mcq " in text
  assert "+66.67" in text


def test_config_rules_place_the_evaluated_params(tiny_ckpt, tmp_path):
  """config.rules, not sharding.DEFAULT_RULES, shard the loaded model."""
  c = stub_config(tmp_path)
  c.mesh = dict(data=1, fsdp=-1, tensor=1)
  # As a config read back from JSON holds them: lists. Default: P(None, 'fsdp').
  c.rules = [["batch", ["data", "fsdp"]], ["vocab", "fsdp"], ["embed", None]]
  specs = []
  stub = stub_factory({"checkpoint": lambda p: True})
  def factory(role, cfg, params, tokenizer, eos):
    specs.append(params["embed_tokens"]["embedding"].sharding.spec)  # [V, D]
    return stub(role, cfg, params, tokenizer, eos)
  evaluate_run.run(c, str(tiny_ckpt), generator_factory=factory)
  assert specs == [P("fsdp", None)]


def test_errors_name_the_problem(tiny_ckpt, tmp_path):
  c = stub_config(tmp_path)
  with pytest.raises(FileNotFoundError, match=r"--checkpoint: .*not found"):
    evaluate_run.run(c, str(tmp_path / "missing"))
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match=r"--baseline: .*hf_student"):
    evaluate_run.run(c, str(tiny_ckpt), str(tmp_path / "empty"))
  bad = get_config("runlocal,suites=countdown3+physics,ood=")
  with pytest.raises(ValueError, match=r"unknown suite\(s\) \['physics'\]"):
    evaluate_run.run(bad, str(tiny_ckpt))
  c.suites.mcq.path = str(tmp_path / "gone.jsonl")
  with pytest.raises(FileNotFoundError, match=r"config.suites.mcq.path.*gone.jsonl"):
    evaluate_run.run(c, str(tiny_ckpt))
  c = get_config("runlocal")
  c.sampler.ks = (1, 8)
  with pytest.raises(ValueError, match=r"ks: .*num_samples=4"):
    evaluate_run.run(c, str(tiny_ckpt))


def test_checkpoint_sparsity_rejects_mismatched_models(tiny_ckpt, tmp_path):
  other = tmp_path / "other"
  shutil.copytree(tiny_ckpt, other)
  t = load_file(str(other / "model.safetensors"))
  t["model.norm.weight"] = np.ones(7, np.float32)
  save_file(t, str(other / "model.safetensors"), metadata={"format": "pt"})
  c = get_config("runlocal")
  with pytest.raises(ValueError, match=r"model.norm.weight.*shape"):
    evaluate_run.run(c, str(tiny_ckpt), str(other))


def test_load_model_stops_on_config_tokenizer_and_generation_config_eos(
    tiny_ckpt, tokenizer, tmp_path):
  """Llama 3 Instruct lists <|eot_id|> in generation_config.json only."""
  ckpt = tmp_path / "ckpt"
  shutil.copytree(tiny_ckpt, ckpt)
  c = get_config("runlocal")
  tok_eos = int(tokenizer.eos_token_id)
  assert evaluate_run.load_model(str(ckpt), c, None)[3] == tuple(
      sorted({2, tok_eos}))  # config.json's (2,) and the tokenizer's
  (ckpt / "generation_config.json").write_text(json.dumps({"eos_token_id": [9, 7]}))
  assert evaluate_run.load_model(str(ckpt), c, None)[3] == tuple(
      sorted({2, tok_eos, 7, 9}))
  c.sampler.eos_token_ids = (11, 4, 11)  # the config's list replaces them all
  assert evaluate_run.load_model(str(ckpt), c, None)[3] == (4, 11)


def test_a_training_workdir_resolves_to_its_export(tiny_ckpt, tmp_path):
  work = tmp_path / "run"
  work.mkdir()
  (work / "config.json").write_text("{}")  # the training config, no weights
  with pytest.raises(FileNotFoundError, match=r"--checkpoint: .*hf_student"):
    evaluate_run.resolve_checkpoint(str(work))
  shutil.copytree(tiny_ckpt, work / "hf_student")
  assert evaluate_run.resolve_checkpoint(str(work)) == str(work / "hf_student")
  assert evaluate_run.resolve_checkpoint(str(tiny_ckpt)) == str(tiny_ckpt)


def test_found_before_any_evaluation(tiny_ckpt, tmp_path, monkeypatch):
  """--out naming a directory, prompts + new tokens beyond the model's
  max_position_embeddings (512 in tiny_ckpt's config.json), a non-finite
  number: refused before any model is loaded or suite evaluated."""
  monkeypatch.setattr(evaluate_run, "load_model", None)  # never reached
  c = get_config("runlocal")
  with pytest.raises(ValueError, match=f"--out: {tmp_path} is a directory; "
                     "give a file path"):
    evaluate_run.run(c, str(tiny_ckpt), out=str(tmp_path))
  c.sampler.max_new_tokens = 300  # + prompts up to 256 = 556 > 512
  with pytest.raises(ValueError, match=r"config\.sampler\.max_new_tokens: "
                     r"prompts up to 256 tokens .* \+ 300 new tokens exceed "
                     r"the --checkpoint model's max_position_embeddings 512"):
    evaluate_run.run(c, str(tiny_ckpt))
  c = get_config("runlocal")
  c.sampler.temperature = float("nan")
  with pytest.raises(ValueError, match=r"config\.sampler\.temperature: must "
                     "be a finite number, got nan"):
    evaluate_run.run(c, str(tiny_ckpt))


def test_paper_countdown_suites_score_step_answers(tiny_ckpt, tmp_path):
  """The paper's Countdown-3 / -4E suites: Table 1 prompts in, step answers
  scored by the paper's verifier (right on even problems only)."""
  c = get_config("runlocal,suites=countdown3_paper+countdown4e,ood=")
  c.progress = False
  c.sampler.max_prompt_len = 448  # Table 1's prompt in the tiny tokenizer
  recs = {n: suites.suite_records(n, c.suites[n]) for n in c.eval_suites}

  def factory(role, cfg, params, tokenizer, eos):
    del role, cfg, params, eos
    def gen(prompts, prompt_mask, *, problem_ids, sample_ids, row_ids,
            temperature, rng):
      del sample_ids, row_ids, temperature, rng
      texts = []
      for row, p in zip(prompts, problem_ids):
        text = tokenizer.decode(row)
        name = "countdown4e" if "Numbers: [" in text and len(
            text.split("Numbers: [")[1].split("]")[0].split(",")) == 4 else (
                "countdown3_paper")
        sol = recs[name][p]["solution"]
        texts.append(f"<think>..</think><answer>{sol if p % 2 == 0 else '1+1=2'}"
                     "</answer>")
      assert all("careful arithmetic solver" in tokenizer.decode(r)
                 for r in prompts)
      return texts, np.full(len(prompts), 5), np.ones(len(prompts), bool)
    return gen

  res = evaluate_run.run(c, str(tiny_ckpt), None, str(tmp_path / "r.json"),
                         generator_factory=factory)
  m = res["metrics"]
  assert m["countdown3_paper/num_problems"] == 4
  assert m["countdown3_paper/greedy_acc"] == 0.5
  assert m["countdown4e/greedy_acc"] == 0.5
  assert m["countdown4e/greedy_format"] == 1.0


def test_language_judge_through_the_command(tiny_ckpt, perturbed, tmp_path):
  """config.language='es': the style transfer's judge on every completion,
  in the result and its report (checkpoint Spanish, baseline English)."""
  pytest.importorskip("langdetect")
  es = ("<think>La respuesta correcta es la primera opción porque el agua "
        "pura es neutra y su pH es siete.</think><answer>A</answer>")
  en = ("<think>The correct answer is the first option because pure water is "
        "neutral and its pH is seven.</think><answer>A</answer>")

  def factory(role, cfg, params, tokenizer, eos):
    del cfg, params, tokenizer, eos

    def gen(prompts, prompt_mask, *, problem_ids, **_):
      del prompt_mask
      text = es if role == "checkpoint" else en
      return ([text] * len(problem_ids), np.full(len(prompts), 5),
              np.ones(len(prompts), bool))
    return gen
  c = stub_config(tmp_path)
  c.language = "es"
  res = evaluate_run.run(c, str(tiny_ckpt), str(perturbed),
                         generator_factory=factory)
  m = res["metrics"]
  assert m["mcq/greedy_lang_es"] == m["countdown3/greedy_lang_es"] == 1.0
  assert m["style/greedy_lang_es"] == 1.0
  assert m["baseline/mcq/greedy_lang_es"] == 0.0
  text = report.format_report(res)
  assert "## language" in text
  assert re.search(r"\| style/greedy_lang_es +\| 100\.0 % +\|", text)
  c.language = "Spanish"
  with pytest.raises(ValueError, match="config.language: an ISO 639-1 code"):
    evaluate_run.check_config(c)
