"""The disk estimate (train/disk.py) against what a tiny run writes, the
free-space refusal, and keep_final_only's cleanup (train/checkpoint.prune)."""
import collections
import os
import pathlib
import sys

import jax
import pytest

from jaxdistill import config_lib
from jaxdistill.train import checkpoint as ckpt_lib
from jaxdistill.train import disk
from jaxdistill.train import loop as train_loop
from jaxdistill.train import setup as train_setup

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests import config_util  # pylint: disable=g-import-not-at-top,wrong-import-position

ONE_DEVICE = [jax.devices()[0]]


_config = config_util.runlocal_distill


def _files(path) -> int:
  """Brute force: the bytes of every file under `path`."""
  return sum(p.stat().st_size for p in pathlib.Path(path).rglob("*")
             if p.is_file())


def _student_params(init: dict) -> int:
  """Parameters of a Llama-style model (untied head), counted by hand."""
  d, f, v, n = (init["hidden_size"], init["intermediate_size"],
                init["vocab_size"], init["num_hidden_layers"])
  hd, h, k = init["head_dim"], init["num_attention_heads"], init["num_key_value_heads"]
  layer = d * h * hd + 2 * d * k * hd + h * hd * d + 3 * d * f + 2 * d
  return v * d + n * layer + d + d * v


# Orbax writes the arrays zstd-compressed: a float32 value's 23 mantissa bits
# are close to random in weights and Adam moments, so no checkpoint of them
# is smaller than 23/32 of their bytes (0.83 measured on this run).
MIN_COMPRESSED = 0.7


@pytest.mark.slow
def test_estimate_matches_the_files_of_a_tiny_run_and_final_only_prunes(tmp_path):
  c = _config(total_steps=2, ckpt_every=1, eval_every=2, keep_ckpts=3,
              keep_final_only=False)
  work = tmp_path / "run"
  train_loop.train(c, str(work), devices=ONE_DEVICE)
  need = disk.need(c, train_setup.model_config(c.student, "student"))

  # The train state: float32 params and AdamW's two float32 moments, plus
  # a few int32 counters (the step, Adam's count).
  n = _student_params(dict(c.student.init))
  assert 0 <= need["state_bytes"] - 3 * 4 * n <= 64, (need, n)
  assert need["export_bytes"] == 4 * n

  ckpts = work / "checkpoints"
  assert sorted(os.listdir(ckpts)) == ["1", "2"]
  for step in ("1", "2"):
    on_disk = _files(ckpts / step)
    assert MIN_COMPRESSED * need["state_bytes"] <= on_disk, (step, on_disk)
    assert on_disk <= need["checkpoint_bytes"], (step, on_disk, need)
  weights = (work / "hf_student" / "model.safetensors").stat().st_size
  assert 4 * n <= weights <= 4 * n + 16 * 1024  # + the safetensors header
  assert _files(work) <= need["kept_bytes"]

  # Finished, then asked to keep only the final checkpoint (a resumable
  # field): nothing trains, checkpoint 1 goes, the export stays.
  before = (work / "hf_student" / "model.safetensors").read_bytes()
  c.keep_final_only = True
  train_loop.train(c, str(work), devices=ONE_DEVICE)
  assert os.listdir(ckpts) == ["2"]
  assert ckpt_lib.Checkpointer(str(ckpts)).steps() == [2]
  assert (work / "hf_student" / "model.safetensors").read_bytes() == before
  final = disk.need(c, train_setup.model_config(c.student, "student"))
  assert (MIN_COMPRESSED * final["state_bytes"] <= _files(ckpts)
          <= final["checkpoint_bytes"])
  assert _files(work) <= final["kept_bytes"]


def _saved_at_most(keep: int, saves: int) -> int:
  """Checkpoints on disk at once under Orbax's retention, simulated: a new
  one is committed before the oldest beyond `keep` is removed."""
  kept, most = [], 0
  for s in range(saves):
    kept.append(s)
    most = max(most, len(kept))
    kept = kept[-keep:]
  return most


@pytest.mark.parametrize("keep,total,every", [
    (3, 150, 50), (3, 150, 25), (1, 10, 3), (2, 5, 10), (5, 7, 1)])
def test_peak_follows_orbax_retention(keep, total, every):
  c = _config(keep_ckpts=keep, total_steps=total, ckpt_every=every)
  scfg = train_setup.model_config(c.student, "student")
  d = disk.need(c, scfg)
  saves = len({s for s in range(1, total + 1) if s % every == 0} | {total})
  assert d["saves"] == saves
  most = _saved_at_most(keep, saves)
  ck, ex = d["checkpoint_bytes"], d["export_bytes"]
  assert d["peak_bytes"] - disk.SMALL_FILES_BYTES == max(
      most * ck, min(keep, saves) * ck + ex)


_Usage = collections.namedtuple("_Usage", "total used free")


def _fake_usage(free):
  return lambda path: _Usage(10**15, 10**15 - free, free)


def test_a_run_without_the_free_space_is_refused_before_compute(
    tmp_path, monkeypatch):
  c = _config()
  monkeypatch.setattr(disk.shutil, "disk_usage", _fake_usage(10**6))

  def no_weights(*a, **k):
    raise AssertionError("weights were loaded before the disk check")
  monkeypatch.setattr(train_setup, "load_params", no_weights)
  with pytest.raises(ValueError) as e:
    train_loop.train(c, str(tmp_path / "w"), devices=ONE_DEVICE)
  msg = str(e.value)
  assert "\n" not in msg
  assert msg.startswith(f"{tmp_path / 'w'}: 1 MB free, the run needs ")
  assert "keep_ckpts" in msg and not (tmp_path / "w" / "checkpoints").exists()


def test_free_space_counts_what_a_resumed_run_already_holds(tmp_path,
                                                            monkeypatch):
  c = _config()
  scfg = train_setup.model_config(c.student, "student")
  peak = disk.need(c, scfg)["peak_bytes"]
  held = 123_456
  (tmp_path / "checkpoints" / "3").mkdir(parents=True)
  (tmp_path / "checkpoints" / "3" / "data").write_bytes(b"x" * held)
  monkeypatch.setattr(disk.shutil, "disk_usage",
                      _fake_usage(peak - held + 10))
  disk.check_free(c, scfg, str(tmp_path))
  monkeypatch.setattr(disk.shutil, "disk_usage",
                      _fake_usage(peak - held - 10))
  with pytest.raises(ValueError, match="free, the run needs"):
    disk.check_free(c, scfg, str(tmp_path))
  disk.check_free(c, scfg, str(tmp_path), finished=True)  # writes no more


def test_gs_workdirs_are_not_checked_and_say_so(monkeypatch, caplog):
  c = _config()
  scfg = train_setup.model_config(c.student, "student")

  def boom(path):
    raise AssertionError(f"disk_usage({path}) on a gs:// workdir")
  monkeypatch.setattr(disk.shutil, "disk_usage", boom)
  caplog.set_level("INFO")
  disk.check_free(c, scfg, "gs://bucket/run")
  assert "gs://bucket/run: free space on gs:// is not checked" in caplog.text


def test_prune_removes_what_a_killed_prune_left(tmp_path):
  d = tmp_path / "checkpoints"
  for step in (2, 4):
    (d / str(step) / "state").mkdir(parents=True)
    (d / str(step) / "state" / "x").write_bytes(b"1" * 10)
    (d / str(step) / ckpt_lib.ORBAX_COMMITTED).write_text("ok")
  (d / ".pruning-1" / "state").mkdir(parents=True)  # a kill part way
  assert ckpt_lib.prune(str(d), 4) == [2]
  assert os.listdir(d) == ["4"]
  assert ckpt_lib.prune(str(d), 6) == [] and os.listdir(d) == ["4"]


def test_grid_arms_keep_only_the_final_checkpoint():
  g = config_lib.load_config("configs/grid_main.py")
  assert g.base.keep_final_only
  g = config_lib.load_config("configs/grid_main.py:runlocal")
  assert g.base.keep_final_only


@pytest.mark.slow
def test_compile_only_reports_the_run_s_disk(capsys):
  pytest.importorskip("libtpu")
  from jaxdistill import compile_only  # pylint: disable=g-import-not-at-top
  c = _config()
  report = train_loop.compile_for(c, "v5e:2x2")
  d = disk.need(c, train_setup.model_config(c.student, "student"))
  assert report["disk"] == d
  compile_only.emit(report, as_json=False)
  assert capsys.readouterr().out.splitlines()[-1] == disk.describe(d)


@pytest.mark.parametrize("total,every,exports", [(10, 3, 3), (10, 5, 1),
                                                 (10, 10, 0), (10, 0, 0)])
def test_step_exports_add_one_export_each(total, every, exports):
  # exports: by hand, the multiples of `every` below `total`.
  base = _config(keep_ckpts=2, total_steps=total, ckpt_every=5)
  c = _config(keep_ckpts=2, total_steps=total, ckpt_every=5)
  c.export_every = every
  scfg = train_setup.model_config(c.student, "student")
  a, b = disk.need(base, scfg), disk.need(c, scfg)
  assert b["step_exports"] == exports
  for k in ("peak_bytes", "kept_bytes"):
    assert b[k] - a[k] == exports * a["export_bytes"]


def test_a_lora_checkpoint_holds_the_adapters_and_their_moments_only():
  """Hand count for configs/grpo_countdown.py:runlocal with LoRA rank 4
  on all seven projections, float32 adapters and Adam: the checkpoint's
  arrays are the adapters' elements x 4 bytes x 3 (params, mu, nu) plus the
  counters; the export the model in its dtype plus the adapters."""
  import math  # pylint: disable=g-import-not-at-top
  from configs import grpo_countdown  # pylint: disable=g-import-not-at-top
  from jaxdistill import models  # pylint: disable=g-import-not-at-top
  from jaxdistill.models import lora  # pylint: disable=g-import-not-at-top
  from jaxdistill.rl import train as rl_train  # pylint: disable=g-import-not-at-top
  from tests import config_util  # pylint: disable=g-import-not-at-top
  c = config_util.set_fields(grpo_countdown.get_config("runlocal"), {
      "student.lora.rank": 4, "student.lora.alpha": 4.0})
  scfg = rl_train._models(rl_train.resolve_paths(c))[0]  # pylint: disable=protected-access
  d, h, m, n, k, L = (scfg.hidden_size, scfg.head_dim, scfg.intermediate_size,
                      scfg.num_attention_heads, scfg.num_key_value_heads,
                      scfg.num_hidden_layers)
  per_layer = 4 * ((d + n * h) * 2 + (d + k * h) * 2 + (d + m) * 3)  # r (in + out)
  adapters = L * per_layer
  need = disk.need(c, scfg)
  assert adapters * 4 * 3 <= need["state_bytes"] <= adapters * 4 * 3 + 64
  model = sum(math.prod(x.shape) * x.dtype.itemsize
              for x in jax.tree.leaves(models.param_shapes(scfg)))
  assert need["export_bytes"] == model + adapters * 4
  assert lora.from_config(c.student.lora).rank == 4
