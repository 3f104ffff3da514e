"""A tiny byte-level BPE tokenizer shared by the data tests (trained once)."""
import pytest

MC = [{"question": "Which gas do plants absorb?", "options": ["Oxygen", "CO2"],
       "answer": "B"}]


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
  from jaxdistill.data import tokenizer
  out = tmp_path_factory.mktemp("tok")
  return tokenizer.train_bpe_tokenizer(
      tokenizer.countdown_texts(3, 40, extra_records=MC), 320, str(out))
