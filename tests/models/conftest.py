"""Shared tiny checkpoints: built once per session with transformers."""
import pytest

from tests import tiny_hf

# name -> (family, config overrides). Covers llama3 RoPE scaling, tied and
# untied heads for both families, and Qwen2.5 q/k/v biases.
VARIANTS = {
    "llama3": ("llama", {}),
    "llama_tied": ("llama", {"tie_word_embeddings": True}),
    "qwen2_tied": ("qwen2", {}),
    "qwen2_untied": ("qwen2", {"tie_word_embeddings": False}),
}


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
  """tiny_ckpt(name, rope_form='rope_parameters', **kw) -> checkpoint dir."""
  made = {}

  def make(name, rope_form="rope_parameters", max_shard_size=None):
    key = (name, rope_form, max_shard_size)
    if key not in made:
      family, overrides = VARIANTS[name]
      path = tmp_path_factory.mktemp(f"{name}_{rope_form}")
      made[key] = tiny_hf.make_tiny_checkpoint(
          family, path, rope_form=rope_form, max_shard_size=max_shard_size,
          **overrides)
    return made[key]
  return make


@pytest.fixture(scope="session")
def hf_model():
  """hf_model(path) -> the transformers model loaded from it (eager, fp32)."""
  import transformers
  loaded = {}

  def load(path):
    if path not in loaded:
      loaded[path] = transformers.AutoModelForCausalLM.from_pretrained(
          path, attn_implementation="eager").eval()
    return loaded[path]
  return load
