"""The demo: its data, tokenizer, verdicts, and the --quick run end to end."""
import ast
import json
import math
import os
import re
from fractions import Fraction

import pytest

from jaxdistill.demo import build
from jaxdistill.demo import report
from jaxdistill.demo import tasks as demo_tasks


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


@pytest.mark.parametrize("n", [3, 4])
def test_countdown_records_are_small_solvable_and_split(n):
  train = demo_tasks.countdown_records(n, 200, 0, "train")
  test = demo_tasks.countdown_records(n, 30, 0, "test")
  for r in train + test:
    assert len(r["numbers"]) == n
    # The demo's documented ranges: numbers 1-9, targets 1-100.
    assert all(1 <= x <= 9 for x in r["numbers"])
    assert 1 <= r["target"] <= 100
    assert _eval_exact(r["solution"]) == r["target"]
    used = sorted(int(t) for t in re.findall(r"\d+", r["solution"]))
    assert used == sorted(r["numbers"])
  assert not {r["target"] for r in train} & {r["target"] for r in test}


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
  from jaxdistill import tasks
  from jaxdistill.data import tokenizer as tok_lib
  recs = (demo_tasks.countdown_records(3, 300, 0) +
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
  from jaxdistill.data import pipeline
  recs = demo_tasks.countdown_records(3, 5, 0) + demo_tasks.addition_records(4, 0)
  path = build.write_records(recs, str(tmp_path), "mix")
  assert path == build.write_records(recs, str(tmp_path), "mix")  # by content
  assert path != build.write_records(recs[:-1], str(tmp_path), "mix")
  cfg = build.base_train_config(_demo_config(), tok_dir="unused", records=path,
                                seed=0)
  assert pipeline.records_from_config(cfg.data) == recs


def _demo_config():
  from jaxdistill.study import grid as grid_lib
  return grid_lib.load_config("configs/demo.py:quick")


def _row(kl, policy, lr, acc3, acc4, add, sp):
  return {"kl": kl, "policy": policy, "lam": {"student": 1.0, "teacher": 0.0}[policy],
          "lr": lr, "acc/countdown3": acc3, "acc/countdown4": acc4,
          "acc/addition": add, "forgetting_pp": 100 * (0.9 - add), "sparsity": sp}


def test_findings_follow_the_numbers():
  teacher = {"countdown3/greedy_acc": 0.6}
  student = {"countdown3/greedy_acc": 0.1, "addition/greedy_acc": 0.9}
  # A run built to agree with every testable headline finding ...
  agree = [_row("forward", "student", 1e-4, .50, .30, .90, .9),
           _row("forward", "teacher", 1e-4, .50, .10, .90, .9),
           _row("forward", "student", 5e-4, .52, .30, .40, .5),
           _row("forward", "teacher", 5e-4, .51, .10, .40, .5),
           _row("reverse", "student", 1e-4, .50, .30, .90, .9),
           _row("reverse", "teacher", 1e-4, .10, .10, .90, .9),
           _row("reverse", "student", 5e-4, .49, .30, .40, .5),
           _row("reverse", "teacher", 5e-4, .05, .10, .40, .5)]
  found = {n: ok for n, ok, _ in report.findings(agree, teacher, student, 400)}
  assert found == {"setup": True, "no on-policy edge": True,
                   "forward KL stable, reverse KL sensitive": True,
                   "reverse KL favours student rollouts": True,
                   "forgetting grows with LR": True, "sparsity falls with LR": True,
                   "on-policy helps on harder Countdown": True,
                   "gain survives RLVR": None}
  # ... and one built to disagree with every one of them.
  disagree = [_row("forward", "student", 1e-4, .90, .10, .90, .5),
              _row("forward", "teacher", 1e-4, .10, .30, .90, .5),
              _row("forward", "student", 5e-4, .90, .10, .90, .9),
              _row("forward", "teacher", 5e-4, .10, .30, .90, .9),
              _row("reverse", "student", 1e-4, .10, .10, .90, .5),
              _row("reverse", "teacher", 1e-4, .10, .30, .90, .5),
              _row("reverse", "student", 5e-4, .10, .10, .90, .9),
              _row("reverse", "teacher", 5e-4, .10, .30, .90, .9)]
  found = report.findings(disagree, {"countdown3/greedy_acc": 0.1}, student, 400)
  assert [ok for _, ok, _ in found] == [False] * 7 + [None]
  text = report.paragraph(found)
  assert text.startswith("This run reproduces 0 of the 6 headline findings")


def test_bad_arguments_raise_before_any_work(tmp_path):
  from jaxdistill import demo
  with pytest.raises(ValueError, match="--seed"):
    demo.main(["--quick", "--seed", "-1", "--workdir", str(tmp_path)])
  with pytest.raises(FileNotFoundError, match="config"):
    demo.main(["--config", "configs/nope.py", "--workdir", str(tmp_path)])
  assert not os.listdir(tmp_path)


@pytest.mark.slow
def test_quick_demo_table_is_complete_and_finite(tmp_path, capsys):
  from jaxdistill import demo
  summary = demo.main(["--quick", "--workdir", str(tmp_path)])
  rows = summary["rows"]
  assert len(rows) == 2 and {r["kl"] for r in rows} == {"forward", "reverse"}
  for r in rows:
    for key in ("acc/countdown3", "acc/countdown4", "acc/addition", "coverage",
                "forgetting_pp", "sparsity", "sparsity_f32"):
      assert isinstance(r[key], float) and math.isfinite(r[key]), (key, r)
      assert -100 <= r[key] <= 100
  for ev in (summary["teacher"], summary["student"]):
    assert all(math.isfinite(v) for v in ev.values())
  out = tmp_path / "results"
  for name in ("demo_table.md", "findings.md", "results.csv", "results.json"):
    assert (out / name).stat().st_size > 0
  assert summary["figures"] and all(os.path.isfile(p) for p in summary["figures"])
  printed = capsys.readouterr().out
  assert "| forward | student |" in printed and "This run reproduces" in printed
  # The rerun reuses the teacher and student and reproduces the table.
  again = demo.main(["--quick", "--workdir", str(tmp_path)])
  assert json.dumps(again["rows"], sort_keys=True) == json.dumps(rows, sort_keys=True)
  assert again["seconds"]["models"] < summary["seconds"]["models"]


def test_accuracy_findings_are_untested_when_no_arm_improves():
  student = {"countdown3/greedy_acc": 0.1, "addition/greedy_acc": 0.9}
  flat = [_row(kl, pol, lr, .1, .0, .9 if lr < 3e-4 else .5, .9 if lr < 3e-4 else .5)
          for kl in ("forward", "reverse") for pol in ("student", "teacher")
          for lr in (1e-4, 5e-4)]
  found = {n: ok for n, ok, _ in report.findings(
      flat, {"countdown3/greedy_acc": 0.6}, student, 400)}
  assert found["no on-policy edge"] is None
  assert found["on-policy helps on harder Countdown"] is None
  assert found["forgetting grows with LR"] is True  # not an accuracy-vs-arm test
  chance = dict(student, **{"addition/greedy_acc": 0.52})
  found = {n: ok for n, ok, _ in report.findings(
      flat, {"countdown3/greedy_acc": 0.6}, chance, 400)}
  assert found["forgetting grows with LR"] is None
