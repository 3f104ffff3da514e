r"""The paper's RLVR after distillation (Sec. 5.3, Figs. 6 and 26, App. D.6).

The main grid's Countdown-3 arms (configs/grid_main.py: Llama-3.1-8B-Instruct
-> Llama-3.2-1B-Instruct, forward / reverse KL x student / teacher rollouts x
lr {1e-5, 5e-5} x seeds 42, 43, 44 with seeds=3: 24 arms), then from each
arm's step-150 export the paper's RLVR stage (configs/grpo_after_distill.py,
Table 4: Countdown-4, 5,000 problems from seed 42, GRPO with the DAPO loss,
300 steps, lr 2e-6 cosine with 30 warm-up steps, 8 completions at T 1.0 and
top-p 0.95, 6 groups per step, reward 2 / 0) with RLVR seed 42 for every
arm, so that the three curves of a configuration differ by distillation seed
only. Each stage logs rl/reward_mean every 5 steps (the figures' curves, in
<arm>/rlvr/results.json 'rewards'). The paper trains fresh LoRA adapters on
the frozen distilled checkpoint; this stage follows configs/
grpo_after_distill.py (its docstring says how far that is).

  HF_TOKEN=hf_... python -m jaxdistill.sweep --config configs/grid_rlvr.py:seeds=3 \
    --workdir /runs/rlvr            # add --print_commands for a cluster

  python -m jaxdistill.sweep --config configs/grid_rlvr.py:runlocal --workdir /tmp/rlvr
"""
from jaxdistill import config_lib
from jaxdistill.sweep import grid as grid_lib

RLVR_SEED = 42


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, seeds=1, runlocal=False)
  c = grid_lib.main_grid_slice(arg, "families=llama,tasks=countdown")
  c.rlvr = dict(base_spec="configs/grpo_after_distill.py",
                updates=dict(keep_final_only=True), seed=RLVR_SEED,
                select=None)
  if arg.runlocal:
    c.rlvr.update(base_spec="configs/grpo_after_distill.py:runlocal",
                  updates=dict(progress=False, total_steps=2, ckpt_every=1,
                               keep_final_only=True))
  return c
