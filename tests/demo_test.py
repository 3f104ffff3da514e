"""The demo: its data, tokenizer, verdicts, and the --quick run end to end."""
import ast
from fractions import Fraction
import glob
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from jaxdistill import config_lib
from jaxdistill import demo
from jaxdistill import tasks
from jaxdistill.data import pipeline
from jaxdistill.data import tokenizer as tok_lib
from jaxdistill.demo import build
from jaxdistill.demo import checks
from jaxdistill.demo import report
from jaxdistill.demo import study
from jaxdistill.demo import tasks as demo_tasks
from jaxdistill.sweep import grid as grid_lib


def _eval_exact(expr: str) -> Fraction:
  """Independent exact evaluator of + - * / expressions (Python's own parser)."""
  def ev(n):
    if isinstance(n, ast.Expression):
      return ev(n.body)
    if isinstance(n, ast.Constant) and isinstance(n.value, int):
      return Fraction(n.value)
    if isinstance(n, ast.BinOp):
      a, b = ev(n.left), ev(n.right)
      return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b,
              ast.Div: a / b if b else None}[type(n.op)]
    raise ValueError(ast.dump(n))
  return ev(ast.parse(expr, mode="eval"))


def test_arith_records_are_chains_in_range_and_split_by_problem():
  for n in (demo_tasks.ID_NUMBERS, demo_tasks.HARDER_NUMBERS):
    train = demo_tasks.arith_records(n, 300, 0, "train")
    test = demo_tasks.arith_records(n, 200, 0, "test")
    for r in train + test:
      digits = [int(t) for t in re.findall(r"\d+", r["expression"])]
      assert len(digits) == n and all(1 <= d <= 9 for d in digits)
      assert "(" not in r["expression"] and "*" not in r["expression"]
      # Left to right, every running value stays in 0..99.
      ops = re.findall(r"[-+]", r["expression"])
      run = digits[0]
      for op, d in zip(ops, digits[1:]):
        run = run + d if op == "+" else run - d
        assert 0 <= run <= 99
      assert run == r["value"] == _eval_exact(r["expression"])
    assert not {r["expression"] for r in train} & {r["expression"] for r in test}


def test_addition_records_gold_is_the_parity_of_the_true_sum():
  train = demo_tasks.addition_records(300, 0, "train")
  test = demo_tasks.addition_records(96, 0, "test")
  for r in train + test:
    a, b = map(int, re.fullmatch(r"Is (\d) \+ (\d) even or odd\?",
                                 r["question"]).groups())
    assert r["options"] == ["even", "odd"]
    assert r["answer"] == ("A" if (a + b) % 2 == 0 else "B")
    assert r["response"].startswith(f"{a} + {b} = {a + b}, which is ")
    assert r["response"].endswith(f"The answer is: {r['answer']}")
    assert demo_tasks.addition_answer(r["question"]) == a + b
  assert len({r["question"] for r in test}) == len(test)  # distinct facts
  assert len({r["question"] for r in train}) == 100  # every fact trained
  golds = [r["answer"] for r in test]
  assert 0.4 < golds.count("A") / len(golds) < 0.6  # guessing scores ~50 %
  with pytest.raises(ValueError, match="split"):
    demo_tasks.addition_records(3, 0, "valid")
  with pytest.raises(ValueError, match="count"):
    demo_tasks.addition_records(101, 0, "test")


def test_tokenizer_round_trips_and_keeps_digits_apart(tmp_path):
  recs = (demo_tasks.arith_records(4, 300, 0) +
          demo_tasks.addition_records(300, 0))
  tok = build.build_tokenizer(str(tmp_path / "tok"), demo_tasks.corpus(recs), 512)
  assert len(tok) <= 512
  for r in recs[:20] + recs[-20:]:
    text = tasks.reference_response(r)
    ids = tok_lib.encode(tok, [text])[0]
    assert tok.decode(ids) == text
    for i in ids:  # no token mixes a digit with anything else
      piece = tok.decode([i])
      assert not re.search(r"\d", piece) or re.fullmatch(r"\d", piece)
  prompt = tok_lib.chat_prompt(tok, tasks.prompt_text(recs[0]))
  assert prompt.startswith("<|bos|><|user|>") and prompt.endswith("<|assistant|>")
  # Cross-word merges make the fixed instruction short.
  assert len(tok_lib.encode(tok, [prompt])[0]) < 50
  with pytest.raises(ValueError, match="vocab_size"):
    build.build_tokenizer(str(tmp_path / "t2"), ["abc"], 100)


def test_training_configs_read_the_demo_records_from_a_file(tmp_path):
  recs = demo_tasks.arith_records(4, 5, 0) + demo_tasks.addition_records(4, 0)
  path = build.write_records(recs, str(tmp_path), "mix")
  assert path == build.write_records(recs, str(tmp_path), "mix")  # by content
  assert path != build.write_records(recs[:-1], str(tmp_path), "mix")
  cfg = build.base_train_config(_demo_config(), tok_dir="unused", records=path,
                                seed=0)
  assert pipeline.records_from_config(cfg.data) == recs


def _demo_config():
  return config_lib.load_config("configs/demo.py:quick")


ID, HARD = report.ID_S, report.HARD_S


def _row(kl, policy, lr, acc3, acc4, add, sp):
  return {"kl": kl, "policy": policy, "lam": {"student": 1.0, "teacher": 0.0}[policy],
          "lr": lr, f"acc/{ID}": acc3, f"acc/{HARD}": acc4,
          "acc/addition": add, "forgetting_pp": 100 * (0.9 - add), "sparsity": sp}


def test_findings_follow_the_numbers():
  teacher = {f"{ID}/greedy_acc": 0.6, f"{HARD}/greedy_acc": 0.3}
  student = {f"{ID}/greedy_acc": 0.1, "addition/greedy_acc": 0.9}
  # A run built to agree with every testable headline finding: forward KL
  # flat, reverse KL moved by the learning rate and better on-policy,
  # on-policy better on the harder suite, the high lr forgets and is denser ...
  agree = [_row("forward", "student", 1e-4, .50, .30, .90, .9),
           _row("forward", "teacher", 1e-4, .50, .10, .90, .9),
           _row("forward", "student", 5e-4, .52, .30, .40, .5),
           _row("forward", "teacher", 5e-4, .51, .10, .40, .5),
           _row("reverse", "student", 1e-4, .50, .30, .90, .9),
           _row("reverse", "teacher", 1e-4, .40, .10, .90, .9),
           _row("reverse", "student", 5e-4, .30, .30, .40, .5),
           _row("reverse", "teacher", 5e-4, .05, .10, .40, .5)]
  found = {n: ok for n, ok, _ in report.findings(agree, teacher, student, 400)}
  assert found == {"setup": True, "distillation moves accuracy": True,
                   "no on-policy edge": True,
                   "forward KL stable, reverse KL sensitive": True,
                   "reverse KL favours student rollouts": True,
                   "forgetting grows with LR": True, "sparsity falls with LR": True,
                   "on-policy helps on harder problems": True,
                   "gain does not survive RLVR": None}
  # ... and one built to disagree with every one of them.
  disagree = [_row("forward", "student", 1e-4, .90, .10, .90, .5),
              _row("forward", "teacher", 1e-4, .10, .30, .90, .5),
              _row("forward", "student", 5e-4, .90, .10, .90, .9),
              _row("forward", "teacher", 5e-4, .10, .30, .90, .9),
              _row("reverse", "student", 1e-4, .10, .10, .90, .5),
              _row("reverse", "teacher", 1e-4, .10, .30, .90, .5),
              _row("reverse", "student", 5e-4, .10, .10, .90, .9),
              _row("reverse", "teacher", 5e-4, .10, .30, .90, .9)]
  found = report.findings(disagree, {f"{ID}/greedy_acc": 0.1,
                                     f"{HARD}/greedy_acc": 0.3}, student, 400)
  assert [ok for _, ok, _ in found] == [False] * 7 + [None]
  text = report.paragraph(found)
  assert text.startswith("This run reproduces 0 of the 6 headline findings")
  # Seeds: a spread over seeds larger than the binomial error makes a
  # difference unclear.
  arms = report.arm_means([dict(r, arm=f"{r['kl']},{r['policy']},{r['lr']}",
                                seed=0) for r in agree] +
                          [dict(r, arm=f"{r['kl']},{r['policy']},{r['lr']}",
                                seed=1, **{f"acc/{HARD}": .0 if
                                           r["policy"] == "student" else .5})
                           for r in agree])
  assert all(a["seeds"] == 2 for a in arms)
  found = {n: ok for n, ok, _ in report.findings(arms, teacher, student, 400)}
  assert found["on-policy helps on harder problems"] is False


def _staged(kl, policy, acc4, hard, acc4_rl, hard_rl, sampled=.3,
            sampled_rl=.6, rewards=(.2, .7)):
  return {"kl": kl, "policy": policy, "lr": 1e-4, "seeds": 1,
          f"acc/{ID}": acc4, f"acc/{HARD}": hard, "acc/addition": .9,
          f"rlvr/acc/{ID}": acc4_rl, f"rlvr/acc/{HARD}": hard_rl,
          "rlvr/acc/addition": .8, report.SAMPLED: sampled,
          f"rlvr/{report.SAMPLED}": sampled_rl, "reward_start": rewards[0],
          "reward_end": rewards[1], "reward_window": 12}


def test_rlvr_verdict_follows_the_gain_before_and_after():
  def verdicts(arms):
    return {n: ok for n, ok, _ in report.rlvr_findings(arms, 200, 200)}
  # On-policy +30 pp on the harder suite before RLVR (s.e. about 4 pp):
  # gone after it under forward KL -> the study's finding reproduced.
  lost = [_staged("forward", "student", .5, .4, .6, .2),
          _staged("forward", "teacher", .5, .1, .6, .2),
          _staged("reverse", "student", .5, .4, .6, .4),
          _staged("reverse", "teacher", .5, .1, .6, .1)]
  assert verdicts(lost) == {"RLVR learns": True,
                            "gain does not survive RLVR": True}
  kept = [dict(a) for a in lost]
  kept[0][f"rlvr/acc/{HARD}"] = .45
  assert verdicts(kept)["gain does not survive RLVR"] is False
  # No clear gain before RLVR (2 pp): nothing to survive -> untested; and
  # a sampled accuracy that does not move is not "learning".
  flat = [_staged(kl, pol, .5, .11 if pol == "student" else .09, .5, .1,
                  sampled=.3, sampled_rl=.31)
          for kl in ("forward", "reverse") for pol in ("student", "teacher")]
  assert verdicts(flat) == {"RLVR learns": False,
                            "gain does not survive RLVR": None}
  text = " ".join(s for _, _, s in report.rlvr_findings(lost, 200, 200))
  # The gain and its standard error, computed here: sqrt(2 x .4 x .6 / 200)
  # ... for the student arm and .1 x .9 for the teacher arm.
  se = 100 * math.hypot(math.sqrt(.4 * .6 / 200), math.sqrt(.1 * .9 / 200))
  assert f"forward KL +30.0 ± {se:.1f} pp before, +0.0 ± " in text
  assert report.rlvr_findings([], 200, 200)[0][1] is None
  md = report.rlvr_markdown(lost, {ID: 200, HARD: 200, "addition": 96})
  assert "| forward | student | 1e-04 | 50.0 -> 60.0 (+10.0) |" in md
  assert "0.20 -> 0.70" in md


def test_precision_finding_follows_the_sparsity_of_the_low_rate_arms():
  def arm(prec, lr, sparsity, acc):
    return {"kl": "forward", "policy": "student", "lr": lr, "precision": prec,
            "sparsity": sparsity, f"acc/{ID}": acc, "seeds": 1}
  # bf16 keeps 60 % of the weights at the low rate, float32 1 %: it depends.
  arms = [arm("float32", 5e-7, .01, .10), arm("bfloat16", 5e-7, .60, .12),
          arm("float32", 2e-4, .00, .60), arm("bfloat16", 2e-4, .02, .55)]
  (name, ok, text), = report.precision_finding(arms, {ID: 200})
  assert name == "sparsity depends on precision" and ok is True
  assert "1.0 % with float32" in text and "60.0 % with weights" in text
  assert "accuracy 10.0 % and 12.0 %" in text
  # 5 pp apart is below the 10 pp bar; one precision alone: no finding.
  arms[1]["sparsity"] = .06
  assert report.precision_finding(arms, {ID: 200})[0][1] is False
  assert report.precision_finding(arms[::2], {ID: 200}) == []
  # Not one of the paper's: the headline count leaves it out.
  found = [("no on-policy edge", True, "a."),
           *report.precision_finding(arms, {ID: 200})]
  assert report.paragraph(found).startswith("This run reproduces 1 of the 1 ")


def test_sparsity_by_layer_kind_table_shows_both_precisions():
  """Per-arm means over seeds (arm_means) in the kind table, S_1e-6 / S_1e-8,
  with the seen / never-seen token ids."""
  def run(prec, seed, attn):
    r = {"arm": f"forward,student,{prec}", "kl": "forward",
         "policy": "student", "lr": 1e-4, "precision": prec, "seed": seed,
         "sparsity": .5, "sparsity_S_1e-8_f32": .25}
    for k in ("attention", "mlp", "norms", "embeddings", "embeddings_seen",
              "embeddings_unseen"):
      r[f"sparsity_{k}_S_1e-6_f32"] = attn if k == "attention" else .75
      r[f"sparsity_{k}_S_1e-8_f32"] = .125
    r["sparsity_embeddings_seen_rows"] = 300 + seed
    r["sparsity_embeddings_unseen_rows"] = 212 - seed
    return r
  arms = report.arm_means([run("float32", 0, .1), run("float32", 2, .3),
                           run("bfloat16", 0, .9)])
  text = report.sparsity_markdown(arms)
  lines = text.splitlines()
  assert lines[0].startswith("| KL | rollouts | lr | weights | whole model | "
                             "attention | mlp | norms | embeddings | "
                             "embeddings seen | embeddings unseen |")
  assert lines[2] == ("| forward | student | 1e-04 | float32 | 50.0 / 25.0 | "
                      "20.0 / 12.5 | " + "75.0 / 12.5 | " * 5 + "301 / 211 |")
  assert lines[3].startswith("| forward | student | 1e-04 | bfloat16 | "
                             "50.0 / 25.0 | 90.0 / 12.5 |")
  # Arms without per-kind figures (an older grid): no table.
  assert report.sparsity_markdown([{**arms[0],
                                    "sparsity_attention_S_1e-6_f32": None}]) == ""


def test_harder_finding_is_untested_when_the_teacher_cannot_do_it():
  rows = [_row(kl, pol, 1e-4, .5, .0, .9, .9)
          for kl in ("forward", "reverse") for pol in ("student", "teacher")]
  teacher = {f"{ID}/greedy_acc": 0.6, f"{HARD}/greedy_acc": 0.0}
  student = {f"{ID}/greedy_acc": 0.1, "addition/greedy_acc": 0.9}
  found = report.findings(rows, teacher, student, 400, figures=[])
  verdicts = {n: ok for n, ok, _ in found}
  assert verdicts["on-policy helps on harder problems"] is None
  assert "no harder figure" in verdicts  # the findings say why it is missing


def test_bad_arguments_raise_before_any_work(tmp_path):
  with pytest.raises(ValueError, match="--seed"):
    demo.main(["--quick", "--seed", "-1", "--workdir", str(tmp_path)])
  with pytest.raises(ValueError, match="--seeds"):
    demo.main(["--quick", "--seeds", "0", "--workdir", str(tmp_path)])
  with pytest.raises(ValueError, match="--quick, --spectrum"):
    demo.main(["--quick", "--spectrum", "--workdir", str(tmp_path)])
  with pytest.raises(FileNotFoundError, match="config"):
    demo.main(["--config", "configs/nope.py", "--workdir", str(tmp_path)])
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize("arg", ["arm_steps=-5", "arm_steps=0", "lrs=-1e-4",
                                 "lrs=2e-4+0", "lrs=1e-4+inf", "lrs=fast",
                                 "policies=student+mixture"])
def test_bad_config_args_are_refused_by_name_before_any_work(tmp_path, arg):
  field = arg.split("=")[0]
  with pytest.raises(ValueError, match=f"^config arg {field}: "):
    demo.main(["--quick", "--workdir", str(tmp_path / "w"),
               "--config", f"configs/demo.py:{arg}"])
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize("arg", ["", "quick", "spectrum", "rlvr", "quick,rlvr",
                                 "seeds=3", "arm_steps=60,lrs=2e-4+2e-3",
                                 "precisions=float32+bfloat16,kl=forward,"
                                 "policies=student"])
def test_every_shipped_variant_passes_the_checks(arg):
  checks.check_config(config_lib.load_config(f"configs/demo.py:{arg}"))


@pytest.mark.parametrize("field, value, says", [
    ("grid.lrs", (5e-4, -1e-4), "learning rates must be finite numbers > 0"),
    ("grid.lrs", (), "learning rates"),
    ("grid.steps", 0, "integer >= 1"),
    ("grid.precisions", ("float32", "float16"), "('float32', 'bfloat16')"),
    ("grid.precisions", ("float32", "float32"), "distinct"),
    ("grid.kl", ("forward", "sampled"), "('forward', 'reverse', 'jsd')"),
    ("grid.policy", (("student", 2.5),), "lambda must be in [-2, 2]"),
    ("teacher.lr", float("nan"), "finite number"),
    ("teacher.warmup", 1.5, "finite number in [0, 1]"),
    ("student.arch.num_key_value_heads", 2, "multiple of num_key_value_heads"),
    ("student.id_share", 1.2, "[0, 1]"),
    ("data.addition_test", 101, "only 100 addition facts"),
    ("max_new_tokens", 250, "exceeds the models' 256 positions"),
    ("vocab_size", 263, "integer >= 264"),  # 256 bytes + 7 special tokens
    ("eval.ks", (1, 3), "1 <= k <= eval.num_samples=2"),
    ("eval.sparsity_taus", (1e-6, 0.0), "finite taus > 0"),
])
def test_bad_settings_are_refused_by_name_before_any_work(tmp_path, field,
                                                          value, says):
  """A setting edited in the config (not through an argument) is named as
  config.<field> before the tokenizer or a model is built."""
  cfg = _demo_config()
  node = cfg
  *parents, leaf = field.split(".")
  for p in parents:
    node = node[p]
  node[leaf] = value
  name = field.rsplit(".", 1)[0] if field.startswith("student.arch") else field
  with pytest.raises(ValueError) as e:
    study.run(cfg, str(tmp_path / "w"))
  msg = str(e.value)
  assert msg.startswith(f"config.{name}: ") and says in msg and "\n" not in msg
  assert not os.listdir(tmp_path)


@pytest.mark.slow
def test_quick_demo_table_is_complete_finite_and_deterministic(quick_demo,
                                                               capsys):
  tmp_path, summary, printed = quick_demo  # the first run, in a fresh workdir
  rows = summary["rows"]
  assert len(rows) == 2 and {r["kl"] for r in rows} == {"forward", "reverse"}
  for r in rows:
    for key in (f"acc/{ID}", f"acc/{HARD}", "acc/addition", "coverage",
                "forgetting_pp", "sparsity", "sparsity_S_1e-8_f32",
                "sparsity_unchanged_1e-5_bf16"):
      assert isinstance(r[key], float) and math.isfinite(r[key]), (key, r)
      assert -100 <= r[key] <= 100
    # Per layer kind, the embedding rows split by the arm's seen token ids.
    for kind in ("attention", "mlp", "norms", "embeddings", "embeddings_seen",
                 "embeddings_unseen"):
      v = r[f"sparsity_{kind}_S_1e-6_f32"]
      assert isinstance(v, float) and 0 <= v <= 1, (kind, r)
    assert r["sparsity_embeddings_seen_rows"] > 0
    hf = os.path.join(summary["grid_dir"], grid_lib.safe_name(r["name"]),
                      "hf_student", "config.json")
    with open(hf) as f:
      rows_ = json.load(f)["vocab_size"]
    assert (r["sparsity_embeddings_seen_rows"]
            + r["sparsity_embeddings_unseen_rows"]) == rows_
  assert "| embeddings seen | embeddings unseen |" in printed
  for ev in (summary["teacher"], summary["student"]):
    assert all(math.isfinite(v) for v in ev.values())
  out = summary["results_dir"]
  assert os.path.dirname(out) == str(tmp_path / "results")
  assert os.path.basename(out).startswith("quick-")
  for name in ("demo_table.md", "findings.md", "results.csv", "results.json"):
    assert os.path.getsize(os.path.join(out, name)) > 0
  assert all(os.path.isfile(p) for p in summary["figures"])
  assert "| forward | student |" in printed and "This run reproduces" in printed
  assert summary["arms_run"] == 2
  # A rerun reuses the models and the finished arms: nothing is trained.
  again = demo.main(["--quick", "--workdir", str(tmp_path)])
  assert again["arms_run"] == 0 and again["results_dir"] == out
  assert json.dumps(again["rows"], sort_keys=True) == json.dumps(rows, sort_keys=True)
  # Determinism: the grid trained again from the cached models gives the
  # same table.
  # (The quickstart notebook may have run a smaller grid in this workdir.)
  assert again["grid_dir"] == summary["grid_dir"]
  shutil.rmtree(summary["grid_dir"])
  third = demo.main(["--quick", "--workdir", str(tmp_path)])
  assert third["arms_run"] == 2
  assert json.dumps(third["rows"], sort_keys=True) == json.dumps(rows, sort_keys=True)
  # --rlvr reuses the grid (its arms untouched) and adds GRPO from the best
  # arm of each KL x policy, with its table, verdict and figure; a rerun
  # runs nothing.
  rl = demo.main(["--quick", "--rlvr", "--workdir", str(tmp_path)])
  assert rl["arms_run"] == 0 and rl["rlvr_run"] == 2
  assert rl["results_dir"] != out
  staged = [r for r in rl["rows"] if f"rlvr/acc/{ID}" in r]
  assert len(staged) == 2
  for r in staged:
    base = next(x for x in rows if x["name"] == r["name"])
    assert all(r[k] == base[k] for k in base)  # before-RLVR columns unchanged
    stage = json.load(open(os.path.join(summary["grid_dir"], r["name"], "rlvr",
                           "results.json")))
    assert r[f"rlvr/acc/{ID}"] == stage["eval"][f"{ID}/greedy_acc"]
    assert len(stage["rewards"]) == 2  # configs/demo.py:quick's iterations
  printed = capsys.readouterr().out
  assert "mean reward, first -> last iterations" in printed
  assert any(n == "RLVR learns" for n in
             (f["finding"] for f in rl["findings"]))
  assert any(p.endswith("rlvr.png") for p in rl["figures"])
  assert demo.main(["--quick", "--rlvr", "--workdir", str(tmp_path)]
                   )["rlvr_run"] == 0
  # Other settings get their own results folder and grid.
  other = demo.main(["--quick", "--workdir", str(tmp_path),
                     "--config", "configs/demo.py:arm_steps=2"])
  assert other["results_dir"] != out and os.path.isdir(out)
  assert len([p for p in os.listdir(tmp_path) if p.startswith("grid-")]) == 2


def test_cache_keys_name_paths_inside_the_workdir_by_their_relative_part():
  def settings(root, other="/data/x.jsonl"):
    return {"tokenizer": f"{root}/models/tokenizer-1", "files": [other],
            "student": {"path": f"{root}/models/student-2/hf_student"}}
  key = build.cache_key(settings("/a/demo"), root="/a/demo")
  assert key == build.cache_key(settings("/b/c/demo"), root="/b/c/demo")
  # Another relative path, or another file outside the workdir, is another key.
  assert key != build.cache_key(settings("/a/demo") | {"tokenizer": (
      "/a/demo/models/tokenizer-9")}, root="/a/demo")
  assert key != build.cache_key(settings("/a/demo", "/data/y.jsonl"),
                                root="/a/demo")
  # A sibling that merely starts with the workdir's name is not inside it.
  assert (build.cache_key({"p": "/a/demo2/x"}, root="/a/demo") ==
          build.cache_key({"p": "/a/demo2/x"}))
  assert build.cache_key(settings("/a/demo")) != build.cache_key(
      settings("/b/demo"))  # without root, paths count as they are


@pytest.mark.slow
def test_a_copied_workdir_trains_nothing(quick_demo, tmp_path):
  """What is cached is named by what makes it, not by where the workdir is:
  a finished workdir copied elsewhere reuses every model and arm."""
  workdir, summary, _ = quick_demo
  copy = tmp_path / "elsewhere" / "demo"
  shutil.copytree(workdir, copy)
  models_before = sorted(os.listdir(copy / "models"))
  grids_before = sorted(p for p in os.listdir(copy) if p.startswith("grid-"))
  again = demo.main(["--quick", "--workdir", str(copy)])
  assert again["arms_run"] == 0
  assert sorted(os.listdir(copy / "models")) == models_before
  assert sorted(p for p in os.listdir(copy)
                if p.startswith("grid-")) == grids_before
  assert again["results_dir"] == str(
      copy / "results" / os.path.basename(summary["results_dir"]))
  keys = ("name", f"acc/{ID}", f"acc/{HARD}", "acc/addition", "sparsity")
  assert ([[r[k] for k in keys] for r in again["rows"]] ==
          [[r[k] for k in keys] for r in summary["rows"]])


def test_accuracy_findings_are_untested_when_no_arm_improves():
  student = {f"{ID}/greedy_acc": 0.1, "addition/greedy_acc": 0.9}
  flat = [_row(kl, pol, lr, .1, .0, .9 if lr < 3e-4 else .5, .9 if lr < 3e-4 else .5)
          for kl in ("forward", "reverse") for pol in ("student", "teacher")
          for lr in (1e-4, 5e-4)]
  found = {n: ok for n, ok, _ in report.findings(
      flat, {f"{ID}/greedy_acc": 0.6}, student, 400)}
  assert found["distillation moves accuracy"] is False
  assert found["no on-policy edge"] is None
  assert found["on-policy helps on harder problems"] is None
  assert found["accuracy untested"] is None
  assert found["forgetting grows with LR"] is True  # not an accuracy-vs-arm test
  chance = dict(student, **{"addition/greedy_acc": 0.52})
  found = {n: ok for n, ok, _ in report.findings(
      flat, {f"{ID}/greedy_acc": 0.6}, chance, 400)}
  assert found["forgetting grows with LR"] is None


def test_worker_groups_deal_arms_round_robin_and_split_the_cores():
  from jaxdistill.demo import workers  # pylint: disable=g-import-not-at-top
  assert workers.groups([0, 1, 2, 3, 4, 5, 6, 7], 2, [0, 1]) == [
      ([0, 2, 4, 6], [0]), ([1, 3, 5, 7], [1])]
  assert workers.groups([2, 5, 7], 3, [0, 1, 2, 3, 4, 5, 6, 7]) == [
      ([2], [0, 1]), ([5], [2, 3, 4]), ([7], [5, 6, 7])]
  # Never more workers than arms; more workers than cores share them.
  assert workers.groups([4], 8, [0, 1]) == [([4], [0, 1])]
  assert workers.groups([0, 1, 2], 3, [0, 1]) == [
      ([0], [0]), ([1], [1]), ([2], [0])]


def test_a_failing_worker_is_named_after_the_others_finish(tmp_path):
  from jaxdistill.demo import workers  # pylint: disable=g-import-not-at-top
  with pytest.raises(RuntimeError) as e:
    workers.run_arms(["--config", "configs/nope.py", "--workdir",
                      str(tmp_path)], [0, 1, 2], 2, log=lambda _: None)
  msg = str(e.value)
  assert ("worker 1/2 (arms [1, 3]) exited with status 1; worker 2/2 (arms "
          "[2]) exited with status 1") in msg
  assert "run the same command to resume" in msg


def test_a_worker_killed_by_a_signal_is_reported_as_such():
  """A worker killed by the OOM killer prints nothing: the message used to
  say 'exited with status -9 (its error is above)' with no error above."""
  from jaxdistill.demo import workers  # pylint: disable=g-import-not-at-top
  with pytest.raises(RuntimeError) as e:
    workers.check_codes([0, -9], ["arms [1]", "arms [2]"])
  msg = str(e.value)
  assert msg.startswith(
      "worker 2/2 (arms [2]) was killed by SIGKILL (out of memory?) and "
      "printed no error: its log is the lines marked [demo worker 2/2] "
      "above; what finished is kept"), msg
  assert "error is above" not in msg and "worker 1" not in msg
  with pytest.raises(RuntimeError, match=r"worker 1/2 \(a\) was killed by "
                     r"SIGTERM and printed no error: .*; worker 2/2 \(b\) "
                     r"exited with status 1 \(its error is above\)"):
    workers.check_codes([-15, 1], ["a", "b"])
  workers.check_codes([0, 0], ["a", "b"])


def test_run_arms_names_a_worker_that_killed_itself(monkeypatch, tmp_path):
  """Through run_arms: worker 2's process sends itself SIGKILL (as the OOM
  killer would), worker 1's exits cleanly; the error names worker 2, its
  arms, the signal and where its log is."""
  from jaxdistill.demo import workers  # pylint: disable=g-import-not-at-top
  real_popen = subprocess.Popen
  started = []

  def fake_popen(cmd, **kw):
    started.append(cmd)
    code = ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
            if cmd[cmd.index("--worker-name") + 1] == "2/2" else "pass")
    return real_popen([sys.executable, "-c", code], **kw)

  monkeypatch.setattr(workers.subprocess, "Popen", fake_popen)
  monkeypatch.setattr(workers, "available_cores", lambda: [0, 1])
  with pytest.raises(RuntimeError) as e:
    workers.run_arms(["--workdir", str(tmp_path)], [0, 1, 2], 2,
                     log=lambda _: None)
  assert len(started) == 2
  assert str(e.value) == (
      "worker 2/2 (arms [2]) was killed by SIGKILL (out of memory?) and "
      "printed no error: its log is the lines marked [demo worker 2/2] "
      "above; what finished is kept: run the same command to resume")


def _copy_models(workdir, dest):
  """The quick demo's tokenizer, teacher and student (cached), no arms, and
  its compiled programs where it wrote any (not in pytest's own process:
  conftest turns JAX's persistent cache off there)."""
  shutil.copytree(workdir / "models", dest / "models")
  if (workdir / "jax_cache").is_dir():
    shutil.copytree(workdir / "jax_cache", dest / "jax_cache")


@pytest.mark.slow
def test_two_workers_give_the_table_of_one_process(quick_demo, tmp_path):
  """Arms trained by two worker processes, one core each: the same table as
  the session's quick demo (one process, both cores), up to float rounding
  (XLA's reductions split by thread count): equal accuracies, sparsity
  within 0.1 pp."""
  workdir, summary, _ = quick_demo
  _copy_models(workdir, tmp_path)
  got = demo.main(["--quick", "--workers", "2", "--workdir", str(tmp_path)])
  assert got["arms_run"] == 2 and got["seconds"]["grid_workers"] == 2
  acc = ("name", f"acc/{ID}", f"acc/{HARD}", "acc/addition", "coverage")
  assert ([[r[k] for k in acc] for r in got["rows"]] ==
          [[r[k] for k in acc] for r in summary["rows"]])
  for a, b in zip(got["rows"], summary["rows"]):
    assert a["sparsity"] == pytest.approx(b["sparsity"], abs=0.1)


@pytest.mark.slow
def test_sigterm_stops_the_workers_with_checkpoints(quick_demo, tmp_path):
  """SIGTERM to the demo while its workers train: each worker stops after
  its step in flight with a checkpoint, none is left running, and the demo
  exits 143 (128 + SIGTERM)."""
  workdir, _, _ = quick_demo
  _copy_models(workdir, tmp_path)
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  log = tmp_path / "stderr.txt"
  with open(log, "w") as err:
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxdistill.demo", "--quick", "--workers", "2",
         "--workdir", str(tmp_path), "--config",
         "configs/demo.py:arm_steps=5000"], cwd=repo, stderr=err,
        stdout=subprocess.DEVNULL)
  try:
    deadline = time.time() + 300
    while sum(len(_read(p).splitlines()) >= 2 for p in glob.glob(  # training
        str(tmp_path / "grid-*" / "*" / "metrics.jsonl"))) < 2:
      assert proc.poll() is None, log.read_text()[-3000:]
      assert time.time() < deadline, log.read_text()[-3000:]
      time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=180) == 143, log.read_text()[-3000:]
  finally:
    if proc.poll() is None:
      proc.kill()
  arms = glob.glob(str(tmp_path / "grid-*" / "*" / "checkpoints"))
  assert len(arms) == 2 and all(os.listdir(a) for a in arms)
  left = [p for p in glob.glob("/proc/[0-9]*/cmdline")
          if str(tmp_path).encode() in _read(p)]
  assert not left
  assert "stopped by SIGTERM" in log.read_text()


def _read(path):
  try:
    with open(path, "rb") as f:
      return f.read()
  except OSError:
    return b""
