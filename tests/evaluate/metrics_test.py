"""Metrics against brute force and NumPy counts."""
from fractions import Fraction
import itertools
import json
import math
import warnings

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as Pspec
import ml_collections
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from jaxdistill import models
from jaxdistill import sparsity
from jaxdistill.evaluate import metrics
from jaxdistill.evaluate import report
from jaxdistill.sharding import make_mesh
from jaxdistill.tasks import countdown


def brute_pass_at_k(n, c, k):
  """Fraction of k-subsets of n samples (c of them correct) with a correct one."""
  samples = [True] * c + [False] * (n - c)
  subsets = list(itertools.combinations(range(n), k))
  return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_equals_subset_enumeration():
  for n in range(1, 9):
    for c in range(n + 1):
      for k in range(1, n + 1):
        assert metrics.pass_at_k(n, c, k) == pytest.approx(
            brute_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_is_stable_for_large_n():
  for n, c, k in [(2000, 10, 16), (5000, 1, 1), (1200, 600, 4)]:
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert metrics.pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)


def test_mean_pass_at_k():
  rng = np.random.default_rng(0)
  correct = rng.random((7, 16)) < 0.3
  out = metrics.mean_pass_at_k(correct, ks=(1, 4, 16))
  for k in (1, 4, 16):
    want = np.mean([float(1 - Fraction(math.comb(16 - int(r.sum()), k),
                                       math.comb(16, k))) for r in correct])
    assert out[f"pass@{k}"] == pytest.approx(want, abs=1e-12)
  assert out["pass@1"] == pytest.approx(correct.mean())
  with pytest.raises(ValueError, match="k=32"):
    metrics.mean_pass_at_k(correct, ks=(32,))
  with pytest.raises(ValueError):
    metrics.pass_at_k(4, 5, 1)


def test_distinct_correct_and_accuracy():
  a = "<answer>{}</answer>"
  answers = [[a.format("3+4*5"), a.format("5*4+3"), a.format("(3+4)*5"),
              a.format("4*5+3"), a.format("3*5+4")],
             [a.format("1+1"), "junk", a.format("2")]]
  correct = [[True, True, True, True, False], [False, False, False]]
  got = metrics.distinct_correct(answers, correct,
                                 normalize=countdown.normalize_answer)
  np.testing.assert_array_equal(got, [2, 0])  # 3+4*5 three ways, and (3+4)*5.
  plain = metrics.distinct_correct([["A", " a ", "B"]], [[True, True, True]])
  np.testing.assert_array_equal(plain, [2])
  assert metrics.accuracy([[1, 0], [1, 1]]) == 0.75
  with pytest.raises(ValueError):
    metrics.distinct_correct([["a"]], [[True, False]])


def test_forgetting():
  out = metrics.forgetting({"mmlu": 0.60, "gsm8k": 0.50},
                           {"mmlu": 0.55, "gsm8k": 0.52})
  assert out["per_suite"] == pytest.approx({"mmlu": 5.0, "gsm8k": -2.0})
  assert out["mean"] == pytest.approx(1.5)
  with pytest.raises(ValueError, match="same"):
    metrics.forgetting({"a": 0.5}, {"b": 0.5})
  with pytest.raises(ValueError, match="fraction"):
    metrics.forgetting({"a": 50.0}, {"a": 0.5})


# ---------------------------------------------------------------- sparsity


def perturb(rng, x, dtype):
  """x plus a mix of no change, sub-atol and large changes, in `dtype`."""
  kind = rng.integers(0, 3, x.shape)
  delta = np.where(kind == 0, 0.0,
                   np.where(kind == 1, rng.uniform(-8e-6, 8e-6, x.shape),
                            rng.normal(0, 1e-2, x.shape)))
  return (x.astype(np.float64) + delta).astype(dtype)


def ref_counts(a, b, dtype, atol=1e-5):
  """(entries, |diff| <= atol, exact) in float64 after NumPy rounding to dtype."""
  a64 = np.asarray(a).astype(dtype).astype(np.float64)
  b64 = np.asarray(b).astype(dtype).astype(np.float64)
  return a64.size, int((np.abs(a64 - b64) <= atol).sum()), int((a64 == b64).sum())


def make_params(rng, dtype, n_layers=3, tied=True):
  def w(*shape):
    return rng.normal(0, 0.02, shape).astype(dtype)
  p = {"embed_tokens": {"embedding": w(50, 8)},
       "norm": {"scale": np.ones(8, dtype)},
       "layers": {"self_attn": {"q_proj": {"kernel": w(n_layers, 8, 4, 2),
                                           "bias": w(n_layers, 4, 2)}},
                  "mlp": {"up_proj": {"kernel": w(n_layers, 8, 16)}},
                  "input_layernorm": {"scale": np.ones((n_layers, 8), dtype)}}}
  if not tied:
    p["lm_head"] = {"kernel": w(8, 50)}
  return p


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float32])
def test_update_sparsity_equals_numpy_count(dtype):
  rng = np.random.default_rng(0)
  p0 = make_params(rng, dtype, tied=False)
  p1 = jax.tree.map(lambda x: perturb(rng, x, dtype), p0)
  out = sparsity.update_sparsity(p0, p1)
  assert out["dtype"] == np.dtype(dtype).name
  total = close = exact = 0
  layer = np.zeros((3, 3), np.int64)
  for path, a in jax.tree_util.tree_flatten_with_path(p0)[0]:
    b = p1
    for k in path:
      b = b[k.key]
    n, c, e = ref_counts(a, b, dtype)
    total, close, exact = total + n, close + c, exact + e
    if path[0].key == "layers":
      for i in range(3):
        layer[i] += ref_counts(a[i], b[i], dtype)
  assert out["num_params"] == total
  assert out["sparsity"] == close / total and out["exact_sparsity"] == exact / total
  assert 0.2 < out["sparsity"] < 0.9  # The test data exercises both sides.
  assert out["exact_sparsity"] < out["sparsity"]
  for i in range(3):
    got = out["per_layer"][i]
    assert (got["num_params"], got["sparsity"], got["exact_sparsity"]) == (
        layer[i, 0], layer[i, 1] / layer[i, 0], layer[i, 2] / layer[i, 0])
  n, c, e = ref_counts(p0["lm_head"]["kernel"], p1["lm_head"]["kernel"], dtype)
  assert out["per_group"]["lm_head/kernel"]["sparsity"] == c / n
  assert out["per_group"]["layers/mlp/up_proj/kernel"]["num_params"] == 3 * 8 * 16


def test_update_sparsity_casts_to_storage_dtype_and_ties():
  rng = np.random.default_rng(1)
  p0 = make_params(rng, np.float32, tied=False)
  p1 = jax.tree.map(lambda x: perturb(rng, x, np.float32), p0)
  out = sparsity.update_sparsity(p0, p1, dtype=jnp.bfloat16, tied=True)
  assert out["dtype"] == "bfloat16" and "lm_head/kernel" not in out["per_group"]
  total = close = exact = 0
  for name, a, b in _leaves(p0, p1):
    if name.startswith("lm_head"):
      continue
    n, c, e = ref_counts(a, b, ml_dtypes.bfloat16)
    total, close, exact = total + n, close + c, exact + e
  assert (out["num_params"], out["sparsity"], out["exact_sparsity"]) == (
      total, close / total, exact / total)
  # Rounding to bf16 merges nearby float32 values, so more entries are equal
  # (a sub-atol change can also cross a bf16 rounding boundary and grow to a
  # full bf16 ulp, so the atol figure may move either way).
  f32 = sparsity.update_sparsity(p0, p1, tied=True)
  assert f32["dtype"] == "float32"
  assert out["exact_sparsity"] > f32["exact_sparsity"]


def _leaves(p0, p1):
  for (path, a), (_, b) in zip(jax.tree_util.tree_flatten_with_path(p0)[0],
                               jax.tree_util.tree_flatten_with_path(p1)[0]):
    yield "/".join(k.key for k in path), a, b


def test_update_sparsity_unstacked_layers_and_sharded_leaves():
  rng = np.random.default_rng(2)
  mesh = make_mesh({"fsdp": 8})
  shard = NamedSharding(mesh, Pspec(None, "fsdp"))
  p0 = {f"layers_{i}": {"w": rng.normal(size=(4, 16)).astype(np.float32)}
        for i in range(2)}
  p0["embed"] = rng.normal(size=(3, 16)).astype(np.float32)
  p1 = jax.tree.map(lambda x: perturb(rng, x, np.float32), p0)
  out = sparsity.update_sparsity(jax.device_put(p0, shard), jax.device_put(p1, shard))
  for i in range(2):
    n, c, e = ref_counts(p0[f"layers_{i}"]["w"], p1[f"layers_{i}"]["w"], np.float32)
    assert out["per_layer"][i] == {"num_params": n, "sparsity": c / n,
                                   "exact_sparsity": e / n}
  assert set(out["per_group"]) == {"layers/w", "embed"}
  # A zero-change update is fully sparse; mismatched trees are rejected.
  assert sparsity.update_sparsity(p0, p0)["exact_sparsity"] == 1.0
  with pytest.raises(ValueError, match="structure"):
    sparsity.update_sparsity(p0, {"x": p0["embed"]})
  with pytest.raises(ValueError, match="shape"):
    bad = dict(p1, embed=np.zeros((3, 15), np.float32))
    sparsity.update_sparsity(p0, bad)


def _write_hf(path, tensors, *, tied, shards=1):
  """A HF-style directory written by safetensors itself (optionally sharded)."""
  path.mkdir()
  (path / "config.json").write_text(json.dumps({"tie_word_embeddings": tied}))
  names = sorted(tensors)
  if shards == 1:
    save_file(tensors, str(path / "model.safetensors"))
    return str(path)
  weight_map = {}
  for s in range(shards):
    fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
    part = {n: tensors[n] for n in names[s::shards]}
    save_file(part, str(path / fname))
    weight_map.update({n: fname for n in part})
  (path / "model.safetensors.index.json").write_text(
      json.dumps({"metadata": {}, "weight_map": weight_map}))
  return str(path)


def _hf_pair(rng, before_dtype, after_dtype):
  shapes = {"model.embed_tokens.weight": (50, 8), "model.norm.weight": (8,)}
  for i in range(3):
    shapes[f"model.layers.{i}.mlp.up_proj.weight"] = (16, 8)
    shapes[f"model.layers.{i}.self_attn.q_proj.bias"] = (8,)
  before = {k: rng.normal(0, 0.5, s).astype(before_dtype) for k, s in shapes.items()}
  after = {}
  for k, v in before.items():
    # Per entry: unchanged, moved by 3e-6 (within atol) or by 1e-2 (changed).
    kind = rng.integers(0, 3, v.shape)
    delta = np.choose(kind, [0.0, 3e-6, 1e-2])
    after[k] = (v.astype(np.float64) + delta).astype(after_dtype)
  # A duplicated tied head that must not be counted.
  before["lm_head.weight"] = before["model.embed_tokens.weight"].copy()
  after["lm_head.weight"] = rng.normal(0, 1, (50, 8)).astype(after_dtype)
  return before, after


def _ref_counts(before, after, names, dtype):
  """float64 NumPy fractions (close, exact) after rounding both to `dtype`."""
  n = close = exact = 0
  for k in names:
    a = before[k].astype(dtype).astype(np.float64)
    b = after[k].astype(dtype).astype(np.float64)
    n += a.size
    close += int((np.abs(a - b) <= 1e-5).sum())
    exact += int((a == b).sum())
  return close / n, exact / n, n


@pytest.mark.parametrize("before_dtype, after_dtype, cmp", [
    ("float32", "float32", None),
    ("bfloat16", "float32", None),        # default: the base's stored bf16
    ("bfloat16", "float32", "float32"),   # forced onto the fp32 grid
    ("bfloat16", "bfloat16", None),
])
def test_update_sparsity_from_checkpoints_equals_numpy(tmp_path, before_dtype,
                                                        after_dtype, cmp):
  dt = lambda s: np.dtype(ml_dtypes.bfloat16 if s == "bfloat16" else s)
  rng = np.random.default_rng(0)
  before, after = _hf_pair(rng, dt(before_dtype), dt(after_dtype))
  p0 = _write_hf(tmp_path / "before", before, tied=True, shards=3)
  p1 = _write_hf(tmp_path / "after", after, tied=True)
  # Tiny chunks: blocks of rows must add up like whole tensors.
  got = sparsity.update_sparsity_from_checkpoints(p0, p1, chunk_bytes=100,
                                                 dtype=cmp)
  want_dtype = dt(cmp or before_dtype)  # docs/method.md: the stored base dtype
  names = [k for k in before if k != "lm_head.weight"]
  close, exact, n = _ref_counts(before, after, names, want_dtype)
  assert got["num_params"] == n
  assert got["sparsity"] == pytest.approx(close, abs=1e-12)
  assert got["exact_sparsity"] == pytest.approx(exact, abs=1e-12)
  assert got["dtype"] == want_dtype.name
  assert got["stored_dtype"] == {"before": before_dtype, "after": after_dtype}
  for i in range(3):
    layer = [k for k in names if f".layers.{i}." in k]
    c, e, m = _ref_counts(before, after, layer, want_dtype)
    assert got["per_layer"][i] == {"num_params": m, "sparsity": pytest.approx(c),
                                   "exact_sparsity": pytest.approx(e)}
  g = got["per_group"]["model.layers.mlp.up_proj.weight"]
  assert g["num_params"] == 3 * 16 * 8
  # 3e-6 moves survive in fp32 but round away on the bf16 grid.
  if want_dtype == np.float32:
    assert 0 < exact < close < 1
  else:
    assert 0 < exact == close < 1


def test_update_sparsity_from_checkpoints_errors(tmp_path):
  rng = np.random.default_rng(1)
  before, after = _hf_pair(rng, np.dtype("float32"), np.dtype("float32"))
  p0 = _write_hf(tmp_path / "a", before, tied=False)
  del after["model.norm.weight"]
  p1 = _write_hf(tmp_path / "b", after, tied=False)
  with pytest.raises(ValueError, match=r"only in .*a: \['model.norm.weight'\]"):
    sparsity.update_sparsity_from_checkpoints(p0, p1)
  with pytest.raises(FileNotFoundError, match="nowhere"):
    sparsity.update_sparsity_from_checkpoints(p0, str(tmp_path / "nowhere"))
  # Untied: the head is a real parameter and is compared.
  after["model.norm.weight"] = before["model.norm.weight"]
  p2 = _write_hf(tmp_path / "c", after, tied=False)
  got = sparsity.update_sparsity_from_checkpoints(p0, p2)
  assert got["num_params"] == sum(v.size for v in before.values())


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("side", ["before", "after"])
def test_update_sparsity_from_checkpoints_refuses_non_finite(tmp_path, bad, side):
  rng = np.random.default_rng(4)
  before, after = _hf_pair(rng, np.dtype("float32"), np.dtype("float32"))
  {"before": before, "after": after}[side]["model.layers.1.mlp.up_proj.weight"][
      3, 2] = bad
  p0 = _write_hf(tmp_path / "before", before, tied=True)
  p1 = _write_hf(tmp_path / "after", after, tied=True)
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # no RuntimeWarning on the way
    for dtype in (None, "bfloat16"):
      with pytest.raises(ValueError) as e:
        sparsity.update_sparsity_from_checkpoints(p0, p1, dtype=dtype)
      msg = str(e.value)
      assert "model.layers.1.mlp.up_proj.weight" in msg and "1 non-finite" in msg
      assert str(tmp_path / side) in msg and "\n" not in msg


def test_update_sparsity_refuses_non_finite_and_compares_ieee():
  zeros = np.zeros((2, 3, 4), np.float32)
  p0 = {"layers": {"mlp": {"w": zeros}}, "embed": np.ones((5, 4), np.float32)}
  # -0.0 == 0.0 under IEEE equality: an entry that only flips the sign of a
  # zero counts as unchanged, exactly.
  flipped = {"layers": {"mlp": {"w": -zeros}}, "embed": p0["embed"]}
  for dtype in ("float32", "bfloat16"):
    got = sparsity.update_sparsity(p0, flipped, dtype=dtype)
    assert got["exact_sparsity"] == got["sparsity"] == 1.0
  for where, bad in (("params1", np.inf), ("params0", np.nan)):
    w = zeros.copy()
    w[1, 2, 3] = bad
    a, b = (p0, {"layers": {"mlp": {"w": w}}, "embed": p0["embed"]})
    if where == "params0":
      a, b = b, a
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      with pytest.raises(ValueError,
                         match=rf"^layers/mlp/w: 1 non-finite .* in {where} "):
        sparsity.update_sparsity(a, b, dtype="bfloat16")


def test_checkpoint_dtype_reads_the_stored_dtype(tmp_path):
  rng = np.random.default_rng(2)
  for name in ("bfloat16", "float32"):
    dt = np.dtype(ml_dtypes.bfloat16 if name == "bfloat16" else name)
    before, _ = _hf_pair(rng, dt, dt)
    assert sparsity.checkpoint_dtype(_write_hf(tmp_path / name, before,
                                              tied=True)) == name
  assert sparsity.other_sparsity_dtype("bfloat16") == "float32"
  assert sparsity.other_sparsity_dtype("float32") == "bfloat16"


def test_training_sparsity_defaults_to_the_base_dtype_and_names_both(tmp_path):
  """train_data: the base checkpoint's stored dtype by default, the other dtype
  beside it, both named in the keys (float64 NumPy reference)."""
  rng = np.random.default_rng(3)
  before, _ = _hf_pair(rng, np.dtype(ml_dtypes.bfloat16),
                       np.dtype(ml_dtypes.bfloat16))
  path = _write_hf(tmp_path / "base", before, tied=True)
  cfg = models.ModelConfig(param_dtype="float32")
  mcfg = ml_collections.ConfigDict(dict(path=path, init=None))
  assert sparsity.base_dtype(mcfg, cfg) == "bfloat16"
  mcfg.path = None
  assert sparsity.base_dtype(mcfg, cfg) == "float32"  # from-scratch init
  # float32 master weights trained from a bf16 base: moves of 1e-3 (below a
  # bf16 step for |w| >= 0.5) vanish on the bf16 grid but not in float32.
  w0 = rng.normal(0, 1, (2, 64, 32)).astype(ml_dtypes.bfloat16).astype(np.float32)
  w1 = w0 + np.where(rng.random(w0.shape) < 0.5, 1e-3, 0.0).astype(np.float32)
  p0, p1 = {"layers": {"w": jnp.asarray(w0)}}, {"layers": {"w": jnp.asarray(w1)}}
  out = sparsity.metrics_from_params(p0, p1, cfg, "bfloat16")
  ref = {d: _ref_counts({"w": w0}, {"w": w1}, ["w"], np.dtype(t))
         for d, t in (("bfloat16", ml_dtypes.bfloat16), ("float32", "float32"))}
  for d, (close, exact, _) in ref.items():
    assert out[f"sparsity/whole_{d}"] == pytest.approx(close, abs=1e-12)
    assert out[f"sparsity/whole_exact_{d}"] == pytest.approx(exact, abs=1e-12)
  assert out["sparsity/whole"] == out["sparsity/whole_bfloat16"]
  assert ref["bfloat16"][0] > ref["float32"][0] + 0.1  # the dtypes disagree
  assert {"sparsity/layer_00", "sparsity/layer_01"} <= set(out)


def test_evaluation_report_names_both_dtypes(tmp_path):
  rng = np.random.default_rng(4)
  before, after = _hf_pair(rng, np.dtype(ml_dtypes.bfloat16),
                           np.dtype("float32"))
  p0 = _write_hf(tmp_path / "before", before, tied=True)
  p1 = _write_hf(tmp_path / "after", after, tied=True)
  sp = sparsity.update_sparsity_from_checkpoints(p0, p1)
  other = sparsity.update_sparsity_from_checkpoints(
      p0, p1, dtype=sparsity.other_sparsity_dtype(sp["dtype"]))
  flat = sparsity.metrics_from_result(sp, other)
  names = [k for k in before if k != "lm_head.weight"]
  for d, t in (("bfloat16", ml_dtypes.bfloat16), ("float32", "float32")):
    close, exact, _ = _ref_counts(before, after, names, np.dtype(t))
    assert flat[f"sparsity/whole_{d}"] == pytest.approx(close, abs=1e-12)
    assert flat[f"sparsity/whole_exact_{d}"] == pytest.approx(exact, abs=1e-12)
  text = report.format_report({
      "checkpoint": p1, "metrics": flat,
      "sparsity": {"dtype": sp["dtype"], "other_dtype": other["dtype"],
                   "atol": sp["atol"], "stored_dtype": sp["stored_dtype"]}})
  assert "compared in bfloat16" in text and "exact (bfloat16)" in text
  assert "exact (float32)" in text
