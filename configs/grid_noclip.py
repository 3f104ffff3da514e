r"""The paper's Countdown-3 grid without gradient clipping (Sec. 6, App. A.1,
Fig. 8).

Llama-3.1-8B-Instruct -> Llama-3.2-1B-Instruct on Countdown-3, forward /
reverse KL x student / teacher rollouts x lr, optim.clip_norm None, every
other setting the main grid's (configs/grid_main.py, Table 3). The paper
sweeps "from 1e-5 to 5e-5" without listing the points: this grid takes
{1, 2, 3, 4, 5} x 1e-5. seeds=3: seeds 42, 43, 44 (the paper's default;
A.1 names no count).

  HF_TOKEN=hf_... python -m jaxdistill.sweep --config configs/grid_noclip.py:seeds=3 \
    --workdir /runs/noclip          # add --print_commands for a cluster

  python -m jaxdistill.sweep --config configs/grid_noclip.py:runlocal --workdir /tmp/noclip
"""
from jaxdistill import config_lib
from jaxdistill.sweep import grid as grid_lib

LRS = (1e-5, 2e-5, 3e-5, 4e-5, 5e-5)


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, seeds=1, runlocal=False)
  c = grid_lib.main_grid_slice(arg, "families=llama,tasks=countdown")
  c.base.optim.clip_norm = None
  if not arg.runlocal:  # runlocal keeps tiny models' own rates
    c.axes = tuple((n, f, LRS if n == "lr" else v) for n, f, v in c.axes)
  return c
