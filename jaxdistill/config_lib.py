"""Config helpers: parsing `file.py:key=value,flag` args and validating configs.

Configs are ml-collections ConfigDicts built by `get_config(arg)` in one file
per experiment (configs/). The arg string after the colon selects sweepable
settings, e.g. `configs/distill.py:kl=reverse,policy=student,lr=5e-5,runlocal`.
"""
from __future__ import annotations

import ast
import json

import ml_collections

LOSS_KINDS = ("forward", "reverse", "jsd", "sampled", "ce")
ESTIMATORS = ("k1", "k2", "k3", "rkl_surrogate")
POLICIES = ("student", "teacher", "mixture", "dataset")
REDUCTIONS = ("token_mean", "sequence_mean", "sequence_sum", "sum")
SCHEDULES = ("constant", "cosine")


def parse_arg(arg: str | None, **defaults):
  """Parses 'a=1,b=x,flag' into a ConfigDict over `defaults`.

  A bare key sets a boolean to True. Values are parsed as Python literals when
  possible, else kept as strings. Unknown keys raise ValueError.
  """
  out = ml_collections.ConfigDict(defaults)
  if not arg:
    return out
  for item in arg.split(","):
    item = item.strip()
    if not item:
      continue
    key, sep, value = item.partition("=")
    key = key.strip()
    if key not in defaults:
      raise ValueError(
          f"config arg: unknown key {key!r}; known keys: {sorted(defaults)}")
    if not sep:
      out[key] = True
      continue
    try:
      parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      parsed = value
    if isinstance(defaults[key], float) and isinstance(parsed, int):
      parsed = float(parsed)
    out[key] = parsed
  return out


def _err(field: str, msg: str):
  raise ValueError(f"config.{field}: {msg}")


def _check_sampled_rollout(loss, ro) -> None:
  """The sampled estimators assume y ~ softmax(z / loss.temperature) over the
  full vocabulary (reweighted from the teacher or the mixture when the policy
  is not the student): refuse rollouts drawn from anything else."""
  if ro.policy == "dataset":
    _err("rollout.policy", "loss.kind='sampled' needs tokens sampled from the "
         "student, the teacher or their mixture (importance weights q/b); "
         "policy='dataset' text has no known sampling distribution: use an "
         "exact loss (loss.kind='forward'/'reverse'/'jsd') or another policy")
  if float(ro.temperature) != float(loss.temperature):
    _err("rollout.temperature", f"{ro.temperature} differs from "
         f"loss.temperature={loss.temperature}: with loss.kind='sampled' the "
         "estimators assume the tokens were drawn at the loss temperature")
  if ro.get("top_k") is not None:
    _err("rollout.top_k", f"{ro.top_k}: with loss.kind='sampled' the "
         "estimators assume sampling over the full vocabulary at "
         "loss.temperature; set rollout.top_k=None")
  if ro.get("top_p") is not None and float(ro.top_p) < 1.0:
    _err("rollout.top_p", f"{ro.top_p}: with loss.kind='sampled' the "
         "estimators assume sampling over the full vocabulary at "
         "loss.temperature; set rollout.top_p=None (or 1.0)")


def validate(config) -> None:
  """Checks a training config before any compute; raises naming the field."""
  loss = config.loss
  if loss.kind not in LOSS_KINDS:
    _err("loss.kind", f"unknown loss {loss.kind!r}; choose from {LOSS_KINDS}")
  if loss.kind == "jsd" and not 0.0 <= float(loss.beta) <= 1.0:
    _err("loss.beta", f"must be in [0, 1], got {loss.beta}")
  if loss.kind == "sampled" and loss.estimator not in ESTIMATORS:
    _err("loss.estimator",
         f"unknown estimator {loss.estimator!r}; choose from {ESTIMATORS}")
  if loss.reduction not in REDUCTIONS:
    _err("loss.reduction", f"unknown {loss.reduction!r}; choose from {REDUCTIONS}")
  if not float(loss.temperature) > 0:
    _err("loss.temperature", f"must be > 0, got {loss.temperature}")

  ro = config.rollout
  if ro.policy not in POLICIES:
    _err("rollout.policy", f"unknown policy {ro.policy!r}; choose from {POLICIES}")
  if loss.kind == "ce" and ro.policy != "dataset":
    _err("rollout.policy", "loss.kind='ce' (supervised fine-tuning) trains on "
         f"fixed sequences: use policy='dataset', got {ro.policy!r}")
  if ro.policy == "mixture":
    if ro.lam is None or not 0.0 <= float(ro.lam) <= 1.0:
      _err("rollout.lam", f"must be in [0, 1] for policy='mixture', got {ro.lam}")
  if ro.policy != "dataset" and int(ro.max_new_tokens) <= 0:
    _err("rollout.max_new_tokens", f"must be > 0, got {ro.max_new_tokens}")
  if float(ro.temperature) < 0:
    _err("rollout.temperature", f"must be >= 0, got {ro.temperature}")
  if loss.kind == "sampled":
    _check_sampled_rollout(loss, ro)

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
