"""Every config under configs/ builds and validates; its runlocal variant runs.

Configs are discovered, so new ones are covered without editing this file.
Kinds: grid configs (configs/grid_*.py: every arm, full and runlocal, must
validate; one runlocal arm trains a step), evaluation configs (checked by
jaxdistill.evaluate.check_config; they train nothing), GRPO configs (the RL
loop's validate and one step) and distillation configs (config_lib.validate
and one step).
"""
import pathlib

import jax
import pytest

from jaxdistill import config_lib
from jaxdistill.study import grid as grid_lib

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("*.py")
                 if not p.name.startswith("_"))
ONE_DEVICE = [jax.devices()[0]]


def _kind(c) -> str:
  if "axes" in c and "base" in c:
    return "grid"
  if "eval_suites" in c:
    return "eval"
  if "grpo" in c:
    return "grpo"
  return "distill"


def _check(c):
  kind = _kind(c)
  if kind == "grid":
    runs = grid_lib.expand(c)  # also checks that arms differ only in axes
    assert runs, "a grid without runs"
    for r in runs:
      config_lib.validate(r.config)
    return runs
  if kind == "eval":
    from jaxdistill import evaluate  # pylint: disable=g-import-not-at-top
    evaluate.check_config(c)
  elif kind == "grpo":
    from jaxdistill.rl import train as rl_train  # pylint: disable=g-import-not-at-top
    rl_train.validate(c)
  else:
    config_lib.validate(c)
  return None


def test_configs_are_discovered():
  assert {"distill.py", "grid_main.py", "grid_spectrum.py",
          "grid_robustness.py", "grid_countdown_harder.py"} <= set(CONFIGS)


@pytest.mark.parametrize("name", CONFIGS)
def test_config_builds_and_validates(name):
  for arg in ("", "runlocal"):
    c = grid_lib.load_config(f"configs/{name}" + (f":{arg}" if arg else ""))
    _check(c)


@pytest.mark.parametrize("name", CONFIGS)
def test_grid_docstring_has_a_launch_command(name):
  text = (ROOT / "configs" / name).read_text()
  assert "python -m jaxdistill." in text and "runlocal" in text


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_runlocal_trains_one_step(name, tmp_path):
  c = grid_lib.load_config(f"configs/{name}:runlocal")
  kind = _kind(c)
  if kind == "eval":
    return  # evaluation configs train nothing; validated above
  if kind == "grid":
    c = grid_lib.expand(c)[0].config  # one arm
  c.total_steps, c.ckpt_every, c.eval_every = 1, 1, 1
  c.progress, c.export_hf = False, False
  if kind == "grpo":
    from jaxdistill.rl import train as rl_train  # pylint: disable=g-import-not-at-top
    m = rl_train.train(c, str(tmp_path), devices=ONE_DEVICE)
  else:
    from jaxdistill import train  # pylint: disable=g-import-not-at-top
    m = train.train(c, str(tmp_path), devices=ONE_DEVICE)
  assert m and all(v == v for v in m.values())  # a step ran, nothing is NaN
