"""bench.train's MFU: the step's model FLOPs against counts made apart from
the code (by hand, and on the step's own jaxpr), and the reference rate it
divides by, sampled beside the timed steps. No timing is asserted."""
import json

import jax

from jaxdistill import compile_only
from jaxdistill.bench import presets
from jaxdistill.bench import train as bench_train


def test_default_step_flops_by_hand_and_on_its_jaxpr():
  s, t, b, l = bench_train._configs(quick=False)  # pylint: disable=protected-access
  assert (b, l, s.vocab_size, t.vocab_size) == (8, 256, 32000, 32000)
  # Matmul weights. Student: 4 layers of q and o (256 x 8*32 each), k and v
  # (256 x 4*32 each), gate, up and down (256 x 768 each); the untied head
  # 256 x 32000. Teacher: 512 wide, 8 heads of 64 (4 kv heads), MLP 1536.
  n_s = 4 * (2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 768) + 256 * 32000
  n_t = 4 * (2 * 512 * 512 + 2 * 512 * 256 + 3 * 512 * 1536) + 512 * 32000
  assert (n_s, n_t) == (11_337_728, 28_966_912)
  tokens = b * l
  # QK^T and PV over all T x T scores: 4 L T^2 (H d) per sequence, forward.
  attn_s = b * 4 * 4 * l * l * (8 * 32)
  attn_t = b * 4 * 4 * l * l * (8 * 64)
  # Student forward + backward (3x), teacher forward (1x).
  want = 3 * (2 * n_s * tokens + attn_s) + (2 * n_t * tokens + attn_t)
  assert want == 268_703_891_456
  assert bench_train.step_flops(s, t, b, l) == want
  # The jitted step itself has exactly these products: every dot_general of
  # its jaxpr (teacher forward, student forward and backward; the loss and
  # AdamW have none), counted by compile_only, not by models.flops.
  update, state, tp, batch = bench_train.jax_step(s, t, b, l, fused=False)
  assert compile_only.jaxpr_flops(jax.make_jaxpr(update)(state, tp, batch)) == want


def test_mfu_divides_by_the_rate_sampled_beside_the_steps(monkeypatch, capsys):
  # The reference as a busy host gives it: the first sample (taken while
  # another process held a core) at a quarter of the others. Measured once,
  # before the steps, that sample alone made MFU read 1.137.
  full = 100e9
  samples = iter([full / 4] + [full] * 10)
  calls = []

  def rate(dtype="float32", n=None, reps=5):
    del n, reps
    calls.append(dtype)
    return next(samples)
  monkeypatch.setattr(presets, "matmul_rate", rate)
  bench_train.main(["--preset", "tiny", "--iters", "3", "--no-torch"])
  out = json.loads(capsys.readouterr().out)
  assert calls == ["float32"] * 3  # one sample per timed round
  assert out["matmul_flops_per_s_samples"] == [full / 4, full, full]
  assert out["matmul_flops_per_s"] == full  # their median
  j = out["jax"]
  assert len(j["step_times_s"]) == 3
  assert abs(j["mfu"] - out["model_flops_per_step"] / j["step_s"] / full) < 1e-12
