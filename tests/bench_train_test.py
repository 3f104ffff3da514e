"""bench.models and bench.train with --preset tiny, in-process: the JSON they
print and the FLOP counts they divide by, against a count written here from
the config by hand. No timing is asserted."""
import json

from jaxdistill.bench import models as bench_models
from jaxdistill.bench import presets
from jaxdistill.bench import train as bench_train


def _matmul_params(cfg):
  """Weights of every matmul, projection by projection (the embedding lookup
  is not a matmul; the untied lm_head is)."""
  d, q_out, kv_out = (cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim,
                      cfg.num_key_value_heads * cfg.head_dim)
  q, k, v, o = d * q_out, d * kv_out, d * kv_out, q_out * d
  gate, up, down = (d * cfg.intermediate_size,) * 3
  return (cfg.num_hidden_layers * (q + k + v + o + gate + up + down)
          + d * cfg.vocab_size)


def _attention_fwd(cfg, seq):
  """QK^T and PV over all seq x seq scores: 2 matmuls of 2 seq^2 N H each."""
  return (cfg.num_hidden_layers * 2 * 2 * seq * seq * cfg.num_attention_heads
          * cfg.head_dim)


def _run(main, argv, capsys):
  main(argv)
  return json.loads(capsys.readouterr().out)


def _check_headline(h):
  assert set(h) >= {"name", "value", "unit", "goal", "meets_goal"}
  assert isinstance(h["meets_goal"], bool)


def test_tiny_preset_numbers_by_hand():
  p = presets.get("tiny")
  s, t = p.student, p.teacher
  # Spelled out for the tiny preset: 2 layers, 4 x 16 query and 2 x 16 kv
  # dims, vocab 2048; the student 64 wide (MLP 192), the teacher 128 (384).
  assert _matmul_params(s) == 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 192) + 64 * 2048
  assert _matmul_params(t) == 2 * (128 * 64 * 2 + 128 * 32 * 2 + 3 * 128 * 384) + 128 * 2048
  assert (p.batch, p.seq, p.dtype) == (2, 64, "float32")


def test_bench_train_tiny_preset(capsys):
  p = presets.get("tiny")
  out = _run(bench_train.main, ["--preset", "tiny", "--iters", "1"], capsys)
  b, l, s, t = p.batch, p.seq, p.student, p.teacher
  # Student forward + backward (3 x 2 N T), teacher forward (2 N T), each
  # with its attention matmuls (x3 / x1).
  want = b * (3 * (2 * _matmul_params(s) * l + _attention_fwd(s, l))
              + 2 * _matmul_params(t) * l + _attention_fwd(t, l))
  assert out["model_flops_per_step"] == want
  assert out["config"]["preset"] == "tiny"
  assert out["config"]["dtype"] == out["matmul_dtype"] == "float32"
  assert (out["config"]["batch"], out["config"]["seq_len"]) == (b, l)
  assert out["matmul_flops_per_s"] > 0
  j = out["jax"]
  assert j["step_s"] > 0
  assert abs(j["mfu"] - want / j["step_s"] / out["matmul_flops_per_s"]) < 1e-9
  _check_headline(out["headline"])
  if "torch" in out:  # the tiny preset compares with PyTorch when it can
    assert out["headline"]["unit"] == "x"
    assert abs(out["headline"]["value"]
               - out["torch"]["step_s"] / j["step_s"]) < 1e-3


def test_bench_models_tiny_preset(capsys):
  p = presets.get("tiny")
  out = _run(bench_models.main, ["--preset", "tiny", "--steps", "1",
                                 "--matmul-n", "256", "--matmul-reps", "1"],
             capsys)
  s = p.student
  want = 3 * (2 * _matmul_params(s) + _attention_fwd(s, p.seq) // p.seq)
  assert out["model_flops_per_token"] == want
  assert (out["config"]["batch"], out["config"]["seq"]) == (p.batch, p.seq)
  assert out["config"]["model"]["hidden_size"] == s.hidden_size
  assert out["matmul"]["dtype"] == "float32"
  _check_headline(out["headline"])
  frac = out["jax"]["fraction_of_matmul_flops"]
  assert 0 < frac and out["flops_goal"]["value"] == frac
