"""The sweep summary's weight-precision finding (issue 41): the same arms in
float32 and bfloat16 at the lowest learning rate."""
from matplotlib.container import ErrorbarContainer
import numpy as np

from jaxdistill.sweep import table


def _result(prec, lr, seed, sparsity, acc, kl="forward"):
  name = f"kl={kl},lr={lr:g},precision={prec},seed={seed}"
  return {"name": name, "dirname": name,
          "factors": {"kl": kl, "lr": lr, "precision": prec, "seed": seed},
          "study": {"kl": kl, "policy": "student", "lr": lr, "seed": seed,
                    "precision": prec},
          "eval": {"sparsity/S_1e-6_f32": sparsity, "id/single_acc": acc},
          "train": {}}


def _md(tmp_path, results):
  _, md = table.write_table([table.row_of(r) for r in results], str(tmp_path))
  return open(md).read()


def test_precision_finding_compares_the_low_rate_arms(tmp_path):
  rs = []
  for kl, (f32, bf16) in (("forward", (.02, .70)), ("reverse", (.04, .50))):
    for seed in (0, 1):
      rs += [_result("float32", 1e-5, seed, f32 + .01 * seed, .30, kl),
             _result("bfloat16", 1e-5, seed, bf16 + .01 * seed, .20, kl),
             _result("float32", 5e-5, seed, .0, .5, kl),
             _result("bfloat16", 5e-5, seed, .9, .5, kl)]
  text = _md(tmp_path, rs)
  # By hand, the lr 1e-5 arms: float32 mean (.025 + .045) / 2 = 3.5 %,
  # bfloat16 (.705 + .505) / 2 = 60.5 %; accuracy 30 % and 20 %; the bar is
  # 10 pp (the seeds' spread, 0.7 pp, is smaller).
  assert ("at lr 1e-05, S_1e-6 is 3.5 % with float32 master weights and "
          "60.5 % with weights stored and updated in bfloat16 "
          "(in-distribution accuracy 30.0 % and 20.0 %): update sparsity at "
          "the low rate depends on weight precision (a difference above 10 pp)"
          ) in text
  assert "Arms compared: 2 pair(s)." in text


def test_precision_finding_below_the_bar_and_not_measured(tmp_path):
  rs = [_result("float32", 1e-5, 0, .50, .3), _result("bfloat16", 1e-5, 0, .55, .3)]
  assert "no difference above 10 pp" in _md(tmp_path / "a", rs)
  # One precision only (every grid without the precision axis).
  text = _md(tmp_path / "b", [_result("float32", 1e-5, 0, .5, .3),
                              _result("float32", 5e-5, 0, .1, .3)])
  assert "Weight precision: not measured" in text
  # Both precisions, but only the higher rate has bfloat16: not measured.
  text = _md(tmp_path / "c", [_result("float32", 1e-5, 0, .5, .3),
                              _result("bfloat16", 5e-5, 0, .1, .3)])
  assert "Weight precision: not measured (no arm at the lowest learning " \
      "rate, 1e-05" in text


def test_rlvr_seed_figure_is_one_panel_per_arm_and_a_curve_per_seed(
    tmp_path, monkeypatch):
  from jaxdistill.sweep import figures  # pylint: disable=g-import-not-at-top
  rows = []
  for lr in (1e-5, 5e-5):
    for policy in ("student", "teacher"):
      for seed in (42, 43):
        rewards = [float(seed - 42 + i) for i in range(20)]
        rows.append({"lr": lr, "policy": policy, "kl": "forward",
                     "seed": seed, "rlvr_rewards": rewards,
                     "rlvr_reward_steps": list(range(5, 105, 5))})
  saved = {}
  real = figures._save  # pylint: disable=protected-access

  def keep(fig, out_dir, name):
    saved[name] = [[(l.get_xdata().tolist(), l.get_ydata().tolist())
                    for l in ax.get_lines()] for ax in fig.axes]
    return real(fig, out_dir, name)
  monkeypatch.setattr(figures, "_save", keep)
  paths = figures.rlvr_seeds(rows, str(tmp_path))
  assert sorted(saved) == ["rlvr_seeds_lr1e-05.png", "rlvr_seeds_lr5e-05.png"]
  assert all((tmp_path / n).exists() for n in saved) and len(paths) == 2
  panels = saved["rlvr_seeds_lr1e-05.png"]
  assert len(panels) == 2                      # student, teacher
  raw, avg = panels[0][2], panels[0][3]        # seed 43: raw, moving average
  assert raw[0][:2] == [5, 10] and raw[1][:2] == [1.0, 2.0]
  # A window of 20 // 10 = 2 values, by hand: (1 + 2) / 2 at step 10.
  assert avg[0][0] == 10 and avg[1][0] == 1.5
  assert figures.rlvr_seeds([{"lr": 1e-5}], str(tmp_path)) == []


def _rows_for_figures():
  """Per-run rows of a grid: policy x kl x lr x 3 seeds x 2 tasks."""
  rows = []
  for policy in ("student", "teacher"):
    for kl in ("forward", "reverse"):
      for lr in (1e-5, 5e-5):
        for seed in (42, 43, 44):
          for t, task in enumerate(("countdown3", "medreason")):
            rows.append({"policy": policy, "kl": kl, "lr": lr, "seed": seed,
                         "task": task, "lam": 1.0 if policy == "student" else 0.0,
                         "accuracy": 0.5 + 0.1 * t + 0.01 * (seed - 42),
                         "forgetting_pp": 2.0 * (seed - 42),
                         "sparsity": 0.9 if lr == 1e-5 else 0.5})
  return rows


def _capture(monkeypatch, module):
  saved = {}
  real = module._save  # pylint: disable=protected-access

  def keep(fig, out_dir, name):
    saved[name] = fig
    return real(fig, out_dir, name)
  monkeypatch.setattr(module, "_save", keep)
  return saved


def test_fig1_bars_are_task_means_with_the_sem_over_seeds(tmp_path, monkeypatch):
  from jaxdistill.sweep import paper_figures  # pylint: disable=g-import-not-at-top
  saved = _capture(monkeypatch, paper_figures)
  assert paper_figures.fig1(_rows_for_figures(), str(tmp_path))
  acc, ood, _ = saved["paper_fig1.png"].axes
  # Per seed the task mean is 0.55 + 0.01 (seed - 42): 55, 56, 57 %; their
  # SEM by hand: std(ddof=1) = 1 -> 1 / sqrt(3).
  bars = [p.get_height() for p in acc.patches]
  np.testing.assert_allclose(bars, [56.0] * 8)
  err = [c for c in acc.containers if isinstance(c, ErrorbarContainer)][0]
  seg = err.lines[2][0].get_segments()[0]
  np.testing.assert_allclose(seg[1][1] - seg[0][1], 2 / np.sqrt(3))
  # OOD change = -forgetting: 0, -2, -4 -> -2 with SEM 2 / sqrt(3) * ...
  np.testing.assert_allclose([p.get_height() for p in ood.patches], [-2.0] * 8)


def test_fig2_and_fig5_need_their_axes(tmp_path, monkeypatch, capsys):
  from jaxdistill.sweep import paper_figures  # pylint: disable=g-import-not-at-top
  rows = _rows_for_figures()
  assert paper_figures.fig2(rows, str(tmp_path)) is None  # two rates only
  assert "paper_fig2: skipped" in capsys.readouterr().err
  for r in rows:
    r["lr"] = {1e-5: 1e-5, 5e-5: 3e-5}[r["lr"]]
  extra = [dict(r, lr=6e-5) for r in rows]
  saved = _capture(monkeypatch, paper_figures)
  assert paper_figures.fig2(rows + extra, str(tmp_path))
  lines = saved["paper_fig2.png"].axes[0].get_lines()
  xs = sorted({x for l in lines for x in l.get_xdata()})
  np.testing.assert_allclose(xs, [1.0, 3.0, 6.0])
  # Fig. 5: pass@1 / pass@10 along the paper's lambda (teacher -1, student 1,
  # the spectrum's own lam), on Countdown-3 only here.
  spec = []
  for lam in (-1.0, 0.0, 1.0):
    for seed, p1 in ((42, 0.2), (43, 0.4)):
      spec.append({"policy": "spectrum", "lam": lam, "kl": "forward",
                   "lr": 1e-5, "seed": seed, "pass@1/countdown3_paper": p1,
                   "pass@10/countdown3_paper": p1 + 0.3})
  assert paper_figures.fig5(spec, str(tmp_path))
  ax, = saved["paper_fig5.png"].axes
  ys = sorted({round(y, 6) for c in ax.containers
               if isinstance(c, ErrorbarContainer)
               for y in c.lines[0].get_ydata()})
  assert ys == [30.0, 60.0]  # the seeds' means of pass@1 and pass@10
  assert paper_figures.paper_lambda({"policy": "teacher", "lam": 0.0}) == -1.0
