"""Update sparsity: the share of parameters an update leaves unchanged, in
memory (update_sparsity on two param trees, per layer, sharded or not) or
between two Hugging Face checkpoints on disk (update_sparsity_from_checkpoints,
one tensor at a time); and their flat sparsity/* metrics
(metrics_from_result; the training loop's: metrics_from_params).
Definitions: docs/method.md.

Entries are compared after both are rounded to the comparison dtype:
`sparsity` counts |theta1 - theta0| <= atol, `exact_sparsity` counts
theta1 == theta0 under IEEE equality (so -0.0 equals 0.0; it is not a
comparison of bit patterns). Both are defined for finite weights only: an inf
or nan in either tree or checkpoint (after rounding) is a ValueError naming
the parameter, since IEEE arithmetic would count it as changed (nan != nan,
inf - inf = nan) and report a sparsity that means nothing.
"""
from __future__ import annotations

from collections.abc import Sequence
import functools
import json
import os
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import sharding
from jaxdistill.models import checkpoint as ckpt_lib
from jaxdistill.models import hub
from jaxdistill.models import safetensors_io as st

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


@functools.partial(jax.jit, static_argnames=("dtype", "atol", "axis"))
def _row_counts(a, b, *, dtype, atol, axis):
  """int32 [rows] counts of |a - b| <= atol and of a == b (IEEE), per index
  of `axis`, and the int32 counts of non-finite entries of a and of b.

  Both operands are first rounded to `dtype`, then widened exactly to float32
  so the difference itself is not rounded to a coarse (bf16) grid.
  """
  a, b = a.astype(dtype), b.astype(dtype)
  bad = tuple(jnp.sum(~jnp.isfinite(x), dtype=jnp.int32) for x in (a, b))
  if a.ndim == 0:
    a, b = a[None], b[None]
  else:
    a, b = jnp.moveaxis(a, axis, 0), jnp.moveaxis(b, axis, 0)
  red = tuple(range(1, a.ndim))
  exact = jnp.sum(a == b, axis=red, dtype=jnp.int32)
  if jnp.issubdtype(a.dtype, jnp.floating):
    close = jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)) <= atol
  else:
    close = a == b
  return jnp.sum(close, axis=red, dtype=jnp.int32), exact, *bad


def _summary(total, close, exact) -> dict:
  return {"num_params": int(total), "sparsity": close / total if total else 0.0,
          "exact_sparsity": exact / total if total else 0.0}


class _Tally:
  """Accumulates (entries, close, exact) counts whole-model, per layer, per group."""

  def __init__(self):
    self.whole = [0, 0, 0]
    self.per_layer: dict[int, list[int]] = {}
    self.per_group: dict[str, list[int]] = {}
    self.dtypes: set[str] = set()

  @staticmethod
  def _add(acc, n, c, e):
    acc[0], acc[1], acc[2] = acc[0] + n, acc[1] + c, acc[2] + e

  def add(self, n, c, e, *, group, layer=None):
    self._add(self.whole, n, c, e)
    self._add(self.per_group.setdefault(group, [0, 0, 0]), n, c, e)
    if layer is not None:
      self._add(self.per_layer.setdefault(layer, [0, 0, 0]), n, c, e)

  def result(self, atol) -> dict:
    out = {"atol": float(atol),
           "dtype": (next(iter(self.dtypes)) if len(self.dtypes) == 1
                     else ",".join(sorted(self.dtypes))),
           **_summary(*self.whole)}
    out["per_layer"] = {i: _summary(*self.per_layer[i])
                        for i in sorted(self.per_layer)}
    out["per_group"] = {k: _summary(*self.per_group[k])
                        for k in sorted(self.per_group)}
    return out


def _counts(a, b, dtype, atol, axis=0, *, name):
  """int64 NumPy (close, exact) counts per index of `axis`; see _row_counts.
  ValueError naming the parameter `name` if a or b holds inf or nan."""
  # Sharded leaves give sharded counts; on several hosts they are gathered.
  c_rows, e_rows, bad0, bad1 = map(sharding.to_host, _row_counts(
      a, b, dtype=dtype, atol=float(atol), axis=axis))
  _check_finite(name, int(bad0), int(bad1), dtype, "params0", "params1")
  return c_rows.astype(np.int64), e_rows.astype(np.int64)


def _check_finite(name, bad0, bad1, dtype, where0, where1):
  for bad, where in ((bad0, where0), (bad1, where1)):
    if bad:
      raise ValueError(
          f"{name}: {bad} non-finite value(s) (inf or nan) in {where} "
          f"(compared in {jnp.dtype(dtype).name}); update sparsity is defined "
          "for finite weights only")


def update_sparsity(params0, params1, *, atol: float = 1e-5, dtype=None,
                    tied: bool = False, layer_key: str = "layers",
                    layer_axis: int = 0) -> dict:
  """Fraction of parameter entries left unchanged by training.

  An entry counts as unchanged when |theta1 - theta0| <= atol after both are
  rounded to the storage dtype (`dtype`, or else each leaf's dtype in
  `params0`, i.e. the checkpoint's); `exact_sparsity` counts entries equal
  under IEEE comparison (-0.0 == 0.0). Reported whole-model, per layer and per
  parameter group. An inf or nan in either tree (after rounding) raises a
  ValueError naming the leaf.

  Layers are found in two layouts: leaves under a `layer_key` entry are
  STACKED along `layer_axis` ([L, ...], one count per index), while keys like
  'layers_3' / 'layer.3' or a numeric key after `layer_key` name one layer.
  Other leaves (embeddings, final norm) only enter the whole-model and
  per-group figures. Tied embeddings count once: a tied model has no lm_head
  leaf; `tied=True` drops one that a conversion duplicated.

  Leaves are reduced one at a time by a jitted counter on their own devices
  (sharded leaves stay sharded), so peak memory is one leaf's temporaries.
  """
  flat0 = jax.tree_util.tree_flatten_with_path(params0)[0]
  flat1, def1 = jax.tree_util.tree_flatten_with_path(params1)
  def0 = jax.tree_util.tree_structure(params0)
  if def0 != def1:
    raise ValueError("params0 and params1 have different tree structures")
  if not flat0:
    raise ValueError("params0 has no leaves")
  if not atol >= 0:
    raise ValueError(f"atol must be >= 0, got {atol}")
  tally = _Tally()
  for (path, a), (_, b) in zip(flat0, flat1):
    names = tuple(_key_str(k) for k in path)
    if tied and "lm_head" in names:
      continue
    if a.shape != b.shape:
      raise ValueError(f"{'/'.join(names)}: shape {a.shape} vs {b.shape}")
    leaf_dtype = jnp.dtype(dtype if dtype is not None else a.dtype)
    tally.dtypes.add(leaf_dtype.name)
    stacked, layer, group = _layer_info(names, layer_key)
    axis = layer_axis if stacked else 0
    if stacked and not -a.ndim <= layer_axis < a.ndim:
      raise ValueError(f"{'/'.join(names)}: no layer axis {layer_axis} in {a.shape}")
    c_rows, e_rows = _counts(a, b, leaf_dtype, atol, axis,
                             name="/".join(names))
    if stacked:
      per_row = int(np.prod(a.shape)) // max(len(c_rows), 1)
      for i in range(len(c_rows)):
        tally.add(per_row, int(c_rows[i]), int(e_rows[i]), group=group, layer=i)
    else:
      tally.add(int(np.prod(a.shape)), int(c_rows.sum()), int(e_rows.sum()),
                group=group, layer=layer)
  return tally.result(atol)


# ------------------------------------------------------ sparsity of checkpoints

SPARSITY_DTYPES = ("bfloat16", "float32")


def other_sparsity_dtype(dtype) -> str:
  """The dtype reported beside `dtype`: float32 beside anything else, and
  bfloat16 beside float32 (the study's checkpoints are bfloat16)."""
  return "bfloat16" if jnp.dtype(dtype) == jnp.float32 else "float32"


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


def _host_counts(a: np.ndarray, b: np.ndarray, dtype, atol,
                 where) -> tuple[int, int]:
  """(close, exact) counts of host arrays rounded to `dtype`, like _row_counts;
  ValueError if either holds inf or nan (`where`: the tensor and both paths).

  Blocks read from files are already on the host, where NumPy needs no
  compilation per tensor shape; the difference is taken in float64, exact
  for every storage dtype we read.
  """
  a, b = a.astype(dtype, copy=False), b.astype(dtype, copy=False)
  exact = int(np.count_nonzero(a == b))
  if not jnp.issubdtype(dtype, jnp.floating):  # (NumPy's misses bfloat16.)
    return exact, exact
  _check_finite(where[0], int(np.count_nonzero(~np.isfinite(a))),
                int(np.count_nonzero(~np.isfinite(b))), dtype, *where[1:])
  diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
  return int(np.count_nonzero(diff <= atol)), exact


def update_sparsity_from_checkpoints(path0: str, path1: str, *,
                                     atol: float = 1e-5, dtype=None,
                                     chunk_bytes: int = 64 << 20) -> dict:
  """`update_sparsity` between two Hugging Face directories (before, after).

  Tensors are read straight from the safetensors files in the dtype they are
  stored in, a block of rows at a time, so host memory holds a few times
  chunk_bytes (the blocks and their float64 difference) whatever the model
  size. Both are rounded to `dtype` before comparing; by default that is the
  stored dtype of each tensor of `path0`, the BASE checkpoint (docs/method.md:
  compare in the dtype the checkpoint is stored in). A float32 export of a
  bfloat16 base is then compared on the bfloat16 grid, where updates smaller
  than a bf16 step leave an entry unchanged, as they would in a bf16 release;
  pass dtype='float32' for the finer comparison (jaxdistill.evaluate reports
  both). A tensor holding inf or nan in either checkpoint is a ValueError
  naming it and the checkpoint.

  Per-layer figures use the HF layer index ('model.layers.3.' -> 3); groups
  are tensor names without it ('model.layers.self_attn.q_proj.weight').
  Tied embeddings count once: lm_head.weight is skipped when either config
  ties it. Returns update_sparsity's dict plus 'stored_dtype' {'before',
  'after'} (a comma-joined list if a checkpoint mixes dtypes).
  """
  if not atol >= 0:
    raise ValueError(f"atol must be >= 0, got {atol}")
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
  tally, stored0, stored1 = _Tally(), set(), set()
  files = {}
  try:
    for name in sorted(infos0):
      i0, i1 = infos0[name], infos1[name]
      if i0.shape != i1.shape:
        raise ValueError(f"tensor {name!r}: shape {i0.shape} in {path0} vs "
                         f"{i1.shape} in {path1}")
      stored0.add(np.dtype(i0.dtype).name)
      stored1.add(np.dtype(i1.dtype).name)
      cmp_dtype = np.dtype(jnp.dtype(dtype if dtype is not None else i0.dtype))
      tally.dtypes.add(cmp_dtype.name)
      m = _HF_LAYER.search(name)
      layer = int(m.group(2)) if m else None
      group = _HF_LAYER.sub(r"\1layers.", name, count=1) if m else name
      rows = i0.shape[0] if i0.shape else 1
      row_bytes = max(i0.nbytes, i1.nbytes) // max(rows, 1)
      step = max(1, chunk_bytes // max(row_bytes, 1))
      n = c = e = 0
      for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        for i in (i0, i1):  # once per file, not per block
          if i.file not in files:
            files[i.file] = open(i.file, "rb")
        a = st.read_rows(i0, r0, r1, f=files[i0.file])
        b = st.read_rows(i1, r0, r1, f=files[i1.file])
        dc, de = _host_counts(a, b, cmp_dtype, atol,
                              (f"tensor {name!r}", path0, path1))
        n, c, e = n + a.size, c + dc, e + de
      tally.add(n, c, e, group=group, layer=layer)
  finally:
    for f in files.values():
      f.close()
  out = tally.result(atol)
  out["stored_dtype"] = {"before": ",".join(sorted(stored0)),
                         "after": ",".join(sorted(stored1))}
  return out



def base_dtype(mcfg, cfg) -> str:
  """The dtype the base student is stored in: its checkpoint's (config.student
  .path, a directory or hub name, unless a preset or init is given), else the params dtype of a from-scratch init. Sparsity is compared
  in it by default (docs/method.md)."""
  spec = hub.weights_spec(mcfg)
  if spec:
    return checkpoint_dtype(hub.resolve(spec)[0])
  return jnp.dtype(cfg.param_dtype).name


def metrics_from_result(res, other=None, *, detail: bool = True) -> dict:
  """Flat sparsity/* numbers of an update_sparsity(_from_checkpoints) result:
  the one naming rule of the sparsity/* keys.

    sparsity/whole, sparsity/whole_exact   `res`, compared in the default dtype
    sparsity/whole_{dtype}, sparsity/whole_exact_{dtype}   `res` and `other`
                                (the same comparison in another dtype), each
                                named by the dtype it was compared in
    sparsity/layer_{i:02d}      per layer
  and with `detail` (evaluation; the training loop logs without it):
    sparsity/num_params, sparsity/layer_{i:02d}_exact,
    sparsity/{tensor group}[_exact] (the group without 'model.' / '.weight')
  """
  out = {"sparsity/whole": float(res["sparsity"]),
         "sparsity/whole_exact": float(res["exact_sparsity"])}
  if detail:
    out["sparsity/num_params"] = float(res["num_params"])
  for r in (res, other):
    if r is not None:
      out[f"sparsity/whole_{r['dtype']}"] = float(r["sparsity"])
      out[f"sparsity/whole_exact_{r['dtype']}"] = float(r["exact_sparsity"])
  for i, v in res["per_layer"].items():
    out[f"sparsity/layer_{int(i):02d}"] = float(v["sparsity"])
    if detail:
      out[f"sparsity/layer_{int(i):02d}_exact"] = float(v["exact_sparsity"])
  if detail:
    for g, v in res["per_group"].items():
      g = g.removeprefix("model.").removesuffix(".weight")
      out[f"sparsity/{g}"] = float(v["sparsity"])
      out[f"sparsity/{g}_exact"] = float(v["exact_sparsity"])
  return out


def metrics_from_params(params0, params1, cfg, dtype=None) -> dict:
  """The training loop's sparsity/* of params1 against the initial student
  params0 (docs/method.md definition; keys: metrics_from_result without
  detail).

  Compared in `dtype` (pass base_dtype(...): the base checkpoint's stored
  dtype; default the params dtype), and the whole-model figures also in the
  other of bfloat16 / float32.
  """
  dtype = jnp.dtype(dtype if dtype is not None else cfg.param_dtype).name
  res = update_sparsity(params0, params1, atol=1e-5, dtype=dtype)
  other = update_sparsity(params0, params1, atol=1e-5,
                          dtype=other_sparsity_dtype(dtype))
  return metrics_from_result(res, other, detail=False)
