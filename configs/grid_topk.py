r"""Teacher support: the full teacher vs its top 64 vs its top 8, x KL direction
x rollout policy (student = on-policy, teacher = off-policy).

Real-scale distillation keeps only the teacher's top-k log-probs (NeMo-RL 64,
EasyDeL 20, ...); this grid measures what that truncation does to the study's
dynamics against the exact loss (topk=None). `variant` picks the top-k loss:
'renorm' (renormalised over the top-k) or 'tail' (plus one tail bucket);
see jaxdistill/losses/topk.py. Qwen2.5-7B-Instruct -> Qwen2.5-0.5B-Instruct
from the hub (configs/distill.py's; --config.base.student.path=... overrides):

  python -m jaxdistill.sweep --config configs/grid_topk.py:variant=tail,lr=1e-5 \
    --workdir /runs/topk            # add --print_commands for a cluster

  python -m jaxdistill.sweep --config configs/grid_topk.py:runlocal --workdir /tmp/topk
"""
import ml_collections

from jaxdistill import config_lib
from jaxdistill.sweep import grid as grid_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, lr=1e-5, task="countdown", variant="renorm",
                             seeds=1, runlocal=False)
  c = ml_collections.ConfigDict()
  # Teacher-policy arms: one teacher generation per step, kept and read by
  # the others (train/shared_rollouts.py).
  c.share_teacher_rollouts = True
  c.base_spec = f"configs/distill.py:lr={arg.lr!r},task={arg.task}"
  c.base = config_lib.load_config(c.base_spec)
  c.base.keep_final_only = True  # a finished arm: its final checkpoint, export
  c.base.loss.topk_variant = arg.variant
  c.axes = (("topk", "loss.teacher_topk", (None, 64, 8)),
            ("kl", "loss.kind", ("forward", "reverse")),
            ("policy", "rollout.policy", ("student", "teacher")))
  c.seeds = tuple(42 + i for i in range(int(arg.seeds)))  # the paper's seeds 42, 43, 44
  c.eval = dict(spec=f"configs/eval.py:task={arg.task}", baseline=True,
                updates={})
  if arg.runlocal:
    grid_lib.make_runlocal(c, arg)
    c.base.loss.topk_variant = arg.variant
  return c
