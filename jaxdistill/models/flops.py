"""Model FLOPs for compute accounting (what the sweep records per run).

N = matmul parameters of a model: every projection and the output head,
not the embedding lookup (a gather). Per token of a sequence of length T:

  forward        2 N + 4 L T (H d)      the 4 L T H d term is QK^T and AV
                                         (causal masking not discounted)
  backward       twice the forward

One distillation step over sequences of length T (prompt + response):
  student forward + backward   3 * forward(student)
  teacher forward (no grad)    1 * forward(teacher)
A rollout decodes with a KV cache: each prompt or generated token goes
through the sampling model(s) once (a token-level mixture runs both).
These are model FLOPs in the usual (PaLM / Chinchilla) sense: hardware FLOPs
of rematerialisation and padding are not counted.
"""
from __future__ import annotations

from jaxdistill.models import ModelConfig


def matmul_params(cfg: ModelConfig) -> int:
  """N: parameters that take part in a matmul per token (head included)."""
  d, h, k, f = (cfg.hidden_size, cfg.num_attention_heads,
                cfg.num_key_value_heads, cfg.intermediate_size)
  hd = cfg.head_dim
  per_layer = d * h * hd * 2 + d * k * hd * 2 + 3 * d * f
  return cfg.num_hidden_layers * per_layer + d * cfg.vocab_size


def forward_flops_per_token(cfg: ModelConfig, seq_len: float) -> float:
  """Forward FLOPs per token in a sequence of `seq_len` tokens."""
  if seq_len < 0:
    raise ValueError(f"seq_len: must be >= 0, got {seq_len}")
  attn = 4 * cfg.num_hidden_layers * seq_len * cfg.num_attention_heads * cfg.head_dim
  return 2.0 * matmul_params(cfg) + attn


def train_step_flops(student: ModelConfig, teacher: ModelConfig | None,
                     tokens: float, seq_len: float) -> float:
  """Student forward+backward and teacher forward over `tokens` tokens."""
  out = 3.0 * forward_flops_per_token(student, seq_len) * tokens
  if teacher is not None:
    out += forward_flops_per_token(teacher, seq_len) * tokens
  return out


def rollout_flops(student: ModelConfig, teacher: ModelConfig | None,
                  policy: str, tokens: float, seq_len: float) -> float:
  """Sampling `tokens` tokens (prompt prefill + decode) with `policy`."""
  models = {"student": (student,), "teacher": (teacher,),
            "coin_mixture": (student, teacher),
            "spectrum": (student, teacher), "dataset": ()}
  if policy not in models:
    raise ValueError(f"policy: unknown {policy!r}; choose from {sorted(models)}")
  # The average token attends to half the sequence under a KV cache.
  return sum(forward_flops_per_token(m, seq_len / 2) * tokens
             for m in models[policy])


def weight_bytes(cfg: ModelConfig) -> int:
  """Bytes of the model's weights as stored (cfg.param_dtype): what one pass
  over the model reads."""
  d, h, k, f = (cfg.hidden_size, cfg.num_attention_heads,
                cfg.num_key_value_heads, cfg.intermediate_size)
  hd = cfg.head_dim
  per_layer = (d * h * hd * 2 + d * k * hd * 2 + 3 * d * f + 2 * d
               + (h + 2 * k) * hd * int(cfg.attention_bias))
  n = (cfg.num_hidden_layers * per_layer + cfg.vocab_size * d + d
       + (0 if cfg.tie_word_embeddings else d * cfg.vocab_size))
  return n * _itemsize(cfg.param_dtype)


def kv_cache_bytes(cfg: ModelConfig, rows: float, length: int) -> float:
  """Bytes of a KV cache (models.init_cache, compute dtype) for `rows`
  rows of `length` slots: what one decode step reads."""
  return (2.0 * cfg.num_hidden_layers * rows * cfg.num_key_value_heads
          * length * cfg.head_dim * _itemsize(cfg.dtype))


def _itemsize(dtype: str) -> int:
  return {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
