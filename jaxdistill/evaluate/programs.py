"""The programs an evaluation compiles, from its config and the checkpoint's
config.json alone (no weights): for `python -m jaxdistill.evaluate
--compile_only=SLICE` (compile_only.py compiles and reports).

  greedy    one decode of sampler.batch_size prompts at temperature 0;
  single    the same at sampler.single_temperature (one sample per prompt);
  sampled   sampler.num_samples samples of each of batch_size // num_samples
            prompts at sampler.temperature.
Prompts are as wide as sampler.max_prompt_len rounded up to the prompt
bucket, answers sampler.max_new_tokens long: the largest the run compiles.
A suite whose sampler.per_suite entry sets other new-token counts or
temperatures adds those programs (e.g. 'sampled, 4096 new tokens').
"""
from __future__ import annotations

import dataclasses
import os

from jaxdistill import models
from jaxdistill import sharding
from jaxdistill.data import tokenizer as tok_lib
from jaxdistill.models import hub
from jaxdistill.train import programs as train_programs

# What a compile-only evaluation reads of a checkpoint: its config, and its
# tokenizer's size when there is one.
_CONFIG_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json")


def model_config(spec: str, dtype: str | None):
  """(ModelConfig, vocabulary sampled) of --checkpoint for compile-only: a
  preset name (models.PRESETS), or a directory / hub name / training
  workdir whose config.json (and tokenizer, if any) is read; no weights."""
  if spec in models.PRESETS and not os.path.exists(spec):
    cfg, vocab = models.get_preset(spec), None
  else:
    if hub.is_hub_id(spec) and not os.path.exists(spec):
      path, _ = hub.resolve(spec, allow_patterns=_CONFIG_FILES)
    else:
      path = hub.checkpoint_dir(spec, "--checkpoint", workdir_ok=True)
    cfg = models.checkpoint.read_config(path)
    vocab = None
    if os.path.isfile(os.path.join(path, "tokenizer.json")):
      vocab = len(tok_lib.load_tokenizer(path))
  if dtype:
    cfg = dataclasses.replace(cfg, dtype=dtype, param_dtype=dtype)
  return cfg, vocab or cfg.vocab_size


def suite_modes(sampler, over=None, *, samples: bool = True):
  """[(mode, rows, temperature, new tokens, prompts per call)] of the
  decodes an evaluation runs on one suite (core.evaluate_suites' modes),
  `over` its sampler.per_suite entry; `samples` False: without the
  sampled mode (a baseline scored by its accuracy sample alone)."""
  s = sampler
  over = {k: v for k, v in dict(over or {}).items() if v is not None}
  b, n = int(s.batch_size), int(s.num_samples) if samples else 0
  new = int(over.get("max_new_tokens") or s.max_new_tokens)
  single = over.get("single_temperature", s.get("single_temperature"))
  out = []
  if s.greedy:
    out.append(("greedy", b, 0.0, new, b))
  if single is not None:
    out.append(("single", b, float(single), new, b))
  if n:
    per_call = max(1, b // n)
    out.append(("sampled", per_call * n,
                float(over.get("temperature") or s.temperature), new, per_call))
  return out


def program_name(config, mode: str, new: int) -> str:
  """The name of the program decoding `mode` with `new` new tokens."""
  default = int(config.sampler.max_new_tokens)
  return mode if new == default else f"{mode}, {new} new tokens"


def _overrides(config) -> dict:
  s = config.sampler
  return {k: dict(v) for k, v in (s.get("per_suite") or {}).items()
          if k in tuple(config.get("eval_suites") or ())}


def eval_programs(config, cfg, vocab, mesh, rules):
  """[greedy, sampled] compile_only.Programs of an evaluation."""
  s = config.sampler
  bucket = s.get("prompt_bucket") or 1
  p = -(-int(s.max_prompt_len) // bucket) * bucket
  params = train_programs.abstract_params(cfg, mesh, rules)
  modes = {}  # (name, rows, temperature, new tokens), each once
  for o in [{}] + list(_overrides(config).values()):
    for name, rows, temp, new, _ in suite_modes(s, o):
      modes[(name, rows, temp, new)] = None
  return [train_programs.rollout_program(
      program_name(config, name, new), cfg, None,
      params, None, mesh, rules, vocab, rows=rows, policy="student",
      prompt_len=p, max_new_tokens=new, temperature=temp, top_k=s.get("top_k"),
      top_p=s.get("top_p"), decode_layout=s.get("decode_layout") or "auto")
          for name, rows, temp, new in modes]


def decode_calls(config, names, *, samples: bool = True):
  """({program name: calls}, [suites not counted]) of an evaluation of the
  suites `names`: per suite and mode, its num_problems over the prompts per
  call, rounded up (the last batch is padded). A suite without
  num_problems (all of a data set's rows) cannot be counted from the
  config and is listed instead. Prompts over sampler.max_prompt_len, which
  the evaluation drops, are counted."""
  calls, uncounted = {}, []
  over = _overrides(config)
  for suite in names:
    problems = config.suites[suite].get("num_problems")
    if problems is None:
      uncounted.append(suite)
      continue
    for mode, _, _, new, per_call in suite_modes(config.sampler,
                                                 over.get(suite),
                                                 samples=samples):
      name = program_name(config, mode, new)
      calls[name] = calls.get(name, 0) + -(-int(problems) // per_call)
  return calls, uncounted


def mesh_of(config, devices):
  """The evaluation's mesh over `devices` (config.mesh None: one device)."""
  if config.get("mesh"):
    return sharding.make_mesh(dict(config.mesh), devices=devices)
  return sharding.make_mesh({"data": 1}, devices=list(devices)[:1])


def advice(config, row) -> str:
  del config, row
  return ("try a smaller sampler.batch_size, sampler.max_prompt_len or "
          "sampler.max_new_tokens, or a slice with more chips")
