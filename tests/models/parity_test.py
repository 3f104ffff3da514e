"""Logit parity with transformers (PyTorch, float32) on tiny random models."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxdistill import models
from jaxdistill.models import checkpoint

TOL = 1e-4  # max |logit difference|, float32


def _batch(vocab, b=3, t=96, pads=(0, 5, 17), seed=0):
  rs = np.random.RandomState(seed)
  tokens = rs.randint(0, vocab, (b, t)).astype(np.int32)
  mask = np.ones((b, t), np.int32)
  for row, p in enumerate(pads):
    mask[row, :p] = 0
    tokens[row, :p] = 0
  return tokens, mask


def _hf_logits(model, tokens, mask=None):
  kw = {}
  if mask is not None:
    # HF defaults positions to 0..T-1; generate() uses cumsum(mask) - 1, which
    # is what our left-padding semantics promise.
    pos = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
    kw = dict(attention_mask=torch.tensor(mask), position_ids=torch.tensor(pos))
  with torch.no_grad():
    return model(torch.tensor(tokens, dtype=torch.long), **kw).logits.numpy()


@pytest.mark.parametrize("name,rope_form", [
    ("llama3", "classic"),
    ("llama3", "rope_parameters"),
    ("llama_tied", "rope_parameters"),
    ("qwen2_tied", "classic"),
    ("qwen2_untied", "rope_parameters"),
])
def test_left_padded_batch_matches_transformers(name, rope_form, tiny_ckpt,
                                                hf_model):
  path = tiny_ckpt(name, rope_form)
  cfg, params = models.load_pretrained(path)
  ref_model = hf_model(path)
  assert cfg.tie_word_embeddings == ref_model.config.tie_word_embeddings
  tokens, mask = _batch(cfg.vocab_size)
  ours = np.asarray(models.apply(cfg, params, tokens, mask))
  assert ours.shape == (*tokens.shape, cfg.vocab_size)
  ref = _hf_logits(ref_model, tokens, mask)
  real = mask.astype(bool)
  assert np.abs(ours - ref)[real].max() <= TOL
  assert np.isfinite(ours).all()  # pad rows too (fully masked rows stay finite)
  # A left-padded row equals the same row without padding.
  for row, p in enumerate((0, 5, 17)):
    alone = _hf_logits(ref_model, tokens[row:row + 1, p:])[0]
    assert np.abs(ours[row, p:] - alone).max() <= TOL


def test_llama3_rope_scaling_matters(tiny_ckpt, hf_model):
  """Guards the parity test: without the llama3 scaling the logits differ."""
  path = tiny_ckpt("llama3")
  cfg, params = models.load_pretrained(path)
  tokens, _ = _batch(cfg.vocab_size, b=1, pads=(0,))
  plain = dataclasses.replace(cfg, rope_scaling=None)
  diff = np.abs(np.asarray(models.apply(plain, params, tokens))
                - _hf_logits(hf_model(path), tokens)).max()
  assert diff > 100 * TOL


@pytest.mark.parametrize("name", ["llama3", "qwen2_untied"])
def test_cache_decode_matches_full_forward(name, tiny_ckpt, hf_model):
  path = tiny_ckpt(name)
  cfg, params = models.load_pretrained(path)
  pads, prompt_len, total = (0, 3), 10, 24
  tokens, mask = _batch(cfg.vocab_size, b=2, t=total, pads=pads, seed=1)
  ref = _hf_logits(hf_model(path), tokens, mask)

  step = jax.jit(lambda p, t, c, m=None: models.apply(cfg, p, t, m, cache=c))
  cache = models.init_cache(cfg, 2, 32)
  logits, cache = step(params, tokens[:, :prompt_len], cache,
                       mask[:, :prompt_len])
  outs = [logits]
  for t in range(prompt_len, total):  # one token per step
    logits, cache = step(params, tokens[:, t:t + 1], cache)
    outs.append(logits)
  ours = np.concatenate([np.asarray(o) for o in outs], axis=1)
  real = mask.astype(bool)
  assert np.abs(ours - ref)[real].max() <= TOL
  np.testing.assert_array_equal(np.asarray(cache["pos"]), mask.sum(1))
  assert int(cache["index"]) == total


def test_return_hidden_times_head_is_logits(tiny_ckpt, hf_model):
  path = tiny_ckpt("qwen2_untied")
  cfg, params = models.load_pretrained(path)
  tokens, mask = _batch(cfg.vocab_size, b=2, t=16, pads=(0, 4))
  hidden = models.apply(cfg, params, tokens, mask, return_hidden=True)
  assert hidden.shape == (2, 16, cfg.hidden_size)
  head = np.asarray(models.output_head(cfg, params), np.float64)
  ref = _hf_logits(hf_model(path), tokens, mask)
  got = np.asarray(hidden, np.float64) @ head
  assert np.abs(got - ref)[mask.astype(bool)].max() <= TOL


def test_gradients_match_torch_autograd(tiny_ckpt, hf_model):
  """Gradients through the scanned, rematerialised layers vs torch autograd."""
  path = tiny_ckpt("qwen2_untied")
  cfg, params = models.load_pretrained(path)
  cfg = dataclasses.replace(cfg, remat="full")
  tokens, mask = _batch(cfg.vocab_size, b=2, t=12, pads=(0, 3))
  weights = np.random.RandomState(2).randn(2, 12, cfg.vocab_size).astype(
      np.float32) * mask[..., None]

  def loss(p):
    return jnp.sum(models.apply(cfg, p, tokens, mask) * weights)
  grads = jax.jit(jax.grad(loss))(params)

  model = hf_model(path)
  model.zero_grad()
  pos = np.clip(np.cumsum(mask, 1) - 1, 0, None)
  out = model(torch.tensor(tokens, dtype=torch.long),
              attention_mask=torch.tensor(mask),
              position_ids=torch.tensor(pos)).logits
  (out * torch.tensor(weights)).sum().backward()
  named = dict(model.named_parameters())
  for hf, leaf, kind in checkpoint.KEY_TABLE:
    if "{i}" not in hf and hf not in named:
      continue
    ours = checkpoint._get(grads, leaf)  # pylint: disable=protected-access
    for i in range(cfg.num_hidden_layers if "{i}" in hf else 1):
      g = np.asarray(ours[i] if "{i}" in hf else ours)
      g = checkpoint._to_hf(g, kind, g.shape)  # pylint: disable=protected-access
      ref = named[hf.format(i=i)].grad.numpy()
      scale = np.abs(ref).max()
      assert np.abs(g - ref).max() <= 1e-4 * max(scale, 1.0), hf.format(i=i)


def test_bfloat16_within_stated_tolerance(tiny_ckpt, hf_model):
  """bf16 params + compute: max |logit diff| vs float32 HF <= 5% of max |logit|."""
  path = tiny_ckpt("llama3")
  tokens, mask = _batch(256, b=2, t=48, pads=(0, 7))
  ref = _hf_logits(hf_model(path), tokens, mask)
  real = mask.astype(bool)
  for param_dtype in ("bfloat16", "float32"):
    cfg, params = models.load_pretrained(path, dtype="bfloat16",
                                         param_dtype=param_dtype)
    assert params["lm_head"]["kernel"].dtype == jnp.dtype(param_dtype)
    got = np.asarray(models.apply(cfg, params, tokens, mask))
    err = np.abs(got - ref)[real].max()
    assert err <= 0.05 * np.abs(ref).max(), (param_dtype, err)
    # Same argmax on the vast majority of positions.
    agree = (got.argmax(-1) == ref.argmax(-1))[real].mean()
    assert agree >= 0.9, (param_dtype, agree)
