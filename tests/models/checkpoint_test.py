"""HF checkpoint loading/saving: config forms, sharded files, round trips, errors."""
import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.torch
import torch
import transformers

from jaxdistill import models
from tests import tiny_hf


def _logits_hf(model, tokens):
  with torch.no_grad():
    return model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()


def _tokens(vocab, b=2, t=20):
  return np.random.RandomState(0).randint(0, vocab, (b, t)).astype(np.int32)


def _assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_both_rope_forms_give_the_hf_config(tiny_ckpt):
  classic = models.load_pretrained(tiny_ckpt("llama3", "classic"))[0]
  new = models.load_pretrained(tiny_ckpt("llama3", "rope_parameters"))[0]
  assert classic == new
  ref = transformers.AutoConfig.from_pretrained(tiny_ckpt("llama3", "classic"))
  assert classic.rope_theta == ref.rope_parameters["rope_theta"]
  want = {k: v for k, v in ref.rope_parameters.items() if k != "rope_theta"}
  assert classic.rope_scaling_dict == want
  assert classic.eos_token_id == (2, 3)
  assert (classic.head_dim, classic.num_key_value_heads) == (16, 2)
  qwen = models.load_pretrained(tiny_ckpt("qwen2_tied", "classic"))[0]
  assert qwen.family == "qwen2" and qwen.attention_bias
  assert qwen.rope_scaling is None and qwen.rope_theta == 1e6


def test_sharded_safetensors_with_index(tiny_ckpt, hf_model):
  path = tiny_ckpt("qwen2_untied", max_shard_size="40KB")
  assert (path / "model.safetensors.index.json").is_file()
  assert len(list(path.glob("model-*.safetensors"))) > 2
  cfg, params = models.load_pretrained(path)
  tokens = _tokens(cfg.vocab_size)
  ours = np.asarray(models.apply(cfg, params, tokens))
  assert np.abs(ours - _logits_hf(hf_model(path), tokens)).max() <= 1e-4
  _, single = models.load_pretrained(tiny_ckpt("qwen2_untied"))
  _assert_trees_equal(params, single)  # same seed, one file


def test_streamed_blocks_equal_whole_tensors(tiny_ckpt):
  """A tiny chunk_bytes forces the donated block-by-block fill path."""
  path = tiny_ckpt("llama3")
  _, whole = models.load_pretrained(path)
  _, streamed = models.load_pretrained(path, chunk_bytes=1000)
  _assert_trees_equal(whole, streamed)


@pytest.mark.parametrize("name,shard", [("llama3", None),
                                        ("qwen2_tied", 30_000)])
def test_save_pretrained_loads_in_transformers(name, shard, tiny_ckpt, hf_model,
                                               tmp_path):
  src = tiny_ckpt(name)
  cfg, params = models.load_pretrained(src)
  kw = {} if shard is None else {"max_shard_size": shard}
  models.save_pretrained(cfg, params, tmp_path, **kw)
  written = json.loads((tmp_path / "config.json").read_text())
  assert "rope_theta" in written and "rope_scaling" in written  # classic form
  if shard is not None:
    assert (tmp_path / "model.safetensors.index.json").is_file()
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(
      tmp_path, attn_implementation="eager").eval()
  assert type(reloaded).__name__ == type(hf_model(src)).__name__
  assert reloaded.config.rope_parameters == hf_model(src).config.rope_parameters
  tokens = _tokens(cfg.vocab_size)
  np.testing.assert_allclose(_logits_hf(reloaded, tokens),
                             _logits_hf(hf_model(src), tokens), rtol=0,
                             atol=1e-6)


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_load_of_save_is_exact(param_dtype, tmp_path):
  cfg = dataclasses.replace(
      models.get_preset("qwen2.5-7b"), vocab_size=96, hidden_size=32,
      intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
      num_key_value_heads=2, head_dim=8, dtype=param_dtype,
      param_dtype=param_dtype, bos_token_id=1, eos_token_id=(5,))
  # Random values everywhere (biases and norms too) so that a swap would show.
  rs = np.random.RandomState(2)
  params = jax.tree.map(lambda s: jnp.asarray(rs.randn(*s.shape), s.dtype),
                        models.param_shapes(cfg))
  models.save_pretrained(cfg, params, tmp_path, max_shard_size=20_000)
  cfg2, params2 = models.load_pretrained(tmp_path)
  assert cfg2 == cfg
  _assert_trees_equal(params, params2)


# -- errors, all raised before any tensor is read ------------------------------

def _copy(tiny_ckpt, tmp_path, name="llama3"):
  dst = tmp_path / "ckpt"
  shutil.copytree(tiny_ckpt(name), dst)
  return dst


def _edit_config(path, **changes):
  d = json.loads((path / "config.json").read_text())
  for k, v in changes.items():
    if v is None:
      d.pop(k, None)
    else:
      d[k] = v
  (path / "config.json").write_text(json.dumps(d))


def _edit_tensors(path, fn):
  f = path / "model.safetensors"
  tensors = safetensors.torch.load_file(f)
  fn(tensors)
  safetensors.torch.save_file(tensors, f)


def test_error_missing_directory_and_files(tiny_ckpt, tmp_path):
  with pytest.raises(FileNotFoundError, match="directory not found"):
    models.load_pretrained(tmp_path / "nope")
  path = _copy(tiny_ckpt, tmp_path)
  (path / "model.safetensors").unlink()
  with pytest.raises(FileNotFoundError, match="model.safetensors"):
    models.load_pretrained(path)
  (path / "config.json").unlink()
  with pytest.raises(FileNotFoundError, match="config.json"):
    models.load_pretrained(path)


def test_error_malformed_config(tiny_ckpt, tmp_path):
  path = _copy(tiny_ckpt, tmp_path)
  (path / "config.json").write_text("{not json")
  with pytest.raises(ValueError, match="config.json: malformed JSON"):
    models.load_pretrained(path)
  (path / "config.json").write_text("[1, 2]")
  with pytest.raises(ValueError, match="expected a JSON object"):
    models.load_pretrained(path)


@pytest.mark.parametrize("changes,match", [
    (dict(architectures=["MistralForCausalLM"], model_type="mistral"),
     "unsupported architecture.*MistralForCausalLM"),
    (dict(architectures=None, model_type="gpt2"), "unsupported model_type"),
    (dict(hidden_size=None), r"missing field\(s\) \['hidden_size'\]"),
    (dict(num_key_value_heads=3), "multiple of num_key_value_heads"),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 2.0,
                           "rope_theta": 1e4}), "only rope_type 'llama3'"),
    (dict(hidden_act="gelu"), "hidden_act"),
    # Out of range: these used to load and train to "loss is nan".
    (dict(eos_token_id=10**6), r"config.json: .*eos_token_id must be a token "
     r"id in \[0, vocab_size="),
    (dict(eos_token_id=[2, -1]), "eos_token_id must be a token id"),
    (dict(bos_token_id=-1), "bos_token_id must be a token id.*got -1"),
    (dict(rms_norm_eps=0.0), "rms_norm_eps must be a finite number > 0"),
    (dict(rms_norm_eps=float("nan")), "rms_norm_eps must be a finite number"),
    (dict(rope_theta=-1.0), "rope_theta must be a finite number > 0"),
    (dict(rope_theta=0), "rope_theta must be a finite number > 0"),
])
def test_error_bad_config_fields(changes, match, tiny_ckpt, tmp_path):
  path = _copy(tiny_ckpt, tmp_path)
  _edit_config(path, **changes)
  with pytest.raises(ValueError, match=match):
    models.load_pretrained(path)


def test_error_missing_tensor(tiny_ckpt, tmp_path):
  path = _copy(tiny_ckpt, tmp_path)
  _edit_tensors(path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
  with pytest.raises(ValueError,
                     match=r"missing tensor 'model.layers.1.mlp.up_proj.weight'"):
    models.load_pretrained(path)


def test_error_wrong_shape_names_both_shapes(tiny_ckpt, tmp_path):
  path = _copy(tiny_ckpt, tmp_path)
  def shrink(t):
    t["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(16, 64)
  _edit_tensors(path, shrink)
  with pytest.raises(ValueError, match=(
      r"'model.layers.0.self_attn.k_proj.weight' has shape \(16, 64\), "
      r"expected \(32, 64\)")):
    models.load_pretrained(path)


def test_error_unexpected_tensor(tiny_ckpt, tmp_path):
  """A bias the config does not declare (llama without attention_bias)."""
  path = _copy(tiny_ckpt, tmp_path)
  def add(t):
    t["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
  _edit_tensors(path, add)
  with pytest.raises(ValueError, match="does not use.*q_proj.bias"):
    models.load_pretrained(path)


def test_error_bad_apply_inputs(tiny_ckpt):
  cfg, params = models.load_pretrained(tiny_ckpt("llama3"))
  with pytest.raises(ValueError, match="tokens must be an int array"):
    models.apply(cfg, params, jnp.zeros((2, 3), jnp.float32))
  with pytest.raises(ValueError, match="attention_mask must have"):
    models.apply(cfg, params, jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 4)))
  with pytest.raises(ValueError, match=r"cache\['k'\] has shape"):
    models.apply(cfg, params, jnp.zeros((2, 3), jnp.int32),
                 cache=models.init_cache(cfg, 3, 8))
  with pytest.raises(ValueError, match="exceeds the cache length"):
    models.apply(cfg, params, jnp.zeros((2, 9), jnp.int32),
                 cache=models.init_cache(cfg, 2, 8))


def test_error_bad_dtype_argument(tiny_ckpt):
  with pytest.raises(ValueError, match="param_dtype must be float32"):
    models.load_pretrained(tiny_ckpt("llama3"), param_dtype="int8")


def test_bfloat16_checkpoint_written_by_transformers(tmp_path):
  model = tiny_hf.make_tiny_model("qwen2", tie_word_embeddings=False)
  model.to(torch.bfloat16).save_pretrained(tmp_path)
  cfg, params = models.load_pretrained(tmp_path)  # keeps the stored dtype
  assert cfg.dtype == cfg.param_dtype == "bfloat16"
  sd = {k: v.float().numpy() for k, v in model.state_dict().items()}
  emb = params["embed_tokens"]["embedding"]
  assert emb.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(emb, np.float32),
                                sd["model.embed_tokens.weight"])
  q = np.asarray(params["layers"]["self_attn"]["q_proj"]["kernel"][1], np.float32)
  np.testing.assert_array_equal(  # [D, N, H] vs HF [N * H, D]
      q.reshape(cfg.hidden_size, -1).T, sd["model.layers.1.self_attn.q_proj.weight"])
  np.testing.assert_array_equal(
      np.asarray(params["lm_head"]["kernel"], np.float32).T, sd["lm_head.weight"])
  _, p32 = models.load_pretrained(tmp_path, dtype="float32")
  assert p32["norm"]["scale"].dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(p32["norm"]["scale"]),
                                sd["model.norm.weight"])
