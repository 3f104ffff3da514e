"""Llama 3 and Qwen2.5 as pure functions over parameter pytrees.

  cfg, params = models.load_pretrained('/path/to/hf_dir', dtype='bfloat16')
  logits = models.apply(cfg, params, tokens, attention_mask)   # [B, T, V]

  cache = models.init_cache(cfg, batch, max_len)
  logits, cache = models.apply(cfg, params, prompt, prompt_mask, cache=cache)
  logits, cache = models.apply(cfg, params, next_tok[:, None], cache=cache)
"""
from jaxdistill.models.checkpoint import config_from_hf
from jaxdistill.models.checkpoint import config_to_hf
from jaxdistill.models.checkpoint import load_pretrained
from jaxdistill.models.checkpoint import save_pretrained
from jaxdistill.models.config import FAMILIES
from jaxdistill.models.config import get_preset
from jaxdistill.models.config import ModelConfig
from jaxdistill.models.config import PRESETS
from jaxdistill.models.config import REMAT_POLICIES
from jaxdistill.models.model import apply
from jaxdistill.models.model import cache_logical_axes
from jaxdistill.models.model import init
from jaxdistill.models.model import init_cache
from jaxdistill.models.model import logical_axes
from jaxdistill.models.model import num_params
from jaxdistill.models.model import output_head
from jaxdistill.models.model import param_shapes
