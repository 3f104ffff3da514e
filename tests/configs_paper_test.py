"""Each experiment config's settings against the paper's (arXiv 2609.35259).

The expected values are written here from the paper's text (the section in
each comment), not read from the configs: a config that drifts from the
paper fails. The RLVR and teacher stages are checked in tests/configs_test.py
(Table 4, App. D.2.2).
"""
import pytest

from jaxdistill import config_lib
from jaxdistill.evaluate import programs as eval_programs
from jaxdistill.sweep import grid as grid_lib

LLAMA = ("meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.1-8B-Instruct")
QWEN = ("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct")

# Table 3 (App. D.3): the distillation settings every grid shares unless its
# section says otherwise. max_new_tokens: 512 Countdown-3, 1,024 MCQ.
TABLE3 = {"total_steps": 150, "data.batch_size": 32, "optim.b1": 0.9,
          "optim.b2": 0.999, "optim.eps": 1e-8, "optim.weight_decay": 0.0,
          "optim.schedule": "constant", "optim.warmup_steps": 10,
          "optim.clip_norm": 1.0, "student.temperature": 1.0,
          "teacher.temperature": 0.5, "data.max_prompt_len": 2048,
          "loss.reduction": "sequence_mean"}


def _get(c, key):
  node = c
  for k in key.split("."):
    node = node[k]
  return node


def _arms(spec):
  return grid_lib.expand(config_lib.load_config(spec))


def _factor_values(runs, name):
  return sorted({r.factors[name] for r in runs}, key=str)


def _models(run):
  return (run.config.student.path, run.config.teacher.path)


def _check_table3(run, **changed):
  want = dict(TABLE3, **changed)
  assert {k: _get(run.config, k) for k in want} == want


# Sec. 4.1 / Fig. 1 / App. D.3: Llama, three tasks, KL x policy x
# lr {1e-5, 5e-5}, seeds 42-44; App. A.5: the same with Qwen2.5-7B -> 1.5B.
def test_main_grid_is_section_4_and_appendix_a5():
  runs = _arms("configs/grid_main.py:seeds=3")
  assert len(runs) == 2 * 3 * 2 * 2 * 2 * 3
  assert _factor_values(runs, "family") == ["llama", "qwen15b"]
  assert _factor_values(runs, "task") == ["countdown", "medical", "science"]
  assert _factor_values(runs, "kl") == ["forward", "reverse"]
  assert _factor_values(runs, "policy") == ["student", "teacher"]
  assert _factor_values(runs, "lr") == [1e-5, 5e-5]
  assert sorted({r.config.seed for r in runs}) == [42, 43, 44]
  for r in runs:
    family, task = r.factors["family"], r.factors["task"]
    assert _models(r) == (LLAMA if family == "llama" else QWEN)
    _check_table3(r, **{"rollout.max_new_tokens":
                        512 if task == "countdown" else 1024})
    want = {"countdown": ("countdown", "countdown3"),
            "science": ("mcq", "sciknoweval"),
            "medical": ("mcq", "medreason")}[task]
    assert (r.config.data.task, r.config.data.source) == want
    assert r.config.loss.kind == r.factors["kl"]
    assert r.config.rollout.policy == r.factors["policy"]


def _countdown3_llama(spec, lrs, **changed):
  runs = _arms(spec)
  assert _factor_values(runs, "lr") == lrs
  assert _factor_values(runs, "policy") == ["student", "teacher"]
  assert sorted({r.config.seed for r in runs}) == [42, 43, 44]
  for r in runs:
    assert _models(r) == LLAMA
    assert r.config.data.source == "countdown3"
    _check_table3(r, **{"rollout.max_new_tokens": 512, **changed})
  return runs


# Sec. 4.2, Fig. 2, App. D.3: lr {1, ..., 6} x 1e-5 on Countdown-3.
def test_lr_sweep_is_figure_2():
  runs = _countdown3_llama("configs/grid_lr_sweep.py:seeds=3",
                           [1e-5, 2e-5, 3e-5, 4e-5, 5e-5, 6e-5])
  assert {r.config.loss.kind for r in runs} == {"forward", "reverse"}


# App. A.1, Fig. 8: no gradient clipping, lr from 1e-5 to 5e-5.
def test_noclip_is_appendix_a1():
  runs = _countdown3_llama("configs/grid_noclip.py:seeds=3",
                           [1e-5, 2e-5, 3e-5, 4e-5, 5e-5],
                           **{"optim.clip_norm": None})
  assert {r.config.loss.kind for r in runs} == {"forward", "reverse"}


# App. A.2, Fig. 9: one fresh token per position, from the teacher (forward)
# or the student (reverse); lr {1e-5, 5e-5}, three seeds, 150 steps.
def test_sampled_kl_is_appendix_a2():
  runs = _countdown3_llama("configs/grid_sampled_kl.py:seeds=3", [1e-5, 5e-5])
  assert len(runs) == 2 * 2 * 2 * 3
  assert {(r.config.loss.kind, r.config.loss.estimator) for r in runs} == {
      ("sampled", "fresh_forward"), ("sampled", "fresh_reverse")}


# Sec. 5.2, Figs. 3-5, App. D.5: lambda in [-2, 2] (-1 teacher, +1 student),
# both policies at T 1.0 inside pi_lambda, alpha 0.2, c = 2 log 3, lr {1e-5,
# 5e-5}, seeds 42-44, Llama; App. A.5 (Fig. 15): Qwen2.5-1.5B, seed 42.
@pytest.mark.parametrize("spec,models,seeds", [
    ("configs/grid_spectrum.py:seeds=3", LLAMA, [42, 43, 44]),
    ("configs/grid_spectrum.py:family=qwen15b", QWEN, [42]),
])
def test_spectrum_is_section_5_2(spec, models, seeds):
  runs = _arms(spec)
  lams = _factor_values(runs, "lam")
  assert min(lams) == -2.0 and max(lams) == 2.0 and {-1.0, 0.0, 1.0} <= set(
      lams)
  assert _factor_values(runs, "lr") == [1e-5, 5e-5]
  assert sorted({r.config.seed for r in runs}) == seeds
  for r in runs:
    assert _models(r) == models
    assert r.config.rollout.policy == "spectrum"
    assert r.config.rollout.spectrum_temperature == 1.0
    assert r.config.data.source == "countdown3"
    _check_table3(r, **{"rollout.max_new_tokens": 512})


# Sec. 5.3 / Fig. 5 / App. A.4: pass@1 and pass@10 from 10 samples on the
# first 200 problems, Countdown-3 at T 1.0 and Countdown-4E at T 0.5 with
# 4,096 new tokens.
def test_spectrum_evaluation_is_figure_5():
  ev = config_lib.load_config("configs/eval.py:task=countdown")
  assert {"countdown3_paper", "countdown4e"} <= set(ev.eval_suites)
  assert (ev.sampler.num_samples, ev.sampler.temperature) == (10, 1.0)
  assert {1, 10} <= set(ev.sampler.ks)
  assert ev.sampler.per_suite.countdown4e.temperature == 0.5
  assert ev.sampler.per_suite.countdown4e.max_new_tokens == 4096
  assert ev.suites.countdown3_paper.num_problems == 200
  assert ev.suites.countdown4e.num_problems == 200


# App. A.12, Fig. 25: MedReason, Llama; only the generation temperatures are
# swapped (OnPD samples at 0.5, OffPD at 1.0), the KL keeps 1.0 / 0.5.
def test_temperature_ablation_is_appendix_a12():
  runs = _arms("configs/grid_temperature.py:seeds=3")
  assert len(runs) == 2 * 2 * 2 * 3
  assert _factor_values(runs, "lr") == [1e-5, 5e-5]
  assert sorted({r.config.seed for r in runs}) == [42, 43, 44]
  for r in runs:
    assert _models(r) == LLAMA
    assert r.config.data.source == "medreason"
    _check_table3(r, **{"rollout.max_new_tokens": 1024})
    student, teacher = config_lib.rollout_temperatures(r.config)
    sampled_at = student if r.factors["policy"] == "student" else teacher
    assert sampled_at == {"student": 0.5, "teacher": 1.0}[r.factors["policy"]]
    assert config_lib.temperatures(r.config) == (1.0, 0.5)


def test_generation_temperatures_leave_the_loss_alone():
  c = config_lib.load_config("configs/distill.py")
  assert config_lib.rollout_temperatures(c) == (1.0, 0.5)
  c.rollout.teacher_temperature = 0.8
  assert config_lib.rollout_temperatures(c) == (1.0, 0.8)
  assert config_lib.temperatures(c) == (1.0, 0.5)
  c.rollout.teacher_temperature = -1.0
  with pytest.raises(ValueError, match="rollout.teacher_temperature"):
    config_lib.validate(c)
  # The estimators on the rollout's own tokens need it sampled at the loss
  # temperatures; the paper's fresh-token ones do not.
  c.rollout.teacher_temperature = 1.0
  c.loss.kind, c.loss.estimator = "sampled", "k3"
  with pytest.raises(ValueError, match="rollout.student_temperature"):
    config_lib.validate(c)
  c.loss.estimator = "fresh_forward"
  config_lib.validate(c)


# Sec. 5.3, App. D.6: the 24 Countdown-3 arms (Llama, KL x policy x lr
# {1e-5, 5e-5} x seeds 42-44), each followed by Table 4's RLVR with RLVR
# seed 42 whatever the distillation seed.
def test_rlvr_after_distillation_is_appendix_d6():
  from jaxdistill.sweep import rlvr  # pylint: disable=g-import-not-at-top
  c = config_lib.load_config("configs/grid_rlvr.py:seeds=3")
  runs = grid_lib.expand(c)
  assert len(runs) == 24
  _countdown3_llama("configs/grid_rlvr.py:seeds=3", [1e-5, 5e-5])
  for r in runs:
    stage = rlvr.stage_config(c, r, "/runs/arm")
    assert stage.seed == 42
    assert stage.student.path == "/runs/arm/hf_student"
    assert (stage.data.source, stage.total_steps, stage.optim.lr) == (
        "countdown4", 300, 2e-6)
    assert (stage.grpo.loss, stage.rollout.group_size) == ("dapo", 8)


# App. A.11 / D.7, Table 5: a frozen Qwen2.5-3B-Instruct teacher (no task
# tuning) -> Qwen2.5-1.5B-Instruct on Science, OnPD / OffPD x forward /
# reverse x lr {1e-5, 5e-5}, seed 42, one run each; sampling and
# distribution temperatures 1.0 for both; completions up to 2,048 tokens;
# gradient checkpointing on; the teacher conditioned on the demonstration
# and the Spanish instruction, the student on the vanilla Science prompt.
SPANISH_INSTRUCTIONS = (
    "Now answer with a response of your own, including the thinking process.",
    "Only speak in Spanish. This does not apply to the special <think></think> "
    "and <answer></answer> tokens or your final answer, but any reasoning or "
    "thoughts you produce should be strictly written in Spanish.")


def test_spanish_style_transfer_is_appendix_d7_table5():
  grid = config_lib.load_config("configs/grid_spanish.py")
  runs = grid_lib.expand(grid)
  assert len(runs) == 2 * 2 * 2
  assert _factor_values(runs, "kl") == ["forward", "reverse"]
  assert _factor_values(runs, "policy") == ["student", "teacher"]
  assert _factor_values(runs, "lr") == [1e-5, 5e-5]
  for r in runs:
    c = r.config
    assert r.config.seed == 42
    assert _models(r) == ("Qwen/Qwen2.5-1.5B-Instruct",
                          "Qwen/Qwen2.5-3B-Instruct")
    assert (c.data.task, c.data.source, c.data.prompt) == (
        "mcq", "sciknoweval", "science")
    _check_table3(r, **{"rollout.max_new_tokens": 2048,
                        "teacher.temperature": 1.0})
    assert config_lib.rollout_temperatures(c) == (1.0, 1.0)
    assert config_lib.temperatures(c) == (1.0, 1.0)
    assert c.student.remat == "full"
    t = c.data.teacher_prompt
    assert t.startswith("{prompt}") and "{demonstration}" in t
    assert t.index("{demonstration}") < t.index(SPANISH_INSTRUCTIONS[0])
    assert t.endswith("\n\n".join(SPANISH_INSTRUCTIONS))
    assert c.data.get("system") is None and c.data.get("teacher_system") is None


# Table 5: 1,000 responses per condition, 200 each from Science train and
# test, MedReason test, GSM8K test and Countdown-3 test (the project has no
# GSM8K: four of the five, docs/experiments.md), under the standard protocol
# (one completion at T 0.5, 2,048 tokens), each judged for language.
def test_spanish_style_evaluation_is_table5():
  from jaxdistill.sweep import inputs  # pylint: disable=g-import-not-at-top
  grid = config_lib.load_config("configs/grid_spanish.py")
  ev = inputs.eval_config(grid, grid_lib.expand(grid)[0])
  assert ev.language == "es"
  assert set(ev.eval_suites) == {"science", "science_train", "medical",
                                 "countdown3_paper"}
  want = {"science": ("sciknoweval", "test"),
          "science_train": ("sciknoweval", "train"),
          "medical": ("medreason", "test"),
          "countdown3_paper": ("countdown3", "test")}
  for name, (source, split) in want.items():
    s = ev.suites[name]
    assert (s.source, s.split, s.num_problems) == (source, split, 200)
    assert s.get("data_seed") is None  # the first 200, in stored order
  assert ev.sampler.single_temperature == 0.5
  assert ev.sampler.max_new_tokens == 2048
  assert ev.sampler.num_samples == 0


# App. A.3 (Figs. 10-11): Qwen2.5-Math-1.5B-Instruct -> Qwen2.5-1.5B-Instruct
# on the 20K Numina-MATH set, OnPD / OffPD x forward / reverse full KL x lr
# {1e-5, 5e-5}; both policies generate at T 0.7, top-p 0.8, up to 1,024
# tokens; KL temperatures 1; 1,000 steps, effective batch 128, constant LR
# after 10 warm-up steps, all parameters; checkpoints evaluated every 100
# steps on MATH-500 with ten generations per problem.
def test_math_grid_is_appendix_a3():
  runs = _arms("configs/grid_math.py")
  assert len(runs) == 8
  assert _factor_values(runs, "kl") == ["forward", "reverse"]
  assert _factor_values(runs, "policy") == ["student", "teacher"]
  assert _factor_values(runs, "lr") == [1e-5, 5e-5]
  for r in runs:
    assert _models(r) == ("Qwen/Qwen2.5-1.5B-Instruct",
                          "Qwen/Qwen2.5-Math-1.5B-Instruct")
    _check_table3(r, **{"total_steps": 1000, "data.batch_size": 128,
                        "teacher.temperature": 1.0,
                        "rollout.max_new_tokens": 1024,
                        "rollout.student_temperature": 0.7,
                        "rollout.teacher_temperature": 0.7,
                        "rollout.top_p": 0.8, "ckpt_every": 100,
                        "eval_every": 100})
    assert (r.config.data.task, r.config.data.source) == ("math", "numina_math")
    config_lib.validate_run(r.config)  # a task the trainer accepts
    assert r.config.loss.kind == r.factors["kl"]
    assert r.config.loss.teacher_topk is None       # full vocabulary
    assert r.config.student.lora.rank in (None, 0)  # full fine-tune
  ev = config_lib.load_config(grid_lib.eval_spec(
      config_lib.load_config("configs/grid_math.py"), runs[0]))
  assert ev.in_distribution == ("math500",)
  assert ev.sampler.num_samples == 10
  assert ev.sampler.per_suite.math500.max_new_tokens == 1024
  assert ev.suites.math500.source == "math500"
  assert ev.suites.math500.num_problems == 500    # all of MATH-500
  # Counted in the sweep's cost: 500 problems, one T-0.5 sample per problem
  # in calls of 80 prompts, ten samples in calls of 80 // 10 prompts.
  calls, uncounted = eval_programs.decode_calls(ev, ["math500"])
  assert uncounted == []
  assert sorted(calls.values()) == [-(-500 // 80), -(-500 // (80 // 10))]
