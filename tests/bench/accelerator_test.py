"""bench.accelerator --quick end to end on the CPU: what it counts (tokens,
bytes a decode step reads, model FLOPs) against counts written here by hand
from the tiny models' dimensions, and the JSON's shape. No timing is
asserted."""
import json

import jax
import pytest

from jaxdistill import compile_only
from jaxdistill.bench import accelerator
from jaxdistill.bench import suite

# configs/distill.py:runlocal's tiny Llamas, spelled out (float32, untied).
V, L = 320, 2
STUDENT = dict(d=32, f=64, heads=2, kv=1, hd=16)
TEACHER = dict(d=64, f=128, heads=4, kv=2, hd=16)
B, P, N = 4, 16, 8  # --quick


def _weight_bytes(d, f, heads, kv, hd):
  """Every weight as stored: per layer q, k, v, o, gate, up, down and two
  norms; the embedding, the final norm and the untied head."""
  layer = d * heads * hd + 2 * d * kv * hd + heads * hd * d + 3 * d * f + 2 * d
  return 4 * (L * layer + V * d + d + d * V)


def _kv_bytes(kv, hd, **_):
  """K and V of every layer for B rows of P + N - 1 positions."""
  return 4 * 2 * L * B * kv * (P + N - 1) * hd


def _update_flops():
  """Student forward + backward and teacher forward over B x (P + N)
  tokens: 2 flops per matmul weight per token, plus QK^T and PV."""
  t = P + N

  def fwd(d, f, heads, kv, hd):
    n = L * (2 * d * heads * hd + 2 * d * kv * hd + 3 * d * f) + d * V
    return 2 * n * t + 4 * L * t * t * heads * hd
  return B * (3 * fwd(**STUDENT) + fwd(**TEACHER))


def test_hand_counts_are_the_runlocal_models():
  config = accelerator.run_config("tiny", B, P, N)
  for name, dims in (("student", STUDENT), ("teacher", TEACHER)):
    init = config[name].init
    assert (init["vocab_size"], init["num_hidden_layers"]) == (V, L)
    assert (init["hidden_size"], init["intermediate_size"],
            init["num_attention_heads"], init["num_key_value_heads"],
            init["head_dim"]) == tuple(dims.values())
  assert _weight_bytes(**STUDENT) == 156_288
  assert _kv_bytes(**STUDENT) == 23_552


def test_bad_policies_are_refused_before_any_work():
  with pytest.raises(ValueError, match="--policies"):
    accelerator.main(["--quick", "--policies", "student,mixture"])


@pytest.mark.slow
def test_quick_run_counts_by_hand(capsys):
  out = accelerator.main(["--quick", "--steps", "1"])
  assert suite.last_json(capsys.readouterr().out) == json.loads(json.dumps(out))
  assert out["device"]["platform"] == "cpu"
  assert out["device"]["jax"] == jax.__version__
  assert out["device"]["target"] is None  # no data sheet for a CPU
  assert out["peak_memory"] is None
  assert "measured" in out["limits"]["source"]
  assert (out["config"]["batch"], out["config"]["prompt_len"],
          out["config"]["new_tokens"]) == (B, P, N)
  for policy, dims in (("student", STUDENT), ("teacher", TEACHER)):
    r = out["policies"][policy]
    assert r["rollout"]["new_tokens"] == B * N  # EOS off: every row runs N
    assert r["rollout_len"] == N
    lim = r["rollout"]["decode_step_hbm_limit"]
    assert lim["weight_bytes"] == _weight_bytes(**dims)
    assert lim["kv_cache_bytes"] == _kv_bytes(**dims)
    assert lim["bytes"] == _weight_bytes(**dims) + _kv_bytes(**dims)
    assert r["update"]["model_flops"] == _update_flops()
    for part in ("rollout", "update"):
      assert r[part]["compile_only"] is None and r[part]["over_bound"] is None
    assert r["step"]["bound_s"] is None
    assert len(r["step"]["times_s"]) == 1
  h = out["headline"]
  assert set(h) >= {"name", "value", "unit", "goal", "meets_goal"}
  assert isinstance(h["meets_goal"], bool)
  peer = out["peer"]
  if peer["impl"] is None:  # torch missing: the headline is the MFU
    assert peer["reason"] and h["unit"] == "fraction"
  else:
    assert peer["impl"] in ("trl GKDTrainer", "plain PyTorch + transformers")
    st = out["policies"]["student"]["step"]
    assert st["peer_s"] == peer["policies"]["student"]["step_s"] > 0
    assert peer["policies"]["teacher"]["step_s"] > 0
    assert h["unit"] == "x" and h["value"] == round(st["peer_s"] / st["s"], 3)


@pytest.mark.slow
def test_with_a_target_each_part_sits_beside_its_bound(monkeypatch, capsys):
  # The path a GPU takes, on the CPU: a Target with H100-like figures for
  # the CPU device, so that each program is compiled for its bound.
  peak, bw = 989.4e12, 3.352e12

  def local_target(devices):
    return compile_only.Target("fake", compile_only.CHIPS["v5e"], "cpu", 1,
                               tuple(devices), 16 << 30, peak, bw)
  monkeypatch.setattr(compile_only, "local_target", local_target)
  out = accelerator.main(["--quick", "--steps", "1", "--policies", "student",
                          "--peer", "none"])
  capsys.readouterr()
  assert out["device"]["target"] == "fake"
  assert out["limits"]["peak_flops_per_device"] == peak
  r = out["policies"]["student"]
  ro, up, st = r["rollout"], r["update"], r["step"]
  # The rollout's limit: N decode steps, each reading the weights and the
  # whole KV cache at the data sheet's bandwidth.
  per_step = _weight_bytes(**STUDENT) + _kv_bytes(**STUDENT)
  assert ro["decode_step_hbm_limit"]["s"] == pytest.approx(per_step / bw)
  assert ro["compile_only"]["limit_s"] == pytest.approx(N * per_step / bw)
  assert up["compile_only"]["limit_s"] > 0
  assert st["bound_s"] == pytest.approx(
      ro["compile_only"]["step_time_bound_s"]
      + up["compile_only"]["step_time_bound_s"])
  assert up["mfu"] == pytest.approx(_update_flops() / up["s"] / peak)
  h = out["headline"]
  assert h["unit"] == "x bound"
  assert h["value"] == round(st["s"] / st["bound_s"], 3)
