"""Host-side helpers: left-pad prompt batches to length buckets, read responses.

Compiled rollouts are specialised to the prompt width, so widths are rounded
up to a bucket (a power of two, or a multiple of an integer) and every batch
in a bucket reuses one compilation.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def bucket_length(n: int, bucket: str | int | None = "pow2") -> int:
  """Rounds a prompt width up to its bucket.

  Args:
    n: width (>= 1).
    bucket: 'pow2' (next power of two), an int m (next multiple of m), or None
      (no rounding).
  """
  if n < 1:
    raise ValueError(f"n: prompt width must be >= 1, got {n}")
  if bucket is None:
    return n
  if bucket == "pow2":
    return 1 << (n - 1).bit_length()
  if isinstance(bucket, (int, np.integer)) and not isinstance(bucket, bool):
    if bucket < 1:
      raise ValueError(f"bucket: must be >= 1, got {bucket}")
    return -(-n // int(bucket)) * int(bucket)
  raise ValueError(f"bucket: expected 'pow2', a positive int or None, got {bucket!r}")


def pad_prompts(token_ids: Sequence[Sequence[int]], *, pad_token_id: int = 0,
                bucket: str | int | None = "pow2", length: int | None = None):
  """Left-pads token-id lists into a batch.

  Args:
    token_ids: B non-empty lists of token ids.
    pad_token_id: id written into padding (masked out anyway).
    bucket: rounding of the width, see `bucket_length`.
    length: exact width instead of a bucket (must fit the longest prompt).

  Returns:
    prompts [B, P] int32 and prompt_mask [B, P] int32 (1 on real tokens), both
    NumPy; real tokens are right-aligned.
  """
  if len(token_ids) == 0:
    raise ValueError("token_ids: need at least one prompt")
  rows = [np.asarray(t, np.int64).reshape(-1) for t in token_ids]
  for i, r in enumerate(rows):
    if r.size == 0:
      raise ValueError(f"token_ids[{i}]: empty prompt")
    if r.min() < 0:
      raise ValueError(f"token_ids[{i}]: negative token id {r.min()}")
  longest = max(r.size for r in rows)
  if length is None:
    width = bucket_length(longest, bucket)
  elif length < longest:
    raise ValueError(f"length: {length} is shorter than the longest prompt ({longest})")
  else:
    width = int(length)
  prompts = np.full((len(rows), width), pad_token_id, np.int32)
  mask = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    prompts[i, width - r.size:] = r
    mask[i, width - r.size:] = 1
  return prompts, mask


def response_token_ids(rollout, *, include_eos: bool = False) -> list[list[int]]:
  """The generated ids of each row, up to its end (EOS kept if include_eos)."""
  p = rollout.prompt_mask.shape[1]
  toks = np.asarray(rollout.tokens)[:, p:]
  mask = np.asarray(rollout.response_mask).astype(bool)
  ended = np.asarray(rollout.ended).astype(bool)
  out = []
  for t, m, e in zip(toks, mask, ended):
    ids = t[m].tolist()
    if e and not include_eos:
      ids = ids[:-1]
    out.append(ids)
  return out


def decode_responses(rollout, tokenizer, **decode_kwargs) -> list[str]:
  """Response texts via a Hugging Face tokenizer (EOS dropped)."""
  return [tokenizer.decode(ids, **decode_kwargs)
          for ids in response_token_ids(rollout, include_eos=False)]
