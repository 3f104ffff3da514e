r"""Evaluate a checkpoint on the study's suites; with --baseline, also forgetting
and update sparsity.

  python -m jaxdistill.evaluate --config configs/eval.py:task=countdown \
      --config.suites.science.data_dir=/data \
      --config.suites.medical.data_dir=/data \
      --checkpoint /runs/qwen_rkl_on --baseline /ckpt/Qwen2.5-0.5B-Instruct \
      --out /runs/qwen_rkl_on/eval.json

--checkpoint / --baseline name a Hugging Face directory, a hub name
(org/name[@revision], resolved into the Hugging Face cache; the commit goes
into the JSON's 'revisions'), or a training workdir (then its hf_student/
export is used). The tokenizer (and chat template) is the
directory's own unless config.tokenizer is set. Prints one markdown table per
suite (plus group means, forgetting and sparsity) to stdout; progress bars and
logs go to stderr. --out writes the JSON: {'metrics': flat namespaced numbers
(keys in jaxdistill.evaluate.core and .report), 'checkpoint', 'baseline',
'suites', 'sparsity' (comparison and stored dtypes), 'config', ...}.

With --baseline (the student before training):
  forgetting   the baseline is evaluated on the OOD suites (config.ood),
               by config.forgetting.metric's mode (the paper's: one sample at
               T 0.5), and the drop in accuracy is reported in percentage
               points per suite and mean.
  sparsity     both checkpoints are read tensor by tensor in their stored
               dtypes (sparsity.update_sparsity_from_checkpoints): the paper's
               S_tau (|delta| < tau, strict, on the stored values upcast to
               float32) at each of config.sparsity.taus, whole model, per
               layer and per tensor group (sparsity/S_1e-6_f32, ...); and the
               former figures, whole model, |delta| <= config.sparsity.atol
               and equal after rounding both to bfloat16 / float32
               (sparsity/unchanged_1e-5_bf16, sparsity/equal_bf16, ...); per
               layer kind (sparsity/attention/S_1e-6_f32, ...) and, when the
               checkpoint holds the run's seen_tokens.json, over the
               embedding rows of seen and never-seen tokens apart.

On a multi-host slice run the same command on every host with --distributed
(train's flags): the mesh spans all chips, each host places its rows of every
batch, the generated rows are gathered to every host, every host scores the
same completions and process 0 alone writes --out and prints.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import re
import sys
import time

from absl import flags
import jax
from ml_collections import config_flags

from jaxdistill import cli
from jaxdistill import compile_only
from jaxdistill import config_lib
from jaxdistill import models
from jaxdistill import rollout
from jaxdistill import sharding
from jaxdistill import sparsity
from jaxdistill import storage
from jaxdistill.data import tokenizer as tok_lib
from jaxdistill.evaluate import core
from jaxdistill.evaluate import programs
from jaxdistill.evaluate import report
from jaxdistill.evaluate import suites as suites_lib
from jaxdistill.models import hub
from jaxdistill.tasks import language as lang_lib
from jaxdistill.train import distributed
from jaxdistill.train import seen as seen_lib

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def resolve_checkpoint(path: str, flag: str = "--checkpoint") -> str:
  """The Hugging Face directory of `path`: itself, a hub name's snapshot in
  the Hugging Face cache, or a training workdir's hf_student/ export."""
  if not path:
    raise ValueError(f"{flag}: a checkpoint directory or hub name is required")
  path = os.path.abspath(hub.checkpoint_dir(path, flag, workdir_ok=True))
  if not (os.path.isfile(os.path.join(path, "model.safetensors")) or
          os.path.isfile(os.path.join(path, "model.safetensors.index.json"))):
    raise FileNotFoundError(
        f"{flag}: {path} holds no weights (model.safetensors or "
        "model.safetensors.index.json) and is not a training workdir with an "
        "hf_student/ export")
  return path


def revision_of(path: str) -> dict | None:
  """The hub revision a --checkpoint / --baseline names (None: a directory)."""
  return hub.resolve(path)[1] if path and hub.is_hub_id(path) else None


def _has_tokenizer(path: str) -> bool:
  return any(os.path.isfile(os.path.join(path, f)) for f in _TOKENIZER_FILES)


def check_config(config, runnable: bool = True) -> tuple[str, ...]:
  """Validates everything that needs no weights; returns the suite names.
  runnable False: for --compile_only, which needs no lm-eval, code-execution
  opt-in or language judge (suites.check_names)."""
  config_lib.check_finite(config)
  names = suites_lib.check_names(config, runnable)
  s = config.sampler
  config_lib.check_decode_layout(s.get("decode_layout"),
                                 "sampler.decode_layout")
  per_suite = _per_suite(config)
  unknown = sorted(set(per_suite) - set(config.suites))
  if unknown:
    raise ValueError(f"config.sampler.per_suite.{unknown[0]}: no such suite in "
                     f"config.suites ({sorted(config.suites)})")
  try:
    core.check_settings(greedy=bool(s.greedy), num_samples=int(s.num_samples),
                        temperature=s.temperature, ks=tuple(s.ks),
                        batch_size=s.batch_size, seed=config.seed,
                        single_temperature=s.get("single_temperature"),
                        per_suite=per_suite)
  except ValueError as e:
    raise ValueError(f"config.sampler.{e}") from None
  lang = config.get("language")
  if lang is not None and not (isinstance(lang, str) and
                               re.fullmatch(r"[a-z]{2}", lang)):
    raise ValueError("config.language: an ISO 639-1 code such as 'es' (the "
                     f"style judge's, jaxdistill.tasks.language), got {lang!r}")
  if lang is not None and runnable:
    lang_lib.check_installed()
  f = config.forgetting
  if f.metric not in ("greedy_acc", "single_acc", "sampled_acc"):
    raise ValueError(f"config.forgetting.metric: expected 'greedy_acc', "
                     f"'single_acc' or 'sampled_acc', got {f.metric!r}")
  if f.metric == "greedy_acc" and not s.greedy:
    raise ValueError("config.forgetting.metric: 'greedy_acc' needs "
                     "config.sampler.greedy=True")
  if f.metric == "single_acc" and s.get("single_temperature") is None:
    raise ValueError("config.forgetting.metric: 'single_acc' needs "
                     "config.sampler.single_temperature")
  if f.metric == "sampled_acc" and not (s.num_samples and f.baseline_samples):
    raise ValueError("config.forgetting.metric: 'sampled_acc' needs "
                     "sampler.num_samples > 0 and forgetting.baseline_samples=True")
  if f.baseline_suites not in ("ood", "all"):
    raise ValueError(f"config.forgetting.baseline_suites: expected 'ood' or 'all', "
                     f"got {f.baseline_suites!r}")
  if not float(config.sparsity.atol) >= 0:
    raise ValueError(f"config.sparsity.atol: must be >= 0, got {config.sparsity.atol}")
  sparsity.check_taus(config.sparsity.taus, "config.sparsity.taus")
  return names


def _per_suite(config, names=None) -> dict:
  """config.sampler.per_suite as plain dicts without None values, for the
  suites in `names` (default: all it names)."""
  over = config.sampler.get("per_suite") or {}
  return {k: {kk: vv for kk, vv in dict(v).items() if vv is not None}
          for k, v in dict(over).items() if names is None or k in names}


def max_new_tokens(config, names=None) -> int:
  """The most new tokens any evaluated suite decodes (per-suite settings
  included)."""
  return max([int(config.sampler.max_new_tokens)] + [
      int(o["max_new_tokens"]) for o in _per_suite(config, names).values()
      if "max_new_tokens" in o])


def check_positions(config, cfg, flag: str) -> None:
  """The widest prompt (sampler.max_prompt_len rounded up to its bucket) plus
  the most new tokens a suite decodes must fit the model's
  max_position_embeddings."""
  s = config.sampler
  prompt = rollout.bucket_length(int(s.max_prompt_len), s.get("prompt_bucket"))
  limit = int(cfg.max_position_embeddings)
  new = max_new_tokens(config, config.get("eval_suites"))
  if prompt + new > limit:
    raise ValueError(
        f"config.sampler.max_new_tokens: prompts up to {prompt} tokens "
        f"(sampler.max_prompt_len {s.max_prompt_len}, bucket "
        f"{s.get('prompt_bucket')}) + {new} new tokens exceed the "
        f"{flag} model's max_position_embeddings {limit}; lower "
        "sampler.max_prompt_len or sampler.max_new_tokens")


def load_model(path: str, config, mesh, rules=None):
  """(cfg, params, tokenizer, eos ids) of a Hugging Face directory."""
  tok_path = config.get("tokenizer") or path
  if not config.get("tokenizer") and not _has_tokenizer(path):
    raise FileNotFoundError(f"{path}: no tokenizer files ({_TOKENIZER_FILES}); "
                            "set config.tokenizer to a tokenizer directory")
  tokenizer = tok_lib.load_tokenizer(hub.checkpoint_dir(
      tok_path, "config.tokenizer", need_config=False))
  cfg, params = models.load_pretrained(path, dtype=config.get("dtype"), mesh=mesh,
                                       rules=rules)
  eos = rollout.eos_ids(cfg, tokenizer=tokenizer,
                        extra=models.checkpoint.generation_eos_ids(path),
                        override=config.sampler.get("eos_token_ids"))
  if len(tokenizer) > cfg.vocab_size:
    raise ValueError(f"{path}: tokenizer has {len(tokenizer)} tokens but the "
                     f"model only {cfg.vocab_size} embeddings")
  return cfg, params, tokenizer, eos


def _rollout_factory(config, mesh, rules):
  s = config.sampler

  def make(role, cfg, params, tokenizer, eos):
    del role
    return core.rollout_generator(
        cfg, params, tokenizer, max_new_tokens=int(s.max_new_tokens),
        top_k=s.get("top_k"), top_p=s.get("top_p"), eos_token_ids=eos, mesh=mesh,
        rules=rules, decode_layout=s.get("decode_layout") or "auto")
  return make


def _harness():
  """jaxdistill.evaluate.harness, imported on first use: importing it needs
  the optional lmeval extra (lm-eval's classes are its base classes)."""
  import jaxdistill.evaluate.harness as harness_lib  # pylint: disable=g-import-not-at-top
  return harness_lib


def _evaluate(role, path, config, mesh, rules, factory, suites, *,
              num_samples, harness=(), raw=None):
  """Flat metrics of `path` on `suites` ({name: records}) and on the
  'harness' suites named in `harness` (lm-eval's own results go into
  raw[name])."""
  out = {}
  if suites:
    out.update(_evaluate_core(role, path, config, mesh, rules, factory, suites,
                              num_samples=num_samples))
  for name in harness:
    harness_lib = _harness()
    logging.info("%s: lm-eval suite %s (%s)", role, name,
                 config.suites[name].tasks)
    scores, res = harness_lib.evaluate_suite(
        path, config.suites[name], dtype=config.get("dtype"),
        seed=int(config.seed), system=config.get("system"))
    out.update({f"{name}/{k}": v for k, v in scores.items()})
    if raw is not None:
      raw[name] = res
  return out


def _evaluate_core(role, path, config, mesh, rules, factory, suites, *,
                   num_samples):
  s = config.sampler
  cfg, params, tokenizer, eos = load_model(path, config, mesh, rules)
  logging.info("%s: %s (%s, %d layers, dtype %s)", role, path, cfg.family,
               cfg.num_hidden_layers, cfg.dtype)
  gen = factory(role, cfg, params, tokenizer, eos)
  return core.evaluate_suites(
      gen, tokenizer, suites, greedy=bool(s.greedy), num_samples=num_samples,
      temperature=float(s.temperature), ks=tuple(s.ks),
      batch_size=int(s.batch_size), seed=int(config.seed),
      max_prompt_len=int(s.max_prompt_len), prompt_bucket=s.get("prompt_bucket"),
      system=config.get("system"), progress=bool(config.get("progress", True)),
      single_temperature=s.get("single_temperature"),
      per_suite=_per_suite(config, suites), language=config.get("language"))


def baseline_plan(config, names) -> tuple[tuple[str, ...], int]:
  """(suites, samples per problem for pass@k) the baseline is evaluated on,
  of the evaluated suites `names`: the OOD ones unless
  forgetting.baseline_suites says all; no pass@k samples unless
  forgetting.baseline_samples."""
  f = config.forgetting
  ood = tuple(config.get("ood") or ())
  chosen = ood if f.baseline_suites == "ood" else tuple(names)
  return chosen, int(config.sampler.num_samples) if f.baseline_samples else 0


def run(config, checkpoint: str, baseline: str | None = None,
        out: str | None = None, *, generator_factory=None,
        before: dict | None = None, before_raw: dict | None = None) -> dict:
  """Evaluates `checkpoint` (and compares with `baseline`); returns the result.

  `before`: the baseline's scores from an earlier run of the same config
  and baseline (its metrics' 'baseline/...' entries, prefix removed), reused
  instead of evaluating the baseline again (the sweep's trajectory: one
  baseline for every checkpoint of a run; sweep/baselines.py: one for every
  arm with the same baseline and config); sparsity is still measured.
  `before_raw`: with `before`, lm-eval's own results of its harness suites
  ({suite: results}), kept in the result's 'lmeval' entry as if evaluated.
  `generator_factory(role, cfg, params, tokenizer, eos_ids) -> generator`
  (role 'checkpoint' or 'baseline') replaces the rollout sampler; tests use it
  to feed known completions through the whole command.
  """
  t0 = time.time()
  names = check_config(config)
  revisions = {"checkpoint": revision_of(checkpoint),
               "baseline": revision_of(baseline)}
  if out:  # before any download
    cli.check_out_file(out, "--out", gs_ok=True)
  # gs:// ones are read from their local mirrors (models.hub.checkpoint_dir)
  checkpoint = resolve_checkpoint(checkpoint, "--checkpoint")
  baseline = resolve_checkpoint(baseline, "--baseline") if baseline else None
  for flag, path in (("--checkpoint", checkpoint), ("--baseline", baseline)):
    if path:
      check_positions(config, models.checkpoint.read_config(path), flag)
  harness = suites_lib.harness_names(config, names)
  if harness:  # before any weights load
    try:
      harness_lib = _harness()
    except ImportError as e:
      raise ImportError(f"config.suites.{harness[0]}: {e}") from None
    for name in harness:
      harness_lib.check_tasks(name, config.suites[name])
  suites = suites_lib.load_suites(config, names)
  mesh = sharding.make_mesh(dict(config.mesh)) if config.get("mesh") else None
  rules = sharding.rules_from_config(config)
  factory = generator_factory or _rollout_factory(config, mesh, rules)
  groups = {"id": tuple(config.get("in_distribution") or ()),
            "harder": tuple(config.get("harder") or ()),
            "ood": tuple(config.get("ood") or ())}
  result = {"checkpoint": checkpoint, "baseline": baseline,
            "revisions": {k: v for k, v in revisions.items() if v},
            "suites": {n: {"group": next((g for g, m in groups.items() if n in m),
                                         "other"),
                           "kind": config.suites[n].kind} for n in names},
            "forgetting_metric": config.forgetting.metric, "sparsity": None}
  raw = {"checkpoint": {}, "baseline": {}}  # lm-eval's results, harness suites

  flat = {}
  if baseline:
    # Cheap next to evaluation, and it checks that the two models match.
    sp = sparsity.update_sparsity_from_checkpoints(
        baseline, checkpoint, taus=tuple(config.sparsity.taus),
        atol=float(config.sparsity.atol),
        seen=seen_lib.read_seen(checkpoint))  # a training run's export has it
    flat.update(sparsity.metrics_from_result(sp))
    result["sparsity"] = {k: sp[k] for k in (
        "taus", "atol", "former_dtypes", "columns", "stored_dtype")}
    result["sparsity"]["kinds"] = list(sp["per_kind"])

  s = config.sampler
  flat.update(_evaluate("checkpoint", checkpoint, config, mesh, rules, factory,
                        suites, num_samples=int(s.num_samples),
                        harness=harness, raw=raw["checkpoint"]))
  flat.update(report.group_means(flat, groups))
  if baseline:
    base_names, base_samples = baseline_plan(config, names)
    if not groups["ood"]:
      logging.warning("config.ood is empty: no forgetting figures")
    if base_names:
      f = config.forgetting
      if before is None:
        before = _evaluate("baseline", baseline, config, mesh, rules, factory,
                           {n: suites[n] for n in base_names if n in suites},
                           num_samples=base_samples,
                           harness=suites_lib.harness_names(config, base_names),
                           raw=raw["baseline"])
      elif before_raw:
        raw["baseline"].update(before_raw)
      flat.update({f"baseline/{k}": v for k, v in before.items()})
      if groups["ood"]:
        # A harness suite's score is its tasks' mean (the paper's forgetting
        # is the drop of its seven benchmarks' mean).
        metric = {n: "score" if n in harness else f.metric
                  for n in groups["ood"]}
        flat.update(report.forgetting_metrics(flat, before, groups["ood"],
                                              metric))
  result["metrics"] = flat
  if harness:
    result["lmeval"] = {k: v for k, v in raw.items() if v}
  result["config"] = json.loads(json.dumps(config.to_dict(), default=str))
  result["elapsed_s"] = time.time() - t0
  if out and jax.process_index() == 0:  # every process has the same result
    # whole or absent (gs://: one upload)
    storage.write_text(out, json.dumps(result, indent=2, sort_keys=True))
  return result


def compile_for(config, checkpoint: str, slice_name: str) -> dict:
  """--compile_only: the evaluation's programs compiled for a TPU slice on
  this host, from the checkpoint's config.json (or a preset name) without
  weights -> compile_only's report."""
  check_config(config, runnable=False)
  target = compile_only.target(slice_name)
  mesh = programs.mesh_of(config, target.devices)
  rules = sharding.rules_from_config(config)
  cfg, vocab = programs.model_config(checkpoint, config.get("dtype"))
  with sharding.compiling_for(target.chip.platform):
    return compile_only.compile_programs(
        programs.eval_programs(config, cfg, vocab, mesh, rules), target)


def main(argv):
  del argv
  f = flags.FLAGS
  if f.compile_only:
    rep = compile_for(f.config, f.checkpoint, f.compile_only)
    compile_only.emit(rep, f.json)
    compile_only.check(rep, advice=functools.partial(programs.advice, f.config))
    return
  distributed.initialize_from_flags(f)
  result = run(f.config, f.checkpoint, f.baseline, f.out)
  if jax.process_index() == 0:
    print(report.format_report(result))
  sys.stdout.flush()


def define_flags():
  config_flags.DEFINE_config_file(
      "config", None, "Eval config file (configs/eval.py[:arg]).",
      lock_config=True)
  flags.DEFINE_string("checkpoint", None,
                      "Hugging Face dir or hub name org/name[@revision], or a "
                      "training workdir (uses hf_student/).")
  flags.DEFINE_string("baseline", None,
                      "The student before training: forgetting and sparsity.")
  flags.DEFINE_string("out", None, "Write the results JSON here.")
  distributed.define_flags()
  compile_only.define_flags()
  flags.mark_flags_as_required(["config", "checkpoint"])
