"""Memory-bounded divergence from final hidden states and output heads.

The plain path materialises logits [B, T, V] for both models (about 2.5 GB
each in float32 at T=4096, V=151,936), plus as many again for their
log-softmaxes and the gradient. Here the tokens are cut into chunks of
`chunk_size` positions and a lax.scan computes, per chunk, both models'
logits [B, C, V], the per-token divergence (the same code as the plain path)
and, in the same pass, its gradient: w.r.t. the logits in closed form, then
by two matmuls w.r.t. the chunk's student hidden states and the student head.
A custom VJP hands these back scaled by the incoming cotangent, so nothing is
recomputed in the backward pass (a jax.checkpoint scan would redo both head
matmuls: 6 instead of 4 matmuls of [T, D] x [D, V]). Without a gradient
request only the value scan runs.

On CPU (`sharding.platform()`; a TPU program traced on a CPU host takes the
accelerator path) the loop is a fori_loop over chunks sliced from the
[B, T, ...] inputs, whose per-token terms run over blocks of rows with each
block's logit gradient written over the student's logits in place: a chunk
holds its two [B, C, V] float32 products and row-sized temporaries (see
`_cpu_loop`).

Einsum legend: B batch, C chunk positions, D hidden (S student / E teacher),
V vocabulary.

Sharding: without `shard`, no constraints are added. The chunk axis is cut
out of T, so the batch axis keeps whatever sharding it arrives with; with a
head's vocab axis on 'tensor', XLA inserts the sums over V (and over B, C for
the head gradient) itself. With `shard` (a sharding.Activations; the
accelerator path, exact teacher) the loss is vocab-parallel: each chunk's
hidden states are gathered whole on every device ([B, C, D]: a few MB), the
heads, logits and head gradient are split over the vocabulary across the
devices that split the batch (and the tensor axis), the sums over V are
all-reduced [B, C] rows and the hidden-state gradient is reduce-scattered back
to the batch's layout. Under FSDP the alternative (what XLA picks with no
constraints) gathers both [D, V] heads whole on every chip and keeps a whole
float32 [D, V] head gradient per chip, all-reduced every chunk (932 MB per
32 positions): for Qwen2.5-1.5B <- 7B on a v5e-8 (configs/distill.py, Table
3) that was 2.0 GiB of teacher head (the gathered head and its cut copy),
0.9 GiB of student head and 3.5 GiB of float32 head gradient buffers per
chip, of the update's 10.0 GiB of temporaries; vocab-parallel, 4.5 GiB of
temporaries and 9.2 GiB in all instead of 14.7 (compile_only, v5e-8).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxdistill.losses import _common as c
from jaxdistill.losses import topk as topk_lib

# On CPU a chunk holds two [B, C, V] float32 arrays: 58 MB at B = 1, C = 48,
# V = 151,936; with C = 48, bench.losses (B = 1, T = 4096, D = 896) needs
# 0.149x the plain path's memory, and 64 would be 0.151x. Programs then pay
# for more, smaller matmuls (each streams the whole head): about 1.3x the
# time of C = 128 on CPU. Training configs set loss.chunk_size themselves.
DEFAULT_CHUNK_SIZE = 48


class _Static(NamedTuple):
  kind: str
  beta: float
  temperature: float  # the student's tau_S
  teacher_temperature: float  # tau_T (a given top-k is at it already)
  vocab_size: int
  topk: int | None = None  # None: exact; k: against the teacher's top-k
  variant: str = "renorm"
  given: bool = False  # the teacher's top-k is given (a cache), not computed
  size: int = 1  # chunk positions
  rows: int = 0  # CPU: rows per block of the per-token terms; 0: accelerator
  layout: "_Layout | None" = None  # vocab-parallel (accelerator, exact teacher)


class _Layout(NamedTuple):
  """The vocab-parallel layout (module doc): `shard` the run's
  sharding.Activations, `axes` the mesh axes the vocabulary is split over."""
  shard: object
  axes: tuple

  def _pin(self, x, spec):
    return lax.with_sharding_constraint(x, NamedSharding(self.shard.mesh, spec))

  def vocab(self, x, dim):
    """x split over `axes` along `dim`, whole along the others."""
    spec = [None] * x.ndim
    spec[dim] = self.axes
    return self._pin(x, P(*spec))

  def whole(self, x):
    return self._pin(x, P())

  def rows(self, x):
    """x [B, ...] back in the batch's layout."""
    return self.shard(x, "batch", *([None] * (x.ndim - 1)))


def _layout(shard, width: int, d_model: int, tokens: int):
  """The vocab-parallel layout of a `width`-column head, or None (no
  `shard`, or the split does not divide the columns and, when the head
  gradient runs in slabs, the _GROUPS groups it is split along)."""
  if shard is None:
    return None
  table, mesh = dict(shard.rules), shard.mesh
  axes = []
  for name in ("batch", "vocab"):
    got = table.get(name) or ()
    for a in ((got,) if isinstance(got, str) else got):
      if a not in axes and mesh.shape.get(a, 1) > 1:
        axes.append(a)
  n = 1
  for a in axes:
    n *= mesh.shape[a]
  slabs = _head_slabs(d_model, width, tokens)
  if n == 1 or width % n or (slabs > 1 and _GROUPS % n):
    return None
  return _Layout(shard, tuple(axes))


def _zero_masked(h, m):
  """[B, C, D] hidden states with masked positions set to 0.

  Padded positions may hold garbage (inf/NaN) whose NaNs a 0 * would carry
  into the value and into both gradients (the head gradient multiplies the
  hidden states by dz): a where on the [B, C, D] inputs, cheaper than on the
  [B, C, V] logits.
  """
  return jnp.where((m != 0)[..., None], h, jnp.zeros((), h.dtype))


# Heads are cut to the shared vocabulary rounded up to a multiple of this
# (whole TPU lanes; the slab split below needs the width divisible by 16).
_ROUND = 128


def _head_width(vocab: int, *widths: int) -> int:
  """Columns of the heads the loss multiplies by: the vocabulary rounded up
  to _ROUND, within the narrowest head."""
  return min(-(-vocab // _ROUND) * _ROUND, *widths)


def _mask_padding(x, cfg: "_Static"):
  """[..., W] logits with the columns past the real vocabulary set to -inf
  (zero probability; token_terms is NaN-free there)."""
  if x.shape[-1] == cfg.vocab_size:
    return x
  col = lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
  return jnp.where(col < cfg.vocab_size, x, -jnp.inf)


def _products(cfg: _Static, hs, ws, ht, wt):
  """The chunk's float32 head products hs @ ws and ht @ wt [B, C, W] (the
  teacher's as given with cfg.given: its (ids, logprobs, tail) chunk).

  `hs` and `ht` must already be zero at masked positions (_zero_masked).
  """
  f32 = jnp.float32
  z = jnp.einsum("bcs,sv->bcv", hs, ws, preferred_element_type=f32)
  if cfg.given:
    return z, ht
  return z, jnp.einsum("bce,ev->bcv", ht, wt, preferred_element_type=f32)


def _scaled(cfg: _Static, z, u, m):
  """The student logits over the shared vocab / tau_S, and the teacher: its
  logits likewise, or its top-k (a TeacherTopK), from `_products` (of a
  chunk or of a block of its rows; m is their mask)."""
  # The heads arrive cut to the shared vocabulary rounded up to whole
  # 128-lane blocks (_run); the columns past it are padding: -inf.
  z = _mask_padding(z, cfg) / cfg.temperature
  if cfg.given:
    active = (m != 0)[..., None]
    ids, lp, tail = u
    # Masked positions may hold anything: distinct ids, finite log-probs.
    ids = jnp.where(active, ids, jnp.arange(ids.shape[-1], dtype=ids.dtype))
    return z, topk_lib.TeacherTopK(
        ids, jnp.where(active, lp, 0.0), jnp.where(active[..., 0], tail, -1.0))
  u = lax.stop_gradient(_mask_padding(u, cfg)) / cfg.teacher_temperature
  if cfg.topk is not None:
    return z, topk_lib.topk_of_scaled(u, cfg.topk)
  return z, u


def _chunk_loss(cfg: _Static, z, u, w, m, with_grad=False):
  """Weighted divergence of one chunk, mask-weighted monitoring sums and,
  with_grad, d loss / d z [B, C, V] (closed form)."""
  if isinstance(u, topk_lib.TeacherTopK):
    terms = topk_lib.topk_token_terms(z, u.ids, u.logprobs, cfg.variant,
                                      cfg.kind, cfg.beta, with_grad=with_grad,
                                      tail=u.tail)
    terms["topk_mass"] = jnp.exp(jax.nn.logsumexp(u.logprobs, axis=-1))
  else:
    terms = c.token_terms(z, u, cfg.kind, cfg.beta, with_grad=with_grad)
  grad = terms.pop("grad", None)
  active = m != 0
  terms = {k: jnp.where(active, x, 0.0) for k, x in terms.items()}  # [B, C]
  loss = jnp.sum(w * terms["loss"])
  sums = {k: jnp.sum(m * x) for k, x in terms.items() if k != "loss"}
  if grad is not None:
    grad = jnp.where(active[..., None], w[..., None] * grad, 0.0)
  return loss, sums, grad


def _zero_sums(cfg):
  keys = ("fkl", "rkl", "jsd") if cfg.kind == "jsd" else ("fkl", "rkl")
  if cfg.topk is not None:
    keys += ("topk_mass",)
  return {k: jnp.zeros((), jnp.float32) for k in keys}


def _add(a, b):
  return jax.tree.map(jnp.add, a, b)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(cfg, hs, ws, ht, wt, w, m):
  """(loss, monitoring sums) of [B, T, ...] inputs; value only (no gradient
  requested)."""
  if cfg.rows:
    return _cpu_loop(cfg, hs, ws, ht, wt, w, m, with_grad=False)[0]
  hs, ht, w, m = _chunked(cfg, hs, ht, w, m)
  ws, wt = _split_heads(cfg, ws, wt)

  def step(carry, xs):
    xs = _gather_chunk(cfg, xs)
    hs_c = _zero_masked(xs[0], xs[3])
    ht_c = xs[1] if cfg.given else _zero_masked(xs[1], xs[3])
    z, u = _scaled(cfg, *_split_products(
        cfg, _products(cfg, hs_c, ws, ht_c, wt)), xs[3])
    loss, sums, _ = _chunk_loss(cfg, z, u, xs[2], xs[3])
    return (carry[0] + loss, _add(carry[1], sums)), None

  init = (jnp.zeros((), jnp.float32), _zero_sums(cfg))
  out, _ = lax.scan(step, init, (hs, ht, w, m))
  return out


def _split_heads(cfg, ws, wt):
  """The heads split over the vocabulary (cfg.layout), once per call: under
  FSDP each device then holds 1/n of each head instead of all of it."""
  if cfg.layout is None:
    return ws, wt
  return cfg.layout.vocab(ws, 1), cfg.layout.vocab(wt, 1)


def _gather_chunk(cfg, xs):
  """A chunk's (hs, ht, w, m), gathered whole on every device (cfg.layout):
  every device computes all rows' logits over its own columns."""
  if cfg.layout is None:
    return xs
  return jax.tree.map(cfg.layout.whole, xs)


def _split_products(cfg, zu):
  """A chunk's [B, C, W] products split over their columns (cfg.layout)."""
  if cfg.layout is None:
    return zu
  z, u = zu
  return cfg.layout.vocab(z, 2), cfg.layout.vocab(u, 2)


def _to_chunks(x, n, size):
  """[B, T, ...] -> [N, B, C, ...], zero-padding T up to N * C."""
  pad = n * size - x.shape[1]
  x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
  x = x.reshape((x.shape[0], n, size) + x.shape[2:])
  return jnp.moveaxis(x, 1, 0)


def _chunked(cfg, hs, ht, w, m):
  n = -(-hs.shape[1] // cfg.size)
  chunks = functools.partial(_to_chunks, n=n, size=cfg.size)
  return chunks(hs), jax.tree.map(chunks, ht), chunks(w), chunks(m)


# The head gradient hs^T @ dz is a full [D, V] product per chunk. XLA does
# not fuse the '+=' into the matmul, so done in one piece it costs a second
# [D, V] float32 buffer as large as the head itself. Instead the vocabulary
# is viewed as [G, S, W] (G groups x S slabs x W columns) and a fori_loop adds
# one slab of every group per iteration: the temporary shrinks S-fold. The
# loop index runs over S, never over G, so with the head's vocab axis sharded
# (in contiguous blocks, any shard count dividing G) every update stays local.
_GROUPS = 16


def _head_slabs(d_model, width, tokens):
  """Number of vocab slabs S: temporary [D, V/S] about one chunk's logits.

  S must divide V / G: the smallest such S >= D / tokens, unless that is over
  twice the target (many tiny matmuls), then the largest S below it.
  """
  if width % _GROUPS:
    return 1
  target = max(1, -(-d_model // max(tokens, 1)))
  per_group = width // _GROUPS
  above = [s for s in range(target, 2 * target + 1) if per_group % s == 0]
  if above:
    return above[0]
  return max(s for s in range(1, target + 1) if per_group % s == 0)


def _fused_fwd(cfg, hs, ws, ht, wt, w, m):
  if cfg.rows:
    out, dhs, dws = _cpu_loop(cfg, hs, ws, ht, wt, w, m, with_grad=True)
    return out, (dhs, dws)
  f32 = jnp.float32
  b, t, d_model = hs.shape
  hs, ht, w, m = _chunked(cfg, hs, ht, w, m)
  width = ws.shape[1]
  n_slabs = _head_slabs(d_model, width, b * cfg.size)
  slab_shape = (_GROUPS, n_slabs, width // (_GROUPS * n_slabs))
  # The gradient w.r.t. the chunk's logits is the closed form (autodiff would
  # keep more [B, C, V] residuals alive); the two matmuls back to hs and ws
  # are written out for the slab-wise ws update.

  ws, wt = _split_heads(cfg, ws, wt)
  lay = cfg.layout

  def step(carry, xs):
    loss, sums, dws = carry  # dws: [D, G, S, W] (or [D, V] when S == 1)
    hs_c, ht_c, w_c, m_c = _gather_chunk(cfg, xs)
    # Zeroed once here: the head gradient below uses hs_c as well.
    hs_c = _zero_masked(hs_c, m_c)
    ht_c = ht_c if cfg.given else _zero_masked(ht_c, m_c)
    z, u = _scaled(cfg, *_split_products(
        cfg, _products(cfg, hs_c, ws, ht_c, wt)), m_c)
    l, s, dz = _chunk_loss(cfg, z, u, w_c, m_c, with_grad=True)
    # [B, C, W]: z above is logits / tau; 0 on the padding columns.
    dz = (dz / cfg.temperature).astype(ws.dtype)
    dhs = jnp.einsum("bcv,sv->bcs", dz, ws, preferred_element_type=f32)
    if lay is not None:  # the sum over the columns: back to the batch's rows
      dhs = lay.rows(dhs)
    dhs = dhs.astype(hs.dtype)
    if n_slabs == 1:
      dws = dws + jnp.einsum("bcs,bcv->sv", hs_c, dz, preferred_element_type=f32)
      if lay is not None:
        dws = lay.vocab(dws, 1)
    else:
      dz = dz.reshape(dz.shape[:2] + slab_shape)  # [B, C, G, S, W]
      if lay is not None:
        dz, dws = lay.vocab(dz, 2), lay.vocab(dws, 1)

      def add_slab(j, acc):
        dz_j = lax.dynamic_index_in_dim(dz, j, axis=3, keepdims=False)
        upd = jnp.einsum("bcs,bcgw->sgw", hs_c, dz_j, preferred_element_type=f32)
        cur = lax.dynamic_index_in_dim(acc, j, axis=2, keepdims=False)
        return lax.dynamic_update_index_in_dim(acc, cur + upd, j, axis=2)

      dws = lax.fori_loop(0, n_slabs, add_slab, dws)
    return (loss + l, _add(sums, s), dws), dhs

  acc_shape = ws.shape if n_slabs == 1 else (d_model,) + slab_shape
  acc = jnp.zeros(acc_shape, f32)
  if lay is not None:
    acc = lay.vocab(acc, 1)
  init = (jnp.zeros((), f32), _zero_sums(cfg), acc)
  (loss, sums, dws), dhs = lax.scan(step, init, (hs, ht, w, m))
  dhs = jnp.moveaxis(dhs, 0, 1).reshape((b, -1, d_model))[:, :t]
  return (loss, sums), (dhs, dws.reshape(ws.shape).astype(ws.dtype))


def _fused_bwd(cfg, res, g):
  del cfg
  dhs, dws = res
  g_loss = g[0]  # the monitoring sums are not differentiated
  return (g_loss.astype(dhs.dtype) * dhs, g_loss.astype(dws.dtype) * dws,
          None, None, None, None)


_fused.defvjp(_fused_fwd, _fused_bwd)


# On CPU (cfg.rows > 0) the chunks' per-token terms run over blocks of
# cfg.rows rows, so that their [rows, V] temporaries stay small; each
# block's logit gradient is written over the student's logits in place, so a
# chunk holds two [B, C, V] float32 arrays at most (its two products). The
# chunks are cut from the [B, T, ...] inputs by dynamic slices (no chunked
# copies of the hidden states), and the head gradient is added in slabs of
# about _CPU_SLAB_BYTES of [D, columns] whatever V's divisors.
_CPU_BLOCK_BYTES = 1 << 20
_CPU_UNBLOCKED_BYTES = 4 << 20  # below this, one block
_CPU_SLAB_BYTES = 4 << 20


def _cpu_slab(d_model, width):
  """Columns per head-gradient slab on CPU (the last slab ends at `width`)."""
  return max(1, min(width, _CPU_SLAB_BYTES // (4 * d_model)))


def _row_terms(cfg, z, u, w, m, with_grad, dtype):
  """(loss, sums, dz) of a chunk's [N, W] rows (z, u: raw `_products`), in
  blocks of cfg.rows rows. With with_grad, dz is the logit gradient / tau
  (rounded through `dtype`, the head's), written over z in place; else z.

  Each block's gradient is written one step late, at the start of the next
  step, and the block is then read from the written array. Were it written
  at the end of its own step, XLA could schedule one of the block's reads
  after that write, and would then keep the old z in a full copy, every
  block.
  """
  f32 = jnp.float32
  rows = cfg.rows

  def block(zs, j):
    take = lambda x: lax.dynamic_slice_in_dim(x, j * rows, rows, axis=0)
    m_j = take(m)
    z_j, u_j = _scaled(cfg, take(zs), jax.tree.map(take, u), m_j)
    l, s, dz = _chunk_loss(cfg, z_j, u_j, take(w), m_j, with_grad)
    if with_grad:
      dz = (dz / cfg.temperature).astype(dtype).astype(f32)
    return l, s, dz

  if rows == z.shape[0]:
    l, s, dz = block(z, 0)
    return l, s, dz if with_grad else z

  def step(j, carry):
    zs, pending, loss, sums = carry
    if with_grad:  # block j - 1's gradient (block 0 itself at j = 0)
      prev = jnp.maximum(j - 1, 0) * rows
      zs = lax.dynamic_update_slice_in_dim(zs, pending, prev, axis=0)
    l, s, dz = block(zs, j)
    return zs, dz if with_grad else pending, loss + l, _add(sums, s)

  n_blocks = z.shape[0] // rows
  pending = z[:rows] if with_grad else jnp.zeros((), f32)
  zs, pending, loss, sums = lax.fori_loop(
      0, n_blocks, step, (z, pending, jnp.zeros((), f32), _zero_sums(cfg)))
  if with_grad:
    zs = lax.dynamic_update_slice_in_dim(zs, pending, (n_blocks - 1) * rows,
                                         axis=0)
  return loss, sums, zs


def _add_head_grad(acc, h, dz):
  """acc [D, W] + h^T @ dz (h [N, D], dz [N, W]) in slabs of columns."""
  d_model, width = acc.shape
  cols = _cpu_slab(d_model, width)
  f32 = jnp.float32
  if cols == width:
    return acc + jnp.einsum("ns,nv->sv", h, dz, preferred_element_type=f32)

  def slab(k, acc):
    # The last slab is moved back to end at W; the columns an earlier slab
    # added are zeroed out of it.
    start = jnp.minimum(k * cols, width - cols)
    dz_k = lax.dynamic_slice_in_dim(dz, start, cols, axis=1)
    fresh = start + jnp.arange(cols) >= k * cols
    dz_k = jnp.where(fresh, dz_k, jnp.zeros((), dz.dtype))
    upd = jnp.einsum("ns,nv->sv", h, dz_k, preferred_element_type=f32)
    cur = lax.dynamic_slice_in_dim(acc, start, cols, axis=1)
    return lax.dynamic_update_slice_in_dim(acc, cur + upd, start, axis=1)

  return lax.fori_loop(0, -(-width // cols), slab, acc)


def _cpu_loop(cfg, hs, ws, ht, wt, w, m, with_grad):
  """((loss, sums), d/d hs, d/d ws) on CPU: a fori_loop over chunks of
  cfg.size positions sliced from [B, T, ...] inputs; the last chunk is moved
  back to end at T, its positions an earlier chunk took masked out."""
  f32 = jnp.float32
  b, t, d_model = hs.shape
  size = cfg.size
  n = b * size

  def chunk(i, carry):
    out, dhs, dws = carry
    start = jnp.minimum(i * size, t - size)
    take = lambda x: lax.dynamic_slice_in_dim(x, start, size, axis=1)
    fresh = start + jnp.arange(size) >= i * size  # [C]
    m_c = jnp.where(fresh, take(m), 0.0)
    hs_c = _zero_masked(take(hs), m_c)
    ht_c = jax.tree.map(take, ht)
    if not cfg.given:
      ht_c = _zero_masked(ht_c, m_c)
    z, u = _products(cfg, hs_c, ws, ht_c, wt)
    flat = lambda x: x.reshape((n,) + x.shape[2:])
    l, s, dz = _row_terms(cfg, flat(z), jax.tree.map(flat, u), flat(take(w)),
                          flat(m_c), with_grad, ws.dtype)
    out = (out[0] + l, _add(out[1], s))
    if with_grad:
      dz = dz.astype(ws.dtype)  # [N, W]
      # As (ws @ dz^T)^T: XLA:CPU runs dz @ ws^T about 3x slower (it packs
      # the whole head as the right operand); the barrier keeps XLA from
      # folding the transpose back into that form.
      dhs_c = lax.optimization_barrier(
          jnp.einsum("sv,nv->sn", ws, dz, preferred_element_type=f32)).T
      dhs_c = jnp.where(fresh[:, None], dhs_c.reshape(b, size, d_model),
                        take(dhs))
      dhs = lax.dynamic_update_slice_in_dim(dhs, dhs_c.astype(dhs.dtype),
                                            start, axis=1)
      dws = _add_head_grad(dws, flat(hs_c), dz)
    return out, dhs, dws

  init = ((jnp.zeros((), f32), _zero_sums(cfg)),
          jnp.zeros(hs.shape if with_grad else (0,), hs.dtype),
          jnp.zeros(ws.shape if with_grad else (0,), f32))
  out, dhs, dws = lax.fori_loop(0, -(-t // size), chunk, init)
  return out, dhs, dws.astype(ws.dtype)


def fused_divergence(student_hidden, student_head, teacher_hidden, teacher_head,
                     mask, *, kind="forward", beta=0.5, temperature=1.0,
                     teacher_temperature=None, reduction="token_mean",
                     vocab_size=None,
                     chunk_size=DEFAULT_CHUNK_SIZE, teacher_topk=None,
                     topk_variant="renorm", shard=None):
  """`divergence(hs @ ws, ht @ wt, mask, ...)` without the [B, T, V] logits.

  Args:
    student_hidden: [B, T, D_s] final (normed) student hidden states.
    student_head: [D_s, V_s] student output head (a tied embedding [V, D]
      passed as its transpose).
    teacher_hidden: [B, T, D_t]; teacher_head: [D_t, V_t]. No gradient flows
      into either.
    mask, kind, beta, temperature, teacher_temperature, reduction,
      vocab_size: as in `divergence`.
    chunk_size: token positions per scan step; peak extra memory is a few
      [B, chunk_size, V] float32 arrays (two on CPU).
    teacher_topk: None (exact), or k: each chunk's teacher logits are cut to
      their top-k and the loss is `topk_divergence(..., variant=topk_variant)`
      (with the teacher's exact tail mass).
    topk_variant: 'renorm' | 'tail' (losses/topk.py).
    shard: None, or a sharding.Activations (static): on an accelerator,
      with the exact teacher, the loss runs vocab-parallel over its mesh
      (module doc); pass the heads as the params hold them (not gathered).
      The same numbers up to the order of the sums over V.

  Returns:
    (loss, metrics) as `divergence` (plus 'distill/topk_mass' with a top-k).
    Differentiable w.r.t. student_hidden and student_head (reverse mode only,
    via a custom VJP). Head matmuls take the inputs' dtype with float32
    accumulation.
  """
  c.check_float(teacher_hidden, "teacher_hidden", 3)
  c.check_float(teacher_head, "teacher_head", 2)
  if teacher_hidden.shape[:2] != student_hidden.shape[:2]:
    raise ValueError(
        "teacher_hidden must match student_hidden in [B, T]: got "
        f"{teacher_hidden.shape} vs {student_hidden.shape}")
  if teacher_head.shape[0] != teacher_hidden.shape[-1]:
    raise ValueError(
        f"teacher_head must be [D_t={teacher_hidden.shape[-1]}, V], "
        f"got {teacher_head.shape}")
  c.check_float(student_head, "student_head", 2)
  vocab = c.shared_vocab(student_head.shape[1], teacher_head.shape[1],
                         vocab_size, "student_head", "teacher_head")
  if teacher_topk is not None:
    topk_lib.check_k(teacher_topk, vocab, "teacher_topk")
    topk_lib.check_variant(topk_variant)
  return _run(student_hidden, student_head, lax.stop_gradient(teacher_hidden),
              lax.stop_gradient(teacher_head), mask, kind=kind, beta=beta,
              temperature=temperature,
              teacher_temperature=teacher_temperature, reduction=reduction,
              vocab=vocab, chunk_size=chunk_size, topk=teacher_topk,
              variant=topk_variant, given=False, shard=shard)


def fused_topk_divergence(student_hidden, student_head, teacher_ids,
                          teacher_logprobs, mask, *, teacher_tail=None,
                          kind="forward", beta=0.5, temperature=1.0,
                          reduction="token_mean", vocab_size=None,
                          chunk_size=DEFAULT_CHUNK_SIZE, variant="renorm"):
  """`topk_divergence(hs @ ws, ids, logprobs, mask, ...)` without the
  [B, T, V] student logits: the fused path against a given (cached) top-k.

  teacher_ids, teacher_logprobs: [B, T, K]; teacher_tail: [B, T] or None
  (rebuilt from the log-probs, as in `topk_divergence`); the log-probs are
  at the teacher's temperature already, so only the student's `temperature`
  is applied. Other arguments as in `fused_divergence`; vocab_size defaults
  to V_s.
  """
  c.check_float(student_head, "student_head", 2)
  topk_lib.check_topk_inputs(teacher_ids, teacher_logprobs, student_hidden,
                             "student_hidden")
  vocab = c.shared_vocab(student_head.shape[1], student_head.shape[1],
                         vocab_size, "student_head", "student_head")
  topk_lib.check_k(teacher_ids.shape[-1], vocab, "teacher_ids.shape[-1] (k)")
  topk_lib.check_variant(variant)
  lp = lax.stop_gradient(teacher_logprobs.astype(jnp.float32))
  if teacher_tail is None:
    tail = topk_lib.teacher_tail_logmass(lp)
  else:
    if tuple(teacher_tail.shape) != tuple(teacher_ids.shape[:2]):
      raise ValueError(f"teacher_tail must have shape {teacher_ids.shape[:2]} "
                       f"([B, T]), got {teacher_tail.shape}")
    tail = lax.stop_gradient(teacher_tail.astype(jnp.float32))
  return _run(student_hidden, student_head,
              (teacher_ids.astype(jnp.int32), lp, tail), None, mask,
              kind=kind, beta=beta, temperature=temperature,
              teacher_temperature=None, reduction=reduction, vocab=vocab,
              chunk_size=chunk_size, topk=teacher_ids.shape[-1],
              variant=variant, given=True)


def _run(student_hidden, student_head, teacher, teacher_head, mask, *, kind,
         beta, temperature, teacher_temperature, reduction, vocab,
         chunk_size, topk, variant, given, shard=None):
  """Checks the shared arguments, then the chunked scan."""
  kind = c.check_kind(kind)
  beta = c.check_beta(beta)
  temperature, teacher_temperature = c.check_temperatures(
      temperature, teacher_temperature)
  c.check_float(student_hidden, "student_hidden", 3)
  if student_head.shape[0] != student_hidden.shape[-1]:
    raise ValueError(
        f"student_head must be [D_s={student_hidden.shape[-1]}, V], "
        f"got {student_head.shape}")
  c.check_mask(mask, student_hidden.shape[:2])
  if (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)
      or chunk_size <= 0):
    raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")

  b, t = student_hidden.shape[:2]
  size = min(chunk_size, max(t, 1))
  weights = c.reduction_weights(mask, reduction)  # [B, T]
  m = mask.astype(jnp.float32)
  # The heads are cut BEFORE the products, never the [B, C, V] logits after
  # them: the TPU compiler fails (an INTERNAL 'Bitcast cannot have different
  # shape sizes' error) on a slice of a product whose contraction dim is
  # sharded (tests/losses/fused_test.py keeps the smallest such program
  # compiling through this path). Cutting costs a copy of the cut head
  # where it is used.
  widths = [student_head.shape[1]]
  if not given:
    widths.append(teacher_head.shape[1])
  w_cols = _head_width(vocab, *widths)
  student_head = student_head[:, :w_cols]
  if not given:
    teacher_head = teacher_head[:, :w_cols]
  rows = c.cpu_row_block(b * size, w_cols, _CPU_BLOCK_BYTES,
                         _CPU_UNBLOCKED_BYTES)
  # Vocab-parallel on accelerators with the exact teacher (a top-k over
  # split columns is left to XLA; the CPU loop keeps its own blocking).
  layout = (_layout(shard, w_cols, student_hidden.shape[-1], b * size)
            if rows == 0 and topk is None and not given else None)
  cfg = _Static(kind, beta, temperature, teacher_temperature, vocab, topk,
                variant, given, size, rows, layout)
  loss, sums = _fused(cfg, student_hidden, student_head, teacher,
                      teacher_head, weights, m)

  m_sum = jnp.sum(m)

  def mean(s):  # as c.token_mean: mask-weighted, 0 for an empty mask
    return jnp.where(m_sum > 0, s / jnp.where(m_sum > 0, m_sum, 1.0), 0.0)

  metrics = {
      "distill/loss": loss,
      "distill/fkl": mean(sums["fkl"]),
      "distill/rkl": mean(sums["rkl"]),
      "distill/tokens": jnp.sum((mask != 0).astype(jnp.float32)),
  }
  if kind == "jsd":
    metrics["distill/jsd"] = mean(sums["jsd"])
  if topk is not None:
    metrics["distill/topk_mass"] = mean(sums["topk_mass"])
  return loss, {k: lax.stop_gradient(v) for k, v in metrics.items()}
