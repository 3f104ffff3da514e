"""The token ids a run's student processed: a boolean mask over its
embedding rows, for update sparsity's seen / unseen embedding rows
(jaxdistill/sparsity.py, docs/method.md section 8).

Seen: a token id that occurs, at a position with attention_mask 1, in the
`tokens` of any training batch the update ran on: prompt or completion,
dataset text or a rollout's sampled tokens (EOS included), never padding.
The input embedding gets gradient only at those rows; the output head gets
it at every row of the vocabulary the loss spans (the softmax), seen or not,
so under tied embeddings never-seen rows of the real vocabulary move too.

The mask is a replicated device array updated by a small jitted scatter per
step; every checkpoint's metadata carries it ('seen_tokens'), so a resumed
run continues it, and the loop writes it beside its export
(<workdir>/hf_student/seen_tokens.json, SEEN_FILE), where evaluation reads it
(read_seen).
"""
from __future__ import annotations

import json
import logging
import os

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import numpy as np

from jaxdistill import sharding
from jaxdistill import sparsity

META_KEY = "seen_tokens"
# Beside the export: the token ids its run processed.
SEEN_FILE = "seen_tokens.json"


def seen_to_json(seen) -> dict:
  """{'vocab_size', 'ids': the seen token ids, ascending}: the file's form."""
  seen = sparsity.check_seen(seen)
  return {"vocab_size": int(seen.shape[0]),
          "ids": [int(i) for i in np.flatnonzero(seen)]}


def seen_from_json(value, where: str = "seen tokens") -> np.ndarray:
  """The bool mask of seen_to_json's dict; ValueError naming `where`."""
  try:
    v, ids = int(value["vocab_size"]), np.asarray(value["ids"], np.int64)
  except (KeyError, TypeError, ValueError) as e:
    raise ValueError(f"{where}: expected {{'vocab_size', 'ids'}}, got "
                     f"{str(value)[:60]!r}") from e
  if ids.ndim != 1 or (ids.size and (ids.min() < 0 or ids.max() >= v)):
    raise ValueError(f"{where}: token ids outside [0, {v})")
  out = np.zeros(v, bool)
  out[ids] = True
  return out


def write_seen(directory: str, seen) -> str:
  """Writes <directory>/seen_tokens.json; returns its path."""
  path = os.path.join(directory, SEEN_FILE)
  with open(path, "w") as f:
    json.dump({"definition": "token ids at attention_mask == 1 in any "
               "training sequence the student processed", **seen_to_json(seen)},
              f)
  return path


def read_seen(directory: str) -> np.ndarray | None:
  """The mask of <directory>/seen_tokens.json, or None without that file."""
  path = os.path.join(directory, SEEN_FILE)
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    try:
      value = json.load(f)
    except ValueError as e:
      raise ValueError(f"{path}: not valid JSON ({e})") from None
  return seen_from_json(value, path)


@jax.jit
def _mark(seen, tokens, mask):
  rows = seen.shape[0]
  ids = jnp.where(mask.reshape(-1) > 0, tokens.reshape(-1), rows)
  return seen.at[ids].set(True, mode="drop")  # rows (padding): dropped


class SeenTokens:
  """The run's mask of seen token ids ([rows] bool, replicated on `mesh`)."""

  def __init__(self, rows: int, mesh, mask=None):
    self.rows = int(rows)
    self._shard = NamedSharding(mesh, PartitionSpec())
    host = (np.zeros(self.rows, bool) if mask is None
            else sparsity.check_seen(mask, self.rows, META_KEY))
    self._mask = sharding.put_global(host, self._shard)

  @classmethod
  def resume(cls, rows, mesh, meta: dict, start: int):
    """A fresh mask at step 0, the checkpoint's when resuming; None when the
    checkpoint predates the mask (what it saw before is unknown, so no
    seen / unseen split is reported)."""
    if start == 0:
      return cls(rows, mesh)
    if META_KEY not in meta:
      logging.warning("checkpoint %d holds no seen token ids: the embedding "
                      "rows' seen / unseen split is not reported", start)
      return None
    return cls(rows, mesh, seen_from_json(
        meta[META_KEY], f"checkpoint {start} meta {META_KEY!r}"))

  def add(self, batch) -> None:
    """Marks the token ids of a training batch (its tokens, attention_mask)."""
    self._mask = _mark(self._mask, batch["tokens"], batch["attention_mask"])

  def mask(self) -> np.ndarray:
    """The host copy (a collective on several processes: all must call it)."""
    return sharding.to_host(self._mask).astype(bool)

  def meta(self) -> dict:
    return {META_KEY: seen_to_json(self.mask())}
