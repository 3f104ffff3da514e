"""generate() on small random jaxdistill models.

References: full (cache-free) forward passes of each model recomputed in
float64 NumPy softmax, binomial sampling error, chi-square goodness of fit.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxdistill import models
from jaxdistill import rollout
from jaxdistill.rollout import generation as generate_lib

EOS = (2, 5)


def _cfg(**kw):
  base = dict(family="llama", vocab_size=96, hidden_size=32,
              intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, eos_token_id=EOS,
              max_position_embeddings=128, rope_theta=10000.0)
  return models.ModelConfig(**{**base, **kw})


def _random_params(cfg, seed):
  # NumPy-filled (no init compile); weights large enough that the models'
  # distributions differ clearly from each other.
  rng = np.random.default_rng(seed)
  def fill(path, s):
    is_norm = "scale" in jax.tree_util.keystr(path)
    return jnp.asarray(rng.normal(0.0, 0.15, s.shape) + is_norm, s.dtype)
  return jax.tree_util.tree_map_with_path(fill, models.param_shapes(cfg))


@pytest.fixture(scope="module")
def student():
  cfg = _cfg()
  return cfg, _random_params(cfg, 0)


@pytest.fixture(scope="module")
def teacher():
  # A bigger vocabulary (as Qwen2.5-7B vs 0.5B): sampling uses the common one.
  cfg = _cfg(vocab_size=104, hidden_size=48, num_hidden_layers=3,
             family="qwen2", attention_bias=True)
  return cfg, _random_params(cfg, 1)


@pytest.fixture(scope="module")
def batch():
  rng = np.random.default_rng(0)
  ids = [rng.integers(6, 96, n).tolist() for n in rng.integers(1, 8, 32)]
  return rollout.pad_prompts(ids, bucket=8)


def _full_logprobs(model, r, t, vocab):
  """log softmax(logits / t) of each response token, by a cache-free forward."""
  cfg, params = model
  logits = models.apply(cfg, params, r.tokens, r.attention_mask)
  p = r.prompt_len
  x = np.asarray(logits, np.float64)[:, p - 1:-1, :vocab] / t  # [B, N, V]
  x = x - x.max(-1, keepdims=True)
  lp = x - np.log(np.exp(x).sum(-1, keepdims=True))
  tok = np.asarray(r.tokens)[:, p:]
  return np.take_along_axis(lp, tok[..., None], -1)[..., 0]


@pytest.mark.slow  # compiles three rollout programs
def test_mixture_endpoints_fraction_and_logprobs(student, teacher, batch):
  prompts, mask = batch
  kw = dict(rng=jax.random.key(3), max_new_tokens=12, temperature=0.8)
  st = rollout.generate(student, teacher, prompts, mask, policy="student", **kw)
  te = rollout.generate(student, teacher, prompts, mask, policy="teacher", **kw)
  mix = lambda lam: rollout.generate(student, teacher, prompts, mask,
                                     policy="coin_mixture", lam=lam, **kw)
  m1, m0, m3 = mix(1.0), mix(0.0), mix(0.3)
  for m, pure, frac in ((m1, st, 1.0), (m0, te, 0.0)):
    np.testing.assert_array_equal(m.tokens, pure.tokens)
    np.testing.assert_array_equal(m.response_mask, pure.response_mask)
    np.testing.assert_array_equal(m.logprobs, pure.logprobs)
    assert float(m.student_fraction) == frac == float(pure.student_fraction)
  assert (np.asarray(st.tokens) != np.asarray(te.tokens)).any()

  for r in (st, te, m3):
    resp = np.asarray(r.tokens)[:, r.prompt_len:]
    assert resp.max() < 96  # the teacher's extra vocabulary is never sampled
    ls = _full_logprobs(student, r, 0.8, 96)
    lt = _full_logprobs(teacher, r, 0.8, 96)
    fs, m = np.asarray(r.from_student), np.asarray(r.response_mask) > 0
    ref = np.where(fs, ls, lt)
    np.testing.assert_allclose(np.asarray(r.logprobs)[m], ref[m], atol=2e-4)
    assert np.abs(ls - lt)[m].mean() > 0.1  # a swap would be caught
    assert (np.asarray(r.logprobs)[~m] == 0).all() and not fs[~m].any()

  # The coins are independent of the tokens: binomial error over the tokens.
  m = np.asarray(m3.response_mask) > 0
  frac = float(m3.student_fraction)
  assert frac == pytest.approx(np.asarray(m3.from_student)[m].mean(), abs=1e-6)
  assert abs(frac - 0.3) < 4 * np.sqrt(0.3 * 0.7 / m.sum())


def test_first_token_is_drawn_from_tempered_softmax(student):
  cfg, params = student
  t, b = 1.4, 8192
  prompt = [11, 40, 3, 70]
  prompts, mask = rollout.pad_prompts([prompt] * b, bucket=None)
  r = rollout.generate(student, None, prompts, mask, rng=jax.random.key(9),
                       max_new_tokens=1, temperature=t)
  x = np.asarray(models.apply(cfg, params, jnp.asarray([prompt])),
                 np.float64)[0, -1] / t
  p = np.exp(x - x.max())
  p /= p.sum()
  counts = np.bincount(np.asarray(r.tokens)[:, -1], minlength=96)
  # Pool the rare tokens into one bin so every expected count is >= 5.
  big = p * b >= 5
  obs, exp = counts[big], p[big] * b
  if not big.all():
    obs, exp = np.append(obs, counts[~big].sum()), np.append(exp, p[~big].sum() * b)
  assert stats.chisquare(obs, exp).pvalue > 1e-3
  np.testing.assert_allclose(
      np.asarray(r.logprobs)[:, 0], np.log(p[np.asarray(r.tokens)[:, -1]]),
      atol=1e-4)


def test_eos_and_max_new_tokens(student, batch):
  prompts, mask = batch
  n = 12  # B, P, N as in the mixture test: the same compiled program
  r = rollout.generate(student, None, prompts, mask, rng=jax.random.key(0),
                       max_new_tokens=n, temperature=1.0)
  resp = np.asarray(r.tokens)[:, r.prompt_len:]
  rm = np.asarray(r.response_mask)
  np.testing.assert_array_equal(np.asarray(r.tokens)[:, :r.prompt_len], prompts)
  kinds = set()
  for row, m, length, ended in zip(resp, rm, np.asarray(r.lengths),
                                   np.asarray(r.ended)):
    hits = np.flatnonzero(np.isin(row, EOS))
    end = hits[0] + 1 if hits.size and hits[0] < length else n
    assert length == end and bool(ended) == (end < n or row[n - 1] in EOS)
    np.testing.assert_array_equal(m, np.arange(n) < end)
    assert (row[end:] == 0).all()
    kinds.add(bool(ended))
  assert kinds == {True, False}  # both an ended row and one that hit N
  ids = rollout.response_token_ids(r)
  assert [len(i) for i in ids] == [int(l) - int(e) for l, e in
                                   zip(np.asarray(r.lengths), np.asarray(r.ended))]


def _compiled():
  """Programs of the jitted rollout so far (one per static signature)."""
  return generate_lib._rollout._cache_size()


def test_one_compilation_per_bucket(student):
  before = _compiled()
  for i, (lens, t) in enumerate([((3, 5), 1.0), ((6, 2), 0.5), ((7, 8), 0.7)]):
    ids = [list(range(10, 10 + n)) for n in lens]
    prompts, mask = rollout.pad_prompts(ids, bucket=None)
    # Widths 5, 6 and 8 all go to bucket 8; rng, temperature, top_p traced.
    rollout.generate(student, None, prompts, mask, rng=jax.random.key(i),
                     max_new_tokens=6, bucket="pow2", temperature=t,
                     top_p=0.8 + 0.05 * i)
  assert _compiled() - before == 1


def test_eos_ids_is_the_union_unless_overridden():
  class Cfg:  # eos_token_id as configs hold it: a tuple, an int or None
    def __init__(self, eos):
      self.eos_token_id = eos

  class Tok:
    eos_token_id = 40

  assert rollout.eos_ids(Cfg((5, 2)), Cfg(7)) == (2, 5, 7)
  assert rollout.eos_ids(Cfg(None), tokenizer=Tok(), extra=[9, 5]) == (5, 9, 40)
  assert rollout.eos_ids(Cfg(2), tokenizer=object()) == (2,)  # no eos_token_id
  assert rollout.eos_ids(Cfg(2), tokenizer=Tok(), override=[8, 3, 8]) == (3, 8)
  assert rollout.eos_ids(Cfg(2), override=()) == (2,)  # empty: not set
  assert rollout.eos_ids() == ()

def test_pad_prompts_buckets():
  p, m = rollout.pad_prompts([[4, 5, 6], [7]], pad_token_id=1, bucket=4)
  np.testing.assert_array_equal(p, [[1, 4, 5, 6], [1, 1, 1, 7]])
  np.testing.assert_array_equal(m, [[0, 1, 1, 1], [0, 0, 0, 1]])
  assert [rollout.bucket_length(n) for n in (1, 2, 3, 64, 65)] == [1, 2, 4, 64, 128]
  assert [rollout.bucket_length(n, 64) for n in (1, 64, 65)] == [64, 64, 128]
  with pytest.raises(ValueError, match=r"token_ids\[1\]"):
    rollout.pad_prompts([[1], []])


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(policy="coin_mixture", lam=1.5), "lam"),
    (dict(policy="coin_mixture", lam=-0.1), "lam"),
    (dict(policy="coin_mixture"), "lam"),
    (dict(policy="teacher", teacher=None), "teacher"),
    (dict(policy="coin_mixture", lam=0.5, teacher=None), "teacher"),
    (dict(policy="beam"), "policy"),
    (dict(max_new_tokens=200), "max_new_tokens"),  # past max positions (128)
    (dict(cache_len=10), "cache_len"),  # prompt 8 + 4 new does not fit
    (dict(temperature=-1.0), "temperature"),
    (dict(top_k=0), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(empty_row=True), "prompt_mask"),
    (dict(right_padded=True), "prompt_mask"),
    (dict(width0=True), "prompts"),
])
def test_bad_input_raises_naming_the_argument(student, teacher, batch, kwargs,
                                              match):
  prompts, mask = batch
  mask = mask.copy()
  if kwargs.pop("empty_row", False):
    mask[1] = 0
  if kwargs.pop("right_padded", False):
    mask[2] = mask[2][::-1]
  if kwargs.pop("width0", False):
    prompts, mask = prompts[:, :0], mask[:, :0]
  kw = dict(rng=jax.random.key(0), max_new_tokens=4, teacher=teacher)
  kw.update(kwargs)
  t = kw.pop("teacher")
  before = _compiled()
  with pytest.raises(ValueError, match=match):
    rollout.generate(student, t, prompts, mask, **kw)
  assert _compiled() == before  # raised before any compute


def _padding_heavy(model, real):
  """The model with its output-head columns >= `real` (embedding padding) made
  far more likely than any real token."""
  cfg, params = model
  head = np.array(params["lm_head"]["kernel"])
  head[:, real:] = 0.0
  bias_dir = np.asarray(params["norm"]["scale"])  # final hidden ~ this sign
  head[:, real:] += 5.0 * np.sign(bias_dir)[:, None]
  params = dict(params, lm_head={"kernel": jnp.asarray(head)})
  return cfg, params


def test_vocab_size_keeps_padding_ids_out_of_rollouts(student):
  real, t = 60, 0.9
  rng = np.random.default_rng(1)
  prompts, mask = rollout.pad_prompts(
      [rng.integers(6, real, n).tolist() for n in rng.integers(1, 8, 32)],
      bucket=8)
  model = _padding_heavy(student, real)
  kw = dict(rng=jax.random.key(4), max_new_tokens=6, temperature=t,
            eos_token_ids=())
  # Without the real vocabulary, padding ids are what the model samples.
  loose = rollout.generate(model, None, prompts, mask, **kw)
  assert (np.asarray(loose.tokens)[:, prompts.shape[1]:] >= real).mean() > 0.25
  r = rollout.generate(model, None, prompts, mask, vocab_size=real, **kw)
  gen = np.asarray(r.tokens)[:, prompts.shape[1]:]
  assert gen.max() < real
  # Log-probs renormalised over the real vocabulary (float64 reference).
  np.testing.assert_allclose(np.asarray(r.logprobs),
                             _full_logprobs(model, r, t, real), atol=2e-4)
  with pytest.raises(ValueError, match="vocab_size"):
    rollout.generate(model, None, prompts, mask, vocab_size=97, **kw)


def test_prefill_in_chunks_is_the_one_pass_prefill(student, batch,
                                                   monkeypatch):
  """Prompts of width 8 prefilled in passes of 3 positions (2, then 3 and
  3; the short prompts' first passes are all padding): the same cache as
  one pass, the cache-free forward's last hidden state, and rollouts whose
  log-probs are those of cache-free forwards (float64 softmax)."""
  cfg, params = student
  prompts, mask = (jnp.asarray(x) for x in batch)
  one = generate_lib._prefill(cfg, params, prompts, mask,
                              models.init_cache(cfg, 32, 14))
  monkeypatch.setattr(generate_lib, "PREFILL_CHUNK", 3)
  last, cache = generate_lib._prefill(cfg, params, prompts, mask,
                                      models.init_cache(cfg, 32, 14))
  want = models.apply(cfg, params, prompts, mask, return_hidden=True)[:, -1]
  np.testing.assert_allclose(last, want, atol=1e-5)
  np.testing.assert_allclose(last, one[0], atol=1e-5)
  # Keys and values of real tokens; a padding slot's (never attended to)
  # depends on what its all-masked query averaged over.
  real = np.asarray(one[1]["mask"])  # [B, S]
  np.testing.assert_array_equal(cache["mask"], real)
  for k in ("pos", "index"):
    np.testing.assert_array_equal(cache[k], one[1][k])
  for k in ("k", "v"):  # [L, B, K, S, H] and [L, B, K, H, S]
    keep = np.expand_dims(real, (0, 2, 4))
    keep = np.broadcast_to(keep if k == "k" else np.swapaxes(keep, 3, 4),
                           cache[k].shape)
    np.testing.assert_allclose(np.where(keep, cache[k], 0),
                               np.where(keep, one[1][k], 0), atol=1e-5,
                               err_msg=k)
  # max_new_tokens=7: a signature no other test compiles, so the rollout is
  # traced with the 3-position passes.
  r = rollout.generate(student, None, prompts, mask, rng=jax.random.key(5),
                       max_new_tokens=7, temperature=0.9, eos_token_ids=())
  np.testing.assert_allclose(np.asarray(r.logprobs),
                             _full_logprobs(student, r, 0.9, 96), atol=2e-4)


def test_raw_prng_keys_accepted(student, batch):
  """jax.random.PRNGKey's raw uint32 keys (one, or one per row) sample what
  the typed keys holding the same data sample; before, a raw key's 2 words
  were read as 2 per-row keys and refused ("one key or one per row")."""
  prompts, mask = batch
  kw = dict(max_new_tokens=12, temperature=1.0)
  typed = rollout.generate(student, None, prompts, mask, rng=jax.random.key(3), **kw)
  raw = rollout.generate(student, None, prompts, mask,
                         rng=jax.random.PRNGKey(3), **kw)
  np.testing.assert_array_equal(np.asarray(raw.tokens), np.asarray(typed.tokens))
  b = prompts.shape[0]
  rows = jax.random.split(jax.random.PRNGKey(4), b)  # raw [B, 2]
  per_row_raw = rollout.generate(student, None, prompts, mask, rng=rows, **kw)
  per_row = rollout.generate(student, None, prompts, mask,
                             rng=jax.random.wrap_key_data(rows), **kw)
  np.testing.assert_array_equal(np.asarray(per_row_raw.tokens),
                                np.asarray(per_row.tokens))
  assert not np.array_equal(np.asarray(per_row.tokens), np.asarray(typed.tokens))
  with pytest.raises(ValueError, match="rng: one key or one per row"):
    rollout.generate(student, None, prompts, mask,
                     rng=jax.random.split(jax.random.key(0), b + 1), **kw)
