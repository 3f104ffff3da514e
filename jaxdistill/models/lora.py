"""LoRA adapters as a second parameter pytree beside the frozen base.

  lcfg = lora.LoraConfig(rank=256, alpha=256)
  adapters = lora.init(cfg, lcfg, rng)                        # float32, B = 0
  logits = models.apply(cfg, lora.attach(params, adapters, lcfg.scale), tokens)
  merged = lora.merge(params, adapters, lcfg.scale)           # W + s * A B

Each target projection's kernel [L, *in, *out] (models/model.py) gets

  lora_a [L, *in, r]   Kaiming-uniform, bound 1 / sqrt(fan_in) (peft's default)
  lora_b [L, r, *out]  zeros, so a fresh adapter leaves the model unchanged

and transformer.Linear adds scale * (x A) B to x W when its params hold
lora_a / lora_b. `attach` puts them there (B pre-multiplied by scale = alpha
/ r, so the model needs no LoRA setting): the base stays in its own dtype
(bf16) and only the adapters are differentiated, optimised and checkpointed.
No dropout and no bias, as the paper's runs (App. D).

peft's layout is the transpose of ours per layer: lora_A.weight [r, in],
lora_B.weight [out, r], delta W = B A scale in HF's [out, in]; `to_peft` /
`from_peft` convert, `save_peft` writes a directory peft loads.

Why not qwix (its LoraProvider, checked with qwix 0.1.8): it finds the
weights by intercepting `jax.lax.dot_general` / `jnp.einsum` calls inside
the modules, so our Linear's `@` is not seen; once rewritten as a
dot_general, its adapters come out in the base's dtype (bf16 adapters and
Adam updates for a bf16 base), flattened against the 2-D reshaped kernel,
and with logical axes taken by position from the 4-D kernel (o_proj's B got
'head_dim' for its embed axis), which our sharding rules would misplace.
This module is a few pure functions with the HF layout and our axis names.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill.config_lib import LORA_TARGETS
from jaxdistill.models import quant
from jaxdistill.models import safetensors_io as st
from jaxdistill.models.config import ModelConfig
from jaxdistill.models.model import logical_axes as model_logical_axes
from jaxdistill.models.model import param_shapes

# Target -> the sub-module that holds it (leaves layers/<module>/<target>/).
MODULES = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
           "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp",
           "down_proj": "mlp"}
TARGETS = tuple(MODULES)
assert TARGETS == LORA_TARGETS
# Leading kernel dims (after 'layers') that are inputs: o_proj is [N, H, D].
_N_IN = {"o_proj": 2}

# The logical name of the rank axis (sharding.DEFAULT_RULES: over fsdp where
# the adapter's other axes leave it free).
RANK_AXIS = "lora_rank"

PEFT_WEIGHTS = "adapter_model.safetensors"
PEFT_CONFIG = "adapter_config.json"


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """rank r, alpha (scale alpha / r), the target projections, the adapters'
  dtype (what they are trained and stored in)."""
  rank: int
  alpha: float
  targets: tuple[str, ...] = TARGETS
  dtype: str = "float32"
  # The frozen base's storage: None (as loaded) or 'nf4' (QLoRA: all seven
  # projections of every layer in 4 bits, models/quant.py).
  base_quant: str | None = None

  def __post_init__(self):
    object.__setattr__(self, "targets", tuple(self.targets))
    if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
      raise ValueError(f"lora.rank must be a positive int, got {self.rank!r}")
    if not float(self.alpha) > 0:
      raise ValueError(f"lora.alpha must be > 0, got {self.alpha!r}")
    bad = [t for t in self.targets if t not in MODULES]
    if bad or not self.targets or len(set(self.targets)) != len(self.targets):
      raise ValueError(f"lora.targets must be distinct names among {TARGETS}, "
                       f"got {list(self.targets)}")
    if jnp.dtype(self.dtype) not in (jnp.float32, jnp.bfloat16):
      raise ValueError(f"lora.dtype must be float32 or bfloat16, got "
                       f"{self.dtype!r}")
    quant.check_format(self.base_quant, "lora.base_quant")

  @property
  def scale(self) -> float:
    return float(self.alpha) / self.rank


def from_config(block, field: str = "config.student.lora") -> LoraConfig | None:
  """The LoraConfig of a config block {rank, alpha, targets, dtype,
  base_quant}; None
  when it is absent or its rank is 0 / None (LoRA off)."""
  if block is None or not block.get("rank"):
    if block is not None and block.get("base_quant") is not None:
      # Without adapters nothing would train on the quantised base: the run
      # would train the whole model in its own dtype instead, silently.
      raise ValueError(f"{field}.base_quant: {block.get('base_quant')!r} holds "
                       "the frozen base of a LoRA run; set "
                       f"{field}.rank too (or base_quant None)")
    return None
  try:
    return LoraConfig(rank=block["rank"], alpha=float(block.get("alpha", block["rank"])),
                      targets=_names(block.get("targets")) or TARGETS,
                      dtype=block.get("dtype") or "float32",
                      base_quant=block.get("base_quant"))
  except (ValueError, TypeError) as e:
    raise ValueError(f"{field}: {e}") from None


def _names(targets) -> tuple:
  """targets as a tuple of names; a string (or an element) may list several
  names split by commas ("q_proj,v_proj", as typed on a command line)."""
  if targets is None:
    return ()
  if isinstance(targets, str):
    targets = (targets,)
  return tuple(n.strip() for t in targets
               for n in (t.split(",") if isinstance(t, str) else (t,))
               if not isinstance(n, str) or n.strip())


def check_base(cfg: ModelConfig, lcfg: LoraConfig | None,
               field: str = "config.student.lora") -> None:
  """Refuses a base_quant this model's projections cannot take: NF4 packs
  blocks of quant.BLOCK inputs, so every projection's input size must be a
  multiple of it (Llama 3's and Qwen2.5's are)."""
  if lcfg is None or lcfg.base_quant is None:
    return
  for t in MODULES:
    n_in = math.prod(_kernel_dims(cfg, t)[0])
    if n_in % quant.BLOCK:
      raise ValueError(
          f"{field}.base_quant: {lcfg.base_quant!r} quantises blocks of "
          f"{quant.BLOCK} inputs, and this model's {t} projection has {n_in} "
          f"inputs, not a multiple of {quant.BLOCK} (hidden_size, "
          "intermediate_size and the attention heads' widths must be; or set "
          f"{field}.base_quant None)")


def _path(target):
  return ("layers", MODULES[target], target)


def _get(tree, path):
  for k in path:
    tree = tree[k]
  return tree


def _kernel_dims(cfg: ModelConfig, target):
  """(in dims, out dims) of a target's kernel, without the 'layers' axis."""
  shape = tuple(_get(param_shapes(cfg), _path(target))["kernel"].shape[1:])
  n = _N_IN.get(target, 1)
  return shape[:n], shape[n:]


def _check(cfg, lcfg):
  if not isinstance(cfg, ModelConfig):
    raise ValueError(f"cfg must be a ModelConfig, got {type(cfg).__name__}")
  if not isinstance(lcfg, LoraConfig):
    raise ValueError(f"lcfg must be a LoraConfig, got {type(lcfg).__name__}")


def init(cfg: ModelConfig, lcfg: LoraConfig, rng: jax.Array) -> dict:
  """Fresh adapters: A ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (peft's
  kaiming_uniform_(a=sqrt(5))), B = 0; in lcfg.dtype."""
  _check(cfg, lcfg)
  out = {}
  for i, t in enumerate(lcfg.targets):
    d_in, d_out = _kernel_dims(cfg, t)
    layers = cfg.num_hidden_layers
    bound = 1.0 / math.sqrt(math.prod(d_in))
    a = jax.random.uniform(jax.random.fold_in(rng, i),
                           (layers, *d_in, lcfg.rank), jnp.float32,
                           -bound, bound).astype(lcfg.dtype)
    b = jnp.zeros((layers, lcfg.rank, *d_out), lcfg.dtype)
    _put(out, _path(t), {"lora_a": a, "lora_b": b})
  return out


def _put(tree, path, leaf):
  for k in path[:-1]:
    tree = tree.setdefault(k, {})
  tree[path[-1]] = leaf


def shapes(cfg: ModelConfig, lcfg: LoraConfig):
  """Adapters as jax.ShapeDtypeStructs; nothing allocated."""
  return jax.eval_shape(lambda k: init(cfg, lcfg, k), jax.random.key(0))


def logical_axes(cfg: ModelConfig, lcfg: LoraConfig) -> dict:
  """Like `shapes`, leaves the logical axis names: A keeps the kernel's
  input axes, B its output axes; the rank axis is RANK_AXIS."""
  _check(cfg, lcfg)
  return _adapter_axes(cfg, lcfg.targets)


def _adapter_axes(cfg, targets):
  axes = model_logical_axes(cfg)
  out = {}
  for t in targets:
    names = tuple(_get(axes, _path(t))["kernel"])  # ('layers', *in, *out)
    n = 1 + _N_IN.get(t, 1)
    _put(out, _path(t), {"lora_a": names[:n] + (RANK_AXIS,),
                         "lora_b": (names[0], RANK_AXIS) + names[n:]})
  return out


def params_logical_axes(cfg: ModelConfig, params):
  """models.logical_axes(cfg), with the adapters' axes beside the kernels
  that `params` (maybe from `attach`) holds adapters for."""
  targets = [t for t in TARGETS if "lora_a" in params["layers"].get(
      MODULES[t], {}).get(t, {})]
  axes = model_logical_axes(cfg)
  if any(quant.is_quantized(params["layers"].get(MODULES[t], {}).get(t))
         for t in TARGETS):
    axes = _quantized_axes(axes)
  if not targets:
    return axes
  return attach(axes, _adapter_axes(cfg, targets), None)


# -- a quantised frozen base (QLoRA) ---------------------------------------------

def _n_in_dims(target):
  return _N_IN.get(target, 1)


def _quantized_axes(axes):
  """models.logical_axes with every projection's kernel axes replaced by
  those of its NF4 codes and absmaxes (quant.leaf_axes)."""
  layers = dict(axes["layers"])
  for t in TARGETS:
    m = MODULES[t]
    sub = dict(layers[m])
    k = sub[t]["kernel"]
    leaf = {n: v for n, v in sub[t].items() if n != "kernel"}
    ax = quant.leaf_axes(k, _n_in_dims(t))
    sub[t] = {**leaf, quant.CODES: ax, quant.ABSMAX: ax}
    layers[m] = sub
  return {**axes, "layers": layers}


def quantize_base(lcfg: LoraConfig, params):
  """The frozen base a LoRA run trains on: `params` as given, or, with
  lcfg.base_quant 'nf4', every layer's seven projections in NF4 (what
  bitsandbytes' load_in_4bit quantises: every linear layer but the head)."""
  if lcfg.base_quant is None:
    return params
  return quant.quantize_params(params, MODULES, _n_in_dims)


def base_shapes(cfg: ModelConfig, lcfg: LoraConfig):
  """The frozen base's ShapeDtypeStructs (quantize_base of the loaded
  params); nothing allocated."""
  return jax.eval_shape(lambda p: quantize_base(lcfg, p), param_shapes(cfg))


def base_logical_axes(cfg: ModelConfig, lcfg: LoraConfig):
  axes = model_logical_axes(cfg)
  return axes if lcfg.base_quant is None else _quantized_axes(axes)


def dequantize_base(cfg: ModelConfig, params, dtype):
  """params with every NF4 kernel dequantised to `dtype` in its model shape
  (what transformer.Linear computes from it); other params as given."""
  shapes = param_shapes(cfg)
  return quant.dequantize_params(
      params, dtype, lambda m, t: shapes["layers"][m][t]["kernel"].shape)


def _targets_of(adapters):
  return [(m, t) for m, sub in adapters.get("layers", {}).items()
          for t in sub]


def attach(params, adapters, scale: float | None):
  """params with each adapted projection's lora_a and scale * lora_b beside
  its kernel: what transformer.Linear reads. Pure; differentiable in both.
  `scale` None attaches B as given (trees of shapes or shardings)."""
  layers = dict(params["layers"])
  for m, t in _targets_of(adapters):
    ad = adapters["layers"][m][t]
    b = ad["lora_b"]
    if scale is not None:
      b = b * jnp.asarray(scale, b.dtype)
    sub = dict(layers[m])
    sub[t] = {**sub[t], "lora_a": ad["lora_a"], "lora_b": b}
    layers[m] = sub
  return {**params, "layers": layers}


def delta(adapter, scale: float) -> jax.Array:
  """scale * A B in the kernel's layout [L, *in, *out], float32."""
  a = adapter["lora_a"].astype(jnp.float32)
  b = adapter["lora_b"].astype(jnp.float32)
  lay, r = a.shape[0], a.shape[-1]
  d = jnp.einsum("lir,lro->lio", a.reshape(lay, -1, r), b.reshape(lay, r, -1))
  return (scale * d).reshape(a.shape[:-1] + b.shape[2:])


def merge(params, adapters, scale: float):
  """params with W + scale * A B in every adapted kernel, summed in float32
  and rounded once to the kernel's dtype (for the Hugging Face export)."""
  layers = dict(params["layers"])
  for m, t in _targets_of(adapters):
    sub = dict(layers[m])
    w = sub[t]["kernel"]
    merged = w.astype(jnp.float32) + delta(adapters["layers"][m][t], scale)
    sub[t] = {**sub[t], "kernel": merged.astype(w.dtype)}
    layers[m] = sub
  return {**params, "layers": layers}


def merge_base(cfg: ModelConfig, params, adapters, scale: float):
  """`merge` for any frozen base. An NF4 one (a QLoRA base) is first
  dequantised to cfg.param_dtype, the weights its forward used
  (transformer.Linear; bitsandbytes dequantises to the dtype the weights
  were loaded in), then merged as such a base: the export is the model
  trained."""
  if any(quant.is_quantized(params["layers"].get(MODULES[t], {}).get(t))
         for t in TARGETS):
    params = dequantize_base(cfg, params, jnp.dtype(cfg.param_dtype))
  return merge(params, adapters, scale)


# -- peft's layout --------------------------------------------------------------

def _peft_name(i, m, t, ab):
  return f"base_model.model.model.layers.{i}.{m}.{t}.lora_{ab}.weight"


def to_peft(adapters) -> dict[str, np.ndarray]:
  """{peft tensor name: array}: lora_A.weight [r, in], lora_B.weight [out, r]
  per layer (HF's flattening of the head dims), host NumPy."""
  out = {}
  for m, t in _targets_of(adapters):
    a = np.asarray(jax.device_get(adapters["layers"][m][t]["lora_a"]))
    b = np.asarray(jax.device_get(adapters["layers"][m][t]["lora_b"]))
    r = a.shape[-1]
    for i in range(a.shape[0]):
      out[_peft_name(i, m, t, "A")] = np.ascontiguousarray(a[i].reshape(-1, r).T)
      out[_peft_name(i, m, t, "B")] = np.ascontiguousarray(b[i].reshape(r, -1).T)
  return out


def from_peft(cfg: ModelConfig, lcfg: LoraConfig, tensors) -> dict:
  """Adapters from peft tensors (names as `to_peft`, the prefix
  'base_model.model.' optional), in lcfg.dtype; ValueError naming a
  missing or mis-shaped tensor."""
  _check(cfg, lcfg)
  tensors = {k if k.startswith("base_model.model.") else
             "base_model.model." + k: v for k, v in tensors.items()}
  out = {}
  for t in lcfg.targets:
    d_in, d_out = _kernel_dims(cfg, t)
    r, m = lcfg.rank, MODULES[t]
    want = {"A": (r, math.prod(d_in)), "B": (math.prod(d_out), r)}
    got = {}
    for ab, shape in want.items():
      rows = []
      for i in range(cfg.num_hidden_layers):
        name = _peft_name(i, m, t, ab)
        if name not in tensors:
          raise ValueError(f"peft adapters: missing tensor {name!r}")
        x = np.asarray(tensors[name], np.float32)
        if x.shape != shape:
          raise ValueError(f"peft adapters: {name} has shape {x.shape}, "
                           f"expected {shape}")
        rows.append(x.T)
      got[ab] = np.stack(rows)
    _put(out, _path(t), {
        "lora_a": jnp.asarray(got["A"].reshape(-1, *d_in, r), lcfg.dtype),
        "lora_b": jnp.asarray(got["B"].reshape(-1, r, *d_out), lcfg.dtype)})
  return out


def save_peft(directory: str, lcfg: LoraConfig, adapters, *,
              base_model: str | None = None, revision: str | None = None) -> str:
  """Writes the adapters as a peft adapter directory (adapter_model.safetensors
  + adapter_config.json: r, lora_alpha, target_modules, no dropout, no bias),
  loadable with peft.PeftModel.from_pretrained(base, directory)."""
  os.makedirs(directory, exist_ok=True)
  tensors = to_peft(adapters)
  st.write_file(os.path.join(directory, PEFT_WEIGHTS),
                [(k, v.shape, np.float32) for k, v in tensors.items()],
                tensors.__getitem__)
  conf = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lcfg.rank,
          "lora_alpha": float(lcfg.alpha), "lora_dropout": 0.0, "bias": "none",
          "target_modules": list(lcfg.targets), "fan_in_fan_out": False,
          "use_rslora": False, "init_lora_weights": True,
          "base_model_name_or_path": base_model, "revision": revision,
          "inference_mode": True}
  with open(os.path.join(directory, PEFT_CONFIG), "w") as f:
    json.dump(conf, f, indent=2, sort_keys=True)
  return directory
