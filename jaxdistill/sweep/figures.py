"""The study's figures from table rows (matplotlib, Agg backend, PNG).

  accuracy_vs_lambda.png      in-distribution accuracy against lambda
                              (0 = teacher rollouts, 1 = on-policy), one line
                              per KL direction (and lr), error bars = std over
                              seeds, or binomial s.e. with one seed
  lr_sparsity_forgetting.png  update sparsity and forgetting against the
                              learning rate (log axis); per-run points, a least-squares
                              line per KL direction with its R^2 in the legend
  harder_countdown.png        greedy accuracy on the harder Countdown suites
                              per rollout policy (not drawn if all are 0)
  rlvr.png                    the RLVR stage (study.rlvr): mean reward per
                              GRPO iteration per arm (a moving average over
                              a tenth of the iterations, raw values faint),
                              and accuracy before and after RLVR per arm
  rlvr_seeds_lr<lr>.png       the paper's Fig. 6 / 26 layout: one panel per
                              rollout policy x KL direction at one
                              distillation learning rate, one reward curve
                              per distillation seed (moving average as
                              above)

A figure is drawn only if the rows have what it needs; otherwise a line on
stderr says what is missing.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
import os
import re
import sys

import numpy as np

from jaxdistill.sweep import rlvr as rlvr_lib
from jaxdistill.sweep import table


def _plt():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def _say(msg):
  print(f"[figures] {msg}", file=sys.stderr, flush=True)


def linear_fit(x, y) -> tuple[float, float, float]:
  """Least squares y = a x + b -> (a, b, R^2); R^2 = 1 - SS_res / SS_tot.

  The fit is over per-run points, not arm means: with two learning rates a
  line through two means would always give R^2 = 1."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  a, b = np.polyfit(x, y, 1)
  ss_tot = float(((y - y.mean()) ** 2).sum())
  ss_res = float(((y - (a * x + b)) ** 2).sum())
  # R^2 is undefined for a constant y: nan, shown as 'n/a'.
  r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")
  return float(a), float(b), r2


def _vals(rows, key):
  return [r for r in rows if table.is_number(r.get(key))]


def _errors(values, n):
  """Error bar of a mean in %: the spread (std) over seeds when there are
  several, else the binomial standard error over n test problems (if known)."""
  if len(values) > 1:
    return float(np.std(values, ddof=1))
  if n:
    p = values[0] / 100.0
    return 100.0 * float(np.sqrt(max(p * (1 - p), 1.0 / n) / n))
  return 0.0


def _references(ax, refs):
  """Horizontal lines for reference models ({label: accuracy in [0, 1]})."""
  for (label, v), style in zip((refs or {}).items(), ("--", ":", "-.")):
    if v is not None:
      ax.axhline(100 * v, color="gray", linestyle=style, linewidth=1,
                 label=f"{label} ({100 * v:.1f} %)")


def _error_note(rows, n):
  seeds = max((len({r.get("seed") for r in rows if r.get("arm") == a})
               for a in {r.get("arm") for r in rows}), default=1)
  if seeds > 1:
    return f"error bars: std over {seeds} seeds"
  return f"error bars: binomial s.e. over {n} problems" if n else ""


def accuracy_vs_lambda(rows, out_dir, refs=None, n_test=None) -> str | None:
  ok = _vals(rows, "accuracy")
  lams = {r["lam"] for r in ok if r.get("lam") is not None}
  if len(lams) < 2:
    _say("accuracy_vs_lambda: skipped (needs 'accuracy' at >= 2 values of "
         f"lambda; have {sorted(lams)})")
    return None
  plt = _plt()
  fig, ax = plt.subplots(figsize=(5.5, 3.8))
  n = (n_test or {}).get("accuracy")
  for kl in sorted({r["kl"] for r in ok}):
    for lr in sorted({r["lr"] for r in ok if r["kl"] == kl}):
      pts = {}
      for r in ok:
        if r["kl"] == kl and r["lr"] == lr and r.get("lam") is not None:
          pts.setdefault(r["lam"], []).append(100 * r["accuracy"])
      xs = sorted(pts)
      many_lrs = len({r["lr"] for r in ok}) > 1
      ax.errorbar(xs, [np.mean(pts[x]) for x in xs],
                  yerr=[_errors(pts[x], n) for x in xs], marker="o", capsize=3,
                  label=f"{kl} KL" + (f", lr {lr:.0e}" if many_lrs else ""))
  _references(ax, (refs or {}).get("accuracy"))
  ax.set_xlabel("lambda (share of student tokens in rollouts)\n"
                "0 = teacher rollouts (off-policy), 1 = on-policy")
  ax.set_xticks(sorted(lams))
  top = max([100 * r["accuracy"] for r in ok] +
            [100 * v for v in ((refs or {}).get("accuracy") or {}).values()
             if v is not None])
  ax.set_ylim(0, max(1.0, 1.2 * top))
  ax.set_ylabel("in-distribution greedy accuracy (%)")
  ax.set_title("Accuracy along the rollout spectrum\n" + _error_note(ok, n),
               fontsize=10)
  ax.legend(fontsize=7)
  return _save(fig, out_dir, "accuracy_vs_lambda.png")


def lr_sparsity_forgetting(rows, out_dir) -> str | None:
  panels = [(k, label) for k, label in (
      ("sparsity", "update sparsity S_1e-6, f32 (%)"),
      ("forgetting_pp", "forgetting (pp)"))
            if len({r["lr"] for r in _vals(rows, k)}) >= 2]
  if not panels:
    _say("lr_sparsity_forgetting: skipped (needs 'sparsity' or "
         "'forgetting_pp' at >= 2 learning rates)")
    return None
  plt = _plt()
  fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.5),
                           squeeze=False)
  for ax, (key, label) in zip(axes[0], panels):
    ok = _vals(rows, key)
    scale = 100.0 if key == "sparsity" else 1.0
    for kl in sorted({r["kl"] for r in ok}):
      x = np.asarray([r["lr"] for r in ok if r["kl"] == kl])
      y = np.asarray([scale * r[key] for r in ok if r["kl"] == kl])
      pts = ax.plot(x, y, "o", alpha=0.7)[0]
      if len(set(x)) >= 2:
        a, b, r2 = linear_fit(x, y)
        xx = np.geomspace(x.min(), x.max(), 20)
        ax.plot(xx, a * xx + b, "-", color=pts.get_color(),
                label=f"{kl} KL (R²={'n/a' if np.isnan(r2) else f'{r2:.2f}'})")
      else:
        pts.set_label(f"{kl} KL")
    ax.set_xscale("log")
    ax.set_xticks(sorted({r["lr"] for r in ok}))
    ax.set_xticklabels([f"{v:.0e}" for v in sorted({r["lr"] for r in ok})])
    ax.minorticks_off()
    ax.set_xlabel("learning rate (log scale)")
    ax.set_ylabel(label)
    ax.legend(fontsize=8)
  fig.suptitle("Sparsity and forgetting against the learning rate "
               "(linear fit over runs)")
  return _save(fig, out_dir, "lr_sparsity_forgetting.png")


def _harder_suites(rows) -> list[str]:
  found = {k for r in rows for k in r if table.is_number(r.get(k))}
  cd = sorted((int(m.group(1)), k) for k in found
              if (m := re.fullmatch(r"acc/countdown(\d+)", k)))
  train_n = {int(m.group(1)) for r in rows
             if (m := re.fullmatch(r"countdown(\d+)", str(r.get("task"))))}
  lo = max(train_n) if train_n else 3
  return [k for n, k in cd if n > lo]


def harder_countdown(rows, out_dir, refs=None, n_test=None,
                     harder=None) -> str | None:
  suites = list(harder) if harder else _harder_suites(rows)
  policies = sorted({r["policy"] for r in rows})
  if not suites:
    _say("harder_countdown: skipped (needs 'acc/countdown<N>' for N above the "
         "training N)")
    return None
  refs = {s: (refs or {}).get(s) or {} for s in suites}
  values = [r[s] for s in suites for r in _vals(rows, s)]
  values += [v for s in suites for v in refs[s].values() if v is not None]
  if not any(values):
    _say("harder_countdown: skipped (every model scores 0 on "
         f"{', '.join(suites)}: nothing to show)")
    return None
  plt = _plt()
  fig, ax = plt.subplots(figsize=(5.5, 3.8))
  width = 0.8 / max(len(policies), 1)
  for i, pol in enumerate(policies):
    means, errs = [], []
    for s in suites:
      v = [100 * r[s] for r in _vals(rows, s) if r["policy"] == pol]
      means.append(np.mean(v) if v else np.nan)
      # Arms of a policy differ in KL and lr: the bar is their mean, the
      # error bar their spread.
      errs.append(np.std(v, ddof=1) if len(v) > 1 else 0.0)
    ax.bar(np.arange(len(suites)) + i * width, means, width, yerr=errs,
           capsize=3, label=f"{pol} rollouts")
  if len(suites) == 1:
    _references(ax, refs[suites[0]])
  ax.set_xticks(np.arange(len(suites)) + width * (len(policies) - 1) / 2)
  ax.set_xticklabels([s.removeprefix("acc/") for s in suites])
  ax.set_ylim(0, max(1.0, 1.25 * max(100 * v for v in values)))
  ax.set_ylabel("greedy accuracy (%)")
  ax.set_title("Harder variants by rollout policy\n"
               "(bar: mean over arms; error bar: spread over arms)", fontsize=10)
  ax.legend(fontsize=7)
  return _save(fig, out_dir, "harder_countdown.png")


def moving_average(x, k: int) -> np.ndarray:
  """Mean of each window of k consecutive values ('valid': len(x) - k + 1)."""
  x = np.asarray(x, np.float64)
  k = max(1, min(int(k), len(x)))
  c = np.cumsum(np.concatenate([[0.0], x]))
  return (c[k:] - c[:-k]) / k


def rlvr(rows, out_dir, accuracy="accuracy", n_test=None) -> str | None:
  """Reward curves of the RLVR stages and `accuracy` before / after them."""
  staged = [r for r in rows if r.get("rlvr_rewards")]
  if not staged:
    _say("rlvr: skipped (no finished RLVR stage)")
    return None
  plt = _plt()
  fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
  for i, r in enumerate(staged):
    y = np.asarray(r["rlvr_rewards"], np.float64)
    k = rlvr_lib.reward_window(len(y))
    color = f"C{i % 10}"
    ax.plot(np.arange(1, len(y) + 1), y, color=color, alpha=0.2, linewidth=0.8)
    ax.plot(np.arange(k, len(y) + 1), moving_average(y, k), color=color,
            label=r["name"])
  ax.set_xlabel("GRPO iteration")
  ax.set_ylabel("mean reward of the iteration's samples")
  ax.set_title("RLVR: reward per iteration (line: moving average)", fontsize=10)
  ax.legend(fontsize=6)
  x = np.arange(len(staged))
  before = [100 * (r.get(accuracy) or 0.0) for r in staged]
  after = [100 * (r.get(table.RLVR + accuracy) or 0.0) for r in staged]
  err = [[_errors([v], n_test) for v in vals] for vals in (before, after)]
  bx.bar(x - 0.2, before, 0.4, yerr=err[0], label="after distillation")
  bx.bar(x + 0.2, after, 0.4, yerr=err[1], label="after RLVR")
  bx.set_xticks(x, [r["name"] for r in staged], rotation=20, ha="right",
                fontsize=6)
  bx.set_ylabel(f"{accuracy} (%)")
  bx.set_title("Before and after RLVR" + (
      f"\n(error bars: binomial s.e., {n_test} problems)" if n_test else ""),
               fontsize=10)
  bx.legend(fontsize=7)
  return _save(fig, out_dir, "rlvr.png")


def rlvr_seeds(rows, out_dir) -> list[str]:
  """Fig. 6 / 26: per distillation learning rate, a panel per (policy, KL)
  with one RLVR reward curve per seed; [] without RLVR stages."""
  staged = [r for r in rows if r.get("rlvr_rewards")]
  if not staged:
    return []
  plt = _plt()
  out = []
  for lr in sorted({r.get("lr") for r in staged}, key=lambda v: (v is None, v)):
    at = [r for r in staged if r.get("lr") == lr]
    panels = sorted({(str(r.get("policy")), str(r.get("kl"))) for r in at})
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.2),
                             sharey=True, squeeze=False)
    for ax, (policy, kl) in zip(axes[0], panels):
      curves = sorted((r for r in at if (str(r.get("policy")), str(r.get("kl")))
                       == (policy, kl)), key=lambda r: str(r.get("seed")))
      for i, r in enumerate(curves):
        y = np.asarray(r["rlvr_rewards"], np.float64)
        x = np.asarray(r.get("rlvr_reward_steps") or range(1, len(y) + 1))
        k = rlvr_lib.reward_window(len(y))
        ax.plot(x, y, color=f"C{i}", alpha=0.2, linewidth=0.8)
        ax.plot(x[k - 1:], moving_average(y, k), color=f"C{i}",
                label=f"seed {r.get('seed')}")
      ax.set_title(f"{policy} rollouts, {kl} KL", fontsize=9)
      ax.set_xlabel("GRPO step")
      ax.legend(fontsize=6)
    axes[0][0].set_ylabel("mean training reward")
    lr_s = "none" if lr is None else f"{lr:.0e}"
    fig.suptitle(f"RLVR rewards from the arms distilled at lr {lr_s}, one "
                 "curve per distillation seed", fontsize=10)
    out.append(_save(fig, out_dir, f"rlvr_seeds_lr{lr_s}.png"))
  return out


def _save(fig, out_dir, name):
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, name)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  _plt().close(fig)
  return path


def make_figures(rows: Sequence[Mapping], out_dir: str, *, refs=None,
                 n_test=None, harder=None) -> list[str]:
  """Draws every figure the rows allow; returns the paths written.

  `refs` ({metric: {label: accuracy}}) adds reference lines (e.g. the teacher
  and the student before distillation) to the accuracy figures; `n_test`
  ({metric: problems}) gives single-seed points a binomial error bar;
  `harder` names the harder suites' row keys (default: Countdown suites of
  more numbers than the training task).
  """
  out = []
  n_acc = (n_test or {}).get("accuracy")
  for path in (accuracy_vs_lambda(rows, out_dir, refs, n_test),
               lr_sparsity_forgetting(rows, out_dir),
               harder_countdown(rows, out_dir, refs, n_test, harder),
               rlvr(rows, out_dir, n_test=n_acc)):
    if path:
      out.append(path)
  return out + rlvr_seeds(rows, out_dir)
