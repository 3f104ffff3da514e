"""Device mesh and logical-axis sharding.

Model code names array axes with a small logical vocabulary::

  batch, seq, embed, heads, kv_heads, head_dim, mlp, vocab, layers, cache_seq,
  lora_rank (the rank axis of LoRA adapters, models/lora.py)

A config holds the rules that map each logical name to mesh axes
(`config.rules`, default DEFAULT_RULES); `rules_from_config` reads them, once
per command, and the result is passed down to every function here that
resolves logical names (none of them has a default). The default mesh is pure FSDP plus
an optional tensor axis: ('data', 'fsdp', 'tensor').
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
import contextlib
import contextvars
import dataclasses
import logging
import math

import jax
from jax import lax
from jax.experimental import multihost_utils
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

from jaxdistill import choices

MESH_AXES = ("data", "fsdp", "tensor")

# Logical name -> mesh axis (or tuple of mesh axes, or None = replicated).
DEFAULT_RULES = (
    ("batch", ("data", "fsdp")),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("vocab", "tensor"),
    ("seq", None),
    ("head_dim", None),
    ("layers", None),
    ("cache_seq", None),
    # An adapter's A holds 'embed' (fsdp) or its B does not: its rank axis
    # takes fsdp then, so each adapter and its Adam moments are split over
    # the FSDP axis (one mesh axis per array: the first name wins).
    ("lora_rank", "fsdp"),
)


# How a rollout lays its weights out for the decode loop (rollout/
# generation.py): 'train' as the run's rules place them (FSDP: every decode
# step gathers every layer's weights), 'replicated' a whole copy on each chip,
# 'tp' tensor parallelism on every mesh axis but 'data', each matrix split
# over an output dim (decode_shardings). 'auto' picks per model
# (generation.resolve_layout).
DECODE_LAYOUTS = choices.DECODE_LAYOUTS
# Logical names a 'tp' decode layout splits over the model axes.
_TP_NAMES = ("heads", "kv_heads", "mlp", "vocab")
_MODEL_AXES = tuple(a for a in MESH_AXES if a != "data")


def decode_rules(rules, layout: str) -> tuple:
  """The rules that place a model's weights in a decode `layout` ('train',
  'replicated' or 'tp'), from the run's `rules`: under 'tp' those of its
  vectors and vocab-sized tables (decode_shardings splits the matrices
  over their outputs). Only weights follow them: the KV cache and the loop
  state keep the run's rules (rows split over the data axes), so attention
  stays data-parallel over the rows."""
  if layout == "train":
    return tuple(rules)
  if layout not in ("replicated", "tp"):
    raise ValueError(f"decode layout: expected one of {DECODE_LAYOUTS[1:]}, "
                     f"got {layout!r}")
  return tuple((name, _MODEL_AXES if layout == "tp" and name in _TP_NAMES
                else None) for name, _ in rules)


def embed_split_rules(rules) -> tuple:
  """Rules that split only 'embed' over the model axes (the 'tp' copy of
  the embedding table that decode steps look tokens up in)."""
  return tuple((name, _MODEL_AXES if name == "embed" else None)
               for name, _ in rules)


def _output_dims(ax) -> list:
  """The dims of a weight that a matmul does not contract, from its logical
  names: the leading group of names is a kernel's input (embed; heads with
  head_dim; mlp; lora_rank), the rest its output; a weight of one group (a
  bias) is all output. `ax` holds 'layers' / None for unnamed dims."""
  group = lambda n: "heads" if n in ("heads", "kv_heads", "head_dim") else n
  named = [i for i, n in enumerate(ax) if n not in (None, "layers")]
  runs = []
  for i in named:
    if runs and group(ax[runs[-1][-1]]) == group(ax[i]):
      runs[-1].append(i)
    else:
      runs.append([i])
  return [i for r in runs[1:] for i in r] if len(runs) > 1 else named


def decode_shardings(logical_tree, mesh: Mesh, rules, layout: str, shapes):
  """NamedShardings of a model's weights in a decode layout.

  'tp' splits every matrix over one of its output dims (_output_dims): the
  heads, kv heads, mlp or vocab where the model axes divide them, else
  another output dim (Qwen2.5-7B's 28 heads and 4 kv heads on 8 chips: the
  head_dim; o_proj and down_proj: the embedding dim). Each chip then
  computes whole dot products over the full input, the values the 'train'
  layout's matmuls give (a split input dim would sum rounded partial
  products across chips), and a decode step moves only activations: the
  inputs a matmul needs whole are gathered (DecodeActivations). The
  embedding table is split over its vocab rows (the tied head's output).
  Vectors (norms) stay whole."""
  primary = decode_rules(rules, layout)
  model = tuple(a for a in _MODEL_AXES if mesh.shape.get(a, 1) > 1)
  size = _mesh_size(mesh, model)

  def one(ax, s):
    shape = getattr(s, "shape", s)
    named = [n for n in ax if n not in (None, "layers")]
    if layout != "tp" or len(named) < 2 or "vocab" in named or size == 1:
      return NamedSharding(mesh, logical_to_spec(ax, shape, mesh, primary))
    outs = [i for i in _output_dims(ax) if shape[i] % size == 0]
    pick = ([i for i in outs if ax[i] in _TP_NAMES] + outs + [None])[0]
    spec = [None] * len(ax)
    if pick is not None:
      spec[pick] = model[0] if len(model) == 1 else model
    return NamedSharding(mesh, P(*spec))
  return jax.tree.map(one, logical_tree, shapes, is_leaf=is_axes_leaf)


# The share of a GPU's memory JAX's allocator takes when our commands run
# (cli.py sets XLA_PYTHON_CLIENT_MEM_FRACTION to it unless the user did, and
# compile_only judges a GPU program's fit against that pool): JAX's
# default, 0.75, leaves a quarter of an 80 GB card unused; 0.9 leaves 8 GB
# for the CUDA context, cuBLAS / cuDNN workspaces and NCCL's buffers, which
# the allocator's pool does not hold.
GPU_MEM_FRACTION = 0.90
MEM_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"


_TARGET = contextvars.ContextVar("jaxdistill_target_platform", default=None)


def platform(mesh: Mesh | None = None) -> str:
  """The platform a program being traced will run on: the one set by
  `compiling_for` (compile-only: a TPU program traced on a CPU host), else
  the mesh's devices', else JAX's default backend. Code that picks a
  per-platform variant (CPU blocking, layouts) asks this, so that what is
  compiled for a TPU slice is what runs there."""
  target = _TARGET.get()
  if target is not None:
    return target
  if mesh is not None:
    return mesh.devices.flat[0].platform
  return jax.default_backend()


@contextlib.contextmanager
def compiling_for(target_platform: str):
  """Within it, `platform()` answers `target_platform`."""
  token = _TARGET.set(target_platform)
  try:
    yield
  finally:
    _TARGET.reset(token)


def rules_from_config(config) -> tuple:
  """A run's logical-axis rules: config.rules, else DEFAULT_RULES.

  The only reader of config.rules: each command calls it once and passes the
  result down. Entries are (logical name, mesh axis | tuple of mesh axes |
  None); lists (a config read back from JSON) become tuples, so that the
  rules are hashable (a static argument of jit).
  """
  raw = config.get("rules")
  if raw is None:
    return DEFAULT_RULES
  rules = []
  for entry in raw:
    if not (isinstance(entry, (tuple, list)) and len(entry) == 2
            and isinstance(entry[0], str)):
      raise ValueError(f"config.rules: each entry must be a pair (logical axis "
                       f"name, mesh axes), got {entry!r}")
    name, axes = entry
    rules.append((name, tuple(axes) if isinstance(axes, list) else axes))
  return tuple(rules)


def make_mesh(shape: Mapping[str, int] | None = None, devices=None) -> Mesh:
  """Builds a ('data', 'fsdp', 'tensor') mesh; one entry may be -1 (= the rest).

  Raises ValueError naming the mesh when it does not divide the device count.
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = dict(shape or {"data": -1})
  unknown = set(shape) - set(MESH_AXES)
  if unknown:
    raise ValueError(f"mesh: unknown axes {sorted(unknown)}; use {MESH_AXES}")
  sizes = [int(shape.get(a, 1)) for a in MESH_AXES]
  n_free = sum(s == -1 for s in sizes)
  if n_free > 1:
    raise ValueError(f"mesh: at most one axis may be -1, got {shape}")
  known = math.prod(s for s in sizes if s != -1)
  if any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"mesh: axis sizes must be positive or -1, got {shape}")
  if n_free:
    if len(devices) % known:
      raise ValueError(
          f"mesh {shape} does not divide the {len(devices)} available devices")
    sizes = [len(devices) // known if s == -1 else s for s in sizes]
  if math.prod(sizes) != len(devices):
    raise ValueError(
        f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices, "
        f"but {len(devices)} are available")
  return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES)


def _mesh_size(mesh: Mesh, axes) -> int:
  if axes is None:
    return 1
  if isinstance(axes, str):
    axes = (axes,)
  return math.prod(mesh.shape[a] for a in axes)


def logical_to_spec(logical: Sequence[str | None], shape: Sequence[int] | None,
                    mesh: Mesh, rules) -> P:
  """Resolves one array's logical axis names to a PartitionSpec.

  A dimension that its mesh axes do not divide is replicated (logged once), so
  that e.g. 2 KV heads on a 4-way tensor axis still run. A mesh axis is used at
  most once per array.
  """
  table = dict(rules)
  used, spec = set(), []
  for i, name in enumerate(logical):
    axes = table.get(name) if name is not None else None
    if isinstance(axes, str):
      axes = (axes,)
    if axes is not None:
      axes = tuple(a for a in axes if a not in used and mesh.shape.get(a, 1) > 1)
      if shape is not None and axes and shape[i] % _mesh_size(mesh, axes):
        logging.info("replicating dim %d (%s, size %d): not divisible by %s",
                     i, name, shape[i], axes)
        axes = ()
    if not axes:
      spec.append(None)
    else:
      used.update(axes)
      spec.append(axes[0] if len(axes) == 1 else axes)
  return P(*spec)


def is_axes_leaf(x) -> bool:
  return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


def tree_shardings(logical_tree, mesh: Mesh, rules, shapes=None):
  """Maps a pytree of logical-axis tuples (and optional same-structured
  shapes/ShapeDtypeStructs) to a pytree of NamedShardings."""
  if shapes is None:
    return jax.tree.map(
        lambda ax: NamedSharding(mesh, logical_to_spec(ax, None, mesh, rules)),
        logical_tree, is_leaf=is_axes_leaf)
  return jax.tree.map(
      lambda ax, s: NamedSharding(
          mesh, logical_to_spec(ax, getattr(s, "shape", s), mesh, rules)),
      logical_tree, shapes, is_leaf=is_axes_leaf)


@dataclasses.dataclass(frozen=True)
class Activations:
  """Sharding constraints for activations, by logical axis names.

  `shard(x, "batch", "seq", "embed")` pins x [B, T, D] to the mesh as the
  rules place those names (with the rules' fallback: a dimension its mesh
  axes do not divide is replicated; a mesh axis is used once per array, so
  the batch takes 'fsdp' before the embedding can). Hashable (a static jit
  argument and a Flax module field): the models take one to keep FSDP
  activations split over the batch; without constraints XLA may propagate
  the weights' embed sharding into the activations and all-reduce the
  [B, T, V] logits instead of gathering the [D, V] head.
  """
  mesh: Mesh
  rules: tuple

  # Pins the models place for decode layouts only (DecodeActivations);
  # training leaves these activations to the compiler, as it always has.
  DECODE_SITES = ("proj_out", "attention_in", "attention_out")

  def _rules(self, site):
    return None if site in self.DECODE_SITES else self.rules

  def __call__(self, x, *logical, site: str | None = None):
    """x pinned by its logical axis names; `site` names the pin's place in
    the model, which only DecodeActivations tells apart ('attention': the
    queries, keys and values where they meet the KV cache; the
    DECODE_SITES, which this class leaves unpinned: 'proj_out' a
    projection's output, 'attention_in' q, k and v before RoPE,
    'attention_out' the attention's output before o_proj)."""
    if len(logical) != x.ndim:
      raise ValueError(f"Activations: {len(logical)} names {logical} for an "
                       f"array of shape {x.shape}")
    rules = self._rules(site)
    if rules is None:
      return x
    spec = logical_to_spec(logical, x.shape, self.mesh, rules)
    return lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))

  def __post_init__(self):
    object.__setattr__(self, "rules", tuple(self.rules))


@dataclasses.dataclass(frozen=True)
class DecodeActivations(Activations):
  """The activation pins of a decode step under the 'tp' decode layout
  (rollout/generation.py), whose weights are split over their output dims
  (decode_shardings). Left to itself the TPU compiler gathered weights
  inside the decode loop to keep the one-token activations split over the
  rows as the KV cache is (Qwen2.5-1.5B on a v5e-8: 165 MB a step into
  each chip, mostly q, k and v projections). Pinned, a step moves only
  activations (24 MB, at 32 rows of 512 prompt positions):

  - a projection's output ('proj_out') stays split as its weight's output
    (heads / kv heads where they divide, else head_dim; embed for o_proj
    and down_proj; the MLP's hidden over mlp), so every chip computes
    whole dot products over the full input;
  - the residual stream follows `tp_rules` (decode_activation_rules):
    rows split over 'data' only, the embedding whole on every chip;
  - q, k and v move onto the KV cache's rows ('attention_in', before RoPE,
    whose rotation pairs head_dim entries a head_dim split holds apart,
    then 'attention'), by the run's `rules`: attention is data-parallel
    over the rows, which suits models with fewer kv heads than chips
    (Qwen2.5's 2 and 4);
  - the attention's output ('attention_out') is gathered whole for o_proj.
  """
  tp_rules: tuple = ()
  # q, k and v projections contract their kernels as stored
  # (transformer.Linear.keep_out_dims), so a head_dim split stays in place.
  KEEP_OUT_DIMS = True

  def __post_init__(self):
    super().__post_init__()
    object.__setattr__(self, "tp_rules", tuple(self.tp_rules))

  def _rules(self, site):
    if site in ("attention", "attention_in"):
      return self.rules
    if site == "attention_out":  # o_proj reads its input whole
      return tuple((n, a if n == "batch" else None) for n, a in self.tp_rules)
    if site == "proj_out":  # as decode_shardings splits the weights' outputs
      return tuple((n, _MODEL_AXES if n in ("heads", "kv_heads", "head_dim",
                                            "embed") else a)
                   for n, a in self.tp_rules)
    return self.tp_rules


def decode_activation_rules(rules) -> tuple:
  """DecodeActivations' `tp_rules` from the run's rules: 'batch' on the
  'data' axis only (where the run splits rows over it), the names the 'tp'
  decode layout splits (heads, kv heads, mlp, vocab) over the model axes,
  every other name whole."""
  out = []
  for name, axes in rules:
    if name == "batch":
      axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
      out.append((name, "data" if "data" in axes else None))
    else:
      out.append((name, _MODEL_AXES if name in _TP_NAMES else None))
  return tuple(out)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh, ndim: int, rules) -> NamedSharding:
  """Sharding for a [batch, ...] array: batch over the data axes."""
  return NamedSharding(
      mesh, logical_to_spec(("batch",) + (None,) * (ndim - 1), None, mesh, rules))


def put_global(x, shard: NamedSharding) -> jax.Array:
  """A host array that every process holds in full (the global batch) ->
  a global jax.Array placed by `shard`. On several processes each one fills
  only its own devices' blocks, whichever rows those are (the mesh's device
  order decides), and a block replicated over hosts is filled on each."""
  x = np.asarray(x)
  if jax.process_count() == 1:
    return jax.device_put(x, shard)
  return jax.make_array_from_callback(x.shape, shard, lambda idx: x[idx])


def to_host(x) -> np.ndarray:
  """NumPy copy of a jax.Array on every process, also one spanning devices of
  other processes (gathered: a collective, so every process must call it)."""
  if jax.process_count() == 1 or x.is_fully_addressable:
    return np.asarray(jax.device_get(x))
  if x.is_fully_replicated:
    return np.asarray(x.addressable_data(0))
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))
