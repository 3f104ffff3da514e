"""The paper's pipeline end to end at runlocal sizes, each stage the config the
real run uses (arXiv 2609.35259: App. D.2.2, Sec. 4, App. D.6):

  teacher SFT with LoRA (configs/teacher_sft.py)
  -> teacher GRPO with the DAPO loss and LoRA, from the SFT teacher
     (configs/teacher_grpo.py)
  -> distillation of a student from that teacher (configs/distill.py, one arm)
  -> RLVR with a fresh LoRA on the distilled student
     (configs/grpo_after_distill.py, its `arm=`).

Each stage must start from the previous stage's export (checked on the
tensors LoRA does not touch, which a stage carries over unchanged) and write
its own; the LoRA stages also write their adapters in peft's layout.
"""
import json
import pathlib
import shutil

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from jaxdistill import config_lib
from jaxdistill import models
from jaxdistill.rl import train as rl_train
from jaxdistill.train import loop as train_loop
from tests import config_util

ONE_DEVICE = [jax.devices()[0]]
LORA = {"student.lora.rank": 4, "student.lora.alpha": 8.0}
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
           "down_proj")


def _weights(export: pathlib.Path) -> dict:
  return load_file(export / "model.safetensors")


def _frozen(weights: dict) -> dict:
  """The tensors LoRA does not adapt: embeddings, norms, the head."""
  return {k: v for k, v in weights.items()
          if not any(f".{t}." in k for t in TARGETS)}


def _carried_over(before: pathlib.Path, after: pathlib.Path):
  a, b = _weights(before), _weights(after)
  assert sorted(a) == sorted(b)
  for k, v in _frozen(a).items():
    np.testing.assert_array_equal(b[k], v, err_msg=k)


@pytest.mark.slow
def test_teacher_sft_grpo_distill_rlvr(tmp_path):
  # 1. The teacher's SFT on demonstrations (runlocal: synthetic records).
  sft = tmp_path / "teacher_sft"
  c = config_util.set_fields(
      config_lib.load_config("configs/teacher_sft.py:runlocal"),
      {**LORA, "progress": False})
  train_loop.train(c, str(sft), devices=ONE_DEVICE)
  assert (sft / "hf_adapter" / "adapter_config.json").is_file()
  cfg = json.loads((sft / "hf_adapter" / "adapter_config.json").read_text())
  assert (cfg["r"], cfg["lora_alpha"]) == (4, 8.0)

  # 2. The teacher's GRPO (DAPO loss, top-p 0.95) from the SFT teacher.
  grpo = tmp_path / "teacher_grpo"
  c = config_lib.load_config("configs/teacher_grpo.py:runlocal")
  assert c.grpo.loss == "dapo" and c.rollout.top_p == 0.95
  c = config_util.set_fields(c, {
      **LORA, "student.path": str(sft / "hf_student"), "student.init": None,
      "tokenizer_build": None, "progress": False})
  rl_train.train(c, str(grpo), devices=ONE_DEVICE)
  _carried_over(sft / "hf_student", grpo / "hf_student")
  assert (grpo / "hf_adapter" / "adapter_model.safetensors").is_file()

  # 3. Distillation: a fresh student (the teacher's tokenizer) learns from
  # the GRPO teacher with reverse KL on its own rollouts.
  student0 = tmp_path / "student0"
  scfg = models.checkpoint.read_config(grpo / "hf_student")
  models.save_pretrained(scfg, models.init(scfg, jax.random.key(7)),
                         str(student0))
  for f in (grpo / "hf_student").iterdir():
    if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
      shutil.copy(f, student0 / f.name)
  distill = tmp_path / "distill"
  c = config_util.set_fields(
      config_lib.load_config("configs/distill.py:runlocal,kl=reverse"),
      {"student.path": str(student0), "student.init": None,
       "teacher.path": str(grpo / "hf_student"), "teacher.init": None,
       "tokenizer_build": None, "progress": False})
  train_loop.train(c, str(distill), devices=ONE_DEVICE)
  before, after = _weights(student0), _weights(distill / "hf_student")
  assert any(not np.array_equal(before[k], after[k]) for k in before)

  # 4. RLVR: a fresh LoRA on the distilled student, Table 4's recipe.
  rlvr = tmp_path / "rlvr"
  c = config_lib.load_config(
      f"configs/grpo_after_distill.py:runlocal,arm={distill}")
  assert c.grpo.loss == "dapo" and c.student.lora.rank
  c.progress = False
  rl_train.train(c, str(rlvr), devices=ONE_DEVICE)
  _carried_over(distill / "hf_student", rlvr / "hf_student")
  assert (rlvr / "hf_adapter" / "adapter_model.safetensors").is_file()
