r"""The paper's rollout-policy spectrum (Sec. 5.2, App. D.5): lambda x forward /
reverse KL on Countdown-3.

Rollouts are drawn from pi_lambda (policy='spectrum', rollout/spectrum.py):
lambda = -1 is the teacher (off-policy), +1 the student (on-policy), 0 their
normalised geometric midpoint, and beyond +-1 the clipped, plausibility-masked
extrapolations (alpha 0.2, c = 2 log 3). The paper does not list the lambdas
it ran; this grid takes the nine points -2, -1.5, ..., 2 (steps of 0.5), and
the paper's learning rates 1e-5 and 5e-5 x seeds 42, 43, 44 with seeds=3.

Temperatures: the paper mixes the two policies with both at temperature 1.0
for the spectrum (App. A.12: at lambda = +-1 its spectrum runs are OnPD and
OffPD with both generation temperatures 1.0), while the KL keeps the teacher
at 0.5 and the student at 1.0: rollout.spectrum_temperature = 1.0 here, the
loss at student.temperature / teacher.temperature (Table 3).

Models: family=llama (default) is the paper's Sec. 5.2 (Figs. 3-5,
Llama-3.1-8B-Instruct -> Llama-3.2-1B-Instruct, seeds 42, 43, 44); family=
qwen15b its App. A.5 repeat (Figs. 15-16, Qwen2.5-7B-Instruct ->
Qwen2.5-1.5B-Instruct, seed 42 only); the hub names are configs/
grid_main.py's (--config.base.student.path=/ckpt/... overrides either).
Fig. 5's coverage (pass@10 on Countdown-3 at T 1.0) and Countdown-4E (T 0.5)
are configs/eval.py:task=countdown, which every arm runs.

  HF_TOKEN=hf_... python -m jaxdistill.sweep --config configs/grid_spectrum.py:seeds=3 \
    --workdir /runs/spectrum        # add --print_commands for a cluster
  python -m jaxdistill.sweep --config configs/grid_spectrum.py:family=qwen15b \
    --workdir /runs/spectrum_qwen

  python -m jaxdistill.sweep --config configs/grid_spectrum.py:runlocal --workdir /tmp/spec
"""
import ml_collections

from jaxdistill import config_lib
from jaxdistill.sweep import grid as grid_lib

LAMS = (-2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0)


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, task="countdown", family="llama", seeds=1,
                             runlocal=False)
  c = ml_collections.ConfigDict()
  c.base_spec = f"configs/distill.py:policy=spectrum,task={arg.task}"
  c.base = config_lib.load_config(c.base_spec)
  family = config_lib.load_config("configs/grid_main.py").presets.family
  if arg.family not in family:
    raise ValueError(f"config arg family={arg.family}: not one of "
                     f"{sorted(family)}")
  c.base.student.path = family[arg.family].student.path
  c.base.teacher.path = family[arg.family].teacher.path
  c.base.keep_final_only = True  # a finished arm: its final checkpoint, export
  c.base.rollout.spectrum_temperature = 1.0
  # lambda = -1 decodes with the teacher's own program (rollout.
  # sampling_policy), so its arms of one seed (2 KLs x 2 rates) share one
  # set of teacher rollouts (train/shared_rollouts.py).
  c.share_teacher_rollouts = True
  c.axes = (("kl", "loss.kind", ("forward", "reverse")),
            ("lam", "rollout.lam", LAMS),
            ("lr", "optim.lr", (1e-5, 5e-5)))
  c.seeds = tuple(42 + i for i in range(int(arg.seeds)))
  c.eval = dict(spec=f"configs/eval.py:task={arg.task}", baseline=True,
                updates={})
  if arg.runlocal:
    if arg.given("family"):
      arg.refuse("family", "runlocal trains tiny random models")
    c.axes = (("kl", "loss.kind", ("forward", "reverse")),
              ("lam", "rollout.lam", (-2.0, 0.0, 1.0)))
    grid_lib.make_runlocal(c, arg)
    c.base.rollout.policy = "spectrum"
  return c
