"""A training run and its evaluation with checkpoints named by hub id,
offline against a seeded Hugging Face cache (tests/hub_cache.py).

References: the commits are the seeded cache's refs; the run's sparsity
baseline is the snapshot's own safetensors file (read by safetensors.numpy
against the export), so "the student the run started from" is checked
against the file the hub name points at, not against the resolver."""
import json
import os
import shutil

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from jaxdistill import config_lib
from jaxdistill.evaluate import run as evaluate_run
from jaxdistill.models import hub
from jaxdistill.train import loop as train_loop
from tests import config_util
from tests import hub_cache

STUDENT, TEACHER = "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct"


def _config(**updates):
  """configs/distill.py:runlocal on Countdown with the hub's (tiny) Qwen
  pair: its default paths, read because `init` is cleared."""
  c = config_lib.load_config("configs/distill.py:runlocal")
  c.progress = False
  return config_util.set_fields(c, {
      "student.init": None, "teacher.init": None, "data.task": "countdown",
      "data.num_problems": 16, "data.max_prompt_len": 448, "total_steps": 2,
      "ckpt_every": 2, "eval_every": 2, **updates})


@pytest.mark.slow  # trains 2 steps and evaluates: compiles a student, a teacher, a sampler
def test_train_and_evaluate_by_hub_name(seeded_hub, tmp_path, monkeypatch):
  cache = str(tmp_path / "hf")  # a copy: the test moves a ref
  shutil.copytree(seeded_hub[0], cache, symlinks=True)
  hub_cache.use(monkeypatch, cache)
  commits = seeded_hub[1]["models"]
  c = _config()
  assert (c.student.path, c.teacher.path) == (STUDENT, TEACHER)  # the defaults
  work = str(tmp_path / "run")
  devices = [jax.devices()[0]]
  train_loop.train(c, work, devices=devices)
  with open(os.path.join(work, "config.json")) as f:
    assert json.load(f)["student"]["path"] == STUDENT  # as written
  with open(os.path.join(work, train_loop.REVISIONS)) as f:
    assert json.load(f) == {
        "student.path": {"id": STUDENT, "revision": "main",
                         "commit": commits[STUDENT]},
        "teacher.path": {"id": TEACHER, "revision": "main",
                         "commit": commits[TEACHER]}}

  # Evaluated against the hub name it started from.
  ev = evaluate_run.run(config_lib.load_config("configs/eval.py:runlocal,samples=2"),
                        work, STUDENT, out=str(tmp_path / "eval.json"))
  assert ev["revisions"] == {"baseline": {"id": STUDENT, "revision": "main",
                                          "commit": commits[STUDENT]}}
  snap = os.path.join(cache, "models--Qwen--Qwen2.5-0.5B-Instruct", "snapshots",
                      commits[STUDENT], "model.safetensors")
  before = load_file(snap)
  after = load_file(os.path.join(work, "hf_student", "model.safetensors"))
  n = sum(v.size for v in before.values())
  # S_1e-6 as the paper defines it: strict <, in float32.
  same = sum(int((np.abs(after[k].astype(np.float32) - before[k].astype(np.float32))
                  < np.float32(1e-6)).sum()) for k in before)
  assert ev["metrics"]["sparsity/S_1e-6_f32"] == pytest.approx(same / n, abs=1e-12)

  # The hub's main moves on: the same config no longer names the same
  # weights, so the run is not resumed; pinned to its commit it is.
  files = {}
  for name in os.listdir(os.path.dirname(snap)):
    with open(os.path.join(os.path.dirname(snap), name), "rb") as f:
      files[name] = f.read()
  with open(os.path.join(hub.resolve(f"{STUDENT}@v1")[0],
                         "model.safetensors"), "rb") as f:
    files["model.safetensors"] = f.read()  # other weights
  moved = hub_cache.add_repo(cache, STUDENT, files)
  with pytest.raises(ValueError) as e:
    train_loop.train(c, work, devices=devices)
  assert (f"student.path: '{STUDENT}@{commits[STUDENT]}' -> "
          f"'{STUDENT}@{moved}'") in str(e.value)
  c.student.path = f"{STUDENT}@{commits[STUDENT]}"
  train_loop.train(c, work, devices=devices)  # at its last step: resumes
  assert hub.resolve(c.student.path)[1]["commit"] == commits[STUDENT]
