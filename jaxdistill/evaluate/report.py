"""Flat metric dicts for comparisons, and the plain-text tables of a result.

Keys added next to the per-suite ones of evaluation.core:

  {group}/{metric}            mean over a group's suites (group: id, harder,
                              ood; metric: greedy_acc, single_acc,
                              sampled_acc, pass@k)
  baseline/{suite}/{metric}   the baseline model's figures
  forgetting/{suite}_pp       100 * (baseline - checkpoint) accuracy, per OOD
  forgetting/mean_pp          suite, and their mean (positive = forgotten)
  sparsity/S_{tau}_f32        the paper's update sparsity (App. D.4): fraction
                              of entries with |after - before| < tau (strict),
                              on the stored values upcast to float32, whole
                              model, per tau of config.sparsity.taus
                              (sparsity/S_1e-6_f32, sparsity/S_1e-8_f32)
  sparsity/layer_{i:02d}/S_{tau}_f32, sparsity/{tensor group}/S_{tau}_f32
                              the same per layer and per tensor group
  sparsity/unchanged_{atol}_{bf16,f32}   the former figure, whole model:
                              |after - before| <= atol after both are rounded
                              to that dtype (sparsity/unchanged_1e-5_bf16)
  sparsity/equal_{bf16,f32}   equal after that rounding (IEEE ==, so -0.0
                              equals 0.0)
  sparsity/{kind}/S_{tau}_f32 per layer kind: attention, mlp, norms,
                              embeddings, and over the embedding rows of seen /
                              never-seen tokens (embeddings_seen,
                              embeddings_unseen, with .../num_rows)
  sparsity/num_params
(the sparsity/* keys: jaxdistill.sparsity.metrics_from_result)
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from jaxdistill.evaluate import metrics

GROUP_METRICS = ("greedy_acc", "single_acc", "sampled_acc")
# Rows of the per-suite table: (key suffix, label, is a fraction to show in %).
_ROWS = (
    ("greedy_acc", "greedy accuracy", True),
    ("single_acc", "accuracy, one sample", True),
    ("sampled_acc", "sampled accuracy", True),
    ("pass@*", None, True),
    ("distinct_correct", "distinct correct / problem", False),
    ("greedy_format", "format score (greedy)", False),
    ("greedy_parse_rate", "parse rate (greedy)", True),
    ("greedy_len", "response tokens (greedy)", False),
    ("greedy_truncated", "truncated (greedy)", True),
    ("single_format", "format score (one sample)", False),
    ("single_parse_rate", "parse rate (one sample)", True),
    ("single_len", "response tokens (one sample)", False),
    ("single_truncated", "truncated (one sample)", True),
    ("sampled_format", "format score (sampled)", False),
    ("sampled_parse_rate", "parse rate (sampled)", True),
    ("sampled_len", "response tokens (sampled)", False),
    ("sampled_truncated", "truncated (sampled)", True),
)


def group_means(flat: Mapping[str, float], groups: Mapping[str, Sequence[str]]
                ) -> dict:
  """{group}/{metric}: mean over the group's suites that have the metric."""
  out = {}
  for group, suites in groups.items():
    if not suites:
      continue
    keys = set(GROUP_METRICS) | {k.split("/", 1)[1] for k in flat
                                 if k.split("/", 1)[-1].startswith("pass@")}
    for m in sorted(keys):
      vals = [flat[f"{s}/{m}"] for s in suites if f"{s}/{m}" in flat]
      if vals and len(vals) == len(suites):
        out[f"{group}/{m}"] = float(np.mean(vals))
  return out


def forgetting_metrics(after: Mapping[str, float], before: Mapping[str, float],
                       ood: Sequence[str],
                       metric: str | Mapping[str, str] = "greedy_acc") -> dict:
  """forgetting/{suite}_pp and forgetting/mean_pp via metrics.forgetting.

  `after` / `before` are flat per-suite dicts ('{suite}/{metric}' keys) of the
  evaluated checkpoint and of the baseline (the student before training);
  `metric` one name, or {suite: name}.
  """
  if not ood:
    raise ValueError("ood: forgetting needs at least one out-of-distribution suite")
  of = (lambda s: metric[s]) if isinstance(metric, Mapping) else (
      lambda s: metric)
  missing = [s for s in ood for d in (after, before) if f"{s}/{of(s)}" not in d]
  if missing:
    raise ValueError(f"forgetting: no '{of(missing[0])}' for suite(s) "
                     f"{sorted(set(missing))}")
  res = metrics.forgetting({s: before[f"{s}/{of(s)}"] for s in ood},
                           {s: after[f"{s}/{of(s)}"] for s in ood})
  out = {f"forgetting/{s}_pp": v for s, v in res["per_suite"].items()}
  out["forgetting/mean_pp"] = res["mean"]
  return out


def _fmt(v, pct: bool) -> str:
  if v is None:
    return "-"
  return f"{100 * v:.1f} %" if pct else f"{v:.3g}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
  widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
  line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"
  return [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
          *map(line, rows)]


def format_report(result: Mapping) -> str:
  """Markdown tables: one per suite, then groups, forgetting and sparsity."""
  m = result["metrics"]
  info = result.get("suites", {})
  lines = [f"checkpoint: {result['checkpoint']}"]
  if result.get("baseline"):
    lines.append(f"baseline:   {result['baseline']}")
  for suite, meta in info.items():
    base = any(k.startswith(f"baseline/{suite}/") for k in m)
    if meta.get("kind") == "harness":  # lm-eval tasks: a score each, the mean
      lines += ["", f"## {suite} ({meta.get('group', 'other')}, lm-eval; score "
                "= the unweighted mean of the tasks')", ""]
      rows = []
      for k in sorted((k.split("/", 1)[1] for k in m
                       if k.startswith(f"{suite}/")),
                      key=lambda k: (k != "score", k)):
        v, row = m[f"{suite}/{k}"], [k, _fmt(m[f"{suite}/{k}"], True)]
        if base:
          b = m.get(f"baseline/{suite}/{k}")
          row += [_fmt(b, True), "-" if b is None else f"{100 * (v - b):+.1f} pp"]
        rows.append(row)
      lines += _table(["task", "checkpoint"] + (["baseline", "change"] if base
                                                else []), rows)
      continue
    lines += ["", f"## {suite} ({meta.get('group', 'other')}, "
              f"{int(m[f'{suite}/num_problems'])} problems"
              + (f", {int(m[f'{suite}/num_dropped'])} dropped as too long"
                 if m.get(f"{suite}/num_dropped") else "") + ")", ""]
    header = ["metric", "checkpoint"] + (["baseline", "change"] if base else [])
    rows = []
    for key, label, pct in _ROWS:
      keys = ([k.split("/", 1)[1] for k in m if k.startswith(f"{suite}/pass@")]
              if key == "pass@*" else [key])
      for k in keys:
        if f"{suite}/{k}" not in m:
          continue
        v, row = m[f"{suite}/{k}"], [label or k, _fmt(m[f"{suite}/{k}"], pct)]
        if base:
          b = m.get(f"baseline/{suite}/{k}")
          row += [_fmt(b, pct), "-" if b is None else
                  (f"{100 * (v - b):+.1f} pp" if pct else f"{v - b:+.3g}")]
        rows.append(row)
    lines += _table(header, rows)
  groups = sorted(k for k in m if k.split("/")[0] in ("id", "harder", "ood"))
  if groups:
    lines += ["", "## group means", ""]
    lines += _table(["metric", "value"], [[k, _fmt(m[k], True)] for k in groups])
  lkeys = sorted(k for k in m if "_lang_" in k)
  if lkeys:
    lines += ["", "## language (share of completions whose prose the judge "
              "finds in that language, jaxdistill/tasks/language.py)", ""]
    lines += _table(["metric", "value"], [[k, _fmt(m[k], True)] for k in lkeys])
  fkeys = sorted(k for k in m if k.startswith("forgetting/"))
  if fkeys:
    lines += ["", "## forgetting (accuracy drop on OOD suites, "
              f"{result.get('forgetting_metric', 'greedy_acc')})", ""]
    lines += _table(["suite", "drop (pp)"],
                    [[k.split("/", 1)[1].removesuffix("_pp"), f"{m[k]:+.2f}"]
                     for k in fkeys])
  sp = result.get("sparsity")
  if sp:
    cols = sp["columns"]
    s_cols = [c for c in cols if c.startswith("S_")]
    lines += ["", "## update sparsity (S_tau: share of parameters with "
              "|after - before| < tau, strict, on the stored values upcast to "
              f"float32; stored: checkpoint {sp['stored_dtype']['after']}, "
              f"baseline {sp['stored_dtype']['before']}; "
              f"{int(m['sparsity/num_params']):,} parameters)", ""]
    rows = [["whole model", *(_fmt(m[f"sparsity/{c}"], True) for c in s_cols)]]
    for k in sp.get("kinds", ()):  # layer kinds; seen / unseen embedding rows
      if f"sparsity/{k}/{s_cols[0]}" in m:
        n = m.get(f"sparsity/{k}/num_rows")
        rows.append([k + ("" if n is None else f" ({int(n):,} token ids)"),
                     *(_fmt(m[f"sparsity/{k}/{c}"], True) for c in s_cols)])
    layers = sorted({k.split("/")[1] for k in m
                     if k.startswith("sparsity/layer_")})
    rows += [[k, *(_fmt(m.get(f"sparsity/{k}/{c}"), True) for c in s_cols)]
             for k in layers]
    lines += _table(["part", *s_cols], rows)
    former = [c for c in cols if not c.startswith("S_")]
    if former:
      lines += ["", "Former figures, whole model (unchanged_<atol>_<dtype>: "
                "|after - before| <= atol after both are rounded to <dtype>; "
                "equal_<dtype>: equal after that rounding):", ""]
      lines += _table(former, [[_fmt(m[f"sparsity/{c}"], True) for c in former]])
  return "\n".join(lines)
