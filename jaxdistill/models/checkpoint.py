"""Hugging Face checkpoints <-> (ModelConfig, params), streamed tensor by tensor.

Loading validates config.json and every tensor's presence and shape before it
allocates anything, then fills one device buffer per parameter leaf piece by
piece (a layer, or a block of rows of the embedding / head) through a donated
`dynamic_update_slice`. Host memory therefore holds at most one piece besides
the parameters themselves, and each piece goes straight onto its NamedSharding
when a mesh is given.
"""
from __future__ import annotations

import ctypes
import dataclasses
import json
import logging
import math
import os
import pathlib

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from jaxdistill import sharding as sharding_lib
from jaxdistill.models import hub
from jaxdistill.models import safetensors_io as st
from jaxdistill.models.config import ModelConfig
from jaxdistill.models.config import rope_scaling_to_tuple
from jaxdistill.models.model import logical_axes
from jaxdistill.models.model import param_shapes

_ARCH = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
_MODEL_TYPE = {"llama": "llama", "qwen2": "qwen2"}
_HF_ARCH = {v: k for k, v in _ARCH.items()}

# HF tensor name -> our leaf path, and how the layouts relate:
#   'same': identical layout; 'flat': HF stores it flattened (biases);
#   int n: a kernel; HF stores [out, in], ours is [in dims (n) ..., out dims ...].
# '{i}' marks a per-layer tensor, stacked on our leading 'layers' axis.
KEY_TABLE = (
    ("model.embed_tokens.weight", "embed_tokens/embedding", "same"),
    ("lm_head.weight", "lm_head/kernel", 1),
    ("model.layers.{i}.input_layernorm.weight", "layers/input_layernorm/scale", "same"),
    ("model.layers.{i}.self_attn.q_proj.weight", "layers/self_attn/q_proj/kernel", 1),
    ("model.layers.{i}.self_attn.q_proj.bias", "layers/self_attn/q_proj/bias", "flat"),
    ("model.layers.{i}.self_attn.k_proj.weight", "layers/self_attn/k_proj/kernel", 1),
    ("model.layers.{i}.self_attn.k_proj.bias", "layers/self_attn/k_proj/bias", "flat"),
    ("model.layers.{i}.self_attn.v_proj.weight", "layers/self_attn/v_proj/kernel", 1),
    ("model.layers.{i}.self_attn.v_proj.bias", "layers/self_attn/v_proj/bias", "flat"),
    ("model.layers.{i}.self_attn.o_proj.weight", "layers/self_attn/o_proj/kernel", 2),
    ("model.layers.{i}.post_attention_layernorm.weight",
     "layers/post_attention_layernorm/scale", "same"),
    ("model.layers.{i}.mlp.gate_proj.weight", "layers/mlp/gate_proj/kernel", 1),
    ("model.layers.{i}.mlp.up_proj.weight", "layers/mlp/up_proj/kernel", 1),
    ("model.layers.{i}.mlp.down_proj.weight", "layers/mlp/down_proj/kernel", 1),
    ("model.norm.weight", "norm/scale", "same"),
)
# Present in some checkpoints, never needed.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

_DTYPE_NAMES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16",
                "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


# -- config.json ------------------------------------------------------------

def config_from_hf(d: dict, source: str = "config.json") -> ModelConfig:
  """ModelConfig from a HF config dict (either RoPE form); ValueError if bad."""
  if not isinstance(d, dict):
    raise ValueError(f"{source}: expected a JSON object")
  archs = d.get("architectures") or []
  family = None
  for a in archs:
    family = family or _ARCH.get(a)
  if family is None and archs:
    raise ValueError(f"{source}: unsupported architecture {archs}; supported: "
                     f"{sorted(_ARCH)}")
  if family is None:
    family = _MODEL_TYPE.get(d.get("model_type"))
    if family is None:
      raise ValueError(f"{source}: unsupported model_type "
                       f"{d.get('model_type')!r} (no 'architectures' either); "
                       f"supported: {sorted(_MODEL_TYPE)}")
  required = ("vocab_size", "hidden_size", "intermediate_size",
              "num_hidden_layers", "num_attention_heads")
  missing = [k for k in required if k not in d]
  if missing:
    raise ValueError(f"{source}: missing field(s) {missing}")
  if d.get("hidden_act", "silu") != "silu":
    raise ValueError(f"{source}: hidden_act {d['hidden_act']!r} unsupported "
                     f"(only 'silu')")
  if d.get("mlp_bias", False):
    raise ValueError(f"{source}: mlp_bias=true is unsupported")
  if family == "qwen2" and d.get("use_sliding_window", False):
    raise ValueError(f"{source}: use_sliding_window=true is unsupported")

  rope_params = dict(d.get("rope_parameters") or {})
  if rope_params and all(isinstance(v, dict) for v in rope_params.values()):
    raise ValueError(f"{source}: per-layer-type rope_parameters unsupported")
  theta = d.get("rope_theta", rope_params.get("rope_theta", 10000.0))
  scaling = d.get("rope_scaling")
  if scaling is None and rope_params.get(
      "rope_type", rope_params.get("type", "default")) != "default":
    scaling = rope_params
  if scaling is not None and scaling.get(
      "rope_type", scaling.get("type")) == "default":
    scaling = None

  heads = d["num_attention_heads"]
  eos = d.get("eos_token_id")
  dtype = _DTYPE_NAMES.get(str(d.get("dtype") or d.get("torch_dtype")),
                           "float32")
  try:
    cfg = ModelConfig(
        family=family,
        vocab_size=d["vocab_size"],
        hidden_size=d["hidden_size"],
        intermediate_size=d["intermediate_size"],
        num_hidden_layers=d["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=d.get("num_key_value_heads") or heads,
        head_dim=d.get("head_dim") or d["hidden_size"] // heads,
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        rope_scaling=rope_scaling_to_tuple(scaling),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        # transformers' Qwen2 attention always has q/k/v biases.
        attention_bias=True if family == "qwen2" else bool(
            d.get("attention_bias", False)),
        max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
        bos_token_id=d.get("bos_token_id"),
        eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
        dtype=dtype,
        param_dtype=dtype,
    )
    cfg.check_token_ids()
  except (ValueError, TypeError) as e:
    raise ValueError(f"{source}: {e}") from e
  return cfg


def config_to_hf(cfg: ModelConfig) -> dict:
  """HF config dict: classic rope_theta/rope_scaling (transformers 5 reads it)."""
  eos = list(cfg.eos_token_id)
  d = {
      "architectures": [_HF_ARCH[cfg.family]],
      "model_type": cfg.family,
      "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.hidden_size,
      "intermediate_size": cfg.intermediate_size,
      "num_hidden_layers": cfg.num_hidden_layers,
      "num_attention_heads": cfg.num_attention_heads,
      "num_key_value_heads": cfg.num_key_value_heads,
      "head_dim": cfg.head_dim,
      "hidden_act": "silu",
      "rms_norm_eps": cfg.rms_norm_eps,
      "rope_theta": cfg.rope_theta,
      "rope_scaling": cfg.rope_scaling_dict,
      "tie_word_embeddings": cfg.tie_word_embeddings,
      "max_position_embeddings": cfg.max_position_embeddings,
      "bos_token_id": cfg.bos_token_id,
      "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
      "torch_dtype": cfg.param_dtype,
      "use_cache": True,
  }
  if cfg.family == "llama":
    d.update(attention_bias=cfg.attention_bias, mlp_bias=False)
  else:
    if not cfg.attention_bias:
      raise ValueError("qwen2 checkpoints always have q/k/v biases; "
                       "cfg.attention_bias is False")
    d.update(use_sliding_window=False, sliding_window=None,
             max_window_layers=cfg.num_hidden_layers)
  return d


def read_config(path) -> ModelConfig:
  f = pathlib.Path(path) / "config.json"
  if not f.is_file():
    raise FileNotFoundError(f"config.json not found in {path}")
  try:
    d = json.loads(f.read_text())
  except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
    raise ValueError(f"{f}: malformed JSON: {e}") from None
  return config_from_hf(d, str(f))



EXPORT_DIR = hub.EXPORT_DIR

def generation_eos_ids(path) -> tuple[int, ...]:
  """The eos_token_id of <path>/generation_config.json, () without one
  (Llama 3 Instruct lists <|eot_id|> there, not in config.json)."""
  f = os.path.join(path, "generation_config.json")
  if not os.path.isfile(f):
    return ()
  with open(f) as fh:
    e = json.load(fh).get("eos_token_id")
  if e is None:
    return ()
  return tuple(int(x) for x in (e if isinstance(e, list) else [e]))

# -- tensor layout ------------------------------------------------------------

def _get(tree, path):
  for k in path.split("/"):
    tree = tree[k]
  return tree


def _leaves(cfg: ModelConfig):
  """(hf_name, path, kind, shape) for the leaves this config has."""
  shapes = param_shapes(cfg)
  out = []
  for hf, path, kind in KEY_TABLE:
    try:
      shape = tuple(_get(shapes, path).shape)
    except KeyError:
      continue
    out.append((hf, path, kind, shape))
  return out


def _hf_shape(kind, shape):
  if kind == "same":
    return shape
  if kind == "flat":
    return (math.prod(shape),)
  return (math.prod(shape[kind:]), math.prod(shape[:kind]))


def _to_ours(w, kind, shape):
  if kind in ("same", "flat"):
    return w.reshape(shape)
  return w.T.reshape(shape)


def _to_hf(x, kind, shape):
  if kind in ("same", "flat"):
    return x.reshape(_hf_shape(kind, shape))
  return x.reshape(math.prod(shape[:kind]), -1).T


def _pieces(cfg, hf, kind, shape, chunk_rows):
  """(hf_name, piece shape in our layout, start index, row range) for a leaf.

  Layers are one piece each; a big 2-D embedding / head is split into blocks
  of HF rows so that a block, not the whole matrix, is held on the host.
  """
  if "{i}" in hf:
    return [(hf.format(i=i), (1,) + shape[1:], (i,) + (0,) * (len(shape) - 1),
             None) for i in range(cfg.num_hidden_layers)]
  rows = _hf_shape(kind, shape)[0]
  if len(shape) != 2 or kind not in ("same", 1) or rows <= chunk_rows:
    return [(hf, shape, (0,) * len(shape), None)]
  out = []
  for r0 in range(0, rows, chunk_rows):
    r1 = min(rows, r0 + chunk_rows)
    piece = (r1 - r0, shape[1]) if kind == "same" else (shape[0], r1 - r0)
    start = (r0, 0) if kind == "same" else (0, r0)
    out.append((hf, piece, start, (r0, r1)))
  return out


# -- loading -------------------------------------------------------------------

def index_tensors(path: pathlib.Path) -> dict[str, st.TensorInfo]:
  index = path / "model.safetensors.index.json"
  single = path / "model.safetensors"
  if index.is_file():
    try:
      weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
      raise ValueError(f"{index}: malformed index ({e})") from e
    infos = {}
    for fname in sorted(set(weight_map.values())):
      header = st.read_header(str(path / fname))
      for name, file_ in weight_map.items():
        if file_ == fname:
          if name not in header:
            raise ValueError(f"{index}: tensor {name!r} is mapped to {fname} "
                             f"but that file does not contain it")
          infos[name] = header[name]
    return infos
  if single.is_file():
    return st.read_header(str(single))
  raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json "
                          f"in {path}")


def _want_shape(hf, kind, shape):
  """HF shape of one tensor (per layer for '{i}' names)."""
  return _hf_shape(kind, shape[1:] if "{i}" in hf else shape)


def _plan(cfg, infos, chunk_rows):
  """Validates every tensor up front; returns [(path, kind, shape, pieces)]."""
  plan, used = [], set()
  for hf, path, kind, shape in _leaves(cfg):
    want = _want_shape(hf, kind, shape)
    pieces = _pieces(cfg, hf, kind, shape, chunk_rows)
    for name in dict.fromkeys(p[0] for p in pieces):
      if name not in infos:
        raise ValueError(f"checkpoint is missing tensor {name!r} (shape {want}, "
                         f"for {path})")
      if tuple(infos[name].shape) != tuple(want):
        raise ValueError(f"tensor {name!r} has shape {infos[name].shape}, "
                         f"expected {want} from config.json")
      used.add(name)
    plan.append((path, kind, shape, pieces))
  extra = [n for n in infos if n not in used
           and not n.endswith(IGNORED_SUFFIXES)
           and not (n == "lm_head.weight" and cfg.tie_word_embeddings)]
  if extra:
    raise ValueError(f"checkpoint has {len(extra)} tensor(s) this "
                     f"{cfg.family} config does not use, e.g. {extra[:3]}")
  return plan


def _piece(w, kind, pshape, rows):
  """One HF tensor (or block of its rows) -> our layout, shaped `pshape`."""
  if rows is None:  # a whole tensor; a leading layer axis of 1 reshapes in
    return _to_ours(w, kind, pshape)
  return w if kind == "same" else w.T  # a block of rows of a 2-D matrix


def _dtype_name(x, arg):
  try:
    name = _DTYPE_NAMES.get(jnp.dtype(x).name)
  except TypeError:
    name = None
  if name is None:
    raise ValueError(f"{arg} must be float32, bfloat16 or float16, got {x!r}")
  return name


def _release_free_memory():
  """Returns freed heap pages to the OS (glibc keeps them by default).

  Pieces of varying sizes otherwise leave ~15% of the checkpoint size
  allocated-but-free in malloc arenas, which counts as resident memory.
  """
  if _LIBC is not None:
    _LIBC.malloc_trim(0)


try:
  _LIBC = ctypes.CDLL("libc.so.6")
  _LIBC.malloc_trim  # pylint: disable=pointless-statement
except (OSError, AttributeError):
  _LIBC = None


def _donated_writer(out_sharding):
  def write(buf, piece, *start):
    return lax.dynamic_update_slice(buf, piece, start)
  if out_sharding is None:
    return jax.jit(write, donate_argnums=0)
  return jax.jit(write, donate_argnums=0, out_shardings=out_sharding)


def check_pretrained(path) -> None:
  """What load_pretrained checks before reading a tensor (config.json, and
  every tensor's presence, shape and byte range within its file: a
  truncated download), without reading one, so that a command can refuse a
  bad checkpoint before it writes anything. Errors name the directory."""
  path = pathlib.Path(path)
  cfg = read_config(path)
  try:
    _plan(cfg, index_tensors(path), 1 << 30)
  except (ValueError, FileNotFoundError) as e:
    if str(path) in str(e):
      raise
    raise type(e)(f"{path}: {e}") from None


def load_pretrained(path, dtype=None, *, param_dtype=None, mesh=None,
                    rules=None, chunk_bytes: int = 16 << 20):
  """Reads a Hugging Face checkpoint; returns (ModelConfig, params).

  Args:
    path: directory with config.json and model.safetensors (or sharded files
      with model.safetensors.index.json), or a hub name `org/name[@revision]`
      (models.hub.resolve: fetched into, or found in, the Hugging Face cache).
    dtype: compute dtype ('float32' / 'bfloat16'); default: the checkpoint's.
    param_dtype: storage dtype of params; default: `dtype`, else checkpoint's.
    mesh: optional jax Mesh; each leaf is placed on the NamedSharding given by
      logical_axes(cfg) and `rules`.
    rules: logical-axis rules for `mesh` (the commands pass their run's,
      sharding.rules_from_config); default sharding.DEFAULT_RULES.
    chunk_bytes: host block size when splitting the embedding / output head.
  """
  if hub.is_hub_id(path):
    path = hub.resolve(path)[0]
  path = pathlib.Path(path)
  if not path.is_dir():
    raise FileNotFoundError(f"checkpoint directory not found: {path}")
  cfg = read_config(path)
  infos = index_tensors(path)
  ckpt_dtype = cfg.dtype
  emb = infos.get("model.embed_tokens.weight")
  if emb is not None and emb.dtype.name in _DTYPE_NAMES:
    ckpt_dtype = emb.dtype.name
  dtype = _dtype_name(dtype, "dtype") if dtype else ckpt_dtype
  param_dtype = _dtype_name(param_dtype, "param_dtype") if param_dtype else dtype
  cfg = dataclasses.replace(cfg, dtype=dtype, param_dtype=param_dtype)
  row_bytes = cfg.hidden_size * 4
  plan = _plan(cfg, infos, max(1, chunk_bytes // row_bytes))

  np_dtype = jnp.dtype(param_dtype)
  rules = sharding_lib.DEFAULT_RULES if rules is None else rules
  axes = logical_axes(cfg)
  params = {}
  files = {}
  nonfinite = []  # tensors holding NaN/inf: warned about, not refused

  def read(name, kind, pshape, rows):
    info = infos[name]
    if info.file not in files:
      files[info.file] = open(info.file, "rb")  # pylint: disable=consider-using-with
    w = st.read_rows(info, *(rows or (0, None)), f=files[info.file])
    if w.dtype.kind == "f" and name not in nonfinite and not np.isfinite(w).all():
      nonfinite.append(name)
    return _piece(w.astype(np_dtype, copy=False), kind, pshape, rows)

  try:
    for leaf_path, kind, shape, pieces in plan:
      leaf_axes = _get(axes, leaf_path)
      sh = None
      if mesh is not None:
        sh = jax.sharding.NamedSharding(
            mesh, sharding_lib.logical_to_spec(leaf_axes, shape, mesh, rules))
      nbytes = math.prod(shape) * np_dtype.itemsize
      if nbytes <= chunk_bytes:
        # Small leaf: assemble on the host, one transfer (no compiles).
        x = np.empty(shape, np_dtype)
        for name, pshape, start, rows in pieces:
          w = read(name, kind, pshape, rows)
          x[tuple(slice(s, s + n) for s, n in zip(start, pshape))] = w
        buf = jax.device_put(x, sh) if sh is not None else jnp.asarray(x)
        del x, w
      else:
        if sh is None:
          buf = jnp.zeros(shape, np_dtype)
        else:
          buf = jax.jit(lambda s=shape: jnp.zeros(s, np_dtype),
                        out_shardings=sh)()
        write = _donated_writer(sh)
        for name, pshape, start, rows in pieces:
          x = read(name, kind, pshape, rows)
          if sh is not None:
            x = jax.device_put(x, jax.sharding.NamedSharding(
                mesh, sharding_lib.logical_to_spec(leaf_axes, pshape, mesh,
                                                   rules)))
          buf = write(buf, x, *(np.int32(s) for s in start))
          # Bounds host memory: without it, reading runs ahead of the async
          # writes and pending pieces pile up.
          buf.block_until_ready()
          del x
          _release_free_memory()
      node = params
      keys = leaf_path.split("/")
      for k in keys[:-1]:
        node = node.setdefault(k, {})
      node[keys[-1]] = buf
  finally:
    for f in files.values():
      f.close()
  if nonfinite:
    logging.warning("%s: %d tensor(s) hold NaN or inf values: %s", path,
                    len(nonfinite), ", ".join(nonfinite[:5]) +
                    (" ..." if len(nonfinite) > 5 else ""))
  return cfg, params


# -- saving --------------------------------------------------------------------

# A traced index compiles once per leaf shape (x[i] with a Python int would
# compile once per layer).
_take_layer = jax.jit(lambda x, i: lax.dynamic_index_in_dim(x, i, 0, False))


def save_pretrained(cfg: ModelConfig, params, path, *,
                    max_shard_size: int = 5 * 10**9) -> None:
  """Writes config.json + model.safetensors (sharded with an index if large)."""
  path = pathlib.Path(path)
  os.makedirs(path, exist_ok=True)
  tensors = []  # (hf_name, hf_shape, dtype, path, kind, shape, layer)
  for hf, leaf_path, kind, shape in _leaves(cfg):
    try:
      leaf = _get(params, leaf_path)
    except KeyError as e:
      raise ValueError(f"params lack leaf {leaf_path!r} required by cfg") from e
    if tuple(leaf.shape) != shape:
      raise ValueError(f"params leaf {leaf_path!r} has shape {leaf.shape}, "
                       f"cfg expects {shape}")
    if "{i}" in hf:
      for i in range(cfg.num_hidden_layers):
        tensors.append((hf.format(i=i), _hf_shape(kind, shape[1:]), leaf.dtype,
                        leaf, kind, shape[1:], i))
    else:
      tensors.append((hf, _hf_shape(kind, shape), leaf.dtype, leaf, kind,
                      shape, None))
  # HF orders layers before the final norm and head; so do we.
  order = {"model.embed_tokens.weight": 0, "model.norm.weight": 2,
           "lm_head.weight": 3}
  tensors.sort(key=lambda t: order.get(t[0], 1))

  shards, size = [[]], 0
  for t in tensors:
    nbytes = math.prod(t[1]) * np.dtype(t[2]).itemsize
    if shards[-1] and size + nbytes > max_shard_size:
      shards.append([])
      size = 0
    shards[-1].append(t)
    size += nbytes
  by_name = {t[0]: t for t in tensors}

  def produce(name):
    _, _, _, leaf, kind, shape, layer = by_name[name]
    x = leaf if layer is None else _take_layer(leaf, np.int32(layer))
    return _to_hf(np.asarray(jax.device_get(x)), kind, shape)

  for stale in path.glob("model*.safetensors*"):
    stale.unlink()
  if len(shards) == 1:
    names = ["model.safetensors"]
  else:
    names = [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
             for k in range(len(shards))]
  for fname, shard in zip(names, shards):
    st.write_file(str(path / fname), [(t[0], t[1], t[2]) for t in shard],
                  produce)
  if len(shards) > 1:
    index = {"metadata": {"total_size": int(sum(
        math.prod(t[1]) * np.dtype(t[2]).itemsize for t in tensors))},
             "weight_map": {t[0]: fname for fname, shard in zip(names, shards)
                            for t in shard}}
    (path / "model.safetensors.index.json").write_text(
        json.dumps(index, indent=2))
  (path / "config.json").write_text(json.dumps(config_to_hf(cfg), indent=2))
  logging.info("saved %s checkpoint (%d tensors, %d file(s)) to %s",
               cfg.family, len(tensors), len(names), path)
