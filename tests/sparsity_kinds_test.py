"""Update sparsity per layer kind and over seen / never-seen embedding rows,
against a brute-force count written here: every entry compared one float32
scalar at a time (|b - a| < float32(tau), strict), each parameter's kind
taken from a table of names written out by hand for the Llama and Qwen2
trees and their Hugging Face tensors, and the seen rows from a hand-made
mask. The trees are the models' own (models.init) with known perturbations
per kind; the checkpoints are what models.save_pretrained writes.
"""
import json
import os
import re

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from jaxdistill import models
from jaxdistill import sparsity
from jaxdistill.evaluate import report as eval_report
from jaxdistill.sweep import table
from jaxdistill.train import seen as seen_lib

TAUS = (1e-6, 1e-8)
V, D = 40, 8

# Every leaf of the tiny trees, by hand: (tree path, kind).
TREE_KINDS = {
    "embed_tokens/embedding": "embeddings",
    "lm_head/kernel": "embeddings",
    "norm/scale": "norms",
    "layers/input_layernorm/scale": "norms",
    "layers/post_attention_layernorm/scale": "norms",
    "layers/self_attn/q_proj/kernel": "attention",
    "layers/self_attn/k_proj/kernel": "attention",
    "layers/self_attn/v_proj/kernel": "attention",
    "layers/self_attn/o_proj/kernel": "attention",
    "layers/self_attn/q_proj/bias": "attention",
    "layers/self_attn/k_proj/bias": "attention",
    "layers/self_attn/v_proj/bias": "attention",
    "layers/mlp/gate_proj/kernel": "mlp",
    "layers/mlp/up_proj/kernel": "mlp",
    "layers/mlp/down_proj/kernel": "mlp",
}
# The same by Hugging Face tensor name (layer index removed).
HF_KINDS = {
    "model.embed_tokens.weight": "embeddings", "lm_head.weight": "embeddings",
    "model.norm.weight": "norms",
    "model.layers.input_layernorm.weight": "norms",
    "model.layers.post_attention_layernorm.weight": "norms",
    **{f"model.layers.self_attn.{p}_proj.{w}": "attention"
       for p in "qkvo" for w in ("weight", "bias")},
    **{f"model.layers.mlp.{p}_proj.weight": "mlp"
       for p in ("gate", "up", "down")},
}
# Share of entries each kind moves by a lot; the rest sit near the taus.
MOVED = {"attention": 0.3, "mlp": 0.6, "norms": 0.1, "embeddings": 0.5}


def brute(pairs, tau):
  """(hits, entries): one float32 scalar at a time, strict <."""
  t = np.float32(tau)
  hits = n = 0
  for a, b in pairs:
    for x, y in zip(np.asarray(a, np.float32).ravel().tolist(),
                    np.asarray(b, np.float32).ravel().tolist()):
      hits += int(abs(np.float32(y) - np.float32(x)) < t)
      n += 1
  return hits, n


def tiny_cfg(family, tied):
  return models.ModelConfig(
      family=family, vocab_size=V, hidden_size=D, intermediate_size=16,
      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
      head_dim=4, tie_word_embeddings=tied, attention_bias=family == "qwen2",
      max_position_embeddings=64)


def move(rng, a, share):
  """a moved: `share` of entries by ~1e-3, the rest by 0, 5e-9, 5e-7 or 2e-6
  (either side of each tau), signs random."""
  small = rng.choice(np.float32([0, 5e-9, 5e-7, 2e-6]), a.shape)
  d = np.where(rng.random(a.shape) < share, np.float32(1e-3), small)
  return (a + d * rng.choice(np.float32([-1, 1]), a.shape)).astype(a.dtype)


def perturbed(family, tied, seed=0):
  """(cfg, params0, params1, seen): each kind moved by MOVED's share; the
  embedding's never-seen rows unchanged in the input embedding, moved in an
  untied head (as a softmax gradient does), a tied one moved at unseen rows
  too."""
  rng = np.random.default_rng(seed)
  cfg = tiny_cfg(family, tied)
  p0 = jax.tree.map(np.asarray, models.init(cfg, jax.random.key(seed)))
  p0 = jax.tree.map(lambda x: (x + rng.normal(0, 0.02, x.shape)).astype(
      np.float32), p0)  # no exact zeros / ones
  seen = np.zeros(V, bool)
  seen[rng.choice(V, 13, replace=False)] = True
  flat = {"/".join(str(k.key) for k in path): x for path, x in
          jax.tree_util.tree_flatten_with_path(p0)[0]}
  assert set(flat) <= set(TREE_KINDS)
  out = {}
  for name, a in flat.items():
    b = move(rng, a, MOVED[TREE_KINDS[name]])
    if name == "embed_tokens/embedding" and not tied:
      b[~seen] = a[~seen]
    out[name] = b
  p1 = jax.tree.map(lambda x: x, p0)
  for name, b in out.items():
    node = p1
    *parents, leaf = name.split("/")
    for k in parents:
      node = node[k]
    node[leaf] = b
  return cfg, p0, p1, seen


def reference(pairs_by_kind, tau):
  return {k: brute(v, tau) for k, v in pairs_by_kind.items()}


def tree_pairs(p0, p1, seen):
  """kind -> [(a, b)], plus embeddings_seen / _unseen by vocabulary row
  (lm_head's kernel is [D, V]: its columns)."""
  f0 = {"/".join(str(k.key) for k in p): x
        for p, x in jax.tree_util.tree_flatten_with_path(p0)[0]}
  f1 = {"/".join(str(k.key) for k in p): x
        for p, x in jax.tree_util.tree_flatten_with_path(p1)[0]}
  out = {}
  for name in f0:
    a, b = f0[name], f1[name]
    kind = TREE_KINDS[name]
    out.setdefault(kind, []).append((a, b))
    if kind == "embeddings":
      if name == "lm_head/kernel":
        a, b = a.T, b.T
      out.setdefault("embeddings_seen", []).append((a[seen], b[seen]))
      out.setdefault("embeddings_unseen", []).append((a[~seen], b[~seen]))
  return out


def _check_kinds(got, pairs):
  """Each kind's count and S_tau equal the brute-force count of its pairs."""
  assert set(got["per_kind"]) == set(pairs)
  for tau in TAUS:
    col = f"S_{sparsity.number_name(tau)}_f32"
    for kind, (h, n) in reference(pairs, tau).items():
      assert got["per_kind"][kind]["num_params"] == n, kind
      assert got["per_kind"][kind][col] == h / n, (kind, tau)


@pytest.mark.parametrize("family, tied", [("llama", False), ("qwen2", True),
                                          ("llama", True), ("qwen2", False)])
def test_kinds_and_seen_rows_in_memory_equal_brute_force(family, tied):
  cfg, p0, p1, seen = perturbed(family, tied)
  got = sparsity.update_sparsity(p0, p1, seen=seen)
  pairs = tree_pairs(p0, p1, seen)
  _check_kinds(got, pairs)
  # Whole model: every parameter once (the parts do not add to it).
  h, n = brute([p for k, v in pairs.items() if "_" not in k for p in v], 1e-6)
  assert got["num_params"] == n == models.num_params(p0)
  assert got["S_1e-6_f32"] == h / n
  assert got["per_kind"]["embeddings_seen"]["num_rows"] == 13
  assert got["per_kind"]["embeddings_unseen"]["num_rows"] == V - 13
  # The perturbations make the kinds differ (a count mixing them fails).
  s = {k: got["per_kind"][k]["S_1e-6_f32"] for k in MOVED}
  assert s["norms"] > s["attention"] > s["mlp"], s
  if not tied:  # the input embedding's unseen rows never moved
    unseen = got["per_group"]["embed_tokens/embedding/unseen"]
    assert unseen["S_1e-8_f32"] == 1.0
    assert got["per_group"]["lm_head/kernel/unseen"]["S_1e-6_f32"] < 0.8
  else:
    assert "lm_head/kernel" not in got["per_group"]
  if family == "qwen2":  # the qkv biases are attention
    assert "layers/self_attn/q_proj/bias" in got["per_group"]
  m = sparsity.metrics_from_params(p0, p1, seen)
  assert m["sparsity/embeddings_unseen/S_1e-6_f32"] == (
      got["per_kind"]["embeddings_unseen"]["S_1e-6_f32"])
  assert m["sparsity/embeddings_seen/num_rows"] == 13
  assert m["sparsity/attention/S_1e-8_f32"] == got["per_kind"]["attention"][
      "S_1e-8_f32"]
  # Without a mask: the kinds, no split.
  bare = sparsity.metrics_from_params(p0, p1)
  assert "sparsity/mlp/S_1e-6_f32" in bare
  assert not any("seen" in k for k in bare)


def hf_pairs(p0_dir, p1_dir, seen, tied):
  """kind -> [(a, b)] from the safetensors files, read by safetensors."""
  t0 = load_file(os.path.join(p0_dir, "model.safetensors"))
  t1 = load_file(os.path.join(p1_dir, "model.safetensors"))
  out = {}
  for name in sorted(t0):
    if tied and name == "lm_head.weight":
      continue
    a, b = t0[name], t1[name]
    kind = HF_KINDS[re.sub(r"\.layers\.\d+\.", ".layers.", name)]
    out.setdefault(kind, []).append((a, b))
    if kind == "embeddings":  # HF rows are the vocabulary
      out.setdefault("embeddings_seen", []).append((a[seen], b[seen]))
      out.setdefault("embeddings_unseen", []).append((a[~seen], b[~seen]))
  return out


@pytest.mark.parametrize("family, tied", [("llama", False), ("qwen2", True)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kinds_and_seen_rows_of_checkpoints_equal_brute_force(
    tmp_path, family, tied, dtype):
  """HF names from the files models.save_pretrained writes, bf16 or f32,
  read a few rows at a time; the tied head once; in memory the same."""
  cfg, p0, p1, seen = perturbed(family, tied, seed=1)
  cast = lambda t: jax.tree.map(lambda x: x.astype(dtype), t)
  d0, d1 = str(tmp_path / "before"), str(tmp_path / "after")
  models.save_pretrained(cfg, cast(p0), d0)
  models.save_pretrained(cfg, cast(p1), d1)
  seen_lib.write_seen(d1, seen)
  got = sparsity.update_sparsity_from_checkpoints(
      d0, d1, chunk_bytes=100, seen=seen_lib.read_seen(d1))
  pairs = hf_pairs(d0, d1, seen, tied)
  _check_kinds(got, pairs)
  mem = sparsity.update_sparsity(cast(p0), cast(p1), seen=seen)
  assert mem["per_kind"] == got["per_kind"]
  m = sparsity.metrics_from_result(got)
  assert m["sparsity/embeddings_unseen/num_rows"] == V - 13
  if not tied:
    assert m["sparsity/embed_tokens/unseen/S_1e-8_f32"] == 1.0
    assert m["sparsity/lm_head/unseen/S_1e-6_f32"] < 0.8
  # The evaluation's text report lists the kinds, the rows' token ids too.
  text = eval_report.format_report({
      "checkpoint": d1, "metrics": m, "suites": {},
      "sparsity": {"columns": got["columns"], "kinds": list(got["per_kind"]),
                   "stored_dtype": got["stored_dtype"]}})
  assert re.search(rf"\| embeddings_unseen \({V - 13} token ids\) +\|", text)
  assert re.search(r"\| attention +\|", text)


def test_layer_kind_names():
  for name, kind in {**TREE_KINDS, **HF_KINDS}.items():
    assert sparsity.layer_kind(name) == kind, name
  assert sparsity.layer_kind("model.layers.3.self_attn.q_norm.weight") == "norms"
  assert sparsity.layer_kind("w") == "other"
  # The sweep's table spells the kinds without importing jax.
  assert table.KINDS == tuple(k for k in sparsity.KINDS if k != "other")


def test_seen_mask_files_and_errors(tmp_path):
  seen = np.zeros(7, bool)
  seen[[0, 3, 6]] = True
  assert seen_lib.read_seen(str(tmp_path)) is None
  seen_lib.write_seen(str(tmp_path), seen)
  with open(tmp_path / seen_lib.SEEN_FILE) as f:
    assert json.load(f)["ids"] == [0, 3, 6]
  np.testing.assert_array_equal(seen_lib.read_seen(str(tmp_path)), seen)
  p = {"embed_tokens": {"embedding": np.zeros((5, 2), np.float32)}}
  with pytest.raises(ValueError, match="5 vocabulary rows, but the seen mask "
                     "has 7"):
    sparsity.update_sparsity(p, p, seen=seen)
  with pytest.raises(ValueError, match="1-D boolean"):
    sparsity.update_sparsity(p, p, seen=np.zeros((5, 1), bool))
  with pytest.raises(ValueError, match=r"outside \[0, 4\)"):
    seen_lib.seen_from_json({"vocab_size": 4, "ids": [4]})
  (tmp_path / seen_lib.SEEN_FILE).write_text("{")
  with pytest.raises(ValueError, match="not valid JSON"):
    seen_lib.read_seen(str(tmp_path))


def test_table_rows_carry_the_kinds():
  ev = {"sparsity/attention/S_1e-6_f32": 0.25,
        "sparsity/embeddings_unseen/S_1e-8_f32": 0.5,
        "sparsity/embeddings_unseen/num_rows": 27.0}
  row = table.row_of({"name": "lr=1e-05,seed=0", "dirname": "x",
                      "factors": {"lr": 1e-5, "seed": 0}, "study": {},
                      "eval": ev, "train": {}})
  assert row["sparsity_attention_S_1e-6_f32"] == 0.25
  assert row["sparsity_embeddings_unseen_S_1e-8_f32"] == 0.5
  assert row["sparsity_embeddings_unseen_rows"] == 27.0
  assert row["sparsity_mlp_S_1e-6_f32"] is None


def test_results_table_has_the_kind_columns(tmp_path):
  """results.md: kinds in %, the token-id counts as numbers, per arm over
  seeds."""
  def result(seed, unseen):
    return {"name": f"lr=1e-05,seed={seed}", "dirname": "x",
            "factors": {"lr": 1e-5, "seed": seed}, "study": {"seed": seed},
            "eval": {"sparsity/S_1e-6_f32": 0.5,
                     "sparsity/embeddings_unseen/S_1e-6_f32": unseen,
                     "sparsity/embeddings_unseen/num_rows": 27.0},
            "train": {}}
  rows = [table.row_of(result(0, 1.0)), table.row_of(result(1, 0.5))]
  _, md = table.write_table(rows, str(tmp_path))
  text = open(md).read()
  def cells_of(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]
  head = cells_of(text.splitlines()[0])
  i = head.index("sparsity_embeddings_unseen_S_1e-6_f32")
  j = head.index("sparsity_embeddings_unseen_rows")
  cells = cells_of(text.splitlines()[2])
  assert cells[i] == "75.0 ± 35.4 % (n=2)"
  assert cells[j] == "27"
  assert "sparsity_attention_S_1e-6_f32" not in head  # no arm has it
