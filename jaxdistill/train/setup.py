"""The models a run's config names, before any training: their ModelConfigs
(from a Hugging Face directory or hub name, a preset or an init block), their params
placed on the mesh, and the vocabulary both models' logits share.

Shared by every command that loads config.student / config.teacher: train,
rl.train, train.teacher_cache, analysis and the sweep.
"""
from __future__ import annotations

import dataclasses
import functools

import jax

from jaxdistill import models
from jaxdistill import sharding
from jaxdistill.models import hub
from jaxdistill.models import lora
from jaxdistill.data import tokenizer as tok_lib
from jaxdistill.train import batches as train_batches


def checkpoint_path(mcfg, name: str, files=hub.MODEL_FILES) -> str | None:
  """The local directory config.<name> loads its weights from: its `path`
  (a directory, or a hub name resolved into the Hugging Face cache), or None
  for a randomly initialised model (`preset` or `init` given: `path` is then
  not read, models.hub.weights_spec). A training workdir is refused, naming
  its hf_student/ export."""
  spec = hub.weights_spec(mcfg)
  if spec is None:
    return None
  return hub.checkpoint_dir(spec, f"config.{name}.path", files=files)


def model_config(mcfg, name: str) -> models.ModelConfig:
  """The ModelConfig of config.student / config.teacher, without any weights.

  `preset` or `init` given: a randomly initialised model of those shapes
  (`path` is not read); else the checkpoint `path` names (a directory or a
  hub name org/name[@revision])."""
  overrides = dict(mcfg.get("overrides") or {})
  # Only the config (and tokenizer) of a hub name: its weights come when
  # they are loaded (load_params), after every check.
  path = checkpoint_path(mcfg, name, files=hub.CONFIG_FILES)
  if path:
    try:
      cfg = models.checkpoint.read_config(path)
    except (ValueError, KeyError, TypeError) as e:
      msg = str(e).strip("'\"")
      raise ValueError(f"config.{name}.path: {msg}"
                       if path in msg else f"config.{name}.path: {path}: {msg}"
                       ) from None
  elif mcfg.get("preset") or mcfg.get("init"):
    cfg = (models.get_preset(mcfg.preset) if mcfg.get("preset")
           else models.ModelConfig())
    cfg = dataclasses.replace(cfg, **dict(mcfg.get("init") or {}))
  else:
    raise ValueError(f"config.{name}.path: set it to a Hugging Face checkpoint "
                     "directory or hub name org/name[@revision] (or set "
                     f"config.{name}.preset/.init for a randomly initialised "
                     "model)")
  fields = dict(dtype=mcfg.dtype, param_dtype=mcfg.param_dtype)
  if mcfg.get("remat") is not None:
    fields["remat"] = remat_policy(mcfg.remat, cfg, name)
  return dataclasses.replace(cfg, **fields, **overrides)


# remat='auto' keeps the matrix products' outputs (recomputing only the
# cheap elementwise work in the backward pass) for students up to this many
# parameters, and recomputes whole layers above it: what fits the study's
# pairs on their slices (docs/tpu.md's fit table, python -m jaxdistill.bench.fit).
REMAT_AUTO_MAX_PARAMS = 1_000_000_000


def remat_policy(remat: str, cfg, name: str = "student") -> str:
  """The rematerialisation policy of config.<name>.remat (models.REMAT_POLICIES,
  or 'auto': by the model's size). It changes memory and time, not results."""
  if remat == "auto":
    n = models.num_params(models.param_shapes(cfg))
    return "dots_no_batch" if n <= REMAT_AUTO_MAX_PARAMS else "full"
  if remat not in models.REMAT_POLICIES:
    raise ValueError(f"config.{name}.remat: {remat!r} is not 'auto' or one of "
                     f"{models.REMAT_POLICIES}")
  return remat


def load_params(cfg, mcfg, mesh, rules, rng, name: str = "student"):
  """Params placed on the mesh: streamed from the checkpoint, or random init."""
  path = checkpoint_path(mcfg, name)
  if path:
    loaded_cfg, params = models.load_pretrained(
        path, dtype=cfg.param_dtype, mesh=mesh, rules=rules)
    del loaded_cfg
    return params
  shapes = jax.eval_shape(functools.partial(models.init, cfg), rng)
  shard = sharding.tree_shardings(models.logical_axes(cfg), mesh, rules, shapes)
  return jax.jit(functools.partial(models.init, cfg), out_shardings=shard)(rng)


def lora_config(mcfg, name: str = "student", cfg=None):
  """The lora.LoraConfig of config.<name>.lora, or None (absent, or rank 0 /
  None: the model itself is trained); with the model's `cfg`, also checked
  against it (lora.check_base)."""
  field = f"config.{name}.lora"
  lcfg = lora.from_config(mcfg.get("lora"), field)
  if cfg is not None:
    lora.check_base(cfg, lcfg, field)
  return lcfg


def frozen_base(cfg, lcfg, params, mesh, rules):
  """The base a LoRA run trains on, placed on the mesh: `params` as loaded,
  or quantised to NF4 (lcfg.base_quant, lora.quantize_base; the loaded
  copy is freed once the caller drops it)."""
  if lcfg.base_quant is None:
    return params
  shard = sharding.tree_shardings(lora.base_logical_axes(cfg, lcfg), mesh,
                                  rules, lora.base_shapes(cfg, lcfg))
  return jax.jit(functools.partial(lora.quantize_base, lcfg),
                 out_shardings=shard)(params)


def init_adapters(cfg, lcfg, mesh, rules, rng):
  """Fresh LoRA adapters (B = 0: the model as loaded) placed on the mesh."""
  shard = sharding.tree_shardings(lora.logical_axes(cfg, lcfg), mesh, rules,
                                  lora.shapes(cfg, lcfg))
  return jax.jit(functools.partial(lora.init, cfg, lcfg),
                 out_shardings=shard)(rng)


def check_weights(mcfg, name: str = "student") -> None:
  """Refuses the checkpoint `load_params` would read if its tensors are
  missing, mis-shaped or truncated: found before the workdir is written, not
  after. (A hub name's files are fetched by `revisions`, before this.)"""
  path = checkpoint_path(mcfg, name)
  if not path:
    return
  field = name if name == "kl.reference" else f"{name}.path"  # as revisions
  try:
    models.checkpoint.check_pretrained(path)
  except (ValueError, FileNotFoundError) as e:
    raise ValueError(f"config.{field}: {e}") from None


def revisions(config, names) -> dict:
  """{field: {'id', 'revision', 'commit'}} of the checkpoints among `names`
  ('student', 'teacher', 'tokenizer', 'kl.reference': fields of `config`)
  that the run takes from the hub: what a workdir records beside its
  config.json (train.loop.prepare_workdir), so that a result names exactly
  which weights made it."""
  out = {}
  for name in names:
    if name == "tokenizer":
      field, spec = "tokenizer", config.get("tokenizer")
    elif name == "kl.reference":
      field, spec = name, config.get("kl", {}).get("reference")
    else:
      field, spec = f"{name}.path", hub.weights_spec(config.get(name))
    if spec and hub.is_hub_id(spec):
      try:
        out[field] = hub.resolve(spec)[1]
      except hub.HubError as e:
        raise ValueError(f"config.{field}: {e}") from None
  return out


def shared_vocab(config, scfg, tcfg, tokenizer, teacher: str = "teacher") -> int:
  """The real vocabulary both models' logits are compared over (and rollouts
  sample from): config.loss.vocab_size, else len(tokenizer), else the models'
  common width. It must fit both models' embeddings (which may differ by
  padding). `teacher` names the second model in errors (GRPO: the policy's
  KL reference, 'kl.reference')."""
  explicit = config.get("loss", {}).get("vocab_size")
  field = "config.loss.vocab_size"
  if explicit:
    v = int(explicit)
  elif tokenizer is not None:
    v = len(tokenizer)
    field = "config.tokenizer"
  elif scfg.vocab_size == tcfg.vocab_size:
    v = scfg.vocab_size
  else:
    raise ValueError(
        f"config.loss.vocab_size: student vocab {scfg.vocab_size} and {teacher} "
        f"vocab {tcfg.vocab_size} differ and no tokenizer gives the real "
        "vocabulary; set loss.vocab_size to the shared real vocabulary size")
  if v > min(scfg.vocab_size, tcfg.vocab_size):
    raise ValueError(
        f"{field}: the real vocabulary ({v}) is larger than the student "
        f"({scfg.vocab_size}) or {teacher} ({tcfg.vocab_size}) vocabulary: "
        "the models do not share a tokenizer")
  return v


def compile_vocab(config, scfg, tcfg) -> int:
  """shared_vocab for a compile-only run, whose models may be presets with
  no tokenizer: config.loss.vocab_size, else the tokenizer's (when one is
  found), else the models' common width."""
  tokenizer = None
  if not config.get("loss", {}).get("vocab_size"):
    try:
      tokenizer = tok_lib.run_tokenizer(config)
    except (ValueError, OSError):
      tokenizer = None
  return shared_vocab(config, scfg, tcfg, tokenizer)


def init_keys(seed: int):
  """(student key, teacher key) of randomly initialised models: one rule for
  train, train.teacher_cache and analysis, so that the teacher a cache or an
  analysis uses is the teacher training would load."""
  s_key, t_key = jax.random.split(jax.random.fold_in(jax.random.key(seed), 1 << 20))
  return s_key, t_key


def pair_and_batches(config):
  """(student cfg, teacher cfg, tokenizer, shared vocabulary, batches) of a
  config with a student and a teacher, before any weights are loaded: where
  train.teacher_cache and analysis start."""
  scfg = model_config(config.student, "student")
  tcfg = model_config(config.teacher, "teacher")
  tokenizer = tok_lib.run_tokenizer(config)
  vocab = shared_vocab(config, scfg, tcfg, tokenizer)
  return scfg, tcfg, tokenizer, vocab, train_batches.make_batches(
      config, tokenizer, vocab)
