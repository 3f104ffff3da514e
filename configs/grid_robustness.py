r"""Robustness of the main comparison (student vs teacher rollouts).

The project's own variants, one lr per sweep. The paper's own robustness
experiments are configs/grid_noclip.py (App. A.1: its lr sweep without
clipping) and configs/grid_sampled_kl.py (App. A.2: a fresh token per
position, not the rollout's own as rkl_sampled / rkl_k3 below); its longer
chains are Numina-MATH (App. A.3), not Countdown-4 as fkl_long / rkl_long.

Variants, each against both rollout policies:
  fkl, rkl                  the exact token-level KL with clipping (reference)
  fkl_noclip, rkl_noclip    no gradient clipping
  rkl_sampled               single-sample reverse-KL surrogate on the sampled
                            tokens (importance-weighted off-policy)
  rkl_k3                    the k3 estimator back-propagated: its expected
                            gradient on student samples, and on teacher
                            samples weighted by q/p (as the training step
                            does), is the FORWARD KL's (docs/method.md), kept as
                            the known trap
  fkl_long, rkl_long        longer reasoning chains: Countdown-4 and 4x the
                            generation budget (train and eval)

  # Llama-3.1-8B-Instruct -> Llama-3.2-1B-Instruct from the hub (gated:
  # HF_TOKEN); --config.base.student.path=/ckpt/... overrides either
  python -m jaxdistill.sweep --config configs/grid_robustness.py:lr=5e-5 \
    --workdir /runs/robustness      # add --print_commands for a cluster

  python -m jaxdistill.sweep --config configs/grid_robustness.py:runlocal --workdir /tmp/rob
"""
import ml_collections

from jaxdistill import config_lib
from jaxdistill.sweep import grid as grid_lib

LONG = 4  # x the base generation budget


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, lr=1e-5, seeds=1, runlocal=False)
  c = ml_collections.ConfigDict()
  # Teacher-policy arms: one teacher generation per step, kept and read by
  # the others (train/shared_rollouts.py).
  c.share_teacher_rollouts = True
  c.base_spec = f"configs/distill.py:lr={arg.lr!r},task=countdown"
  c.base = config_lib.load_config(c.base_spec)
  c.base.keep_final_only = True  # a finished arm: its final checkpoint, export
  c.base.student.path = "meta-llama/Llama-3.2-1B-Instruct"
  c.base.teacher.path = "meta-llama/Llama-3.1-8B-Instruct"
  n_new = int(c.base.rollout.max_new_tokens)
  long = dict(rollout=dict(max_new_tokens=LONG * n_new),
              data=dict(n_numbers=4))
  c.presets = dict(variant=dict(
      fkl=dict(loss=dict(kind="forward")),
      rkl=dict(loss=dict(kind="reverse")),
      fkl_noclip=dict(loss=dict(kind="forward"), optim=dict(clip_norm=None)),
      rkl_noclip=dict(loss=dict(kind="reverse"), optim=dict(clip_norm=None)),
      rkl_sampled=dict(loss=dict(kind="sampled", estimator="rkl_surrogate")),
      rkl_k3=dict(loss=dict(kind="sampled", estimator="k3")),
      fkl_long=dict(loss=dict(kind="forward"), **long),
      rkl_long=dict(loss=dict(kind="reverse"), **long)))
  c.axes = (("variant", None, ("fkl", "rkl", "fkl_noclip", "rkl_noclip",
                               "rkl_sampled", "rkl_k3", "fkl_long", "rkl_long")),
            ("policy", "rollout.policy", ("student", "teacher")))
  c.seeds = tuple(42 + i for i in range(int(arg.seeds)))  # the paper's seeds 42, 43, 44
  # One generous evaluation budget for every arm, so the long arms are not
  # the only ones allowed to think longer.
  c.eval = dict(spec="configs/eval.py:task=countdown", baseline=True,
                updates=dict(sampler=dict(max_new_tokens=LONG * 1024)))
  if arg.runlocal:
    grid_lib.make_runlocal(c, arg)
    c.presets.variant.fkl_long.rollout.max_new_tokens = LONG * 8
    c.presets.variant.rkl_long.rollout.max_new_tokens = LONG * 8
  return c
