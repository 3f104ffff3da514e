"""Decode layouts (rollout.generate's decode_layout) on an 8-device CPU mesh.

Reference: the same rollout in the run's own layout ('train', the FSDP
weights every rollout used before decode layouts): the tokens are equal
token for token, for Llama and Qwen2 tiny models in bf16 compute over
float32 weights, greedy and seeded sampling, student / teacher / spectrum.
And the inter-chip bytes of a decode step of the compiled programs
(collectives.count): no weight is gathered in the decode loop.
"""
import dataclasses

import jax
import numpy as np
import pytest

from jaxdistill import collectives
from jaxdistill import compile_only
from jaxdistill import config_lib
from jaxdistill import models
from jaxdistill import rollout
from jaxdistill import sharding
from jaxdistill.evaluate import programs as eval_programs
from jaxdistill.evaluate import run as eval_run
from jaxdistill.models import flops
from jaxdistill.rl import train as rl_train
from jaxdistill.rollout import generation
from jaxdistill.train import programs as train_programs

EOS = (2, 5)


def _model(seed, **kw):
  base = dict(family="llama", vocab_size=96, hidden_size=32,
              intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, eos_token_id=EOS,
              max_position_embeddings=128, rope_theta=10000.0,
              dtype="bfloat16", param_dtype="float32")
  cfg = models.ModelConfig(**{**base, **kw})
  rng = np.random.default_rng(seed)

  def fill(path, s):
    is_norm = "scale" in jax.tree_util.keystr(path)
    return np.asarray(rng.normal(0.0, 0.15, s.shape) + is_norm, s.dtype)
  return cfg, jax.tree_util.tree_map_with_path(fill, models.param_shapes(cfg))


@pytest.fixture(scope="module")
def setup():
  student = _model(0)
  teacher = _model(1, family="qwen2", vocab_size=104, hidden_size=48,
                   num_hidden_layers=3, attention_bias=True)
  rng = np.random.default_rng(0)
  ids = [rng.integers(6, 96, n).tolist() for n in rng.integers(1, 8, 8)]
  prompts, mask = rollout.pad_prompts(ids, bucket=8)
  # TP over the 4-way fsdp axis: 4 heads split, 2 kv heads replicated.
  mesh = sharding.make_mesh({"data": 2, "fsdp": 4})
  return student, teacher, prompts, mask, mesh


CASES = [("student", None, 0.0), ("student", None, 1.0),
         ("teacher", None, 0.0), ("teacher", None, 1.0),
         ("spectrum", 0.5, 1.0)]


@pytest.mark.parametrize("layout", ["replicated", "tp"])
@pytest.mark.parametrize("policy,lam,temperature", CASES)
def test_decode_layouts_give_the_train_layouts_tokens(setup, layout, policy,
                                                      lam, temperature):
  student, teacher, prompts, mask, mesh = setup
  kw = dict(policy=policy, lam=lam, rng=jax.random.key(3), max_new_tokens=12,
            temperature=temperature, teacher_temperature=temperature / 2,
            mesh=mesh)
  ref = rollout.generate(student, teacher, prompts, mask,
                         decode_layout="train", **kw)
  got = rollout.generate(student, teacher, prompts, mask, decode_layout=layout,
                         **kw)
  np.testing.assert_array_equal(got.tokens, ref.tokens)
  np.testing.assert_array_equal(got.response_mask, ref.response_mask)
  np.testing.assert_array_equal(got.from_student, ref.from_student)
  # Log-probs up to rounding: XLA fuses and orders the arithmetic of each
  # layout its own way ('tp' also sums matmul partial products across
  # chips); a bf16 rounding that flips carries on through the bf16 KV cache
  # (seen: up to 9e-3 in a row).
  np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=2e-2)
  # Rows differ and some are long: the comparison sees real decoding.
  assert len({tuple(r) for r in np.asarray(ref.tokens).tolist()}) > 4
  assert int(np.asarray(ref.lengths).max()) > 3


def _decode_step_bytes(setup, layout, policy):
  """Per-device inter-chip bytes of one decode step of the compiled rollout
  (the decode loop's collectives, collectives.count), weights passed in the
  training layout (FSDP)."""
  (scfg, _), (tcfg, _), prompts, _, mesh = setup
  rules = sharding.DEFAULT_RULES
  abstract = lambda cfg: train_programs.abstract_params(cfg, mesh, rules)
  rows = train_programs.batch_struct(prompts.shape, np.int32, mesh, rules)
  fn, args, kwargs = rollout.program(
      (scfg, abstract(scfg)) if policy != "teacher" else None,
      (tcfg, abstract(tcfg)), rows, rows, policy=policy, max_new_tokens=12,
      temperature=1.0, mesh=mesh, rules=rules, decode_layout=layout,
      lam=0.5 if policy == "spectrum" else None)
  assert kwargs["layouts"] == (layout,) * (2 if policy == "spectrum" else 1)
  text = fn.lower(*args, **kwargs).compile().as_text()
  loops = [l for l in collectives.count(text, mesh.devices.size)["ici_loops"]
           if l["op_name"] == "jit(_rollout)/while"]
  # XLA:CPU leaves the decode loop's trip count unknown: counted once.
  return sum(l["bytes"] / (l["trips"] or 1) for l in loops)


@pytest.mark.parametrize("policy", ["teacher", "spectrum"])
def test_decode_steps_move_activations_not_weights(setup, policy):
  """A decode step gathers no weight: 'replicated' moves only the loop's
  row flags, 'tp' activations, well under what gathering the weights once
  would move ((n - 1) / n of their bf16 bytes into each of n devices).
  ('train' cannot be the reference here: XLA:CPU hoists its FSDP gathers
  out of the loop, the TPU compiler does not, docs/tpu.md.)"""
  (scfg, _), (tcfg, _), _, _, mesh = setup
  n = mesh.devices.size
  cfgs = (tcfg,) if policy == "teacher" else (scfg, tcfg)
  gather = sum(flops.weight_bytes(dataclasses.replace(
      c, param_dtype=c.dtype)) for c in cfgs) * (n - 1) / n
  assert _decode_step_bytes(setup, "replicated", policy) < 64
  assert _decode_step_bytes(setup, "tp", policy) < gather / 2


def test_resolve_layout():
  cfg, _ = _model(0)
  mesh = sharding.make_mesh({"fsdp": -1})
  assert generation.resolve_layout(cfg, "tp", mesh) == "tp"
  assert generation.resolve_layout(cfg, "tp", None) == "train"
  # CPU devices report no memory: 'auto' keeps the run's layout.
  assert generation.resolve_layout(cfg, "auto", mesh) == "train"
  with pytest.raises(ValueError, match="decode_layout: expected one of"):
    generation.resolve_layout(cfg, "fsdp", mesh)


def test_auto_replicates_only_a_model_far_smaller_than_a_chip(monkeypatch):
  cfg, params = _model(0)
  bf16 = 2 * sum(x.size for x in jax.tree.leaves(params))
  mesh = sharding.make_mesh({"fsdp": -1})
  share = generation.REPLICATE_SHARE
  for hbm, want in ((bf16 / share, "replicated"), (bf16 / share - 8, "tp")):
    monkeypatch.setattr(compile_only, "device_hbm_bytes", lambda d, h=hbm: h)
    assert generation.resolve_layout(cfg, "auto", mesh) == want


def test_decode_rules():
  rules = dict(sharding.decode_rules(sharding.DEFAULT_RULES, "tp"))
  assert rules["heads"] == rules["mlp"] == rules["vocab"] == ("fsdp", "tensor")
  assert rules["embed"] is None and rules["batch"] is None
  assert all(v is None for _, v in
             sharding.decode_rules(sharding.DEFAULT_RULES, "replicated"))


def test_tp_splits_every_matrix_over_an_output_dim():
  """Over a 4-way model axis (the size-1 'tensor' axis drops out): 4 heads
  split; 2 kv heads and a model of 6 heads cannot be, so those projections
  (and their biases) split head_dim; o_proj and down_proj split their
  embedding outputs, gate and up the mlp, the embedding its vocab rows;
  norms stay whole. No contracted dim is split."""
  mesh = sharding.make_mesh({"data": 2, "fsdp": 4})
  P = sharding.P
  for heads, q in ((4, P(None, None, "fsdp", None)),
                   (6, P(None, None, None, "fsdp"))):
    cfg, params = _model(0, num_attention_heads=heads, attention_bias=True)
    shard = sharding.decode_shardings(models.logical_axes(cfg), mesh,
                                      sharding.DEFAULT_RULES, "tp", params)
    attn, mlp = shard["layers"]["self_attn"], shard["layers"]["mlp"]
    # kernels [L, in..., out...]; biases [L, heads, head_dim]
    assert attn["q_proj"]["kernel"].spec == q
    assert attn["q_proj"]["bias"].spec == P(*q[:1], *q[2:])
    assert attn["k_proj"]["kernel"].spec == P(None, None, None, "fsdp")
    assert attn["v_proj"]["bias"].spec == P(None, None, "fsdp")
    assert attn["o_proj"]["kernel"].spec == P(None, None, None, "fsdp")
    assert mlp["gate_proj"]["kernel"].spec == P(None, None, "fsdp")
    assert mlp["down_proj"]["kernel"].spec == P(None, None, "fsdp")
    assert shard["embed_tokens"]["embedding"].spec == P("fsdp", None)
    assert shard["layers"]["input_layernorm"]["scale"].spec == P(None, None)


@pytest.mark.parametrize("policy,lam,temperature", [
    ("student", None, 0.0), ("teacher", None, 1.0), ("spectrum", 0.5, 1.0)])
def test_pinned_tp_decode_gives_the_train_layouts_rollout(
    setup, monkeypatch, policy, lam, temperature):
  """The decode step's activation pins (sharding.DecodeActivations, what
  accelerators compile) forced on the CPU mesh, in float32 compute (in
  bf16 XLA:CPU's matmul kernels round differently at the rows per device
  that the pins leave, generation.PIN_CPU): the 'train' layout's tokens,
  and its log-probs within float32 rounding, for a teacher of 6 heads on
  the 4-way model axis (its projections split head_dim, RoPE after the
  move onto the cache's rows)."""
  *_, prompts, mask, mesh = setup
  f32 = dict(dtype="float32")
  student = _model(0, **f32)
  teacher = _model(1, family="qwen2", vocab_size=104, hidden_size=48,
                   num_hidden_layers=3, attention_bias=True,
                   num_attention_heads=6, **f32)
  kw = dict(policy=policy, lam=lam, rng=jax.random.key(3), max_new_tokens=12,
            temperature=temperature, teacher_temperature=temperature / 2,
            mesh=mesh)
  ref = rollout.generate(student, teacher, prompts, mask,
                         decode_layout="train", **kw)
  monkeypatch.setattr(generation, "PIN_CPU", True)
  got = rollout.generate(student, teacher, prompts, mask, decode_layout="tp",
                         **kw)
  np.testing.assert_array_equal(got.tokens, ref.tokens)
  np.testing.assert_array_equal(got.from_student, ref.from_student)
  np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=1e-5)
  assert len({tuple(r) for r in np.asarray(ref.tokens).tolist()}) > 4


def test_compile_only_reads_each_layouts_weights_per_step():
  """The bytes model of the rollout program (train/programs.py): a chip
  reads per decode step the float32 weights whole ('train', gathered), a
  bf16 copy whole ('replicated') or a quarter of it ('tp' on 4 model-axis
  devices); parameters counted from the tree."""
  cfg, params = _model(0)
  count = sum(x.size for x in jax.tree.leaves(params))
  mesh = sharding.make_mesh({"data": 2, "fsdp": 4})
  got = {l: generation.decode_weight_bytes(cfg, l, mesh)
         for l in ("train", "replicated", "tp")}
  assert got == {"train": 4 * count, "replicated": 2 * count,
                 "tp": 2 * count / 4}


def test_evaluation_and_grpo_take_the_layout_from_their_configs(monkeypatch):
  """sampler.decode_layout (evaluation) and rollout.decode_layout (GRPO)
  reach the compile-only rollout programs; a name not in the list is
  refused naming the field before anything is built."""
  seen = []
  real = train_programs.rollout_program
  monkeypatch.setattr(train_programs, "rollout_program", lambda *a, **k: (
      seen.append(k["decode_layout"]), real(*a, **k))[1])
  c = config_lib.load_config("configs/eval.py:runlocal")
  assert c.sampler.decode_layout == "auto"
  c.sampler.decode_layout = "replicated"
  mesh = eval_programs.mesh_of(c, jax.devices()[:1])
  eval_programs.eval_programs(c, models.get_preset("qwen2.5-0.5b"), 151665,
                              mesh, sharding.rules_from_config(c))
  assert seen and set(seen) == {"replicated"}
  seen.clear()
  g = config_lib.load_config("configs/grpo_after_distill.py:runlocal")
  g.tokenizer_build = None
  g.student.init.update(vocab_size=320)
  assert g.rollout.decode_layout == "auto"
  g.rollout.decode_layout = "tp"
  rl_train.programs_for(g, jax.devices()[:1])
  assert seen == ["tp"]
  c.sampler.decode_layout = "sharded"
  with pytest.raises(ValueError, match=r"config\.sampler\.decode_layout: "
                     r"expected one of \('auto', 'train', 'replicated', "
                     r"'tp'\) \(None: 'auto'\), got 'sharded'"):
    eval_run.check_config(c)
  g.rollout.decode_layout = "TP"
  with pytest.raises(ValueError, match=r"config\.rollout\.decode_layout: "
                     r"expected one of .* got 'TP'"):
    rl_train.validate(g)
  t = config_lib.load_config("configs/distill.py:runlocal")
  t.rollout.decode_layout = "fsdp"
  with pytest.raises(ValueError, match=r"config\.rollout\.decode_layout: "
                     r"expected one of .* got 'fsdp'"):
    config_lib.validate(t)


@pytest.mark.parametrize("layout", ["replicated", "tp"])
def test_an_nf4_student_decodes_as_in_the_train_layout(layout):
  """A QLoRA policy (NF4 base, models/quant.py, with adapters attached):
  each decode layout's copy is dequantised once, and its tokens equal those
  of the train layout, which dequantises at every use."""
  from jaxdistill.models import lora  # pylint: disable=g-import-not-at-top
  cfg, params = _model(0, hidden_size=64, intermediate_size=128, head_dim=16)
  lcfg = lora.LoraConfig(2, 2.0, base_quant="nf4")
  adapters = jax.tree.map(
      lambda x: 0.05 * np.random.default_rng(2).standard_normal(x.shape).astype(
          np.float32), lora.shapes(cfg, lcfg))
  policy = lora.attach(lora.quantize_base(lcfg, params), adapters, lcfg.scale)
  rng = np.random.default_rng(1)
  ids = [rng.integers(6, 96, n).tolist() for n in rng.integers(1, 8, 8)]
  prompts, mask = rollout.pad_prompts(ids, bucket=8)
  mesh = sharding.make_mesh({"data": 2, "fsdp": 4})
  kw = dict(policy="student", rng=jax.random.key(3), max_new_tokens=12,
            temperature=1.0, mesh=mesh)
  ref = rollout.generate((cfg, policy), None, prompts, mask,
                         decode_layout="train", **kw)
  got = rollout.generate((cfg, policy), None, prompts, mask,
                         decode_layout=layout, **kw)
  np.testing.assert_array_equal(got.tokens, ref.tokens)
  np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=2e-2)
  assert len({tuple(r) for r in np.asarray(ref.tokens).tolist()}) > 4
