r"""The paper's Spanish style transfer (App. A.11, Fig. 24; App. D.7, Table 5).

A frozen, untuned Qwen2.5-3B-Instruct teacher is distilled into
Qwen2.5-1.5B-Instruct on Science (SciKnowEval), OnPD / OffPD x forward /
reverse KL x lr {1e-5, 5e-5}, seed 42. The teacher sees its own prompt
(data.teacher_prompt, TEACHER_PROMPT below): the Science task, the
example's own correct worked demonstration (the release's trace, the
record's `response`), the paper's "answer on your own" instruction and its
Spanish instruction, all in one user message under Table 1's Science system
line. The student sees the vanilla prompt. Every teacher distribution, in
OffPD rollouts and in every loss, is taken under the teacher's prompt; OnPD
samples the student under its own; both models then score the same
completion, each after its own prompt (docs/method.md, "A teacher with its
own prompt"). Table 5's changes to the standard protocol: sampling and
distribution temperatures 1.0 for both models, completions up to 2,048
tokens, gradient checkpointing on (student.remat='full'); the rest is
configs/distill.py's Table 3.

Evaluation: one completion per problem at T 0.5 (the standard protocol)
on the first 200 of Science train and test, MedReason test and Countdown-3
test, each judged Spanish or not by jaxdistill.tasks.language (langdetect,
not the paper's GPT-5; tags, mathematics, code and answer labels stripped
first): `S/single_lang_es` per suite, `style/single_lang_es` over all of
them, in each arm's eval.json. Not the paper's: its fifth suite, GSM8K test,
is missing (the project prepares no GSM8K yet), so a condition is judged on
800 responses, not 1,000.

Ours, where the paper is silent: the words linking the task and the
demonstration, one user message rather than several turns, and
data.max_teacher_prompt_len 4,096 (the student's prompt limit, 2,048, plus a
demonstration's); an example is kept when both prompts fit.

Every program fits v5e-8 with at least 43 % headroom (docs/experiments.md).

The demonstrations are SciKnowEval's release traces, which only
`--split_dir` gives (data/paper_mcq.py); without them every record is
refused in one line. Prepare once, then sweep:

  python -m jaxdistill.data.prepare sciknoweval --data_dir /data \
    --split_dir ~/Self-Distillation/data/science_data
  python -m jaxdistill.sweep --config configs/grid_spanish.py \
    --config.base.data.data_dir=/data --workdir /runs/spanish

  # Tiny random models on the project's Countdown-3 (its solver's steps as
  # the demonstration), CPU:
  python -m jaxdistill.sweep --config configs/grid_spanish.py:runlocal --workdir /tmp/spanish
"""
import ml_collections

from jaxdistill import config_lib
from jaxdistill.sweep import grid as grid_lib

STUDENT = "Qwen/Qwen2.5-1.5B-Instruct"
TEACHER = "Qwen/Qwen2.5-3B-Instruct"  # frozen Instruct, no task tuning

# The teacher's user message ({prompt}: the student's; {demonstration}: the
# record's worked solution, data.pipeline.demonstration). The last two
# paragraphs are the paper's instructions (App. D.7), verbatim.
TEACHER_PROMPT = (
    "{prompt}\n\n"
    "Here is a correct worked solution to this question:\n\n"
    "{demonstration}\n\n"
    "Now answer with a response of your own, including the thinking process."
    "\n\n"
    "Only speak in Spanish. This does not apply to the special <think></think>"
    " and <answer></answer> tokens or your final answer, but any reasoning or "
    "thoughts you produce should be strictly written in Spanish.")

# The style evaluation's suites (configs/eval.py): Science train and test,
# MedReason test, Countdown-3 test; 200 problems each.
SUITES = "science+science_train+medical+countdown3_paper"


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, runlocal=False)
  c = ml_collections.ConfigDict()
  # Teacher-policy arms: one teacher generation per step, kept and read by
  # the others (train/shared_rollouts.py).
  c.share_teacher_rollouts = True
  c.base_spec = "configs/distill.py:task=science"
  c.base = config_lib.load_config(c.base_spec)
  b = c.base
  b.keep_final_only = True
  b.student.path, b.teacher.path = STUDENT, TEACHER
  # Table 5: 1.0 for both, in sampling and inside the loss.
  b.student.temperature = b.teacher.temperature = 1.0
  b.student.remat = "full"
  b.rollout.max_new_tokens = 2048
  b.data.teacher_prompt = TEACHER_PROMPT
  b.data.max_teacher_prompt_len = 4096
  c.axes = (("kl", "loss.kind", ("forward", "reverse")),
            ("policy", "rollout.policy", ("student", "teacher")),
            ("lr", "optim.lr", (1e-5, 5e-5)))
  c.seeds = (42,)
  # The standard single sample (T 0.5, 2,048 tokens) only: no pass@k.
  style = dict(language="es", sampler=dict(num_samples=0, ks=()))
  c.eval = dict(spec=f"configs/eval.py:task=science,suites={SUITES}",
                baseline=True, updates=style)
  if arg.runlocal:
    grid_lib.make_runlocal(c, arg)
    b = c.base
    # Text prompts (the teacher's is text): the project's Countdown-3.
    b.data.update(task="countdown", source=None, num_problems=64,
                  max_prompt_len=256,
                  teacher_prompt=TEACHER_PROMPT, max_teacher_prompt_len=768)
    for m in (b.student, b.teacher):
      m.init.max_position_embeddings = 1024
      m.temperature = 1.0
    c.eval.updates.update(language="es")
  return c
