"""rollout.student_temperature / teacher_temperature: the training rollouts
sample at them (the paper's temperature ablation, App. A.12), exactly as if
the model's own temperature were that value, while the loss keeps its own."""
import jax
import numpy as np
import pytest

from jaxdistill import config_lib
from jaxdistill import models
from jaxdistill import sharding
from jaxdistill.train import batches as train_batches
from jaxdistill.train import setup as train_setup


def _tokens(c):
  scfg = train_setup.model_config(c.student, "student")
  tcfg = train_setup.model_config(c.teacher, "teacher")
  sp = models.init(scfg, jax.random.key(0))
  tp = models.init(tcfg, jax.random.key(1))
  mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1),
                            devices=jax.devices()[:1])
  host = train_batches.SyntheticPrompts(batch_size=4, prompt_len=6, vocab=40,
                                        seed=0)[0]
  maker = train_batches.SequenceMaker(c, scfg, tcfg, mesh,
                                      sharding.DEFAULT_RULES, vocab_size=40)
  b, _ = maker(host, sp, tp, jax.random.key(5))
  return np.asarray(b["tokens"])


@pytest.mark.parametrize("policy,model,t", [("teacher", "teacher", 1.0),
                                            ("student", "student", 0.5)])
def test_rollouts_sample_at_the_generation_temperature(policy, model, t):
  spec = f"configs/distill.py:runlocal,policy={policy}"
  swapped = config_lib.load_config(spec)
  swapped.rollout[f"{model}_temperature"] = t
  as_if = config_lib.load_config(spec)
  as_if[model].temperature = t
  default = config_lib.load_config(spec)
  assert default[model].temperature != t
  assert config_lib.temperatures(swapped) == config_lib.temperatures(default)
  got = _tokens(swapped)
  np.testing.assert_array_equal(got, _tokens(as_if))
  assert (got != _tokens(default)).any()
