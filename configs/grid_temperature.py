r"""The paper's generation-temperature ablation (App. A.12, Fig. 25).

The main grid's MedReason arms (configs/grid_main.py: Llama-3.1-8B-Instruct
-> Llama-3.2-1B-Instruct, forward / reverse KL x student / teacher rollouts x
lr {1e-5, 5e-5}; seeds=3: 42, 43, 44) with the two generation temperatures
swapped: on-policy rollouts sample the student at 0.5 (instead of 1.0),
off-policy ones the teacher at 1.0 (instead of 0.5). The loss keeps the
student at 1.0 and the teacher at 0.5 in every arm (rollout.student_
temperature / teacher_temperature change generation only). Held-out
MedReason accuracy at step 150 against grid_main's arms is Fig. 25.

  HF_TOKEN=hf_... python -m jaxdistill.sweep --config configs/grid_temperature.py:seeds=3 \
    --workdir /runs/temperature     # add --print_commands for a cluster

  python -m jaxdistill.sweep --config configs/grid_temperature.py:runlocal --workdir /tmp/temp
"""
from jaxdistill import config_lib
from jaxdistill.sweep import grid as grid_lib

# The swap: each policy generates at the other's default temperature.
GENERATION = dict(student_temperature=0.5, teacher_temperature=1.0)


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, seeds=1, runlocal=False)
  c = grid_lib.main_grid_slice(arg, "families=llama,tasks=medical")
  c.base.rollout.update(GENERATION)
  return c
