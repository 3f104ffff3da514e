"""The paper's figure layouts from a sweep's table rows, error bars the SEM
over seeds (std with ddof 1 over sqrt(n); none with one seed).

  paper_fig1.png   Fig. 1 (grid_main): per rollout policy x KL direction,
                   bars per learning rate: in-distribution accuracy averaged
                   over the grid's tasks (for each seed the mean over the
                   tasks it finished, then mean and SEM over seeds), the
                   mean OOD change (-forgetting, points) in the same way, and
                   update sparsity S_1e-6
  paper_fig2.png   Fig. 2 (grid_lr_sweep): accuracy, OOD change and S_1e-6
                   against the learning rate, a line per rollout policy (and
                   KL direction when both ran), on one task (Countdown-3
                   when present)
  paper_fig5.png   Fig. 5 (grid_spectrum): pass@1 and pass@10 along lambda
                   on Countdown-3 and on Countdown-4E, a line per KL
                   direction, the band between pass@1 and pass@10 shaded (a
                   span, not an uncertainty), error bars SEM

A figure is drawn when the rows have what it needs (two configurations, two
learning rates, two values of lambda); otherwise a line on stderr says what
is missing. Lambda here is the paper's (1 on-policy, -1 off-policy), not the
table's share of student tokens.
"""
from __future__ import annotations

from collections.abc import Sequence
import sys

import numpy as np

from jaxdistill.sweep import figures
from jaxdistill.sweep import table

# Fig. 5's suites (configs/eval.py:task=countdown): Countdown-3 at T 1.0,
# Countdown-4E at T 0.5, ten samples each.
FIG5_SUITES = (("countdown3_paper", "Countdown-3"), ("countdown4e", "Countdown-4E"))


def _say(msg):
  print(f"[figures] {msg}", file=sys.stderr, flush=True)


def sem(values) -> float:
  """Standard error of the mean: std (ddof 1) / sqrt(n); 0 for one value."""
  v = np.asarray(values, np.float64)
  return float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else 0.0


_plt = figures._plt  # pylint: disable=protected-access


def _save(fig, out_dir, name):
  return figures._save(fig, out_dir, name)  # pylint: disable=protected-access


def paper_lambda(row) -> float | None:
  """The paper's lambda of a row: rollout.lam for the spectrum policy (the
  study's `lam` is that lambda there), 1 for student rollouts, -1 for
  teacher rollouts; None for other policies."""
  pol = row.get("policy")
  if pol == "student":
    return 1.0
  if pol == "teacher":
    return -1.0
  if pol == "spectrum" and table.is_number(row.get("lam")):
    return float(row["lam"])
  return None


def seed_means(rows, key, group, scale=1.0) -> dict:
  """{group(row): {seed: mean of scale * row[key] over the row's tasks}}."""
  acc = {}
  for r in rows:
    if table.is_number(r.get(key)):
      acc.setdefault(group(r), {}).setdefault(r.get("seed"), []).append(
          scale * r[key])
  return {g: {s: float(np.mean(v)) for s, v in by.items()}
          for g, by in acc.items()}


def _mean_sem(by_seed: dict) -> tuple[float, float, int]:
  v = list(by_seed.values())
  return float(np.mean(v)), sem(v), len(v)


# (row key, axis label, scale to the plotted unit)
_PANELS = (("accuracy", "ID accuracy (%)", 100.0),
           ("forgetting_pp", "OOD change (pp)", -1.0),
           ("sparsity", "update sparsity S_1e-6 (%)", 100.0))


def fig1(rows: Sequence[dict], out_dir: str) -> str | None:
  """Fig. 1's three panels (module docstring)."""
  def config(r):
    return (r.get("policy"), r.get("kl"))
  configs = sorted({config(r) for r in rows if table.is_number(r.get("accuracy"))},
                   key=str)
  lrs = sorted({r["lr"] for r in rows if table.is_number(r.get("lr"))})
  if len(configs) < 2:
    _say("paper_fig1: skipped (needs accuracy for >= 2 rollout policy x KL "
         f"configurations; have {configs})")
    return None
  tasks = sorted({str(r.get("task")) for r in rows})
  plt = _plt()
  fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
  width = 0.8 / max(len(lrs), 1)
  seeds = set()
  for ax, (key, label, scale) in zip(axes, _PANELS):
    by = seed_means(rows, key, lambda r: (config(r), r.get("lr")), scale)
    for j, lr in enumerate(lrs):
      stats = [(_mean_sem(by[(c, lr)]) if (c, lr) in by else (np.nan, 0.0, 0))
               for c in configs]
      seeds.update(n for _, _, n in stats)
      ax.bar(np.arange(len(configs)) + j * width, [m for m, _, _ in stats],
             width, yerr=[e for _, e, _ in stats], capsize=3,
             label=f"lr {lr:.0e}")
    ax.set_xticks(np.arange(len(configs)) + width * (len(lrs) - 1) / 2)
    ax.set_xticklabels([f"{'OnPD' if p == 'student' else 'OffPD' if p == 'teacher' else p}"
                        f" {str(k)[0].upper()}-KL" for p, k in configs],
                       fontsize=8)
    ax.set_ylabel(label)
    if key == "forgetting_pp":
      ax.axhline(0.0, color="gray", linewidth=0.8)
    ax.legend(fontsize=7)
  n = max(seeds - {0}, default=1)
  fig.suptitle(f"On- vs off-policy distillation, mean over {', '.join(tasks)}; "
               + (f"error bars: SEM over {n} seeds" if n > 1
                  else "one seed: no error bars"), fontsize=10)
  return _save(fig, out_dir, "paper_fig1.png")


def _lr_task(rows):
  tasks = {str(r.get("task")) for r in rows}
  return "countdown3" if "countdown3" in tasks else sorted(tasks)[0]


def fig2(rows: Sequence[dict], out_dir: str) -> str | None:
  """Fig. 2: the learning-rate sweep on one task (module docstring)."""
  if not rows:
    return None
  task = _lr_task(rows)
  at = [r for r in rows if str(r.get("task")) == task]
  lrs = sorted({r["lr"] for r in at if table.is_number(r.get("lr"))})
  if len(lrs) < 3:
    _say(f"paper_fig2: skipped (needs >= 3 learning rates on {task}; have "
         f"{lrs})")
    return None
  kls = sorted({r.get("kl") for r in at}, key=str)
  plt = _plt()
  fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
  for ax, (key, label, scale) in zip(axes, _PANELS):
    by = seed_means(at, key, lambda r: (r.get("policy"), r.get("kl"), r["lr"]),
                    scale)
    for pol, kl in sorted({(g[0], g[1]) for g in by}, key=str):
      xs = [lr for lr in lrs if (pol, kl, lr) in by]
      stats = [_mean_sem(by[(pol, kl, lr)]) for lr in xs]
      ax.errorbar([1e5 * x for x in xs], [m for m, _, _ in stats],
                  yerr=[e for _, e, _ in stats], marker="o", capsize=3,
                  label=f"{pol} rollouts" + (f", {kl} KL" if len(kls) > 1
                                             else ""))
    ax.set_xlabel("learning rate (x 1e-5)")
    ax.set_ylabel(label)
    ax.legend(fontsize=7)
  fig.suptitle(f"The learning rate on {task}; error bars: SEM over seeds",
               fontsize=10)
  return _save(fig, out_dir, "paper_fig2.png")


def fig5(rows: Sequence[dict], out_dir: str) -> str | None:
  """Fig. 5: coverage along the spectrum (module docstring)."""
  have = [(s, name) for s, name in FIG5_SUITES
          if any(table.is_number(r.get(f"pass@1/{s}")) for r in rows)]
  lams = {paper_lambda(r) for r in rows} - {None}
  if not have or len(lams) < 2:
    _say("paper_fig5: skipped (needs pass@1 / pass@10 on countdown3_paper or "
         f"countdown4e at >= 2 values of lambda; have lambda {sorted(lams)})")
    return None
  lrs = sorted({r["lr"] for r in rows if table.is_number(r.get("lr"))})
  lo = [r for r in rows if r.get("lr") == lrs[0]] if lrs else list(rows)
  plt = _plt()
  fig, axes = plt.subplots(1, len(have), figsize=(5.5 * len(have), 3.6),
                           squeeze=False)
  for ax, (suite, name) in zip(axes[0], have):
    for i, kl in enumerate(sorted({r.get("kl") for r in lo}, key=str)):
      mine = [r for r in lo if r.get("kl") == kl]
      color = f"C{i}"
      curves = {}
      for k, style in ((1, "-"), (10, "--")):
        by = seed_means(mine, f"pass@{k}/{suite}", paper_lambda, 100.0)
        xs = sorted(x for x in by if x is not None)
        if not xs:
          continue
        stats = [_mean_sem(by[x]) for x in xs]
        curves[k] = (xs, [m for m, _, _ in stats])
        ax.errorbar(xs, curves[k][1], yerr=[e for _, e, _ in stats],
                    color=color, linestyle=style, marker="o", capsize=3,
                    label=f"{kl} KL, pass@{k}")
      if 1 in curves and 10 in curves and curves[1][0] == curves[10][0]:
        ax.fill_between(curves[1][0], curves[1][1], curves[10][1],
                        color=color, alpha=0.15)
    ax.set_xlabel("lambda (-1 off-policy, 1 on-policy)")
    ax.set_ylabel("pass@k (%)")
    ax.set_title(name, fontsize=10)
    ax.legend(fontsize=7)
  lr_s = f"lr {lrs[0]:.0e}; " if lrs else ""
  fig.suptitle(f"Coverage along the rollout spectrum ({lr_s}band: pass@1 to "
               "pass@10; error bars: SEM over seeds)", fontsize=10)
  return _save(fig, out_dir, "paper_fig5.png")


def make(rows: Sequence[dict], out_dir: str) -> list[str]:
  return [p for p in (fig1(rows, out_dir), fig2(rows, out_dir),
                      fig5(rows, out_dir)) if p]
