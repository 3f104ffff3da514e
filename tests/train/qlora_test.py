"""QLoRA runs (config.student.lora.base_quant='nf4'): GRPO trains adapters on
a frozen NF4 base, exports the quantised model with them merged (checked
against bitsandbytes' own NF4 round trip), and its compile-only programs
hold the base in 4 bits."""
import pathlib
import sys

import jax
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from jaxdistill.models import lora
from jaxdistill.models import quant

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests import config_util  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests import tiny_hf  # pylint: disable=g-import-not-at-top,wrong-import-position

bnb_f = pytest.importorskip("bitsandbytes.functional")
torch = pytest.importorskip("torch")

RANK, ALPHA = 4, 8.0
# Projection inputs in multiples of NF4's block of 64 (hidden 64, 4 heads of
# 16, MLP 128).
WIDE = dict(vocab_size=320, hidden_size=64, intermediate_size=128,
            num_attention_heads=4, num_key_value_heads=2)


def _grpo_config(**fields):
  from configs import grpo_countdown  # pylint: disable=g-import-not-at-top
  return config_util.set_fields(grpo_countdown.get_config("runlocal"), {
      "progress": False, "student.lora.rank": RANK, "student.lora.alpha": ALPHA,
      "student.lora.base_quant": "nf4",
      **fields})


def _restore(workdir, step):
  return config_util.restore_checkpoint(workdir, step)


def test_grpo_on_an_nf4_base_exports_the_quantised_model_plus_adapters(tmp_path):
  from jaxdistill.rl import train as rl_train  # pylint: disable=g-import-not-at-top
  student = tiny_hf.make_tiny_checkpoint("qwen2", tmp_path / "policy", **WIDE)
  c = _grpo_config(**{"total_steps": 2, "ckpt_every": 2,
                      "student.path": str(student), "student.init": None,
                      "student.param_dtype": "bfloat16"})
  rs = np.random.RandomState(0)

  def rewards(ro, host_batch):  # varied within groups: a non-zero gradient
    del host_batch
    return {"reward": rs.rand(ro.tokens.shape[0]).astype(np.float32)}

  m = rl_train.train(c, str(tmp_path / "work"), devices=[jax.devices()[0]],
                     reward_fn=rewards)
  assert np.isfinite(m["train/loss"])
  got, meta = _restore(tmp_path / "work", 2)
  assert set(got) == {"params", "opt_state", "step"}  # no base saved
  assert meta["lora"]["base_quant"] == "nf4"
  assert np.abs(got["params"]["layers"]["mlp"]["up_proj"]["lora_b"]).max() > 0

  # hf_student/: each projection bf16(NF4(W) + (alpha / r) B A), NF4(W) by
  # bitsandbytes from the bf16 weight as loaded; the rest bf16(W).
  base = load_file(str(student / "model.safetensors"))
  ad = load_file(str(tmp_path / "work" / "hf_adapter" / lora.PEFT_WEIGHTS))
  merged = load_file(str(tmp_path / "work" / "hf_student" / "model.safetensors"))
  n = 0
  for key, w in base.items():
    w16 = w.astype(ml_dtypes.bfloat16)
    prefix = "base_model.model." + key[:-len(".weight")]
    if prefix + ".lora_A.weight" not in ad:
      np.testing.assert_array_equal(merged[key], w16, err_msg=key)
      continue
    packed, state = bnb_f.quantize_4bit(
        torch.tensor(w16.astype(np.float32)).to(torch.bfloat16), blocksize=64,
        quant_type="nf4")
    wq = bnb_f.dequantize_4bit(packed, state).double().numpy()
    a, b = ad[prefix + ".lora_A.weight"], ad[prefix + ".lora_B.weight"]
    want = wq + (ALPHA / RANK) * (b.astype(np.float64) @ a)
    got_w = merged[key].astype(np.float64)
    ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(want), 1e-30))) - 7)
    assert np.all(np.abs(got_w - want) <= 0.5 * ulp * (1 + 1e-3) + 1e-12), key
    # 4 bits moved the weight (the export is not W + B A).
    assert np.abs(wq - w16.astype(np.float64)).max() > 1e-3
    n += 1
  assert n == 7 * 2


def test_compile_only_programs_hold_the_base_in_four_bits():
  """rl.train's programs with an NF4 base on 8 devices (fsdp 4 x tensor 2)
  compile, the update's base is NF4 codes and absmaxes, and its bytes are
  about 4.5 / 32 of the float32 projections'."""
  from jaxdistill import compile_only  # pylint: disable=g-import-not-at-top
  from jaxdistill.rl import train as rl_train  # pylint: disable=g-import-not-at-top
  init = dict(_grpo_config().student.init)
  init.update(hidden_size=64, intermediate_size=128, num_attention_heads=4,
              num_key_value_heads=2)
  fields = {"student.init": init, "mesh": {"data": 1, "fsdp": 4, "tensor": 2},
            "data.batch_size": 8}
  progs = rl_train.programs_for(_grpo_config(**fields), jax.devices())
  plain = rl_train.programs_for(_grpo_config(**{
      **fields, "student.lora.base_quant": None}), jax.devices())
  update = next(p for p in progs if p.name == "update")
  update.trace().lower().compile()
  base = update.args[0]["base"]
  mlp = base["layers"]["mlp"]["up_proj"]
  assert set(mlp) == {quant.CODES, quant.ABSMAX}
  assert mlp[quant.CODES].dtype == np.uint8
  plain_base = next(p for p in plain if p.name == "update").args[0]["base"]
  nbytes = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))
  assert nbytes(base["layers"]["mlp"]) * 32 == nbytes(
      plain_base["layers"]["mlp"]) * 4.5
  assert compile_only.tree_bytes_per_device(base) < (
      compile_only.tree_bytes_per_device(plain_base))
  for p in progs:
    if p.name != "update":
      p.trace().lower().compile()
