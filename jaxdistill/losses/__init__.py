"""Distillation losses: exact token-level divergences, sampled estimators and a
memory-bounded fused path from hidden states, and divergences against the
teacher's top-k (renormalised, or with a tail bucket). Definitions: docs/method.md."""
from jaxdistill.losses._common import KINDS
from jaxdistill.losses._common import REDUCTIONS
from jaxdistill.losses.divergence import divergence
from jaxdistill.losses.divergence import forward_kl
from jaxdistill.losses.divergence import jsd
from jaxdistill.losses.divergence import reverse_kl
from jaxdistill.losses.divergence import token_divergence
from jaxdistill.losses.fused import DEFAULT_CHUNK_SIZE
from jaxdistill.losses.fused import fused_divergence
from jaxdistill.losses.fused import fused_topk_divergence
from jaxdistill.losses.sampled import ESTIMATORS
from jaxdistill.losses.sampled import sampled_kl
from jaxdistill.losses.topk import teacher_topk
from jaxdistill.losses.topk import TeacherTopK
from jaxdistill.losses.topk import topk_divergence
from jaxdistill.losses.topk import topk_forward_kl
from jaxdistill.losses.topk import topk_jsd
from jaxdistill.losses.topk import topk_reverse_kl
from jaxdistill.losses.topk import VARIANTS as TOPK_VARIANTS

__all__ = [
    "divergence", "forward_kl", "reverse_kl", "jsd", "token_divergence",
    "fused_divergence", "fused_topk_divergence", "sampled_kl", "KINDS", "REDUCTIONS", "ESTIMATORS",
    "DEFAULT_CHUNK_SIZE", "TeacherTopK", "TOPK_VARIANTS", "teacher_topk",
    "topk_divergence", "topk_forward_kl", "topk_reverse_kl", "topk_jsd",
]
