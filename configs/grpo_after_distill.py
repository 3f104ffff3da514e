r"""RLVR after one arm of the distillation grid, by hand: the paper's RLVR stage
(App. D.6, Table 4: configs/grpo_countdown.py:paper, its docstring lists the
settings), then evaluation on Countdown-3..6 (does on-policy distillation's
edge on harder variants survive an RL stage?).

`python -m jaxdistill.sweep --config configs/grid_countdown_harder.py` runs
an RL stage after every arm by itself (jaxdistill/sweep/rlvr.py: resume, skip,
evaluation, before/after tables); this config is the stage for one arm.

Args: those of configs/grpo_countdown.py, with `paper` on by default
(`paper=False` for the project's own Countdown-n generator and GRPO loss:
then n, kl, avg apply), and last `arm=<distillation workdir>`: everything
after `arm=` is the path, commas included (grid run directories are named
like 'kl=reverse,policy=student,...'). Every arm gets the same RL stage
(data, seed 42, G, lr); only the start differs. As the paper, fresh LoRA
adapters (rank 256, alpha 256) train on the frozen distilled checkpoint held
in 4 bits (NF4); float32 Adam moments where the paper's AdamW keeps 8-bit
ones.

  for arm in /runs/harder/*/; do          # configs/grid_countdown_harder.py
    out=/runs/harder_grpo/$(basename "$arm")
    python -m jaxdistill.rl.train \
      --config "configs/grpo_after_distill.py:arm=$arm" --workdir "$out"
    python -m jaxdistill.evaluate \
      --config configs/eval.py:suites=countdown3+countdown4+countdown5+countdown6,ood= \
      --checkpoint "$out" --baseline "$arm" --out "$out/eval.json"
  done
  # Tiny random policy, CPU:
  python -m jaxdistill.rl.train --config configs/grpo_after_distill.py:runlocal \
    --workdir /tmp/rlvr

The evaluation (jaxdistill/evaluate/run.py) reads <out>/hf_student; with the
distilled arm as --baseline it also reports the RL stage's update sparsity.
Compare its Countdown-5/6 accuracy per distillation policy with the arms'
own eval.json (before RL). The training reward (rl/reward_mean, 2 for right:
half of it is the fraction right) is logged every 5 steps, Fig. 6's curves.
"""
from jaxdistill import config_lib


def get_config(arg=None):
  arg = arg or ""
  arm = None
  if arg.startswith("arm=") or ",arm=" in arg:
    head, _, arm = arg.partition("arm=")
    arg = head.rstrip(",")
    if not arm.strip():
      # An empty arm= (an unset shell variable) would train the config's own
      # student instead of the arm's.
      raise ValueError("configs/grpo_after_distill.py: arm= names no "
                       "distillation workdir (empty); give arm=<workdir>")
  # `paper` first, so that a paper=False given after it wins.
  c = config_lib.load_config(
      f"configs/grpo_countdown.py:paper{',' + arg if arg else ''}")
  if arm:  # else: --config.student.path=<workdir or HF dir>
    c.student.path = arm
    # The arm's weights and tokenizer (its hf_student/), even for runlocal:
    # an init block would make the path unread (models.hub.weights_spec).
    c.student.init = None
    c.tokenizer_build = None
  return c
