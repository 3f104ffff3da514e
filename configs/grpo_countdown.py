r"""GRPO with the Countdown verifier (RLVR), from any student checkpoint.

Sweepable args (after the colon): n (Countdown-n numbers, 3..6, the project's
own generator), lr, g (samples per prompt), kl (coefficient beta of the KL to
the initial policy), avg (token | sequence), seed, paper (the paper's RLVR
data and reward, App. D.6: its Countdown-4 with Table 1's prompt and step
verifier, reward 2 for right), runlocal (a tiny random policy; its defaults g=4,
lr=1e-3 apply to the args not given).

  # From a distillation workdir (its hf_student/ export), any HF directory or
  # hub name (default: Qwen/Qwen2.5-0.5B-Instruct):
  python -m jaxdistill.rl.train --config configs/grpo_countdown.py:n=3,lr=1e-6 \
    --config.student.path=/runs/qwen_rkl_on --workdir /runs/qwen_rkl_on_grpo

  # The paper's RLVR data and reward (Countdown-4, 2 for right):
  python -m jaxdistill.rl.train --config configs/grpo_countdown.py:paper \
    --config.student.path=/runs/qwen_rkl_on --workdir /runs/qwen_rkl_on_rlvr

  # Tiny random model, tiny tokenizer built in the workdir, CPU:
  python -m jaxdistill.rl.train --config configs/grpo_countdown.py:runlocal \
    --workdir /tmp/grpo

Objective (jaxdistill/rl/grpo.py): advantages (r - mean_g r) / (std_g r +
adv_eps) per group of g samples; clipped ratio against the sampler's tempered
log-probs with clip range [1 - clip_low, 1 + clip_high]; averaging
`grpo.reduction` ('sequence_mean': mean over a row's tokens, then over rows,
as in the original GRPO; 'token_mean': over all tokens of the mini-batch);
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
  c.progress = True
  c.export_hf = True
  c.track_sparsity = True

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
  c.rollout = dict(policy="student", group_size=arg.g, max_new_tokens=512,
                   temperature=1.0, top_k=None, top_p=None, eos_token_ids=None)
  # reward_scale: the verifier's 1 for a right answer times this (the
  # paper's RLVR: 2, App. D.6).
  c.grpo = dict(clip_low=0.2, clip_high=0.2, scale_by_std=True, adv_eps=1e-6,
                reduction=f"{arg.avg}_mean", ppo_epochs=1, num_minibatches=4,
                reward_scale=1.0)
  # reference None = the initial policy; monitor logs rl/kl_ref even at coef 0.
  c.kl = dict(coef=arg.kl, estimator="k3", direction="forward",
              reference=config_dict.placeholder(str), monitor=True)
  c.optim = dict(lr=arg.lr, schedule="constant", warmup_steps=10,
                 final_lr_frac=0.0, weight_decay=0.0, b1=0.9, b2=0.999,
                 eps=1e-8, clip_norm=1.0, grad_accum=2,
                 moment_dtype=config_dict.placeholder(str))  # train/optim.py
  c.mesh = dict(data=1, fsdp=-1, tensor=1)

  if arg.paper:
    # The paper's RLVR data and reward (App. D.6): Countdown-4, 5,000
    # problems, seed 42, Table 1's prompt and the step verifier, reward 2;
    # `n` is not read. Its other settings (LoRA, 4-bit, DAPO) are not ours.
    c.data.update(source="countdown4", max_prompt_len=2048)
    c.grpo.reward_scale = 2.0
  if arg.runlocal:
    c.total_steps = 4
    c.eval_every = c.ckpt_every = 2
    c.student.update(init=TINY, dtype="float32", remat="none")
    c.tokenizer_build = dict(vocab_size=300)  # trained into <workdir>/tokenizer
    c.data.update(num_problems=64, batch_size=2,
                  max_prompt_len=2048 if arg.paper else 256)
    c.rollout.update(group_size=arg.given_or("g", 4), max_new_tokens=8)
    c.grpo.update(num_minibatches=2)
    c.optim.update(lr=arg.given_or("lr", 1e-3), warmup_steps=1, grad_accum=1)
  return c
