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
# On the rollout's own tokens (importance-weighted), and the paper's sampled KL
# (App. A.2): a fresh token per position from the teacher (forward) or the
# student (reverse).
ROLLOUT_TOKEN_ESTIMATORS = ("k1", "k2", "k3", "rkl_surrogate")
FRESH_ESTIMATORS = ("fresh_forward", "fresh_reverse")
ESTIMATORS = ROLLOUT_TOKEN_ESTIMATORS + FRESH_ESTIMATORS
# 'sequence_mean' is the paper's (Eq. 1): each completion's mean over its own
# tokens, then the mean over completions; 'token_mean' averages all tokens of
# the batch together.
REDUCTIONS = ("token_mean", "sequence_mean", "sequence_sum", "sum")
TOPK_VARIANTS = ("renorm", "tail")
# 'spectrum' is the paper's pi_lambda (lam in [-2, 2]); 'coin_mixture' a
# token-level coin flip (lam in [0, 1]), a different method.
ROLLOUT_POLICIES = ("student", "teacher", "spectrum", "coin_mixture")
# optim.moment_dtype: None stores each Adam moment in its parameter's dtype
# (torch AdamW on a bf16 model); or one dtype for all (train/optim.py).
MOMENT_DTYPES = (None, "float32", "bfloat16")
# rollout.decode_layout (training, GRPO) and sampler.decode_layout
# (evaluation): how a rollout lays the weights out for its decode loop
# (sharding.py, rollout/generation.py).
DECODE_LAYOUTS = ("auto", "train", "replicated", "tp")
