"""The training loop end to end on tiny random models (configs/distill.py:runlocal)."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxdistill import config_lib
from jaxdistill.data import tokenizer as tok_lib
from jaxdistill.tasks import countdown
from jaxdistill.train import checkpoint as ckpt_lib
from jaxdistill.train import log as train_log
from jaxdistill.train import loop as train_loop

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from configs import \
    distill as distill_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests import config_util
from tests import tiny_hf


def _config(arg="runlocal", **updates):
  c = distill_config.get_config(arg)
  c.progress = False
  return config_util.set_fields(c, updates)


def _params(workdir, step=None):
  """The student params of a run's checkpoint, as numpy (independent reader)."""
  mngr = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"))
  step = step or mngr.steps()[-1]
  out = mngr._mngr.restore(step, args=ocp.args.Composite(  # pylint: disable=protected-access
      state=ocp.args.StandardRestore()))
  mngr.close()
  return jax.tree.map(np.asarray, out["state"]["params"])


ONE_DEVICE = [jax.devices()[0]]


def test_loss_goes_down_on_a_fixed_batch(tmp_path):
  c = _config("runlocal,policy=dataset", **{
      "data.fixed_batch": True, "total_steps": 12, "optim.lr": 3e-3,
      "ckpt_every": 100, "eval_every": 100})
  train_loop.train(c, str(tmp_path), devices=ONE_DEVICE)
  recs = train_log.read_metrics(str(tmp_path))
  losses = [r["train/loss"] for r in recs]
  assert len(losses) == 12
  assert losses[-1] < 0.7 * losses[0], losses
  # The run leaves what a user looks at: events, a final checkpoint, an HF export.
  assert os.listdir(tmp_path / "tb")
  assert (tmp_path / "hf_student" / "config.json").exists()
  assert {"sparsity/S_1e-6_f32", "sparsity/S_1e-8_f32",
          "sparsity/unchanged_1e-5_bf16"} <= set(recs[-1])


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["dataset", "coin_mixture"])
def test_sharded_run_matches_single_device(tmp_path, policy):
  """fsdp x tensor on 8 devices == 1 device, after 3 steps."""
  upd = {"total_steps": 3, "ckpt_every": 3, "optim.lr": 1e-3,
         "student.temperature": 1.0, "loss.fused": policy == "coin_mixture"}
  c1 = _config(f"runlocal,policy={policy}", **upd, **{"mesh": {"data": 1}})
  m1 = train_loop.train(c1, str(tmp_path / "one"), devices=ONE_DEVICE)
  c8 = _config(f"runlocal,policy={policy}", **upd,
               **{"mesh": {"data": 1, "fsdp": 4, "tensor": 2}})
  m8 = train_loop.train(c8, str(tmp_path / "eight"))
  np.testing.assert_allclose(m8["train/loss"], m1["train/loss"], rtol=1e-4)
  p1, p8 = _params(tmp_path / "one"), _params(tmp_path / "eight")
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4,
                                                       atol=1e-5), p1, p8)


def _cli(workdir, *extra):
  cmd = [sys.executable, "-m", "jaxdistill.train",
         "--config", str(ROOT / "configs" / "distill.py") + ":runlocal",
         "--workdir", str(workdir), "--config.total_steps=8",
         "--config.ckpt_every=2", "--config.progress=False", *extra]
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1",
             PYTHONPATH=str(ROOT))
  return cmd, env


@pytest.mark.slow
def test_sigkill_then_resume_is_bitwise_identical(tmp_path):
  cmd, env = _cli(tmp_path / "ref")
  subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=ROOT)

  cmd, env = _cli(tmp_path / "killed")
  proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  ckdir = tmp_path / "killed" / "checkpoints"
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None:
    done = [d for d in (os.listdir(ckdir) if ckdir.exists() else [])
            if d.isdigit()]
    if any(int(d) >= 4 for d in done):
      break
    time.sleep(0.05)
  assert proc.poll() is None, "run finished before it could be killed"
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  killed_at = max(int(d) for d in os.listdir(ckdir) if d.isdigit())
  assert killed_at < 8
  subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=ROOT)
  ref, res = _params(tmp_path / "ref", 8), _params(tmp_path / "killed", 8)
  jax.tree.map(np.testing.assert_array_equal, ref, res)


@pytest.mark.slow
def test_truncated_checkpoint_falls_back_to_previous(tmp_path, caplog):
  c = _config(**{"total_steps": 4, "ckpt_every": 2})
  train_loop.train(c, str(tmp_path / "ref"), devices=ONE_DEVICE)
  # Same run, stopped at 4 with a truncated latest checkpoint, then resumed
  # to 4 again: it must restart from step 2 and end where the reference did.
  work = tmp_path / "broken"
  train_loop.train(c, str(work), devices=ONE_DEVICE)
  latest = work / "checkpoints" / "4"
  files = sorted((p for p in latest.rglob("*") if p.is_file()),
                 key=lambda p: p.stat().st_size)
  for f in files[-3:]:  # the largest files hold the array data
    with open(f, "r+b") as fh:
      fh.truncate(max(f.stat().st_size // 3, 1))
  caplog.set_level("WARNING")
  train_loop.train(c, str(work), devices=ONE_DEVICE)
  assert "failed to restore" in caplog.text
  assert "resuming" in caplog.text and "from step 2" in caplog.text
  jax.tree.map(np.testing.assert_array_equal, _params(tmp_path / "ref", 4),
               _params(work, 4))


def test_workdir_of_a_different_config_is_not_overwritten(tmp_path):
  c = _config(**{"total_steps": 1, "ckpt_every": 1, "export_hf": False})
  train_loop.train(c, str(tmp_path), devices=ONE_DEVICE)
  before = (tmp_path / "config.json").read_text()
  c2 = _config(**{"total_steps": 1, "ckpt_every": 1, "optim.lr": 0.5,
                  "export_hf": False})
  with pytest.raises(ValueError, match="optim.lr"):
    train_loop.train(c2, str(tmp_path), devices=ONE_DEVICE)
  assert (tmp_path / "config.json").read_text() == before
  train_loop.train(c2, str(tmp_path), overwrite=True, devices=ONE_DEVICE)
  aside = [d for d in os.listdir(tmp_path) if d.startswith("replaced-")]
  assert len(aside) == 1
  assert json.loads((tmp_path / aside[0] / "config.json").read_text())[
      "optim"]["lr"] == c.optim.lr


HUB = "Qwen/Qwen2.5-0.5B-Instruct"
OLD, NEW = "a" * 40, "b" * 40


def _hub_workdir(tmp_path, trained=True):
  """A workdir trained from hub name HUB (revisions.json: commit OLD)."""
  c = _config(**{"student.path": HUB, "student.init": None})
  train_loop.prepare_workdir(c, str(tmp_path), False, {
      "student.path": {"id": HUB, "revision": "main", "commit": OLD}})
  if trained:
    (tmp_path / "checkpoints" / "1").mkdir(parents=True)
  return c


def test_a_deleted_revisions_json_is_not_replaced_by_what_the_hub_says_now(
    tmp_path):
  """The run used to resume from a hub name that had moved, recording the
  new commit as if it had trained from it."""
  c = _hub_workdir(tmp_path)
  rev = tmp_path / train_loop.REVISIONS
  rev.unlink()
  moved = {"student.path": {"id": HUB, "revision": "main", "commit": NEW}}
  with pytest.raises(ValueError, match=(
      f"^{rev}: missing, so the commits {tmp_path} trained from are unknown "
      "for student.path; restore it")):
    train_loop.prepare_workdir(c, str(tmp_path), False, moved)
  assert not rev.exists()
  # Pinned in the config to the commit it trained from: resumable.
  pinned = _config(**{"student.path": f"{HUB}@{OLD}", "student.init": None})
  (tmp_path / "config.json").write_text(config_lib.to_json(pinned))
  train_loop.prepare_workdir(pinned, str(tmp_path), False, {
      "student.path": {"id": HUB, "revision": OLD, "commit": OLD}})
  # Nothing trained yet: the commit resolved now is the run's.
  fresh = tmp_path / "fresh"
  _hub_workdir(fresh, trained=False)
  (fresh / train_loop.REVISIONS).unlink()
  train_loop.prepare_workdir(c, str(fresh), False, moved)
  assert json.loads((fresh / train_loop.REVISIONS).read_text()) == moved
  # --overwrite moves the run of unknown commits aside.
  rev.unlink()
  train_loop.prepare_workdir(c, str(tmp_path), True, moved)
  assert [d for d in os.listdir(tmp_path) if d.startswith("replaced-")]


@pytest.mark.parametrize("text,words", [
    ("[]", "expected a JSON object of fields"),
    ('{"student.path": {"commit": "%s"}}' % OLD,
     "entry 'student.path' needs string 'id' and 'commit'"),
    ('{"student.path": "%s"}' % OLD, "entry 'student.path' needs"),
])
def test_a_malformed_revisions_json_is_named(tmp_path, text, words):
  """These used to be a KeyError or an AttributeError."""
  c = _hub_workdir(tmp_path)
  rev = tmp_path / train_loop.REVISIONS
  rev.write_text(text)
  with pytest.raises(ValueError, match=f"^{rev}: {words}"):
    train_loop.prepare_workdir(c, str(tmp_path), False, {
        "student.path": {"id": HUB, "revision": "main", "commit": OLD}})
  assert rev.read_text() == text


@pytest.mark.parametrize("field,value,match", [
    ("loss.kind", "sideways", "config.loss.kind"),
    ("rollout.policy", "oracle", "config.rollout.policy"),
    ("rollout.lam", 1.5, "config.rollout.lam"),
    ("optim.lr", 0.0, "config.optim.lr"),
    ("optim.lr", -1e-5, "config.optim.lr"),
    ("loss.beta", 2.0, "config.loss.beta"),
    ("mesh", {"data": 3}, "mesh"),
    ("student.path", "/nonexistent/ckpt", "config.student.path"),
    ("teacher.init.vocab_size", 300, "config.loss.vocab_size"),
])
def test_bad_configs_fail_before_compute_naming_the_field(tmp_path, field,
                                                          value, match):
  overrides = {field: value}
  if field == "rollout.lam":
    overrides["rollout.policy"] = "coin_mixture"
  if field == "loss.beta":
    overrides["loss.kind"] = "jsd"
  if field == "student.path":
    overrides["student.init"] = None
  c = _config(**overrides)
  t0 = time.perf_counter()
  with pytest.raises(ValueError, match=match.replace(".", r"\.")):
    train_loop.train(c, str(tmp_path), devices=None if field == "mesh" else ONE_DEVICE)
  assert not (tmp_path / "checkpoints").exists()


def test_config_arg_parsing():
  c = distill_config.get_config("kl=reverse,lr=5e-5,policy=coin_mixture,lam=0.25")
  assert (c.loss.kind, c.optim.lr, c.rollout.policy, c.rollout.lam) == (
      "reverse", 5e-5, "coin_mixture", 0.25)
  with pytest.raises(ValueError, match="unknown key 'kll'"):
    config_lib.parse_arg("kll=reverse", kl="forward")


@pytest.mark.slow
def test_countdown_from_hf_checkpoints_with_padded_vocabularies(tmp_path):
  """The user path: HF dirs (vocab 300 vs 320, a 290-token tokenizer), Countdown
  prompts through the chat template, a lambda-mixture rollout, export."""
  probs = countdown.generate_problems(3, 100, 0)
  tok_lib.train_bpe_tokenizer(
      [countdown.build_prompt(p.numbers, p.target) for p in probs], 290,
      str(tmp_path / "tok"))
  tiny_hf.make_tiny_checkpoint("qwen2", tmp_path / "teacher", vocab_size=320)
  tiny_hf.make_tiny_checkpoint("qwen2", tmp_path / "student", vocab_size=300,
                               seed=1, hidden_size=32)
  c = _config("policy=coin_mixture,lam=0.5", **{
      "student.path": str(tmp_path / "student"),
      "teacher.path": str(tmp_path / "teacher"),
      "tokenizer": str(tmp_path / "tok"), "student.dtype": "float32",
      "teacher.dtype": "float32", "teacher.param_dtype": "float32",
      "data.batch_size": 4, "data.max_prompt_len": 448,
      "data.num_problems": 100, "rollout.max_new_tokens": 8,
      "total_steps": 2, "ckpt_every": 2, "eval_every": 2})
  m = train_loop.train(c, str(tmp_path / "work"), devices=ONE_DEVICE)
  assert 0.0 < m["rollout/student_fraction"] < 1.0
  assert np.isfinite(m["train/loss"]) and m["distill/tokens"] > 0
  # The export loads in transformers with the tokenizer beside it.
  import transformers  # pylint: disable=g-import-not-at-top
  out = tmp_path / "work" / "hf_student"
  model = transformers.AutoModelForCausalLM.from_pretrained(out)
  tok = transformers.AutoTokenizer.from_pretrained(out)
  ref = tok_lib.load_tokenizer(str(tmp_path / "tok"))
  text = countdown.build_prompt(probs[0].numbers, probs[0].target)
  assert model.config.vocab_size == 300
  assert tok(text)["input_ids"] == ref(text)["input_ids"]
