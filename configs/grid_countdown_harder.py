r"""Harder Countdown: train on Countdown-3 or -4, evaluate on 3, 4, 5 and 6,
then RLVR from every arm and evaluate again.

Does on-policy data help on harder, unseen variants (more numbers), and does
that gain survive a later RLVR stage? Axes: training N x KL direction x
rollout policy; evaluation on all four Countdown suites (the figure: accuracy
on Countdown-5/6 per policy). The RLVR stage (jaxdistill/sweep/rlvr.py) runs
GRPO (configs/grpo_countdown.py on the arm's Countdown-N, lr `rl_lr`) from
each arm's student in <arm>/rlvr/ and evaluates it on the same suites; the
summary tables the accuracy before RLVR, after it and the change. `rlvr=False`
drops the stage.

  # Qwen2.5-7B-Instruct -> Qwen2.5-1.5B-Instruct from the hub;
  # --config.base.student.path=/ckpt/... overrides either
  python -m jaxdistill.sweep --config configs/grid_countdown_harder.py:seeds=3 \
    --workdir /runs/harder          # add --print_commands for a cluster

  python -m jaxdistill.sweep --config configs/grid_countdown_harder.py:runlocal --workdir /tmp/hard
"""
import ml_collections

from jaxdistill import config_lib
from jaxdistill.sweep import grid as grid_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, lr=1e-5, seeds=1, rlvr=True, rl_lr=1e-6,
                             runlocal=False)
  c = ml_collections.ConfigDict()
  # Teacher-policy arms: one teacher generation per step, kept and read by
  # the others (train/shared_rollouts.py).
  c.share_teacher_rollouts = True
  c.base_spec = f"configs/distill.py:lr={arg.lr!r},task=countdown"
  c.base = config_lib.load_config(c.base_spec)
  c.base.keep_final_only = True  # a finished arm: its final checkpoint, export
  c.base.student.path = "Qwen/Qwen2.5-1.5B-Instruct"
  # The project's own Countdown-N generator (not the paper's sets): the
  # train_n axis and the Countdown-5/6 suites need N beyond the paper's.
  c.base.data.source = None
  c.axes = (("train_n", "data.n_numbers", (3, 4)),
            ("kl", "loss.kind", ("forward", "reverse")),
            ("policy", "rollout.policy", ("student", "teacher")))
  c.seeds = tuple(42 + i for i in range(int(arg.seeds)))  # the paper's seeds 42, 43, 44
  c.eval = dict(spec="configs/eval.py:suites=countdown3+countdown4+countdown5"
                "+countdown6,ood=", baseline=True, updates={})
  # A finished stage, like a finished arm: its final checkpoint and export.
  rlvr = dict(base_spec="configs/grpo_countdown.py:n={train_n},"
              f"lr={arg.rl_lr!r}", updates=dict(keep_final_only=True),
              select=None)
  if arg.runlocal:
    grid_lib.make_runlocal(c, arg, eval_spec="configs/eval.py:runlocal,"
                           "samples=2,suites=countdown3+countdown5+countdown6")
    rl_lr = f",lr={arg.rl_lr!r}" if arg.given("rl_lr") else ""
    rlvr.update(base_spec="configs/grpo_countdown.py:runlocal,n={train_n}"
                + rl_lr, updates=dict(progress=False, total_steps=2,
                                      ckpt_every=1, keep_final_only=True))
  c.rlvr = rlvr if arg.rlvr else None
  return c
