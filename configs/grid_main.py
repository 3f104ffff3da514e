r"""The study's main factorial grid: family x KL x rollout policy x lr x task.

The paper's Sec. 4 (Fig. 1, App. D.3: Llama) and its App. A.5 replication
(Figs. 13-14: Qwen2.5-7B -> 1.5B); seeds=3 gives its seeds 42, 43, 44.
Llama 3 (3.1-8B-Instruct -> 3.2-1B-Instruct) and Qwen2.5 (7B-Instruct ->
1.5B-Instruct; 0.5B-Instruct as an extra family, not the paper's, by
families=qwen05b) x forward / reverse KL x student / teacher rollouts x
lr 1e-5 / 5e-5 x science (the paper's SciKnowEval set) / medical (its
MedReason pools) / Countdown-3 (tasks.countdown.PRESETS), all three the
paper's (App. D.1; data.paper_mcq says how close the MCQ sets are). Every arm
shares data, seeds and sampler settings (the runner checks it). The
checkpoints are the study's, by hub name (the Llama repos are gated: accept
their licence and set HF_TOKEN); SciKnowEval and MedReason are prepared from
the hub into <workdir>/data before the first arm (jaxdistill.data.prepare).
The teachers are the Instruct checkpoints unless their paths name the
task-trained teachers of configs/teacher_sft.py / teacher_grpo.py (App.
D.2.2; --config.presets.family.F.teacher.path=...). Forgetting is the
paper's, the drop of the mean of seven lm-evaluation-harness benchmarks
(configs/eval.py's suite `lmeval`; `pip install 'jaxdistill[lmeval]'`; their
data sets download on first use); HumanEval executes the code the model
writes, which HF_ALLOW_CODE_EVAL=1 allows (ideally inside a sandbox; without
it the sweep is refused before any arm trains). One command per family:

  HF_ALLOW_CODE_EVAL=1 python -m jaxdistill.sweep --config configs/grid_main.py:families=llama,seeds=3 --workdir /runs/main
  HF_ALLOW_CODE_EVAL=1 python -m jaxdistill.sweep --config configs/grid_main.py:families=qwen15b,seeds=3 --workdir /runs/main
  HF_ALLOW_CODE_EVAL=1 python -m jaxdistill.sweep --config configs/grid_main.py:families=qwen05b --workdir /runs/main
  # add --print_commands for a cluster

Local checkpoints and data instead (any path flag overrides its default):

  HF_ALLOW_CODE_EVAL=1 python -m jaxdistill.sweep --config configs/grid_main.py:seeds=3 \
    --config.presets.family.llama.student.path=/ckpt/Llama-3.2-1B-Instruct \
    --config.presets.family.llama.teacher.path=/ckpt/Llama-3.1-8B-Instruct \
    --config.presets.family.qwen05b.student.path=/ckpt/Qwen2.5-0.5B-Instruct \
    --config.presets.family.qwen05b.teacher.path=/ckpt/Qwen2.5-7B-Instruct \
    --config.presets.family.qwen15b.student.path=/ckpt/Qwen2.5-1.5B-Instruct \
    --config.presets.family.qwen15b.teacher.path=/ckpt/Qwen2.5-7B-Instruct \
    --config.base.data.data_dir=/data/tfds \
    --workdir /runs/main
  # /data/tfds: where `python -m jaxdistill.data.prepare sciknoweval|medreason
  # --data_dir /data/tfds` wrote them (the runs and their suites read it).

  # Not the paper's data (the project's earlier sets, kept as extras):
  #   --config.presets.task.science.data.source=sciq
  #   --config.presets.task.medical.data.source=medmcqa
  #   --config.eval.updates.suites.science.source=sciq (and .medical: medmcqa,
  #   .medical.split=validation)

Args: families / tasks (names joined by '+'), seeds (how many), axes (the
axes kept, joined by '+'; default the study's five, family+task+kl+policy+lr;
`precision`, the student's weights stored and updated in float32 (master
weights, the default) or bfloat16 (student.param_dtype, no float32 copy;
docs/method.md section 8), only when named), runlocal (tiny CPU models, no
family or task axis; axes kl x policy unless `axes` names others, e.g.
`runlocal,axes=policy+lr`; its forgetting is 'suites'), forgetting ('lmeval',
the default, or 'suites'), unsafe_code (True: the same opt-in to HumanEval's
code execution as HF_ALLOW_CODE_EVAL=1, which lm-eval needs as well).

forgetting=suites: forgetting as accuracy on the other two study tasks
instead (not the paper's measure; no lm-eval, no code executed):

  python -m jaxdistill.sweep --config \
    configs/grid_main.py:families=llama,seeds=3,forgetting=suites \
    --workdir /runs/main_suites

Weight precision as a sixth axis (twice the arms):

  HF_ALLOW_CODE_EVAL=1 python -m jaxdistill.sweep --config \
    configs/grid_main.py:families=qwen05b,axes=family+task+kl+policy+lr+precision \
    --workdir /runs/main_precision
"""
import ml_collections
from ml_collections import config_dict

from jaxdistill import config_lib
from jaxdistill.sweep import grid as grid_lib

FAMILIES = ("llama", "qwen05b", "qwen15b")
# The paper's two families (Sec. 4.1, App. A.5): the default of `families`.
PAPER_FAMILIES = ("llama", "qwen15b")
TASKS = ("science", "medical", "countdown")
# The axes a grid keeps unless `axes` names others; `precision` is opt-in.
STUDY_AXES = "family+task+kl+policy+lr"
PRECISIONS = ("float32", "bfloat16")


# family -> (student, teacher): the study's checkpoints on the hub.
CHECKPOINTS = {
    "llama": ("meta-llama/Llama-3.2-1B-Instruct",
              "meta-llama/Llama-3.1-8B-Instruct"),
    "qwen05b": ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct"),
    "qwen15b": ("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct"),
}


# family -> rollout.decode_ahead: its teacher-policy arms decode this many
# steps' prompts in one call on the family's slice (train/batches.py; tokens
# unchanged). Measured 2026-12-06 with --compile_only (docs/tpu.md, "Decoding
# ahead"): two steps fit every task (the 7B teacher on v5e-8: 13.1 GiB of 16
# for the MCQ tasks, four steps of Countdown-3 need 15.9; the 8B teacher on
# v6e-8: four steps of Countdown-3 fit in 17.5 GiB of 32, of the MCQ tasks
# need 32.1).
DECODE_AHEAD = {"llama": 2, "qwen05b": 2, "qwen15b": 2}


def _mcq(source, prompt):
  # manual_dir None: the data set prepared by name (jaxdistill.data.prepare);
  # Table 1's prompt (tasks.mcq.PROMPTS); completions up to 1,024 tokens for
  # the MCQ tasks (Table 3).
  return dict(data=dict(task="mcq", source=source, prompt=prompt,
                        manual_dir=config_dict.placeholder(str)),
              rollout=dict(max_new_tokens=1024))


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, families="+".join(PAPER_FAMILIES),
                             tasks="+".join(TASKS), seeds=1, axes="",
                             runlocal=False, forgetting="lmeval",
                             unsafe_code=False)
  c = ml_collections.ConfigDict()
  # Teacher-policy arms: one teacher generation per step, kept and read by
  # the others (train/shared_rollouts.py).
  c.share_teacher_rollouts = True
  c.base_spec = "configs/distill.py"
  c.base = config_lib.load_config(c.base_spec)
  c.base.keep_final_only = True  # a finished arm: its final checkpoint, export
  c.presets = dict(
      family={f: dict(student=dict(path=CHECKPOINTS[f][0]),
                      teacher=dict(path=CHECKPOINTS[f][1]),
                      rollout=dict(decode_ahead=DECODE_AHEAD[f]))
              for f in FAMILIES},
      task=dict(science=_mcq("sciknoweval", "science"),
                medical=_mcq("medreason", "medreason"),
                # The paper's Countdown-3 (App. D.1, Table 1's prompt).
                countdown=dict(data=dict(task="countdown", source="countdown3"),
                               rollout=dict(max_new_tokens=512))))
  c.axes = (("family", None, tuple(arg.families.split("+"))),
            ("task", None, tuple(arg.tasks.split("+"))),
            ("kl", "loss.kind", ("forward", "reverse")),
            ("policy", "rollout.policy", ("student", "teacher")),
            ("lr", "optim.lr", (1e-5, 5e-5)),
            ("precision", "student.param_dtype", PRECISIONS))
  c.seeds = tuple(42 + i for i in range(int(arg.seeds)))  # the paper's seeds 42, 43, 44
  # In-distribution accuracy and coverage on the trained task, sparsity
  # against the student checkpoint, forgetting as the paper measures it:
  # the seven lm-eval benchmarks (configs/eval.py's default, suite lmeval);
  # forgetting=suites: accuracy on the other two families of tasks instead.
  # Suites without a path read the data prepared by name in the runs' data_dir.
  forgetting = (arg.forgetting if arg.given("forgetting") else
                "suites" if arg.runlocal else "lmeval")
  if forgetting not in ("suites", "lmeval"):
    raise ValueError("config arg forgetting: expected 'suites' or 'lmeval', "
                     f"got {forgetting!r}")
  if arg.unsafe_code and forgetting != "lmeval":
    arg.refuse("unsafe_code", "it lets lm-eval run HumanEval's code, which "
               "only forgetting=lmeval evaluates")
  if arg.runlocal and arg.given("forgetting"):
    arg.refuse("forgetting", "runlocal evaluates its tiny local suites (the "
               "lm-eval benchmarks download their data sets)")
  ev_spec = f"configs/eval.py:task={{task}},forgetting={forgetting}" + (
      ",unsafe_code=True" if arg.unsafe_code else "")
  c.eval = dict(spec=ev_spec, baseline=True,
                updates=dict(suites=dict(science=dict(path=config_dict.placeholder(str)),
                                         medical=dict(path=config_dict.placeholder(str)))))
  if arg.runlocal:
    for key in ("families", "tasks"):
      arg.refuse(key, "runlocal has no family or task axis (tiny random "
                 "models on synthetic prompts)")
  keep = (arg.axes or ("kl+policy" if arg.runlocal else STUDY_AXES)).split("+")
  names = [a[0] for a in c.axes]
  if set(keep) - set(names):
    raise ValueError(f"config arg axes={arg.axes}: no axis "
                     f"{sorted(set(keep) - set(names))[0]!r}; the axes are "
                     f"{'+'.join(names)}")
  c.axes = tuple(a for a in c.axes if a[0] in keep)
  if arg.runlocal:
    grid_lib.make_runlocal(c, arg)
  return c
