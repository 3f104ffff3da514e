r"""The whole study in miniature on a CPU: the settings of `python -m jaxdistill.demo`.

  python -m jaxdistill.demo                 # this config
  python -m jaxdistill.demo --quick         # get_config('quick'): the tests' run
  python -m jaxdistill.demo --config configs/demo.py:arm_steps=100,lrs=2e-4+2e-3

A Llama 3 teacher (4 layers, width 128) and student (2 layers, width 64) are
trained from scratch on small-number Countdown-3 (the student on half of it,
plus its second task: the single-digit addition facts, asked as even/odd
multiple choice); then the grid KL direction x rollout policy (student,
teacher, lambda = 0.5) x learning rate distils the teacher into the student,
60 steps per arm, each with the real training loop.

Measured on a quiet 2-core machine (seed 0): first run 8.0 min, cached rerun
2.6 min (same table). Teacher 16.7 % vs student 1.0 % greedy on held-out Countdown-3, student
85.4 % on the addition suite (chance 50 %). The grid reproduces forgetting
growing with the learning rate and sparsity falling with it; 60 steps per arm
do not move Countdown accuracy, so the accuracy findings come out untested.
"""
import ml_collections

from jaxdistill import config_lib

TEACHER = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, head_dim=32)
STUDENT = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2,
               num_attention_heads=2, num_key_value_heads=1, head_dim=32)


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, quick=False, seed=0, arm_steps=0, lrs="")
  c = ml_collections.ConfigDict()
  c.seed = arg.seed
  c.vocab_size = 512
  c.batch_size = 32
  c.max_prompt_len = 40
  c.max_new_tokens = 48
  # Training records (small-number Countdown-3, addition) and test suites.
  c.data = dict(countdown_train=1500, addition_train=2000, test_problems=96,
                data_seed=0)
  c.teacher = dict(arch=TEACHER, steps=600, lr=3e-3)
  # The student sees only a slice of the Countdown data, so it starts weaker.
  c.student = dict(arch=STUDENT, steps=400, lr=3e-3, countdown_share=0.5)
  c.grid = dict(kl=("forward", "reverse"),
                policy=(("student", 1.0), ("teacher", 0.0), ("mixture", 0.5)),
                lrs=(1e-4, 1e-3), steps=60, batch_size=16, temperature=1.0)
  c.eval = dict(num_samples=8, ks=(1, 4, 8), batch_size=96, sparsity_atol=1e-5,
                sparsity_dtype="bfloat16")
  if arg.quick:
    c.data.update(countdown_train=400, addition_train=400, test_problems=16)
    c.teacher.update(steps=60)
    c.student.update(steps=40)
    c.grid.update(kl=("forward", "reverse"), policy=(("student", 1.0),),
                  lrs=(5e-4,), steps=3, batch_size=8)
    c.eval.update(num_samples=2, ks=(1, 2), batch_size=32)
  if arg.arm_steps:
    c.grid.steps = int(arg.arm_steps)
  if arg.lrs:
    c.grid.lrs = tuple(float(x) for x in str(arg.lrs).split("+"))
  return c
