"""runlocal grids (grid.local_assets, set by grid.make_runlocal): a tiny
tokenizer and student checkpoint, so that a sweep's runlocal path is the real
one (student loaded from a Hugging Face directory, tokenizer saved with the
export, evaluation with a baseline), only tiny.
"""
from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np

from jaxdistill import models
from jaxdistill import storage
from jaxdistill.data import tokenizer as tok_lib


def prepare_assets(grid, workdir: str) -> None:
  """Writes <workdir>/assets/{tokenizer,student} once (the same for every
  arm) and points grid.base's student and tokenizer at them. On gs:// they
  are made locally and uploaded (config.json, tokenizer.json last): the
  runs read them back through their mirrors (storage.mirror)."""
  if storage.is_gs(workdir):
    remote = f"{workdir}/assets"
    if not storage.isfile(f"{remote}/student/config.json"):
      local = storage.local_staging("jaxdistill-assets-")
      _make(grid, os.path.join(local, "tokenizer"),
            os.path.join(local, "student"))
      storage.upload_dir(os.path.join(local, "tokenizer"),
                         f"{remote}/tokenizer", last="tokenizer.json")
      storage.upload_dir(os.path.join(local, "student"),
                         f"{remote}/student", last="config.json")
    _point(grid, f"{remote}/student", f"{remote}/tokenizer")
    return
  root = os.path.join(os.path.abspath(workdir), "assets")
  tok_dir, student_dir = os.path.join(root, "tokenizer"), os.path.join(root, "student")
  if not os.path.isfile(os.path.join(student_dir, "model.safetensors")):
    _make(grid, tok_dir, student_dir)
  _point(grid, student_dir, tok_dir)


def _point(grid, student_dir: str, tok_dir: str) -> None:
  b = grid.base
  b.student.path, b.student.init = student_dir, None
  b.tokenizer = tok_dir


def _make(grid, tok_dir: str, student_dir: str) -> None:
  """The tiny tokenizer and student, saved to tok_dir and student_dir."""
  tok = tok_lib.train_bpe_tokenizer(
      tok_lib.countdown_texts((3, 4, 5, 6), 20), 300, tok_dir)
  init = dict(grid.base.student.init or {})
  if not init:
    raise ValueError("grid.local_assets: needs grid.base.student.init (the "
                     "tiny student's ModelConfig fields)")
  cfg = dataclasses.replace(models.ModelConfig(), **init)
  if cfg.vocab_size < len(tok):
    raise ValueError(f"grid.base.student.init.vocab_size: {cfg.vocab_size} < "
                     f"the local tokenizer's {len(tok)} tokens")
  rng = np.random.default_rng(0)

  def fill(path, s):
    norm = "norm" in jax.tree_util.keystr(path) or "scale" in jax.tree_util.keystr(path)
    return np.asarray(rng.normal(0.0, 0.2, s.shape) + norm, s.dtype)
  params = jax.tree_util.tree_map_with_path(fill, models.param_shapes(cfg))
  tmp = student_dir + ".tmp"
  models.save_pretrained(cfg, params, tmp)
  tok.save_pretrained(tmp)
  os.replace(tmp, student_dir)
