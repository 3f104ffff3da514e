"""The GRPO loop: CLI on the runlocal config, resume, init from a workdir."""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxdistill.data import tokenizer as tok_lib
from jaxdistill.rl import train as rl_train
from jaxdistill.train import log as train_log
from jaxdistill.train import setup as train_setup

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from configs import grpo_countdown  # pylint: disable=g-import-not-at-top,wrong-import-position

ONE_DEVICE = [jax.devices()[0]]
# Weight decay moves the parameters even when every reward is 0 (a random
# tiny model never solves Countdown), so resuming has state to get right.
RUN = {"progress": False, "ckpt_every": 1, "eval_every": 3,
       "optim.weight_decay": 0.1}


def _config(arg="runlocal", **updates):
  c = grpo_countdown.get_config(arg)
  for key, value in {**RUN, **updates}.items():
    node = c
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return c


def _params(workdir, step):
  mngr = ocp.CheckpointManager(os.path.join(workdir, "checkpoints"),
                               item_names=("state", "meta"))
  out = mngr.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()))
  mngr.close()
  return jax.tree.map(np.asarray, out["state"]["params"]), dict(out["meta"])


def _cli(workdir, *flags):
  cmd = [sys.executable, "-m", "jaxdistill.rl.train",
         "--config", str(ROOT / "configs" / "grpo_countdown.py") + ":runlocal",
         "--workdir", str(workdir)] + [f"--config.{k}={v}" for k, v in
                                       RUN.items()] + list(flags)
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  return subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT,
                        timeout=600)


@pytest.mark.slow
def test_cli_resumes_where_an_uninterrupted_run_goes(tmp_path):
  ref_dir, work = tmp_path / "ref", tmp_path / "resumed"
  # All 8 test devices (fsdp=8), in-process and in the CLI's subprocess: the
  # same programs, so the subprocess reuses the persistent compilation cache.
  ref = rl_train.train(_config(total_steps=3), str(ref_dir))
  # The same run, stopped after step 2: checkpoints 1-2 and their log lines.
  shutil.copytree(ref_dir, work)
  shutil.rmtree(work / "checkpoints" / "3")
  shutil.rmtree(work / "hf_student")
  lines = (work / "metrics.jsonl").read_text().splitlines()
  (work / "metrics.jsonl").write_text(
      "".join(l + "\n" for l in lines if json.loads(l)["step"] <= 2))
  out = _cli(work, "--config.total_steps=3")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "from step 2" in out.stderr
  recs = train_log.read_metrics(str(work))
  assert [r["step"] for r in recs] == [1, 2, 3]
  for key in ("rl/reward_mean", "rl/reward_std", "rl/zero_var_groups",
              "rl/format", "rl/clip_frac", "rl/kl_ref", "rl/entropy",
              "rollout/len", "train/loss", "sparsity/S_1e-6_f32"):
    assert key in recs[-1], key
  # Same data position, RNG streams and state after the resume.
  for key in ("rollout/tokens", "rl/entropy", "rl/kl_ref", "train/update_norm"):
    np.testing.assert_allclose(recs[-1][key], ref[key], rtol=1e-5, err_msg=key)
  p_ref, _ = _params(ref_dir, 3)
  p_res, meta = _params(work, 3)
  assert meta["step"] == meta["data_position"] == 3 and meta["rng"]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6,
                                                       atol=1e-7), p_ref, p_res)
  assert not all(np.array_equal(a, b) for a, b in zip(
      jax.tree.leaves(p_res), jax.tree.leaves(_params(work, 2)[0])))

  # A new GRPO run given that workdir starts from its hf_student/ export
  # (weights and tokenizer), not from random weights.
  init = rl_train.resolve_paths(_config(**{"student.path": str(work),
                                       "student.init": None,
                                       "tokenizer_build": None}))
  assert init.student.path == str(work / "hf_student")
  scfg = train_setup.model_config(init.student, "student")
  assert len(tok_lib.run_tokenizer(init)) <= scfg.vocab_size
  loaded = train_setup.load_params(scfg, init.student, None, None, None)
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, loaded),
               p_res)


def test_resolve_init_prefers_the_hf_student_export(tmp_path):
  assert rl_train.resolve_init(str(tmp_path)) == str(tmp_path)
  (tmp_path / "hf_student").mkdir()
  (tmp_path / "hf_student" / "config.json").write_text("{}")
  assert rl_train.resolve_init(str(tmp_path)) == str(tmp_path / "hf_student")


@pytest.mark.parametrize("field,value,match", [
    ("rollout.group_size", 1, "config.rollout.group_size"),
    ("rollout.temperature", 0.0, "config.rollout.temperature"),
    ("rollout.top_k", 5, "config.rollout.top_k"),
    ("rollout.top_p", 1.5, "config.rollout.top_p"),
    ("grpo.loss", "ppo", "config.grpo.loss"),
    ("grpo.format_reward", "xml", "config.grpo.format_reward"),
    ("rollout.policy", "teacher", "config.rollout.policy"),
    ("grpo.num_minibatches", 3, "config.grpo.num_minibatches"),
    ("grpo.reduction", "sum", "config.grpo.reduction"),
    ("grpo.clip_low", 1.0, "config.grpo.clip_low"),
    ("grpo.clip_high", -0.1, "config.grpo.clip_high"),
    ("kl.coef", 0.1, "config.kl.direction"),
    ("data.task", "synthetic", "config.data.task"),
    ("optim.grad_accum", 3, "config.optim.grad_accum"),
    ("student.path", "/nonexistent/ckpt", "config.student.path"),
    ("grpo.reward_scale", 0.0, "config.grpo.reward_scale"),
    ("rollout.generation_batch", 3, "config.rollout.generation_batch"),
])
def test_bad_configs_fail_before_compute_naming_the_field(tmp_path, field,
                                                          value, match):
  c = _config(**{field: value})
  if field == "student.path":
    c.student.init = None  # an init (runlocal's) wins over the path
  if field == "kl.coef":
    c.kl.direction = "reverse"  # k3 follows the forward KL
  with pytest.raises(ValueError, match=match.replace(".", r"\.")):
    rl_train.train(c, str(tmp_path), devices=ONE_DEVICE)
  assert not (tmp_path / "config.json").exists()


def _rewards(values):
  """A reward_fn giving row i the reward values[i % len(values)]."""
  def reward_fn(ro, host_batch):
    del host_batch
    rows = ro.tokens.shape[0]
    return {"reward": np.array([values[i % len(values)] for i in range(rows)],
                               np.float32)}
  return reward_fn


@pytest.mark.slow  # a 2-iteration GRPO run (its compilation: seconds)
def test_warns_once_when_every_group_has_zero_reward_variance(tmp_path,
                                                              capsys):
  """Unreachable targets: reward 0 for every sample of every iteration."""
  c = _config(total_steps=2, ckpt_every=2, export_hf=False)
  rl_train.train(c, str(tmp_path), devices=ONE_DEVICE,
                 reward_fn=_rewards([0.0]))
  err = capsys.readouterr().err
  lines = [l for l in err.splitlines() if "zero reward variance" in l]
  assert lines == [
      "rl: the first 2 iterations had zero reward variance within every group "
      "(mean reward 0): every advantage is 0, so the rewards give GRPO no "
      "gradient (only the KL penalty and weight decay move the policy); no "
      "sample reached its target: the targets may be out of reach of this "
      "policy (check the task and data, rollout.max_new_tokens and the answer "
      "format the verifier expects)"], err[-3000:]


def test_no_zero_variance_warning_once_a_group_differs(capsys):
  watch = rl_train.ZeroVarianceWatch(total_steps=100)
  for step, zero_var in enumerate([1.0, 1.0, 0.5, 1.0, 1.0, 1.0]):
    watch.update(step, {"rl/zero_var_groups": zero_var,
                        "rl/reward_mean": 0.0})
  assert "zero reward variance" not in capsys.readouterr().err
  watch = rl_train.ZeroVarianceWatch(total_steps=100)
  for step in range(6):
    watch.update(step, {"rl/zero_var_groups": 1.0, "rl/reward_mean": 1.0})
  err = capsys.readouterr().err
  assert err.count("zero reward variance") == 1  # once, after 5 iterations
  assert "the first 5 iterations" in err and "every sample was rewarded" in err


def test_paper_arg_is_the_papers_rlvr_data_and_reward():
  c = grpo_countdown.get_config("paper")
  assert c.data.source == "countdown4" and c.grpo.reward_scale == 2.0
  assert grpo_countdown.get_config().grpo.reward_scale == 1.0
  rl_train.validate(c)


@pytest.mark.slow  # a 1-iteration GRPO run (its compilation: seconds)
def test_reward_scale_multiplies_the_logged_reward(tmp_path):
  """App. D.6: 2 for a right answer. Half the rows right -> mean 1.0."""
  c = _config(total_steps=1, ckpt_every=1, export_hf=False)
  c.grpo.reward_scale = 2.0
  m = rl_train.train(c, str(tmp_path), devices=ONE_DEVICE,
                     reward_fn=_rewards([1.0, 0.0]))
  assert m["rl/reward_mean"] == pytest.approx(1.0)
