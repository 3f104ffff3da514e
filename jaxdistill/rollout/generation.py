"""`generate`: KV-cache rollouts from the student, the teacher, or both: the
paper's spectrum pi_lambda ('spectrum', rollout/spectrum.py) or a token-level
coin flip between them ('coin_mixture').

Layout of a `Rollout` (P = prompt width as passed, N = max_new_tokens):

  tokens        [B, P+N] int32: the left-padded prompt, then the N response
                slots; slots after a row's end hold pad_token_id.
  prompt_mask   [B, P]   int32: 1 on real prompt tokens (as passed).
  response_mask [B, N]   int32: 1 on generated tokens up to and including the
                row's EOS, 0 after it (and on slots never generated).
  logprobs      [B, N]   float32: log-prob of each generated token under the
                distribution of the MODEL THAT SAMPLED IT (after temperature /
                top-k / top-p; for greedy the raw model log_softmax). 0 where
                response_mask is 0. For a coin mixture this is NOT the
                probability of the token under the policy that generated the
                rollout: use behaviour_logprobs for importance weights. For the
                spectrum, log pi_lambda (no single model sampled it).
  behaviour_logprobs [B, N] float32: log-prob of each token under the policy
                that generated the rollout: for 'spectrum' log pi_lambda;
                for 'coin_mixture' the mixture
                log(lam q'(y) + (1 - lam) p'(y)), q' and p' the student's and
                teacher's sampling distributions (tempered and truncated like
                the sampler; for greedy, their raw log_softmax); for
                'student' / 'teacher' equal to logprobs. 0 where
                response_mask is 0.
  from_student  [B, N]   bool: the student sampled this token (spectrum:
                True on every token when lambda >= 1, the student-anchored
                policies, else False).
  lengths       [B]      int32: generated tokens per row (incl. EOS).
  ended         [B]      bool: the row emitted an EOS (else it hit N).
  student_fraction []    float32: realised share of student tokens among all
                generated tokens of the batch.

`attention_mask` = [prompt_mask, response_mask] ([B, P+N]) is what both
models should see in training; `loss_mask` marks the response tokens. With
causal LM logits, the token in column c is predicted by the logits of column
c - 1.

Models are (config, params) pairs of `jaxdistill.models`. Sampling is over
the first `vocab_size` ids (pass the real vocabulary, len(tokenizer): config
widths include embedding padding that the tokenizer does not have); by
default over the smallest width of the models given, so that with both a
student and a teacher it is restricted to their common ids
(Qwen2.5 sizes pad their embeddings differently) and the default EOS set is the
union of both configs' eos_token_id, whatever the policy, so that the end
points (coin_mixture lam = 1 and 0, spectrum lam = +1 and -1) reproduce the
pure policies exactly.

A teacher with a prompt of its own (`teacher_prompts`, the paper's style
transfer, App. D.7): the teacher's KV cache is prefilled from its left-padded
prompt, the student's from `prompts`; the generated tokens are shared, so
`tokens` holds the student's prompt and the response, and the teacher's
sequence is [teacher_prompts | tokens[:, P:]].

Temperatures: `temperature` is the student's, `teacher_temperature` the
teacher's (default: the same). Each model's distribution is its logits divided
by its own temperature, in every policy (the paper: teacher 0.5, student 1.0).

Compilation: one program per (policy, model configs, B, P, N, greedy or not,
top_k, top-p on or off, EOS ids, pad id, cache length, mesh). The rng, row
ids, lam, temperature and the top_p value are traced, so sweeping them does
not recompile; pad prompts to a width bucket (`pad_prompts`, or `bucket=`) so
that nearby prompt widths share a program. RNG guarantees: see loop.py.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
import dataclasses
import functools
import math

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import NamedSharding
import numpy as np

from jaxdistill import choices
from jaxdistill import compile_only
from jaxdistill import models
from jaxdistill import sharding
from jaxdistill.models import flops
from jaxdistill.models import lora
from jaxdistill.rollout import loop
from jaxdistill.rollout import prompts as prompts_lib
from jaxdistill.rollout import sampling
from jaxdistill.rollout import spectrum as spectrum_lib

POLICIES = choices.ROLLOUT_POLICIES


TWO_MODEL_POLICIES = ("coin_mixture", "spectrum")

# 'auto' decodes a model from a whole copy on each chip only when its
# weights in the compute dtype take at most this share of a chip's memory,
# else tensor-parallel (resolve_layout). Every chip reads a replicated copy
# whole on every step, so it pays only for models so small that the tp
# layout's per-layer collectives would cost more than the reads (not
# modelled: chosen). Compiled for v5e-8 (docs/tpu.md): Qwen2.5-1.5B's
# student rollout binds at 2.11 s replicated, 0.48 s tp.
REPLICATE_SHARE = 0.02


def policy_lam(rollout_config) -> float | None:
  """The `lam` argument of `generate` for a rollout config (fields `policy`,
  `lam`): float(lam) for the two-model policies, None for the others."""
  if rollout_config.policy in TWO_MODEL_POLICIES:
    return float(rollout_config.lam)
  return None


# The spectrum's endpoints: there pi_lambda is one model's own tempered
# policy, drawn without top-k / top-p (loop.py), so that model's one-model
# program decodes the same tokens without running the other model.
ENDPOINTS = {-1.0: "teacher", 1.0: "student"}


def sampling_policy(rollout_config) -> tuple:
  """(policy, lam, top_k, top_p) that `generate` is called with for a
  rollout config: its own, except at the spectrum's endpoints (lam -1 / +1),
  which run the pure teacher / student program with no top-k or top-p:
  the same tokens and log-probs (tests/rollout/spectrum_test.py), one model."""
  ro = rollout_config
  lam = policy_lam(ro)
  if ro.policy == "spectrum" and lam in ENDPOINTS:
    return ENDPOINTS[lam], None, None, None
  return ro.policy, lam, ro.get("top_k"), ro.get("top_p")


@flax.struct.dataclass
class Rollout:
  """A batch of rollouts (a pytree); field layout in the module docstring."""
  tokens: jax.Array
  prompt_mask: jax.Array
  response_mask: jax.Array
  logprobs: jax.Array
  from_student: jax.Array
  lengths: jax.Array
  ended: jax.Array
  student_fraction: jax.Array
  behaviour_logprobs: jax.Array | None = None

  @property
  def prompt_len(self) -> int:
    return self.prompt_mask.shape[1]

  @property
  def attention_mask(self):
    """[B, P+N] int32: real prompt and generated tokens."""
    return jnp.concatenate([self.prompt_mask, self.response_mask], axis=1)

  @property
  def loss_mask(self):
    """[B, P+N] int32: the generated tokens only."""
    return jnp.concatenate(
        [jnp.zeros_like(self.prompt_mask), self.response_mask], axis=1)


def _constrainer(mesh, rules, cfgs):
  """Sharding constraints for the loop state (batch over the data axes)."""
  if mesh is None:
    return lambda s: s

  def batch(x):
    spec = sharding.logical_to_spec(("batch",) + (None,) * (x.ndim - 1),
                                    x.shape, mesh, rules)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

  def constrain(s: loop.LoopState) -> loop.LoopState:
    caches = tuple(
        jax.lax.with_sharding_constraint(
            c, sharding.tree_shardings(models.cache_logical_axes(cfg), mesh,
                                       rules, c))
        for cfg, c in zip(cfgs, s.caches))
    return s.replace(
        tokens=batch(s.tokens), logprobs=batch(s.logprobs),
        behaviour_logprobs=batch(s.behaviour_logprobs),
        from_student=batch(s.from_student), mask=batch(s.mask),
        done=batch(s.done), logits=tuple(batch(l) for l in s.logits),
        caches=caches)
  return constrain


def resolve_layout(cfg, layout: str, mesh: Mesh | None) -> str:
  """The decode layout ('train', 'replicated' or 'tp'; sharding.decode_rules)
  a model of `cfg` takes for `layout` (sharding.DECODE_LAYOUTS) on `mesh`.
  'auto': 'train' without a mesh, on one device, or where a device's memory
  is not known (CPU), so CPU runs keep their programs; else 'replicated' when
  the weights in the compute dtype take at most REPLICATE_SHARE of it, else
  'tp'."""
  if layout not in sharding.DECODE_LAYOUTS:
    raise ValueError(f"decode_layout: expected one of "
                     f"{sharding.DECODE_LAYOUTS}, got {layout!r}")
  if mesh is None or mesh.devices.size == 1:
    return "train"
  if layout != "auto":
    return layout
  hbm = compile_only.device_hbm_bytes(mesh.devices.flat[0])
  if hbm is None:
    return "train"
  weights = decode_weight_bytes(cfg, "replicated", mesh)
  return "replicated" if weights <= REPLICATE_SHARE * hbm else "tp"


def decode_weight_bytes(cfg, layout, mesh) -> float:
  """Weight bytes a chip reads per decode step in a decode layout
  (resolve_layout): 'train' every weight gathered whole, as stored;
  'replicated' its whole compute-dtype copy; 'tp' that copy's share over
  the model axes (sharding.decode_rules; the few replicated pieces, norms
  and kv heads the axes do not divide, are left out)."""
  if layout == "train":
    return flops.weight_bytes(cfg)
  copy = flops.weight_bytes(dataclasses.replace(cfg, param_dtype=cfg.dtype))
  if layout == "replicated":
    return copy
  return copy / (mesh.devices.size // mesh.shape["data"])


def _decode_params(cfg, params, layout, mesh, rules):
  """(params of the output head, params of the steps) a model decodes from,
  made once per rollout (not per token): outside 'train', a copy in the
  compute dtype (what every use of a weight in models/ casts it to first,
  so the logits do not change) placed by the decode layout
  (sharding.decode_shardings), so that the decode steps read weights in
  place and move only activations between chips."""
  if layout == "train":
    return params, params
  dtype = jnp.dtype(cfg.dtype)
  # An NF4 base (a QLoRA run) decodes from its dequantised weights: the
  # values transformer.Linear computes from the codes at every use.
  params = lora.dequantize_base(cfg, params, jnp.dtype(cfg.param_dtype))
  params = jax.tree.map(
      lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating)
      else x, params)
  wsc = jax.lax.with_sharding_constraint
  placed = wsc(params, sharding.decode_shardings(
      lora.params_logical_axes(cfg, params), mesh, rules, layout, params))
  if layout != "tp":
    return placed, placed
  # The steps look token ids up in the embedding: from a table split over
  # its vocab rows the TPU compiler gathers the whole table every step (the
  # compile of Qwen2.5-1.5B, tied: 0.4 GB a step per chip); split over the
  # embedding dim, each chip takes its columns of the rows, and the [B, D]
  # activations are gathered. The head keeps the vocab split.
  emb = params["embed_tokens"]["embedding"]
  split = wsc(emb, NamedSharding(mesh, sharding.logical_to_spec(
      ("vocab", "embed"), emb.shape, mesh, sharding.embed_split_rules(rules))))
  return placed, {**placed, "embed_tokens": {**placed["embed_tokens"],
                                             "embedding": split}}


def _head(cfg, params, vocab, platform, whole=False):
  """(output projection, its einsum, None | the vocab to cut the logits
  to), restricted to the sampling vocab.

  `whole` (a decode layout splits the head over its vocab rows): the head
  is kept whole and its logits are cut instead, so that no cut of the split
  rows (151,665 of 151,936: not divisible by 8) moves the head between
  chips inside the decode loop.

  XLA:CPU's skinny matmuls read a [V, D] matrix (contracting dim minor) 2-3x
  faster than the [D, V] lm_head kernel, and the head is most of the bytes a
  small model reads per step; so on CPU an untied head is transposed once per
  rollout (outside the loop). Tied heads are the [V, D] embedding already.
  On accelerators the kernel is used as stored (a copy would only cost memory).
  """
  keep = vocab if whole else None
  if cfg.tie_word_embeddings:
    table = params["embed_tokens"]["embedding"]  # [V, D]
    return (table if whole else table[:vocab]), "BD,VD->BV", keep
  head = models.output_head(cfg, params)  # [D, V]
  if not whole:
    head = head[:, :vocab]
  if platform == "cpu":
    return head.T, "BD,VD->BV", keep
  return head, "BD,DV->BV", keep


def _logits(hidden, head):
  # hidden [B, D] in the compute dtype -> float32 logits [B, V], as apply().
  w, eq, keep = head
  out = jnp.einsum(eq, hidden, w.astype(hidden.dtype),
                   preferred_element_type=jnp.float32)
  return out if keep is None else out[:, :keep]


def _hoisted_layers(cfg, params, platform):
  """(config, params builder) for decode steps, with per-layer weights
  sliced once per rollout instead of once per token on CPU.

  The models scan over stacked [L, ...] layer weights, and XLA:CPU copies
  each layer's slice out of the stack on every decode step (all layer
  weights written and read again per token). With the layer scan unrolled
  (scan_unroll = L) and the stack rebuilt inside the loop from slices taken
  before it, XLA folds slice(stack(...)) back to those loop-invariant slices:
  ~20% less time per decode step on the benchmark model. Accelerators fuse
  the slice into the matmul, so there the params are used as they are.
  """
  layers = params.get("layers") if isinstance(params, dict) else None
  n = cfg.num_hidden_layers
  if (platform != "cpu" or not isinstance(layers, dict)
      or any(jnp.shape(x)[:1] != (n,) for x in jax.tree.leaves(layers))):
    return cfg, lambda: params
  per_layer = [jax.tree.map(lambda x, i=i: x[i], layers) for i in range(n)]
  return dataclasses.replace(cfg, scan_unroll=n), lambda: {
      **params, "layers": jax.tree.map(lambda *xs: jnp.stack(xs), *per_layer)}


# Prompt positions per prefill pass. The prefill's attention scores are
# float32 [B, heads, T, cache slots] and XLA holds two of them per layer (the
# scores and their softmax): for Qwen2.5-7B's 28 heads at 4 rows per chip,
# T = 2,048 and 3,071 slots, 2 x 2.6 GiB of a v5e chip's 16. In passes of
# 512 positions it is a quarter of that, for a weight pass per chunk (4 per
# prompt, against one per generated token): the teacher rollout of
# Qwen2.5-1.5B <- 7B at 1,024-token completions needs 8.0 GiB per chip of a
# v5e-8 instead of 15.3 (compile_only). Each real token's query attends over
# the same cached keys either way (a left-padding query, masked out of every
# other, averages over whatever slots are written so far).
PREFILL_CHUNK = 512


def _prefill(cfg, params, tokens, mask, cache):
  """The prompt [B, P] written into `cache` in passes of at most
  PREFILL_CHUNK positions (the first pass takes the remainder) -> (the last
  column's hidden state [B, D], cache)."""
  t = tokens.shape[1]
  n = -(-t // PREFILL_CHUNK)
  first = t - (n - 1) * PREFILL_CHUNK

  def run(tok, m, cache):
    hidden, cache = models.apply(cfg, params, tok, m, cache=cache,
                                 return_hidden=True)  # [B, T, D]
    return hidden[:, -1], cache

  last, cache = run(tokens[:, :first], mask[:, :first], cache)
  if n == 1:
    return last, cache

  def chunk(i, carry):
    start = first + i * PREFILL_CHUNK
    cut = lambda x: jax.lax.dynamic_slice_in_dim(x, start, PREFILL_CHUNK, 1)
    return run(cut(tokens), cut(mask), carry[1])

  # Static bounds: a scan, so compile_only counts its FLOPs n - 1 times.
  return jax.lax.fori_loop(0, n - 1, chunk, (last, cache))


def _step_fn(cfg, params, head, platform, shard=None):
  """One decode step's (logits [B, V], cache) from (cache, tokens [B]);
  `shard`: the activation pins of a 'tp' decode layout (_decode_shard)."""
  cfg, build = _hoisted_layers(cfg, params, platform)

  def step(cache, tok):
    hidden, cache = models.apply(cfg, build(), tok[:, None], cache=cache,
                                 return_hidden=True, shard=shard)  # [B, 1, D]
    return _logits(hidden[:, 0], head), cache
  return step


# Whether CPU decode steps take the 'tp' activation pins (tests set it;
# read when a program is made). XLA:CPU hoists the weights' gathers out of
# the decode loop by itself, and its matmul kernels round differently at
# other rows per device: unpinned, a CPU rollout in 'tp' keeps the 'train'
# layout's tokens and its log-probs within 1e-6 (the parity tests);
# pinned, in bf16 compute, its log-probs move by up to 2e-2 and greedy
# tokens can flip (in float32 they agree: the pinned parity test).
# Accelerators always take them.
PIN_CPU = False


def _decode_shard(layout, mesh, rules, pin_cpu=False):
  """The activation pins of a decode step: under 'tp' on an accelerator
  (or with `pin_cpu`, PIN_CPU when the program was made),
  sharding.DecodeActivations (weights read in place, attention
  data-parallel over the KV cache's rows); else none (the 'train' layout
  keeps the programs it had; 'replicated' has every weight on every chip).
  The prefill is not pinned: there the TPU compiler gathers each layer's
  weights once per prefill pass (Qwen2.5-1.5B, 32 rows of 512 positions
  on a v5e-8: about 104 MB a layer into each chip)."""
  if layout != "tp" or (sharding.platform(mesh) == "cpu" and not pin_cpu):
    return None
  return sharding.DecodeActivations(
      mesh, tuple(rules), tp_rules=sharding.decode_activation_rules(rules))


@functools.partial(
    jax.jit,
    static_argnames=("cfgs", "student_index", "max_new_tokens", "sampler",
                     "eos_ids", "pad_id", "vocab", "cache_len", "mesh",
                     "rules", "combine", "layouts", "pin_cpu"))
def _rollout(params, prompts, prompt_mask, rng, row_ids, lam, temperature,
             top_p, teacher_prompts=None, *, cfgs, student_index, max_new_tokens, sampler, eos_ids,
             pad_id, vocab, cache_len, mesh, rules, combine="coin_mixture",
             layouts=None, pin_cpu=False):
  # temperature: [n_models] float32, one per model in cfgs' order.
  # teacher_prompts: None, or the teacher's own ([B, Pt] tokens, mask).
  b = prompts.shape[0]
  constrain = _constrainer(mesh, rules, cfgs)
  platform = sharding.platform(mesh)
  # The teacher is the second of two models, or the only one when the
  # student is not.
  teacher = 1 if len(cfgs) == 2 else (0 if student_index is None else None)

  logits, caches, steps = [], [], []
  for i, (cfg, p) in enumerate(zip(cfgs, params)):
    p_head = p
    if layouts is not None:  # one per model (resolve_layout)
      p_head, p = _decode_params(cfg, p, layouts[i], mesh, rules)
    head = _head(cfg, p_head, vocab, platform,
                 whole=layouts is not None and layouts[i] != "train")
    toks, mask, length = prompts, prompt_mask, cache_len
    if teacher_prompts is not None and i == teacher:
      toks, mask = teacher_prompts
      length = cache_len + toks.shape[1] - prompts.shape[1]
    cache = models.init_cache(cfg, b, length)
    # Left padding puts every row's last prompt token in the last column, and
    # only its logits are needed: skip the [B, P, V] head of the prefill.
    last, cache = _prefill(cfg, p, toks, mask, cache)  # [B, D]
    logits.append(_logits(last, head))
    caches.append(cache)
    steps.append(_step_fn(cfg, p, head, platform, _decode_shard(
        None if layouts is None else layouts[i], mesh, rules, pin_cpu)))

  s = loop.decode(
      steps, logits, caches,
      rng=rng, row_ids=row_ids, max_new_tokens=max_new_tokens,
      sampler=sampler, temperature=tuple(temperature), top_p=top_p, lam=lam,
      student_index=student_index, combine=combine, eos_ids=eos_ids, pad_id=pad_id,
      constrain=constrain)
  mask = s.mask.astype(jnp.int32)
  n_gen = jnp.sum(mask)
  return Rollout(
      tokens=jnp.concatenate([prompts.astype(jnp.int32), s.tokens], axis=1),
      prompt_mask=prompt_mask.astype(jnp.int32),
      response_mask=mask,
      logprobs=s.logprobs,
      from_student=s.from_student,
      lengths=jnp.sum(mask, axis=1),
      ended=s.done,
      student_fraction=(jnp.sum(s.from_student & s.mask) /
                        jnp.maximum(n_gen, 1)).astype(jnp.float32),
      behaviour_logprobs=s.behaviour_logprobs)


def _check_model(name, m):
  if not (isinstance(m, (tuple, list)) and len(m) == 2):
    raise ValueError(f"{name}: expected a (config, params) pair, got {type(m).__name__}")
  return m


def _host(x):
  """NumPy copy of x, or None when it lives on devices of other hosts."""
  try:
    return np.asarray(x)
  except RuntimeError:
    return None


def eos_ids(*cfgs, tokenizer=None, extra: Iterable[int] = (),
            override: Sequence[int] | None = None) -> tuple[int, ...]:
  """The token ids that end a rollout row, sorted: the one rule for them.

  `override` (a config's eos_token_ids), if non-empty, is the whole set.
  Otherwise the union of each model config's eos_token_id (an int, a
  sequence or None), the tokenizer's eos_token_id (chat templates end the
  assistant turn with their own token) and `extra` (e.g. the ids of a
  checkpoint's generation_config.json, models.checkpoint.generation_eos_ids).
  """
  if override:
    return tuple(sorted({int(e) for e in override}))
  eos = {int(e) for e in extra}
  for cfg in cfgs:
    e = getattr(cfg, "eos_token_id", None)
    if e is not None:
      eos.update(int(x) for x in (e if isinstance(e, (tuple, list)) else (e,)))
  if getattr(tokenizer, "eos_token_id", None) is not None:
    eos.add(int(tokenizer.eos_token_id))
  return tuple(sorted(eos))


def _check_temperature(name, t):
  if not 0.0 <= float(t) < math.inf:  # NaN fails too
    raise ValueError(f"{name}: must be finite and >= 0, got {t}")
  return float(t)


def _check_settings(student, teacher, policy, lam, max_new_tokens,
                    temperature, teacher_temperature, top_k, top_p,
                    vocab_size=None):
  """Validates everything but the prompts; returns the models given (by
  name) and the sampling vocabulary size."""
  if policy not in POLICIES:
    raise ValueError(f"policy: expected one of {POLICIES}, got {policy!r}")
  if policy in ("student",) + TWO_MODEL_POLICIES and student is None:
    raise ValueError(f"student: required for policy={policy!r}")
  if policy in ("teacher",) + TWO_MODEL_POLICIES and teacher is None:
    raise ValueError(f"teacher: required for policy={policy!r}")
  given = {n: _check_model(n, m)
           for n, m in (("student", student), ("teacher", teacher))
           if m is not None}
  if policy == "coin_mixture":
    if lam is None or not 0.0 <= float(lam) <= 1.0:  # NaN fails too
      raise ValueError(f"lam: coin_mixture needs lam in [0, 1] (the "
                       f"probability of a student token), got {lam}")
  elif policy == "spectrum":
    spectrum_lib.check_lam(lam)
  elif lam is not None:
    raise ValueError(f"lam: only used with policies {TWO_MODEL_POLICIES} "
                     f"(got {policy!r})")
  if (not isinstance(max_new_tokens, (int, np.integer))
      or isinstance(max_new_tokens, bool) or max_new_tokens < 1):
    raise ValueError(
        f"max_new_tokens: must be an int >= 1, got {max_new_tokens!r}")
  ts = _check_temperature("temperature", temperature)
  tt = ts if teacher_temperature is None else _check_temperature(
      "teacher_temperature", teacher_temperature)
  if policy == "spectrum":
    if ts == 0 or tt == 0:
      raise ValueError(f"temperature: the spectrum samples pi_lambda, which "
                       f"needs both temperatures > 0 (student {ts}, teacher "
                       f"{tt})")
    if top_k is not None or (top_p is not None and float(top_p) < 1.0):
      raise ValueError("top_k, top_p: the spectrum samples pi_lambda over the "
                       "whole vocabulary (the paper: top-p 1.0); set both to "
                       "None")
  if policy == "coin_mixture" and (ts == 0) != (tt == 0):
    raise ValueError(f"temperature: coin_mixture decodes both models greedily "
                     f"or samples both; got student {ts}, teacher {tt}")
  vocab = min(int(cfg.vocab_size) for cfg, _ in given.values())
  if vocab_size is not None:
    if (isinstance(vocab_size, bool)
        or not isinstance(vocab_size, (int, np.integer))
        or not 1 <= vocab_size <= vocab):
      raise ValueError(f"vocab_size: must be an int in [1, {vocab}] (the "
                       f"models' embedding width), got {vocab_size!r}")
    vocab = int(vocab_size)
  if top_k is not None and not (isinstance(top_k, (int, np.integer))
                                and 1 <= top_k <= vocab):
    raise ValueError(f"top_k: must be an int in [1, {vocab}], got {top_k!r}")
  if top_p is not None and not 0.0 < float(top_p) <= 1.0:
    raise ValueError(f"top_p: must be in (0, 1], got {top_p}")
  return given, vocab


def _check_prompts(prompts, prompt_mask, vocab, names="prompts, prompt_mask"):
  if prompts is None or prompt_mask is None:
    raise ValueError(f"{names}: both are required")
  if jnp.ndim(prompts) != 2 or jnp.shape(prompts) != jnp.shape(prompt_mask):
    raise ValueError(
        f"{names}: expected equal [B, P] shapes, got "
        f"{jnp.shape(prompts)} and {jnp.shape(prompt_mask)}")
  b, p = jnp.shape(prompts)
  if b == 0 or p == 0:
    raise ValueError(f"prompts: empty batch or empty prompt (shape {(b, p)})")
  host_mask = _host(prompt_mask)
  if host_mask is None:  # spread over other hosts: each host checked its own
    return
  m = host_mask != 0
  empty = np.flatnonzero(~m.any(axis=1))
  if empty.size:
    raise ValueError(f"prompt_mask: row {empty[0]} is an empty prompt")
  unsorted = np.flatnonzero((np.diff(m.astype(np.int8), axis=1) < 0).any(1))
  if unsorted.size:
    raise ValueError(f"prompt_mask: row {unsorted[0]} is not left-padded")
  host_prompts = _host(prompts)
  if host_prompts is not None:
    real = host_prompts[m]
    if real.min() < 0 or real.max() >= vocab:
      raise ValueError(f"prompts: token ids must be in [0, {vocab}), got "
                       f"[{real.min()}, {real.max()}]")


def generate(student, teacher=None, prompts=None, prompt_mask=None, *, rng,
             policy: str = "student", lam: float | None = None,
             max_new_tokens: int, temperature: float = 1.0,
             teacher_temperature: float | None = None,
             top_k: int | None = None, top_p: float | None = None,
             eos_token_ids: Sequence[int] | None = None,
             pad_token_id: int = 0, return_logprobs: bool = True,
             bucket: str | int | None = None, cache_len: int | None = None,
             row_ids=None, mesh: Mesh | None = None,
             rules=None,
             vocab_size: int | None = None, teacher_prompts=None,
             teacher_prompt_mask=None,
             decode_layout: str = "auto") -> Rollout:
  """Samples responses to a left-padded prompt batch.

  Args:
    student: (config, params) of the student; may be None for 'teacher'.
    teacher: (config, params) of the teacher; needed for 'teacher',
      'spectrum' and 'coin_mixture'.
    prompts: [B, P] int token ids, left-padded (see `pad_prompts`).
    prompt_mask: [B, P], 1 on real tokens, a non-empty suffix of each row.
    rng: PRNG key, or [B] keys, one per row (rows of several rollouts
      decoded in one call: row b draws as it would in a call with the key
      rng[b]). Same rng -> same rollout.
    policy: 'student', 'teacher', 'spectrum' (the paper's pi_lambda) or
      'coin_mixture' (each token the student's with probability lam).
    lam: 'spectrum': the paper's lambda in [-2, 2] (-1 the teacher, +1 the
      student); 'coin_mixture': probability in [0, 1] that a step's token is
      the student's; None otherwise. Traced: changing it does not recompile.
    max_new_tokens: N >= 1.
    temperature: the student's, >= 0; 0 is greedy (top_k / top_p then
      ignored). Traced.
    teacher_temperature: the teacher's (default `temperature`); traced.
    top_k: keep the k most likely tokens (static).
    top_p: nucleus mass in (0, 1] (traced; whether it is used is static).
    eos_token_ids: ids that end a row; default the union of the configs'
      (eos_ids).
    pad_token_id: written after a row's end.
    return_logprobs: if False, `logprobs` and `behaviour_logprobs` are None
      in the result.
    bucket: if set ('pow2' or an int), first left-pad the prompts to
      bucket_length(P) so that nearby widths share a compilation.
    cache_len: KV-cache length; default P + N - 1 (all that is needed).
    row_ids: [B] ints keying each row's RNG stream (default 0..B-1); pass
      stable example ids to make a row's draws independent of its batch.
    mesh: optional device mesh; the batch is split over its data axes,
      params follow models.logical_axes, caches models.cache_logical_axes.
    rules: logical-axis rules for the mesh (the commands pass their run's,
      sharding.rules_from_config); default sharding.DEFAULT_RULES.
    vocab_size: sample only token ids below it: the real vocabulary (e.g.
      len(tokenizer)), so that embedding-padding ids (a Qwen2.5 config's
      151,936 rows vs its tokenizer's 151,665 tokens) are never drawn;
      probabilities and log-probs are renormalised over it. Default: the
      smallest embedding width of the models given.
    teacher_prompts, teacher_prompt_mask: optional [B, Pt], left-padded like
      `prompts`: the teacher's own prompt (its cache is prefilled from it);
      only for policies that run the teacher. `tokens` keeps the student's.
    decode_layout: how the weights are laid out for the decode loop, per
      model: 'train' (as `rules` place them), 'replicated', 'tp' or 'auto'
      (see `resolve_layout`); the tokens are the same in each.

  Returns:
    A Rollout (layout in the module docstring).
  """
  fn, args, kwargs = _plan(
      student, teacher, prompts, prompt_mask, rng=rng, policy=policy, lam=lam,
      max_new_tokens=max_new_tokens, temperature=temperature,
      teacher_temperature=teacher_temperature, top_k=top_k,
      top_p=top_p, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id,
      bucket=bucket, cache_len=cache_len, row_ids=row_ids, mesh=mesh,
      rules=rules, vocab_size=vocab_size, teacher_prompts=teacher_prompts,
      teacher_prompt_mask=teacher_prompt_mask, abstract=False,
      decode_layout=decode_layout)
  out = fn(*args, **kwargs)
  if not return_logprobs:
    out = out.replace(logprobs=None, behaviour_logprobs=None)
  return out


def program(student, teacher=None, prompts=None, prompt_mask=None, *,
            policy: str = "student", lam: float | None = None,
            max_new_tokens: int, temperature: float = 1.0,
            teacher_temperature: float | None = None,
            top_k: int | None = None, top_p: float | None = None,
            eos_token_ids: Sequence[int] | None = None,
            pad_token_id: int = 0, cache_len: int | None = None,
            mesh: Mesh | None = None, rules=None,
            vocab_size: int | None = None, teacher_prompts=None,
            decode_layout: str = "auto", row_rngs: bool = False):
  """The program `generate` runs, for compiling ahead of time: (jitted
  function, arguments, static keyword arguments), with `prompts`,
  `prompt_mask` and the params abstract (jax.ShapeDtypeStruct leaves placed
  by their shardings). Arguments as `generate` (`teacher_prompts`: the
  abstract [B, Pt] teacher prompt, used for its mask too; `row_rngs`: the
  program of a call given one key per row); the prompts are not checked
  (there are none), the settings are."""
  sds = jax.ShapeDtypeStruct
  b = prompts.shape[0]
  row_sharding = None
  if mesh is not None:
    row_sharding = NamedSharding(mesh, sharding.logical_to_spec(
        ("batch",), (b,), mesh, rules or sharding.DEFAULT_RULES))
  return _plan(
      student, teacher, prompts, prompt_mask,
      rng=sds((b,) if row_rngs else (), jax.random.key(0).dtype,
              sharding=row_sharding if row_rngs else None),
      policy=policy, lam=lam,
      max_new_tokens=max_new_tokens, temperature=temperature,
      teacher_temperature=teacher_temperature, top_k=top_k,
      top_p=top_p, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id,
      bucket=None, cache_len=cache_len,
      row_ids=sds((b,), jnp.int32, sharding=row_sharding), mesh=mesh,
      rules=rules, vocab_size=vocab_size, teacher_prompts=teacher_prompts,
      teacher_prompt_mask=teacher_prompts, abstract=True,
      decode_layout=decode_layout)


def _plan(student, teacher, prompts, prompt_mask, *, rng, policy, lam,
          max_new_tokens, temperature, teacher_temperature, top_k, top_p,
          eos_token_ids,
          pad_token_id, bucket, cache_len, row_ids, mesh, rules, vocab_size,
          abstract, teacher_prompts=None, teacher_prompt_mask=None,
          decode_layout="auto"):
  """Checks and resolves generate's arguments -> (_rollout, args, kwargs).
  `abstract`: prompts, params and row_ids are jax.ShapeDtypeStructs already
  placed (nothing is moved or read)."""
  rng = loop.as_keys(rng)  # jax.random.PRNGKey's raw keys too
  given, vocab = _check_settings(student, teacher, policy, lam,
                                 max_new_tokens, temperature,
                                 teacher_temperature, top_k, top_p,
                                 vocab_size)
  own = teacher_prompts is not None or teacher_prompt_mask is not None
  if own and policy == "student":
    raise ValueError("teacher_prompts: only used with policies that run the "
                     f"teacher, got policy={policy!r}")
  if not abstract:
    _check_prompts(prompts, prompt_mask, vocab)
    if own:
      _check_prompts(teacher_prompts, teacher_prompt_mask, vocab,
                     "teacher_prompts, teacher_prompt_mask")
  if own and (tuple(teacher_prompts.shape)[0] if abstract
              else jnp.shape(teacher_prompts)[0]) != tuple(prompts.shape)[0]:
    raise ValueError(f"teacher_prompts: {tuple(teacher_prompts.shape)[0]} "
                     f"rows for {tuple(prompts.shape)[0]} prompts")
  max_new_tokens = int(max_new_tokens)
  temps = {"student": float(temperature),
           "teacher": float(temperature if teacher_temperature is None
                            else teacher_temperature)}
  b, p = tuple(prompts.shape) if abstract else jnp.shape(prompts)
  if bucket is not None:
    width = prompts_lib.bucket_length(p, bucket)
    if width != p:
      pad = ((0, 0), (width - p, 0))
      prompts = jnp.pad(jnp.asarray(prompts), pad, constant_values=pad_token_id)
      prompt_mask = jnp.pad(jnp.asarray(prompt_mask), pad)
      p = width
  pt = p
  if own:
    pt = tuple(teacher_prompts.shape)[1]
    if bucket is not None and prompts_lib.bucket_length(pt, bucket) != pt:
      pad = ((0, 0), (prompts_lib.bucket_length(pt, bucket) - pt, 0))
      teacher_prompts = jnp.pad(jnp.asarray(teacher_prompts), pad,
                                constant_values=pad_token_id)
      teacher_prompt_mask = jnp.pad(jnp.asarray(teacher_prompt_mask), pad)
      pt = teacher_prompts.shape[1]
  for n, (cfg, _) in given.items():
    limit = getattr(cfg, "max_position_embeddings", None)
    width = pt if n == "teacher" else p
    if limit is not None and width + max_new_tokens > limit:
      raise ValueError(
          f"max_new_tokens: prompt width {width} + max_new_tokens "
          f"{max_new_tokens} exceeds the {n}'s max_position_embeddings {limit}")
  if cache_len is None:
    cache_len = p + max_new_tokens - 1
  elif p + max_new_tokens - 1 > cache_len:
    raise ValueError(
        f"cache_len: {cache_len} is too short for prompt width {p} + "
        f"{max_new_tokens} new tokens (needs {p + max_new_tokens - 1})")

  if row_ids is None:
    row_ids = jnp.arange(b, dtype=jnp.int32)
  elif tuple(np.shape(row_ids) if not abstract else row_ids.shape) != (b,):
    raise ValueError(f"row_ids: expected shape ({b},), got {np.shape(row_ids)}")
  rng_shape = tuple(rng.shape) if abstract else tuple(jnp.shape(rng))
  if rng_shape not in ((), (b,)):
    raise ValueError(f"rng: one key or one per row ({b}), got shape "
                     f"{rng_shape}")
  if eos_token_ids is None:
    eos = eos_ids(*(cfg for cfg, _ in given.values()))
  else:
    eos = [int(e) for e in eos_token_ids]

  names = {"student": ("student",), "teacher": ("teacher",),
           "coin_mixture": ("student", "teacher"),
           "spectrum": ("student", "teacher")}[policy]
  cfgs = tuple(given[n][0] for n in names)
  params = tuple(given[n][1] for n in names)
  if rules is None:
    rules = sharding.DEFAULT_RULES
  if not abstract:
    prompts = jnp.asarray(prompts, jnp.int32)
    prompt_mask = jnp.asarray(prompt_mask, jnp.int32)
    row_ids = jnp.asarray(row_ids, jnp.int32)
    if own:
      teacher_prompts = jnp.asarray(teacher_prompts, jnp.int32)
      teacher_prompt_mask = jnp.asarray(teacher_prompt_mask, jnp.int32)
  if mesh is not None and not abstract:
    params = tuple(
        jax.device_put(pr, sharding.tree_shardings(
            lora.params_logical_axes(cfg, pr), mesh, rules, pr))
        for cfg, pr in zip(cfgs, params))
    rows = lambda nd, shape: NamedSharding(mesh, sharding.logical_to_spec(
        ("batch",) + (None,) * (nd - 1), shape, mesh, rules))
    prompts, prompt_mask = jax.device_put((prompts, prompt_mask), rows(2, (b, p)))
    row_ids = jax.device_put(jnp.asarray(row_ids, jnp.int32), rows(1, (b,)))
    if jnp.ndim(rng) == 1:  # one key per row: placed with its row
      rng = jax.device_put(rng, rows(1, (b,)))
    if own:
      teacher_prompts, teacher_prompt_mask = jax.device_put(
          (teacher_prompts, teacher_prompt_mask), rows(2, (b, pt)))

  greedy = all(temps[n] == 0.0 for n in names)
  sampler = sampling.Sampler(
      greedy=greedy, top_k=None if greedy else top_k,
      use_top_p=(not greedy) and top_p is not None and float(top_p) < 1.0)
  args = (params, prompts, prompt_mask, rng, row_ids,
          jnp.float32(1.0 if lam is None else lam),
          jnp.asarray([1.0 if greedy else temps[n] for n in names],
                      jnp.float32),
          jnp.float32(1.0 if top_p is None else top_p))
  if own:  # the default path keeps its program: no extra argument
    args += ((teacher_prompts, teacher_prompt_mask),)
  kwargs = dict(
      cfgs=cfgs, student_index=0 if names[0] == "student" else None,
      max_new_tokens=max_new_tokens, sampler=sampler, eos_ids=tuple(eos),
      pad_id=int(pad_token_id), vocab=vocab, cache_len=int(cache_len),
      mesh=mesh, rules=tuple(tuple(r) for r in rules),
      combine="spectrum" if policy == "spectrum" else "coin_mixture",
      layouts=tuple(resolve_layout(cfg, decode_layout, mesh)
                    for cfg in cfgs), pin_cpu=bool(PIN_CPU))
  return _rollout, args, kwargs
