"""The demo's settings checked before anything is built or written.

`check_config(cfg)` raises ValueError naming the field (`config.grid.lrs:
...`) for any value that would otherwise fail after minutes of training, or
be accepted and give a meaningless run (a negative learning rate trains
towards higher loss without a word).
"""
from __future__ import annotations

import math

from jaxdistill import losses
from jaxdistill import models
from jaxdistill import sparsity
from jaxdistill.data import tokenizer as tok_lib
from jaxdistill.demo import build
from jaxdistill.demo import tasks as demo_tasks
from jaxdistill.sweep import table

PRECISIONS = build.PRECISIONS


def _err(field: str, msg: str):
  raise ValueError(f"config.{field}: {msg}")


def _get(cfg, field: str):
  node = cfg
  for part in field.split("."):
    node = node[part]
  return node


def _int(cfg, field: str, lo: int = 1):
  v = _get(cfg, field)
  if isinstance(v, bool) or not isinstance(v, int) or v < lo:
    _err(field, f"must be an integer >= {lo}, got {v!r}")
  return v


def _number(cfg, field: str, lo: float = 0.0, hi: float = math.inf,
            open_lo: bool = True):
  """A finite number in (lo, hi] (open_lo) or [lo, hi]."""
  v = _get(cfg, field)
  ok = (not isinstance(v, bool) and isinstance(v, (int, float)) and
        math.isfinite(v) and (v > lo if open_lo else v >= lo) and v <= hi)
  if not ok:
    where = f"{'(' if open_lo else '['}{lo:g}, {hi:g}]"
    _err(field, f"must be a finite number in {where}, got {v!r}")
  return float(v)


def check_config(cfg) -> None:
  """Every setting of configs/demo.py that can be checked from the config."""
  _int(cfg, "seed", 0)
  _int(cfg, "seeds")
  # The byte alphabet and the special tokens come first (train_bpe_tokenizer).
  _int(cfg, "vocab_size", 256 + len(tok_lib.SPECIAL_TOKENS) + 1)
  for f in ("batch_size", "max_prompt_len", "max_new_tokens"):
    _int(cfg, f)
  if cfg.max_prompt_len + cfg.max_new_tokens > build.MAX_POSITIONS:
    _err("max_new_tokens", f"max_prompt_len + max_new_tokens = "
         f"{cfg.max_prompt_len + cfg.max_new_tokens} exceeds the models' "
         f"{build.MAX_POSITIONS} positions")
  for f in ("arith_train", "addition_train", "distill_prompts", "id_test",
            "harder_test", "addition_test"):
    _int(cfg, f"data.{f}")
  _int(cfg, "data.data_seed", 0)
  facts = (demo_tasks.ADD_RANGE[1] - demo_tasks.ADD_RANGE[0] + 1) ** 2
  if cfg.data.addition_test > facts:
    _err("data.addition_test", f"only {facts} addition facts to test, got "
         f"{cfg.data.addition_test}")
  for name in ("teacher", "student"):
    _int(cfg, f"{name}.steps")
    _number(cfg, f"{name}.lr")
    _number(cfg, f"{name}.warmup", 0.0, 1.0, open_lo=False)
    try:
      models.ModelConfig(**dict(cfg[name].arch, vocab_size=cfg.vocab_size))
    except (TypeError, ValueError) as e:
      _err(f"{name}.arch", str(e))
  for f in ("arith_share", "id_share"):
    _number(cfg, f"student.{f}", 0.0, 1.0, open_lo=False)

  g = cfg.grid
  if not g.kl or any(k not in losses.KINDS for k in g.kl):
    _err("grid.kl", f"a non-empty tuple of {losses.KINDS}, got {g.kl!r}")
  names = [p[0] for p in g.policy] if all(
      isinstance(p, (tuple, list)) and len(p) == 2 for p in g.policy) else None
  if not names or len(set(names)) != len(names):
    _err("grid.policy", "a non-empty tuple of distinct (name, lambda) pairs, "
         f"got {g.policy!r}")
  for name, lam in g.policy:
    if (isinstance(lam, bool) or not isinstance(lam, (int, float)) or
        not -2.0 <= lam <= 2.0):
      _err("grid.policy", f"{name!r}: lambda must be in [-2, 2] (the paper's "
           f"spectrum: -1 teacher, +1 student), got {lam!r}")
  lrs = tuple(g.lrs)
  if not lrs or any(isinstance(x, bool) or not isinstance(x, (int, float)) or
                    not math.isfinite(x) or x <= 0 for x in lrs):
    _err("grid.lrs", f"learning rates must be finite numbers > 0, got {lrs!r}")
  _int(cfg, "grid.steps")
  _int(cfg, "grid.batch_size")
  precisions = tuple(g.get("precisions", ("float32",)))
  if (not precisions or len(set(precisions)) != len(precisions)
      or any(p not in PRECISIONS for p in precisions)):
    _err("grid.precisions", f"a non-empty tuple of distinct {PRECISIONS}, got "
         f"{precisions!r}")
  _number(cfg, "grid.student_temperature", open_lo=False)
  _number(cfg, "grid.teacher_temperature", open_lo=False)

  e = cfg.eval
  _int(cfg, "eval.num_samples", 0)
  _int(cfg, "eval.batch_size")
  ks = tuple(e.ks)
  if not ks or any(isinstance(k, bool) or not isinstance(k, int) or
                   not 1 <= k <= e.num_samples for k in ks):
    _err("eval.ks", f"pass@k needs 1 <= k <= eval.num_samples="
         f"{e.num_samples}, got {ks!r}")
  _number(cfg, "eval.sparsity_atol", open_lo=False)
  try:
    sparsity.check_taus(e.sparsity_taus, "taus")
  except ValueError as err:
    _err("eval.sparsity_taus", str(err).removeprefix("taus: "))

  r = cfg.rlvr
  if r.enabled:
    for f in ("iterations", "prompts", "minibatches"):
      _int(cfg, f"rlvr.{f}")
    _int(cfg, "rlvr.group_size", 2)  # a group's advantages need 2 samples
    _number(cfg, "rlvr.lr")
    if not g.student_temperature > 0:  # GRPO's ratio needs a distribution
      _err("grid.student_temperature", f"must be > 0 with rlvr (GRPO samples "
           f"at it), got {g.student_temperature}")
    if (r.prompts * r.group_size) % r.minibatches:
      _err("rlvr.minibatches", f"{r.minibatches} does not divide the "
           f"{r.prompts} x {r.group_size} samples of an iteration")
    bad = [p for p in r.per if p not in table.STUDY]
    if bad:
      _err("rlvr.per", f"{bad} are not study factors {table.STUDY}")
