"""The tiny BPE tokenizer loads through transformers.AutoTokenizer."""
import numpy as np
import pytest
import transformers

from jaxdistill.data import tokenizer as tok_lib
from jaxdistill.tasks import countdown


def test_autotokenizer_loads_round_trips_and_templates(tiny_tokenizer):
  path = tiny_tokenizer.name_or_path
  tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
  assert len(tok) == 320
  for text in ["Using the numbers [3, 5, 7] <answer>3*5+7</answer>",
               "Unicode: héllo 世界 ٣ \t\n end", ""]:
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
  # Special tokens are single ids and are not split.
  for t in tok_lib.SPECIAL_TOKENS:
    assert len(tok.encode(t, add_special_tokens=False)) == 1
  assert tok.pad_token == "<|pad|>" and tok.eos_token == "<|eos|>"
  msgs = [{"role": "system", "content": "Be brief."},
          {"role": "user", "content": "2+2?"}]
  text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
  assert text == "<|bos|><|system|>Be brief.<|end|><|user|>2+2?<|end|><|assistant|>"
  msgs.append({"role": "assistant", "content": "4"})
  text = tok.apply_chat_template(msgs, tokenize=False)
  assert text.endswith("<|assistant|>4<|eos|>")
  assert tok_lib.chat_prompt(tok, "2+2?", "Be brief.") == (
      "<|bos|><|system|>Be brief.<|end|><|user|>2+2?<|end|><|assistant|>")


def test_left_pad():
  tokens, mask = tok_lib.left_pad([[5, 6], [7], []], 4, pad_id=0)
  np.testing.assert_array_equal(tokens, [[0, 0, 5, 6], [0, 0, 0, 7], [0, 0, 0, 0]])
  np.testing.assert_array_equal(mask, [[0, 0, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0]])
  assert tokens.dtype == np.int32 and mask.dtype == np.int32
  with pytest.raises(ValueError, match="length"):
    tok_lib.left_pad([[1, 2, 3]], 2, 0)


def test_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="tokenizer directory"):
    tok_lib.load_tokenizer(str(tmp_path / "missing"))
  with pytest.raises(ValueError, match="vocab_size"):
    tok_lib.train_bpe_tokenizer(["a"], 100, str(tmp_path / "t"))


def test_countdown_texts_cover_each_size_then_the_extra_records():
  mc = {"question": "Which organ pumps blood?", "options": ["Heart", "Lung"],
        "answer": "A"}
  texts = tok_lib.countdown_texts((3, 5), 4, extra_records=[mc])
  assert len(texts) == 2 * 4 + 1
  probs = [p for n in (3, 5) for p in countdown.generate_problems(n, 4, seed=0)]
  for text, p in zip(texts, probs):  # each names its numbers and its target
    assert all(str(x) in text for x in p.numbers) and str(p.target) in text
  assert "Which organ pumps blood?" in texts[-1] and "Heart" in texts[-1]
  assert tok_lib.countdown_texts(3, 4) == texts[:4]
