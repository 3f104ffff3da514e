r"""The teachers' GRPO refinement (arXiv 2609.35259, App. D.2.2), after their
SFT stage, for Science and MedReason (Countdown-3's teacher has none).

Args: family (qwen | llama: Qwen2.5-7B-Instruct, Llama-3.1-8B-Instruct),
task (science | medical: the paper's SciKnowEval / MedReason sets, App. D.1,
each with its Table 1 prompt; exact option accuracy), lr,
seed, runlocal (a tiny random policy on the project's Countdown, no files;
its default lr=1e-3 applies unless lr is given).

App. D.2.2's settings: 8 completions per prompt at T 1.0 and top-p 0.95;
reward 2.0 for the right option plus the formatting rewards of
rl/rewards.py (one pair of each tag, their order, the exact structure; at
most 0.5 each); GRPO with the DAPO loss (rl/grpo.py: the token mean over all
completion tokens of the step, clip 0.2 / 0.28), group-normalised rewards,
no KL (beta 0); 500 optimizer steps of 8 per device x 16 accumulation = 128
completions (16 prompts x 8), here 16 micro-batches of 8 (one row per chip
of 8; the same update), sampled in 4 generation calls of 32
(`rollout.generation_batch`; the same samples as one call); LR 1e-5, cosine after 50 warm-up steps (ratio 0.1),
clip 1.0; prompts up to 2,048 tokens, completions up to 824; LoRA rank 256,
alpha 256 on the q, k, v, o, gate, up and down projections of the frozen
backbone, loaded in bfloat16 and held in 4 bits (NF4, models/quant.py).
Not the paper's: its 8-bit AdamW (here float32 moments) and the seed (not
stated; 42). Fit (compile-only, 2026-12-05, docs/training.md): Qwen2.5-7B
on a v5e-8, every program with 54 % headroom or more (the update, 7.9 GB
per chip); all 128 rows in one generation call needed 18.5 GB and the
former 2 micro-batches 22.9 GB: neither fitted.

  # One command per (family, task); the starting point is that pair's SFT
  # teacher (a configs/teacher_sft.py workdir; any HF directory serves), the data prepared first (jaxdistill.data.prepare):
  python -m jaxdistill.data.prepare sciknoweval --data_dir /data
  python -m jaxdistill.rl.train --config configs/teacher_grpo.py:family=qwen,task=science \
    --config.student.path=/runs/teacher_sft_qwen_science \
    --config.data.data_dir=/data --workdir /runs/teacher_qwen_science
  python -m jaxdistill.data.prepare medreason --data_dir /data
  python -m jaxdistill.rl.train --config configs/teacher_grpo.py:family=llama,task=medical \
    --config.student.path=/runs/teacher_sft_llama_medical \
    --config.data.data_dir=/data --workdir /runs/teacher_llama_medical

  # Tiny random model, CPU:
  python -m jaxdistill.rl.train --config configs/teacher_grpo.py:runlocal --workdir /tmp/tg

The paper keeps step 500 (step 450 for Qwen2.5 MedReason and Llama-3
Science); checkpoints every 50 steps keep both.
"""
from ml_collections import config_dict

from jaxdistill import config_lib

BACKBONES = {"qwen": "Qwen/Qwen2.5-7B-Instruct",
             "llama": "meta-llama/Llama-3.1-8B-Instruct"}
# task -> (prepared data set, Table 1's prompt): the paper's SciKnowEval and
# MedReason sets (App. D.1), as configs/distill.py's PAPER_MCQ.
TASKS = {"science": ("sciknoweval", "science"),
         "medical": ("medreason", "medreason")}


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, family="qwen", task="science", lr=1e-5,
                             seed=42, runlocal=False)
  c = config_lib.load_config(
      "configs/grpo_countdown.py" + (":runlocal" if arg.runlocal else ""))
  c.seed = arg.seed
  c.rollout.update(group_size=8, temperature=1.0, top_p=0.95)
  c.grpo.update(loss="dapo", reduction="token_mean", clip_low=0.2,
                clip_high=0.28, reward_scale=2.0, format_reward="think_answer",
                ppo_epochs=1)
  c.kl.coef = 0.0
  c.optim.update(schedule="cosine", final_lr_frac=0.0, clip_norm=1.0)
  if arg.runlocal:
    for key in ("family", "task"):
      arg.refuse(key, "runlocal trains a tiny random policy on the "
                 "project's Countdown (no files)")
    c.rollout.group_size = 4
    c.optim.lr = arg.given_or("lr", 1e-3)
    return c
  if arg.family not in BACKBONES:
    raise ValueError(f"config arg family={arg.family}: choose from "
                     f"{sorted(BACKBONES)}")
  if arg.task not in TASKS:
    raise ValueError(f"config arg task={arg.task}: choose from {sorted(TASKS)}"
                     " (the paper's Countdown-3 teacher has no GRPO stage)")
  source, prompt = TASKS[arg.task]
  c.total_steps = 500
  c.log_every, c.ckpt_every = 5, 50
  c.student.path = BACKBONES[arg.family]
  c.data = dict(task="mcq", source=source, prompt=prompt, split="train",
                data_dir=config_dict.placeholder(str),
                manual_dir=config_dict.placeholder(str),
                system=config_dict.placeholder(str), batch_size=16,
                max_prompt_len=2048, bucket=config_dict.placeholder(int))
  c.rollout.max_new_tokens = 824
  c.grpo.num_minibatches = 1
  c.rollout.generation_batch = 32
  c.optim.update(lr=arg.lr, warmup_steps=50, grad_accum=16)
  # LoRA 256 / 256 on the frozen 4-bit backbone (App. D.2.2).
  c.student.lora.update(rank=256, alpha=256.0)
  c.student.param_dtype = "bfloat16"
  c.student.lora.base_quant = "nf4"
  return c
