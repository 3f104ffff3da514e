"""Greedy rollouts equal transformers' greedy `generate`, token for token, and
stay identical when the batch and parameters are sharded over 8 devices.

Tiny random Llama 3 / Qwen2.5 checkpoints are written by transformers
(tests/tiny_hf.py) and read with models.load_pretrained, in float32.
"""
import jax
import numpy as np
import pytest
import torch
import transformers

from jaxdistill import models
from jaxdistill import rollout
from jaxdistill import sharding
from tests import tiny_hf

N_NEW = 16
PAD = 0
# A token each family's greedy continuations reach mid-way in some rows (not
# all), added to the config's EOS ids so early stops are compared too.
EXTRA_EOS = {"llama": 108, "qwen2": 185}


def _prompts(seed):
  rng = np.random.default_rng(seed)
  # Different lengths, so rows carry different amounts of left padding.
  return [rng.integers(3, 256, n).tolist() for n in (5, 11, 1, 8, 13, 3, 9, 6)]


def _hf_greedy(path, prompts, mask, eos):
  model = transformers.AutoModelForCausalLM.from_pretrained(
      path, dtype=torch.float32, attn_implementation="eager").eval()
  with torch.no_grad():
    out = model.generate(
        input_ids=torch.from_numpy(prompts).long(),
        attention_mask=torch.from_numpy(mask).long(),
        do_sample=False, num_beams=1, max_new_tokens=N_NEW, min_new_tokens=0,
        eos_token_id=list(eos), pad_token_id=PAD, top_k=None, top_p=None,
        temperature=None, repetition_penalty=None)
  return out[:, prompts.shape[1]:].numpy()


@pytest.fixture(scope="module")
def greedy_run(tmp_path_factory):
  """family -> (path, model, prompts, mask, rollout), built once per family."""
  runs = {}

  def get(family):
    if family not in runs:
      path = tiny_hf.make_tiny_checkpoint(
          family, tmp_path_factory.mktemp(family), seed=3)
      model = models.load_pretrained(path, dtype="float32")
      eos = tuple(model[0].eos_token_id) + (EXTRA_EOS[family],)
      prompts, mask = rollout.pad_prompts(_prompts(1), pad_token_id=PAD,
                                          bucket=16)
      r = rollout.generate(model, None, prompts, mask, rng=jax.random.key(0),
                           max_new_tokens=N_NEW, temperature=0.0,
                           pad_token_id=PAD, eos_token_ids=eos)
      runs[family] = (path, model, prompts, mask, eos, r)
    return runs[family]
  return get


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_greedy_matches_transformers(greedy_run, family):
  path, _, prompts, mask, eos, r = greedy_run(family)
  ref = _hf_greedy(path, prompts, mask, eos)
  ours = np.asarray(r.tokens)[:, prompts.shape[1]:]
  # transformers stops when every row has ended; later columns are padding.
  np.testing.assert_array_equal(ours[:, :ref.shape[1]], ref, err_msg=family)
  assert (ours[:, ref.shape[1]:] == PAD).all()
  # Rows are not all the same continuation, and some (not all) end early.
  assert len({tuple(row) for row in ref.tolist()}) > 4
  ended = np.asarray(r.ended)
  assert ended.any() and not ended.all()
  for row, length in zip(ours.tolist(), np.asarray(r.lengths)):
    stops = [i for i, x in enumerate(row) if x in eos]
    assert length == (stops[0] + 1 if stops else N_NEW)


def test_sharded_equals_unsharded(greedy_run):
  _, model, prompts, mask, eos, r = greedy_run("llama")
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  rs = rollout.generate(model, None, prompts, mask, rng=jax.random.key(0),
                        max_new_tokens=N_NEW, temperature=0.0,
                        pad_token_id=PAD, eos_token_ids=eos, mesh=mesh)
  # The batch really is split over the 4 data-parallel devices.
  assert rs.tokens.sharding.spec[0] == ("data", "fsdp")
  np.testing.assert_array_equal(rs.tokens, r.tokens)
  np.testing.assert_array_equal(rs.response_mask, r.response_mask)
  np.testing.assert_allclose(rs.logprobs, r.logprobs, atol=1e-5)


def test_teacher_prompt_rollouts_decode_each_model_from_its_own_prompt(
    greedy_run, tmp_path):
  """With teacher_prompts, the teacher's cache starts from its own prompt:
  policy 'teacher' is transformers' greedy decoding of the teacher from the
  teacher's prompts, and a coin mixture at lam = 1 / 0 (the same program)
  the student's from its prompts / the teacher's from its own."""
  s_path, student, prompts, mask, _, _ = greedy_run("llama")
  t_path = tiny_hf.make_tiny_checkpoint("llama", tmp_path / "t", seed=5,
                                        num_hidden_layers=3)
  teacher = models.load_pretrained(t_path, dtype="float32")
  rng = np.random.default_rng(4)
  t_prompts, t_mask = rollout.pad_prompts(
      [rng.integers(3, 256, n).tolist() for n in (14, 2, 20, 7, 9, 17, 4, 11)],
      pad_token_id=PAD, bucket=8)
  assert t_prompts.shape[1] != prompts.shape[1]
  eos = tuple(student[0].eos_token_id)
  kw = dict(rng=jax.random.key(0), max_new_tokens=N_NEW, temperature=0.0,
            pad_token_id=PAD, eos_token_ids=eos, teacher_prompts=t_prompts,
            teacher_prompt_mask=t_mask)
  runs = {"teacher": rollout.generate(None, teacher, prompts, mask,
                                      policy="teacher", **kw)}
  for lam in (1.0, 0.0):
    runs[lam] = rollout.generate(student, teacher, prompts, mask,
                                 policy="coin_mixture", lam=lam, **kw)
  want_t = _hf_greedy(t_path, t_prompts, t_mask, eos)
  want_s = _hf_greedy(s_path, prompts, mask, eos)
  for key, want in (("teacher", want_t), (0.0, want_t), (1.0, want_s)):
    r = runs[key]
    # The rollout keeps the student's prompt; the response is shared.
    np.testing.assert_array_equal(np.asarray(r.tokens)[:, :prompts.shape[1]],
                                  prompts)
    ours = np.asarray(r.tokens)[:, prompts.shape[1]:]
    np.testing.assert_array_equal(ours[:, :want.shape[1]], want,
                                  err_msg=str(key))
    assert (ours[:, want.shape[1]:] == PAD).all()
  assert (want_t[:, :4] != want_s[:, :4]).any()
  with pytest.raises(ValueError, match="teacher_prompts"):
    rollout.generate(student, teacher, prompts, mask, policy="student", **kw)
