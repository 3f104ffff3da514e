"""bench.rollout --preset tiny: the JSON's structure, its bandwidth bound and
its --profile bytes, checked against byte counts written out by hand from the
preset's config."""
import json
import os
import subprocess
import sys

import jax
import pytest

from jaxdistill import models
from jaxdistill.bench import presets
from jaxdistill.bench import rollout as bench_rollout


def _hand_count_floats(c):
  """Weights of each projection, per layer, from the config's shapes."""
  d, f = c.hidden_size, c.intermediate_size
  nh, kh, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
  return {"q_proj": d * nh * hd, "k_proj": d * kh * hd, "v_proj": d * kh * hd,
          "o_proj": nh * hd * d, "gate_proj": d * f, "up_proj": d * f,
          "down_proj": f * d}


def _hand_count_bytes(c, batch, cache_len):
  """Bytes one decode step reads: float32 weights without the (untied)
  embedding table, plus K and V for every layer, row, slot and kv head."""
  d, l = c.hidden_size, c.num_hidden_layers
  per_layer = sum(_hand_count_floats(c).values()) + 2 * d  # + two RMSNorms
  weights = l * per_layer + d + d * c.vocab_size  # + final norm + lm_head
  kv = 2 * l * batch * cache_len * c.num_key_value_heads * c.head_dim
  return 4 * weights, 4 * kv


def test_preset_tiny_json_and_bound(capsys):
  bench_rollout.main(["--preset", "tiny", "--rounds", "1"])
  out = json.loads(capsys.readouterr().out)
  assert set(out["headline"]) == {"name", "value", "unit", "goal",
                                  "meets_goal"}
  pre = presets.get("tiny")
  c = pre.student
  assert not c.tie_word_embeddings and c.param_dtype == "float32"
  assert out["setup"]["preset"] == "tiny"
  assert (out["setup"]["batch"], out["setup"]["prompt_len"],
          out["setup"]["new_tokens"]) == (pre.batch, pre.prompt_len,
                                          pre.new_tokens)
  w, kv = _hand_count_bytes(c, pre.batch, pre.prompt_len + pre.new_tokens - 1)
  bb = out["bandwidth_bound"]
  assert (bb["weight_bytes_per_step"], bb["kv_bytes_per_step"]) == (w, kv)
  bw = bb["copy_bandwidth_GBps"] * 1e9
  assert abs(bb["bound_step_s"] - (w + kv) / bw) <= 0.01 * bb["bound_step_s"]
  step = out["jaxdistill"]["decode_step_ms"] / 1e3
  assert step > 0  # a step resolved above the timer's noise, or an error
  assert abs(bb["measured_over_bound"] - step / bb["bound_step_s"]) <= 0.01 + (
      0.01 * abs(bb["measured_over_bound"]))
  assert out["headline"]["value"] == bb["measured_over_bound"]


def test_profile_scope_bytes_match_the_hand_count():
  # The bytes each decode-step product reads, per source scope of the
  # profile, against the config's shapes written out by hand.
  c = presets.get("tiny").student
  params = models.init(c, jax.random.key(0))
  got = bench_rollout._scope_bytes(c, params, kv_bytes=1000)
  for name, n in _hand_count_floats(c).items():
    assert got[f"{name}/dot_general"] == 4 * c.num_hidden_layers * n, name
  assert got["BD,VD->BV/dot_general"] == 4 * c.hidden_size * c.vocab_size
  assert got["BTKGH,BKSH->BKGTS/dot_general"] == 500
  assert got["BKGTS,BKHS->BTKGH/dot_general"] == 500


def test_profile_per_decode_step():
  # --profile in a fresh process (it sets the dump flag before JAX starts):
  # every product of the step is attributed, with its bytes.
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  out = subprocess.run(
      [sys.executable, "-m", "jaxdistill.bench.rollout", "--preset", "tiny",
       "--rounds", "1", "--profile"], env=env, check=True,
      capture_output=True, text=True, timeout=300).stdout
  prof = json.loads(out)["decode_profile"]
  rows = {r["scope"]: r for r in prof["by_scope"]}
  c = presets.get("tiny").student
  floats = {k: c.num_hidden_layers * n for k, n in _hand_count_floats(c).items()}
  floats["BD,VD->BV"] = c.hidden_size * c.vocab_size  # rollout's CPU head layout
  for name, n in floats.items():
    r = rows[f"{name}/dot_general"]
    assert r["MB_read"] == round(4 * n / 1e6, 3), name
    assert r["ms_per_step"] > 0
    # Both inputs are rounded (MB to 3 places, ms to 4): 5 % covers it.
    assert abs(r["GBps"] - r["MB_read"] / r["ms_per_step"]) <= 0.05 * r["GBps"]
  assert 0 < prof["dot_share"] <= 1


def _fake_clock(monkeypatch, times):
  """bench.rollout's timer replaced by a list of (seconds) it hands out in
  turn: the n-token and 1-token runs alternate after the two compile runs."""
  it = iter(times)
  monkeypatch.setattr(bench_rollout, "_timed",
                      lambda fn: (next(it), fn()))


def _tiny():
  pre = presets.get("tiny")
  params = models.init(pre.student, jax.random.key(0))
  return pre.student, params


def test_decode_timing_runs_more_rounds_until_the_step_resolves(monkeypatch):
  cfg, params = _tiny()
  n = 5
  # compile runs, then round 1 (n-run 1.0 s no slower than the 1-run 1.2 s:
  # unresolved), round 2 (3.0 vs 1.0): medians 2.0 and 1.1 resolve it.
  _fake_clock(monkeypatch, [9.0, 8.0, 1.0, 1.2, 3.0, 1.0])
  t = bench_rollout._decode_timing(cfg, params, 1, 4, n, rounds=1)
  assert t["rounds_run"] == 2
  assert abs(t["step_s"] - (2.0 - 1.1) / (n - 1)) < 1e-12


def test_decode_timing_unresolved_is_an_error_not_a_negative_step(monkeypatch):
  cfg, params = _tiny()
  rounds = 1 + bench_rollout.MAX_EXTRA_ROUNDS
  _fake_clock(monkeypatch, [9.0, 8.0] + [1.0, 1.5] * rounds)
  with pytest.raises(RuntimeError, match="not resolved above timer noise"):
    bench_rollout._decode_timing(cfg, params, 1, 4, 5, rounds=1)
