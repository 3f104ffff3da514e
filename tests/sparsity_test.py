"""Update sparsity against a brute-force count written here from the paper's
definition (App. D.4): S_tau = (1/P) sum_i 1[|theta1_i - theta0_i| < tau],
element by element on NumPy float32 scalars, strict <, tied embeddings once;
and the former |delta| <= atol / equal figures from a float64 count after
rounding both to the dtype.

The trees hold entries moved by exactly tau (strict < must leave them out),
by the float32 neighbours just below and above it, unchanged, by a sign flip
of zero, and by large amounts; the test checks with float64 arithmetic that
the data really sits on each side of the boundary.
"""
import builtins
import json
import warnings

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as Pspec
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from jaxdistill import sparsity
from jaxdistill.evaluate import report
from jaxdistill.sharding import make_mesh
from jaxdistill.sweep import table

BF16 = np.dtype(ml_dtypes.bfloat16)
TAUS = (1e-6, 1e-8)


# ------------------------------------------------------------ the references

def brute_s(pairs, tau):
  """(hits, entries): |b - a| < float32(tau), one float32 scalar at a time."""
  t = np.float32(tau)
  hits = n = 0
  for a, b in pairs:
    for x, y in zip(np.asarray(a).ravel().tolist(), np.asarray(b).ravel().tolist()):
      d = np.float32(y) - np.float32(x)  # float32 arithmetic, rounded once
      hits += int(abs(d) < t)
      n += 1
  return hits, n


def former_counts(pairs, dtype, atol=1e-5):
  """(|b - a| <= atol, a == b) after rounding both to `dtype`, in float64."""
  close = equal = 0
  for a, b in pairs:
    a64 = np.asarray(a).astype(dtype).astype(np.float64)
    b64 = np.asarray(b).astype(dtype).astype(np.float64)
    close += int((np.abs(a64 - b64) <= atol).sum())
    equal += int((a64 == b64).sum())
  return close, equal


def reference(pairs, taus=TAUS, atol=1e-5):
  """Every column of update_sparsity's default result, as fractions."""
  n = sum(np.asarray(a).size for a, _ in pairs)
  out = {"num_params": n}
  for t in taus:
    out[f"S_{sparsity.number_name(t)}_f32"] = brute_s(pairs, t)[0] / n
  for dt, short in ((BF16, "bf16"), (np.dtype(np.float32), "f32")):
    close, equal = former_counts(pairs, dt, atol)
    out[f"unchanged_{sparsity.number_name(atol)}_{short}"] = close / n
    out[f"equal_{short}"] = equal / n
  return out


# ------------------------------------------------------------ test data

def boundary_move(rng, shape):
  """(a, b) in float32 where b - a is EXACTLY one of: 0, +-tau, +-tau's float32
  neighbours below / above, for tau in TAUS (a on a coarse grid near 0, so the
  sums are exact), or a large move."""
  kinds = []
  for tau in TAUS:
    t = np.float32(tau)
    kinds += [t, np.nextafter(t, np.float32(0)), np.nextafter(t, np.float32(1))]
  kinds = np.asarray(kinds + [np.float32(0)], np.float32)
  pick = rng.integers(0, len(kinds) + 1, shape)
  d = np.where(pick < len(kinds), kinds[np.minimum(pick, len(kinds) - 1)],
               np.float32(3e-3)) * rng.choice(np.float32([-1, 1]), shape)
  # Multiples of 2^-30 below 4e-9 in magnitude: a + d is exact in float32.
  a = (rng.integers(-4, 5, shape) * 2.0**-30).astype(np.float32)
  return a, (a + d).astype(np.float32)


def random_move(rng, x):
  """x (float32) unchanged, moved by less or more than either tau, or a lot."""
  kind = rng.integers(0, 5, x.shape)
  delta = np.choose(kind, [0.0, rng.uniform(-5e-9, 5e-9, x.shape),
                           rng.uniform(-3e-6, 3e-6, x.shape),
                           rng.uniform(-8e-6, 8e-6, x.shape),
                           rng.normal(0, 1e-2, x.shape)])
  return (x.astype(np.float64) + delta).astype(np.float32)


def make_pair(rng, dtype, tied=True, n_layers=3):
  """Two parameter trees (stacked layers) in `dtype`; half of each leaf's
  entries sit on the tau boundaries, half are weights of scale 0.02."""
  def pair(*shape):
    a, b = boundary_move(rng, shape)
    w = rng.normal(0, 0.02, shape).astype(np.float32)
    half = rng.random(shape) < 0.5
    return (np.where(half, a, w).astype(dtype),
            np.where(half, b, random_move(rng, w)).astype(dtype))
  leaves = {("embed_tokens", "embedding"): pair(50, 8),
            ("norm", "scale"): pair(8),
            ("layers", "self_attn", "q_proj", "kernel"): pair(n_layers, 8, 4, 2),
            ("layers", "mlp", "up_proj", "kernel"): pair(n_layers, 8, 16)}
  if not tied:
    leaves[("lm_head", "kernel")] = pair(8, 50)
  p0, p1 = {}, {}
  for path, (a, b) in leaves.items():
    for tree, v in ((p0, a), (p1, b)):
      node = tree
      for k in path[:-1]:
        node = node.setdefault(k, {})
      node[path[-1]] = v
  return p0, p1, leaves


def check_boundaries(pairs, taus=TAUS):
  """The data exercises strict <: for each tau, some entries moved by exactly
  tau, some by just less and some by just more (exact float64 differences)."""
  for tau in taus:
    t = float(np.float32(tau))
    d = np.concatenate([np.abs(np.asarray(b, np.float64) - np.asarray(a, np.float64)).ravel()
                        for a, b in pairs])
    assert (d == t).sum() >= 5, tau
    assert ((d < t) & (d > 0.9 * t)).sum() >= 5, tau
    assert ((d > t) & (d < 1.1 * t)).sum() >= 5, tau


# ------------------------------------------------------------ the definition

def test_strict_less_than_at_tau_in_float32():
  """Moved by exactly float32(tau): not sparse; by one float32 step less: sparse."""
  for tau in TAUS:
    t = np.float32(tau)
    a = np.asarray([0.0, -0.0, 2.0**-30, -(2.0**-30)], np.float32)
    for d, want in ((t, 0.0), (-t, 0.0), (np.nextafter(t, np.float32(0)), 1.0),
                    (np.nextafter(t, np.float32(1)), 0.0)):
      b = (a + d).astype(np.float32)
      assert np.all(np.abs(b.astype(np.float64) - a) == abs(float(d)))
      got = sparsity.update_sparsity({"w": a}, {"w": b}, taus=(tau,))
      assert got[f"S_{sparsity.number_name(tau)}_f32"] == want, (tau, d)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_update_sparsity_equals_brute_force(dtype):
  """In memory: float32 trees (training's values) and bf16 trees (as from a
  bf16 Orbax checkpoint), compared on their values upcast to float32."""
  rng = np.random.default_rng(0)
  p0, p1, leaves = make_pair(rng, dtype, tied=False)
  pairs = list(leaves.values())
  if dtype == np.float32:
    check_boundaries(pairs)
  out = sparsity.update_sparsity(p0, p1)
  want = reference(pairs)
  assert out["columns"] == list(want)[1:]
  assert {k: out[k] for k in want} == want
  assert out["values_dtype"] == np.dtype(dtype).name
  assert 0.1 < out["S_1e-6_f32"] < 0.9 and out["S_1e-8_f32"] < out["S_1e-6_f32"]
  for i in range(3):  # stacked layers: one figure per index
    layer = [(a[i], b[i]) for path, (a, b) in leaves.items() if path[0] == "layers"]
    got = out["per_layer"][i]
    assert got["num_params"] == sum(a.size for a, _ in layer)
    for t in TAUS:
      h, n = brute_s(layer, t)
      assert got[f"S_{sparsity.number_name(t)}_f32"] == h / n
  h, n = brute_s([leaves[("lm_head", "kernel")]], 1e-6)
  assert out["per_group"]["lm_head/kernel"]["S_1e-6_f32"] == h / n
  assert out["per_group"]["layers/mlp/up_proj/kernel"]["num_params"] == 3 * 8 * 16


def test_bf16_values_compare_as_stored_not_rounded():
  """A bf16 tree's moves are bf16 steps; S_tau sees them upcast. Around 1e-6
  bf16 steps are 2^-27: the bf16 value just below float32(1e-6) is sparse, the
  one just above is not; at a bf16-exact tau (2^-20) the move of exactly tau
  is not."""
  t = np.float32(1e-6)
  below = np.asarray(t).astype(BF16)
  while below.astype(np.float32) >= t:
    below = np.nextafter(below, BF16.type(0))
  above = np.nextafter(below, BF16.type(1))
  assert below.astype(np.float32) < t < above.astype(np.float32)
  z = np.zeros(3, BF16)
  for b, want in ((below, 1.0), (above, 0.0)):
    got = sparsity.update_sparsity({"w": z}, {"w": np.full(3, b, BF16)})
    assert got["S_1e-6_f32"] == want
  a = np.asarray([0.0, 2.0**-20, -(2.0**-19)], BF16)
  b = np.asarray([2.0**-20, 2.0**-19, -(2.0**-20 + 2.0**-19)], BF16)
  assert np.all(np.abs(b.astype(np.float64) - a.astype(np.float64)) == 2.0**-20)
  got = sparsity.update_sparsity({"w": a}, {"w": b}, taus=(2.0**-20,))
  assert got["S_9.53674e-7_f32"] == 0.0
  got = sparsity.update_sparsity({"w": a}, {"w": b}, taus=(2.0**-20 * 1.01,))
  assert got[sparsity.columns((2.0**-20 * 1.01,))[0]] == 1.0


def test_float32_training_moves_are_not_rounded_to_bf16():
  """metrics_from_params (the training loop's): float32 master weights of a
  bf16 base moved by 2e-6, below a bf16 step at |w| ~ 1, are changed for
  S_1e-6_f32 while the former bf16 figure calls them unchanged."""
  rng = np.random.default_rng(3)
  w0 = rng.normal(0, 1, (2, 64, 32)).astype(BF16).astype(np.float32)
  w0 = np.where(np.abs(w0) < 0.25, 0.5, w0).astype(np.float32)
  w1 = (w0 + np.where(rng.random(w0.shape) < 0.5, 2e-6, 0.0)).astype(np.float32)
  out = sparsity.metrics_from_params({"layers": {"w": jnp.asarray(w0)}},
                                     {"layers": {"w": jnp.asarray(w1)}})
  ref = reference([(w0, w1)])
  for c in sparsity.columns():
    assert out[f"sparsity/{c}"] == ref[c], c
  assert out["sparsity/unchanged_1e-5_bf16"] == 1.0
  assert 0.4 < out["sparsity/S_1e-6_f32"] < 0.6
  for i in range(2):
    h, n = brute_s([(w0[i], w1[i])], 1e-6)
    assert out[f"sparsity/layer_{i:02d}/S_1e-6_f32"] == h / n
  assert "sparsity/num_params" not in out  # no detail in training logs


def test_tied_embeddings_count_once_in_memory():
  rng = np.random.default_rng(1)
  p0, p1, leaves = make_pair(rng, np.float32, tied=False)
  out = sparsity.update_sparsity(p0, p1, tied=True)
  pairs = [v for k, v in leaves.items() if k[0] != "lm_head"]
  assert {k: out[k] for k in reference(pairs)} == reference(pairs)
  assert "lm_head/kernel" not in out["per_group"]


def test_unstacked_layers_sharded_leaves_and_tree_errors():
  rng = np.random.default_rng(2)
  mesh = make_mesh({"fsdp": 8})
  shard = NamedSharding(mesh, Pspec(None, "fsdp"))
  p0, p1 = {}, {}
  for i in range(2):
    a, b = boundary_move(rng, (4, 16))
    p0[f"layers_{i}"], p1[f"layers_{i}"] = {"w": a}, {"w": b}
  p0["embed"] = rng.normal(size=(3, 16)).astype(np.float32)
  p1["embed"] = random_move(rng, p0["embed"])
  out = sparsity.update_sparsity(jax.device_put(p0, shard), jax.device_put(p1, shard))
  for i in range(2):
    want = reference([(p0[f"layers_{i}"]["w"], p1[f"layers_{i}"]["w"])])
    assert out["per_layer"][i] == want
  assert set(out["per_group"]) == {"layers/w", "embed"}
  same = sparsity.update_sparsity(p0, p0)
  assert all(same[c] == 1.0 for c in same["columns"])
  with pytest.raises(ValueError, match="structure"):
    sparsity.update_sparsity(p0, {"x": p0["embed"]})
  with pytest.raises(ValueError, match="shape"):
    sparsity.update_sparsity(p0, dict(p1, embed=np.zeros((3, 15), np.float32)))


def test_signed_zero_is_unchanged_and_non_finite_is_refused_by_name():
  zeros = np.zeros((2, 3, 4), np.float32)
  p0 = {"layers": {"mlp": {"w": zeros}}, "embed": np.ones((5, 4), np.float32)}
  flipped = {"layers": {"mlp": {"w": -zeros}}, "embed": p0["embed"]}
  got = sparsity.update_sparsity(p0, flipped)
  assert all(got[c] == 1.0 for c in got["columns"])
  for where, bad in (("params1", np.inf), ("params0", np.nan)):
    w = zeros.copy()
    w[1, 2, 3] = bad
    a, b = p0, {"layers": {"mlp": {"w": w}}, "embed": p0["embed"]}
    if where == "params0":
      a, b = b, a
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      for former in (sparsity.FORMER_DTYPES, ()):
        with pytest.raises(ValueError,
                           match=rf"^layers/mlp/w: 1 non-finite .* in {where} "
                                 r"\(in float32\)"):
          sparsity.update_sparsity(a, b, former=former)
  # Finite in float32, inf once rounded to bf16: named with that dtype.
  big = {"w": np.full(2, np.finfo(np.float32).max, np.float32)}
  with pytest.raises(ValueError, match=r"^w: 2 non-finite .*rounded to bfloat16"):
    sparsity.update_sparsity(big, big)
  assert sparsity.update_sparsity(big, big, former=())["S_1e-6_f32"] == 1.0


# ------------------------------------------------------------ names

def test_column_names_and_arguments():
  assert sparsity.number_name(1e-6) == "1e-6"
  assert sparsity.number_name(1e-8) == "1e-8"
  assert sparsity.number_name(2.5e-7) == "2.5e-7"
  assert sparsity.number_name(1e-5) == "1e-5"
  assert sparsity.columns() == (
      "S_1e-6_f32", "S_1e-8_f32", "unchanged_1e-5_bf16", "equal_bf16",
      "unchanged_1e-5_f32", "equal_f32")
  assert sparsity.s_columns() == ("S_1e-6_f32", "S_1e-8_f32")
  # The sweep's table spells the same columns without importing jax.
  assert set(table.SPARSITY) == {f"sparsity_{c}" for c in sparsity.columns()}
  p = {"w": np.zeros(3, np.float32)}
  for taus in ((), (0.0,), (-1e-6,), (float("nan"),), (float("inf"),),
               (1e-6, 1.0000001e-6), "x"):
    with pytest.raises(ValueError, match="taus"):
      sparsity.update_sparsity(p, p, taus=taus)
  with pytest.raises(ValueError, match="atol"):
    sparsity.update_sparsity(p, p, atol=-1.0)


# ------------------------------------------------------------ checkpoints

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
  """HF tensors before/after: half on the tau boundaries, half weights with
  random moves; a tied lm_head that differs (it must not be counted)."""
  shapes = {"model.embed_tokens.weight": (50, 8), "model.norm.weight": (8,)}
  for i in range(3):
    shapes[f"model.layers.{i}.mlp.up_proj.weight"] = (16, 8)
    shapes[f"model.layers.{i}.self_attn.q_proj.bias"] = (8,)
  before, after = {}, {}
  for k, s in shapes.items():
    a, b = boundary_move(rng, s)
    w = rng.normal(0, 0.5, s).astype(np.float32)
    half = rng.random(s) < 0.5
    before[k] = np.where(half, a, w).astype(before_dtype)
    after[k] = np.where(half, b, random_move(rng, w)).astype(after_dtype)
  before["lm_head.weight"] = before["model.embed_tokens.weight"].copy()
  after["lm_head.weight"] = rng.normal(0, 1, (50, 8)).astype(after_dtype)
  return before, after


@pytest.mark.parametrize("before_dtype, after_dtype", [
    (np.float32, np.float32), (BF16, np.float32), (BF16, BF16)])
def test_checkpoints_equal_brute_force_as_stored(tmp_path, before_dtype,
                                                 after_dtype):
  """Stored values upcast to float32, never rounded to the base's dtype; the
  tied head once; tiny chunks add up like whole tensors."""
  rng = np.random.default_rng(0)
  before, after = _hf_pair(rng, before_dtype, after_dtype)
  p0 = _write_hf(tmp_path / "before", before, tied=True, shards=3)
  p1 = _write_hf(tmp_path / "after", after, tied=True)
  got = sparsity.update_sparsity_from_checkpoints(p0, p1, chunk_bytes=100)
  names = sorted(k for k in before if k != "lm_head.weight")
  pairs = [(before[k], after[k]) for k in names]
  if before_dtype == after_dtype == np.float32:
    check_boundaries(pairs)
  want = reference(pairs)
  assert {k: got[k] for k in want} == want
  assert got["stored_dtype"] == {"before": np.dtype(before_dtype).name,
                                 "after": np.dtype(after_dtype).name}
  for i in range(3):
    layer = [(before[k], after[k]) for k in names if f".layers.{i}." in k]
    for t in TAUS:
      h, n = brute_s(layer, t)
      assert got["per_layer"][i][f"S_{sparsity.number_name(t)}_f32"] == h / n
  assert got["per_group"]["model.layers.mlp.up_proj.weight"]["num_params"] == 3 * 16 * 8
  # The same values in memory give the same figures.
  mem = sparsity.update_sparsity({k: before[k] for k in names},
                                 {k: after[k] for k in names})
  assert {k: mem[k] for k in want} == want
  if after_dtype == np.float32 and before_dtype == BF16:
    # An f32 export of a bf16 base: its small moves count as changes in
    # S_tau, while rounding to bf16 (the former figure) hides them.
    assert want["equal_bf16"] > want["equal_f32"]


def test_checkpoint_mismatches(tmp_path):
  rng = np.random.default_rng(1)
  before, after = _hf_pair(rng, np.float32, np.float32)
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
def test_checkpoints_refuse_non_finite_and_close_their_files(tmp_path, bad, side,
                                                            monkeypatch):
  rng = np.random.default_rng(4)
  before, after = _hf_pair(rng, np.float32, np.float32)
  {"before": before, "after": after}[side]["model.layers.1.mlp.up_proj.weight"][
      3, 2] = bad
  p0 = _write_hf(tmp_path / "before", before, tied=True)
  p1 = _write_hf(tmp_path / "after", after, tied=True)
  opened = []

  def tracking_open(*args, **kwargs):
    f = builtins.open(*args, **kwargs)
    opened.append(f)
    return f

  monkeypatch.setattr(sparsity, "open", tracking_open, raising=False)
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # no RuntimeWarning on the way
    with pytest.raises(ValueError) as e:
      sparsity.update_sparsity_from_checkpoints(p0, p1)
  msg = str(e.value)
  assert "model.layers.1.mlp.up_proj.weight" in msg and "1 non-finite" in msg
  assert str(tmp_path / side) in msg and "\n" not in msg
  assert any(f.name.endswith(".safetensors") for f in opened)
  assert all(f.closed for f in opened)


def test_checkpoint_dtype_reads_the_stored_dtype(tmp_path):
  rng = np.random.default_rng(2)
  for dt in (BF16, np.dtype(np.float32)):
    before, _ = _hf_pair(rng, dt, dt)
    assert sparsity.checkpoint_dtype(
        _write_hf(tmp_path / dt.name, before, tied=True)) == dt.name


def test_metric_keys_and_evaluation_report(tmp_path):
  rng = np.random.default_rng(4)
  before, after = _hf_pair(rng, BF16, np.float32)
  p0 = _write_hf(tmp_path / "before", before, tied=True)
  p1 = _write_hf(tmp_path / "after", after, tied=True)
  sp = sparsity.update_sparsity_from_checkpoints(p0, p1)
  flat = sparsity.metrics_from_result(sp)
  groups = ("embed_tokens", "norm", "layers.mlp.up_proj",
            "layers.self_attn.q_proj.bias")
  kinds = ("attention", "mlp", "norms", "embeddings")
  assert set(flat) == (
      {f"sparsity/{c}" for c in sparsity.columns()} | {"sparsity/num_params"}
      | {f"sparsity/{p}/{c}" for c in sparsity.s_columns()
         for p in [f"layer_{i:02d}" for i in range(3)] + list(groups)
         + list(kinds)}
      | {f"sparsity/{k}/num_params" for k in kinds})
  names = [k for k in before if k != "lm_head.weight"]
  want = reference([(before[k], after[k]) for k in names])
  assert flat["sparsity/S_1e-6_f32"] == want["S_1e-6_f32"]
  assert flat["sparsity/unchanged_1e-5_bf16"] == want["unchanged_1e-5_bf16"]
  text = report.format_report({
      "checkpoint": p1, "metrics": flat,
      "sparsity": {k: sp[k] for k in ("taus", "atol", "former_dtypes",
                                      "columns", "stored_dtype")}})
  assert "| part        | S_1e-6_f32 | S_1e-8_f32 |" in text
  assert f"| whole model | {100 * want['S_1e-6_f32']:.1f} %" in text
  assert "| layer_02 " in text
  assert "unchanged_1e-5_bf16 | equal_bf16" in text
