"""Presets, parameter structure, logical axes and RoPE frequencies."""
import dataclasses

import jax
import numpy as np
import pytest
import torch
import transformers
from transformers import modeling_rope_utils

from jaxdistill import models
from jaxdistill.models import rope

AXES = {"batch", "seq", "embed", "heads", "kv_heads", "head_dim", "mlp",
        "vocab", "layers", "cache_seq", None}


def _hf_config(cfg):
  d = models.config_to_hf(cfg)
  return transformers.AutoConfig.for_model(d.pop("model_type"), **d)


@pytest.mark.parametrize("name", sorted(models.PRESETS))
def test_preset_parameter_count_matches_transformers(name):
  cfg = models.get_preset(name)
  with torch.device("meta"):
    ref = transformers.AutoModelForCausalLM.from_config(_hf_config(cfg))
  # named_parameters() yields a tied tensor once.
  want = sum(p.numel() for p in ref.parameters())
  assert models.num_params(models.param_shapes(cfg)) == want


def test_published_parameter_counts():
  # From the model cards / safetensors metadata.
  assert models.num_params(models.param_shapes(
      models.get_preset("llama-3.1-8b"))) == 8_030_261_248
  assert models.num_params(models.param_shapes(
      models.get_preset("Qwen2.5-0.5B-Instruct"))) == 494_032_768


def test_unknown_preset():
  with pytest.raises(ValueError, match="unknown preset 'gpt2'"):
    models.get_preset("gpt2")


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-3.2-1b", "qwen2.5-7b"])
def test_rope_frequencies_match_transformers(name):
  cfg = models.get_preset(name)
  hf = _hf_config(cfg)
  rope_type = hf.rope_parameters["rope_type"]
  init_fn = (modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type]
             if rope_type != "default" else None)
  if init_fn is None:
    theta = hf.rope_parameters["rope_theta"]
    want = 1.0 / theta ** (torch.arange(0, cfg.head_dim, 2).float()
                           / cfg.head_dim)
  else:
    want, _ = init_fn(hf, "cpu")
  np.testing.assert_allclose(rope.inv_frequencies(cfg), want.numpy(),
                             rtol=1e-6)


def test_logical_axes_cover_every_param():
  cfg = dataclasses.replace(models.get_preset("qwen2.5-7b"), vocab_size=64,
                            hidden_size=32, intermediate_size=48,
                            num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=8)
  shapes = models.param_shapes(cfg)
  axes = models.logical_axes(cfg)
  is_axes = lambda x: isinstance(x, tuple)
  assert jax.tree.structure(axes, is_leaf=is_axes) == jax.tree.structure(shapes)
  for ax, s in zip(jax.tree.leaves(axes, is_leaf=is_axes),
                   jax.tree.leaves(shapes)):
    assert len(ax) == len(s.shape) and set(ax) <= AXES
  assert axes["layers"]["self_attn"]["q_proj"]["kernel"] == (
      "layers", "embed", "heads", "head_dim")
  assert axes["lm_head"]["kernel"] == ("embed", "vocab")

  cache = models.init_cache(cfg, 2, 8)
  cache_axes = models.cache_logical_axes(cfg)
  assert set(cache) == set(cache_axes)
  for k, v in cache.items():
    assert len(cache_axes[k]) == v.ndim and set(cache_axes[k]) <= AXES
  assert cache["k"].shape == (2, 2, 2, 8, 8)  # [L, B, K, S, H]
  assert cache["v"].shape == (2, 2, 2, 8, 8)  # [L, B, K, H, S]
  assert cache_axes["k"][3] == cache_axes["v"][4] == "cache_seq"


def test_tied_head_counted_once_and_is_embedding_transpose():
  cfg = models.get_preset("qwen2.5-0.5b")
  shapes = models.param_shapes(cfg)
  assert "lm_head" not in shapes
  untied = dataclasses.replace(cfg, tie_word_embeddings=False)
  extra = cfg.vocab_size * cfg.hidden_size
  assert (models.num_params(models.param_shapes(untied))
          == models.num_params(shapes) + extra)
  emb = np.arange(12.0).reshape(4, 3)
  head = models.output_head(cfg, {"embed_tokens": {"embedding": emb}})
  np.testing.assert_array_equal(head, emb.T)


def test_config_validation():
  with pytest.raises(ValueError, match="family"):
    models.ModelConfig(family="gpt2")
  with pytest.raises(ValueError, match="remat"):
    models.ModelConfig(remat="sometimes")
  with pytest.raises(ValueError, match="dtype"):
    models.ModelConfig(dtype="int8")
  cfg = models.ModelConfig(eos_token_id=[1, 2], rope_scaling={
      "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
  assert hash(cfg) == hash(dataclasses.replace(cfg))  # static jit arg
  assert cfg.eos_token_id == (1, 2)


def test_cache_overflow_poisons_the_output_instead_of_clamping():
  cfg = dataclasses.replace(models.get_preset("llama-3.2-1b"), vocab_size=32,
                            hidden_size=16, intermediate_size=32,
                            num_hidden_layers=1, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=8,
                            dtype="float32", param_dtype="float32")
  params = jax.tree.map(
      lambda s: jax.random.normal(jax.random.key(0), s.shape, s.dtype) * 0.1,
      models.param_shapes(cfg))
  tokens = np.arange(1, 7, dtype=np.int32)[None]  # T = 6
  full = models.apply(cfg, params, tokens)
  cache = models.init_cache(cfg, 1, 6)
  logits, cache = models.apply(cfg, params, tokens[:, :4], cache=cache)
  np.testing.assert_allclose(logits, full[:, :4], atol=1e-5)
  fits, _ = models.apply(cfg, params, tokens[:, 4:], cache=cache)  # 4 + 2 = 6
  np.testing.assert_allclose(fits, full[:, 4:], atol=1e-5)
  over, _ = models.apply(cfg, params, tokens[:, 3:], cache=cache)  # 4 + 3 > 6
  assert np.isnan(np.asarray(over)).all()


def test_qwen_math_preset_is_its_published_config():
  # Qwen/Qwen2.5-Math-1.5B-Instruct's config.json, written here by hand.
  cfg = models.get_preset("Qwen2.5-Math-1.5B-Instruct")
  want = dict(family="qwen2", vocab_size=151936, hidden_size=1536,
              intermediate_size=8960, num_hidden_layers=28,
              num_attention_heads=12, num_key_value_heads=2, head_dim=128,
              rope_theta=10000.0, max_position_embeddings=4096,
              rms_norm_eps=1e-6, tie_word_embeddings=True,
              attention_bias=True)
  assert {k: getattr(cfg, k) for k in want} == want
