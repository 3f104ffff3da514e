r"""The rollout spectrum: lambda in {0, .25, .5, .75, 1} x forward / reverse KL.

Rollouts are a token-level mixture (policy='coin_mixture'): each token comes from
the student with probability lambda, else from the teacher; lambda = 1 is
on-policy, 0 teacher-generated. One family and task (Countdown-3 by default):
Qwen2.5-7B-Instruct -> Qwen2.5-0.5B-Instruct from the hub (configs/distill.py's;
--config.base.student.path=/ckpt/... overrides either):

  python -m jaxdistill.sweep --config configs/grid_spectrum.py:lr=1e-5,seeds=3 \
    --workdir /runs/spectrum        # add --print_commands for a cluster

  python -m jaxdistill.sweep --config configs/grid_spectrum.py:runlocal --workdir /tmp/spec
"""
import ml_collections

from jaxdistill import config_lib
from jaxdistill.sweep import grid as grid_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, lr=1e-5, task="countdown", seeds=1,
                             runlocal=False)
  c = ml_collections.ConfigDict()
  c.base_spec = f"configs/distill.py:policy=coin_mixture,lr={arg.lr!r},task={arg.task}"
  c.base = config_lib.load_config(c.base_spec)
  c.axes = (("kl", "loss.kind", ("forward", "reverse")),
            ("lam", "rollout.lam", (0.0, 0.25, 0.5, 0.75, 1.0)))
  c.seeds = tuple(range(int(arg.seeds)))
  c.eval = dict(spec=f"configs/eval.py:task={arg.task}", baseline=True,
                updates={})
  if arg.runlocal:
    c.axes = (("kl", "loss.kind", ("forward", "reverse")),
              ("lam", "rollout.lam", (0.0, 0.5, 1.0)))
    grid_lib.make_runlocal(c, arg)
    c.base.rollout.policy = "coin_mixture"
  return c
