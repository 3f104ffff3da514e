"""Every config under configs/ builds and validates; its runlocal variant runs.

Configs are discovered, so new ones are covered without editing this file.
Kinds: grid configs (configs/grid_*.py: every arm, full and runlocal, must
validate; one runlocal arm trains a step), evaluation configs (checked by
jaxdistill.evaluate.check_config; they train nothing), GRPO configs (the RL
loop's validate and one step), distillation configs (config_lib.validate
and one step), and others (settings of another entry point, such as
configs/demo.py: they must build; their own tests run them).
"""
import pathlib

import jax
import pytest

from jaxdistill import config_lib
from jaxdistill.evaluate import run as evaluate_run
from jaxdistill.rl import train as rl_train
from jaxdistill.sweep import grid as grid_lib
from jaxdistill.train import loop as train_loop

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
  if "loss" in c and "rollout" in c:
    return "distill"
  return "other"  # e.g. configs/demo.py: settings of another entry point


def _check(c):
  kind = _kind(c)
  if kind == "grid":
    runs = grid_lib.expand(c)  # also checks that arms differ only in axes
    assert runs, "a grid without runs"
    for r in runs:
      config_lib.validate(r.config)
    return runs
  if kind == "eval":
    evaluate_run.check_config(c)
  elif kind == "other":
    pass  # built; its own entry point's tests run it
  elif kind == "grpo":
    rl_train.validate(c)
  else:
    config_lib.validate(c)
  return None


def test_configs_are_discovered():
  assert {"distill.py", "grid_main.py", "grid_spectrum.py",
          "grid_robustness.py", "grid_countdown_harder.py"} <= set(CONFIGS)


def _load_runlocal(name):
  """The runlocal variant; None for an 'other' config that has none."""
  try:
    return config_lib.load_config(f"configs/{name}:runlocal")
  except ValueError as e:
    if "unknown key 'runlocal'" in str(e) and _kind(
        config_lib.load_config(f"configs/{name}")) == "other":
      return None
    raise


@pytest.mark.parametrize("name", CONFIGS)
def test_config_builds_and_validates(name):
  c = config_lib.load_config(f"configs/{name}")
  _check(c)
  local = _load_runlocal(name)
  if local is not None:
    assert _kind(local) == _kind(c)
    _check(local)


@pytest.mark.parametrize("name", CONFIGS)
def test_docstring_has_a_launch_command(name):
  text = (ROOT / "configs" / name).read_text()
  assert "python -m jaxdistill." in text
  if _kind(config_lib.load_config(f"configs/{name}")) != "other":
    assert "runlocal" in text


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_runlocal_trains_one_step(name, tmp_path):
  c = _load_runlocal(name)
  kind = "other" if c is None else _kind(c)
  if kind in ("eval", "other"):
    return  # they train nothing through train_loop.train; built and checked above
  if kind == "grid":
    c = grid_lib.expand(c)[0].config  # one arm
  c.total_steps, c.ckpt_every, c.eval_every = 1, 1, 1
  c.progress, c.export_hf = False, False
  if kind == "grpo":
    m = rl_train.train(c, str(tmp_path), devices=ONE_DEVICE)
  else:
    m = train_loop.train(c, str(tmp_path), devices=ONE_DEVICE)
  assert m and all(v == v for v in m.values())  # a step ran, nothing is NaN
