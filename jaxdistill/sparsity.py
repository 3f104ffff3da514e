"""Update sparsity: the share of parameters an update leaves unchanged, in
memory (update_sparsity on two param trees, per layer, sharded or not) or
between two Hugging Face checkpoints on disk (update_sparsity_from_checkpoints,
one tensor at a time); and their flat sparsity/* metrics
(metrics_from_result; the training loop's: metrics_from_params).
Definitions: docs/method.md.

The figure reported is the paper's S_tau (App. D.4):

  S_tau = (1/P) * sum_i 1[|theta1_i - theta0_i| < tau],  tau in TAUS

STRICT less-than, over all P parameters of the model (tied embeddings once),
computed in float32: both values are widened to float32 exactly as they are
(the float32 values training produced, or a checkpoint's stored values, e.g.
bfloat16, upcast), their difference is taken in float32 and compared with
float32(tau), as `(a.float() - b.float()).abs() < tau` does in PyTorch.
Its column is named `S_{tau}_f32` (`S_1e-6_f32`).

Beside the whole model, S_tau is reported per layer kind (layer_kind:
attention, MLP, norms, embeddings) and, given the set of token ids training
processed (jaxdistill.train.seen: the training loop writes it beside its
export), over
the embedding rows of seen tokens and of never-seen ones apart.

The project's former figures stay under names of their own, whole model only:
`unchanged_{atol}_{dt}` counts |theta1 - theta0| <= atol after both are
ROUNDED to dt (bf16 or f32; atol 1e-5), `equal_{dt}` counts theta1 == theta0
after that rounding under IEEE equality (-0.0 equals 0.0; not a comparison of
bit patterns). All are defined for finite weights only: an inf or nan in either
tree or checkpoint (in float32, or after rounding to dt) is a ValueError
naming the parameter, since IEEE arithmetic would count it as changed
(nan != nan, inf - inf = nan) and report a sparsity that means nothing.
"""
from __future__ import annotations

from collections.abc import Sequence
import functools
import json
import math
import os
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import sharding
from jaxdistill.models import checkpoint as ckpt_lib
from jaxdistill.models import safetensors_io as st

TAUS = (1e-6, 1e-8)  # App. D.4 (main results) and App. A.6 (ablation)
ATOL = 1e-5  # the former figure's tolerance
FORMER_DTYPES = ("bfloat16", "float32")

_SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16",
          "float64": "f64"}


def number_name(x: float) -> str:
  """1e-06 -> '1e-6', 2.5e-07 -> '2.5e-7': the tau / atol part of a column."""
  mant, _, exp = f"{float(x):g}".partition("e")
  return f"{mant}e{int(exp)}" if exp else mant


def dtype_name(dtype) -> str:
  """'bfloat16' -> 'bf16', 'float32' -> 'f32': the dtype part of a column."""
  name = jnp.dtype(dtype).name
  return _SHORT.get(name, name)


def check_taus(taus, where: str = "taus") -> tuple[float, ...]:
  """The taus as floats; ValueError unless a non-empty sequence of finite
  taus > 0 with distinct column names."""
  try:
    out = tuple(float(t) for t in taus)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{where}: expected a sequence of numbers, got {taus!r}") from e
  if not out or not all(math.isfinite(t) and t > 0 for t in out):
    raise ValueError(f"{where}: expected one or more finite taus > 0, got {taus!r}")
  if len({number_name(t) for t in out}) != len(out):
    raise ValueError(f"{where}: two taus share a column name: {taus!r}")
  return out


def columns(taus=TAUS, atol=ATOL, former=FORMER_DTYPES) -> tuple[str, ...]:
  """The names of the figures update_sparsity reports, in order: S_{tau}_f32
  for each tau, then unchanged_{atol}_{dt} and equal_{dt} for each dt."""
  return (tuple(f"S_{number_name(t)}_f32" for t in taus)
          + tuple(c for d in former for c in
                  (f"unchanged_{number_name(atol)}_{dtype_name(d)}",
                   f"equal_{dtype_name(d)}")))


def s_columns(taus=TAUS) -> tuple[str, ...]:
  """The paper's figures among columns(): S_{tau}_f32, one per tau."""
  return columns(taus, former=())


def _check_args(taus, atol, former):
  taus = check_taus(taus)
  if not atol >= 0:
    raise ValueError(f"atol must be >= 0, got {atol}")
  former = tuple(jnp.dtype(d).name for d in former)
  if any(not jnp.issubdtype(d, jnp.floating) for d in former):
    raise ValueError(f"former dtypes must be floating, got {former}")
  return taus, float(atol), former

# ------------------------------------------------------------ update sparsity

_LAYER_KEY = re.compile(r"^(?:layers?|blocks?|h)[._]?(\d+)$")


def _key_str(k) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def _layer_info(path: Sequence[str], layer_key: str):
  """(stacked, layer index or None, group name without the layer part)."""
  for i, k in enumerate(path):
    if k == layer_key:
      if i + 1 < len(path) and path[i + 1].isdigit():  # A list of layers.
        return False, int(path[i + 1]), "/".join(path[:i + 1] + path[i + 2:])
      return True, None, "/".join(path)
    m = _LAYER_KEY.match(k)
    if m:
      return False, int(m.group(1)), "/".join(path[:i] + (layer_key,) + path[i + 1:])
  return False, None, "/".join(path)


# ------------------------------------------------------------ layer kinds

EMBEDDINGS = "embeddings"
# Per-kind figures, in report order; the seen / unseen parts split the
# embedding rows by whether training ever processed the row's token.
KINDS = ("attention", "mlp", "norms", EMBEDDINGS, f"{EMBEDDINGS}_seen",
         f"{EMBEDDINGS}_unseen", "other")
_KIND_KEYS = (("attention", ("self_attn", "q_proj", "k_proj", "v_proj",
                             "o_proj")),
              ("mlp", ("mlp", "gate_proj", "up_proj", "down_proj")),
              (EMBEDDINGS, ("embed_tokens", "lm_head")))


def layer_kind(name: str) -> str:
  """The kind of a parameter from its name, a tree path
  ('layers/self_attn/q_proj/bias') or a Hugging Face tensor name
  ('model.layers.3.mlp.down_proj.weight'): 'norms' (any part ending in
  'norm': input_layernorm, post_attention_layernorm, the final norm; checked
  first, so a norm inside attention is a norm), 'attention' (q, k, v, o
  projections and their biases), 'mlp' (gate, up, down), 'embeddings'
  (embed_tokens, lm_head), else 'other'."""
  parts = re.split(r"[/.]", name)
  if any(p.endswith("norm") for p in parts):
    return "norms"
  for kind, keys in _KIND_KEYS:
    if any(p in keys for p in parts):
      return kind
  return "other"


def check_seen(seen, rows: int | None = None, where: str = "seen") -> np.ndarray:
  """`seen` as a bool [vocab rows] array; ValueError unless it is a 1-D
  boolean (or 0/1) vector of `rows` entries."""
  arr = np.asarray(seen)
  if arr.ndim != 1 or not (arr.dtype == bool or (
      np.issubdtype(arr.dtype, np.integer) and np.isin(arr, (0, 1)).all())):
    raise ValueError(f"{where}: expected a 1-D boolean mask over the vocabulary, "
                     f"got {arr.dtype} of shape {arr.shape}")
  if rows is not None and arr.shape[0] != rows:
    raise ValueError(f"{where}: {arr.shape[0]} entries, but the embedding has "
                     f"{rows} rows")
  return arr.astype(bool)


def _split_rows(tally, hits, seen, entries, *, group, name):
  """hits [columns, vocab rows] of an embedding tensor of `entries` entries
  -> its seen and unseen parts."""
  if hits.shape[1] != seen.shape[0]:
    raise ValueError(f"{name}: {hits.shape[1]} vocabulary rows, but the seen "
                     f"mask has {seen.shape[0]} entries")
  per_row = entries // max(seen.shape[0], 1)
  for part, rows in (("seen", seen), ("unseen", ~seen)):
    k = int(rows.sum())
    tally.part(per_row * k, hits[:, rows].sum(axis=1), k, group=group,
               part=part)


def _nonfinite(x):
  return jnp.sum(~jnp.isfinite(x), dtype=jnp.int32)


@functools.partial(jax.jit, static_argnames=("taus", "atol", "former", "axis"))
def _row_counts(a, b, *, taus, atol, former, axis):
  """int32 [len(columns), rows]: the hits of each column of columns(taus,
  atol, former) per index of `axis`; and int32 [1 + len(former), 2]: the
  non-finite entries of a and of b in float32, then rounded to each former
  dtype.

  S_tau: both widened to float32 (exact), the difference in float32, strict <
  float32(tau). Former: both rounded to the dtype, then widened exactly to
  float32 so the difference itself is not rounded to a coarse (bf16) grid.
  """
  def rows(hit):
    if hit.ndim == 0:
      return hit[None].astype(jnp.int32)
    hit = jnp.moveaxis(hit, axis, 0)
    return jnp.sum(hit, axis=tuple(range(1, hit.ndim)), dtype=jnp.int32)

  a32, b32 = a.astype(jnp.float32), b.astype(jnp.float32)
  diff = jnp.abs(b32 - a32)
  hits = [rows(diff < np.float32(t)) for t in taus]
  bad = [(_nonfinite(a32), _nonfinite(b32))]
  for d in former:
    ad, bd = a.astype(d), b.astype(d)
    hits.append(rows(jnp.abs(ad.astype(jnp.float32) - bd.astype(jnp.float32))
                     <= atol))
    hits.append(rows(ad == bd))
    bad.append((_nonfinite(ad), _nonfinite(bd)))
  return jnp.stack(hits), jnp.asarray(bad)


class _Tally:
  """Accumulates [entries, hits per column] whole-model, per layer, per group
  and per layer kind; `part` adds the seen / unseen embedding rows, which
  only enter their own kinds and groups (their tensor is already counted)."""

  def __init__(self, cols):
    self.cols = cols
    self.whole = np.zeros(1 + len(cols), np.int64)
    self.per_layer: dict[int, np.ndarray] = {}
    self.per_group: dict[str, np.ndarray] = {}
    self.per_kind: dict[str, np.ndarray] = {}
    self.rows: dict[str, int] = {}

  def add(self, n, hits, *, group, layer=None, kind=None):
    v = np.concatenate([[n], np.asarray(hits, np.int64)])
    self.whole += v
    for acc, k in ((self.per_group, group), (self.per_layer, layer),
                   (self.per_kind, kind)):
      if k is not None:
        acc[k] = acc.get(k, 0) + v

  def part(self, n, hits, rows, *, group, part):
    v = np.concatenate([[n], np.asarray(hits, np.int64)])
    for acc, k in ((self.per_group, f"{group}/{part}"),
                   (self.per_kind, f"{EMBEDDINGS}_{part}")):
      acc[k] = acc.get(k, 0) + v
    kind = f"{EMBEDDINGS}_{part}"
    self.rows[kind] = max(self.rows.get(kind, 0), int(rows))

  def _summary(self, v, rows=None) -> dict:
    n = int(v[0])
    out = {"num_params": n,
           **{c: (int(h) / n if n else 0.0) for c, h in zip(self.cols, v[1:])}}
    if rows is not None:
      out["num_rows"] = rows
    return out

  def result(self, taus, atol, former, values_dtypes) -> dict:
    kinds = sorted(self.per_kind, key=lambda k: (
        KINDS.index(k) if k in KINDS else len(KINDS), k))
    return {"taus": list(taus), "atol": atol, "former_dtypes": list(former),
            "columns": list(self.cols),
            "values_dtype": ",".join(sorted(values_dtypes)),
            **self._summary(self.whole),
            "per_layer": {i: self._summary(self.per_layer[i])
                          for i in sorted(self.per_layer)},
            "per_group": {k: self._summary(self.per_group[k])
                          for k in sorted(self.per_group)},
            "per_kind": {k: self._summary(self.per_kind[k], self.rows.get(k))
                         for k in kinds}}


def _check_finite(name, bad, dtypes, where0, where1):
  """bad: [len(dtypes), 2] non-finite counts of (a, b) in float32 (dtypes[0])
  and rounded to each former dtype (see _row_counts)."""
  for dt, row in zip(dtypes, np.asarray(bad)):
    for n, where in zip(row, (where0, where1)):
      if n:
        how = ("in float32" if dt is None
               else f"rounded to {jnp.dtype(dt).name}")
        raise ValueError(
            f"{name}: {int(n)} non-finite value(s) (inf or nan) in {where} "
            f"({how}); update sparsity is defined for finite weights only")


def update_sparsity(params0, params1, *, taus=TAUS, atol: float = ATOL,
                    former=FORMER_DTYPES, tied: bool = False,
                    layer_key: str = "layers", layer_axis: int = 0,
                    seen=None) -> dict:
  """Update sparsity of params1 against params0 (the module docstring's
  definitions): the paper's S_tau for each of `taus`, in float32 on the
  values as they are (a bf16 tree, e.g. restored from a bf16 Orbax
  checkpoint, is upcast, never rounded), and the former figures in each of
  `former` (() for none; atol for their |delta| <= atol).

  Returns {'taus', 'atol', 'former_dtypes', 'columns', 'values_dtype' (the
  leaves' dtypes in params0), 'num_params', one fraction per column name
  (columns(taus, atol, former)), 'per_layer': {i: {'num_params', column:
  fraction}}, 'per_group': {name: ...}}. An inf or nan in either tree raises
  a ValueError naming the leaf.

  Layers are found in two layouts: leaves under a `layer_key` entry are
  STACKED along `layer_axis` ([L, ...], one count per index), while keys like
  'layers_3' / 'layer.3' or a numeric key after `layer_key` name one layer.
  Other leaves (embeddings, final norm) only enter the whole-model and
  per-group figures. Tied embeddings count once: a tied model has no lm_head
  leaf; `tied=True` drops one that a conversion duplicated.

  'per_kind' holds the same figures by layer kind (layer_kind: attention,
  mlp, norms, embeddings, other if any); with `seen` (a bool mask over the
  vocabulary, train.seen's), also 'embeddings_seen' and 'embeddings_unseen':
  the rows of embed_tokens and of an untied lm_head (its kernel's last axis)
  whose token training did / never processed, with their 'num_rows' (token
  ids), and per group '<group>/seen', '<group>/unseen'.

  Leaves are reduced one at a time by a jitted counter on their own devices
  (sharded leaves stay sharded), so peak memory is one leaf's temporaries.
  """
  taus, atol, former = _check_args(taus, atol, former)
  seen = None if seen is None else check_seen(seen)
  flat0 = jax.tree_util.tree_flatten_with_path(params0)[0]
  flat1, def1 = jax.tree_util.tree_flatten_with_path(params1)
  def0 = jax.tree_util.tree_structure(params0)
  if def0 != def1:
    raise ValueError("params0 and params1 have different tree structures")
  if not flat0:
    raise ValueError("params0 has no leaves")
  tally, dtypes = _Tally(columns(taus, atol, former)), set()
  for (path, a), (_, b) in zip(flat0, flat1):
    names = tuple(_key_str(k) for k in path)
    if tied and "lm_head" in names:
      continue
    name = "/".join(names)
    if a.shape != b.shape:
      raise ValueError(f"{name}: shape {a.shape} vs {b.shape}")
    dtypes.add(jnp.dtype(a.dtype).name)
    stacked, layer, group = _layer_info(names, layer_key)
    kind = layer_kind(name)
    split = seen is not None and kind == EMBEDDINGS and not stacked
    axis = layer_axis if stacked else (
        a.ndim - 1 if split and "lm_head" in names else 0)  # lm_head: [D, V]
    if stacked and not -a.ndim <= layer_axis < a.ndim:
      raise ValueError(f"{name}: no layer axis {layer_axis} in {a.shape}")
    # Sharded leaves give sharded counts; on several hosts they are gathered.
    hits, bad = map(sharding.to_host, _row_counts(
        a, b, taus=taus, atol=atol, former=former, axis=axis))
    _check_finite(name, bad, (None,) + former, "params0", "params1")
    hits = hits.astype(np.int64)  # [columns, rows]
    if stacked:
      per_row = int(np.prod(a.shape)) // max(hits.shape[1], 1)
      for i in range(hits.shape[1]):
        tally.add(per_row, hits[:, i], group=group, layer=i, kind=kind)
    else:
      tally.add(int(np.prod(a.shape)), hits.sum(axis=1), group=group,
                layer=layer, kind=kind)
      if split:
        _split_rows(tally, hits, seen, int(np.prod(a.shape)), group=group,
                    name=name)
  return tally.result(taus, atol, former, dtypes)


# ------------------------------------------------------ sparsity of checkpoints

def checkpoint_dtype(path: str) -> str:
  """The dtype a Hugging Face checkpoint's floating-point tensors are stored in
  (from the safetensors headers; config.json's torch_dtype if they hold none,
  e.g. a mix). ValueError naming the directory if neither says."""
  infos, _ = _hf_tensors(path)
  kinds = {np.dtype(i.dtype).name for i in infos.values()
           if jnp.issubdtype(i.dtype, jnp.floating)}
  if len(kinds) == 1:
    return kinds.pop()
  with open(os.path.join(path, "config.json")) as f:
    name = json.load(f).get("torch_dtype")
  if name:
    return jnp.dtype(str(name)).name
  raise ValueError(f"{path}: cannot tell the stored dtype (tensors hold "
                   f"{sorted(kinds)}, config.json has no torch_dtype)")

_HF_LAYER = re.compile(r"(^|\.)layers\.(\d+)\.")


def _hf_tensors(path: str) -> tuple[dict, bool]:
  """Tensor name -> TensorInfo of a HF directory, and its tie_word_embeddings."""
  if not os.path.isdir(path):
    raise FileNotFoundError(f"checkpoint directory not found: {path}")
  cfg_file = os.path.join(path, "config.json")
  if not os.path.isfile(cfg_file):
    raise FileNotFoundError(f"config.json not found in {path}")
  with open(cfg_file) as f:
    tied = bool(json.load(f).get("tie_word_embeddings", False))
  infos = ckpt_lib.index_tensors(pathlib.Path(path))
  return {k: v for k, v in infos.items()
          if not k.endswith(ckpt_lib.IGNORED_SUFFIXES)}, tied


def _host_counts(a: np.ndarray, b: np.ndarray, taus, atol, former,
                 where, per_row: bool = False) -> np.ndarray:
  """int64 [columns] hits of host arrays (with `per_row`: [columns, rows],
  per index of the first axis), as _row_counts counts them (S_tau
  in float32; the former figures' difference in float64, exact for every
  storage dtype we read); ValueError if either holds inf or nan (`where`: the
  tensor and both paths).

  Blocks read from files are already on the host, where NumPy needs no
  compilation per tensor shape.
  """
  def finite(x, y, dt):  # before any arithmetic on them (no RuntimeWarning)
    bad = [(np.count_nonzero(~np.isfinite(x)), np.count_nonzero(~np.isfinite(y)))]
    _check_finite(where[0], bad, (dt,), *where[1:])

  def count(hit):
    if per_row:
      return np.count_nonzero(hit.reshape(hit.shape[0], -1), axis=1)
    return np.count_nonzero(hit)

  a32, b32 = a.astype(np.float32), b.astype(np.float32)
  finite(a32, b32, None)
  diff = np.abs(b32 - a32)  # float32, as in _row_counts
  hits = [count(diff < np.float32(t)) for t in taus]
  for d in former:
    ad, bd = a.astype(d, copy=False), b.astype(d, copy=False)
    finite(ad, bd, d)
    hits.append(count(
        np.abs(ad.astype(np.float64) - bd.astype(np.float64)) <= atol))
    hits.append(count(ad == bd))
  return np.asarray(hits, np.int64)


def update_sparsity_from_checkpoints(path0: str, path1: str, *, taus=TAUS,
                                     atol: float = ATOL, former=FORMER_DTYPES,
                                     chunk_bytes: int = 64 << 20,
                                     seen=None) -> dict:
  """`update_sparsity` between two Hugging Face directories (before, after),
  on the values as stored: S_tau compares the stored values widened to
  float32 (a bf16 checkpoint's bf16 values, upcast), the former figures round
  both to each of `former` first.

  Tensors are read straight from the safetensors files in the dtype they are
  stored in, a block of rows at a time, so host memory holds a few times
  chunk_bytes (the blocks, their float32 copies and differences) whatever the
  model size. A tensor holding inf or nan in either checkpoint is a
  ValueError naming it and the checkpoint; the files are closed either way.

  Per-layer figures use the HF layer index ('model.layers.3.' -> 3); groups
  are tensor names without it ('model.layers.self_attn.q_proj.weight').
  Tied embeddings count once: lm_head.weight is skipped when either config
  ties it. Layer kinds and `seen` as in update_sparsity (an embedding's
  rows are its first axis; train.seen.read_seen(path1) gives the mask a
  training run exported). Returns update_sparsity's dict ('values_dtype': the stored dtypes
  of path0) plus 'stored_dtype' {'before', 'after'} (a comma-joined list if a
  checkpoint mixes dtypes).
  """
  taus, atol, former = _check_args(taus, atol, former)
  seen = None if seen is None else check_seen(seen)
  if chunk_bytes <= 0:
    raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
  infos0, tied0 = _hf_tensors(path0)
  infos1, tied1 = _hf_tensors(path1)
  if tied0 or tied1:
    infos0.pop("lm_head.weight", None)
    infos1.pop("lm_head.weight", None)
  if set(infos0) != set(infos1):
    only0, only1 = sorted(set(infos0) - set(infos1)), sorted(set(infos1) - set(infos0))
    raise ValueError(f"checkpoints hold different tensors: only in {path0}: "
                     f"{only0[:3]}, only in {path1}: {only1[:3]}")
  if not infos0:
    raise ValueError(f"{path0}: no tensors")
  tally, stored0, stored1 = _Tally(columns(taus, atol, former)), set(), set()
  former_np = tuple(np.dtype(jnp.dtype(d)) for d in former)
  files = {}
  try:
    for name in sorted(infos0):
      i0, i1 = infos0[name], infos1[name]
      if i0.shape != i1.shape:
        raise ValueError(f"tensor {name!r}: shape {i0.shape} in {path0} vs "
                         f"{i1.shape} in {path1}")
      stored0.add(np.dtype(i0.dtype).name)
      stored1.add(np.dtype(i1.dtype).name)
      m = _HF_LAYER.search(name)
      layer = int(m.group(2)) if m else None
      group = _HF_LAYER.sub(r"\1layers.", name, count=1) if m else name
      kind = layer_kind(name)
      split = seen is not None and kind == EMBEDDINGS and len(i0.shape) > 1
      rows = i0.shape[0] if i0.shape else 1
      row_bytes = max(i0.nbytes, i1.nbytes) // max(rows, 1)
      step = max(1, chunk_bytes // max(row_bytes, 1))
      n, hits, row_hits = 0, 0, []
      for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        for i in (i0, i1):  # once per file, not per block
          if i.file not in files:
            files[i.file] = open(i.file, "rb")
        a = st.read_rows(i0, r0, r1, f=files[i0.file])
        b = st.read_rows(i1, r0, r1, f=files[i1.file])
        got = _host_counts(a, b, taus, atol, former_np,
                           (f"tensor {name!r}", path0, path1), per_row=split)
        if split:
          row_hits.append(got)
          got = got.sum(axis=1)
        hits = hits + got
        n += a.size
      tally.add(n, hits, group=group, layer=layer, kind=kind)
      if split:
        _split_rows(tally, np.concatenate(row_hits, axis=1), seen, n,
                    group=group, name=f"tensor {name!r}")
  finally:
    for f in files.values():
      f.close()
  out = tally.result(taus, atol, former, stored0)
  out["stored_dtype"] = {"before": ",".join(sorted(stored0)),
                         "after": ",".join(sorted(stored1))}
  return out


def metrics_from_result(res, *, detail: bool = True) -> dict:
  """Flat sparsity/* numbers of an update_sparsity(_from_checkpoints) result:
  the one naming rule of the sparsity/* keys.

    sparsity/{column}     whole model, every column of res ('S_1e-6_f32',
                          'S_1e-8_f32', 'unchanged_1e-5_bf16', 'equal_bf16', ...)
    sparsity/layer_{i:02d}/S_{tau}_f32   per layer, the paper's figures only
    sparsity/{kind}/S_{tau}_f32          per layer kind (KINDS present:
                          attention, mlp, norms, embeddings, and with a seen
                          mask embeddings_seen / embeddings_unseen)
    sparsity/embeddings_{seen,unseen}/num_rows   their token ids
  and with `detail` (evaluation; the training loop logs without it):
    sparsity/num_params, sparsity/{kind}/num_params,
    sparsity/{tensor group}/S_{tau}_f32 (the group without 'model.' / '.weight')
  """
  cols = list(res["columns"])
  s_cols = [c for c in cols if c.startswith("S_")]
  out = {f"sparsity/{c}": float(res[c]) for c in cols}
  if detail:
    out["sparsity/num_params"] = float(res["num_params"])
  for k, v in (res.get("per_kind") or {}).items():
    for c in s_cols:
      out[f"sparsity/{k}/{c}"] = float(v[c])
    if "num_rows" in v:
      out[f"sparsity/{k}/num_rows"] = float(v["num_rows"])
    if detail:
      out[f"sparsity/{k}/num_params"] = float(v["num_params"])
  for i, v in res["per_layer"].items():
    for c in s_cols:
      out[f"sparsity/layer_{int(i):02d}/{c}"] = float(v[c])
  if detail:
    for g, v in res["per_group"].items():
      g = re.sub(r"\.weight(?=/|$)", "", g.removeprefix("model."))
      for c in s_cols:
        out[f"sparsity/{g}/{c}"] = float(v[c])
  return out


def metrics_from_params(params0, params1, seen=None) -> dict:
  """The training loop's sparsity/* of params1 (the values training
  produced) against the initial student params0: metrics_from_result without
  detail, at the default TAUS and the former figures in bf16 and f32; `seen`
  (the loop's mask of processed token ids, or None) splits the embedding
  rows."""
  return metrics_from_result(update_sparsity(params0, params1, seen=seen),
                             detail=False)
