"""Random-access batch pipelines: the iterator position is just the step.

Both pipelines are grain `MapDataset`s: record ids are shuffled with a
per-epoch seed (`shuffle` then `repeat`: epoch e uses hash(seed) + e),
concatenated across epochs and cut into batches. `batches[step]` is a pure
function of (records, tokenizer, settings, seed, step): resuming after a
restart needs only the step, and two pipelines built alike agree batch for
batch. Tokenization happens once, at construction, so that over-long
examples can be filtered out up front (counted in `num_dropped`) and every
batch is full.

Prompt batch (`make_prompt_batches`), for rollouts::

  prompt       int32 [B, P]  chat-templated prompt, LEFT-padded: ends at P-1
  prompt_mask  int32 [B, P]  1 on prompt tokens
  task         int32 [B]     jaxdistill.tasks.COUNTDOWN / MCQ / ARITH /
                             COUNTDOWN_STEPS / MATH
  numbers      int32 [B, 6]  Countdown numbers, padded with -1 (else -1)
  target       int32 [B]     Countdown target, arithmetic value (-1 for MCQ)
  gold         int32 [B]     gold option index, A = 0 (-1 for the others)
  num_options  int32 [B]     number of options offered (-1 for the others)
  reference    object [B]    math answer text ('' for the others; host only)
  index        int32 [B]     position of the record in `records`
  valid        int32 [B]     0 on rows that pad a finite pass's last batch

With a teacher prompt (`teacher_prompt`, see `teacher_prompt_text`) two more
keys, the teacher's own conditioning (App. D.7), left-padded like `prompt`:

  teacher_prompt       int32 [B, Pt]  the teacher's chat-templated prompt
  teacher_prompt_mask  int32 [B, Pt]  1 on its tokens

Pt is max_teacher_prompt_len (default max_prompt_len), or with `bucket` the
batch's longest teacher prompt rounded up; an example is kept only when
both of its prompts fit.

Sequence batch (`make_sequence_batches`), fixed (off-policy) responses::

  tokens          int32 [B, P + R]  [left-padded prompt | response, EOS, pad]
  attention_mask  int32 [B, P + R]  1 on prompt and response tokens
  response_mask   int32 [B, P + R]  1 on response tokens (incl. EOS)
  ... plus task, numbers, target, gold, index, valid as above

P is max_prompt_len and R max_response_len, or with `bucket` the batch's
longest prompt and response, each rounded up to a multiple of `bucket`
(less padding, one compilation per distinct width).

The response always starts at column P, the same place a rollout's first
sampled token goes, so on- and off-policy batches share one layout; models
must take positions from the mask (cumsum - 1), not from the column.

`batches.score(texts, batch)` maps completions back to their verifiers.
`batches_from_config(config, tokenizer)` builds either kind from a run
config's `data` / `rollout` blocks (see `records_from_config`).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
import hashlib
import json
import logging
import os
import string

import grain
import numpy as np

from jaxdistill import config_lib
from jaxdistill import tasks
from jaxdistill.data import builders
from jaxdistill.data import numina_math
from jaxdistill.data import sources
from jaxdistill.data import tokenizer as tok_lib
from jaxdistill.tasks import countdown as countdown_lib
from jaxdistill.tasks import expr as expr_lib
from jaxdistill.tasks import mcq

MAX_NUMBERS = 6


class TooLong(ValueError):
  """No record fits a length limit; `arg` names the limit's argument."""

  def __init__(self, arg: str, limit: int, what: str, lengths: Sequence[int]):
    super().__init__(f"{arg}={limit}: all {len(lengths)} {what} are longer "
                     f"(the shortest has {min(lengths)} tokens)")
    self.arg = arg


class _Batches:
  """Shared machinery: record metadata, id shuffling, fixed-size batches."""

  def __init__(self, records, keep, *, batch_size, seed, shuffle, num_epochs,
               process_index, process_count):
    if batch_size <= 0:
      raise ValueError(f"batch_size must be positive, got {batch_size}")
    if not 0 <= seed < 2**32:
      raise ValueError(f"seed must be in [0, 2**32), got {seed}")
    if num_epochs is not None and num_epochs <= 0:
      raise ValueError(f"num_epochs must be positive or None, got {num_epochs}")
    if process_count <= 0 or not 0 <= process_index < process_count:
      raise ValueError(f"process_index {process_index} / process_count "
                       f"{process_count} invalid")
    if batch_size % process_count:
      raise ValueError(f"batch_size {batch_size} not divisible by process_count "
                       f"{process_count}")
    if not keep:
      raise ValueError("records: no example left after length filtering "
                       f"({len(records)} given)")
    self.records = records
    self.keep = np.asarray(keep, np.int64)  # Kept position -> record index.
    self.num_dropped = len(records) - len(keep)
    self.global_batch_size = batch_size
    self.batch_size = batch_size // process_count  # Rows this process gets.
    self._rows = slice(process_index * batch_size // process_count,
                       (process_index + 1) * batch_size // process_count)
    self._meta = _metadata([records[i] for i in keep])
    n = len(keep)
    self.steps_per_epoch = -(-n // batch_size)
    ids = grain.MapDataset.range(n)
    if shuffle:
      # grain seeds epoch e with seed + e, so runs with seeds s and s + 1 would
      # share all but one epoch order; hashing the seed first decorrelates them.
      digest = hashlib.sha256(f"jaxdistill-batches/{seed}".encode()).digest()
      ids = ids.shuffle(seed=int.from_bytes(digest[:4], "big") >> 1)
    ids = ids.repeat(num_epochs).map(lambda i: (i, 1))
    if num_epochs is not None and len(ids) % batch_size:
      # Pad the last batch with copies of the first example, marked invalid,
      # so that shapes never change.
      pad = grain.MapDataset.range(batch_size - len(ids) % batch_size)
      ids = grain.MapDataset.concatenate([ids, pad.map(lambda _: (0, 0))])
    self.dataset = ids.batch(batch_size, drop_remainder=True,
                             batch_fn=self._collate)
    if self.num_dropped:
      logging.info("dropped %d of %d examples that exceed the length limits",
                   self.num_dropped, len(records))

  def __len__(self) -> int:
    return len(self.dataset)

  def __getitem__(self, step: int) -> dict:
    if not 0 <= step < len(self.dataset):
      raise IndexError(f"step {step} out of range [0, {len(self.dataset)})")
    return self.dataset[step]

  def _collate(self, pairs) -> dict:
    pairs = pairs[self._rows]
    pos = np.asarray([p for p, _ in pairs], np.int64)
    out = self._features(pos)
    out.update({k: v[pos] for k, v in self._meta.items()})
    out["index"] = self.keep[pos].astype(np.int32)
    out["valid"] = np.asarray([v for _, v in pairs], np.int32)
    return out

  def _features(self, pos) -> dict:
    raise NotImplementedError

  def score(self, texts: Sequence[str], batch: Mapping) -> dict:
    """Rewards of completions (prompt-major, G per row); see tasks.score_batch."""
    return tasks.score_batch(texts, batch)


def _metadata(records) -> dict[str, np.ndarray]:
  n = len(records)
  meta = {"task": np.zeros(n, np.int32),
          "numbers": np.full((n, MAX_NUMBERS), -1, np.int32),
          "target": np.full(n, -1, np.int32),
          "gold": np.full(n, -1, np.int32),
          "num_options": np.full(n, -1, np.int32),
          "reference": np.full(n, "", object)}
  for i, r in enumerate(records):
    t = tasks.task_of(r)
    meta["task"][i] = t
    if t in (tasks.COUNTDOWN, tasks.COUNTDOWN_STEPS):
      nums = list(r["numbers"])
      if len(nums) > MAX_NUMBERS:
        raise ValueError(f"record {i}: {len(nums)} numbers > {MAX_NUMBERS}")
      meta["numbers"][i, :len(nums)] = nums
      meta["target"][i] = int(r["target"])
    elif t == tasks.ARITH:
      meta["target"][i] = int(r["value"])  # the gold value
    elif t == tasks.MATH:
      meta["reference"][i] = str(r["answer"])
    else:
      meta["gold"][i] = mcq.letter_index(r["answer"])
      meta["num_options"][i] = len(r["options"])
  return meta


def _prompt_ids(records, tokenizer, system):
  """Chat-templated prompts; `system` (a config's) replaces the task's own
  system line (tasks.prompt_messages: Table 1's for the paper's Countdown)."""
  texts = []
  for r in records:
    own, user = tasks.prompt_messages(r)
    texts.append(tok_lib.chat_prompt(tokenizer, user,
                                     own if system is None else system))
  return tok_lib.encode(tokenizer, texts)


# The template field of a record's worked solution (teacher_prompt_text).
DEMONSTRATION = "demonstration"


def teacher_prompt_text(template: str, record: Mapping) -> str:
  """The teacher's user message for a record: `template.format(prompt=...,
  demonstration=..., **record)`.

  {prompt} is tasks.prompt_text(record), the student's user message; {field}
  reads record[field]; {demonstration} is the record's worked solution
  (`demonstration`): the paper's style-transfer teacher (App. D.7) sees each
  training example's own correct demonstration after the task.
  """
  names = {f for _, f, _, _ in string.Formatter().parse(template) if f}
  missing = sorted(names - {"prompt", DEMONSTRATION} - set(record))
  if missing:
    raise ValueError(f"data.teacher_prompt: the record has no field "
                     f"{missing[0]!r} (named in the template)")
  derived = {"prompt": tasks.prompt_text(record)}
  if DEMONSTRATION in names and DEMONSTRATION not in record:
    derived[DEMONSTRATION] = demonstration(record)
  return template.format(**{**record, **derived})


def demonstration(record: Mapping) -> str:
  """A record's worked solution: its `response` (SciKnowEval's train traces,
  a records file's), else a Countdown record's solver steps
  (tasks.reference_response); a multiple-choice record without one is
  refused, as its answer letter alone demonstrates no reasoning."""
  if record.get("response") is None and tasks.task_of(record) == tasks.MCQ:
    raise ValueError(
        "data.teacher_prompt: {demonstration} needs each record's worked "
        "'response' (SciKnowEval's train split carries them when prepared "
        "with `python -m jaxdistill.data.prepare sciknoweval --split_dir "
        "DIR`); this record has none")
  return tasks.reference_response(record)


def _teacher_prompt_ids(records, tokenizer, template, system):
  # As for the student: None leaves the task's own system line.
  texts = [tok_lib.chat_prompt(
      tokenizer, teacher_prompt_text(template, r),
      tasks.prompt_messages(r)[0] if system is None else system)
           for r in records]
  return tok_lib.encode(tokenizer, texts)


def bucketed(longest: int, bucket: int | None, cap: int) -> int:
  """A batch's padded width: `cap` without a bucket, else its longest row
  rounded up to a multiple of `bucket` (at most `cap`)."""
  if not bucket:
    return cap
  return min(cap, -(-longest // bucket) * bucket)


def _check_bucket(bucket):
  if bucket is not None and (isinstance(bucket, bool)
                             or not isinstance(bucket, (int, np.integer))
                             or bucket <= 0):
    raise ValueError(f"bucket must be a positive int or None, got {bucket!r}")


class PromptBatches(_Batches):
  """Left-padded prompt batches with verifier metadata; see module docstring."""

  def __init__(self, records, tokenizer, *, max_prompt_len, bucket=None,
               system=None, teacher_prompt=None, teacher_system=None,
               max_teacher_prompt_len=None, **kw):
    if max_prompt_len <= 0:
      raise ValueError(f"max_prompt_len must be positive, got {max_prompt_len}")
    _check_bucket(bucket)
    ids = _prompt_ids(records, tokenizer, system)
    fits = [len(s) <= max_prompt_len for s in ids]
    self._teacher_ids = None
    if teacher_prompt is not None:
      config_lib.check_teacher_prompt(teacher_prompt)
      t_max = max_teacher_prompt_len or max_prompt_len
      if t_max <= 0:
        raise ValueError(f"max_teacher_prompt_len must be positive, got {t_max}")
      t_ids = _teacher_prompt_ids(
          records, tokenizer, teacher_prompt,
          system if teacher_system is None else teacher_system)
      fits = [f and len(t) <= t_max for f, t in zip(fits, t_ids)]
    keep = [i for i, f in enumerate(fits) if f]
    if ids and not keep:
      if teacher_prompt is not None and any(
          len(s) <= max_prompt_len for s in ids):  # the teacher's are long
        raise TooLong("max_teacher_prompt_len", t_max, "teacher prompts",
                      list(map(len, t_ids)))
      raise TooLong("max_prompt_len", max_prompt_len, "prompts", list(map(len, ids)))
    # Records dropped by each limit (a record may exceed both).
    self.dropped_by = {"max_prompt_len": sum(
        len(s) > max_prompt_len for s in ids)}
    if teacher_prompt is not None:
      self.dropped_by["max_teacher_prompt_len"] = sum(
          len(t) > t_max for t in t_ids)
    self._ids = [ids[i] for i in keep]
    if teacher_prompt is not None:
      self._teacher_ids = [t_ids[i] for i in keep]
      self.max_teacher_prompt_len = t_max
    self.max_prompt_len, self._bucket = max_prompt_len, bucket
    self.pad_id = int(tokenizer.pad_token_id)
    super().__init__(records, keep, **kw)

  def _features(self, pos):
    seqs = [self._ids[p] for p in pos]
    # Shorter batches at the cost of one compilation per bucket.
    width = bucketed(max(len(s) for s in seqs), self._bucket,
                     self.max_prompt_len)
    prompt, mask = tok_lib.left_pad(seqs, width, self.pad_id)
    out = {"prompt": prompt, "prompt_mask": mask}
    if self._teacher_ids is not None:
      seqs = [self._teacher_ids[p] for p in pos]
      width = bucketed(max(len(s) for s in seqs), self._bucket,
                       self.max_teacher_prompt_len)
      out["teacher_prompt"], out["teacher_prompt_mask"] = tok_lib.left_pad(
          seqs, width, self.pad_id)
    return out


class SequenceBatches(_Batches):
  """Prompt + fixed response batches for off-policy training; see module docstring."""

  def __init__(self, records, tokenizer, *, max_prompt_len, max_response_len,
               response_fn: Callable[[Mapping], str] | None = None, system=None,
               bucket=None, **kw):
    if max_prompt_len <= 0 or max_response_len <= 0:
      raise ValueError("max_prompt_len and max_response_len must be positive, got "
                       f"{max_prompt_len}, {max_response_len}")
    _check_bucket(bucket)
    response_fn = response_fn or tasks.reference_response
    prompts = _prompt_ids(records, tokenizer, system)
    eos = int(tokenizer.eos_token_id)
    responses = [s + [eos] for s in
                 tok_lib.encode(tokenizer, [response_fn(r) for r in records])]
    keep = [i for i in range(len(records))
            if len(prompts[i]) <= max_prompt_len
            and len(responses[i]) <= max_response_len]
    if records and not keep:
      fit = [i for i in range(len(records)) if len(prompts[i]) <= max_prompt_len]
      if not fit:
        raise TooLong("max_prompt_len", max_prompt_len, "prompts",
                      list(map(len, prompts)))
      raise TooLong("max_response_len", max_response_len,
                    "responses of the prompts that fit",
                    [len(responses[i]) for i in fit])
    self._prompts = [prompts[i] for i in keep]
    self._responses = [responses[i] for i in keep]
    self.max_prompt_len, self.max_response_len = max_prompt_len, max_response_len
    self._bucket = bucket
    self.pad_id = int(tokenizer.pad_token_id)
    super().__init__(records, keep, **kw)

  def _features(self, pos):
    # Prompt and response widths: the maxima, or (bucket) the batch's
    # longest rounded up, at one compilation per distinct width.
    p = bucketed(max(len(self._prompts[i]) for i in pos), self._bucket,
                 self.max_prompt_len)
    r = bucketed(max(len(self._responses[i]) for i in pos), self._bucket,
                 self.max_response_len)
    prompt, prompt_mask = tok_lib.left_pad([self._prompts[i] for i in pos], p,
                                           self.pad_id)
    resp = np.full((len(pos), r), self.pad_id, np.int32)
    resp_mask = np.zeros((len(pos), r), np.int32)
    for row, i in enumerate(pos):
      s = self._responses[i]
      resp[row, :len(s)] = s
      resp_mask[row, :len(s)] = 1
    zeros = np.zeros_like(prompt_mask)
    return {"tokens": np.concatenate([prompt, resp], 1),
            "attention_mask": np.concatenate([prompt_mask, resp_mask], 1),
            "response_mask": np.concatenate([zeros, resp_mask], 1)}


def make_prompt_batches(records: Sequence[Mapping], tokenizer, *, batch_size: int,
                        max_prompt_len: int, seed: int, shuffle: bool = True,
                        num_epochs: int | None = None, bucket: int | None = None,
                        system: str | None = None,
                        teacher_prompt: str | None = None,
                        teacher_system: str | None = None,
                        max_teacher_prompt_len: int | None = None,
                        process_index: int = 0,
                        process_count: int = 1) -> PromptBatches:
  """Prompt batches; `num_epochs=None` repeats forever (training), `shuffle=False,
  num_epochs=1` is one ordered pass (evaluation). With process_count > 1, each
  process gets its rows of the same global batch (batch_size is global).
  `teacher_prompt` (a template, `teacher_prompt_text`) adds the teacher's own
  prompt, under system message `teacher_system` (None: `system`; '' none),
  at most `max_teacher_prompt_len` tokens (None: max_prompt_len)."""
  return PromptBatches(
      records, tokenizer, max_prompt_len=max_prompt_len, bucket=bucket,
      system=system, teacher_prompt=teacher_prompt,
      teacher_system=teacher_system,
      max_teacher_prompt_len=max_teacher_prompt_len,
      batch_size=batch_size, seed=seed, shuffle=shuffle,
      num_epochs=num_epochs, process_index=process_index,
      process_count=process_count)


def make_sequence_batches(records: Sequence[Mapping], tokenizer, *,
                          batch_size: int, max_prompt_len: int,
                          max_response_len: int, seed: int,
                          response_fn: Callable[[Mapping], str] | None = None,
                          shuffle: bool = True, num_epochs: int | None = None,
                          bucket: int | None = None,
                          system: str | None = None, process_index: int = 0,
                          process_count: int = 1) -> SequenceBatches:
  """Prompt + response batches. Responses come from `response_fn(record)`,
  by default `tasks.reference_response` (record['response'], else the
  Countdown solver solution's worked steps). `bucket`: pad prompts and
  responses to the batch's longest rounded up to a multiple of it, instead
  of to the maxima."""
  return SequenceBatches(
      records, tokenizer, max_prompt_len=max_prompt_len,
      max_response_len=max_response_len, response_fn=response_fn, system=system,
      bucket=bucket,
      batch_size=batch_size, seed=seed, shuffle=shuffle, num_epochs=num_epochs,
      process_index=process_index, process_count=process_count)


def records_from_config(data, *, responses: bool = False) -> list[dict]:
  """The records named by a run config's `data` block (`responses`: they
  are trained on as text, rollout.policy='dataset'; see read_records).

  data.task 'countdown' with `source` countdown3 | countdown4e | countdown4:
    the paper's Countdown set of that name (tasks.countdown.PRESETS: its
    counts, seeds and target range; Table 1's prompt and the step verifier),
    split `split` (countdown3: train, test; countdown4e: test; countdown4:
    train); read from DIR/paper_countdown with `data_dir` (prepared there
    first if missing), else generated in memory, the same problems either
    way. n_numbers, num_problems and data_seed are not read.
  data.task 'countdown' without `source`: the project's own generator (not
    the paper's), Countdown-`n_numbers` problems of `split` (default
    'train'). With `data_dir`, they are prepared as (and read from) the TFDS
    builder `countdown_tasks`; without it they are generated in memory, the
    same problems either way. Optional: num_problems (train split size,
    default 50,000; the test split gets a tenth), data_seed (default 0).
  data.task 'mcq': the `mcq_files` builder with config `source` (default
    'generic') over the user's files in `manual_dir`, prepared under the
    required `data_dir`; without manual_dir, the data set `source`
    (sciknoweval, medreason: the paper's; sciq, medmcqa, gpqa: not) that
    `python -m jaxdistill.data.prepare` wrote there.
    `prompt` None asks with the project's prompt; 'science' or 'medreason'
    with that Table 1 prompt (mcq.PROMPTS; the answer letter in <answer>).
  data.task 'math': split `split` of `source` (numina_math: train;
    math500: test) as `python -m jaxdistill.data.prepare SOURCE --data_dir
    DIR` wrote it under the required `data_dir` (App. A.3; Qwen2.5-Math's
    prompt, math-verify's equivalence, tasks.MATH).
  data.task 'records': records already in jaxdistill's form, read from
    `records_file` (.jsonl, one object per line, or .json, an array): each
    one Countdown (numbers, target, and solution or response) or multiple
    choice (question, options, answer, optional response); both kinds may be
    mixed. `split` is not used: name the file of the split you want.
  """
  task, split = data.get("task"), data.get("split") or "train"
  if task == "countdown" and data.get("source") is not None:
    return paper_countdown_records(data.source, split, data.get("data_dir"),
                                   "data")
  if task == "countdown":
    n = int(data.get("n_numbers") or 3)
    size = data.get("num_problems")
    seed = int(data.get("data_seed") or 0)
    if size is None:
      size = builders.CountdownConfig.train_size
    sizes = {"train": int(size), "test": max(1, int(size) // 10)}
    if split not in sizes:
      raise ValueError(f"data.split: Countdown has 'train' and 'test', got {split!r}")
    if not data.get("data_dir"):
      problems = countdown_lib.generate_problems(n, sizes[split], seed, split=split)
      return [p.to_record() for p in problems]
    builder = builders.prepare(
        builders.CountdownTasks, data_dir=builders.local_data_dir(
            data.data_dir, "countdown", "data.data_dir"),
        config=builders.countdown_config(n, sizes["train"], seed))
    return builders.load_records(builder, split)
  if task == "mcq":
    mcq.check_prompt(data.get("prompt"), "data.prompt")
    records = builders.load_records(builders.mcq_builder(data, "data"), split)
    if data.get("prompt") is not None:
      records = [dict(r, prompt=data.prompt) for r in records]
    return records
  if task == "math":
    return math_records(data.get("source"), split, data.get("data_dir"), "data")
  if task == "records":
    path = data.get("records_file")
    if not path:
      raise ValueError("data.records_file is required for task 'records'")
    return read_records(path, responses=responses)
  raise ValueError(f"data.task: expected 'countdown', 'mcq', 'math' or "
                   f"'records', got {task!r}")


MATH_SETS = {"numina_math": "train", "math500": "test"}


def math_records(name, split: str, data_dir, field: str) -> list[dict]:
  """Records of the prepared math set `name` (data.numina_math), split
  `split`, from DIR/math_files; `field` names the config block in errors."""
  if name not in MATH_SETS:
    raise ValueError(f"{field}.source: for math, one of {sorted(MATH_SETS)}, "
                     f"got {name!r}")
  if split != MATH_SETS[name]:
    raise ValueError(f"{field}.split: {name} has only {MATH_SETS[name]!r}, "
                     f"got {split!r}")
  if not data_dir:
    raise ValueError(f"{field}.data_dir: required (where `python -m "
                     f"jaxdistill.data.prepare {name}` wrote it)")
  local = builders.local_data_dir(data_dir, name, f"{field}.data_dir")
  path = os.path.join(numina_math.files_dir(local, name), f"{split}.jsonl")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{field}.data_dir: {path} is missing; run "
                            f"`python -m jaxdistill.data.prepare {name} "
                            f"--data_dir {data_dir}` first")
  return numina_math.read_jsonl(path)


def paper_countdown_records(name: str, split: str, data_dir: str | None,
                            field: str, unseen: bool = False) -> list[dict]:
  """Records of the paper's Countdown set `name` (a tasks.countdown.PRESETS
  key), split `split`: from the paper_countdown builder under `data_dir`
  (built there if missing), or generated in memory without one. `field`
  names the config block in errors ('data', 'config.suites.NAME').
  `unseen` drops the test problems that also occur in the set's train split
  (277 of Countdown-3's 500; the paper keeps them)."""
  if name not in countdown_lib.PRESETS:
    raise ValueError(f"{field}.source: for Countdown, one of the paper's sets "
                     f"{sorted(countdown_lib.PRESETS)} (or None: the project's "
                     f"own generator), got {name!r}")
  splits = countdown_lib.PRESETS[name].splits
  if split not in splits:
    raise ValueError(f"{field}.split: {name} has {sorted(splits)}, got {split!r}")
  if unseen:
    if split != "test" or "train" not in splits:
      raise ValueError(f"{field}.unseen: only for the test split of a set "
                       "with a train split (countdown3)")
    key = lambda r: (tuple(sorted(r["numbers"])), int(r["target"]))
    seen = {key(r) for r in paper_countdown_records(name, "train", data_dir,
                                                    field)}
    return [r for r in paper_countdown_records(name, split, data_dir, field)
            if key(r) not in seen]
  if not data_dir:
    return [dict(p.to_record(), variant=name)
            for p in countdown_lib.paper_problems(name, split)]
  builder = builders.prepare(
      builders.PaperCountdown, config=name, data_dir=builders.local_data_dir(
          data_dir, name, f"{field}.data_dir"))
  return builders.load_records(builder, split)


# The fields that make a record of each kind (tasks.task_of).
_FIELDS = {tasks.COUNTDOWN: ("numbers", "target"),
           tasks.MCQ: ("question", "options", "answer"),
           tasks.ARITH: ("expression", "value")}
_KIND = {tasks.COUNTDOWN: "Countdown", tasks.MCQ: "multiple-choice",
         tasks.ARITH: "arithmetic"}


def _is_int(x) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)  # JSON true is not 1


def _record_kind(row) -> int:
  """The one kind whose fields `row` has; ValueError naming the missing field
  of the kind it comes closest to, or the kinds it mixes."""
  whole = [k for k, f in _FIELDS.items() if all(x in row for x in f)]
  if len(whole) > 1:
    raise ValueError(
        "record has the fields of " + " and ".join(
            f"a {_KIND[k]} record ({', '.join(_FIELDS[k])})" for k in whole)
        + "; each record must be one kind")
  if whole:
    return whole[0]
  near = max(_FIELDS, key=lambda k: sum(x in row for x in _FIELDS[k]))
  if any(x in row for x in _FIELDS[near]):
    missing = [x for x in _FIELDS[near] if x not in row]
    raise ValueError(f"{_KIND[near]} record has no field {missing[0]!r} (it "
                     f"needs {', '.join(_FIELDS[near])})")
  return tasks.task_of(row)  # Raises, naming the fields each kind needs.


def _check_record(row, responses: bool) -> None:
  """ValueError naming the field of `row` that is missing or wrong."""
  kind = _record_kind(row)
  if "response" in row and not isinstance(row["response"], str):
    raise ValueError("field 'response' must be text")
  if kind == tasks.COUNTDOWN:
    nums, target = row["numbers"], row["target"]
    if (not isinstance(nums, list) or not 1 <= len(nums) <= MAX_NUMBERS
        or not all(_is_int(x) for x in nums)):
      raise ValueError(f"field 'numbers' must be a list of 1-{MAX_NUMBERS} "
                       f"integers, got {nums!r}")
    if not _is_int(target):
      raise ValueError(f"field 'target' must be an integer, got {target!r}")
    if row.get("solution") is not None:
      if not isinstance(row["solution"], str):
        raise ValueError("field 'solution' must be text")
      try:
        # A paper variant's solution is in step form (field 'variant').
        (countdown_lib.paper_reference_completion
         if tasks.task_of(row) == tasks.COUNTDOWN_STEPS
         else countdown_lib.reference_completion)(nums, target, row["solution"])
      except (ValueError, RecursionError) as e:
        raise ValueError(f"field 'solution': {e}") from None
    elif responses and row.get("response") is None:
      raise ValueError("Countdown record has no field 'solution' or 'response' "
                       "(rollout.policy='dataset' trains on one)")
  elif kind == tasks.ARITH:
    if not _is_int(row["value"]) or row["value"] < 0:
      raise ValueError("field 'value' must be a non-negative integer, got "
                       f"{row['value']!r}")
    if not isinstance(row["expression"], str):
      raise ValueError("field 'expression' must be text")
    if expr_lib.evaluate(expr_lib.parse(row["expression"])) != row["value"]:
      raise ValueError(f"arithmetic record: {row['expression']} is not "
                       f"{row['value']}")
  else:
    if not isinstance(row["question"], str) or not row["question"].strip():
      raise ValueError("field 'question' must be non-empty text")
    rec = sources.validate_record(row["question"], row["options"], row["answer"])
    seen = {}
    for letter, option in zip(mcq.LETTERS, rec["options"]):
      key = " ".join(option.split())
      if key in seen:
        raise ValueError(f"field 'options': {seen[key]} and {letter} are the "
                         f"same option {option!r}")
      seen[key] = letter


def read_records(path: str, *, responses: bool = False) -> list[dict]:
  """Task records from a .jsonl/.json file, each checked to be exactly one
  kind: Countdown (integer numbers and target, not booleans; a `solution`
  that solves it), multiple choice (distinct options) or arithmetic. With
  `responses` (rollout.policy='dataset') each must also give the text to
  train on. Errors are one line naming the file, line and field."""
  out = []
  for where, row in sources.read_rows(path):
    try:
      _check_record(row, responses)
    except (ValueError, TypeError, KeyError) as e:
      raise ValueError(f"{where}: {e}") from None
    out.append(row)
  if not out:
    raise ValueError(f"{path}: no records")
  return out


def write_records(records: Sequence[Mapping], path: str) -> None:
  """Writes records as JSON lines, readable by `read_records` (atomically)."""
  tmp = f"{path}.tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps(dict(r), ensure_ascii=False, sort_keys=True) + "\n")
  os.replace(tmp, path)


def batches_from_config(config, tokenizer) -> PromptBatches | SequenceBatches:
  """The training loop's batches: prompt batches for rollouts, or, with
  rollout.policy == 'dataset', sequence batches of reference responses no
  longer than rollout.max_new_tokens. Every host builds the full global batch
  (the loop keeps its own rows)."""
  data = config.data
  recs = records_from_config(data,
                             responses=config.rollout.policy == "dataset")
  common = dict(batch_size=int(data.batch_size),
                max_prompt_len=int(data.max_prompt_len), seed=int(config.seed),
                system=data.get("system"), bucket=data.get("bucket"))
  try:
    if config.rollout.policy == "dataset":
      if data.get("teacher_prompt") is not None:
        raise ValueError("config.data.teacher_prompt: not supported with "
                         "rollout.policy='dataset' (set it to None)")
      batches = make_sequence_batches(
          recs, tokenizer, max_response_len=int(config.rollout.max_new_tokens),
          **common)
    else:
      batches = make_prompt_batches(
          recs, tokenizer, teacher_prompt=data.get("teacher_prompt"),
          teacher_system=data.get("teacher_system"),
          max_teacher_prompt_len=data.get("max_teacher_prompt_len"), **common)
  except TooLong as e:
    field = {"max_prompt_len": "data.max_prompt_len",
             "max_teacher_prompt_len": "data.max_teacher_prompt_len",
             "max_response_len": "rollout.max_new_tokens"}[e.arg]
    raise ValueError(f"config.{field}: {e}") from None
  if data.get("task") == "records" and len(batches.keep) < batches.global_batch_size:
    # A batch would repeat records: the user's file is too small to train on.
    raise ValueError(
        f"config.data.batch_size: {batches.global_batch_size} is more than the "
        f"{len(batches.keep)} usable records of {data.records_file} (a batch "
        "would repeat them); lower it or give more records")
  return batches
