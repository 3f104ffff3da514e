"""A tiny byte-level BPE tokenizer shared by the data tests (trained once)."""
import pytest

from jaxdistill import tasks
from jaxdistill.tasks import countdown


def corpus():
  probs = [p.to_record() for p in countdown.generate_problems(3, 40, seed=0)]
  mc = [{"question": "Which gas do plants absorb?", "options": ["Oxygen", "CO2"],
         "answer": "B"}]
  return [tasks.prompt_text(r) + " " + tasks.reference_response(r)
          for r in probs + mc]


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
  from jaxdistill.data import tokenizer
  out = tmp_path_factory.mktemp("tok")
  return tokenizer.train_bpe_tokenizer(corpus(), 320, str(out))
