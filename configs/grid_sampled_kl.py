r"""The paper's Countdown-3 grid with sampled KL (Sec. 6, App. A.2, Fig. 9).

Llama-3.1-8B-Instruct -> Llama-3.2-1B-Instruct on Countdown-3, 150 steps,
lr {1e-5, 5e-5} x student / teacher rollouts x KL direction, where the KL is
the paper's single-sample estimator: at every completion position a fresh
token is drawn (forward: from the teacher, loss -log q(y); reverse: from the
student, the score-function surrogate sg[log q(y) - log p(y)] log q(y)),
independent of the rollout's own token (loss.kind 'sampled', estimator
'fresh_forward' / 'fresh_reverse'; jaxdistill/losses/). Every other setting
is the main grid's (configs/grid_main.py, Table 3). seeds=3: 42, 43, 44.

  HF_TOKEN=hf_... python -m jaxdistill.sweep --config configs/grid_sampled_kl.py:seeds=3 \
    --workdir /runs/sampled_kl      # add --print_commands for a cluster

  python -m jaxdistill.sweep --config configs/grid_sampled_kl.py:runlocal --workdir /tmp/skl
"""
from jaxdistill import config_lib
from jaxdistill.sweep import grid as grid_lib

ESTIMATORS = ("fresh_forward", "fresh_reverse")


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, seeds=1, runlocal=False)
  c = grid_lib.main_grid_slice(arg, "families=llama,tasks=countdown")
  c.base.loss.kind = "sampled"
  c.axes = tuple(("kl", "loss.estimator", ESTIMATORS) if n == "kl"
                 else (n, f, v) for n, f, v in c.axes)
  return c
