"""The names a run config chooses from: loss kinds, estimators, reductions,
top-k variants and rollout policies.

A foundation: it imports nothing, so config_lib checks a config against these
names before anything is built, and the libraries that implement them
(jaxdistill.losses, jaxdistill.rollout) take the same tuples from here and
re-export them (`losses.KINDS`, `rollout.POLICIES`, ...). A name added here
is then offered by the config check and must be implemented by its library.
"""

KINDS = ("forward", "reverse", "jsd")   # the exact divergences
SAMPLED = "sampled"                     # single-sample estimators
CE = "ce"                               # supervised fine-tuning
LOSS_KINDS = KINDS + (SAMPLED, CE)      # every loss.kind
ESTIMATORS = ("k1", "k2", "k3", "rkl_surrogate")
REDUCTIONS = ("token_mean", "sequence_mean", "sequence_sum", "sum")
TOPK_VARIANTS = ("renorm", "tail")
# 'spectrum' is the paper's pi_lambda (lam in [-2, 2]); 'coin_mixture' a
# token-level coin flip (lam in [0, 1]), a different method.
ROLLOUT_POLICIES = ("student", "teacher", "spectrum", "coin_mixture")
