r"""The paper's Numina-MATH long-rollout grid (App. A.3, Figs. 10-11).

Qwen2.5-Math-1.5B-Instruct -> Qwen2.5-1.5B-Instruct on the 20,000-example
Numina-MATH training set (data.numina_math: all MATH train problems plus
synthetic_math problems of NuminaMath-CoT drawn with seed 42), forward /
reverse full-vocabulary KL x student (OnPD) / teacher (OffPD) rollouts x lr
{1e-5, 5e-5}. Both policies generate at T 0.7, top-p 0.8 (Qwen2.5-Math's
guidance), up to 1,024 new tokens; the KL sees both at temperature 1. 1,000
steps of 128 prompts (one completion each), constant LR after 10 warm-up
steps, every parameter trained; clipping, AdamW and the reduction are Table
3's (the section changes none of them). Prompt: App. A.3's system line and
the problem (tasks.MATH), chat template, for rollouts, the loss and the
evaluation alike. The evaluation (configs/eval.py:task=math) scores MATH-500
by math-verify equivalence of the last \boxed{} from ten samples per problem
at T 0.7 (S/pass@1: accuracy), and forgetting on the other tasks and update
sparsity against the student.

The paper's importance weight for vLLM's sampler is left out on purpose: our
rollouts are sampled by the same JAX model and parameters the trainer
differentiates, so the sampling and training distributions are one.

App. A.3 evaluates a checkpoint every 100 steps and reports the best MATH-500
accuracy along the trajectory, with forgetting and sparsity at that
checkpoint, and the learning curves. Here each arm exports its student every
100 steps (export_every; exports/step_000100 ... step_000900, and hf_student
at step 1,000) and the sweep evaluates all ten (grid.eval.trajectory,
sweep/trajectory.py): the arm's row is the checkpoint with the highest
MATH-500 pass@1 (S/pass@1 of ten samples: `select`), `final/...` holds the
last checkpoint's figures, <arm>/trajectory.json every metric at every step
(Fig. 11). The baseline is evaluated once per arm. Once an arm's ten are
evaluated its nine unselected exports are deleted (keep='selected'; 'all'
keeps them: 6 GB each in float32). Checkpoints with optimizer state are
saved every 100 steps for resuming and only the final one is kept
(keep_final_only). The paper gives no seeds for this grid: 42 (seeds=3: 42,
43, 44).

  python -m jaxdistill.data.prepare numina_math --data_dir /runs/math/data
  python -m jaxdistill.data.prepare math500 --data_dir /runs/math/data
  python -m jaxdistill.sweep --config configs/grid_math.py --workdir /runs/math
  # (the sweep prepares both into <workdir>/data itself when they are missing;
  # add --print_commands for a cluster)

  python -m jaxdistill.sweep --config configs/grid_math.py:runlocal --workdir /tmp/math
"""
import ml_collections

from jaxdistill import config_lib
from jaxdistill.sweep import grid as grid_lib

STUDENT = "Qwen/Qwen2.5-1.5B-Instruct"
TEACHER = "Qwen/Qwen2.5-Math-1.5B-Instruct"
# App. A.3: both policies sample at T 0.7, top-p 0.8; the loss at T 1.
GENERATION = dict(student_temperature=0.7, teacher_temperature=0.7,
                  top_p=0.8, max_new_tokens=1024)


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, seeds=1, runlocal=False)
  c = ml_collections.ConfigDict()
  # Teacher-policy arms: one teacher generation per step, kept and read by
  # the others (train/shared_rollouts.py).
  c.share_teacher_rollouts = True
  c.base_spec = "configs/distill.py"
  c.base = config_lib.load_config(c.base_spec)
  b = c.base
  b.student.path, b.teacher.path = STUDENT, TEACHER
  b.student.temperature = b.teacher.temperature = 1.0
  b.rollout.update(GENERATION)
  b.data.update(task="math", source="numina_math", split="train",
                batch_size=128)
  b.total_steps = 1000
  b.optim.update(schedule="constant", warmup_steps=10)
  # Sparsity logged, a checkpoint saved and the student exported every 100
  # steps; the final checkpoint kept.
  b.eval_every = b.ckpt_every = b.export_every = 100
  b.keep_final_only = True
  c.axes = (("kl", "loss.kind", ("forward", "reverse")),
            ("policy", "rollout.policy", ("student", "teacher")),
            ("lr", "optim.lr", (1e-5, 5e-5)))
  c.seeds = tuple(42 + i for i in range(int(arg.seeds)))
  trajectory = dict(select="math500/pass@1", keep="selected")
  c.eval = dict(spec="configs/eval.py:task=math", baseline=True, updates={},
                trajectory=trajectory)
  if arg.runlocal:  # tiny random models on synthetic prompts
    grid_lib.make_runlocal(c, arg)
    c.base.export_every = 1  # of 2 steps: two checkpoints to choose from
    c.eval.trajectory = dict(trajectory, select=None)  # runlocal's Countdown
  return c
