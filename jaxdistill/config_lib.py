"""Config helpers: parsing `file.py:key=value,flag` args and validating configs.

Configs are ml-collections ConfigDicts built by `get_config(arg)` in one file
per experiment (configs/). The arg string after the colon selects sweepable
settings, e.g. `configs/distill.py:kl=reverse,policy=student,lr=5e-5,runlocal`.
"""
from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import math
import os
import re
import string

import ml_collections

from jaxdistill import choices

# Where a relative config path falls back to, so commands work from any cwd:
# the checkout jaxdistill runs from (pip install -e), whose configs/ sit beside
# the package, and the package itself, where a regular install (a wheel, `pip
# install git+URL` on Colab) puts the same files as jaxdistill/configs/
# (setup.py's package_dir).
PROJECT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

# The loss kinds, estimators, reductions and top-k variants are
# jaxdistill.choices' (those jaxdistill.losses implements); the rollout
# policies jaxdistill.rollout's, plus 'dataset' (train on the data's own text:
# no rollout).
POLICIES = choices.ROLLOUT_POLICIES + ("dataset",)
SCHEDULES = ("constant", "cosine")


def find_config(path: str) -> str:
  """A config file's path: as given if it exists (absolute, or relative to the
  working directory), else relative to PROJECT_DIR (`configs/distill.py`
  works from anywhere), else relative to PACKAGE_DIR (installed copies).
  Raises FileNotFoundError saying where it looked."""
  given = os.path.expanduser(path)
  if os.path.isfile(given):
    return given
  fallbacks = [] if os.path.isabs(given) else [
      os.path.join(root, given) for root in (PROJECT_DIR, PACKAGE_DIR)]
  for fallback in fallbacks:
    if os.path.isfile(fallback):
      return fallback
  where = " and ".join([os.path.abspath(given)] + fallbacks)
  raise FileNotFoundError(
      f"config file {path!r} not found (looked for {where}); the project's "
      f"own configs are named like 'configs/distill.py'")


def load_config(spec: str):
  """`path/to/config.py[:arg]` -> get_config(arg), like --config does; a
  relative path missing from the working directory is taken from the
  project's own (find_config). An argument the config does not read is a
  ValueError naming it (Args)."""
  path, _, arg = spec.partition(":")
  full = find_config(path)
  name = "_jd_config_" + re.sub(r"\W", "_", os.path.abspath(full))
  mod_spec = importlib.util.spec_from_file_location(name, full)
  module = importlib.util.module_from_spec(mod_spec)
  mod_spec.loader.exec_module(module)
  with checking_args(path):
    return module.get_config(arg or None)


class Args:
  """A config's arguments (`configs/x.py:a=1,flag`), read as attributes.

  It records which arguments were given and which the config read: inside
  `checking_args` (load_config, and the --config flag through
  cli.parse_flags) an argument given but never read is an error naming it.
  An argument given is always applied: a variant such as `runlocal` changes
  only the defaults of the arguments not given (`given_or`).
  """

  def __init__(self, values: dict, given: dict):
    self._values, self._given, self._read = dict(values), dict(given), set()

  def __getattr__(self, key):
    if key.startswith("_"):
      raise AttributeError(key)
    if key not in self._values:
      raise AttributeError(f"config arg: no argument {key!r}")
    self._read.add(key)
    return self._values[key]

  def __contains__(self, key) -> bool:
    return key in self._values

  def given(self, key: str) -> bool:
    """Whether `key` was given after the colon."""
    getattr(self, key)
    return key in self._given

  def given_or(self, key: str, default):
    """The value given for `key`, else `default` (a variant's default)."""
    return getattr(self, key) if self.given(key) else default

  def refuse(self, key: str, why: str) -> None:
    """Raises, naming `key`, if it was given: `why` says it cannot apply."""
    if self.given(key):
      raise ValueError(f"config arg {key}={self._given[key]}: {why}")

  def unused(self) -> list[str]:
    """'key=value' of every argument given but never read."""
    return [f"{k}={v}" for k, v in self._given.items() if k not in self._read]


# A stack: the Args parsed while each config on it is being built.
_CHECKING: list[list[Args]] = []


@contextlib.contextmanager
def checking_args(where: str):
  """Refuses, after the body, any argument a config built inside was given
  but never read (ValueError naming it and `where`)."""
  parsed = []
  _CHECKING.append(parsed)
  try:
    yield
  finally:
    _CHECKING.remove(parsed)
  for args in parsed:
    unused = args.unused()
    if unused:
      raise ValueError(f"config arg {unused[0]}: {where} does not use it"
                       + (f" (nor {', '.join(unused[1:])})" if unused[1:]
                          else ""))


def parse_arg(arg: str | None, **defaults) -> Args:
  """Parses 'a=1,b=x,flag' into Args over `defaults`.

  A bare key sets a boolean to True. Values are parsed as Python literals when
  possible, else kept as strings. Unknown keys raise ValueError.
  """
  out = ml_collections.ConfigDict(defaults)
  given = {}
  for item in (arg or "").split(","):
    item = item.strip()
    if not item:
      continue
    key, sep, value = item.partition("=")
    key = key.strip()
    if key not in defaults:
      raise ValueError(
          f"config arg: unknown key {key!r}; known keys: {sorted(defaults)}")
    given[key] = value if sep else "True"
    if not sep:
      out[key] = True
      continue
    try:
      parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      parsed = value
    default = defaults[key]
    if isinstance(default, str) and not isinstance(parsed, str):
      parsed = value  # 'lrs=1e-3' is the text 1e-3
    elif isinstance(default, float) and not isinstance(parsed, bool):
      try:
        parsed = float(parsed)  # also 'inf', 'nan': refused by name later
      except (TypeError, ValueError):
        pass
    try:
      out[key] = parsed
    except TypeError:
      raise ValueError(f"config arg {key}={value}: expected a "
                       f"{type(default).__name__}") from None
  args = Args({k: out[k] for k in defaults}, given)
  if _CHECKING:
    _CHECKING[-1].append(args)
  return args


def _err(field: str, msg: str):
  raise ValueError(f"config.{field}: {msg}")


def temperatures(config) -> tuple[float, float]:
  """(student, teacher) temperatures of a training config: config.student.
  temperature and config.teacher.temperature (1.0 where a config names none)."""
  out = []
  for name in ("student", "teacher"):
    node = config.get(name) or {}
    t = node.get("temperature", 1.0)
    try:
      t = float(t)
    except (TypeError, ValueError):
      _err(f"{name}.temperature", f"must be a number > 0, got {t!r}")
    if not 0 < t < float("inf"):
      _err(f"{name}.temperature", f"must be > 0 and finite, got {t}")
    out.append(t)
  return out[0], out[1]


def rollout_temperatures(config) -> tuple[float, float]:
  """(student, teacher) temperatures the rollouts sample at: the models' own
  (`temperatures`), or rollout.spectrum_temperature for both under
  policy='spectrum' when it is set (the paper's spectrum runs: 1.0), or else
  rollout.student_temperature / rollout.teacher_temperature where set (the
  paper's temperature ablation, App. A.12: generation only, the loss keeps
  the models' own)."""
  ro = config.rollout
  t = ro.get("spectrum_temperature")
  if ro.get("policy") == "spectrum" and t is not None:
    if not 0 < float(t) < float("inf"):
      _err("rollout.spectrum_temperature", f"must be > 0 and finite, got {t}")
    return float(t), float(t)
  out = list(temperatures(config))
  for i, name in enumerate(("student", "teacher")):
    t = ro.get(f"{name}_temperature")
    if t is not None:
      if not 0 < float(t) < float("inf"):
        _err(f"rollout.{name}_temperature", f"must be > 0 and finite, got {t}")
      out[i] = float(t)
  return out[0], out[1]


def check_teacher_prompt(template) -> None:
  """ValueError unless `template` (data.teacher_prompt) is a format string
  naming {prompt} (jaxdistill.data.pipeline.teacher_prompt_text)."""
  if not isinstance(template, str) or not template.strip():
    _err("data.teacher_prompt", f"must be a non-empty format string or None, "
         f"got {template!r}")
  try:
    names = {f for _, f, _, _ in string.Formatter().parse(template) if f}
  except ValueError as e:
    _err("data.teacher_prompt", f"not a format string ({e}); write literal "
         "braces as {{ and }}")
  if "prompt" not in names:
    _err("data.teacher_prompt", "must contain {prompt} (the task text the "
         "student sees): the teacher answers the same task")


def teacher_prompt_len(config) -> int | None:
  """The teacher's prompt width when it has a prompt of its own
  (data.teacher_prompt): data.max_teacher_prompt_len, else
  data.max_prompt_len; None without one."""
  d = config.data
  if d.get("teacher_prompt") is None:
    return None
  return int(d.get("max_teacher_prompt_len") or d.max_prompt_len)


def _check_teacher_prompt(config) -> None:
  """data.teacher_prompt and what it cannot be combined with."""
  d = config.data
  if d.get("teacher_prompt") is None:
    if d.get("teacher_system") is not None:
      _err("data.teacher_system", "the system message of the teacher's own "
           "prompt: only used with data.teacher_prompt (set it, or "
           "teacher_system None)")
    return
  check_teacher_prompt(d.teacher_prompt)
  if d.get("task") == "synthetic":
    _err("data.teacher_prompt", "synthetic prompts are token ids, not text: "
         "use a text task (countdown, mcq, records) or set it to None")
  if config.rollout.policy == "dataset":
    _err("data.teacher_prompt", "not supported with rollout.policy='dataset' "
         "(set it to None)")
  if config.loss.get("teacher_cache") is not None:
    _err("data.teacher_prompt", "not supported with loss.teacher_cache (the "
         "cache holds the teacher under the student's prompt)")
  n = d.get("max_teacher_prompt_len")
  if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
    _err("data.max_teacher_prompt_len", f"must be an int >= 1 or None, got {n!r}")


def check_decode_layout(value, field: str) -> None:
  """`field` (rollout.decode_layout, sampler.decode_layout): None or one of
  choices.DECODE_LAYOUTS."""
  if value is not None and value not in choices.DECODE_LAYOUTS:
    _err(field, f"expected one of {choices.DECODE_LAYOUTS} (None: 'auto'), "
         f"got {value!r}")


def _check_sampled_rollout(loss, ro) -> None:
  """The estimators on the rollout's own tokens assume y ~ softmax(z / tau_S)
  over the full vocabulary (reweighted from the teacher or the policy when it
  is not the student): refuse rollouts drawn from anything else. The paper's
  fresh-token estimators draw their own tokens: any rollout will do."""
  if loss.estimator in choices.FRESH_ESTIMATORS:
    return
  if ro.policy == "dataset":
    _err("rollout.policy", "loss.kind='sampled' needs tokens sampled from the "
         "student, the teacher or their mixture (importance weights q/b); "
         "policy='dataset' text has no known sampling distribution: use an "
         "exact loss (loss.kind='forward'/'reverse'/'jsd') or another policy")
  if ro.get("top_k") is not None:
    _err("rollout.top_k", f"{ro.top_k}: with loss.kind='sampled' the "
         "estimators assume sampling over the full vocabulary at "
         "the models' temperatures; set rollout.top_k=None")
  if ro.get("top_p") is not None and float(ro.top_p) < 1.0:
    _err("rollout.top_p", f"{ro.top_p}: with loss.kind='sampled' the "
         "estimators assume sampling over the full vocabulary at "
         "the models' temperatures; set rollout.top_p=None (or 1.0)")


def _check_topk(loss, ro) -> None:
  """loss.teacher_topk (None = the full teacher, or k), loss.topk_variant and
  loss.teacher_cache (a directory written by jaxdistill.train.teacher_cache)."""
  k = loss.get("teacher_topk")
  cache = loss.get("teacher_cache")
  if k is not None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
      _err("loss.teacher_topk", f"must be None (the full teacher) or an "
           f"integer >= 1, got {k!r}")
    if loss.kind not in choices.KINDS:
      _err("loss.teacher_topk", f"applies to the exact losses (forward, "
           f"reverse, jsd), not loss.kind={loss.kind!r}; set it to None")
  if loss.get("topk_variant", "renorm") not in choices.TOPK_VARIANTS:
    _err("loss.topk_variant", f"unknown {loss.topk_variant!r}; choose from "
         f"{choices.TOPK_VARIANTS}")
  if cache is not None:
    if not str(cache).strip():
      _err("loss.teacher_cache", "empty: set a cache directory (python -m "
           "jaxdistill.train.teacher_cache --out DIR), or None for the live "
           "teacher")
    if k is None:
      _err("loss.teacher_cache", "a cache holds the teacher's top-k: set "
           "loss.teacher_topk to its k (or set teacher_cache=None)")
    if ro.policy not in ("teacher", "dataset"):
      _err("loss.teacher_cache", "only rollouts that do not depend on the "
           "student can be cached (rollout.policy 'teacher' or 'dataset'), "
           f"got {ro.policy!r}")


def check_trained_dtypes(config) -> None:
  """The model a run trains (config.student) in float16 is refused: nothing
  here scales the loss, and its gradients overflowed to inf on every step
  until an unrelated check failed at the end of the run."""
  student = config.get("student") or {}
  for f in ("dtype", "param_dtype"):
    if str(student.get(f) or "") == "float16":
      _err(f"student.{f}", "float16 trains without loss scaling here (its "
           "gradients overflow to inf): use bfloat16, float16's memory with "
           "float32's range, or float32")


def validate(config) -> None:
  """Checks a training config before any compute; raises naming the field."""
  loss = config.loss
  if loss.kind not in choices.LOSS_KINDS:
    _err("loss.kind", f"unknown loss {loss.kind!r}; choose from "
         f"{choices.LOSS_KINDS}")
  # Every divergence's loss function checks beta, whatever the kind: refused
  # here, not after the models are built and the workdir written.
  if loss.kind != choices.CE and not 0.0 <= _number(config, "loss.beta") <= 1.0:
    _err("loss.beta", f"must be in [0, 1], got {loss.beta}")
  if loss.kind == choices.SAMPLED and loss.estimator not in choices.ESTIMATORS:
    _err("loss.estimator", f"unknown estimator {loss.estimator!r}; choose "
         f"from {choices.ESTIMATORS}")
  if loss.reduction not in choices.REDUCTIONS:
    _err("loss.reduction", f"reduction must be one of {choices.REDUCTIONS}, "
         f"got {loss.reduction!r}")
  if "temperature" in loss:
    _err("loss.temperature", "the temperatures are each model's own: set "
         "student.temperature and teacher.temperature")
  if "temperature" in config.rollout:
    _err("rollout.temperature", "rollouts sample each model at its own "
         "temperature: set student.temperature and teacher.temperature")
  rollout_temperatures(config)
  _check_topk(loss, config.rollout)
  check_trained_dtypes(config)
  lora = config.student.get("lora") if "student" in config else None
  if lora is not None and not lora.get("rank") and lora.get("base_quant"):
    # (models/lora.py refuses it too, for code that builds a LoraConfig.)
    _err("student.lora.base_quant", f"{lora.base_quant!r} holds the frozen "
         "base of a LoRA run: set student.lora.rank too (or base_quant None); "
         "without adapters the whole model would train unquantised")

  ro = config.rollout
  if ro.policy not in POLICIES:
    _err("rollout.policy", f"unknown policy {ro.policy!r}; choose from {POLICIES}")
  if loss.kind == choices.CE and ro.policy != "dataset":
    _err("rollout.policy", "loss.kind='ce' (supervised fine-tuning) trains on "
         f"fixed sequences: use policy='dataset', got {ro.policy!r}")
  if ro.policy == "coin_mixture":
    if ro.lam is None or not 0.0 <= float(ro.lam) <= 1.0:
      _err("rollout.lam", f"must be in [0, 1] for policy='coin_mixture' (the "
           f"probability of a student token), got {ro.lam}")
  if ro.policy == "spectrum":
    if ro.lam is None or not -2.0 <= float(ro.lam) <= 2.0:
      _err("rollout.lam", f"must be in [-2, 2] for policy='spectrum' (the "
           f"paper's lambda: -1 teacher, +1 student), got {ro.lam}")
    if ro.get("top_k") is not None or (ro.get("top_p") is not None
                                       and float(ro.top_p) < 1.0):
      _err("rollout.top_p", "policy='spectrum' samples pi_lambda over the "
           "whole vocabulary (the paper: top-p 1.0): set rollout.top_k and "
           "rollout.top_p to None")
  if ro.policy != "dataset" and int(ro.max_new_tokens) <= 0:
    _err("rollout.max_new_tokens", f"must be > 0, got {ro.max_new_tokens}")
  check_decode_layout(ro.get("decode_layout"), "rollout.decode_layout")
  if loss.kind == choices.SAMPLED:
    _check_sampled_rollout(loss, ro)
    if (loss.estimator not in choices.FRESH_ESTIMATORS
        and rollout_temperatures(config) != temperatures(config)):
      _err("rollout.student_temperature", "the estimators on the rollout's "
           "own tokens assume it was sampled at the loss temperatures: leave "
           "rollout.student_temperature / teacher_temperature None, or use "
           "estimator 'fresh_forward' / 'fresh_reverse'")
  _check_teacher_prompt(config)

  opt = config.optim
  if not float(opt.lr) > 0:
    _err("optim.lr", f"must be > 0, got {opt.lr}")
  if opt.schedule not in SCHEDULES:
    _err("optim.schedule", f"unknown {opt.schedule!r}; choose from {SCHEDULES}")
  if opt.clip_norm is not None and not float(opt.clip_norm) > 0:
    _err("optim.clip_norm", f"must be > 0 or None, got {opt.clip_norm}")
  if int(opt.grad_accum) < 1:
    _err("optim.grad_accum", f"must be >= 1, got {opt.grad_accum}")
  if int(config.data.batch_size) % int(opt.grad_accum):
    _err("optim.grad_accum", f"must divide data.batch_size={config.data.batch_size}")
  if int(opt.warmup_steps) < 0:
    _err("optim.warmup_steps", f"must be >= 0, got {opt.warmup_steps}")
  if int(config.total_steps) < 1:
    _err("total_steps", f"must be >= 1, got {config.total_steps}")


def to_json(config) -> str:
  return json.dumps(config.to_dict(), indent=2, sort_keys=True, default=str)


def diff(a: dict, b: dict, prefix: str = "") -> list[str]:
  """Lists the dotted keys whose values differ between two nested dicts."""
  out = []
  for k in sorted(set(a) | set(b)):
    key = f"{prefix}{k}"
    va, vb = a.get(k, "<missing>"), b.get(k, "<missing>")
    if isinstance(va, dict) and isinstance(vb, dict):
      out += diff(va, vb, key + ".")
    elif va != vb:
      out.append(f"{key}: {va!r} -> {vb!r}")
  return out


# --- Run-level checks shared by train, rl.train and the sweep (issue 20). ---
# Kept apart from validate() so that loss/rollout checks can grow there
# independently.

DATA_TASKS = ("synthetic", "countdown", "mcq", "math", "records")


def _number(config, field: str):
  node = config
  for part in field.split("."):
    node = node[part]
  try:
    return float(node)
  except (TypeError, ValueError):
    _err(field, f"must be a number, got {node!r}")


def check_finite(config, prefix: str = "config") -> None:
  """Refuses a NaN or infinite number anywhere in `config` (lr=inf would
  otherwise surface as a NaN loss), naming its field."""
  if isinstance(config, (dict, ml_collections.ConfigDict)):
    for k in config.keys():
      check_finite(config[k], f"{prefix}.{k}")
  elif isinstance(config, (list, tuple)):
    for i, v in enumerate(config):
      check_finite(v, f"{prefix}[{i}]")
  elif isinstance(config, float) and not math.isfinite(config):
    raise ValueError(f"{prefix}: must be a finite number, got {config}")


def check_fits(config, model_configs: dict, vocab: int | None = None) -> None:
  """What the models' config.json decides, checked before any weights load:
  loss.teacher_topk within the real vocabulary `vocab`, and the sequence
  width data.max_prompt_len + rollout.max_new_tokens within every model's
  max_position_embeddings. `model_configs`: {name: ModelConfig}."""
  k = config.get("loss", {}).get("teacher_topk")
  if k is not None and vocab is not None and int(k) > int(vocab):
    _err("loss.teacher_topk", f"{k} exceeds the real vocabulary ({vocab})")
  new = int(config.rollout.max_new_tokens)
  for name, cfg in model_configs.items():
    limit = getattr(cfg, "max_position_embeddings", None)
    field, prompt = "data.max_prompt_len", int(config.data.max_prompt_len)
    if name == "teacher" and teacher_prompt_len(config) is not None:
      field, prompt = "data.max_teacher_prompt_len", teacher_prompt_len(config)
    if limit is not None and prompt + new > int(limit):
      _err("rollout.max_new_tokens",
           f"{field} {prompt} + rollout.max_new_tokens {new} = "
           f"{prompt + new} positions exceed the {name}'s "
           f"max_position_embeddings {limit}")


def validate_run(config, mesh=None, rules=None) -> None:
  """Values that would otherwise be accepted silently or fail only after the
  first step: intervals, checkpoint retention, optimizer constants, the data
  task, and (given the mesh and the run's rules, sharding.rules_from_config)
  the batch's split over the data axes. Every number must be finite.
  """
  check_finite(config)
  for field in ("ckpt_every", "eval_every", "log_every", "keep_ckpts"):
    if field in config:
      v = config[field]
      if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        _err(field, f"must be an integer >= 1, got {v!r}")
  v = config.get("export_every")
  if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
    _err("export_every", f"must be an integer >= 0 (0: off), got {v!r}")
  opt = config.optim
  for field in ("b1", "b2"):
    if field in opt:
      v = _number(config, f"optim.{field}")
      if not 0.0 <= v < 1.0:
        _err(f"optim.{field}", f"must be in [0, 1), got {v}")
  for field in ("eps", "weight_decay"):
    if field in opt and not _number(config, f"optim.{field}") >= 0.0:
      _err(f"optim.{field}", f"must be >= 0, got {opt[field]}")
  if "final_lr_frac" in opt:
    v = _number(config, "optim.final_lr_frac")
    if not 0.0 <= v <= 1.0:
      _err("optim.final_lr_frac", f"must be in [0, 1], got {v}")
  if opt.get("moment_dtype") not in choices.MOMENT_DTYPES:
    _err("optim.moment_dtype", f"unknown {opt.moment_dtype!r}; choose from "
         f"{choices.MOMENT_DTYPES}")
  if opt.get("clip_norm") is not None:
    if not _number(config, "optim.clip_norm") > 0:
      _err("optim.clip_norm", f"must be > 0 or None, got {opt.clip_norm}")
  if "loss" in config and config.loss.get("iw_clip") is not None:
    if not _number(config, "loss.iw_clip") > 0:
      _err("loss.iw_clip", "must be > 0 (a cap on the importance weights) or "
           f"None, got {config.loss.iw_clip}")
  task = config.data.get("task")
  if task not in DATA_TASKS:
    _err("data.task", f"unknown task {task!r}; choose from {DATA_TASKS}")
  b = config.data.get("batch_size")
  if isinstance(b, bool) or not isinstance(b, int) or b < 1:
    _err("data.batch_size", f"must be an integer >= 1, got {b!r}")
  k = config.data.get("bucket")
  if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
    _err("data.bucket", f"must be an integer >= 1 or None, got {k!r}")
  if mesh is not None:
    if rules is None:
      raise ValueError("validate_run: pass the run's rules with the mesh")
    axes = dict(rules).get("batch") or ()
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    n = 1
    for a in axes:
      n *= int(mesh.shape.get(a, 1))
    if b % n:
      _err("data.batch_size", f"{b} is not divisible by the {n} devices of "
           f"the mesh's data axes {dict((a, mesh.shape[a]) for a in axes)}")


# The seven projections LoRA adapts (jaxdistill/models/lora.py).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                "down_proj")


def lora_block(rank: int | None = None, alpha: float = 256.0) -> dict:
  """config.student.lora: rank None (or 0) trains the model itself; a rank r
  trains LoRA adapters of that rank on the frozen model (scale alpha / r) on
  `targets`, in `dtype`; `base_quant` 'nf4' stores the frozen model in 4 bits
  (QLoRA, models/quant.py) (docs/training.md, "LoRA"). The paper: 256 / 256,
  on a 4-bit base for its GRPO stages."""
  return dict(rank=ml_collections.config_dict.placeholder(int) if rank is None
              # A tuple: ml_collections' flags cannot override a list field
              # (--config.student.lora.targets=q_proj,v_proj, or one
              # flag per name, repeated).
              else rank, alpha=float(alpha), targets=LORA_TARGETS,
              dtype="float32",
              base_quant=ml_collections.config_dict.placeholder(str))


def without_lora_off(config: dict) -> dict:
  """A config dict (JSON) without its student.lora block when LoRA is off:
  so that a workdir written before the block existed compares equal."""
  student = config.get("student")
  if isinstance(student, dict) and isinstance(student.get("lora"), dict) and \
      not student["lora"].get("rank"):
    config = {**config, "student": {k: v for k, v in student.items()
                                    if k != "lora"}}
  return config
