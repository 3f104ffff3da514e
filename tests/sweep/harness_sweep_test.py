"""A sweep whose forgetting suite is lm-eval's, as the study's grids are by
default (configs/eval.py's forgetting=lmeval): the table's forgetting column
is, for each arm, the drop in points of the harness tasks' mean between the
baseline and the arm, as lm-eval itself scored them (each arm's eval.json
keeps lm-eval's own results; the reference is read from there, not from our
aggregate metrics); the arms' shared baseline is evaluated once, and the
arm that reuses it gets the eval.json a fresh baseline gives. Tiny random
runlocal models and two local lm-eval tasks
(tests/evaluate/harness_test.py's), so nothing downloads."""
import csv
import json
import os
import shutil

import jax
import pytest

from jaxdistill import config_lib
from jaxdistill.evaluate import run as evaluate_run
from jaxdistill.sweep import runner
from tests.evaluate import harness_test

ONE_DEVICE = [jax.devices()[0]]
TASKS = {"tiny_mcq": "acc,none", "tiny_gen": "exact_match,none"}


def test_sweep_forgetting_column_is_the_lm_eval_mean_drop(tmp_path,
                                                          monkeypatch):
  # Forty questions, so that two steps at a large rate move the tiny
  # student's scores away from its baseline's (a drop of 0 would not tell
  # the column's source apart).
  data = tmp_path / "docs.jsonl"
  data.write_text("".join(json.dumps(
      {"question": f"What is {i} + {i % 7}?",
       "choices": [str(i + i % 7 + d) for d in (0, 1, 2, 3)][::(-1) ** i],
       "label": 0 if i % 2 == 0 else 3}) + "\n" for i in range(40)))
  tasks = tmp_path / "tasks"
  tasks.mkdir()
  (tasks / "tiny_mcq.yaml").write_text(harness_test.TASK_YAML.format(data=data))
  (tasks / "tiny_gen.yaml").write_text(harness_test.GEN_YAML.format(data=data))
  # The grid's evaluation: configs/eval.py's runlocal with the lm-eval
  # suite as its forgetting suite, over the local tasks (a config file, as
  # the suite's dict fields cannot be set through grid.eval.updates).
  spec = tmp_path / "eval_lmeval.py"
  spec.write_text(
      "from jaxdistill import config_lib\n"
      "def get_config(arg=None):\n"
      "  c = config_lib.load_config("
      "'configs/eval.py:runlocal,samples=2,forgetting=lmeval')\n"
      f"  c.suites.lmeval.update(tasks={'+'.join(TASKS)!r}, "
      f"include_path={str(tasks)!r}, metrics={TASKS!r}, "
      f"limits={{'tiny_gen': 2}}, max_length={harness_test.MAX_LEN}, "
      "apply_chat_template=False)\n"
      "  return c\n")
  g = config_lib.load_config("configs/grid_main.py:runlocal")
  g.eval.spec = str(spec)
  g.base.optim.lr = 0.05
  work = tmp_path / "sweep"
  roles = []
  real = evaluate_run._evaluate  # pylint: disable=protected-access

  def counting(role, *a, **kw):
    roles.append(role)
    return real(role, *a, **kw)
  monkeypatch.setattr(evaluate_run, "_evaluate", counting)
  runner.run_sweep(g, str(work), only="kl=reverse", devices=ONE_DEVICE)
  # Both arms start from the same student under the same evaluation config:
  # the baseline is evaluated once (sweep/baselines.py), for the first arm.
  assert roles == ["checkpoint", "baseline", "checkpoint"]
  assert len(os.listdir(work / "baselines")) == 1
  with open(work / "summary" / "results.csv") as f:
    table = {r["arm"]: r for r in csv.DictReader(f)}
  arms = sorted(d for d in os.listdir(work) if d.startswith("kl="))
  assert len(arms) == 2 and len(table) == 2
  drops = []
  for d in arms:
    saved = json.loads((work / d / "eval.json").read_text())
    assert saved["metrics"]  # the study suites were scored beside it
    mean = {}
    for role in ("checkpoint", "baseline"):
      res = saved["lmeval"][role]["lmeval"]
      mean[role] = sum(res[t][k] for t, k in TASKS.items()) / len(TASKS)
    row = table[d.removesuffix(",seed=0")]
    drops.append(100 * (mean["baseline"] - mean["checkpoint"]))
    assert float(row["forgetting_pp_mean"]) == pytest.approx(drops[-1],
                                                             abs=1e-9)
    assert "countdown5" not in " ".join(saved["metrics"])  # not the OOD suite
  assert any(abs(x) > 0 for x in drops), drops

  # Exact: the second arm evaluated again with the baseline decoded afresh
  # (no store) gives the same eval.json, lm-eval's baseline results included.
  second = max(arms, key=lambda d: json.loads(
      (work / d / "results.json").read_text())["finished"])  # it reused it
  first_eval = json.loads((work / second / "eval.json").read_text())
  shutil.rmtree(work / "baselines")
  os.remove(work / second / "results.json")
  roles.clear()
  runner.run_sweep(g, str(work), only="kl=reverse", devices=ONE_DEVICE)
  assert roles == ["checkpoint", "baseline"]
  again = json.loads((work / second / "eval.json").read_text())
  for key in ("metrics", "lmeval"):
    assert again[key] == first_eval[key], key
