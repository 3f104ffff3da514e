"""The style-transfer teacher's context end to end (App. D.7,
configs/grid_spanish.py): Science records with a worked trace -> prompt
batches with the teacher's own prompt -> rollouts (SequenceMaker) -> the
loss, against transformers run on prompts rendered here from the chat
template, one row at a time, KL in float64."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdistill import config_lib
from jaxdistill import losses
from jaxdistill import models
from jaxdistill import sharding
from jaxdistill.data import pipeline
from jaxdistill.data import tokenizer as tok_lib
from jaxdistill.train import batches as train_batches
from jaxdistill.train import step as step_lib
from tests import tiny_hf

# Table 1's Science system line (App. D.1), written here from the paper.
SYSTEM = "You are a careful solver of multiple-choice science questions."

RECORDS = [
    dict(question="Which gas do plants take in for photosynthesis?",
         options=["Oxygen", "Carbon dioxide", "Nitrogen", "Helium"],
         answer="B", prompt="science",
         response="<reasoning>Plants fix carbon from the air.</reasoning>"
                  "<answer>B</answer>"),
    dict(question="What is the pH of pure water at 25 C?",
         options=["7", "1", "14", "3"], answer="A", prompt="science",
         response="<reasoning>Neutral water has equal H+ and OH-, pH 7."
                  "</reasoning><answer>A</answer>"),
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  texts = tok_lib.countdown_texts(3, 20) + [
      r["question"] + " " + r["response"] for r in RECORDS]
  return tok_lib.train_bpe_tokenizer(texts, 300,
                                     str(tmp_path_factory.mktemp("tok")))


def _pair(family, tmp_path):
  out = []
  for name, seed, over in (
      ("student", 0, dict(hidden_size=32, intermediate_size=64,
                          num_attention_heads=2, num_key_value_heads=1)),
      ("teacher", 1, {})):
    over = dict(over, vocab_size=320, max_position_embeddings=4096)
    path = tiny_hf.make_tiny_checkpoint(family, tmp_path / name, seed=seed,
                                        **over)
    out.append((tiny_hf.make_tiny_model(family, seed=seed, **over),
                models.load_pretrained(path, dtype="float32")))
  return out


def _ids(tokenizer, system, user):
  text = tokenizer.apply_chat_template(
      [{"role": "system", "content": system}, {"role": "user", "content": user}],
      tokenize=False, add_generation_prompt=True)
  return tokenizer.encode(text, add_special_tokens=False)


def _student_user(r):
  # Table 1's Science user message, as tasks.mcq renders it for the record.
  from jaxdistill import tasks  # pylint: disable=g-import-not-at-top
  return tasks.prompt_messages(r)[1]


@pytest.mark.parametrize("family,policy,kind", [
    ("llama", "teacher", "forward"),   # OffPD: the teacher samples
    ("qwen2", "student", "reverse"),   # OnPD: the student samples
])
def test_teacher_scores_the_completion_under_its_own_prompt(
    tokenizer, tmp_path, family, policy, kind):
  import torch  # pylint: disable=g-import-not-at-top
  from configs import grid_spanish  # pylint: disable=g-import-not-at-top
  (s_hf, (scfg, sp)), (t_hf, (tcfg, tp)) = _pair(family, tmp_path)
  c = config_lib.load_config("configs/grid_spanish.py:runlocal").base
  c.rollout.update(policy=policy, max_new_tokens=6)
  c.loss.update(kind=kind, fused=False)
  vocab = len(tokenizer)
  p, pt = 512, 1024
  batches = pipeline.make_prompt_batches(
      RECORDS, tokenizer, batch_size=2, max_prompt_len=p, seed=0,
      shuffle=False, num_epochs=1,
      teacher_prompt=grid_spanish.TEACHER_PROMPT, max_teacher_prompt_len=pt)
  host = batches[0]
  mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1),
                            devices=jax.devices()[:1])
  maker = train_batches.SequenceMaker(c, scfg, tcfg, mesh,
                                      sharding.DEFAULT_RULES, tokenizer,
                                      vocab_size=vocab)
  batch, _ = maker(host, sp, tp, jax.random.key(3))
  batch["weights"] = losses.reduction_weights(batch["loss_mask"],
                                              "sequence_mean")
  loss_fn = step_lib.make_loss_fn(c, scfg, tcfg, vocab)
  loss, _ = jax.jit(loss_fn)(sp, tp, batch)

  tokens = np.asarray(batch["tokens"])
  rmask = np.asarray(batch["loss_mask"])[:, p:] > 0
  assert rmask.sum(1).min() >= 1

  def logp(model, prompt, r):
    with torch.no_grad():
      x = model(torch.tensor([prompt + r])).logits[0].double().numpy()
    x = x[len(prompt) - 1:len(prompt) - 1 + len(r), :vocab]  # T 1.0 (Table 5)
    return x - np.logaddexp.reduce(x, axis=-1, keepdims=True)

  def reference(teacher_sees_demo):
    rows = []
    for row, i in enumerate(np.asarray(host["index"])):
      r = RECORDS[i]
      resp = tokens[row, p:][rmask[row]].tolist()
      s_prompt = _ids(tokenizer, SYSTEM, _student_user(r))
      user = (
          f"{_student_user(r)}\n\n"
          "Here is a correct worked solution to this question:\n\n"
          f"{r['response']}\n\n"
          "Now answer with a response of your own, including the thinking "
          "process.\n\nOnly speak in Spanish. This does not apply to the "
          "special <think></think> and <answer></answer> tokens or your final "
          "answer, but any reasoning or thoughts you produce should be "
          "strictly written in Spanish.")
      t_prompt = _ids(tokenizer, SYSTEM, user) if teacher_sees_demo else s_prompt
      lq, lp = logp(s_hf, s_prompt, resp), logp(t_hf, t_prompt, resp)
      kl = ((np.exp(lp) * (lp - lq)).sum(-1) if kind == "forward"
            else (np.exp(lq) * (lq - lp)).sum(-1))
      rows.append(kl.mean())
    return np.mean(rows)

  want = reference(True)
  np.testing.assert_allclose(float(loss), want, rtol=2e-4)
  assert abs(reference(False) - want) > 1e-2 * want  # the context matters


def test_default_batches_carry_no_teacher_keys(tokenizer):
  """Without data.teacher_prompt the batches, and so the loss, are the
  study's usual ones: no teacher_* key anywhere."""
  b = pipeline.make_prompt_batches(RECORDS, tokenizer, batch_size=2,
                                   max_prompt_len=512, seed=0)[0]
  assert not any(k.startswith("teacher") for k in b)


def test_a_science_record_without_a_trace_is_refused(tokenizer):
  from configs import grid_spanish  # pylint: disable=g-import-not-at-top
  bare = [{k: v for k, v in r.items() if k != "response"} for r in RECORDS]
  with pytest.raises(ValueError, match=r"^data.teacher_prompt: \{demonstration"
                     r"\} needs each record's worked 'response'.*--split_dir"):
    pipeline.make_prompt_batches(
        bare, tokenizer, batch_size=2, max_prompt_len=512, seed=0,
        teacher_prompt=grid_spanish.TEACHER_PROMPT)
