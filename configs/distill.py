r"""Distil a teacher into a student: one cell of the study's grid.

Sweepable args (after the colon): kl (forward | reverse | jsd | sampled),
policy (student | teacher | spectrum | coin_mixture | dataset), lam (spectrum:
the paper's lambda in [-2, 2], -1 teacher, +1 student; coin_mixture: the
probability of a student token), lr, task (countdown | science | medical |
mcq | records | synthetic ...), seed, topk (None = the full
teacher, or k: the loss sees only the teacher's top-k), runlocal (tiny random
models; its defaults task=synthetic, lr=1e-3 apply to the args not given).

The defaults are the paper's Table 3 (arXiv 2609.35259, App. D.3): 150 steps
of 32 prompts with one completion each, AdamW (0.9, 0.999, eps 1e-8, no weight
decay), constant LR after 10 linear warm-up steps, clip 1.0, prompts up to
2,048 tokens, completions up to 512 (Countdown-3; 1,024 for the MCQ tasks),
teacher temperature 0.5 and student 1.0 in sampling and inside the loss, the
loss averaged over each completion's tokens and then over completions
(reduction 'sequence_mean'), seed 42. docs/method.md lists where the project
still deviates.

  # A real run: Qwen2.5-7B-Instruct -> Qwen2.5-0.5B-Instruct from the hub
  # (a local directory or another org/name[@revision] overrides a path):
  python -m jaxdistill.train \
    --config configs/distill.py:kl=reverse,policy=student,lr=1e-5 \
    --workdir /runs/qwen_rkl_on
  python -m jaxdistill.train --config configs/distill.py:kl=reverse \
    --config.student.path=/ckpt/Qwen2.5-0.5B-Instruct \
    --config.teacher.path=Qwen/Qwen2.5-7B-Instruct@main --workdir /runs/q2

  # The same path, shrunk to tiny random models on synthetic prompts (CPU):
  python -m jaxdistill.train --config configs/distill.py:runlocal --workdir /tmp/jd

Models: `path` is a Hugging Face directory or hub name org/name[@revision]
(resolved into the Hugging Face cache, its commit recorded in the workdir's
revisions.json); `preset` or `init` instead builds a randomly initialised
model of those shapes and `path` is then not read (runlocal does this).
"""
import ml_collections
from ml_collections import config_dict

from jaxdistill import config_lib

# The study's Qwen2.5 pair (configs/grid_main.py names the others).
STUDENT = "Qwen/Qwen2.5-0.5B-Instruct"
TEACHER = "Qwen/Qwen2.5-7B-Instruct"

# task arg -> (data.source, data.prompt): the paper's MCQ sets (App. D.1).
PAPER_MCQ = {"science": ("sciknoweval", "science"),
             "medical": ("medreason", "medreason")}

# Tiny random models for runlocal: a bigger "teacher" and a smaller student
# sharing one vocabulary.
TINY_TEACHER = dict(family="llama", vocab_size=320, hidden_size=64,
                    intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    eos_token_id=(2,), max_position_embeddings=512)
TINY_STUDENT = dict(TINY_TEACHER, hidden_size=32, intermediate_size=64,
                    num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1)


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, kl="forward", policy="student", lam=0.0,
                             lr=1e-5, task="countdown", seed=42, topk=None,
                             runlocal=False)
  c = ml_collections.ConfigDict()
  c.seed = arg.seed
  c.total_steps = 150
  c.log_every = 1
  c.eval_every = 50
  c.ckpt_every = 50
  c.keep_ckpts = 3
  # True: once the run has finished (final checkpoint saved, export written)
  # its older checkpoints are deleted (the grids set it for their arms);
  # docs/training.md, "Disk".
  c.keep_final_only = False
  c.progress = True
  c.export_hf = True
  # N > 0: also export the student every N steps before the last, to
  # <workdir>/exports/step_<N> (Hugging Face directories, kept; the sweep
  # evaluates each with grid.eval.trajectory, configs/grid_math.py).
  c.export_every = 0
  c.track_sparsity = True
  # Weights & Biases beside TensorBoard, off unless project is set (pip
  # install wandb); mode 'online' | 'offline' | 'disabled' (None: wandb's
  # default, WANDB_MODE); name None: the workdir's name.
  c.wandb = dict(project=config_dict.placeholder(str),
                 entity=config_dict.placeholder(str),
                 mode=config_dict.placeholder(str),
                 name=config_dict.placeholder(str),
                 group=config_dict.placeholder(str))

  # Checkpoints: a directory or hub name; preset / init win over path.
  # remat (what the backward pass recomputes; memory, not results): 'auto'
  # keeps the products' outputs of students up to 1B parameters and
  # recomputes whole layers of larger ones, so that every pair of the study
  # fits its slice (docs/tpu.md, "Fit on a TPU slice"); or 'none', 'dots',
  # 'dots_no_batch', 'full'.
  # temperature: each model's policy is softmax(logits / temperature), in its
  # rollouts and inside the loss (the paper: student 1.0, teacher 0.5).
  c.student = dict(path=STUDENT, preset=config_dict.placeholder(str),
                   init=None, dtype="bfloat16", param_dtype="float32",
                   remat="auto", temperature=1.0, overrides={},
                   lora=config_lib.lora_block())
  c.teacher = dict(path=TEACHER, preset=config_dict.placeholder(str),
                   init=None, dtype="bfloat16", param_dtype="bfloat16",
                   temperature=0.5, overrides={})
  c.tokenizer = config_dict.placeholder(str)  # default: the student's

  # task='countdown': source 'countdown3' is the paper's Countdown-3 (App.
  # D.1, Table 1's prompt; tasks.countdown.PRESETS; read from data_dir when
  # `python -m jaxdistill.data.prepare countdown3` wrote it there, else
  # generated); source None is the project's own generator (not the
  # paper's), Countdown-n_numbers from data_seed. task='science' /
  # 'medical' (args) is task='mcq' on the paper's SciKnowEval / MedReason
  # set (source 'sciknoweval' / 'medreason', prepared under data_dir by
  # `python -m jaxdistill.data.prepare NAME`) with its Table 1 prompt.
  # task='mcq': prompt 'science' / 'medreason' is that Table 1 prompt
  # (None: the project's); it reads the data set `source` prepared under
  # data_dir, or the user's files (manual_dir, format `source`);
  # task='records' reads records_file (.jsonl of Countdown/MCQ records).
  # bucket=None pads every batch to max_prompt_len + max_new_tokens (one
  # compilation); an int b pads prompts and responses (rollouts are cut
  # after their longest) to the batch's longest, rounded up to a multiple
  # of b: less padding, one compilation per width.
  # teacher_prompt: None, the teacher sees the student's prompt; or a format
  # string, the teacher's own user turn (the paper's style transfer, App.
  # D.7: the task plus a demonstration and a style instruction), {prompt}
  # the student's task text, {field} a field of each record; under system
  # message teacher_system (None: data.system), at most
  # max_teacher_prompt_len tokens (None: max_prompt_len). Both models score
  # the same completion, each under its own prompt.
  c.data = dict(task=arg.task, n_numbers=3, num_problems=50_000, data_seed=0,
                split="train", data_dir=config_dict.placeholder(str),
                manual_dir=config_dict.placeholder(str),
                source=config_dict.placeholder(str),
                records_file=config_dict.placeholder(str),
                system=config_dict.placeholder(str),
                prompt=config_dict.placeholder(str), batch_size=32,
                max_prompt_len=2048, fixed_batch=False,
                bucket=config_dict.placeholder(int),
                teacher_prompt=config_dict.placeholder(str),
                teacher_system=config_dict.placeholder(str),
                max_teacher_prompt_len=config_dict.placeholder(int))
  if arg.task == "countdown":
    c.data.source = "countdown3"
  if arg.task in PAPER_MCQ:
    c.data.task = "mcq"
    c.data.source, c.data.prompt = PAPER_MCQ[arg.task]
  # Completions: 512 tokens for Countdown-3, 1,024 for the MCQ tasks.
  c.rollout = dict(policy=arg.policy, lam=arg.lam,
                   max_new_tokens=512 if arg.task == "countdown" else 1024,
                   top_k=config_dict.placeholder(int),
                   top_p=config_dict.placeholder(float),
                   eos_token_ids=None,
                   # How the weights are laid out for decoding: 'auto'
                   # (per model, rollout/generation.py), 'train', 'replicated'
                   # or 'tp' (docs/tpu.md); the tokens are the same.
                   decode_layout="auto",
                   # Teacher-policy rollouts only: decode this many steps'
                   # prompts in one call (train/batches.py; the grids set
                   # it where it pays on the TPU, docs/tpu.md).
                   decode_ahead=1,
                   # policy='spectrum' only: both models' temperature inside
                   # pi_lambda (None: each its own); the paper's spectrum
                   # runs used 1.0 (configs/grid_spectrum.py).
                   spectrum_temperature=config_dict.placeholder(float),
                   # Generation only (None: the model's own temperature;
                   # the loss always uses student/teacher.temperature):
                   # the paper's temperature ablation (App. A.12,
                   # configs/grid_temperature.py).
                   student_temperature=config_dict.placeholder(float),
                   teacher_temperature=config_dict.placeholder(float))
  # reduction 'sequence_mean' is the paper's (Eq. 1); 'token_mean' pools all
  # tokens of the batch. estimator (kind='sampled'): 'fresh_forward' /
  # 'fresh_reverse' are the paper's (App. A.2), the others score the
  # rollout's own tokens (docs/method.md).
  c.loss = dict(kind=arg.kl, beta=0.5,
                reduction="sequence_mean", estimator="fresh_forward",
                iw_clip=config_dict.placeholder(float), fused=True,
                # Positions per step of the fused loss: its working set is a
                # few [rows per chip, chunk, vocab] float32 blocks (at 8 rows
                # and Qwen's vocabulary, 155 MB each at 32, 620 MB at 128).
                chunk_size=32, vocab_size=config_dict.placeholder(int),
                # The teacher's top-k (None: all of it); 'renorm' or 'tail'
                # (jaxdistill/losses/topk.py); a teacher cache directory
                # (python -m jaxdistill.train.teacher_cache) replaces the teacher.
                teacher_topk=config_dict.placeholder(int),
                topk_variant="renorm",
                teacher_cache=config_dict.placeholder(str))
  c.loss.teacher_topk = arg.topk
  c.optim = dict(lr=arg.lr, schedule="constant", warmup_steps=10,
                 final_lr_frac=0.0, weight_decay=0.0, b1=0.9, b2=0.999,
                 # 4 micro-batches of 8 rows: one row per chip of an
                 # 8-chip slice, as the paper's 1 per device x 32 steps
                 # (the same gradient; what makes 32 x 3,072 tokens fit).
                 eps=1e-8, clip_norm=1.0, grad_accum=4,
                 # None: each Adam moment in its weight's dtype (float32
                 # master weights by default; with student.param_dtype
                 # 'bfloat16' bf16 moments, as torch AdamW; train/optim.py).
                 moment_dtype=config_dict.placeholder(str))
  c.mesh = dict(data=1, fsdp=-1, tensor=1)

  if arg.runlocal:
    c.total_steps = 6
    c.eval_every = c.ckpt_every = 3
    c.student.update(init=TINY_STUDENT, dtype="float32", remat="none")
    c.teacher.update(init=TINY_TEACHER, dtype="float32", param_dtype="float32")
    task = arg.given_or("task", "synthetic")
    c.data.update(task="mcq" if task in PAPER_MCQ else task, batch_size=4,
                  max_prompt_len=8)
    # Written with the export (hf_student/), for jaxdistill.evaluate; the
    # synthetic prompts are random token ids and do not use it.
    c.tokenizer_build = dict(vocab_size=300)
    c.rollout.update(max_new_tokens=8)
    c.loss.update(chunk_size=16)
    c.optim.update(lr=arg.given_or("lr", 1e-3), warmup_steps=1, grad_accum=1)
  return c
