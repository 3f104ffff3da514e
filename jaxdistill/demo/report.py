"""The demo's output: the table, the figures and the findings paragraph.

Every sentence of the findings is chosen by a comparison of the run's own
numbers (`findings`); a difference counts as real only when it exceeds twice
its standard error (`_clear`): the binomial standard error over the test
problems, pooled over seeds, or the spread over seeds when that is larger.
So small suites cannot "reproduce" a finding by noise.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
import math
import os

import numpy as np

from jaxdistill.demo import tasks as demo_tasks
from jaxdistill.sweep import figures as study_figures
from jaxdistill.sweep import grid as grid_lib
from jaxdistill.sweep import rlvr as rlvr_lib
from jaxdistill.sweep import table as table_lib

ID_S = f"arith{demo_tasks.ID_NUMBERS}"  # suite names
HARD_S = f"arith{demo_tasks.HARDER_NUMBERS}"
ID_NAME = f"{demo_tasks.ID_NUMBERS}-number arithmetic"
HARD_NAME = f"{demo_tasks.HARDER_NUMBERS}-number arithmetic"

COLUMNS = (  # (row key, header, kind) kind: pct | pp | sci | str
    ("kl", "KL", "str"), ("policy", "rollouts", "str"), ("lam", "lambda", "str"),
    ("lr", "lr", "sci"), ("precision", "weights", "str"),
    (f"acc/{ID_S}", ID_NAME, "pct"),
    ("coverage", "pass@k", "pct"), (f"acc/{HARD_S}", f"{HARD_NAME} (harder)", "pct"),
    ("acc/addition", "addition (OOD)", "pct"),
    ("forgetting_pp", "forgetting", "pp"),
    # The paper's S_tau (float32, strict <), then the former bf16 figure.
    ("sparsity", "S_1e-6 f32", "pct"), ("sparsity_S_1e-8_f32", "S_1e-8 f32", "pct"),
    ("sparsity_unchanged_1e-5_bf16", "unchanged 1e-5 bf16", "pct"))
# The RLVR stage (--rlvr): after-RLVR accuracies (study.table's rlvr/
# columns), sampled accuracy before and after, and the mean reward of the
# first and last tenth of the GRPO iterations.
SAMPLED = f"sampled/{ID_S}"
RLVR_KEYS = (f"rlvr/acc/{ID_S}", f"rlvr/acc/{HARD_S}", "rlvr/acc/addition",
             SAMPLED, f"rlvr/{SAMPLED}", "reward_start", "reward_end")
NUMERIC = tuple(k for k, _, kind in COLUMNS if kind in ("pct", "pp")) + (
    "accuracy",) + RLVR_KEYS + table_lib.SPARSITY_KINDS
# The sparsity-by-layer-kind table: (header, row key prefix) per column.
KIND_COLUMNS = (("whole model", "sparsity"),
                *((k.replace("_", " "), f"sparsity_{k}")
                  for k in table_lib.KINDS))


def rows_with_extras(rows, grid_dir) -> list[dict]:
  """Table rows (study.table) plus the demo's extra figures from results.json."""
  out = []
  for r in rows:
    run_dir = os.path.join(grid_dir, grid_lib.safe_name(r["name"]))
    ev = table_lib.read_results(
        os.path.join(run_dir, "results.json"))["eval"] or {}
    r = dict(r)
    cfg = table_lib.read_json(os.path.join(run_dir, "config.json"),
                              fix=f"delete {run_dir} to rerun the arm")
    r["precision"] = (cfg.get("student") or {}).get("param_dtype") or "float32"
    r["pass_k"] = max((int(k.split("@")[1]) for k in ev
                       if k.startswith("id/pass@")), default=None)
    r[SAMPLED] = ev.get(f"{ID_S}/sampled_acc")
    stage = os.path.join(rlvr_lib.stage_dir(run_dir), "results.json")
    if os.path.isfile(stage):
      res = table_lib.read_results(stage)
      r[f"rlvr/{SAMPLED}"] = (res["eval"] or {}).get(f"{ID_S}/sampled_acc")
      rewards = res.get("rewards") or []
      if rewards:
        k = rlvr_lib.reward_window(len(rewards))
        r["reward_start"] = float(np.mean(rewards[:k]))
        r["reward_end"] = float(np.mean(rewards[-k:]))
        r["reward_window"] = k
    out.append(r)
  return out


def arm_means(rows: Sequence[Mapping]) -> list[dict]:
  """One row per arm: the factors, the mean of each metric over seeds, its
  sample std as `<key>_std` and the number of seeds as `seeds`."""
  groups: dict[str, list] = {}
  for r in rows:
    groups.setdefault(r["arm"], []).append(r)
  out = []
  for arm, rs in groups.items():
    a = {k: rs[0].get(k) for k in ("arm", "kl", "policy", "lam", "lr",
                                   "precision", "pass_k", "reward_window")}
    a["seeds"] = len(rs)
    for k in NUMERIC:
      v = [r[k] for r in rs if r.get(k) is not None]
      a[k] = float(np.mean(v)) if v else None
      a[f"{k}_std"] = float(np.std(v, ddof=1)) if len(v) > 1 else None
    out.append(a)
  return out


def _fmt(v, kind, std=None):
  if v is None or (isinstance(v, float) and not math.isfinite(v)):
    return "-"
  if kind == "pct":
    return f"{100 * v:.1f}" + (f" ± {100 * std:.1f}" if std is not None else "")
  if kind == "pp":
    return f"{v:+.1f}" + (f" ± {std:.1f}" if std is not None else "")
  if kind == "sci":
    return f"{v:.0e}"
  return str(v)


def baseline_row(name: str, ev: Mapping, *, knows_addition: bool) -> dict:
  ks = [int(k.split("@")[1]) for k in ev if k.startswith(f"{ID_S}/pass@")]
  return {"kl": name, "policy": "-", "lam": "-", "lr": None, "precision": "-",
          f"acc/{ID_S}": ev.get(f"{ID_S}/greedy_acc"),
          "coverage": ev.get(f"{ID_S}/pass@{max(ks)}") if ks else None,
          f"acc/{HARD_S}": ev.get(f"{HARD_S}/greedy_acc"),
          # The teacher never learnt the addition task: no figure, not 0.
          "acc/addition": (ev.get("addition/greedy_acc") if knows_addition
                           else None)}


def table_markdown(arms: Sequence[Mapping], teacher: Mapping,
                   student: Mapping, n_test: Mapping) -> str:
  lines = ["| " + " | ".join(h for _, h, _ in COLUMNS) + " |",
           "|" + "---|" * len(COLUMNS)]
  for r in [baseline_row("teacher", teacher, knows_addition=False),
            baseline_row("student (before)", student, knows_addition=True),
            *arms]:
    lines.append("| " + " | ".join(_fmt(r.get(k), kind, r.get(f"{k}_std"))
                                   for k, _, kind in COLUMNS) + " |")
  k = next((r.get("pass_k") for r in arms if r.get("pass_k")), None)
  seeds = max((r.get("seeds", 1) for r in arms), default=1)
  spread = (f"mean ± sample std over {seeds} seeds" if seeds > 1 else
            "one seed per arm")
  lines += ["", f"Greedy accuracy in % on held-out problems ({spread}; "
            f"{ID_NAME}: {n_test[ID_S]} problems, {HARD_NAME}: "
            f"{n_test[HARD_S]}, addition: {n_test['addition']} facts); "
            f"pass@k with k={k}; forgetting = drop in addition accuracy vs the "
            "student before distillation, percentage points (positive = "
            "forgotten); S_1e-6 f32 and S_1e-8 f32 = update sparsity as the "
            "paper defines it, % of parameters with |change| < tau (strict), "
            "compared in float32; unchanged 1e-5 bf16 = the project's former "
            "figure, % with |change| <= 1e-5 after both are rounded to "
            "bfloat16; weights = how the student's weights are stored and "
            "updated (float32 master weights, or bfloat16 weights and Adam "
            "moments, measured from the student rounded to bfloat16). The "
            "teacher was never trained on addition ('-')."]
  return "\n".join(lines)


def sparsity_markdown(arms: Sequence[Mapping]) -> str:
  """S_1e-6 / S_1e-8 per arm by layer kind, with the seen / never-seen
  embedding rows apart ('' when no arm has per-kind figures)."""
  if not any(a.get("sparsity_attention_S_1e-6_f32") is not None for a in arms):
    return ""

  def pair(a, prefix):
    keys = (("sparsity", "sparsity_S_1e-8_f32") if prefix == "sparsity" else
            (f"{prefix}_S_1e-6_f32", f"{prefix}_S_1e-8_f32"))
    if a.get(keys[0]) is None:
      return "-"
    return " / ".join(_fmt(a.get(k), "pct") for k in keys)

  def ids(a):
    n = [a.get(f"sparsity_embeddings_{p}_rows") for p in ("seen", "unseen")]
    return "-" if None in n else f"{n[0]:,.0f} / {n[1]:,.0f}"

  heads = ("KL", "rollouts", "lr", "weights",
           *(h for h, _ in KIND_COLUMNS), "token ids seen / never seen")
  lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
  for a in arms:
    lines.append("| " + " | ".join(
        [str(a["kl"]), str(a["policy"]), _fmt(a["lr"], "sci"),
         str(a.get("precision"))] + [pair(a, p) for _, p in KIND_COLUMNS]
        + [ids(a)]) + " |")
  lines += ["", "Update sparsity by layer kind, S_1e-6 / S_1e-8 in % (the "
            "paper's S_tau, strict <, compared in float32; mean over seeds): "
            "attention = q, k, v, o projections, mlp = gate, up, down, norms "
            "= every RMSNorm scale, embeddings = the token embedding (and an "
            "untied output head); embeddings seen / never seen = its rows of "
            "the token ids the arm's training sequences (prompts and "
            "completions, not padding) did / never hold. A tied output head "
            "gets gradient at every row through the softmax, so never-seen "
            "rows move too."]
  return "\n".join(lines)


def _change(before, after, std_b=None, std_a=None):
  if before is None or after is None:
    return "-"
  return (f"{_fmt(before, 'pct', std_b)} -> {_fmt(after, 'pct', std_a)} "
          f"({100 * (after - before):+.1f})")


def staged_arms(arms: Sequence[Mapping]) -> list[Mapping]:
  """The arms that went through the RLVR stage."""
  return [a for a in arms if a.get(f"rlvr/acc/{ID_S}") is not None]


def rlvr_markdown(arms: Sequence[Mapping], n_test: Mapping) -> str:
  """Before -> after RLVR (change, pp) per arm that had the stage."""
  staged = staged_arms(arms)
  if not staged:
    return ""
  heads = ("KL", "rollouts", "lr", f"{ID_NAME}, greedy",
           f"{ID_NAME}, sampled (T = 1)", f"{HARD_NAME} (harder)",
           "addition (OOD)", "mean reward, first -> last iterations")
  lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
  for a in staged:
    pairs = [(f"acc/{ID_S}", f"rlvr/acc/{ID_S}"), (SAMPLED, f"rlvr/{SAMPLED}"),
             (f"acc/{HARD_S}", f"rlvr/acc/{HARD_S}"),
             ("acc/addition", "rlvr/acc/addition")]
    cells = [str(a["kl"]), str(a["policy"]), _fmt(a["lr"], "sci")]
    cells += [_change(a.get(b), a.get(c), a.get(f"{b}_std"), a.get(f"{c}_std"))
              for b, c in pairs]
    rs, re_ = a.get("reward_start"), a.get("reward_end")
    cells.append("-" if rs is None else f"{rs:.2f} -> {re_:.2f}")
    lines.append("| " + " | ".join(cells) + " |")
  k = next((a.get("reward_window") for a in staged), None)
  lines += ["", "RLVR (GRPO on the in-distribution prompts, reward 1 for a "
            "correct answer) from the best arm (greedy in-distribution "
            "accuracy, over learning rates) of each KL direction x rollout "
            "policy: accuracy in % after distillation -> after RLVR (change in "
            "percentage points), on the same held-out problems "
            f"({n_test[ID_S]} / {n_test[HARD_S]} / {n_test['addition']}); "
            f"mean reward over the first and the last {k} iterations."]
  return "\n".join(lines)


# ----------------------------------------------------------------- findings

def _se(p, n):
  return math.sqrt(max(p * (1 - p), 1.0 / n) / n)


def _sd(a, key, n):
  """Standard error of an arm's mean of `key`: binomial over its n test
  problems x seeds, or the spread over seeds if larger."""
  v, seeds = a[key], a.get("seeds", 1)
  se = _se(v, n * seeds)
  std = a.get(f"{key}_std")
  return max(se, std / math.sqrt(seeds)) if std is not None else se


def _clear_se(a, sa, b, sb) -> bool:
  return a - b > 2 * math.hypot(sa, sb)


def _clear(a, b, n) -> bool:
  """a exceeds b by more than twice the binomial standard error of the
  difference (n test problems each)."""
  return _clear_se(a, _se(a, n), b, _se(b, n))


def _mean(rows, key, **match):
  v = [r[key] for r in rows if r.get(key) is not None and
       all(r.get(k) == m for k, m in match.items())]
  return float(np.mean(v)) if v else None


def _pooled(rows, key, n, **match):
  """(mean, standard error) of `key` over the arms matching `match`."""
  sel = [r for r in rows if r.get(key) is not None and
         all(r.get(k) == m for k, m in match.items())]
  if not sel:
    return None, None
  m = float(np.mean([r[key] for r in sel]))
  se = math.sqrt(sum(_sd(r, key, n) ** 2 for r in sel)) / len(sel)
  return m, se


def _best(rows, key, n, **match):
  sel = [r for r in rows if r.get(key) is not None and
         all(r.get(k) == m for k, m in match.items())]
  if not sel:
    return None, None
  b = max(sel, key=lambda r: r[key])
  return b[key], _sd(b, key, n)


def findings(arms: Sequence[Mapping], teacher: Mapping, student: Mapping,
             n_test: Mapping | int, chance: float = 0.5, figures=None
             ) -> list[tuple[str, bool | None, str]]:
  """[(finding, reproduced?, sentence)]; None when the run cannot tell.

  `arms` are per-arm rows (arm_means; a single-seed run's rows serve as is),
  `n_test` the number of problems per suite ({suite: n}, or one n for all),
  `chance` the addition suite's accuracy by guessing.
  """
  n_of = (lambda s: int(n_test[s])) if isinstance(n_test, Mapping) else (
      lambda s: int(n_test))
  n3, n4, nadd = n_of(ID_S), n_of(HARD_S), n_of("addition")
  out = []
  acc, harder = f"acc/{ID_S}", f"acc/{HARD_S}"
  t3, s3 = teacher[f"{ID_S}/greedy_acc"], student[f"{ID_S}/greedy_acc"]
  ok = _clear(t3, s3, n3)
  out.append(("setup", ok,
              f"Before distillation the teacher solves {100 * t3:.1f} % of "
              f"held-out {ID_NAME} problems and the student {100 * s3:.1f} %"
              + (" (a clear gap, so distillation has something to transfer)."
                 if ok else ": the gap is within noise, so this run cannot show"
                 " much.")))

  # If no arm beats the student it started from, comparisons of accuracy
  # between arms measure noise, not distillation: they count as untested.
  best, best_se = _best(arms, acc, n3)
  moved = best is not None and _clear_se(best, best_se, s3, _se(s3, n3))
  if best is not None and t3 > s3:
    out.append(("distillation moves accuracy", moved,
                f"The best arm reaches {100 * best:.1f} %, closing "
                f"{100 * (best - s3) / (t3 - s3):.0f} % of the teacher-student "
                "gap" + ("." if moved else ", not clearly above the student's "
                         "own accuracy.")))
  first_acc = len(out)

  b_on, se_on = _best(arms, acc, n3, policy="student")
  b_off, se_off = _best(arms, acc, n3, policy="teacher")
  if b_on is not None and b_off is not None:
    edge = _clear_se(b_on, se_on, b_off, se_off)
    out.append(("no on-policy edge", not edge,
                f"Best accuracy with student rollouts is {100 * b_on:.1f} % "
                f"against {100 * b_off:.1f} % with teacher rollouts: "
                + ("on-policy is clearly better here, which the study does not "
                   "find (no consistent edge, 72 % vs 73 %)." if edge else
                   "no clear edge for on-policy, as in the study (72 % vs 73 %).")))

  def spread(kl):
    v = [r[acc] for r in arms if r["kl"] == kl and r.get(acc) is not None]
    return (min(v), max(v)) if v else None

  def lr_effect(kl):
    """Mean |accuracy at the highest lr - at the lowest| over policies."""
    lrs_kl = sorted({r["lr"] for r in arms if r["kl"] == kl})
    d = [abs(_mean(arms, acc, kl=kl, policy=p, lr=lrs_kl[-1]) -
             _mean(arms, acc, kl=kl, policy=p, lr=lrs_kl[0]))
         for p in sorted({r["policy"] for r in arms if r["kl"] == kl})
         if _mean(arms, acc, kl=kl, policy=p, lr=lrs_kl[0]) is not None and
         _mean(arms, acc, kl=kl, policy=p, lr=lrs_kl[-1]) is not None]
    return float(np.mean(d)) if d and len(lrs_kl) > 1 else None
  f, rv = spread("forward"), spread("reverse")
  if f and rv:
    # Differences must exceed noise: twice the s.e. of a difference of two
    # arms' accuracies.
    noise = 2 * math.sqrt(2) * _se(0.5 * (f[0] + f[1]), n3)
    span = (f"Forward-KL arms span {100 * f[0]:.1f}-{100 * f[1]:.1f} % and "
            f"reverse-KL arms {100 * rv[0]:.1f}-{100 * rv[1]:.1f} %")
    e_f, e_r = lr_effect("forward"), lr_effect("reverse")
    if e_f is not None and e_r is not None:
      wider = e_r - e_f > noise
      text = (f"{span}; changing the learning rate moves reverse-KL arms by "
              f"{100 * e_r:.1f} pp and forward-KL arms by {100 * e_f:.1f} pp "
              "on average: ")
    else:
      wider = (rv[1] - rv[0]) - (f[1] - f[0]) > noise
      text = span + ": "
    out.append(("forward KL stable, reverse KL sensitive", wider, text
                + ("reverse KL is the more setting-sensitive direction, as in "
                   "the study (71-73 % vs 35-72 %)." if wider else
                   "reverse KL is not clearly more setting-sensitive here, "
                   "unlike the study (71-73 % vs 35-72 %).")))
    r_on, se_r_on = _pooled(arms, acc, n3, kl="reverse", policy="student")
    r_off, se_r_off = _pooled(arms, acc, n3, kl="reverse", policy="teacher")
    if r_on is not None and r_off is not None:
      fav = _clear_se(r_on, se_r_on, r_off, se_r_off)
      out.append(("reverse KL favours student rollouts", fav,
                  f"Under reverse KL, student rollouts average {100 * r_on:.1f} %"
                  f" and teacher rollouts {100 * r_off:.1f} %: "
                  + ("student rollouts are clearly better, as the study finds."
                     if fav else "no clear preference for student rollouts, "
                     "unlike the study.")))

  verdicts = []
  for kl in sorted({r["kl"] for r in arms}):
    h_on, se_h_on = _pooled(arms, harder, n4, kl=kl, policy="student")
    h_off, se_h_off = _pooled(arms, harder, n4, kl=kl, policy="teacher")
    if h_on is not None and h_off is not None:
      verdicts.append((kl, h_on, h_off, _clear_se(h_on, se_h_on, h_off, se_h_off)))
  t4 = teacher.get(f"{HARD_S}/greedy_acc")
  if verdicts:
    good = all(v[3] for v in verdicts)
    parts = "; ".join(f"{kl} KL {100 * a:.1f} % vs {100 * b:.1f} %"
                      for kl, a, b, _ in verdicts)
    text = (f"On the harder {HARD_NAME} (teacher {100 * (t4 or 0):.1f} %), "
            f"student vs teacher rollouts: {parts}: "
            + ("on-policy data clearly helps under every KL direction, as "
               "in the study." if good else "on-policy data does not "
               "clearly help under every KL direction, unlike the study."))
    if not t4 or not _clear(t4, 0.0, n4):
      good, text = None, text + (" Untested: the teacher itself does not "
                                 "solve the harder suite.")
    out.append(("on-policy helps on harder problems", good, text))

  if not moved:
    out[first_acc:] = [(n, None, s) for n, _, s in out[first_acc:]]
    if len(out) > first_acc:
      out.append(("accuracy untested", None,
                  "The accuracy comparisons above are untested: no arm "
                  f"clearly beats the student's own {100 * s3:.1f} %."))

  lrs = sorted({r["lr"] for r in arms})
  if len(lrs) >= 2:
    lo, hi = lrs[0], lrs[-1]
    fg_lo = _mean(arms, "forgetting_pp", lr=lo)
    fg_hi = _mean(arms, "forgetting_pp", lr=hi)
    if fg_lo is not None and fg_hi is not None:
      # Forgetting is a drop from one shared baseline: compare what is left.
      a_lo, se_lo = _pooled(arms, "acc/addition", nadd, lr=lo)
      a_hi, se_hi = _pooled(arms, "acc/addition", nadd, lr=hi)
      more = _clear_se(a_lo, se_lo, a_hi, se_hi)
      # Forgetting needs a skill to lose: the student must beat guessing.
      base = student.get("addition/greedy_acc")
      knows = base is not None and _clear(base, chance, nadd)
      out.append(("forgetting grows with LR", more if knows else None,
                  f"Forgetting on the addition suite averages {fg_lo:+.1f} pp at "
                  f"lr {lo:.0e} and {fg_hi:+.1f} pp at lr {hi:.0e}: "
                  + ("the higher learning rate forgets clearly more, as in the "
                     "study (<= 1.3 pp vs 11-14 pp)." if more else
                     "no clear growth of forgetting with the learning rate, "
                     "unlike the study (<= 1.3 pp vs 11-14 pp).")
                  + ("" if knows else " Untested: the student's addition "
                     "accuracy before distillation is at chance "
                     f"({100 * chance:.0f} %), so there is nothing to forget.")))
    sp = [(r["lr"], r["sparsity"]) for r in arms if r.get("sparsity") is not None]
    if len({x for x, _ in sp}) >= 2:
      s_lo = _mean(arms, "sparsity", lr=lo)
      s_hi = _mean(arms, "sparsity", lr=hi)
      _, _, r2 = study_figures.linear_fit([x for x, _ in sp], [y for _, y in sp])
      sparser = s_lo > s_hi
      out.append(("sparsity falls with LR", sparser,
                  f"Update sparsity S_1e-6 (float32) is {100 * s_lo:.1f} % at lr "
                  f"{lo:.0e} and {100 * s_hi:.1f} % at lr {hi:.0e} (R^2 of a "
                  f"linear fit over arms {r2:.2f}): "
                  + ("low learning rates leave more weights untouched, as in "
                     "the study (85-90 % vs 52-60 %, R^2 about 1.00)." if sparser
                     else "sparsity does not fall with the learning rate here, "
                     "unlike the study.")))

  out += rlvr_findings(arms, n3, n4)
  if figures is not None and not any("harder" in os.path.basename(p)
                                     for p in figures) and verdicts:
    out.append(("no harder figure", None,
                f"No harder-problem figure is drawn: no model solves any "
                f"{HARD_NAME} problem."))
  return out


def rlvr_findings(arms, n3: int, n4: int) -> list[tuple[str, bool | None, str]]:
  """Does GRPO learn here (a check), and does the on-policy gain survive it
  (the study: it does not reliably)?"""
  staged = staged_arms(arms)
  if not staged:
    return [("gain does not survive RLVR", None,
             "The RLVR stage did not run (python -m jaxdistill.demo --rlvr adds "
             "it), so whether the on-policy gain survives RLVR is untested.")]
  out = []
  rew0 = float(np.mean([a["reward_start"] for a in staged]))
  rew1 = float(np.mean([a["reward_end"] for a in staged]))
  s0, se0 = _pooled(staged, SAMPLED, n3)
  s1, se1 = _pooled(staged, f"rlvr/{SAMPLED}", n3)
  learns = s0 is not None and s1 is not None and _clear_se(s1, se1, s0, se0)
  out.append(("RLVR learns", learns,
              f"GRPO raises the mean reward from {rew0:.2f} in its first "
              f"iterations to {rew1:.2f} in its last (mean over the "
              f"{len(staged)} arms it started from), and sampled accuracy on "
              f"{ID_NAME} from {100 * s0:.1f} % to {100 * s1:.1f} % "
              + ("(clearly)." if learns else "(not clearly: within twice the "
                 "standard error).")))

  def gains(before_key, after_key, n):
    """Per KL: (on-policy gain before, its s.e., gain after, its s.e.)."""
    res = {}
    for kl in sorted({a["kl"] for a in staged}):
      on = [a for a in staged if a["kl"] == kl and a["policy"] == "student"]
      off = [a for a in staged if a["kl"] == kl and a["policy"] == "teacher"]
      if on and off:
        on, off = on[0], off[0]
        res[kl] = tuple(
            x for key in (before_key, after_key) for x in (
                on[key] - off[key], math.hypot(_sd(on, key, n),
                                               _sd(off, key, n))))
    return res
  hard = gains(f"acc/{HARD_S}", f"rlvr/acc/{HARD_S}", n4)
  ind = gains(f"acc/{ID_S}", f"rlvr/acc/{ID_S}", n3)
  if not hard:
    return out

  def say(g):
    return "; ".join(f"{kl} KL {100 * b:+.1f} ± {100 * sb:.1f} pp before, "
                     f"{100 * a:+.1f} ± {100 * sa:.1f} pp after"
                     for kl, (b, sb, a, sa) in g.items())
  clear_before = [kl for kl, (b, sb, _, _) in hard.items() if b > 2 * sb]
  before = [a[f"acc/{ID_S}"] for a in staged]
  after = [a[f"rlvr/acc/{ID_S}"] for a in staged]
  text = (f"On-policy gain (best student-rollout arm minus best teacher-"
          f"rollout arm, ± its standard error) on the harder {HARD_NAME}: "
          f"{say(hard)}; on {ID_NAME}: {say(ind)}. RLVR "
          f"{'narrows' if max(after) - min(after) < max(before) - min(before) else 'does not narrow'}"
          f" the spread of these {len(staged)} arms on {ID_NAME} (from "
          f"{100 * (max(before) - min(before)):.1f} pp to "
          f"{100 * (max(after) - min(after)):.1f} pp). ")
  if not clear_before:
    out.append(("gain does not survive RLVR", None, text + (
        "Untested: there is no clear on-policy gain on the harder problems "
        "before RLVR for it to survive or lose.")))
  else:
    kept = [kl for kl in clear_before if hard[kl][2] > 2 * hard[kl][3]]
    lost = len(kept) < len(clear_before)
    out.append(("gain does not survive RLVR", lost, text + (
        "The gain is no longer clear after RLVR under "
        f"{', '.join(k for k in clear_before if k not in kept)} KL, as the "
        "study finds (it does not reliably survive)." if lost else
        "The gain survives RLVR under every KL direction that had it, "
        "unlike the study.")))
  return out


def precision_finding(arms: Sequence[Mapping], n_test: Mapping | int
                      ) -> list[tuple[str, bool | None, str]]:
  """This project's finding (not the paper's): at the grid's lowest learning
  rate, does update sparsity S_1e-6 depend on how the weights are stored?
  The same arms (KL, policy) in float32 and in bfloat16, their mean S_1e-6
  and in-distribution accuracy. [] unless both precisions ran."""
  kinds = sorted({r.get("precision") for r in arms} - {None})
  if kinds != ["bfloat16", "float32"]:
    return []
  n3 = int(n_test[ID_S]) if isinstance(n_test, Mapping) else int(n_test)
  acc = f"acc/{ID_S}"
  lo = min(r["lr"] for r in arms)
  s = {p: _mean(arms, "sparsity", lr=lo, precision=p) for p in kinds}
  a = {p: _pooled(arms, acc, n3, lr=lo, precision=p) for p in kinds}
  if s["float32"] is None or s["bfloat16"] is None:
    return []
  sd = [r.get("sparsity_std") for r in arms
        if r["lr"] == lo and r.get("sparsity_std") is not None]
  depends, text = table_lib.precision_text(
      lo, s, {p: a[p][0] for p in kinds}, sd)
  return [("sparsity depends on precision", depends, text)]


def paragraph(found) -> str:
  """The findings as one paragraph; the headline counts the study's findings
  (not the setup checks)."""
  study = [ok for n, ok, _ in found
           if n not in ("setup", "distillation moves accuracy",
                        "accuracy untested", "no harder figure",
                        "RLVR learns", "sparsity depends on precision")]
  yes = sum(1 for ok in study if ok)
  tested = sum(1 for ok in study if ok is not None)
  head = (f"This run reproduces {yes} of the {tested} headline findings it can "
          f"test ({len(study) - tested} untested).")
  return " ".join([head] + [s for _, _, s in found])


# ------------------------------------------------------------------ figures

def make_figures(rows: Sequence[Mapping], teacher: Mapping, student: Mapping,
                 n_test: Mapping, out_dir: str) -> list[str]:
  """The study's figures with the teacher and the student before
  distillation as reference lines; error bars: binomial standard error over
  the test problems with one seed, spread over seeds with several."""
  refs = {
      "accuracy": {"teacher": teacher.get(f"{ID_S}/greedy_acc"),
                   "student before": student.get(f"{ID_S}/greedy_acc")},
      f"acc/{HARD_S}": {"teacher": teacher.get(f"{HARD_S}/greedy_acc"),
                        "student before": student.get(f"{HARD_S}/greedy_acc")},
  }
  n = {"accuracy": n_test[ID_S], f"acc/{HARD_S}": n_test[HARD_S]}
  return study_figures.make_figures(rows, out_dir, refs=refs, n_test=n,
                                    harder=[f"acc/{HARD_S}"])
