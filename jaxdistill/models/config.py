"""Model configuration and presets, with the Hugging Face field names.

`ModelConfig` is a frozen dataclass so it can be a static jit argument. Both
families share one architecture; they differ only in fields:

  llama: no biases, llama3 RoPE scaling, theta 5e5, eps 1e-5.
  qwen2: q/k/v biases (attention_bias=True), theta 1e6, eps 1e-6, no scaling.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

FAMILIES = ("llama", "qwen2")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")

# The four llama3 rope_scaling keys, in the order of the hashable tuple form.
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Decoder-only transformer hyper-parameters (HF names where HF has one).

  rope_scaling is None or a sorted tuple of (key, value) pairs of the HF
  llama3 dict, e.g. (('factor', 8.0), ('high_freq_factor', 4.0), ...,
  ('rope_type', 'llama3')); `rope_scaling_dict` gives it back as a dict.
  remat: 'none' | 'full' | 'dots' | 'dots_no_batch' (jax.checkpoint policy per
  decoder layer; only matters under jax.grad).
  scan_unroll: how many decoder layers one step of the layer scan runs.
  """
  family: str = "llama"
  vocab_size: int = 128256
  hidden_size: int = 2048
  intermediate_size: int = 8192
  num_hidden_layers: int = 16
  num_attention_heads: int = 32
  num_key_value_heads: int = 8
  head_dim: int = 64
  rms_norm_eps: float = 1e-5
  rope_theta: float = 500000.0
  rope_scaling: tuple[tuple[str, Any], ...] | None = None
  tie_word_embeddings: bool = False
  attention_bias: bool = False
  max_position_embeddings: int = 131072
  bos_token_id: int | None = None
  eos_token_id: tuple[int, ...] = ()
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: str = "none"
  scan_unroll: int = 1

  def __post_init__(self):
    # Accept a dict / list / int for the hashable fields, then validate.
    if isinstance(self.rope_scaling, dict):
      object.__setattr__(self, "rope_scaling", rope_scaling_to_tuple(
          self.rope_scaling))
    if isinstance(self.eos_token_id, int):
      object.__setattr__(self, "eos_token_id", (self.eos_token_id,))
    elif self.eos_token_id is None:
      object.__setattr__(self, "eos_token_id", ())
    elif isinstance(self.eos_token_id, list):
      object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
    self.validate()

  def validate(self):
    if self.family not in FAMILIES:
      raise ValueError(f"ModelConfig.family must be one of {FAMILIES}, "
                       f"got {self.family!r}")
    for f in ("vocab_size", "hidden_size", "intermediate_size",
              "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim"):
      v = getattr(self, f)
      if not isinstance(v, int) or v <= 0:
        raise ValueError(f"ModelConfig.{f} must be a positive int, got {v!r}")
    if self.num_attention_heads % self.num_key_value_heads:
      raise ValueError(
          f"ModelConfig.num_attention_heads ({self.num_attention_heads}) must "
          f"be a multiple of num_key_value_heads ({self.num_key_value_heads})")
    self._validate_ranges()
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"ModelConfig.remat must be one of {REMAT_POLICIES}, "
                       f"got {self.remat!r}")
    for f in ("dtype", "param_dtype"):
      if getattr(self, f) not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"ModelConfig.{f} must be 'float32', 'bfloat16' or "
                         f"'float16', got {getattr(self, f)!r}")
    if self.rope_scaling is not None:
      d = self.rope_scaling_dict
      if d.get("rope_type", d.get("type")) != "llama3":
        raise ValueError(f"ModelConfig.rope_scaling: only rope_type 'llama3' "
                         f"is supported, got {d!r}")
      missing = [k for k in _LLAMA3_KEYS if k not in d]
      if missing:
        raise ValueError(f"ModelConfig.rope_scaling: llama3 needs {missing}")

  def _validate_ranges(self):
    # Out of range, these train without error and end as "loss is nan" or
    # as a token id the embedding cannot hold.
    for f in ("rms_norm_eps", "rope_theta"):
      v = getattr(self, f)
      if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
          math.isfinite(v) and v > 0):
        raise ValueError(f"ModelConfig.{f} must be a finite number > 0, "
                         f"got {v!r}")
    v = self.max_position_embeddings
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
      raise ValueError(f"ModelConfig.max_position_embeddings must be a "
                       f"positive int, got {v!r}")

  def check_token_ids(self):
    """ValueError unless bos/eos ids are tokens of the vocabulary.

    Not part of `validate`: presets shrunk for tests and benchmarks
    (dataclasses.replace(preset, vocab_size=96)) keep their real ids, which
    nothing reads; a checkpoint's config.json must be consistent.
    """
    ids = [("bos_token_id", self.bos_token_id)] if self.bos_token_id is not None else []
    ids += [("eos_token_id", e) for e in self.eos_token_id]
    for f, v in ids:
      if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < self.vocab_size:
        raise ValueError(f"ModelConfig.{f} must be a token id in [0, vocab_size="
                         f"{self.vocab_size}), got {v!r}")

  @property
  def rope_scaling_dict(self) -> dict[str, Any] | None:
    return None if self.rope_scaling is None else dict(self.rope_scaling)

  @property
  def num_groups(self) -> int:
    return self.num_attention_heads // self.num_key_value_heads


def rope_scaling_to_tuple(d: dict[str, Any] | None):
  if d is None:
    return None
  d = dict(d)
  if "type" in d and "rope_type" not in d:
    d["rope_type"] = d.pop("type")
  d.pop("rope_theta", None)
  return tuple(sorted(d.items()))


# -- presets ----------------------------------------------------------------
# Shapes of the public checkpoints (Instruct variants share them).

_LLAMA31_SCALING = (("factor", 8.0), ("high_freq_factor", 4.0),
                    ("low_freq_factor", 1.0),
                    ("original_max_position_embeddings", 8192),
                    ("rope_type", "llama3"))
_LLAMA32_SCALING = (("factor", 32.0), ("high_freq_factor", 4.0),
                    ("low_freq_factor", 1.0),
                    ("original_max_position_embeddings", 8192),
                    ("rope_type", "llama3"))


def _llama(**kw) -> ModelConfig:
  base = dict(family="llama", vocab_size=128256, head_dim=128,
              num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=500000.0,
              max_position_embeddings=131072, bos_token_id=128000,
              eos_token_id=(128001, 128008, 128009), dtype="bfloat16",
              param_dtype="bfloat16")
  return ModelConfig(**{**base, **kw})


def _qwen(**kw) -> ModelConfig:
  base = dict(family="qwen2", vocab_size=151936, num_key_value_heads=2,
              head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
              attention_bias=True, max_position_embeddings=32768,
              bos_token_id=151643, eos_token_id=(151645, 151643),
              dtype="bfloat16", param_dtype="bfloat16")
  return ModelConfig(**{**base, **kw})


def llama_3_1_8b():
  return _llama(hidden_size=4096, intermediate_size=14336,
                num_hidden_layers=32, num_attention_heads=32,
                rope_scaling=_LLAMA31_SCALING)


def llama_3_2_1b():
  return _llama(hidden_size=2048, intermediate_size=8192,
                num_hidden_layers=16, num_attention_heads=32, head_dim=64,
                rope_scaling=_LLAMA32_SCALING, tie_word_embeddings=True)


def llama_3_2_3b():
  return _llama(hidden_size=3072, intermediate_size=8192,
                num_hidden_layers=28, num_attention_heads=24,
                rope_scaling=_LLAMA32_SCALING, tie_word_embeddings=True)


def qwen2_5_0_5b():
  return _qwen(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
               num_attention_heads=14, head_dim=64, tie_word_embeddings=True)


def qwen2_5_1_5b():
  return _qwen(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
               num_attention_heads=12, tie_word_embeddings=True)


def qwen2_5_math_1_5b():
  # Qwen2.5-Math-1.5B-Instruct's config.json (App. A.3's teacher): the
  # 1.5B shapes with RoPE base 1e4 and a 4,096-position window.
  return _qwen(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
               num_attention_heads=12, tie_word_embeddings=True,
               rope_theta=10000.0, max_position_embeddings=4096)


def qwen2_5_3b():
  return _qwen(hidden_size=2048, intermediate_size=11008,
               num_hidden_layers=36, num_attention_heads=16,
               tie_word_embeddings=True)


def qwen2_5_7b():
  return _qwen(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
               num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4)


PRESETS = {
    "llama-3.1-8b": llama_3_1_8b,
    "llama-3.2-1b": llama_3_2_1b,
    "llama-3.2-3b": llama_3_2_3b,
    "qwen2.5-0.5b": qwen2_5_0_5b,
    "qwen2.5-1.5b": qwen2_5_1_5b,
    "qwen2.5-math-1.5b": qwen2_5_math_1_5b,
    "qwen2.5-3b": qwen2_5_3b,
    "qwen2.5-7b": qwen2_5_7b,
}


def get_preset(name: str) -> ModelConfig:
  """Config of a public checkpoint by name, e.g. 'qwen2.5-0.5b'."""
  key = name.lower().removesuffix("-instruct")
  if key not in PRESETS:
    raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
  return PRESETS[key]()
