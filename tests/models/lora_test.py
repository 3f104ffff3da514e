"""LoRA (models/lora.py) against peft + transformers and NumPy formulas."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxdistill import models
from jaxdistill.models import lora
from safetensors.numpy import load_file

TOL = 1e-4  # max |logit difference|, float32, as tests/models/parity_test.py
RANK, ALPHA = 4, 8.0


def _tokens(vocab, b=2, t=12, seed=0):
  return np.random.RandomState(seed).randint(0, vocab, (b, t)).astype(np.int32)


def _peft_model(path, hf_model, seed=0):
  """The transformers model at `path` wrapped by peft (all seven
  projections), with random non-zero A and B."""
  import copy
  import peft
  conf = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                         bias="none", target_modules=list(lora.TARGETS))
  model = peft.get_peft_model(copy.deepcopy(hf_model(path)), conf).eval()
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "lora_" in name:
        p.copy_(0.3 * torch.randn(p.shape, generator=gen))
  return model


def _peft_tensors(model):
  return {k: v.detach().numpy() for k, v in model.state_dict().items()
          if "lora_" in k}


@pytest.mark.parametrize("name", ["llama3", "qwen2_untied"])
def test_forward_matches_peft(name, tiny_ckpt, hf_model):
  path = tiny_ckpt(name)
  cfg, params = models.load_pretrained(path)
  model = _peft_model(path, hf_model)
  lcfg = lora.LoraConfig(RANK, ALPHA)
  # peft names its tensors ...lora_A.default.weight; ours drop the adapter name.
  tensors = {k.replace(".default", ""): v for k, v in _peft_tensors(model).items()}
  adapters = lora.from_peft(cfg, lcfg, tensors)
  tokens = _tokens(cfg.vocab_size)
  with torch.no_grad():
    ref = model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
  ours = np.asarray(models.apply(cfg, lora.attach(params, adapters, lcfg.scale),
                                 tokens))
  assert np.abs(ours - ref).max() <= TOL
  # The adapters matter: the base alone is far from peft's output.
  base = np.asarray(models.apply(cfg, params, tokens))
  assert np.abs(base - ref).max() > 100 * TOL
  # And the merged weights give the same logits.
  merged = np.asarray(models.apply(cfg, lora.merge(params, adapters, lcfg.scale),
                                   tokens))
  assert np.abs(merged - ref).max() <= TOL


def test_save_peft_loads_in_peft(tiny_ckpt, hf_model, tmp_path):
  """Our adapters, written by save_peft, load in peft and give our logits."""
  import copy
  import peft
  path = tiny_ckpt("qwen2_tied")
  cfg, params = models.load_pretrained(path)
  lcfg = lora.LoraConfig(RANK, ALPHA, targets=("q_proj", "o_proj", "down_proj"))
  adapters = lora.init(cfg, lcfg, jax.random.key(1))
  adapters = jax.tree.map(  # a non-zero B
      lambda x: x + 0.2 * jax.random.normal(jax.random.key(2), x.shape), adapters)
  out = lora.save_peft(str(tmp_path / "adapter"), lcfg, adapters,
                       base_model=str(path))
  model = peft.PeftModel.from_pretrained(copy.deepcopy(hf_model(path)), out).eval()
  tokens = _tokens(cfg.vocab_size, seed=3)
  with torch.no_grad():
    ref = model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
  ours = np.asarray(models.apply(cfg, lora.attach(params, adapters, lcfg.scale),
                                 tokens))
  assert np.abs(ours - ref).max() <= TOL
  conf = json.loads((tmp_path / "adapter" / lora.PEFT_CONFIG).read_text())
  assert (conf["r"], conf["lora_alpha"], conf["lora_dropout"], conf["bias"]) == (
      RANK, ALPHA, 0.0, "none")


def test_merged_export_is_w_plus_scaled_ba(tiny_ckpt, tmp_path):
  """The saved merged checkpoint holds W + (alpha / r) B A in HF's [out, in]
  layout, computed here in NumPy from the saved base and adapter files."""
  path = tiny_ckpt("llama3")
  cfg, params = models.load_pretrained(path)
  lcfg = lora.LoraConfig(RANK, ALPHA)
  adapters = jax.tree.map(
      lambda x: 0.1 * jax.random.normal(jax.random.key(4), x.shape),
      lora.shapes(cfg, lcfg))
  lora.save_peft(str(tmp_path / "ad"), lcfg, adapters)
  models.save_pretrained(cfg, lora.merge(params, adapters, lcfg.scale),
                         str(tmp_path / "merged"))
  base = load_file(str(path / "model.safetensors"))
  ad = load_file(str(tmp_path / "ad" / lora.PEFT_WEIGHTS))
  merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
  n = 0
  for key, w in base.items():
    prefix = "base_model.model." + key[:-len(".weight")]
    if prefix + ".lora_A.weight" in ad:
      a, b = ad[prefix + ".lora_A.weight"], ad[prefix + ".lora_B.weight"]
      assert a.shape == (RANK, w.shape[1]) and b.shape == (w.shape[0], RANK)
      want = w.astype(np.float64) + (ALPHA / RANK) * (b.astype(np.float64) @ a)
      n += 1
    else:
      want = w
    np.testing.assert_allclose(merged[key], want, rtol=1e-5, atol=1e-6)
  assert n == 7 * cfg.num_hidden_layers


def test_merge_rounds_once_to_the_base_dtype():
  cfg = models.ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=24,
                           num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=1, head_dim=8,
                           param_dtype="bfloat16")
  params = models.init(cfg, jax.random.key(0))
  lcfg = lora.LoraConfig(2, 4.0, targets=("up_proj",))
  adapters = jax.tree.map(lambda x: jnp.full(x.shape, 0.01, x.dtype),
                          lora.shapes(cfg, lcfg))
  out = lora.merge(params, adapters, lcfg.scale)["layers"]["mlp"]["up_proj"]["kernel"]
  w = np.asarray(params["layers"]["mlp"]["up_proj"]["kernel"], np.float32)
  assert out.dtype == jnp.bfloat16
  want = (w + 2.0 * 2 * 0.01 * 0.01).astype(jnp.bfloat16)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(want))


def test_fresh_adapter_is_the_base_and_init_is_peft_like():
  cfg = models.ModelConfig(vocab_size=40, hidden_size=64, intermediate_size=96,
                           num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=16)
  params = models.init(cfg, jax.random.key(0))
  lcfg = lora.LoraConfig(8, 16.0)
  adapters = lora.init(cfg, lcfg, jax.random.key(1))
  tokens = _tokens(cfg.vocab_size)
  np.testing.assert_array_equal(
      np.asarray(models.apply(cfg, lora.attach(params, adapters, 2.0), tokens)),
      np.asarray(models.apply(cfg, params, tokens)))
  for t in lora.TARGETS:
    ad = adapters["layers"][lora.MODULES[t]][t]
    kernel = params["layers"][lora.MODULES[t]][t]["kernel"]
    fan_in = {"o_proj": 4 * 16, "down_proj": 96}.get(t, 64)
    a = np.asarray(ad["lora_a"])
    n = 3 if t == "o_proj" else 2  # [L, *in] of the kernel [L, *in, *out]
    assert a.shape == kernel.shape[:n] + (8,)
    assert ad["lora_b"].shape == (2, 8) + kernel.shape[n:]
    assert not np.asarray(ad["lora_b"]).any()
    # peft: kaiming_uniform_(a=sqrt(5)) is U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    assert np.abs(a).max() <= 1 / np.sqrt(fan_in)
    assert np.abs(a).max() > 0.9 / np.sqrt(fan_in)
    assert a.dtype == np.float32


def test_logical_axes_follow_the_kernel():
  cfg = models.ModelConfig(vocab_size=40, hidden_size=32, intermediate_size=48,
                           num_hidden_layers=1, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=8)
  axes = lora.logical_axes(cfg, lora.LoraConfig(2, 2.0))
  attn, mlp = axes["layers"]["self_attn"], axes["layers"]["mlp"]
  r = "lora_rank"
  assert attn["o_proj"] == {"lora_a": ("layers", "heads", "head_dim", r),
                            "lora_b": ("layers", r, "embed")}
  assert attn["k_proj"] == {"lora_a": ("layers", "embed", r),
                            "lora_b": ("layers", r, "kv_heads", "head_dim")}
  assert mlp["down_proj"]["lora_a"] == ("layers", "mlp", r)
  shapes = lora.shapes(cfg, lora.LoraConfig(2, 2.0))
  assert jax.tree.structure(shapes) == jax.tree.structure(
      axes, is_leaf=lambda x: isinstance(x, tuple))


@pytest.mark.parametrize("block,msg", [
    (dict(rank=-1, alpha=2.0), "rank must be a positive int"),
    (dict(rank=4, alpha=0.0), "alpha must be > 0"),
    (dict(rank=4, alpha=4.0, targets=["q_proj", "lm_head"]), "targets"),
    (dict(rank=4, alpha=4.0, dtype="float16"), "dtype"),
])
def test_bad_config_is_refused(block, msg):
  with pytest.raises(ValueError, match=msg):
    lora.from_config(block)


def test_rank_zero_or_none_is_off():
  assert lora.from_config(None) is None
  assert lora.from_config(dict(rank=0, alpha=256.0)) is None
  assert lora.from_config(dict(rank=None, alpha=256.0)) is None
  assert lora.from_config(dict(rank=256, alpha=256.0)).scale == 1.0


def test_base_quant_without_a_rank_is_refused():
  """An NF4 base with LoRA off would leave nothing to hold it for: refused,
  naming the field (before, the whole model trained unquantised)."""
  with pytest.raises(ValueError, match=r"config\.student\.lora\.base_quant"):
    lora.from_config({"rank": None, "base_quant": "nf4"})
  assert lora.from_config({"rank": 0}) is None


def test_nf4_base_of_a_model_whose_sizes_are_not_blocks_is_refused_naming_it():
  # intermediate_size 96 is not a multiple of NF4's 64-input blocks: down_proj
  # (96 inputs) cannot be quantised; the other projections (64) can.
  cfg = models.ModelConfig(vocab_size=40, hidden_size=64, intermediate_size=96,
                           num_hidden_layers=1, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=16)
  lcfg = lora.from_config({"rank": 4, "base_quant": "nf4"})
  with pytest.raises(ValueError, match=(
      r"^config\.student\.lora\.base_quant: 'nf4' quantises blocks of 64 "
      r"inputs, and this model's down_proj projection has 96 inputs")):
    lora.check_base(cfg, lcfg)
  lora.check_base(cfg, lora.from_config({"rank": 4}))  # no quantised base
  ok = models.ModelConfig(vocab_size=40, hidden_size=64, intermediate_size=128,
                          num_hidden_layers=1, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16)
  lora.check_base(ok, lcfg)
  # What the check stands for: quantising that model's base fails.
  with pytest.raises(ValueError, match="multiple of the block size 64"):
    lora.base_shapes(cfg, lcfg)
  lora.base_shapes(ok, lcfg)
