"""Llama 3 and Qwen2.5 as pure functions over parameter pytrees.

  cfg, params = models.load_pretrained('/path/to/hf_dir', dtype='bfloat16')
  logits = models.apply(cfg, params, tokens, attention_mask)   # [B, T, V]

  cache = models.init_cache(cfg, batch, max_len)
  logits, cache = models.apply(cfg, params, prompt, prompt_mask, cache=cache)
  logits, cache = models.apply(cfg, params, next_tok[:, None], cache=cache)
"""
from jaxdistill.models.checkpoint import (
    config_from_hf, config_to_hf, load_pretrained, save_pretrained)
from jaxdistill.models.config import FAMILIES, PRESETS, ModelConfig, get_preset
from jaxdistill.models.model import (
    apply, cache_logical_axes, init, init_cache, logical_axes, num_params,
    output_head, param_shapes)
