r"""GRPO with the Countdown verifier (RLVR), from any student checkpoint.

Sweepable args (after the colon): n (Countdown-n numbers, 3..6, the project's
own generator), lr, g (samples per prompt), kl (coefficient beta of the KL to
the initial policy), avg (token | sequence), seed, paper (the paper's RLVR
stage, App. D.6 and Table 4, below), runlocal (a tiny random policy; its
defaults g=4, lr=1e-3 apply to the args not given).

`paper` is Table 4 (arXiv 2609.35259): a fresh LoRA, rank 256, alpha 256,
on the q, k, v, o, gate, up and down projections of the frozen policy (the
distilled student; docs/training.md, "LoRA"), loaded in bfloat16 and held in
4 bits (NF4 in blocks of 64, QLoRA's format: the paper says only "4-bit"),
AdamW (float32 moments; the paper's are 8-bit), the paper's Countdown-4 (5,000 problems, seed 42; Table 1's prompt, the step
verifier), reward 2 for right and 0 otherwise, GRPO with the DAPO loss
(grpo.py: token-level mean over all completion tokens of the step, clip
0.2 / 0.28, no KL), 8 completions per prompt at T 1.0 and top-p 0.95,
6 groups of 8 per optimizer step, completions up to 1,024 tokens, prompts up
to 2,048, 300 steps, LR 2e-6 cosine after 30 warm-up steps (10 %), clip 1.0,
seed 42, logged every 5 steps, checkpoints every 50. The paper accumulates
16 micro-batches of 3 on one GPU; here 2 of 24 (3 rows per chip of 8): the
loss is normalised over all 48 rows either way, so the update is the same
(tests/rl/dapo_test.py); set optim.grad_accum to fit other slices. `n`,
`avg` and `kl` are refused with it.

  # From a distillation workdir (its hf_student/ export), any HF directory or
  # hub name (default: Qwen/Qwen2.5-0.5B-Instruct):
  python -m jaxdistill.rl.train --config configs/grpo_countdown.py:n=3,lr=1e-6 \
    --config.student.path=/runs/qwen_rkl_on --workdir /runs/qwen_rkl_on_grpo

  # The paper's RLVR stage (Table 4: Countdown-4, 2 for right, DAPO, top-p):
  python -m jaxdistill.rl.train --config configs/grpo_countdown.py:paper \
    --config.student.path=/runs/qwen_rkl_on --workdir /runs/qwen_rkl_on_rlvr

  # Tiny random model, tiny tokenizer built in the workdir, CPU:
  python -m jaxdistill.rl.train --config configs/grpo_countdown.py:runlocal \
    --workdir /tmp/grpo

Objective (jaxdistill/rl/grpo.py): advantages (r - mean_g r) / (std_g r +
adv_eps) per group of g samples; clipped ratio against the sampler's tempered
log-probs with clip range [1 - clip_low, 1 + clip_high]; averaging
`grpo.reduction` ('sequence_mean': mean over a row's tokens, then over rows,
as in the original GRPO; 'token_mean': over all tokens of the mini-batch, as
grpo.loss 'dapo' requires);
KL penalty on the sampled tokens with estimator k3, whose gradient is that of
the FORWARD KL(pi_ref || pi_theta) (its value estimates the reverse one;
k2 follows the reverse KL). rl/kl_ref logs KL(pi_theta || pi_ref) (k3 value).
"""
import ml_collections
from ml_collections import config_dict

from jaxdistill import config_lib

TINY = dict(family="llama", vocab_size=320, hidden_size=32,
            intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, eos_token_id=(2,),
            max_position_embeddings=512)


def paper_lora(c, runlocal: bool) -> None:
  """The paper's adapters for its GRPO stages (Table 4, App. D.2.2): LoRA
  256 / 256 on the frozen base loaded in bfloat16 and stored in 4 bits (NF4,
  models/quant.py). runlocal's tiny model takes rank 4 (scale 1 as 256 /
  256) and keeps its float32 base: NF4 needs projection inputs in multiples
  of 64 (hidden 32 here)."""
  rank = 4 if runlocal else 256
  c.student.lora.update(rank=rank, alpha=float(rank))
  if not runlocal:
    c.student.param_dtype = "bfloat16"  # frozen: nothing to round away
    c.student.lora.base_quant = "nf4"


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, n=3, lr=1e-6, g=8, kl=0.0, avg="sequence",
                             seed=0, paper=False, runlocal=False)
  c = ml_collections.ConfigDict()
  c.seed = arg.seed
  c.total_steps = 300
  c.log_every = 1
  c.eval_every = 50  # update sparsity vs the initial policy
  c.ckpt_every = 25
  c.keep_ckpts = 3
  # True: once the run has finished (final checkpoint saved, export written)
  # its older checkpoints are deleted (the grids set it for their arms);
  # docs/training.md, "Disk".
  c.keep_final_only = False
  c.progress = True
  c.export_hf = True
  c.track_sparsity = True
  # Weights & Biases beside TensorBoard, off unless project is set (pip
  # install wandb); mode 'online' | 'offline' | 'disabled' (None: wandb's
  # default, WANDB_MODE); name None: the workdir's name.
  c.wandb = dict(project=config_dict.placeholder(str),
                 entity=config_dict.placeholder(str),
                 mode=config_dict.placeholder(str),
                 name=config_dict.placeholder(str),
                 group=config_dict.placeholder(str))

  # A Hugging Face directory or hub name, or a distillation workdir (its
  # hf_student/); preset / init (runlocal) win over path. remat as in
  # configs/distill.py ('auto': by the policy's size).
  c.student = dict(path="Qwen/Qwen2.5-0.5B-Instruct",
                   preset=config_dict.placeholder(str), init=None,
                   dtype="bfloat16", param_dtype="float32", remat="auto",
                   overrides={},
                   lora=config_lib.lora_block())
  c.tokenizer = config_dict.placeholder(str)  # default: the student's

  # source None: the project's Countdown-n generator (not the paper's);
  # 'countdown4' (arg paper): the paper's RLVR set.
  c.data = dict(task="countdown", n_numbers=arg.n, num_problems=50_000,
                data_seed=0, split="train",
                data_dir=config_dict.placeholder(str),
                source=config_dict.placeholder(str),
                system=config_dict.placeholder(str), batch_size=32,
                max_prompt_len=256,
                # None: prompts padded to max_prompt_len; b: to the batch's
                # longest, rounded up to a multiple of b
                bucket=config_dict.placeholder(int))
  # group_size G: rows per iteration = data.batch_size * G.
  # generation_batch: rows sampled per decode call (None: all of a step's
  # at once); the same samples either way (rl/step.py's Collector).
  c.rollout = dict(policy="student", group_size=arg.g, max_new_tokens=512,
                   temperature=1.0, top_k=None, top_p=None, eos_token_ids=None,
                   decode_layout="auto",  # as configs/distill.py's
                   generation_batch=config_dict.placeholder(int))
  # reward_scale: the verifier's 1 for a right answer times this (the
  # paper's RLVR: 2, App. D.6). loss: 'grpo' (reduction and KL as set) or
  # 'dapo' (token_mean, no KL; rl/grpo.py). format_reward: None, or
  # 'think_answer' (the teachers' formatting rewards, rl/rewards.py).
  c.grpo = dict(loss="grpo", clip_low=0.2, clip_high=0.2, scale_by_std=True,
                adv_eps=1e-6, reduction=f"{arg.avg}_mean", ppo_epochs=1,
                num_minibatches=4, reward_scale=1.0,
                format_reward=config_dict.placeholder(str))
  # reference None = the initial policy; monitor logs rl/kl_ref even at coef 0.
  c.kl = dict(coef=arg.kl, estimator="k3", direction="forward",
              reference=config_dict.placeholder(str), monitor=True)
  c.optim = dict(lr=arg.lr, schedule="constant", warmup_steps=10,
                 final_lr_frac=0.0, weight_decay=0.0, b1=0.9, b2=0.999,
                 eps=1e-8, clip_norm=1.0, grad_accum=2,
                 moment_dtype=config_dict.placeholder(str))  # train/optim.py
  c.mesh = dict(data=1, fsdp=-1, tensor=1)

  if arg.paper:  # Table 4 (the docstring)
    for key, why in (("n", "the paper's RLVR set is Countdown-4"),
                     ("avg", "the DAPO loss is a mean over tokens"),
                     ("kl", "the paper's RLVR has no KL penalty (beta 0)")):
      arg.refuse(key, f"{why}; not with paper")
    c.seed = arg.given_or("seed", 42)
    c.total_steps = 300
    c.log_every, c.ckpt_every = 5, 50
    c.data.update(source="countdown4", max_prompt_len=2048, batch_size=6)
    c.rollout.update(group_size=arg.given_or("g", 8), max_new_tokens=1024,
                     temperature=1.0, top_p=0.95)
    c.grpo.update(loss="dapo", reduction="token_mean", clip_low=0.2,
                  clip_high=0.28, reward_scale=2.0, ppo_epochs=1,
                  num_minibatches=1)
    c.kl.coef = 0.0
    c.optim.update(lr=arg.given_or("lr", 2e-6), schedule="cosine",
                   warmup_steps=30, final_lr_frac=0.0, clip_norm=1.0,
                   grad_accum=2)
    paper_lora(c, arg.runlocal)
  if arg.runlocal:
    c.total_steps = 4
    c.eval_every = c.ckpt_every = 2
    c.student.update(init=TINY, dtype="float32", remat="none")
    c.tokenizer_build = dict(vocab_size=300)  # trained into <workdir>/tokenizer
    c.data.update(num_problems=64, batch_size=2,
                  # Table 1's Countdown prompt: 359-372 tiny-tokenizer tokens.
                  max_prompt_len=448 if arg.paper else 256)
    c.rollout.update(group_size=arg.given_or("g", 4), max_new_tokens=8)
    c.grpo.update(num_minibatches=2)
    c.optim.update(lr=arg.given_or("lr", 1e-3), warmup_steps=1, grad_accum=1)
  return c
