r"""The paper's Countdown-3 learning-rate sweep (Sec. 4.2, Fig. 2; App. D.3).

Llama-3.1-8B-Instruct -> Llama-3.2-1B-Instruct on Countdown-3, forward /
reverse KL x student / teacher rollouts x lr {1, 2, 3, 4, 5, 6} x 1e-5, every
other setting the main grid's (configs/grid_main.py, Table 3). The paper's
text names the rollout policies of Fig. 2 and not the KL directions; both
are kept (its forward-KL remark reads them). seeds=3: seeds 42, 43, 44.
The arms at 1e-5 and 5e-5 are the main grid's Countdown-3 arms (same
factors, one workdir can hold both).

  HF_TOKEN=hf_... python -m jaxdistill.sweep --config configs/grid_lr_sweep.py:seeds=3 \
    --workdir /runs/lr_sweep        # add --print_commands for a cluster

  python -m jaxdistill.sweep --config configs/grid_lr_sweep.py:runlocal --workdir /tmp/lrs
"""
from jaxdistill import config_lib
from jaxdistill.sweep import grid as grid_lib

LRS = (1e-5, 2e-5, 3e-5, 4e-5, 5e-5, 6e-5)


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, seeds=1, runlocal=False)
  c = grid_lib.main_grid_slice(arg, "families=llama,tasks=countdown")
  if not arg.runlocal:  # runlocal keeps tiny models' own rates
    c.axes = tuple((n, f, LRS if n == "lr" else v) for n, f, v in c.axes)
  return c
