"""Evaluating one model on suites: rollouts -> verifier scores -> metrics.

`evaluate_model(cfg, params, tokenizer, suites, ...)` returns a flat dict of
namespaced numbers, per suite S (accuracies are fractions in [0, 1]):

  S/num_problems, S/num_dropped     problems scored / dropped as too long
  greedy (temperature 0, one completion per problem):
    S/greedy_acc                    mean reward
    S/greedy_format                 mean format score (task-specific, see tasks)
    S/greedy_parse_rate             fraction whose answer could be parsed
    S/greedy_len                    mean generated tokens (incl. the EOS)
    S/greedy_truncated              fraction that hit max_new_tokens
  single (one completion per problem SAMPLED at `single_temperature`; the
  paper's in-distribution accuracy, App. D.3: T 0.5, top-p 1.0):
    S/single_acc, S/single_format, S/single_parse_rate, S/single_len,
    S/single_truncated              as for greedy
  sampled (num_samples = n completions per problem at `temperature`):
    S/sampled_acc                   mean reward over all samples (= pass@1)
    S/pass@k                        unbiased pass@k with n samples, per problem
                                    1 - C(n-c, k) / C(n, k), averaged
    S/distinct_correct              mean number of distinct correct answers per
                                    problem (Countdown: equations equal up to
                                    commutativity/associativity count once;
                                    MCQ: the letter, so at most 1)
    S/sampled_format, S/sampled_parse_rate, S/sampled_len, S/sampled_truncated
  language (`language='es'`: the style judge, jaxdistill.tasks.language):
    S/M_lang_es                     fraction of mode M's completions whose
                                    prose is Spanish (App. A.11, Fig. 24)
    style/M_lang_es                 the same over every suite's completions

Completions come from a generator, `gen(prompts, prompt_mask, *, problem_ids,
sample_ids, row_ids, temperature, rng) -> (texts, lengths, ended)` over R
rows; `rollout_generator` wraps rollout.generate (policy='student' on the
evaluated model). `evaluate_suites` takes any generator, which is how tests
check the scoring against known completions.

RNG: the key of suite S is fold_in(key(seed), crc32(S)); row r of a batch,
answering problem i with sample j, draws from row id i * n + j. A sample
therefore does not depend on the batch size or on the other suites. The
single mode folds crc32('single') into its suite's key, so its one sample is
not sampled mode's first.

Per-suite settings (`per_suite={S: {...}}`): `temperature`,
`single_temperature` and `max_new_tokens` replace the run's for suite S (the
paper evaluates Countdown-4E at T 0.5 with 4,096 new tokens, App. D.3); a
generator is then called with `max_new_tokens=` as a keyword.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
import logging
import sys
import zlib

import jax
from jax.sharding import NamedSharding
import numpy as np
from tqdm import tqdm

from jaxdistill import rollout as rollout_lib
from jaxdistill import sharding
from jaxdistill import tasks
from jaxdistill.data import pipeline
from jaxdistill.data import sources
from jaxdistill.evaluate import metrics
from jaxdistill.tasks import arith
from jaxdistill.tasks import countdown
from jaxdistill.tasks import language as lang_lib
from jaxdistill.tasks import math_answer

Generator = Callable[..., tuple[Sequence[str], np.ndarray, np.ndarray]]
MODES = ("greedy", "single", "sampled")
# What per_suite may set for one suite (evaluate_suites).
PER_SUITE = ("temperature", "single_temperature", "max_new_tokens")


def rollout_generator(cfg, params, tokenizer, *, max_new_tokens: int,
                      top_k: int | None = None, top_p: float | None = None,
                      eos_token_ids: Sequence[int] | None = None,
                      mesh=None, rules=None,
                      decode_layout: str = "auto") -> Generator:
  """A generator sampling from the model (cfg, params) with rollout.generate.

  Rows end at any of `eos_token_ids` (default: the config's EOS ids and the
  tokenizer's, since chat templates end the assistant turn with their own
  token). Texts are decoded without special tokens. Tokens are sampled over
  the tokenizer's real vocabulary only (len(tokenizer), not the config's
  padded embedding width). `decode_layout`: rollout.generate's (the weights'
  layout in the decode loop, sharding.DECODE_LAYOUTS).
  """
  vocab = len(tokenizer)
  if vocab > cfg.vocab_size:
    raise ValueError(f"tokenizer: {vocab} tokens do not fit the model's "
                     f"vocabulary ({cfg.vocab_size})")
  if eos_token_ids is None:
    eos_token_ids = rollout_lib.eos_ids(cfg, tokenizer=tokenizer)
  if not eos_token_ids:
    raise ValueError("eos_token_ids: the model config and tokenizer name no EOS "
                     "token; pass eos_token_ids")
  pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None
            else eos_token_ids[0])

  default_new_tokens = max_new_tokens

  def generate(prompts, prompt_mask, *, row_ids, temperature, rng,
               max_new_tokens=None, **_):
    if mesh is not None and jax.process_count() > 1:
      # Every process holds the whole batch; each places its devices' rows
      # (the rows sharding rollout.generate would give them).
      prompts, prompt_mask, row_ids = (
          sharding.put_global(np.asarray(x, np.int32), NamedSharding(
              mesh, sharding.logical_to_spec(
                  ("batch",) + (None,) * (np.ndim(x) - 1), np.shape(x), mesh,
                  rules or sharding.DEFAULT_RULES)))
          for x in (prompts, prompt_mask, row_ids))
    r = rollout_lib.generate(
        (cfg, params), None, prompts, prompt_mask, rng=rng, policy="student",
        max_new_tokens=int(max_new_tokens or default_new_tokens),
        temperature=float(temperature),
        top_k=top_k, top_p=top_p, eos_token_ids=eos_token_ids,
        pad_token_id=pad, return_logprobs=False, row_ids=row_ids, mesh=mesh,
        rules=rules, vocab_size=vocab, decode_layout=decode_layout)
    # On several processes the rows live on every host's devices: gathered
    # (a collective every process runs), so each scores the whole batch.
    r = r.replace(**{k: sharding.to_host(getattr(r, k)) for k in (
        "tokens", "prompt_mask", "response_mask", "lengths", "ended")})
    texts = rollout_lib.decode_responses(r, tokenizer, skip_special_tokens=True)
    return texts, np.asarray(r.lengths), np.asarray(r.ended)
  return generate


def evaluate_model(cfg, params, tokenizer, suites: Mapping[str, Sequence[Mapping]],
                   *, greedy: bool = True, num_samples: int = 16,
                   temperature: float = 1.0, ks: Sequence[int] = (1, 4, 16),
                   max_new_tokens: int, batch_size: int, seed: int, mesh=None,
                   top_k: int | None = None, top_p: float | None = None,
                   eos_token_ids: Sequence[int] | None = None,
                   max_prompt_len: int = 1024, prompt_bucket: int | None = 64,
                   system: str | None = None, progress: bool = True,
                   single_temperature: float | None = None,
                   per_suite: Mapping[str, Mapping] | None = None,
                   language: str | None = None) -> dict:
  """Metrics of the model (cfg, params) on `suites` ({name: records}).

  See the module docstring for the keys. `batch_size` is the number of
  sequences per rollout call: prompts for greedy decoding, prompts x
  num_samples (at least one prompt) for sampling. Prompts longer than
  `max_prompt_len` tokens are dropped and counted (S/num_dropped); widths are
  rounded up to a multiple of `prompt_bucket` (one compilation per width).
  """
  if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
    raise ValueError(f"max_new_tokens: must be an int >= 1, got {max_new_tokens!r}")
  gen = rollout_generator(cfg, params, tokenizer, max_new_tokens=max_new_tokens,
                          top_k=top_k, top_p=top_p, eos_token_ids=eos_token_ids,
                          mesh=mesh)
  return evaluate_suites(
      gen, tokenizer, suites, greedy=greedy, num_samples=num_samples,
      temperature=temperature, ks=ks, batch_size=batch_size, seed=seed,
      max_prompt_len=max_prompt_len, prompt_bucket=prompt_bucket,
      system=system, progress=progress, single_temperature=single_temperature,
      per_suite=per_suite, language=language)


def check_settings(*, greedy, num_samples, temperature, ks, batch_size, seed,
                   single_temperature=None, per_suite=None):
  """ValueError naming the first bad sampler setting."""
  if not isinstance(num_samples, (int, np.integer)) or num_samples < 0:
    raise ValueError(f"num_samples: must be an int >= 0, got {num_samples!r}")
  if not greedy and num_samples == 0 and single_temperature is None:
    raise ValueError("greedy, single_temperature, num_samples: nothing to "
                     "evaluate (greedy=False, no single_temperature and "
                     "num_samples=0)")
  for name, over in [(None, {"single_temperature": single_temperature})] + list(
      (per_suite or {}).items()):
    where = f"per_suite[{name!r}]." if name else ""
    unknown = sorted(set(over) - set(PER_SUITE))
    if unknown:
      raise ValueError(f"{where}{unknown[0]}: not a per-suite setting; "
                       f"choose from {PER_SUITE}")
    t = over.get("single_temperature")
    if t is not None and not float(t) > 0:
      raise ValueError(f"{where}single_temperature: one sampled completion "
                       f"needs a temperature > 0, got {t} (greedy decoding "
                       "is greedy=True)")
    t = over.get("temperature")
    if name and t is not None and not float(t) > 0:
      raise ValueError(f"{where}temperature: must be > 0, got {t}")
    m = over.get("max_new_tokens")
    if m is not None and (not isinstance(m, (int, np.integer)) or m < 1):
      raise ValueError(f"{where}max_new_tokens: must be an int >= 1, got {m!r}")
  if num_samples:
    if not float(temperature) > 0:
      raise ValueError(f"temperature: sampling needs temperature > 0, got "
                       f"{temperature} (greedy decoding is greedy=True)")
    bad = [k for k in ks if not isinstance(k, (int, np.integer))
           or not 1 <= k <= num_samples]
    if bad:
      raise ValueError(f"ks: pass@k needs 1 <= k <= num_samples={num_samples}, "
                       f"got {list(bad)}")
  if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
    raise ValueError(f"batch_size: must be an int >= 1, got {batch_size!r}")
  if not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
    raise ValueError(f"seed: must be an int in [0, 2**32), got {seed!r}")


def evaluate_suites(generate: Generator, tokenizer,
                    suites: Mapping[str, Sequence[Mapping]], *, greedy: bool = True,
                    num_samples: int = 16, temperature: float = 1.0,
                    ks: Sequence[int] = (1, 4, 16), batch_size: int, seed: int,
                    max_prompt_len: int = 1024, prompt_bucket: int | None = 64,
                    system: str | None = None, progress: bool = True,
                    single_temperature: float | None = None,
                    per_suite: Mapping[str, Mapping] | None = None,
                    language: str | None = None) -> dict:
  """`evaluate_model` with completions from any generator (module docstring)."""
  per_suite = {k: {kk: vv for kk, vv in dict(v).items() if vv is not None}
               for k, v in (per_suite or {}).items()}
  check_settings(greedy=greedy, num_samples=num_samples, temperature=temperature,
                 ks=ks, batch_size=batch_size, seed=seed,
                 single_temperature=single_temperature, per_suite=per_suite)
  if not suites:
    raise ValueError("suites: no suite to evaluate")
  unknown = sorted(set(per_suite) - set(suites))
  if unknown:
    raise ValueError(f"per_suite[{unknown[0]!r}]: no such suite is evaluated "
                     f"({sorted(suites)})")
  for name, records in suites.items():
    if not records:
      raise ValueError(f"suites[{name!r}]: no problems")
    for i, r in enumerate(records):
      try:
        if tasks.task_of(r) == tasks.MCQ:  # null options are not the text "None"
          sources.validate_record(r["question"], r["options"], r["answer"])
      except ValueError as e:
        raise ValueError(f"suites[{name!r}][{i}]: {e}") from None
    if len(records) * max(num_samples, 1) >= 2**31:
      raise ValueError(f"suites[{name!r}]: {len(records)} problems x "
                       f"{num_samples} samples overflow int32 row ids")
  # Imported here: the pipeline pulls in grain, which scoring alone never needs.

  key = jax.random.key(int(seed))
  out = {}
  judged = {}  # mode -> [language of each completion], every suite's
  for name, records in suites.items():
    rng = jax.random.fold_in(key, _crc(name))
    over = per_suite.get(name, {})
    single = over.get("single_temperature", single_temperature)
    runs = {}
    modes = [("greedy", 1, 0.0, batch_size, rng)] if greedy else []
    if single is not None:
      modes.append(("single", 1, float(single), batch_size,
                    jax.random.fold_in(rng, _crc("single"))))
    if num_samples:
      modes.append(("sampled", int(num_samples),
                    float(over.get("temperature", temperature)),
                    max(1, batch_size // num_samples), rng))
    gen_kw = ({"max_new_tokens": int(over["max_new_tokens"])}
              if "max_new_tokens" in over else {})
    batches = None
    for mode, n, temp, prompts_per_call, mode_rng in modes:
      batches = pipeline.make_prompt_batches(
          records, tokenizer, batch_size=prompts_per_call,
          max_prompt_len=max_prompt_len, seed=0, shuffle=False, num_epochs=1,
          bucket=prompt_bucket, system=system)
      runs[mode] = _run(generate, batches, n=n, temperature=temp, rng=mode_rng,
                        desc=f"{name} {mode}", progress=progress, **gen_kw)
    kept = batches.keep
    if batches.num_dropped:
      logging.warning("suite %s: %d of %d prompts exceed max_prompt_len=%d and "
                      "are not scored", name, batches.num_dropped, len(records),
                      max_prompt_len)
    task_ids = np.asarray([tasks.task_of(records[i]) for i in kept])
    out[f"{name}/num_problems"] = float(len(kept))
    out[f"{name}/num_dropped"] = float(batches.num_dropped)
    for k, v in summarize(task_ids, runs.get("greedy"), runs.get("sampled"),
                          ks if num_samples else (),
                          single=runs.get("single")).items():
      out[f"{name}/{k}"] = v
    if language is not None:
      for mode, res in runs.items():
        found = [lang_lib.language(t) for texts in res["texts"] for t in texts]
        judged.setdefault(mode, []).extend(found)
        out[f"{name}/{mode}_lang_{language}"] = _share(found, language)
  for mode, found in judged.items():
    out[f"style/{mode}_lang_{language}"] = _share(found, language)
  return out


def _share(found, language) -> float:
  return sum(f == language for f in found) / max(len(found), 1)


def _crc(text: str) -> int:
  return zlib.crc32(text.encode()) & 0x7FFFFFFF


def _run(generate, batches, *, n, temperature, rng, desc, progress,
         **gen_kw) -> dict:
  """Completions and scores of every kept problem: arrays [P, n], texts [P][n]."""
  size = len(batches.records)
  res = {"reward": np.full((size, n), np.nan, np.float32),
         "format": np.zeros((size, n), np.float32),
         "parsed": np.zeros((size, n), bool),
         "length": np.zeros((size, n), np.float32),
         "ended": np.zeros((size, n), bool)}
  texts: list[list[str] | None] = [None] * size
  for step in tqdm(range(len(batches)), desc=desc, file=sys.stderr,
                   disable=not progress or jax.process_index() != 0,
                   leave=False):
    b = batches[step]
    idx = np.asarray(b["index"], np.int64)
    rows = len(idx) * n
    pid = np.repeat(idx, n)
    sid = np.tile(np.arange(n, dtype=np.int64), len(idx))
    t, lengths, ended = generate(
        np.repeat(b["prompt"], n, axis=0), np.repeat(b["prompt_mask"], n, axis=0),
        problem_ids=pid, sample_ids=sid, row_ids=(pid * n + sid).astype(np.int32),
        temperature=temperature, rng=rng, **gen_kw)
    t = list(t)
    if len(t) != rows or np.shape(lengths) != (rows,) or np.shape(ended) != (rows,):
      raise ValueError(f"generator returned {len(t)} texts, lengths "
                       f"{np.shape(lengths)}, ended {np.shape(ended)} for "
                       f"{rows} rows")
    sc = tasks.score_batch(t, b)
    for r in np.flatnonzero(np.asarray(b["valid"])):
      sl, i = slice(r * n, (r + 1) * n), idx[r]
      res["reward"][i], res["format"][i] = sc["reward"][sl], sc["format"][sl]
      res["parsed"][i] = sc["parsed"][sl]
      res["length"][i] = np.asarray(lengths)[sl]
      res["ended"][i] = np.asarray(ended)[sl]
      texts[i] = t[sl]
  kept = batches.keep
  out = {k: v[kept] for k, v in res.items()}
  if np.isnan(out["reward"]).any():
    raise RuntimeError(f"{desc}: some problems were never scored")
  out["texts"] = [texts[i] for i in kept]
  return out


def _answer_key(task: int):
  """How two correct answers of a non-MCQ task are told apart."""
  return {tasks.COUNTDOWN: countdown.normalize_answer,
          tasks.COUNTDOWN_STEPS: countdown.paper_normalize_answer,
          tasks.ARITH: arith.extract_answer,
          tasks.MATH: math_answer.last_boxed}[task]


def summarize(task_ids: np.ndarray, greedy: Mapping | None,
              sampled: Mapping | None, ks: Sequence[int],
              num_options: Sequence[int | None] | None = None, *,
              single: Mapping | None = None) -> dict:
  """Suite metrics (unprefixed keys) from per-problem results of `_run`.

  `num_options` (each MCQ problem's option count) is still accepted and no
  longer read: an MCQ problem's distinct correct answers are its gold
  letter or none."""
  del num_options
  out = {}
  for mode, res in (("greedy", greedy), ("single", single),
                    ("sampled", sampled)):
    if res is None:
      continue
    correct = res["reward"] > 0.5  # [P, n]; rewards are 0 or 1.
    out[f"{mode}_acc"] = metrics.accuracy(correct)
    out[f"{mode}_format"] = float(np.mean(res["format"], dtype=np.float64))
    out[f"{mode}_parse_rate"] = float(np.mean(res["parsed"]))
    out[f"{mode}_len"] = float(np.mean(res["length"], dtype=np.float64))
    out[f"{mode}_truncated"] = float(np.mean(~res["ended"]))
  if sampled is not None:
    correct = sampled["reward"] > 0.5
    out.update(metrics.mean_pass_at_k(correct, ks))
    # An MCQ sample is correct when its letter is the gold one, so its correct
    # samples share one answer whatever letters a key would read (a run-on
    # letter the question does not offer must not count as a second one).
    distinct = [int(np.any(c)) if task == tasks.MCQ else
                metrics.distinct_correct([t], [c], normalize=_answer_key(task))[0]
                for t, c, task in zip(sampled["texts"], correct, task_ids)]
    out["distinct_correct"] = float(np.mean(distinct))
  return out
