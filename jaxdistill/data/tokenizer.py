"""Tokenizers: load a checkpoint's own, or train a tiny byte-level BPE for tests.

`load_tokenizer(path)` reads a local directory (local_files_only=True), or a
hub name's files in the Hugging Face cache (models.hub.resolve). `train_bpe_tokenizer` builds a small byte-level
BPE (any text round-trips, since every byte is in the base alphabet) with the
special tokens below and a chat template (for runlocal, the sweep's local
assets, the demo and tests; `countdown_texts` is their usual text), saved so that
`transformers.AutoTokenizer.from_pretrained(out_dir)` loads it and
`apply_chat_template` works exactly as for a real checkpoint.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
import json
import os
import shutil
import sys
import time

import jax
import numpy as np

from jaxdistill import storage
from jaxdistill import tasks
from jaxdistill.models import hub
from jaxdistill.tasks import countdown

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
SPECIAL_TOKENS = (PAD, BOS, EOS) + ROLE_TOKENS

# Each turn is <|role|>content<|end|>; the assistant turn ends with <|eos|>
# instead, so the generation stop token is the tokenizer's eos_token, as in
# Qwen2.5 (<|im_end|>) and Llama 3.1 Instruct (<|eot_id|>).
DEFAULT_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "<|{{ m['role'] }}|>{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% else %}<|end|>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def import_transformers():
  """transformers, imported without its "PyTorch was not found. Models won't
  be available" notice: jaxdistill uses its tokenizers and configs only. The
  import is heavy, so only callers that tokenize pay for it."""
  if "transformers" in sys.modules:
    return sys.modules["transformers"]
  key = "TRANSFORMERS_NO_ADVISORY_WARNINGS"
  old = os.environ.get(key)
  os.environ[key] = "1"
  try:
    import transformers  # pylint: disable=g-import-not-at-top
  finally:
    if old is None:
      del os.environ[key]
    else:
      os.environ[key] = old
  return transformers


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def has_tokenizer(path: str) -> bool:
  """Whether a local directory holds a tokenizer load_tokenizer can read."""
  return any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES)


def load_tokenizer(path: str, *, need_chat_template: bool = True):
  """A transformers tokenizer from a checkpoint directory or hub name
  (models.hub.resolve). `need_chat_template`: refuse one without a chat
  template (every prompt of training and evaluation is built with it);
  False for lm-eval, where the template is opt-in (a base model's)."""
  transformers = import_transformers()
  if hub.is_hub_id(path) and not os.path.isdir(path):
    path = hub.resolve(path, allow_patterns=hub.CONFIG_FILES)[0]  # no weights
  if not os.path.isdir(path):
    raise FileNotFoundError(f"tokenizer directory not found: {path}")
  if not has_tokenizer(path):
    raise ValueError(f"{path}: no tokenizer files (none of "
                     f"{', '.join(TOKENIZER_FILES)})")
  for name in ("tokenizer.json", "tokenizer_config.json"):
    f = os.path.join(path, name)
    if os.path.isfile(f):
      try:
        with open(f, encoding="utf-8") as fh:
          json.load(fh)
      except ValueError as e:
        raise ValueError(f"{f}: malformed JSON ({e})") from None
  try:
    tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
  except (OSError, ValueError, TypeError, KeyError) as e:
    first = (str(e).strip().splitlines() or [""])[0][:200]
    raise ValueError(f"{path}: cannot load the tokenizer "
                     f"({type(e).__name__}: {first})") from None
  if tok.pad_token_id is None:
    # Llama 3 ships without a pad token; padding is masked out anyway, so
    # reuse EOS rather than growing the vocabulary.
    tok.pad_token = tok.eos_token
  if need_chat_template and not getattr(tok, "chat_template", None):
    raise ValueError(f"{path}: tokenizer has no chat_template; prompts are built "
                     "with the model's own template")
  return tok


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str, *,
                        chat_template: str = DEFAULT_CHAT_TEMPLATE,
                        model_max_length: int = 4096,
                        split_words: bool = True,
                        max_token_length: int | None = None):
  """Trains a byte-level BPE on `texts`, saves it to `out_dir`, returns it loaded.

  The vocabulary holds the 256 byte symbols and SPECIAL_TOKENS, so
  `vocab_size` must exceed 256 + len(SPECIAL_TOKENS); the rest are merges.
  split_words: merges stay inside words (the byte-level regex splits at
  spaces first, as in real checkpoints). False lets merges span words while
  every digit stays its own token: a fixed instruction then costs a few
  tokens instead of dozens, and arithmetic stays learnable (the demo's).
  max_token_length: the longest merge, in characters (None: unbounded).
  """
  from tokenizers import decoders
  from tokenizers import models
  from tokenizers import pre_tokenizers
  from tokenizers import Tokenizer
  from tokenizers import trainers
  transformers = import_transformers()
  floor = 256 + len(SPECIAL_TOKENS)
  if vocab_size <= floor:
    raise ValueError(f"vocab_size must be > {floor} (bytes + special tokens), "
                     f"got {vocab_size}")
  tok = Tokenizer(models.BPE())
  if split_words:
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  else:
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
      max_token_length=max_token_length)
  tok.train_from_iterator(texts, trainer)
  fast = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
      additional_special_tokens=list(ROLE_TOKENS),
      model_max_length=model_max_length, padding_side="left")
  fast.chat_template = chat_template
  os.makedirs(out_dir, exist_ok=True)
  fast.save_pretrained(out_dir)
  return load_tokenizer(out_dir)


def countdown_texts(n_numbers: int | Sequence[int], count: int, *,
                    seed: int = 0, extra_records: Sequence[Mapping] = ()
                    ) -> list[str]:
  """A tiny tokenizer's training text: prompt + " " + reference response of
  `count` Countdown problems per number of inputs in `n_numbers`, then of
  `extra_records` (task records, e.g. multiple-choice questions)."""
  ns = (n_numbers,) if isinstance(n_numbers, int) else tuple(n_numbers)
  recs = [p.to_record() for n in ns
          for p in countdown.generate_problems(int(n), int(count), seed=seed)]
  return [tasks.prompt_text(r) + " " + tasks.reference_response(r)
          for r in recs + list(extra_records)]


def chat_prompt(tokenizer, user: str, system: str | None = None) -> str:
  """The prompt text for one user turn, ending where the assistant starts."""
  messages = ([{"role": "system", "content": system}] if system else []) + [
      {"role": "user", "content": user}]
  return tokenizer.apply_chat_template(
      messages, tokenize=False, add_generation_prompt=True)


def encode(tokenizer, texts: Sequence[str]) -> list[list[int]]:
  """Token ids without extra special tokens: chat templates already add BOS."""
  if not texts:
    return []
  return list(tokenizer(list(texts), add_special_tokens=False)["input_ids"])


def left_pad(seqs: Sequence[Sequence[int]], length: int, pad_id: int):
  """int32 tokens [N, length] right-aligned, and int32 mask [N, length]."""
  tokens = np.full((len(seqs), length), pad_id, np.int32)
  mask = np.zeros((len(seqs), length), np.int32)
  for i, s in enumerate(seqs):
    if len(s) > length:
      raise ValueError(f"sequence {i} has {len(s)} tokens > length {length}")
    if len(s):
      tokens[i, length - len(s):] = s
      mask[i, length - len(s):] = 1
  return tokens, mask


def special_ids(tokenizer) -> Mapping[str, int]:
  return {"pad": int(tokenizer.pad_token_id), "eos": int(tokenizer.eos_token_id)}


# -- the tokenizer of a run's config ----------------------------------------------

def run_tokenizer(config):
  """The run's tokenizer: config.tokenizer, else that of the checkpoint the
  student loads (a directory or hub name); for synthetic data, which needs
  none, the student checkpoint's if it has one (so that its export carries
  it), else None."""
  field = "config.tokenizer" if config.get("tokenizer") else "config.student.path"
  spec = config.get("tokenizer") or hub.weights_spec(config.student)
  if config.data.task == "synthetic" and not config.get("tokenizer"):
    if not spec:
      return None
    path = hub.checkpoint_dir(spec, field, need_config=False,
                              files=hub.CONFIG_FILES)
    return load_tokenizer(path) if has_tokenizer(path) else None
  if not spec:
    raise ValueError("config.tokenizer: a tokenizer directory or hub name is "
                     f"needed for data.task={config.data.task!r}")
  return load_tokenizer(hub.checkpoint_dir(spec, field, need_config=False,
                                           files=hub.CONFIG_FILES))


def runlocal_tokenizer(config, workdir):
  """runlocal (config.tokenizer_build set): a byte-level BPE trained on
  Countdown text into <workdir>/tokenizer, so that the tiny random models'
  exports carry a tokenizer and `python -m jaxdistill.evaluate` runs on them."""
  out = os.path.join(workdir, "tokenizer")
  done = os.path.join(out, "tokenizer.json")
  # On several hosts process 0 builds it (into a temporary directory renamed
  # into place, so that no host reads a half-written one; on gs://, with no
  # rename, uploaded with tokenizer.json last) and the others wait.
  if jax.process_index() == 0 and not storage.isfile(done):
    texts = countdown_texts(int(config.data.get("n_numbers") or 3), 64)
    remote = storage.is_gs(out)
    tmp = storage.local_staging() if remote else f"{out}.tmp-{os.getpid()}"
    train_bpe_tokenizer(texts, int(config.tokenizer_build.vocab_size), tmp)
    if remote:
      storage.upload_dir(tmp, out, last="tokenizer.json")
      return _load_staged(tmp)
    if os.path.isdir(out):  # a leftover of a killed build
      shutil.rmtree(out)
    os.replace(tmp, out)
  deadline = time.monotonic() + 600
  while not storage.isfile(done):
    if time.monotonic() > deadline:
      raise ValueError(f"{done}: process 0 did not write the runlocal "
                       "tokenizer within 600 s (is the workdir on a "
                       "filesystem every host sees?)")
    time.sleep(0.2)
  if storage.is_gs(out):
    local = storage.local_staging()
    storage.download_dir(out, local)
    return _load_staged(local)
  return load_tokenizer(out)


def _load_staged(local: str):
  """The tokenizer of a local copy, which is then removed."""
  try:
    return load_tokenizer(local)
  finally:
    shutil.rmtree(local, ignore_errors=True)


def save_tokenizer(tokenizer, out_dir):
  if tokenizer is not None:
    tokenizer.save_pretrained(out_dir)
