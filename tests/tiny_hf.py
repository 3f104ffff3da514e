"""Tiny random Hugging Face checkpoints for tests (built locally, no network).

  make_tiny_config('llama', vocab_size=256)            -> transformers config
  make_tiny_checkpoint('qwen2', tmp_path / 'ckpt')     -> the directory

The Llama config uses llama3 RoPE scaling with original_max_position_embeddings
= 64 so that, at head_dim 16, all three frequency bands (kept, smoothed,
divided) occur. Models are float32 and saved with transformers'
save_pretrained, i.e. config.json in the transformers-5 `rope_parameters` form.
`rope_form='classic'` rewrites it as `rope_theta` + `rope_scaling`, the form
real Llama 3 / Qwen2.5 checkpoints ship with.
"""
from __future__ import annotations

import json
import os
import pathlib

_BASE = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    initializer_range=0.1,  # larger than HF's 0.02 so logits are not all ~0
)

_FAMILY = {
    "llama": dict(
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=[2, 3],
    ),
    "qwen2": dict(
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    ),
}


def make_tiny_config(family: str, **overrides):
  """A tiny transformers LlamaConfig / Qwen2Config; overrides use HF names."""
  import transformers  # pylint: disable=g-import-not-at-top
  if family not in _FAMILY:
    raise ValueError(f"family must be one of {sorted(_FAMILY)}, got {family!r}")
  kw = {**_BASE, **_FAMILY[family], **overrides}
  cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}
  return cls[family](**kw)


def make_tiny_model(family: str, *, seed: int = 0, **overrides):
  """A tiny random float32 transformers model in eval mode."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  cfg = make_tiny_config(family, **overrides)
  cfg._attn_implementation = "eager"  # pylint: disable=protected-access
  torch.manual_seed(seed)
  cls = {"llama": transformers.LlamaForCausalLM,
         "qwen2": transformers.Qwen2ForCausalLM}[family]
  model = cls(cfg).to(torch.float32).eval()
  # HF initialises biases and norm scales to constants; randomise them so a
  # swapped or missing tensor shows up in parity tests.
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("bias") or "norm" in name:
        p.add_(0.1 * torch.randn_like(p))
  return model


def make_tiny_checkpoint(family: str, path, *, seed: int = 0,
                         rope_form: str = "rope_parameters",
                         max_shard_size: str | None = None,
                         **config_overrides) -> pathlib.Path:
  """Saves a tiny random model with transformers; returns the directory.

  Args:
    family: 'llama' or 'qwen2'.
    path: output directory (created).
    seed: torch seed for the weights.
    rope_form: 'rope_parameters' (as transformers 5 writes it) or 'classic'
      (rope_theta / rope_scaling at the top level, as real checkpoints have).
    max_shard_size: e.g. '100KB' to force a sharded checkpoint with an index.
    **config_overrides: HF config fields.
  """
  if rope_form not in ("rope_parameters", "classic"):
    raise ValueError(f"rope_form must be 'rope_parameters' or 'classic', "
                     f"got {rope_form!r}")
  path = pathlib.Path(path)
  os.makedirs(path, exist_ok=True)
  model = make_tiny_model(family, seed=seed, **config_overrides)
  kw = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
  model.save_pretrained(path, **kw)
  if rope_form == "classic":
    cfg_file = path / "config.json"
    d = json.loads(cfg_file.read_text())
    rp = dict(d.pop("rope_parameters"))
    d["rope_theta"] = rp.pop("rope_theta")
    if rp.get("rope_type", "default") != "default":
      d["rope_scaling"] = rp
    cfg_file.write_text(json.dumps(d, indent=2))
  return path
