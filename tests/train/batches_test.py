"""Rollouts of the training loop (train_batches.SequenceMaker): the sampling
vocabulary and the mixture's log-probs that the sampled estimators weight by.

References: float64 NumPy softmaxes of full forward passes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdistill import config_lib
from jaxdistill import models
from jaxdistill import rollout as rollout_lib
from jaxdistill import sharding
from jaxdistill.train import batches as train_batches
from jaxdistill.train import setup as train_setup

REAL = 40  # the "tokenizer's" size; the configs' embeddings are wider


def _setup(kl, policy, lam=None):
  c = config_lib.load_config(f"configs/distill.py:runlocal,kl={kl},policy={policy}")
  if lam is not None:
    c.rollout.lam = lam
  scfg = train_setup.model_config(c.student, "student")
  tcfg = train_setup.model_config(c.teacher, "teacher")
  assert min(scfg.vocab_size, tcfg.vocab_size) > REAL
  sp = models.init(scfg, jax.random.key(0))
  tp = models.init(tcfg, jax.random.key(1))
  # Padding columns of both heads made far more likely than real tokens.
  for cfg, p in ((scfg, sp), (tcfg, tp)):
    head = np.array(models.output_head(cfg, p))
    head[:, REAL:] += 4.0 / np.sqrt(head.shape[0])
    if cfg.tie_word_embeddings:
      p["embed_tokens"]["embedding"] = jnp.asarray(head.T)
    else:
      p["lm_head"]["kernel"] = jnp.asarray(head)
  mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1),
                            devices=jax.devices()[:1])
  data = train_batches.SyntheticPrompts(batch_size=4, prompt_len=6, vocab=REAL,
                                     seed=0)
  return c, scfg, tcfg, sp, tp, mesh, data[0]


def _logp(cfg, params, tokens, attn, t):
  x = np.asarray(models.apply(cfg, params, tokens, attn), np.float64)
  x = x[:, :-1, :REAL] / t
  lp = x - np.logaddexp.reduce(x, axis=-1, keepdims=True)
  return np.take_along_axis(lp, np.asarray(tokens)[:, 1:, None], -1)[..., 0]


def test_training_rollouts_sample_only_the_real_vocabulary():
  c, scfg, tcfg, sp, tp, mesh, host = _setup("forward", "student")
  rules = sharding.DEFAULT_RULES
  loose = train_batches.SequenceMaker(c, scfg, tcfg, mesh, rules)
  b, _ = loose(host, sp, tp, jax.random.key(5))
  m = np.asarray(b["loss_mask"]) > 0
  assert (np.asarray(b["tokens"])[m] >= REAL).mean() > 0.5  # the bug, shown
  maker = train_batches.SequenceMaker(c, scfg, tcfg, mesh, rules, vocab_size=REAL)
  b, _ = maker(host, sp, tp, jax.random.key(5))
  m = np.asarray(b["loss_mask"]) > 0
  assert m.any() and np.asarray(b["tokens"])[m].max() < REAL
  assert "behaviour_logprobs" not in b  # exact KL: not needed


@pytest.mark.slow  # compiles a mixture rollout
def test_sampled_mixture_batch_carries_the_mixture_logprobs():
  lam = 0.3
  c, scfg, tcfg, sp, tp, mesh, host = _setup("sampled", "coin_mixture", lam)
  c.loss.estimator = "k3"  # on the rollout's own tokens, weighted by q / b
  maker = train_batches.SequenceMaker(c, scfg, tcfg, mesh, sharding.DEFAULT_RULES,
                                   vocab_size=REAL)
  b, _ = maker(host, sp, tp, jax.random.key(6))
  tokens, attn = b["tokens"], b["attention_mask"]
  m = np.asarray(b["loss_mask"])[:, 1:] > 0
  ts, tt = c.student.temperature, c.teacher.temperature  # 1.0 and 0.5
  assert ts != tt
  want = np.logaddexp(np.log(lam) + _logp(scfg, sp, tokens, attn, ts),
                      np.log1p(-lam) + _logp(tcfg, tp, tokens, attn, tt))
  got = np.asarray(b["behaviour_logprobs"])[:, 1:]
  np.testing.assert_allclose(got[m], want[m], atol=2e-4)
  np.testing.assert_array_equal(got[~m], 0.0)


def test_bucket_cuts_rollouts_after_the_longest_response():
  """data.bucket drops only columns where no row has a token: the batch is
  the unbucketed one cut at P + the longest response rounded up."""
  c, scfg, tcfg, sp, tp, mesh, host = _setup("forward", "student")
  # A third of the real tokens end a row, so rows end at different steps.
  c.rollout.update(max_new_tokens=16, eos_token_ids=tuple(range(0, REAL, 3)))
  rules = sharding.DEFAULT_RULES
  full, _ = train_batches.SequenceMaker(c, scfg, tcfg, mesh, rules,
                                     vocab_size=REAL)(host, sp, tp,
                                                      jax.random.key(5))
  c.data.bucket = 3
  cut, _ = train_batches.SequenceMaker(c, scfg, tcfg, mesh, rules,
                                    vocab_size=REAL)(host, sp, tp,
                                                     jax.random.key(5))
  p = host["prompt"].shape[1]
  resp = np.asarray(full["loss_mask"])[:, p:]
  longest = int(resp.sum(1).max())
  want = p + min(resp.shape[1], 3 * -(-longest // 3))
  assert want < full["tokens"].shape[1]  # the rows end early: a cut is made
  assert cut["tokens"].shape[1] == want
  for k in full:
    np.testing.assert_array_equal(np.asarray(cut[k]),
                                  np.asarray(full[k])[:, :want])
    assert not np.asarray(full[k])[:, want:].any() or k == "tokens"


def test_teacher_prompt_batch_is_the_teachers_own_sequence():
  """With teacher prompts in the host batch: the teacher samples from its
  own prompt (its log-probs, from a cache-free forward over [teacher prompt
  | response], are the behaviour log-probs), and the batch carries that
  sequence, its response columns the student's, also after a bucket cut."""
  c, scfg, tcfg, sp, tp, mesh, host = _setup("sampled", "teacher")
  c.loss.estimator = "k3"
  c.data.bucket = 3
  c.rollout.update(max_new_tokens=16, eos_token_ids=tuple(range(0, REAL, 3)))
  rs = np.random.default_rng(2)
  lens = rs.integers(1, 11, size=4)
  t_mask = (np.arange(10)[None] >= 10 - lens[:, None]).astype(np.int32)
  host = dict(host, teacher_prompt=(rs.integers(3, REAL, (4, 10))
                                    * t_mask).astype(np.int32),
              teacher_prompt_mask=t_mask)
  maker = train_batches.SequenceMaker(c, scfg, tcfg, mesh,
                                      sharding.DEFAULT_RULES, vocab_size=REAL)
  b, _ = maker(host, sp, tp, jax.random.key(6))
  p, pt = host["prompt"].shape[1], 10
  n = b["tokens"].shape[1] - p
  assert n < 16  # the bucket cut columns
  tt_, ta = np.asarray(b["teacher_tokens"]), np.asarray(b["teacher_attention_mask"])
  assert tt_.shape == ta.shape == (4, pt + n)
  np.testing.assert_array_equal(tt_[:, :pt], host["teacher_prompt"])
  np.testing.assert_array_equal(ta[:, :pt], t_mask)
  np.testing.assert_array_equal(tt_[:, pt:], np.asarray(b["tokens"])[:, p:])
  np.testing.assert_array_equal(ta[:, pt:], np.asarray(b["loss_mask"])[:, p:])
  m = np.asarray(b["loss_mask"])[:, p:] > 0
  tau = c.teacher.temperature
  want = _logp(tcfg, tp, tt_, ta, tau)[:, pt - 1:]
  got = np.asarray(b["behaviour_logprobs"])[:, p:]
  np.testing.assert_allclose(got[m], want[m], atol=2e-4)
  under_student = _logp(tcfg, tp, b["tokens"], b["attention_mask"],
                        tau)[:, p - 1:]
  assert np.abs(under_student[m] - want[m]).max() > 0.1


@pytest.mark.parametrize("lam,pure", [(-1.0, "teacher"), (1.0, "student")])
def test_the_spectrum_s_endpoints_decode_with_the_pure_policy_s_program(
    lam, pure, monkeypatch):
  """Its batch is the two-model spectrum rollout's, token for token and
  log-prob for log-prob (the sampled loss keeps them), from one model."""
  c, scfg, tcfg, sp, tp, mesh, host = _setup("sampled", "spectrum", lam)
  c.loss.estimator = "k1"  # keeps the behaviour log-probs
  c.rollout.top_k, c.rollout.top_p = 5, 0.5  # the spectrum draws without them
  rules = sharding.DEFAULT_RULES
  rng = jax.random.key(3)
  ts, tt = config_lib.rollout_temperatures(c)
  # The reference: the two-model program at the same lam, as before.
  ref = rollout_lib.generate(
      (scfg, sp), (tcfg, tp), host["prompt"], host["prompt_mask"], rng=rng,
      policy="spectrum", lam=lam, max_new_tokens=int(c.rollout.max_new_tokens),
      temperature=ts, teacher_temperature=tt, vocab_size=REAL, mesh=mesh,
      rules=rules, eos_token_ids=rollout_lib.eos_ids(scfg, tcfg))
  calls = []
  orig = rollout_lib.generate
  monkeypatch.setattr(rollout_lib, "generate", lambda *a, **k: (
      calls.append((k["policy"], k["lam"], k["top_k"], k["top_p"])),
      orig(*a, **k))[1])
  maker = train_batches.SequenceMaker(c, scfg, tcfg, mesh, rules,
                                      vocab_size=REAL)
  b, m = maker(host, sp, tp, rng)
  assert calls == [(pure, None, None, None)]
  np.testing.assert_array_equal(np.asarray(b["tokens"]), np.asarray(ref.tokens))
  p = host["prompt"].shape[1]
  np.testing.assert_array_equal(np.asarray(b["loss_mask"])[:, p:],
                                np.asarray(ref.response_mask))
  np.testing.assert_array_equal(np.asarray(b["behaviour_logprobs"])[:, p:],
                                np.asarray(ref.behaviour_logprobs))
  assert m["rollout/student_fraction"] == float(ref.student_fraction)
