"""Teacher rollouts decoded ahead (rollout.decode_ahead, train/batches.py):
the steps of an aligned chunk decoded in one call of k B rows give each step
the batch and metrics of its own one-step call (the reference: the k = 1
path, one generate call per step), in fewer calls; a run's logged metrics
and its shared store equal the unshared one-step run's; the settings that
cannot decode ahead are refused; the compiled program is the k B-row call and
serves k steps in the step-time figures."""
import os
import pathlib
import sys

import jax
import numpy as np
import pytest

from jaxdistill import models
from jaxdistill import rollout
from jaxdistill import sharding
from jaxdistill.bench import fit as bench_fit
from jaxdistill.train import batches as train_batches
from jaxdistill.train import loop as train_loop
from jaxdistill.train import programs
from jaxdistill.train import setup as train_setup
from jaxdistill.train import step as step_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from configs import \
    distill as distill_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests import config_util
from tests.train import shared_rollouts_test as shared_test

ONE_DEVICE = [jax.devices()[0]]
REAL = 40  # the sampled vocabulary (the tiny configs' embeddings are wider)


@pytest.fixture
def generate_calls(monkeypatch):
  """The row counts of every rollout.generate call, in order."""
  calls = []
  orig = rollout.generate

  def counting(*a, **k):
    calls.append(int(np.shape(a[2])[0]))
    return orig(*a, **k)
  monkeypatch.setattr(rollout, "generate", counting)
  return calls


def _models(c):
  scfg = train_setup.model_config(c.student, "student")
  tcfg = train_setup.model_config(c.teacher, "teacher")
  return (scfg, tcfg, models.init(scfg, jax.random.key(0)),
          models.init(tcfg, jax.random.key(1)))


@pytest.mark.parametrize("kl,estimator", [("forward", None), ("sampled", "k3")])
def test_a_chunk_decoded_in_one_call_gives_each_step_its_own_call_s_batch(
    kl, estimator, generate_calls):
  c = distill_config.get_config(f"runlocal,policy=teacher,kl={kl}")
  if estimator:  # the rollout's own tokens, weighted: behaviour log-probs kept
    c.loss.estimator = estimator
  scfg, tcfg, sp, tp = _models(c)
  # Rows over data x fsdp = 4 of the 8 simulated devices, heads over tensor.
  mesh = sharding.make_mesh(dict(data=2, fsdp=2, tensor=2),
                            devices=jax.devices()[:8])
  rules = sharding.DEFAULT_RULES
  data = train_batches.SyntheticPrompts(batch_size=4, prompt_len=6, vocab=REAL,
                                        seed=0)
  seed_key, steps = jax.random.key(3), 5

  def run(ahead):
    c.rollout.decode_ahead = ahead
    maker = train_batches.SequenceMaker(c, scfg, tcfg, mesh, rules,
                                        vocab_size=REAL)
    maker.ahead_from(data, seed_key, steps)
    out = []
    for s in range(steps):
      batch, metrics = maker(data[s], sp, tp, jax.random.fold_in(seed_key, s),
                             step=s)
      out.append(({k: np.asarray(v) for k, v in batch.items()}, metrics))
    return out

  want = run(1)
  assert generate_calls == [4] * steps
  got = run(2)  # chunks [0, 1], [2, 3] and the shorter [4]
  assert generate_calls[steps:] == [8, 8, 4]
  for s, ((wb, wm), (gb, gm)) in enumerate(zip(want, got)):
    assert sorted(gb) == sorted(wb), s
    for k in wb:
      if k == "behaviour_logprobs":  # computed from [k B, V] logits: rounding
        np.testing.assert_allclose(gb[k], wb[k], rtol=1e-6, atol=1e-6,
                                   err_msg=f"step {s}: {k}")
      else:
        np.testing.assert_array_equal(gb[k], wb[k], err_msg=f"step {s}: {k}")
    assert gm == wm, s
  if estimator:
    assert "behaviour_logprobs" in want[0][0]
  # The steps differ (each its own key and prompts): the test can fail.
  assert not np.array_equal(want[0][0]["tokens"], want[1][0]["tokens"])


@pytest.mark.slow  # three tiny runs of 3 steps
def test_a_run_decoding_ahead_logs_and_stores_what_the_one_step_run_does(
    tmp_path, generate_calls):
  store = tmp_path / "shared"

  def config(ahead):
    return shared_test._config(**{"total_steps": 3, "ckpt_every": 3,  # pylint: disable=protected-access
                                  "eval_every": 3,
                                  "rollout.decode_ahead": ahead})

  train_loop.train(config(1), str(tmp_path / "one"), devices=ONE_DEVICE)
  assert generate_calls == [4, 4, 4]
  train_loop.train(config(2), str(tmp_path / "two"), devices=ONE_DEVICE,
                   shared_rollouts=str(store))
  assert generate_calls[3:] == [8, 4]  # steps 0-1 in one call, then step 2
  metrics = shared_test._metrics  # pylint: disable=protected-access
  assert metrics(tmp_path / "two") == metrics(tmp_path / "one")
  (key,) = os.listdir(store)
  assert sorted(os.listdir(store / key)) == ["meta.json"] + [
      f"step_{s:06d}.npz" for s in range(3)]
  # A resumed-from-nothing reader of the same key decodes nothing.
  train_loop.train(config(2), str(tmp_path / "reader"), devices=ONE_DEVICE,
                   shared_rollouts=str(store))
  assert len(generate_calls) == 5
  assert metrics(tmp_path / "reader") == metrics(tmp_path / "one")


@pytest.mark.parametrize("arg,steps", [
    ("runlocal,policy=teacher", 3), ("runlocal,policy=spectrum,lam=-1.0", 3),
    ("runlocal,policy=student", 1), ("runlocal,policy=spectrum,lam=-2.0", 1),
    ("runlocal,policy=coin_mixture,lam=0.0", 1)])
def test_only_rollouts_of_the_teacher_alone_are_decoded_ahead(arg, steps):
  # The others depend on the student's weights at their own step.
  c = distill_config.get_config(arg)
  c.rollout.decode_ahead = 3
  assert train_batches.decode_ahead(c) == steps


@pytest.mark.parametrize("arg,updates,match", [
    ("runlocal,policy=teacher", {"rollout.decode_ahead": 0}, "positive int"),
    ("runlocal,policy=teacher", {"rollout.decode_ahead": 2, "data.bucket": 4},
     "data.bucket"),
])
def test_settings_that_cannot_decode_ahead_are_refused_before_any_weight(
    tmp_path, arg, updates, match):
  c = distill_config.get_config(arg)
  config_util.set_fields(c, updates)
  with pytest.raises(ValueError, match=match):
    train_loop.train(c, str(tmp_path / "w"), devices=ONE_DEVICE)
  assert not (tmp_path / "w" / "checkpoints").exists()


def test_the_compiled_rollout_is_the_chunk_s_call_and_serves_its_steps():
  c = distill_config.get_config("runlocal,policy=teacher")
  c.rollout.decode_ahead = 3
  scfg, tcfg, _, _ = _models(c)
  mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1),
                            devices=ONE_DEVICE)
  optimizer, schedule = step_lib.make_optimizer(c.optim, c.total_steps,
                                                "float32")
  rollout_prog, _ = programs.train_programs(
      c, scfg, tcfg, mesh, sharding.DEFAULT_RULES, REAL, optimizer=optimizer,
      schedule=schedule, cached=False, track_sparsity=False)
  b = int(c.data.batch_size)
  _, prompts, _, rng, row_ids = rollout_prog.args[:5]
  assert prompts.shape == (3 * b, c.data.max_prompt_len)
  assert rng.shape == (3 * b,) and row_ids.shape == (3 * b,)
  assert rollout_prog.steps == 3
  # bench.fit's step: the call's time over the steps it serves, plus the
  # update's (figures made up for the sum).
  report = {"programs": [
      {"name": "rollout", "step_time_bound_s": 0.9, "limit_s": 0.6,
       "steps": 3},
      {"name": "update", "step_time_bound_s": 0.2, "limit_s": 0.1}]}
  step = bench_fit.step_summary(report)
  assert step["step_time_bound_s"] == pytest.approx(0.3 + 0.2)
  assert step["step_limit_s"] == pytest.approx(0.2 + 0.1)
