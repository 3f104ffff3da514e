"""Shared fixtures: a tiny BPE tokenizer and a tiny random Qwen2-style checkpoint.

The checkpoint is written by models.save_pretrained from NumPy-random weights
(no init compile, no torch), with the tokenizer saved into the same directory,
i.e. laid out like a real Hugging Face checkpoint.
"""
import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from jaxdistill import models

MCQ = [
    {"question": "Which gas do plants absorb for photosynthesis?",
     "options": ["Oxygen", "Carbon dioxide", "Helium"], "answer": "B"},
    {"question": "Which organ pumps blood?",
     "options": ["Heart", "Liver", "Lung", "Kidney"], "answer": "A"},
    {"question": "What is the chemical symbol of sodium?",
     "options": ["S", "So", "Na"], "answer": "C"},
]


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
  from jaxdistill.data import tokenizer as tok_lib
  out = tmp_path_factory.mktemp("eval_tok")
  tok_lib.train_bpe_tokenizer(
      tok_lib.countdown_texts(3, 30, extra_records=MCQ), 300, str(out))
  return out


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
  from jaxdistill.data import tokenizer as tok_lib
  return tok_lib.load_tokenizer(str(tokenizer_dir))


TINY = dict(family="qwen2", vocab_size=320, hidden_size=32,
            intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, attention_bias=True,
            tie_word_embeddings=True, eos_token_id=(2,),
            max_position_embeddings=512, rope_theta=1e6)


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory, tokenizer):
  """A float32 HF directory: config.json, model.safetensors, the tokenizer.

  Tensors are written with HF names and [out, in] layouts by safetensors
  itself (no model code, nothing to compile).
  """
  cfg = models.ModelConfig(**TINY)
  d, f, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
  q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
  shapes = {"model.embed_tokens.weight": (cfg.vocab_size, d),
            "model.norm.weight": (d,)}
  for i in range(cfg.num_hidden_layers):
    p = f"model.layers.{i}."
    shapes.update({
        p + "input_layernorm.weight": (d,),
        p + "post_attention_layernorm.weight": (d,),
        p + "self_attn.q_proj.weight": (q, d), p + "self_attn.q_proj.bias": (q,),
        p + "self_attn.k_proj.weight": (kv, d), p + "self_attn.k_proj.bias": (kv,),
        p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.v_proj.bias": (kv,),
        p + "self_attn.o_proj.weight": (d, q),
        p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
        p + "mlp.down_proj.weight": (d, f)})
  rng = np.random.default_rng(0)
  tensors = {k: (rng.normal(0.0, 0.2, s) + ("norm" in k)).astype(np.float32)
             for k, s in shapes.items()}
  out = tmp_path_factory.mktemp("eval_ckpt")
  save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
  (out / "config.json").write_text(json.dumps(models.config_to_hf(cfg)))
  tokenizer.save_pretrained(str(out))
  return out
