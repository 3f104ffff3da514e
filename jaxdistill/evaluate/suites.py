"""Evaluation suites: named sets of problems, built from the eval config.

A suite spec is a small dict in `config.suites`:

  countdown3 = dict(kind='countdown', n_numbers=3, num_problems=500, data_seed=0)
      the Countdown-3 TEST split of tasks.countdown.generate_problems (its
      targets never occur in any training split, whatever the seed): the
      project's own generator, not the paper's.
  countdown4e = dict(kind='countdown', source='countdown4e', split='test',
                     data_dir=None, num_problems=None)
      the paper's Countdown set `source` (tasks.countdown.PRESETS), split
      `split` (default 'test'), its first `num_problems` (None: all), from
      `data_dir` if given (data.prepare NAME writes it), else generated;
      `unseen=True` first drops the test problems that also occur in the
      set's training split (the paper keeps them).
  science = dict(kind='mcq', data_dir='/data', source='sciknoweval',
                 split='test', num_problems=None, data_seed=0)
      with `data_dir` alone (as here), split `split` of the data set
      `source` that `python -m jaxdistill.data.prepare` wrote there
      (builders.mcq_builder; sciknoweval and medreason are the paper's); or
      `path`, a user file (JSONL / JSON / CSV / Parquet) in one of
      jaxdistill.data.sources.SOURCES, converted in memory; or, with
      `manual_dir` + `data_dir` (+ `split`, default 'test') instead of `path`,
      the prepared `mcq_files` TFDS builder over that directory.
      `prompt`: None, the project's prompt; 'science' / 'medreason', that
      Table 1 prompt (tasks.mcq.PROMPTS).

  lmeval = dict(kind='harness', tasks='mmlu_pro+truthfulqa_mc1+...',
                limit=200, ...)
      lm-evaluation-harness tasks run on the checkpoint by
      jaxdistill.evaluate.harness.evaluate_suite (fields there); its
      metrics are `lmeval/score` (the unweighted mean of the tasks' scores,
      fractions) and `lmeval/{task}`. It holds no problems of ours: it is
      not loaded here, and --compile_only and the sweep's cost do not count
      it. Needs `pip install 'jaxdistill[lmeval]'`.

  math500 = dict(kind='math', source='math500', data_dir='/data',
                 num_problems=None)
      the math set `source` (numina_math's train, math500's test) that
      `python -m jaxdistill.data.prepare SOURCE` wrote under `data_dir`
      (App. A.3: Qwen2.5-Math's prompt, math-verify's equivalence); its
      first `num_problems` (None: all).

`num_problems` caps a suite: Countdown generates exactly that many; an MCQ
set keeps a seeded random subset (in file order) of that size with
`data_seed` an int, its FIRST `num_problems` in stored order with
`data_seed=None` (the paper's protocol, App. D.3: configs/eval.py's
sciknoweval / medreason suites), or all rows when num_problems is None.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
import importlib.util
import logging
import os

import numpy as np

from jaxdistill.data import builders
from jaxdistill.data import pipeline
from jaxdistill.data import sources
from jaxdistill.tasks import countdown
from jaxdistill.tasks import mcq

KINDS = ("countdown", "mcq", "math", "harness")


def _field(name: str, key: str) -> str:
  return f"config.suites.{name}.{key}"


def suite_records(name: str, spec: Mapping) -> list[dict]:
  """The problems of one suite spec (see the module docstring)."""
  kind = spec.get("kind")
  num = spec.get("num_problems")
  if num is not None and (not isinstance(num, int) or num <= 0):
    raise ValueError(f"{_field(name, 'num_problems')}: must be a positive int or "
                     f"None, got {num!r}")
  seed = int(spec.get("data_seed") or 0)
  if kind == "countdown" and spec.get("source") is not None:
    records = pipeline.paper_countdown_records(
        spec.source, spec.get("split") or "test", spec.get("data_dir"),
        f"config.suites.{name}", unseen=bool(spec.get("unseen")))
    return records[:num] if num is not None else records
  if kind == "countdown":
    n = spec.get("n_numbers")
    if n is None:
      raise ValueError(f"{_field(name, 'n_numbers')}: required for kind 'countdown'")
    if num is None:
      raise ValueError(f"{_field(name, 'num_problems')}: required for kind "
                       "'countdown' (problems are generated)")
    try:
      problems = countdown.generate_problems(int(n), num, seed, split="test")
    except ValueError as e:
      raise ValueError(f"config.suites.{name}: {e}") from None
    return [p.to_record() for p in problems]
  if kind == "math":
    source = spec.get("source")
    records = pipeline.math_records(
        source, spec.get("split") or pipeline.MATH_SETS.get(source, "test"),
        spec.get("data_dir"), f"config.suites.{name}")
    return records[:num] if num is not None else records
  if kind == "mcq":
    mcq.check_prompt(spec.get("prompt"), _field(name, "prompt"))
    records = _mcq_records(name, spec)
    if spec.get("prompt") is not None:
      records = [dict(r, prompt=spec.prompt) for r in records]
    if num is not None and len(records) > num:
      if spec.get("data_seed") is None:
        return records[:num]
      keep = np.sort(np.random.default_rng(seed).permutation(len(records))[:num])
      records = [records[i] for i in keep]
    return records
  raise ValueError(f"{_field(name, 'kind')}: expected one of {KINDS}, got {kind!r}")


def _mcq_records(name, spec) -> list[dict]:
  source = spec.get("source") or "generic"
  if source not in sources.SOURCES:
    raise ValueError(f"{_field(name, 'source')}: expected one of "
                     f"{tuple(sources.SOURCES)}, got {source!r}")
  path = spec.get("path")
  if path:
    path = os.path.expanduser(path)
    if not os.path.isfile(path):
      raise FileNotFoundError(f"{_field(name, 'path')}: data file not found: {path}")
    records = sources.convert_file(path, source, seed=int(spec.get("data_seed") or 0))
  elif spec.get("manual_dir") or spec.get("data_dir"):
    manual = spec.get("manual_dir")
    if manual and not os.path.isdir(os.path.expanduser(manual)):
      raise FileNotFoundError(f"{_field(name, 'manual_dir')}: directory not found: "
                              f"{os.path.expanduser(manual)}")
    builder = builders.mcq_builder(spec, f"config.suites.{name}")
    split = spec.get("split") or "test"
    if split not in builder.info.splits:
      raise ValueError(f"{_field(name, 'split')}: {split!r} is not a split of "
                       f"the prepared {source!r} data "
                       f"({', '.join(sorted(builder.info.splits))})")
    records = builders.load_records(builder, split)
  else:
    raise ValueError(
        f"{_field(name, 'path')}: not set. Pass the suite's data file, e.g. "
        f"--config.suites.{name}.path=/data/test.jsonl, or a data_dir where "
        f"`python -m jaxdistill.data.prepare {source}` wrote it, or leave "
        f"'{name}' out of the evaluated suites (configs/eval.py:suites=...)")
  if not records:
    raise ValueError(f"config.suites.{name}: the data holds no labelled questions")
  return records


def check_names(config, runnable: bool = True) -> tuple[str, ...]:
  """The evaluated suite names; ValueError naming any unknown or misplaced one.

  runnable False (--compile_only, which runs no lm-eval task): a harness
  suite's fields are checked, not the opt-in, environment and install its
  run needs."""
  known = sorted(config.suites.keys())
  names = tuple(config.eval_suites)
  if not names:
    raise ValueError("config.eval_suites: no suite to evaluate")
  unknown = [n for n in names if n not in config.suites]
  if unknown:
    raise ValueError(f"config.eval_suites: unknown suite(s) {unknown}; known "
                     f"suites: {known}")
  for n in names:
    if config.suites[n].get("kind") == "harness":
      check_harness(n, config.suites[n], runnable)
  for group in ("in_distribution", "harder", "ood"):
    stray = [n for n in config.get(group) or () if n not in names]
    if stray:
      raise ValueError(f"config.{group}: suite(s) {stray} are not evaluated "
                       f"(config.eval_suites = {list(names)})")
  return names


def task_names(spec: Mapping) -> list[str]:
  """A 'harness' suite's lm-eval task names (its '+'-joined `tasks`)."""
  return [t for t in str(spec.get("tasks") or "").split("+") if t]


def check_harness(name: str, spec: Mapping, runnable: bool = True) -> None:
  """A 'harness' suite's fields, without importing lm-eval; with `runnable`,
  also what running it needs: the code-execution opt-in, HF_ALLOW_CODE_EVAL
  and lm-eval installed."""
  tasks = task_names(spec)
  if not tasks:
    raise ValueError(f"{_field(name, 'tasks')}: lm-eval task names joined by "
                     "'+', got none")
  for key, value in [(k, spec.get(k)) for k in (
      "limit", "batch_size", "max_gen_toks", "max_length")] + [
                         (f"limits.{t}", v) for t, v in
                         dict(spec.get("limits") or {}).items()]:
    if value is not None and (not isinstance(value, int) or isinstance(
        value, bool) or value <= 0):
      raise ValueError(f"{_field(name, key)}: a positive int or None, got "
                       f"{value!r}")
  stray = sorted(set(dict(spec.get("limits") or {})) - set(tasks))
  if stray:
    raise ValueError(f"{_field(name, 'limits')}: {stray[0]!r} is not one of "
                     f"the suite's tasks ({'+'.join(tasks)})")
  if not runnable:
    return
  code = [t for t in tasks if "humaneval" in t or "mbpp" in t]
  if code and not spec.get("confirm_run_unsafe_code"):
    raise ValueError(
        f"{_field(name, 'tasks')}: {code[0]} executes the code the model "
        "writes, which lm-eval does only when you opt in: set "
        f"{_field(name, 'confirm_run_unsafe_code')}=True and export "
        "HF_ALLOW_CODE_EVAL=1 (ideally inside a sandbox), or leave it out "
        f"of {_field(name, 'tasks')} (the mean is then over the others); "
        "configs/eval.py's arg unsafe_code=True, or HF_ALLOW_CODE_EVAL=1 in "
        "the environment, opts in; forgetting=suites measures forgetting "
        "without lm-eval")
  if code and os.environ.get("HF_ALLOW_CODE_EVAL") != "1":
    # Hugging Face's code_eval metric refuses without it, after every
    # completion has been generated: say so before anything loads.
    raise ValueError(
        f"{_field(name, 'tasks')}: {code[0]} scores the model's code with "
        "Hugging Face's code_eval, which runs only with HF_ALLOW_CODE_EVAL=1 "
        "in the environment: export it (ideally inside a sandbox)")
  if importlib.util.find_spec("lm_eval") is None:
    raise ImportError(
        f"{_field(name, 'kind')}='harness' runs lm-evaluation-harness, which "
        "is not installed: pip install 'jaxdistill[lmeval]' (or evaluate "
        "forgetting=suites, without lm-eval)")


def harness_names(config, names: Sequence[str]) -> tuple[str, ...]:
  """Of `names`, the suites of kind 'harness' (lm-eval tasks)."""
  return tuple(n for n in names if config.suites[n].get("kind") == "harness")


def load_suites(config, names: Sequence[str] | None = None) -> dict[str, list[dict]]:
  """{name: records} for `names` (default: config.eval_suites), in order;
  'harness' suites are left out (they hold no problems of ours)."""
  names = check_names(config) if names is None else tuple(names)
  names = tuple(n for n in names if n not in harness_names(config, names))
  out = {}
  for n in names:
    if n not in config.suites:
      raise ValueError(f"unknown suite {n!r}; known suites: "
                       f"{sorted(config.suites.keys())}")
    out[n] = suite_records(n, config.suites[n])
    logging.info("suite %s: %d problems", n, len(out[n]))
  return out
