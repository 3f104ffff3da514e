"""LoRA training (config.student.lora): the step trains only the adapters,
and a runlocal run resumes and exports the merged weights."""
import functools
import pathlib
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import ml_collections
import numpy as np
import optax
from safetensors.numpy import load_file

from jaxdistill import models
from jaxdistill.models import lora
from jaxdistill.train import log as train_log
from jaxdistill.train import loop as train_loop
from jaxdistill.train import step as step_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from configs import \
    distill as distill_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests import config_util
from tests import tiny_hf

ONE_DEVICE = [jax.devices()[0]]
RANK, ALPHA = 4, 8.0


def _tiny_cfg(**kw):
  return models.ModelConfig(vocab_size=48, hidden_size=32, intermediate_size=40,
                            num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=8, **kw)


def _batch(vocab, b=2, t=10):
  tokens = np.random.RandomState(0).randint(0, vocab, (b, t)).astype(np.int32)
  mask = np.ones((b, t), np.int32)
  loss_mask = np.zeros((b, t), np.int32)
  loss_mask[:, 4:] = 1
  return {"tokens": jnp.asarray(tokens), "attention_mask": jnp.asarray(mask),
          "loss_mask": jnp.asarray(loss_mask),
          "weights": jnp.asarray(loss_mask / loss_mask.sum(), jnp.float32)}


def test_a_step_moves_only_the_adapters_by_their_gradient():
  """bf16 base, float32 adapters, plain SGD: the base is bit-identical after
  the step, A does not move (B = 0 gives it no gradient) and B moves by
  -lr * scale * A^T dL/dW, dL/dW the full model's own gradient."""
  cfg = _tiny_cfg(param_dtype="bfloat16")
  base = models.init(cfg, jax.random.key(0))
  lcfg = lora.LoraConfig(RANK, ALPHA)
  adapters = lora.init(cfg, lcfg, jax.random.key(1))
  batch = _batch(cfg.vocab_size)
  loss_fn = functools.partial(
      step_lib.distill_loss, student_cfg=cfg, teacher_cfg=cfg,
      loss_cfg=ml_collections.ConfigDict({"kind": "ce"}),
      vocab_size=cfg.vocab_size)
  lr = 0.5
  opt = optax.sgd(lr)
  state = step_lib.new_state(opt, adapters, base)
  base_before = jax.tree.map(np.asarray, base)
  new, metrics = jax.jit(functools.partial(
      step_lib.train_step, optimizer=opt, schedule=lambda _: lr,
      loss_fn=loss_fn, lora_scale=lcfg.scale))(state, None, batch)
  jax.tree.map(np.testing.assert_array_equal, base_before,
               jax.tree.map(np.asarray, new["base"]))
  assert jax.tree.map(lambda x: x.dtype, new["base"]) == jax.tree.map(
      lambda x: x.dtype, base)

  # The reference gradient: the plain model in float32 (the same numbers:
  # the bf16 weights are exact in float32 and the compute dtype is float32).
  cfg32 = _tiny_cfg()
  base32 = jax.tree.map(lambda x: x.astype(jnp.float32), base)
  f32_loss = functools.partial(loss_fn, student_cfg=cfg32, teacher_cfg=cfg32)
  grads = jax.grad(lambda p: f32_loss(p, None, batch)[0])(base32)
  assert np.isclose(float(metrics["train/loss"]),
                    float(f32_loss(base32, None, batch)[0]), rtol=1e-6)
  for t in lora.TARGETS:
    m = lora.MODULES[t]
    a0 = np.asarray(adapters["layers"][m][t]["lora_a"], np.float64)
    a1 = np.asarray(new["params"]["layers"][m][t]["lora_a"])
    b1 = np.asarray(new["params"]["layers"][m][t]["lora_b"], np.float64)
    np.testing.assert_array_equal(a1, a0.astype(np.float32))
    g = np.asarray(grads["layers"][m][t]["kernel"], np.float64)
    lay, r = a0.shape[0], a0.shape[-1]
    want = -lr * lcfg.scale * np.einsum(
        "lir,lio->lro", a0.reshape(lay, -1, r), g.reshape(lay, a0[0].size // r, -1))
    np.testing.assert_allclose(b1.reshape(want.shape), want, rtol=1e-4,
                               atol=1e-7)
    assert np.abs(want).max() > 0


def _config(student_dir, **updates):
  c = distill_config.get_config("runlocal")
  c.progress = False
  return config_util.set_fields(c, {
      "student.path": str(student_dir), "student.init": None,
      "student.param_dtype": "bfloat16", "student.lora.rank": RANK,
      "student.lora.alpha": ALPHA, "ckpt_every": 2, **updates})


def _restore(workdir, step):
  return config_util.restore_checkpoint(workdir, step)


def test_runlocal_lora_resumes_and_exports_the_merged_weights(tmp_path):
  student = tiny_hf.make_tiny_checkpoint(
      "llama", tmp_path / "student", vocab_size=320, hidden_size=32,
      intermediate_size=64, num_attention_heads=2, num_key_value_heads=1)
  train_loop.train(_config(student, total_steps=4), str(tmp_path / "ref"),
                   devices=ONE_DEVICE)
  train_loop.train(_config(student, total_steps=2), str(tmp_path / "run"),
                   devices=ONE_DEVICE)
  m = train_loop.train(_config(student, total_steps=4), str(tmp_path / "run"),
                       devices=ONE_DEVICE)
  assert np.isfinite(m["train/loss"])
  steps = [r["step"] for r in train_log.read_metrics(str(tmp_path / "run"))]
  assert steps == [1, 2, 3, 4]  # resumed at 3, not restarted

  ref, _ = _restore(tmp_path / "ref", 4)
  got, meta = _restore(tmp_path / "run", 4)
  jax.tree.map(np.testing.assert_array_equal, ref, got)
  # The checkpoint holds the adapters (and their Adam state), not the base.
  assert set(got) == {"params", "opt_state", "step"}
  leaves = jax.tree_util.tree_leaves_with_path(got["params"])
  assert {p[-1].key for p, _ in leaves} == {"lora_a", "lora_b"}
  assert len(leaves) == 2 * 7
  assert all(x.dtype == np.float32 for _, x in leaves)
  assert meta["lora"] == {"rank": RANK, "alpha": ALPHA,
                          "targets": list(lora.TARGETS), "dtype": "float32",
                          "base": str(student), "revision": None}
  assert np.abs(got["params"]["layers"]["mlp"]["up_proj"]["lora_b"]).max() > 0

  # hf_student/ holds bf16(W) + (alpha / r) B A in bf16, W the student's
  # weights as loaded (bf16) and A, B those of hf_adapter/ (NumPy here).
  work = tmp_path / "run"
  base = load_file(str(student / "model.safetensors"))
  ad = load_file(str(work / "hf_adapter" / lora.PEFT_WEIGHTS))
  merged = load_file(str(work / "hf_student" / "model.safetensors"))
  assert set(merged) == set(base)
  bf16 = ml_dtypes.bfloat16
  n = 0
  for key, w in base.items():
    w16 = w.astype(bf16).astype(np.float64)
    assert merged[key].dtype == bf16, key
    prefix = "base_model.model." + key[:-len(".weight")]
    if prefix + ".lora_A.weight" in ad:
      a, b = ad[prefix + ".lora_A.weight"], ad[prefix + ".lora_B.weight"]
      want = w16 + (ALPHA / RANK) * (b.astype(np.float64) @ a)
      n += 1
    else:
      want = w16
    got_w = merged[key].astype(np.float64)
    # Rounded once to bf16: within half a bf16 step (2^-8 relative).
    assert np.all(np.abs(got_w - want) <= np.abs(want) * 2.0 ** -8 + 1e-30), key
  assert n == 7 * 2


def test_grpo_trains_a_fresh_lora_on_the_frozen_policy(tmp_path):
  """rl.train with config.student.lora: adapters trained and checkpointed,
  the merged weights exported, the KL reference the base itself."""
  from configs import grpo_countdown  # pylint: disable=g-import-not-at-top
  from jaxdistill.rl import train as rl_train  # pylint: disable=g-import-not-at-top
  student = tiny_hf.make_tiny_checkpoint(
      "qwen2", tmp_path / "policy", vocab_size=320, hidden_size=32,
      intermediate_size=64, num_attention_heads=2, num_key_value_heads=1)
  c = config_util.set_fields(grpo_countdown.get_config("runlocal"), {
      "progress": False, "total_steps": 2, "ckpt_every": 2,
      "student.path": str(student), "student.init": None,
      "student.param_dtype": "bfloat16", "student.lora.rank": RANK,
      "student.lora.alpha": ALPHA, "student.lora.targets": ["v_proj", "up_proj"]})
  rs = np.random.RandomState(0)

  def rewards(ro, host_batch):  # varied within groups: a non-zero gradient
    del host_batch
    return {"reward": rs.rand(ro.tokens.shape[0]).astype(np.float32)}

  m = rl_train.train(c, str(tmp_path / "work"), devices=ONE_DEVICE,
                     reward_fn=rewards)
  assert np.isfinite(m["train/loss"])
  got, meta = _restore(tmp_path / "work", 2)
  assert set(got["params"]["layers"]["self_attn"]) == {"v_proj"}
  assert set(got["params"]["layers"]["mlp"]) == {"up_proj"}
  assert np.abs(got["params"]["layers"]["mlp"]["up_proj"]["lora_b"]).max() > 0
  assert meta["lora"]["base"] == str(student) and "rng" in meta
  # Only the two adapted projections differ from the (bf16) policy.
  base = load_file(str(student / "model.safetensors"))
  merged = load_file(str(tmp_path / "work" / "hf_student" / "model.safetensors"))
  changed = {k for k, w in base.items()
             if not np.array_equal(merged[k], w.astype(ml_dtypes.bfloat16))}
  assert changed == {f"model.layers.{i}.{m}" for i in range(2) for m in (
      "self_attn.v_proj.weight", "mlp.up_proj.weight")}


def test_the_compile_only_programs_of_lora_runs_compile_on_a_mesh():
  """train and rl.train's programs (what --compile_only and the TPU fit
  check compile) with LoRA on 8 devices (fsdp 4 x tensor 2): they compile,
  the update's state holds the adapters and the base, and the optimizer
  state is the adapters' only."""
  from configs import grpo_countdown  # pylint: disable=g-import-not-at-top
  from jaxdistill import compile_only  # pylint: disable=g-import-not-at-top
  from jaxdistill import sharding  # pylint: disable=g-import-not-at-top
  from jaxdistill.rl import train as rl_train  # pylint: disable=g-import-not-at-top
  lora_fields = {"student.lora.rank": RANK, "student.lora.alpha": ALPHA,
                 "mesh": {"data": 1, "fsdp": 4, "tensor": 2},
                 "data.batch_size": 8}
  c = config_util.set_fields(distill_config.get_config("runlocal"),
                             dict(lora_fields))
  mesh = train_loop.config_mesh(c, jax.devices())
  scfg, tcfg, cached = train_loop.model_configs(c)
  progs = train_loop.run_programs(c, scfg, tcfg, 300, mesh,
                                  sharding.DEFAULT_RULES, cached)
  g = config_util.set_fields(grpo_countdown.get_config("runlocal"),
                             dict(lora_fields))
  progs += rl_train.programs_for(g, jax.devices())
  assert [p.name for p in progs] == ["rollout", "update", "rollout",
                                     "reference", "update"]
  for i, p in enumerate(progs):
    if i == 2:  # GRPO's rollout is train's rollout program: traced only
      p.trace()
      continue
    p.trace().lower().compile()
    if p.name == "update":
      state = p.args[0]
      assert set(state) == {"params", "opt_state", "step", "base"}
      ad_shapes = {x.shape for x in jax.tree.leaves(state["params"])}
      opt_shapes = {x.shape for x in jax.tree.leaves(state["opt_state"])}
      assert opt_shapes - {()} == ad_shapes  # Adam's moments: adapters only
      opt = compile_only.tree_bytes_per_device(state["opt_state"])
      adapters = compile_only.tree_bytes_per_device(state["params"])
      assert opt <= 2 * adapters + 64  # the two moments, and counts


def test_a_workdir_from_before_the_lora_block_still_resumes(tmp_path):
  """config.json written without student.lora (older runs) compares equal
  to a config whose LoRA is off; turning LoRA on is a different config."""
  import json  # pylint: disable=g-import-not-at-top
  import pytest  # pylint: disable=g-import-not-at-top
  from jaxdistill import config_lib  # pylint: disable=g-import-not-at-top
  c = distill_config.get_config("runlocal")
  old = json.loads(config_lib.to_json(c))
  del old["student"]["lora"]
  (tmp_path / "config.json").write_text(json.dumps(old))
  (tmp_path / "checkpoints").mkdir()
  train_loop.prepare_workdir(c, str(tmp_path), overwrite=False)
  on = config_util.set_fields(distill_config.get_config("runlocal"),
                              {"student.lora.rank": 8})
  with pytest.raises(ValueError, match="student.lora"):
    train_loop.prepare_workdir(on, str(tmp_path), overwrite=False)


def test_a_bad_lora_block_fails_before_compute_naming_the_field(tmp_path):
  import pytest  # pylint: disable=g-import-not-at-top
  from configs import grpo_countdown  # pylint: disable=g-import-not-at-top
  from jaxdistill.rl import train as rl_train  # pylint: disable=g-import-not-at-top
  c = config_util.set_fields(distill_config.get_config("runlocal"),
                             {"student.lora.rank": 4, "student.lora.alpha": -1.0})
  with pytest.raises(ValueError, match=r"config\.student\.lora: .*alpha"):
    train_loop.train(c, str(tmp_path / "a"), devices=ONE_DEVICE)
  g = config_util.set_fields(grpo_countdown.get_config("runlocal"), {
      "student.lora.rank": 4, "student.lora.targets": ["q_proj", "lm_head"]})
  with pytest.raises(ValueError, match=r"config\.student\.lora: .*targets"):
    rl_train.train(g, str(tmp_path / "b"), devices=ONE_DEVICE)
  assert not (tmp_path / "a" / "config.json").exists()
  assert not (tmp_path / "b" / "config.json").exists()
