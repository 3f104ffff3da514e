"""The NF4 frozen base (models/quant.py, lora.quantize_base) against
bitsandbytes' own 4-bit quantisation, transformers and peft."""
import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxdistill import models
from jaxdistill.models import lora
from jaxdistill.models import quant

bnb_f = pytest.importorskip("bitsandbytes.functional")

TOL = 1e-4  # max |logit difference|, float32 (tests/models/lora_test.py)
RANK, ALPHA = 4, 8.0


def _bnb_roundtrip(w_hf: torch.Tensor):
  """(codes [n], absmax [n / 64], dequantised weight) of bitsandbytes' NF4
  quantisation of a Hugging Face weight [out, in], block 64."""
  packed, state = bnb_f.quantize_4bit(w_hf, blocksize=64, quant_type="nf4")
  p = packed.reshape(-1).numpy()
  codes = np.stack([p >> 4, p & 0xF], 1).reshape(-1)
  deq = bnb_f.dequantize_4bit(packed, state).float().numpy()
  return codes, state.absmax.numpy(), deq


def _ours_unpacked(q):
  c = np.asarray(q[quant.CODES])
  return np.stack([c >> 4, c & 0xF], 2)  # [L, n_in / 2, 2, *out]


def test_nf4_values_are_bitsandbytes():
  np.testing.assert_array_equal(
      quant.NF4, bnb_f.get_4bit_type("nf4", device="cpu").numpy())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape,n_in_dims", [
    ((2, 128, 4, 16), 1),   # q_proj-like: in (D,), out (N, H)
    ((2, 4, 16, 128), 2),   # o_proj: in (N, H) with H < 64, out (D,)
    ((1, 192, 96), 1)])     # an MLP kernel
def test_quantisation_matches_bitsandbytes(shape, n_in_dims, dtype):
  """Codes, absmaxes and dequantised weights equal bitsandbytes' for every
  output row of HF's [out, in] weight, blocks running along its input."""
  rng = np.random.RandomState(0)
  w = rng.standard_normal(shape).astype(np.float32) * rng.uniform(
      0.01, 3.0, shape).astype(np.float32)
  w = np.array(jnp.asarray(w).astype(dtype).astype(jnp.float32))
  lay = shape[0]
  n_in = int(np.prod(shape[1:1 + n_in_dims]))
  n_out = int(np.prod(shape[1 + n_in_dims:]))
  w.reshape(lay, n_in, n_out)[0, :64, 1] = 0.0  # an all-zero block
  kernel = jnp.asarray(w).astype(dtype)
  q = quant.quantize_kernel(kernel, n_in_dims)
  codes = _ours_unpacked(q).reshape(lay, n_in, n_out)
  absmax = np.asarray(q[quant.ABSMAX]).reshape(lay, n_in // 64, n_out)
  deq = np.asarray(quant.dequantize(q[quant.CODES], q[quant.ABSMAX],
                                    jnp.float32)).reshape(lay, n_in, n_out)
  tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
  for i in range(lay):
    w_hf = torch.tensor(w[i].reshape(n_in, n_out).T.copy()).to(tdt)
    b_codes, b_absmax, b_deq = _bnb_roundtrip(w_hf)
    np.testing.assert_array_equal(codes[i].T.reshape(-1), b_codes)
    np.testing.assert_array_equal(absmax[i].T.reshape(-1), b_absmax)
    # bitsandbytes dequantises to the weight's dtype: float32, then rounded.
    got = np.asarray(jnp.asarray(deq[i].T).astype(dtype).astype(jnp.float32))
    np.testing.assert_array_equal(got, b_deq)
  # Not the identity: 4 bits lose most of the mantissa.
  assert np.abs(deq.reshape(w.shape) - w).max() > 0.05


def test_input_not_a_multiple_of_the_block_is_refused():
  with pytest.raises(ValueError, match="multiple of the block size 64"):
    quant.quantize_kernel(jnp.zeros((1, 48, 8)), 1)


def _bnb_hf_model(path, hf_model):
  """The transformers model at `path` with every layer's seven projections
  replaced by bitsandbytes' NF4 round trip of its weight, under peft
  adapters with random non-zero A and B."""
  import peft
  model = copy.deepcopy(hf_model(path))
  with torch.no_grad():
    for layer in model.model.layers:
      for m, t in [(lora.MODULES[t], t) for t in lora.TARGETS]:
        lin = getattr(getattr(layer, m), t)
        lin.weight.copy_(torch.tensor(_bnb_roundtrip(lin.weight.detach())[2]))
  conf = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                         bias="none", target_modules=list(lora.TARGETS))
  model = peft.get_peft_model(model, conf).eval()
  gen = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "lora_" in name:
        p.copy_(0.3 * torch.randn(p.shape, generator=gen))
  tensors = {k.replace(".default", ""): v.detach().numpy()
             for k, v in model.state_dict().items() if "lora_" in k}
  return model, tensors


@pytest.mark.parametrize("name", ["llama3", "qwen2_untied"])
def test_qlora_forward_and_export(name, tiny_ckpt, hf_model, tmp_path):
  """A LoRA model on an NF4 base (of float32 weights) gives the logits of
  transformers + peft on bitsandbytes' NF4 weights; its merged export is
  the same model, in float32."""
  path = tiny_ckpt(name)
  cfg, params = models.load_pretrained(path)
  ref_model, tensors = _bnb_hf_model(path, hf_model)
  lcfg = lora.LoraConfig(RANK, ALPHA, base_quant="nf4")
  adapters = lora.from_peft(cfg, lcfg, tensors)
  base = jax.jit(lora.quantize_base, static_argnums=0)(lcfg, params)
  assert base["layers"]["mlp"]["down_proj"][quant.CODES].dtype == jnp.uint8
  assert "kernel" not in base["layers"]["self_attn"]["o_proj"]
  tokens = np.random.RandomState(1).randint(0, cfg.vocab_size, (2, 12))
  with torch.no_grad():
    ref = ref_model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
  ours = np.asarray(models.apply(cfg, lora.attach(base, adapters, lcfg.scale),
                                 jnp.asarray(tokens, jnp.int32)))
  assert np.abs(ours - ref).max() <= TOL
  # The quantisation matters: the unquantised base is far from it.
  full = np.asarray(models.apply(cfg, lora.attach(params, adapters, lcfg.scale),
                                 jnp.asarray(tokens, jnp.int32)))
  assert np.abs(full - ref).max() > 100 * TOL
  # The export: every projection W_nf4 + (alpha / r) B A in float32, in
  # HF's layout.
  merged = jax.jit(lora.merge_base, static_argnums=(0, 3))(
      cfg, base, adapters, lcfg.scale)
  models.save_pretrained(cfg, merged, str(tmp_path / "merged"))
  from safetensors.torch import load_file
  saved = load_file(str(tmp_path / "merged" / "model.safetensors"))
  ref_sd = ref_model.state_dict()
  n = 0
  for key, w in saved.items():
    module = key[:-len(".weight")]
    if not any(module.endswith("." + t) for t in lora.TARGETS):
      continue
    lin = "base_model.model." + module
    wq = ref_sd[lin + ".base_layer.weight"].double()
    a = ref_sd[lin + ".lora_A.default.weight"].double()
    b = ref_sd[lin + ".lora_B.default.weight"].double()
    want = wq + (ALPHA / RANK) * (b @ a)  # float64
    assert w.dtype == torch.float32
    torch.testing.assert_close(w.double(), want, rtol=1e-6, atol=1e-6)
    n += 1
  assert n == 7 * cfg.num_hidden_layers


def test_bad_base_quant_is_refused():
  with pytest.raises(ValueError, match="lora.base_quant must be one of"):
    lora.from_config({"rank": 4, "base_quant": "int3"})
  assert lora.from_config({"rank": 4, "base_quant": "nf4"}).base_quant == "nf4"


def test_base_axes_and_shapes_agree():
  """Every NF4 leaf has logical axes of its own rank, and the abstract base
  the compile-only programs use is what quantize_base makes."""
  cfg = models.ModelConfig(vocab_size=32, hidden_size=64, intermediate_size=128,
                           num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=16)
  lcfg = lora.LoraConfig(2, 2.0, base_quant="nf4")
  params = models.init(cfg, jax.random.key(0))
  base = lora.quantize_base(lcfg, params)
  shapes = lora.base_shapes(cfg, lcfg)
  assert jax.tree.map(lambda x: (x.shape, x.dtype), base) == jax.tree.map(
      lambda x: (x.shape, x.dtype), shapes)
  axes = lora.base_logical_axes(cfg, lcfg)
  flat_axes = jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple))
  flat = jax.tree.leaves(base)
  assert len(flat_axes) == len(flat)
  assert all(len(a) == x.ndim for a, x in zip(flat_axes, flat))
  assert lora.params_logical_axes(cfg, base) == axes
  # 4 bits a weight plus a float32 absmax per 64 (4.5 bits), against 32.
  kb = sum(x.nbytes for x in jax.tree.leaves(base["layers"]["mlp"]))
  kp = sum(x.nbytes for x in jax.tree.leaves(params["layers"]["mlp"]))
  assert kb * 32 == kp * 4.5
