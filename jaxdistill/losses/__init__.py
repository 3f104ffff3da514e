"""Distillation losses: exact token-level divergences, sampled estimators and a
memory-bounded fused path from hidden states, divergences against the
teacher's top-k (renormalised, or with a tail bucket), the cross-entropy of
supervised fine-tuning, and the reduction weights they all share.
Definitions: docs/method.md."""
from jaxdistill import choices
from jaxdistill.losses._common import check_reduction
from jaxdistill.losses._common import KINDS
from jaxdistill.losses._common import reduction_weights
from jaxdistill.losses._common import REDUCTIONS
from jaxdistill.losses.cross_entropy import CE
from jaxdistill.losses.cross_entropy import cross_entropy
from jaxdistill.losses.divergence import divergence
from jaxdistill.losses.divergence import forward_kl
from jaxdistill.losses.divergence import jsd
from jaxdistill.losses.divergence import logit_gradient
from jaxdistill.losses.divergence import reverse_kl
from jaxdistill.losses.divergence import token_divergence
from jaxdistill.losses.fused import DEFAULT_CHUNK_SIZE
from jaxdistill.losses.fused import fused_divergence
from jaxdistill.losses.fused import fused_topk_divergence
from jaxdistill.losses.sampled import ESTIMATORS
from jaxdistill.losses.sampled import FRESH
from jaxdistill.losses.sampled import fresh_sampled_kl
from jaxdistill.losses.sampled import importance_weights
from jaxdistill.losses.sampled import SAMPLED
from jaxdistill.losses.sampled import sampled_kl
from jaxdistill.losses.sampled import sampled_kl_from_logits
from jaxdistill.losses.topk import teacher_topk
from jaxdistill.losses.topk import TeacherTopK
from jaxdistill.losses.topk import topk_divergence
from jaxdistill.losses.topk import topk_forward_kl
from jaxdistill.losses.topk import topk_jsd
from jaxdistill.losses.topk import topk_logit_gradient
from jaxdistill.losses.topk import topk_reverse_kl
from jaxdistill.losses.topk import VARIANTS as TOPK_VARIANTS

# Every loss.kind a training config may name: the exact divergences (KINDS),
# the sampled estimators and supervised cross-entropy.
LOSS_KINDS = choices.LOSS_KINDS

__all__ = [
    "divergence", "forward_kl", "reverse_kl", "jsd", "token_divergence",
    "logit_gradient", "fused_divergence", "fused_topk_divergence",
    "sampled_kl", "sampled_kl_from_logits", "importance_weights",
    "fresh_sampled_kl", "FRESH",
    "cross_entropy", "reduction_weights", "check_reduction",
    "KINDS", "LOSS_KINDS", "SAMPLED", "CE", "REDUCTIONS", "ESTIMATORS",
    "DEFAULT_CHUNK_SIZE", "TeacherTopK", "TOPK_VARIANTS", "teacher_topk",
    "topk_divergence", "topk_forward_kl", "topk_reverse_kl", "topk_jsd",
    "topk_logit_gradient",
]
