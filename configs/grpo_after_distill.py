r"""RLVR after one arm of the distillation grid, by hand: GRPO on Countdown,
then evaluation on Countdown-3..6 (does on-policy distillation's edge on harder
variants survive an RL stage?).

`python -m jaxdistill.sweep --config configs/grid_countdown_harder.py` runs
this stage after every arm by itself (jaxdistill/sweep/rlvr.py: resume, skip,
evaluation, before/after tables); this config is the same stage for one arm.

Args: n (Countdown-n for the RL stage), lr, g, kl, seed, runlocal, and last
`arm=<distillation workdir>`: everything after `arm=` is the path, commas
included (grid run directories are named like 'kl=reverse,policy=student,...').
Every arm gets the same RL stage (data, seed, G, lr); only the start differs.

  for arm in /runs/harder/*/; do          # configs/grid_countdown_harder.py
    out=/runs/harder_grpo/$(basename "$arm")
    python -m jaxdistill.rl.train \
      --config "configs/grpo_after_distill.py:n=3,arm=$arm" --workdir "$out"
    python -m jaxdistill.evaluate \
      --config configs/eval.py:suites=countdown3+countdown4+countdown5+countdown6,ood= \
      --checkpoint "$out" --baseline "$arm" --out "$out/eval.json"
  done

The evaluation (jaxdistill/evaluate/run.py) reads <out>/hf_student; with the
distilled arm as --baseline it also reports the RL stage's update sparsity.
Compare its Countdown-5/6 accuracy per distillation policy with the arms'
own eval.json (before RL).
"""
from jaxdistill import config_lib


def get_config(arg=None):
  arg = arg or ""
  arm = None
  if arg.startswith("arm=") or ",arm=" in arg:
    head, _, arm = arg.partition("arm=")
    arg = head.rstrip(",")
  c = config_lib.load_config(f"configs/grpo_countdown.py:{arg}")
  if arm:  # else: --config.student.path=<workdir or HF dir>
    c.student.path = arm
    # The arm's own tokenizer (its hf_student/), even for runlocal.
    c.tokenizer_build = None
  return c
