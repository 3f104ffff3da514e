r"""The teachers' supervised stage (arXiv 2609.35259, App. D.2.2): token-level
cross-entropy on worked demonstrations, one run per (family, task).

Args: family (qwen | llama: Qwen2.5-7B-Instruct, Llama-3.1-8B-Instruct), lr,
seed, runlocal (tiny random model on synthetic sequences; its default
lr=1e-3 applies unless lr is given).

App. D.2.2's settings: the vanilla task prompt (Table 1) as input, the
demonstration as the target, cross-entropy over its tokens (loss.kind 'ce'
on rollout.policy 'dataset': the records' own responses), 500 optimizer
steps, LR 5e-5 cosine after 10 warm-up steps, 32 sequences per step, clip
1.0, prompts and completions of at most 2,048 tokens each, LoRA rank 256,
alpha 256 on the q, k, v, o, gate, up and down projections of the frozen
bfloat16 backbone (hf_student/ is the merged teacher, hf_adapter/ the
adapters). Not the paper's: records longer than the limits are left out
(reported at the start), not truncated. The demonstrations are a records file the user gives
(data.records_file, .jsonl: Countdown or MCQ records with a `response`, the
Table 1 prompt named by `variant` / `prompt`; the paper's are verified GPT-5
answers for Countdown-3 and MedReason and the set's own worked solutions for
Science): say where it came from with the teacher.

  python -m jaxdistill.train --config configs/teacher_sft.py:family=qwen \
    --config.data.records_file=/data/demos_countdown3.jsonl \
    --workdir /runs/teacher_sft_qwen_countdown
  python -m jaxdistill.train --config configs/teacher_sft.py:family=llama \
    --config.data.records_file=/data/demos_medreason.jsonl \
    --workdir /runs/teacher_sft_llama_medical

  # Tiny random model, CPU:
  python -m jaxdistill.train --config configs/teacher_sft.py:runlocal --workdir /tmp/ts

The export (<workdir>/hf_student/) is the teacher: Countdown-3's as it is,
Science's and MedReason's after configs/teacher_grpo.py
(--config.student.path=<this workdir>).
"""
from jaxdistill import config_lib

BACKBONES = {"qwen": "Qwen/Qwen2.5-7B-Instruct",
             "llama": "meta-llama/Llama-3.1-8B-Instruct"}


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, family="qwen", lr=5e-5, seed=42,
                             runlocal=False)
  c = config_lib.load_config("configs/distill.py:kl=ce,policy=dataset"
                             + (",runlocal" if arg.runlocal else ""))
  c.seed = arg.seed
  c.loss.reduction = "token_mean"  # one mean over the demonstration tokens
  c.optim.update(schedule="cosine", warmup_steps=10, final_lr_frac=0.0,
                 clip_norm=1.0)
  if arg.runlocal:
    arg.refuse("family", "runlocal trains a tiny random model")
    c.optim.lr = arg.given_or("lr", 1e-3)
    return c
  if arg.family not in BACKBONES:
    raise ValueError(f"config arg family={arg.family}: choose from "
                     f"{sorted(BACKBONES)}")
  c.total_steps = 500
  c.eval_every = c.ckpt_every = 50
  c.track_sparsity = False  # a teacher, not a study student
  c.student.path = BACKBONES[arg.family]  # the model trained: the teacher
  # data.records_file (a placeholder in distill.py): the demonstrations.
  c.data.update(task="records", source=None, prompt=None, batch_size=32,
                max_prompt_len=2048)
  c.rollout.max_new_tokens = 2048
  c.optim.update(lr=arg.lr)
  c.student.lora.update(rank=256, alpha=256.0)
  c.student.param_dtype = "bfloat16"  # the frozen backbone
  return c
