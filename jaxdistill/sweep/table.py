"""Finished runs -> one row per run -> a table per arm (mean, std, n over seeds).

A row is a flat dict: run identity (name, arm), the grid's factor labels, the
study's factors (kl, policy, lam, lr, task, seed, clip, max_new_tokens) and
the metrics below (None when a run has no such figure):

  accuracy        in-distribution accuracy: the paper's one sample at T 0.5
                  (evaluation 'id/single_acc', configs/eval.py's default)
                  where the evaluation has it, else greedy ('id/greedy_acc')
  coverage        in-distribution pass@k at the largest k evaluated
  forgetting_pp   mean accuracy drop on the OOD suites, percentage points (with
                  forgetting=lmeval: the drop of the seven lm-eval benchmarks' mean)
  sparsity_S_1e-6_f32, sparsity_S_1e-8_f32   update sparsity as the paper
                  defines it (App. D.4), whole model: share of parameters
                  with |delta| < tau (strict), compared in float32
                  (evaluation on the stored checkpoints; else the training
                  loop's figure on its float32 weights)
  sparsity_unchanged_1e-5_bf16, sparsity_unchanged_1e-5_f32   the project's
                  former figure: |delta| <= 1e-5 after both are rounded to
                  that dtype
  sparsity_equal_bf16, sparsity_equal_f32   equal after that rounding
                  (IEEE ==, so -0.0 == 0.0)
  sparsity_<kind>_S_1e-6_f32, sparsity_<kind>_S_1e-8_f32   S_tau per layer
                  kind: attention (q, k, v, o and their biases), mlp (gate,
                  up, down), norms (every RMSNorm scale), embeddings
                  (embed_tokens, an untied lm_head), and the embedding rows of
                  tokens the run's training processed (embeddings_seen) and
                  never processed (embeddings_unseen)
  sparsity_embeddings_seen_rows, sparsity_embeddings_unseen_rows   how many
                  token ids those rows are
  sparsity        row field only (figures): sparsity_S_1e-6_f32
  harder_acc      mean accuracy of the harder suites (Countdown-4E, 5/6),
                  single sample or greedy as `accuracy`
  acc/<suite>     accuracy per suite, single sample or greedy as `accuracy`
  lang_<code>     share of the completions (of that same mode, every suite)
                  judged in language <code> (evaluation 'style/M_lang_<code>',
                  config.language: the style transfer, configs/grid_spanish.py)
  tokens_generated, flops   compute of the run (runner.compute_record)

Arms with a finished RLVR stage (study.rlvr) also carry, for each metric m
above that the stage's evaluation gives, `rlvr/m` (after RLVR) and
`rlvr_change/m` (after - before), and `rlvr_rewards` (mean reward of each
GRPO iteration, for the figures).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
import csv
import glob
import json
import math
import os

import numpy as np

from jaxdistill import storage

# <arm dir>/rlvr/: where an arm's RLVR stage (sweep/rlvr.py) runs. Defined
# here, below rlvr.py, which builds on this module's rows.
RLVR_DIR = "rlvr"

STUDY = ("kl", "policy", "lam", "lr", "task", "clip", "max_new_tokens",
         "precision")
# Whole-model sparsity/<column> of the evaluation (else of training), as
# sparsity_<column>; jaxdistill/sparsity.py names the columns.
SPARSITY = tuple(f"sparsity_{c}" for c in (
    "S_1e-6_f32", "S_1e-8_f32", "unchanged_1e-5_bf16", "unchanged_1e-5_f32",
    "equal_bf16", "equal_f32"))
# S_tau per layer kind (sparsity.KINDS but 'other'), sparsity/<kind>/<column>
# as sparsity_<kind>_<column>, and the token ids behind the seen / unseen
# embedding rows, sparsity/<kind>/num_rows as sparsity_<kind>_rows.
KINDS = ("attention", "mlp", "norms", "embeddings", "embeddings_seen",
         "embeddings_unseen")
_KIND_KEYS = {f"sparsity_{k}_{c}": f"sparsity/{k}/{c}" for k in KINDS
              for c in ("S_1e-6_f32", "S_1e-8_f32")}
_ROW_KEYS = {f"sparsity_{k}_rows": f"sparsity/{k}/num_rows"
             for k in KINDS[-2:]}
SPARSITY_KINDS = tuple(_KIND_KEYS) + tuple(_ROW_KEYS)
METRICS = ("accuracy", "coverage", "forgetting_pp", *SPARSITY,
           *SPARSITY_KINDS, "harder_acc", "tokens_generated", "flops")


def _pass_at_max_k(ev: Mapping, group: str = "id"):
  ks = [int(k.split("@")[1]) for k in ev if k.startswith(f"{group}/pass@")]
  return ev[f"{group}/pass@{max(ks)}"] if ks else None


_JSON_NAMES = {dict: "object", list: "array", str: "string", int: "number",
               float: "number", bool: "boolean", type(None): "null"}
# What every results.json holds (runner.run_one, run_rlvr_one), by type.
_RESULT_FIELDS = {"name": str, "dirname": str, "factors": dict, "study": dict}
# The study's factors the table, its figures and summarize_arms read, by the
# types they take (runner.study_factors); a factor an older results.json
# lacks is left out of its row, but `seed` groups the seeds of an arm. lam
# is None for one-model policies ('dataset'), clip without clipping.
_NUMBER = (int, float)
_STUDY_FIELDS = {"seed": int, "kl": str, "policy": str, "task": str,
                 "precision": str, "lam": (*_NUMBER, type(None)),
                 "lr": _NUMBER,
                 "clip": (*_NUMBER, type(None)), "max_new_tokens": int}
_NUMBERS = "a list of numbers"


def _json_name(kind) -> str:
  kinds = kind if isinstance(kind, tuple) else (kind,)
  return " or ".join(dict.fromkeys(_JSON_NAMES[k] for k in kinds))


def read_json(path: str, kind: type = dict,
              fix: str = "delete it to redo what wrote it"):
  """The JSON value of `path`, a `kind`; ValueError naming the file if it is
  not valid JSON or not of that kind, ending with `fix` (what to do)."""
  try:
    with storage.open(path) as f:
      value = json.load(f)
  except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
    raise ValueError(f"{path}: not valid JSON ({e}); {fix}") from None
  if not isinstance(value, kind):
    raise ValueError(f"{path}: expected a JSON {_json_name(kind)}, got "
                     f"{_JSON_NAMES.get(type(value), type(value).__name__)}; "
                     f"{fix}")
  return value


def _is(value, kind) -> bool:
  if kind == _NUMBERS:
    return (isinstance(value, list)
            and all(_is(v, _NUMBER) for v in value))
  # JSON true / false are not numbers here, though Python's bool is an int.
  return isinstance(value, kind) and not (
      isinstance(value, bool) and bool not in (
          kind if isinstance(kind, tuple) else (kind,)))


def read_results(path: str) -> dict:
  """A run's (or RLVR stage's) results.json, checked for the fields the
  sweep reads; ValueError naming the file and the field, and what to do."""
  fix = (f"delete it to finish the run again from its checkpoints, or delete "
         f"{os.path.dirname(path) or '.'} to rerun it from the start")
  result = read_json(path, fix=fix)
  checks = [(field, result.get(field), kind)
            for field, kind in _RESULT_FIELDS.items()]
  checks += [(field, result[field], dict) for field in ("eval", "train",
                                                         "compute")
             if result.get(field) is not None]
  checks += [(field, result[field], _NUMBERS) for field in ("rewards",
                                                            "reward_steps")
             if result.get(field) is not None]
  study = result.get("study")
  if isinstance(study, dict):
    checks += [(f"study.{field}", study.get(field), kind)
               for field, kind in _STUDY_FIELDS.items()
               if field in study or field == "seed"]
  for field, value, kind in checks:
    if not _is(value, kind):
      what = kind if kind == _NUMBERS else f"a JSON {_json_name(kind)}"
      raise ValueError(f"{path}: field {field!r} must be {what}, got "
                       f"{json.dumps(value)[:60]}; {fix}")
  return result


# The accuracy a row reports, first found first: the paper's protocol (one
# sample at T 0.5, App. D.3), then greedy decoding (runlocal, the demo).
ACC_METRICS = ("single_acc", "greedy_acc")


def row_of(result: Mapping) -> dict:
  """The table row of one results.json."""
  ev, tr = result.get("eval") or {}, result.get("train") or {}
  # Axis order is the run name's (results.json stores factors sorted).
  factors = result["factors"]
  order = [p.split("=", 1)[0] for p in result["name"].split(",")]
  order = [k for k in order if k in factors and k != "seed"]
  row = {"name": result["name"],
         "arm": ",".join(p for p in result["name"].split(",")
                         if not p.startswith("seed="))}
  row.update({f"f:{k}": factors[k] for k in order})
  row.update(result["study"])
  acc = ACC_METRICS[0] if any(k.endswith("/" + ACC_METRICS[0]) for k in ev) \
      else ACC_METRICS[1]
  row["accuracy"] = ev.get(f"id/{acc}")
  row["coverage"] = _pass_at_max_k(ev)
  row["forgetting_pp"] = ev.get("forgetting/mean_pp")
  keys = {**{c: c.replace("_", "/", 1) for c in SPARSITY}, **_KIND_KEYS,
          **_ROW_KEYS}
  for col, key in keys.items():
    row[col] = ev.get(key, tr.get(key))
  row["sparsity"] = row["sparsity_S_1e-6_f32"]
  row["harder_acc"] = ev.get(f"harder/{acc}")
  for k, v in sorted(ev.items()):
    suite, _, metric = k.partition("/")
    if metric == acc and suite not in ("id", "ood", "harder", "baseline"):
      row[f"acc/{suite}"] = v
    elif (metric.startswith("pass@") and "/" not in metric
          and suite not in ("id", "ood", "harder", "baseline", "final")):
      # per-suite coverage for the figures (Fig. 5), not a table column
      row[f"{metric}/{suite}"] = v
    elif suite == "style" and metric.startswith(acc.split("_")[0] + "_lang_"):
      row[f"lang_{metric.rsplit('_', 1)[1]}"] = v
  c = result.get("compute") or {}
  row["tokens_generated"] = c.get("tokens_generated")
  row["flops"] = c.get("flops")
  return row


RLVR, CHANGE = "rlvr/", "rlvr_change/"
# Compute columns describe the distillation run, not a change; counts are
# printed as numbers, not percentages.
_NO_CHANGE = ("tokens_generated", "flops")
_COUNTS = _NO_CHANGE + tuple(_ROW_KEYS)


def with_rlvr(row: Mapping, stage: Mapping) -> dict:
  """`row` plus the rlvr/, rlvr_change/ columns of its RLVR stage's
  results.json (study.rlvr)."""
  after = row_of(stage)
  out = dict(row)
  for m in [*METRICS, *sorted(k for k in after if k.startswith("acc/"))]:
    if m in _NO_CHANGE or after.get(m) is None:
      continue
    out[RLVR + m] = after[m]
    if is_number(row.get(m)):
      out[CHANGE + m] = after[m] - row[m]
  out["rlvr_rewards"] = list(stage.get("rewards") or [])
  steps = list(stage.get("reward_steps") or [])  # older stages: 1, 2, ...
  out["rlvr_reward_steps"] = (steps if len(steps) == len(out["rlvr_rewards"])
                              else list(range(1, len(out["rlvr_rewards"]) + 1)))
  return out


def aggregate(workdir: str) -> list[dict]:
  """One row per finished run (<workdir>/*/results.json), sorted by name,
  with its RLVR stage's columns when <run>/rlvr/results.json exists."""
  rows = []
  if storage.is_gs(workdir):
    paths = [p for p in (f"{workdir}/{n}/results.json"
                         for n in storage.listdir(workdir))
             if storage.isfile(p)]
  else:
    paths = glob.glob(os.path.join(workdir, "*", "results.json"))
  for path in sorted(paths):
    row = row_of(read_results(path))
    stage = os.path.join(stage_dir(os.path.dirname(path)), "results.json")
    if storage.isfile(stage):
      row = with_rlvr(row, read_results(stage))
    rows.append(row)
  return rows


def stage_dir(run_dir: str) -> str:
  """The directory of a run's RLVR stage."""
  return os.path.join(run_dir, RLVR_DIR)


def metric_columns(rows: Sequence[Mapping]) -> list[str]:
  """The metric columns present: METRICS, acc/<suite>, then their rlvr/ and
  rlvr_change/ versions."""
  extra = sorted({k for r in rows for k in r
                  if k.startswith(("acc/", "lang_"))})
  base = [m for m in METRICS if any(r.get(m) is not None for r in rows)] + extra
  return base + [p + m for p in (RLVR, CHANGE) for m in base
                 if any(r.get(p + m) is not None for r in rows)]


def is_number(v):
  """A finite int or float: a value the table averages (None, NaN and text are not)."""
  return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


def summarize_arms(rows: Sequence[Mapping]) -> list[dict]:
  """Rows grouped by arm: factors, then {metric}_mean/_std/_n over seeds.

  std is the sample standard deviation (ddof=1); 0 when n == 1.
  """
  groups: dict[str, list] = {}
  for r in rows:
    groups.setdefault(r["arm"], []).append(r)
  cols = metric_columns(rows)
  out = []
  for arm, rs in groups.items():
    a = {k: v for k, v in rs[0].items()
         if k.startswith("f:") or k in STUDY}
    a["arm"], a["seeds"] = arm, sorted(r["seed"] for r in rs)
    for m in cols:
      vals = np.asarray([r[m] for r in rs if is_number(r.get(m))], np.float64)
      a[f"{m}_n"] = int(vals.size)
      a[f"{m}_mean"] = float(vals.mean()) if vals.size else None
      a[f"{m}_std"] = float(vals.std(ddof=1)) if vals.size > 1 else (
          0.0 if vals.size else None)
    out.append(a)
  return out


# A difference of update sparsity that counts as one: the share of weights is
# a count over every parameter (no sampling noise within a run), so the bar
# is a size, not a standard error; with seeds, twice their spread if larger.
SPARSITY_CLEAR = 0.10
PRECISIONS = ("bfloat16", "float32")
S6 = "sparsity_S_1e-6_f32"  # the paper's S_1e-6, a column of the table


def precision_text(lr: float, sparsity: Mapping, accuracy: Mapping,
                   stds: Sequence[float] = ()) -> tuple[bool, str]:
  """(depends, sentence): this project's finding, not the paper's, on
  whether update sparsity S_1e-6 at learning rate `lr` depends on weight
  precision. `sparsity` / `accuracy`: {precision: the mean over the same
  arms} (accuracy may be None); `stds`: the arms' spreads over seeds; the
  bar is SPARSITY_CLEAR or twice the largest spread."""
  bar = max([SPARSITY_CLEAR] + [2 * x for x in stds])
  depends = abs(sparsity["bfloat16"] - sparsity["float32"]) > bar
  accs = ("" if None in (accuracy.get("float32"), accuracy.get("bfloat16"))
          else f" (in-distribution accuracy {100 * accuracy['float32']:.1f} % "
          f"and {100 * accuracy['bfloat16']:.1f} %)")
  text = (f"Weight precision (this project's question, not the paper's): at "
          f"lr {lr:.0e}, S_1e-6 is {100 * sparsity['float32']:.1f} % with "
          "float32 master weights and "
          f"{100 * sparsity['bfloat16']:.1f} % with weights stored and updated "
          f"in bfloat16{accs}")
  text += (": update sparsity at the low rate depends on weight precision "
           f"(a difference above {100 * bar:.0f} pp), so the precision the "
           "weights are stored in can make a run look sparse." if depends else
           f": no difference above {100 * bar:.0f} pp, so precision does not "
           "explain the sparsity here.")
  return depends, text


def precision_finding(arms: Sequence[Mapping]) -> str:
  """The weight-precision sentence of a sweep's summary from its arms
  (summarize_arms): the arms at the lowest learning rate, S_1e-6 and
  accuracy averaged per precision (student.param_dtype) over the arms that
  ran in both; 'not measured' unless both precisions ran there."""
  lrs = [a["lr"] for a in arms if is_number(a.get("lr"))]
  if not lrs:
    return "Weight precision: not measured (no arm has a learning rate)."
  lo = min(lrs)
  at = [a for a in arms if a.get("lr") == lo
        and a.get("precision") in PRECISIONS
        and a.get(f"{S6}_mean") is not None]

  def key(a):  # the arm but for its precision
    return tuple((k, json.dumps(v)) for k, v in sorted(a.items())
                 if (k.startswith("f:") or k in STUDY)
                 and k not in ("precision", "f:precision"))
  by = {}
  for a in at:
    by.setdefault(key(a), {})[a["precision"]] = a
  pairs = [d for d in by.values() if set(d) == set(PRECISIONS)]
  if not pairs:
    return ("Weight precision: not measured (no arm at the lowest learning "
            f"rate, {lo:.0e}, ran in both float32 and bfloat16; the grids' "
            "`precision` axis adds them, configs/grid_main.py).")

  def mean(p, m):
    vals = [d[p].get(f"{m}_mean") for d in pairs]
    return (None if any(v is None for v in vals)
            else float(np.mean(vals)))
  sd = [d[p][f"{S6}_std"] for d in pairs for p in PRECISIONS
        if d[p].get(f"{S6}_std") is not None]
  _, text = precision_text(
      lo, {p: mean(p, S6) for p in PRECISIONS},
      {p: mean(p, "accuracy") for p in PRECISIONS}, sd)
  return text + f" Arms compared: {len(pairs)} pair(s)."


def _cell(mean, std, n, metric):
  if mean is None:
    return "-"
  if metric.removeprefix(CHANGE).removeprefix(RLVR) in _COUNTS:
    return f"{mean:.3g}"
  change = metric.startswith(CHANGE)
  pp = metric.removeprefix(CHANGE).removeprefix(RLVR) == "forgetting_pp"
  scale = 1.0 if pp else 100.0  # forgetting is already in points
  unit = " pp" if pp or change else " %"
  s = f"{scale * mean:+.1f}" if change else f"{scale * mean:.1f}"
  if n > 1:
    s += f" ± {scale * std:.1f}"
  return s + unit + (f" (n={n})" if n != 1 else "")


def write_table(rows: Sequence[Mapping], out_dir: str) -> tuple[str, str]:
  """results.csv (per arm: factors, mean/std/n per metric) and results.md."""
  if not rows:
    raise ValueError("rows: no finished run to tabulate")
  os.makedirs(out_dir, exist_ok=True)
  arms = summarize_arms(rows)
  cols = metric_columns(rows)
  factor_cols = [k for k in arms[0] if k.startswith("f:")] or []
  # The study's factors that vary (kl and policy always), unless an axis of
  # the same name already shows them.
  study_cols = [k for k in STUDY if f"f:{k}" not in factor_cols and (
      len({json.dumps(a.get(k)) for a in arms}) > 1 or k in ("kl", "policy"))]
  csv_path = os.path.join(out_dir, "results.csv")
  header = (["arm"] + factor_cols + study_cols + ["seeds"] +
            [f"{m}_{s}" for m in cols for s in ("mean", "std", "n")])
  with open(csv_path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow([h.removeprefix("f:") for h in header])
    for a in arms:
      w.writerow(["+".join(map(str, a[h])) if h == "seeds" else a.get(h)
                  for h in header])
  md_path = os.path.join(out_dir, "results.md")
  keys = factor_cols + study_cols
  base = [m for m in cols if not m.startswith((RLVR, CHANGE))]

  def section(prefix, shown):
    head = [h.removeprefix("f:") for h in keys] + base
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for a in shown:
      cells = [str(a.get(h)) for h in keys]
      for m in base:
        k = prefix + m
        cells.append(_cell(a.get(f"{k}_mean"), a.get(f"{k}_std"),
                           a.get(f"{k}_n", 0), k) if k in cols else "-")
      out.append("| " + " | ".join(cells) + " |")
    return out
  staged = [a for a in arms if any(a.get(f"{RLVR}{m}_n") for m in base)]
  lines = section("", arms)
  if staged:
    lines = (["After distillation:", ""] + lines +
             ["", "After RLVR (GRPO from the arm's student; the same "
              "evaluation):", ""] + section(RLVR, staged) +
             ["", "Change with RLVR (after - before; accuracy in percentage "
              "points):", ""] + section(CHANGE, staged))
  spread = ("mean ± std over seeds (n = seeds with the figure)"
            if any(a[f"{m}_n"] > 1 for a in arms for m in cols)
            else "one seed per arm, so no spread is shown")
  lines += ["", "Accuracy, coverage (pass@k) and sparsity in %, forgetting in "
            f"percentage points (positive = forgotten); {spread}. "
            "sparsity_S_<tau>_f32: update sparsity as the paper defines it, "
            "share of parameters with |change| < tau (strict), compared in "
            "float32; sparsity_unchanged_1e-5_<dtype>: the former figure, "
            "|change| <= 1e-5 after both are rounded to <dtype> "
            "(sparsity_equal_<dtype>: equal, IEEE ==, so -0.0 equals 0.0); "
            "sparsity_<kind>_S_<tau>_f32: the same per layer kind "
            "(embeddings_seen / _unseen: the embedding rows of token ids the "
            "run's training did / never processed, _rows of them).",
            "", precision_finding(arms)]
  with open(md_path, "w") as f:
    f.write("\n".join(lines) + "\n")
  return csv_path, md_path
