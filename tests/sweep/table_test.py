"""The sweep summary's weight-precision finding (issue 41): the same arms in
float32 and bfloat16 at the lowest learning rate."""
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
