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
import sys

import jax
import pytest

from jaxdistill import config_lib
from jaxdistill import tasks
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
def test_config_builds_and_validates(name, monkeypatch):
  # The study's forgetting suite (lm-eval's seven benchmarks) runs
  # HumanEval's code only where the user allowed it, as a user of these
  # configs does (configs/eval.py).
  monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
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


# A value other than the default for every argument of every config; a
# (config, key, mode) entry wins over a (config, key) one, which wins over
# the key's own. A new argument needs an entry.
ARG_VALUES = {
    "kl": "reverse", "policy": "teacher", "lam": 0.25, "lr": 7e-4,
    "task": "mcq", "seed": 3, "seeds": 2, "topk": 16, "n": 4, "g": 6,
    "avg": "token", "suites": "countdown4", "ood": "countdown6", "samples": 8,
    "families": "llama", "tasks": "science", "axes": "policy", "rlvr": False,
    "rl_lr": 3e-6, "variant": "tail", "spectrum": True, "arm_steps": 7,
    "lrs": "2e-4+2e-3", "paper": True, "forgetting": "suites",
    "unsafe_code": True}
CONFIG_ARG_VALUES = {("grpo_countdown.py", "kl"): 0.05,
                     ("teacher_grpo.py", "family"): "llama",
                     ("teacher_grpo.py", "task"): "medical",
                     ("teacher_sft.py", "family"): "llama",
                     ("grpo_after_distill.py", "kl"): 0.05,
                     ("eval.py", "task"): "medical",
                     # runlocal's default is 'suites' (tiny local suites)
                     ("eval.py", "forgetting", "runlocal"): "lmeval",
                     ("grid_spectrum.py", "task"): "medical",
                     ("grid_spectrum.py", "family"): "qwen15b",
                     ("grid_topk.py", "task"): "medical",
                     ("demo.py", "rlvr"): True,
                     ("demo.py", "precisions"): "float32+bfloat16",
                     ("demo.py", "policies"): "teacher"}
MODES = ("runlocal", "quick")  # variants, not settings


def _arg_keys(name, monkeypatch):
  """The keys of the config's own parse_arg ([] if it has none; nested
  configs' ones are theirs)."""
  seen = []
  real = config_lib.parse_arg

  def parse_arg(arg, **defaults):
    if sys._getframe(1).f_code.co_filename.endswith(f"configs/{name}"):  # pylint: disable=protected-access
      seen.append(list(defaults))
    return real(arg, **defaults)
  monkeypatch.setattr(config_lib, "parse_arg", parse_arg)
  config_lib.load_config(f"configs/{name}")
  monkeypatch.undo()
  return seen[0] if seen else []


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_argument_is_applied_or_refused(name, monkeypatch):
  """configs/x.py:key=value, in every variant: the config changes, or a
  ValueError names the key. (runlocal used to replace lr by max(lr, 1e-3),
  the harder grid's lr and rl_lr under runlocal were dropped, ...)"""
  keys = _arg_keys(name, monkeypatch)
  modes = [""] + [m for m in MODES if m in keys]
  for mode in modes:
    prefix = f"configs/{name}:{mode}"
    ref = config_lib.to_json(config_lib.load_config(prefix))
    for key in keys:
      if key in MODES:
        continue
      value = CONFIG_ARG_VALUES.get((name, key, mode), CONFIG_ARG_VALUES.get(
          (name, key), ARG_VALUES.get(key, KeyError)))
      assert value is not KeyError, f"add a value for {name}'s {key!r} above"
      spec = f"{prefix}{',' if mode else ''}{key}={value}"
      try:
        got = config_lib.to_json(config_lib.load_config(spec))
      except ValueError as e:
        assert f"config arg {key}=" in str(e), (spec, str(e))
        continue
      assert got != ref, f"{spec}: the config ignores {key}={value}"


def test_an_argument_the_config_never_reads_is_refused(tmp_path):
  path = tmp_path / "mine.py"
  path.write_text(
      "from jaxdistill import config_lib\n"
      "def get_config(arg=None):\n"
      "  arg = config_lib.parse_arg(arg, used=1, unused=2, runlocal=False)\n"
      "  return {'used': arg.used if not arg.runlocal else 0}\n")
  assert config_lib.load_config(f"{path}:used=5") == {"used": 5}
  with pytest.raises(ValueError, match=r"config arg unused=3: .*mine\.py does "
                     "not use it"):
    config_lib.load_config(f"{path}:unused=3")
  # Read only outside runlocal: given with runlocal, it is refused too.
  with pytest.raises(ValueError, match="config arg used=5: "):
    config_lib.load_config(f"{path}:runlocal,used=5")


@pytest.mark.parametrize("spec,field", [
    ("configs/distill.py:runlocal,lr=-1", r"config\.optim\.lr: must be > 0"),
    ("configs/grpo_countdown.py:runlocal,lr=-1", r"config\.optim\.lr: must be > 0"),
])
def test_a_bad_value_given_under_runlocal_is_refused(spec, field):
  c = config_lib.load_config(spec)
  with pytest.raises(ValueError, match=field):
    (rl_train.validate if "grpo" in spec else config_lib.validate)(c)


# The paper's settings (arXiv 2609.35259), written here from its text: the
# RLVR stage after distillation (App. D.6, Table 4) and the teachers' GRPO
# (App. D.2.2). rows_per_step: completions per optimizer step (Table 4: 6
# groups of 8; D.2.2: 8 per device x 16 accumulation steps).
TABLE4 = {"data.source": "countdown4", "seed": 42, "total_steps": 300,
          "optim.lr": 2e-6, "optim.schedule": "cosine",
          "optim.warmup_steps": 30, "rollout.group_size": 8,
          "rollout.temperature": 1.0, "rollout.top_p": 0.95,
          "rollout.max_new_tokens": 1024, "data.max_prompt_len": 2048,
          "grpo.loss": "dapo", "kl.coef": 0.0, "grpo.reward_scale": 2.0,
          "grpo.format_reward": None, "optim.clip_norm": 1.0,
          "log_every": 5, "ckpt_every": 50, "rows_per_step": 48,
          "student.lora.rank": 256, "student.lora.alpha": 256.0,
          # "4-bit": NF4 is our reading (models/quant.py).
          "student.lora.base_quant": "nf4"}
TEACHER_GRPO = {"total_steps": 500, "optim.lr": 1e-5,
                "optim.schedule": "cosine", "optim.warmup_steps": 50,
                "rollout.group_size": 8, "rollout.temperature": 1.0,
                "rollout.top_p": 0.95, "rollout.max_new_tokens": 824,
                "data.max_prompt_len": 2048, "grpo.loss": "dapo",
                "kl.coef": 0.0, "grpo.reward_scale": 2.0,
                "grpo.format_reward": "think_answer", "optim.clip_norm": 1.0,
                "rows_per_step": 128, "student.lora.rank": 256,
                "student.lora.alpha": 256.0, "student.lora.base_quant": "nf4",
                # 8 per device x 16 accumulation; rollout batches of 32.
                "optim.grad_accum": 16, "rollout.generation_batch": 32}


def _setting(c, key):
  if key == "rows_per_step":
    return (c.data.batch_size * c.rollout.group_size
            // c.grpo.num_minibatches)
  node = c
  for k in key.split("."):
    node = node[k]
  return node


@pytest.mark.parametrize("spec,paper", [
    ("configs/grpo_countdown.py:paper", TABLE4),
    ("configs/grpo_after_distill.py", TABLE4),
    ("configs/teacher_grpo.py", TEACHER_GRPO),
    ("configs/teacher_grpo.py:family=llama,task=medical", TEACHER_GRPO),
])
def test_rl_configs_have_the_papers_settings(spec, paper):
  c = config_lib.load_config(spec)
  got = {k: _setting(c, k) for k in paper}
  assert got == paper
  # One update per rollout batch (TRL's default: generation batch =
  # accumulated batch), the DAPO paper's clip-higher, no reference KL.
  assert (c.grpo.ppo_epochs, c.grpo.clip_low, c.grpo.clip_high) == (
      1, 0.2, 0.28)
  assert c.grpo.reduction == "token_mean" and c.optim.final_lr_frac == 0.0
  if "data.source" in paper:  # Countdown-4: 5,000 problems, seed 42
    assert tasks.countdown.PRESETS["countdown4"].splits == {
        "train": (5000, 42)}
  else:  # Table 1's prompts, exact option accuracy
    assert c.data.task == "mcq" and c.data.prompt in ("science", "medreason")


# The teachers' SFT stage (App. D.2.2).
TEACHER_SFT = {"student.lora.rank": 256, "student.lora.alpha": 256.0,
               "loss.kind": "ce", "rollout.policy": "dataset",
               "loss.reduction": "token_mean", "total_steps": 500,
               "optim.lr": 5e-5, "optim.schedule": "cosine",
               "optim.warmup_steps": 10, "data.batch_size": 32,
               "optim.clip_norm": 1.0, "data.max_prompt_len": 2048,
               "rollout.max_new_tokens": 2048}


@pytest.mark.parametrize("spec", ["configs/teacher_sft.py",
                                  "configs/teacher_sft.py:family=llama"])
def test_teacher_sft_has_the_papers_settings(spec):
  c = config_lib.load_config(spec)
  assert {k: _setting(c, k) for k in TEACHER_SFT} == TEACHER_SFT


@pytest.mark.parametrize("spec, n", [
    ("families=qwen05b,tasks=countdown,axes=family+task+kl+policy+lr+precision",
     16),
    ("runlocal,axes=kl+precision", 4)])
def test_grid_main_precision_axis_is_opt_in(spec, n):
  """Named in axes, precision doubles the arms: each float32 arm has a
  bfloat16 twin that differs only in student.param_dtype; by default the
  study's five axes, float32 only, names unchanged."""
  default = grid_lib.expand(config_lib.load_config("configs/grid_main.py"))
  assert len(default) == 2 * 3 * 2 * 2 * 2  # the paper's two families
  assert {r.config.student.param_dtype for r in default} == {"float32"}
  assert not any("precision" in r.factors for r in default)
  runs = grid_lib.expand(config_lib.load_config(f"configs/grid_main.py:{spec}"))
  assert len(runs) == n
  arms = {}
  for r in runs:
    config_lib.validate(r.config)
    assert r.config.student.param_dtype == r.factors["precision"]
    rest = r.config.to_dict()
    rest["student"].pop("param_dtype")
    key = ",".join(p for p in r.name.split(",")
                   if not p.startswith("precision="))
    arms.setdefault(key, []).append((r.factors["precision"], rest))
  assert len(arms) == n // 2
  for pair in arms.values():
    assert sorted(p for p, _ in pair) == ["bfloat16", "float32"]
    assert pair[0][1] == pair[1][1]  # nothing else differs
  with pytest.raises(ValueError, match="no axis 'precisions'"):
    config_lib.load_config("configs/grid_main.py:axes=kl+precisions")


@pytest.mark.parametrize("arg", ["arm=", "runlocal,arm=", "runlocal,arm= "])
def test_rlvr_empty_arm_is_refused(arg):
  """An empty arm= (an unset shell variable in the documented loop) used to
  fall back to the config's own student: refused, naming arm=."""
  with pytest.raises(ValueError, match="arm= names no distillation workdir"):
    config_lib.load_config(f"configs/grpo_after_distill.py:{arg}")
