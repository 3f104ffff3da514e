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

Einsum legend: B batch, C chunk positions, D hidden (S student / E teacher),
V vocabulary.

Sharding: no constraints are added. The chunk axis is cut out of T, so the
batch axis keeps whatever sharding it arrives with; with a head's vocab axis
on 'tensor', XLA inserts the sums over V (and over B, C for the head
gradient) itself.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
from jax import lax
import jax.numpy as jnp

from jaxdistill.losses import _common as c
from jaxdistill.losses import topk as topk_lib

DEFAULT_CHUNK_SIZE = 128


class _Static(NamedTuple):
  kind: str
  beta: float
  temperature: float
  vocab_size: int
  topk: int | None = None  # None: exact; k: against the teacher's top-k
  variant: str = "renorm"
  given: bool = False  # the teacher's top-k is given (a cache), not computed


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


def _chunk_logits(cfg: _Static, hs, ws, ht, wt, m):
  """The chunk's student logits over the shared vocab, float32 / tau, and the
  teacher: its logits likewise, or its top-k (a TeacherTopK).

  `hs` and `ht` must already be zero at masked positions (_zero_masked).
  With cfg.given, `ht` is the chunk's (ids, logprobs, tail) and `wt` unused.
  """
  f32 = jnp.float32
  # The heads arrive cut to the shared vocabulary rounded up to whole
  # 128-lane blocks (_run); the columns past it are padding: -inf.
  z = _mask_padding(
      jnp.einsum("bcs,sv->bcv", hs, ws, preferred_element_type=f32), cfg)
  z = z / cfg.temperature  # [B, C, W]
  if cfg.given:
    active = (m != 0)[..., None]
    ids, lp, tail = ht
    # Masked positions may hold anything: distinct ids, finite log-probs.
    ids = jnp.where(active, ids, jnp.arange(ids.shape[-1], dtype=ids.dtype))
    return z, topk_lib.TeacherTopK(
        ids, jnp.where(active, lp, 0.0), jnp.where(active[..., 0], tail, -1.0))
  u = _mask_padding(
      jnp.einsum("bce,ev->bcv", ht, wt, preferred_element_type=f32), cfg)
  u = lax.stop_gradient(u) / cfg.temperature  # [B, C, W]
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
  """Value only (no gradient requested). Chunked inputs: [N, B, C, ...]."""

  def step(carry, xs):
    hs_c = _zero_masked(xs[0], xs[3])
    ht_c = xs[1] if cfg.given else _zero_masked(xs[1], xs[3])
    z, u = _chunk_logits(cfg, hs_c, ws, ht_c, wt, xs[3])
    loss, sums, _ = _chunk_loss(cfg, z, u, xs[2], xs[3])
    return (carry[0] + loss, _add(carry[1], sums)), None

  init = (jnp.zeros((), jnp.float32), _zero_sums(cfg))
  out, _ = lax.scan(step, init, (hs, ht, w, m))
  return out


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
  f32 = jnp.float32
  _, b, size, d_model = hs.shape
  width = ws.shape[1]
  n_slabs = _head_slabs(d_model, width, b * size)
  slab_shape = (_GROUPS, n_slabs, width // (_GROUPS * n_slabs))
  # The gradient w.r.t. the chunk's logits is the closed form (autodiff would
  # keep more [B, C, V] residuals alive); the two matmuls back to hs and ws
  # are written out for the slab-wise ws update.

  def step(carry, xs):
    loss, sums, dws = carry  # dws: [D, G, S, W] (or [D, V] when S == 1)
    hs_c, ht_c, w_c, m_c = xs
    # Zeroed once here: the head gradient below uses hs_c as well.
    hs_c = _zero_masked(hs_c, m_c)
    ht_c = ht_c if cfg.given else _zero_masked(ht_c, m_c)
    z, u = _chunk_logits(cfg, hs_c, ws, ht_c, wt, m_c)
    l, s, dz = _chunk_loss(cfg, z, u, w_c, m_c, with_grad=True)
    # [B, C, W]: z above is logits / tau; 0 on the padding columns.
    dz = (dz / cfg.temperature).astype(ws.dtype)
    dhs = jnp.einsum("bcv,sv->bcs", dz, ws,
                     preferred_element_type=f32).astype(hs.dtype)
    if n_slabs == 1:
      dws = dws + jnp.einsum("bcs,bcv->sv", hs_c, dz, preferred_element_type=f32)
    else:
      dz = dz.reshape(dz.shape[:2] + slab_shape)  # [B, C, G, S, W]

      def add_slab(j, acc):
        dz_j = lax.dynamic_index_in_dim(dz, j, axis=3, keepdims=False)
        upd = jnp.einsum("bcs,bcgw->sgw", hs_c, dz_j, preferred_element_type=f32)
        cur = lax.dynamic_index_in_dim(acc, j, axis=2, keepdims=False)
        return lax.dynamic_update_index_in_dim(acc, cur + upd, j, axis=2)

      dws = lax.fori_loop(0, n_slabs, add_slab, dws)
    return (loss + l, _add(sums, s), dws), dhs

  acc_shape = ws.shape if n_slabs == 1 else (d_model,) + slab_shape
  init = (jnp.zeros((), f32), _zero_sums(cfg), jnp.zeros(acc_shape, f32))
  (loss, sums, dws), dhs = lax.scan(step, init, (hs, ht, w, m))
  return (loss, sums), (dhs, dws.reshape(ws.shape).astype(ws.dtype))


def _fused_bwd(cfg, res, g):
  del cfg
  dhs, dws = res
  g_loss = g[0]  # the monitoring sums are not differentiated
  return (g_loss.astype(dhs.dtype) * dhs, g_loss.astype(dws.dtype) * dws,
          None, None, None, None)


_fused.defvjp(_fused_fwd, _fused_bwd)


def _to_chunks(x, n, size):
  """[B, T, ...] -> [N, B, C, ...], zero-padding T up to N * C."""
  pad = n * size - x.shape[1]
  x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
  x = x.reshape((x.shape[0], n, size) + x.shape[2:])
  return jnp.moveaxis(x, 1, 0)


def fused_divergence(student_hidden, student_head, teacher_hidden, teacher_head,
                     mask, *, kind="forward", beta=0.5, temperature=1.0,
                     reduction="token_mean", vocab_size=None,
                     chunk_size=DEFAULT_CHUNK_SIZE, teacher_topk=None,
                     topk_variant="renorm"):
  """`divergence(hs @ ws, ht @ wt, mask, ...)` without the [B, T, V] logits.

  Args:
    student_hidden: [B, T, D_s] final (normed) student hidden states.
    student_head: [D_s, V_s] student output head (a tied embedding [V, D]
      passed as its transpose).
    teacher_hidden: [B, T, D_t]; teacher_head: [D_t, V_t]. No gradient flows
      into either.
    mask, kind, beta, temperature, reduction, vocab_size: as in `divergence`.
    chunk_size: token positions per scan step; peak extra memory is a few
      [B, chunk_size, V] float32 arrays.
    teacher_topk: None (exact), or k: each chunk's teacher logits are cut to
      their top-k and the loss is `topk_divergence(..., variant=topk_variant)`
      (with the teacher's exact tail mass).
    topk_variant: 'renorm' | 'tail' (losses/topk.py).

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
              temperature=temperature, reduction=reduction, vocab=vocab,
              chunk_size=chunk_size, topk=teacher_topk, variant=topk_variant,
              given=False)


def fused_topk_divergence(student_hidden, student_head, teacher_ids,
                          teacher_logprobs, mask, *, teacher_tail=None,
                          kind="forward", beta=0.5, temperature=1.0,
                          reduction="token_mean", vocab_size=None,
                          chunk_size=DEFAULT_CHUNK_SIZE, variant="renorm"):
  """`topk_divergence(hs @ ws, ids, logprobs, mask, ...)` without the
  [B, T, V] student logits: the fused path against a given (cached) top-k.

  teacher_ids, teacher_logprobs: [B, T, K]; teacher_tail: [B, T] or None
  (rebuilt from the log-probs, as in `topk_divergence`). Other arguments as
  in `fused_divergence`; vocab_size defaults to V_s.
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
              reduction=reduction, vocab=vocab, chunk_size=chunk_size,
              topk=teacher_ids.shape[-1], variant=variant, given=True)


def _run(student_hidden, student_head, teacher, teacher_head, mask, *, kind,
         beta, temperature, reduction, vocab, chunk_size, topk, variant,
         given):
  """Checks the shared arguments, then the chunked scan."""
  kind = c.check_kind(kind)
  beta = c.check_beta(beta)
  temperature = c.check_temperature(temperature)
  c.check_float(student_hidden, "student_hidden", 3)
  if student_head.shape[0] != student_hidden.shape[-1]:
    raise ValueError(
        f"student_head must be [D_s={student_hidden.shape[-1]}, V], "
        f"got {student_head.shape}")
  c.check_mask(mask, student_hidden.shape[:2])
  if (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)
      or chunk_size <= 0):
    raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")

  t = student_hidden.shape[1]
  size = min(chunk_size, max(t, 1))
  n = -(-t // size)
  weights = c.reduction_weights(mask, reduction)  # [B, T]
  m = mask.astype(jnp.float32)
  cfg = _Static(kind, beta, temperature, vocab, topk, variant, given)
  chunks = functools.partial(_to_chunks, n=n, size=size)
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
  loss, sums = _fused(
      cfg, chunks(student_hidden), student_head,
      jax.tree.map(chunks, teacher), teacher_head, chunks(weights), chunks(m))

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
