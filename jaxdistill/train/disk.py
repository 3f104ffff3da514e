"""The disk a training run needs, worked out from its config before it starts.

A checkpoint (train/checkpoint.py) holds the train state: the student's
params in student.param_dtype, the optimizer's state (AdamW's two moments
in optim.moment_dtype, else each in its weight's dtype, and its counters)
and the step. Its bytes S are those of jax.eval_shape of the state built
from the model config's parameter shapes: no weight is read. Orbax writes
them zstd-compressed (never larger than the arrays; float32 weights and
moments shrink little) plus metadata that grows with the number of leaves
(CKPT_META_BYTES_PER_LEAF, measured: ~1 KB a leaf). The export
<workdir>/hf_student holds the student's weights in student.param_dtype (E,
safetensors) and its tokenizer; the tokenizer, config files and logs are
covered by SMALL_FILES_BYTES. Under LoRA (student.lora) a checkpoint holds
the adapters and their optimizer state only, and E is the merged model plus
the adapters (hf_adapter/).

With k = keep_ckpts and n checkpoint saves (every ckpt_every steps and the
last step):

  peak   max(min(k + 1, n) S, min(k, n) S + E): Orbax removes the oldest
         checkpoint only once the next one is committed, so a save past the
         k-th briefly holds k + 1; the export is written while k are kept.
  kept   S + E with keep_final_only (older checkpoints are deleted once the
         final one is saved and the export written), else min(k, n) S + E.

With config.export_every, the run also writes E for each of its step
exports (step_exports), all kept: they add x E to both figures.

`check_free` refuses a local run whose file system has less free space than
the peak still to come, in one line, before any compute; a gs:// workdir is
not checked (the line says so in the log).
"""
from __future__ import annotations

import functools
import logging
import math
import os
import shutil

import jax

from jaxdistill import models
from jaxdistill import storage
from jaxdistill.models import lora
from jaxdistill.train import checkpoint as ckpt_lib
from jaxdistill.train import step as step_lib

# Orbax's metadata per checkpoint (_METADATA, _sharding, array metadata,
# manifests): about 1 KB per leaf of the state measured on Orbax 0.12
# (36 KB for the 40 leaves of configs/distill.py:runlocal's state); allowed
# twice that, plus a fixed part.
CKPT_META_BYTES_PER_LEAF = 2048
CKPT_META_BYTES = 64 * 1024
# The export's tokenizer (a Qwen2.5 or Llama 3 tokenizer.json is 7-9 MB),
# config files, metrics.jsonl and TensorBoard events of a run.
SMALL_FILES_BYTES = 32 * 2**20


def state_struct(config, scfg):
  """jax.ShapeDtypeStructs of the train state {params, opt_state, step} of
  `config` (configs/distill.py or configs/grpo_*.py) for the student `scfg`:
  what a checkpoint holds, so under LoRA the adapters and their optimizer
  state (the frozen base is not saved)."""
  lcfg = lora.from_config(config.student.get("lora"))
  params = (models.param_shapes(scfg) if lcfg is None
            else lora.shapes(scfg, lcfg))
  optimizer, _ = step_lib.make_optimizer(
      config.optim, max(int(config.total_steps), 1),
      scfg.param_dtype if lcfg is None else lcfg.dtype)
  return jax.eval_shape(functools.partial(step_lib.new_state, optimizer),
                        params)


def _nbytes(tree) -> int:
  return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def step_exports(config) -> list[int]:
  """The steps config.export_every exports before the last one (the last is
  hf_student/): every export_every steps, ascending; [] when off."""
  every = int(config.get("export_every") or 0)
  total = int(config.total_steps)
  return list(range(every, total, every)) if every > 0 else []


def num_saves(config) -> int:
  """Checkpoints a run from step 0 writes: every ckpt_every steps and at
  the last step."""
  total, every = int(config.total_steps), max(int(config.ckpt_every), 1)
  return total // every + (1 if total % every else 0)


def need(config, scfg) -> dict:
  """Bytes of one checkpoint (`state`: the arrays; `checkpoint`: with
  Orbax's metadata allowance), of the export, and the run's `peak` and
  `kept` (module docstring)."""
  state = state_struct(config, scfg)
  arrays = _nbytes(state)
  ckpt = (arrays + CKPT_META_BYTES
          + CKPT_META_BYTES_PER_LEAF * len(jax.tree.leaves(state)))
  # The export: the model (merged under LoRA; hf_adapter/ beside it).
  adapters = lora.from_config(config.student.get("lora")) is not None
  export = (_nbytes(models.param_shapes(scfg)) + (
      _nbytes(state["params"]) if adapters else 0)
            if config.get("export_hf", True) else 0)
  k, n = int(config.keep_ckpts), num_saves(config)
  steps = len(step_exports(config)) if config.get("export_hf", True) else 0
  peak = max(min(k + 1, n) * ckpt, min(k, n) * ckpt + export) + steps * export
  kept = ((1 if config.get("keep_final_only", False) else min(k, n)) * ckpt
          + steps * export)
  return {"state_bytes": arrays, "checkpoint_bytes": ckpt,
          "export_bytes": export, "keep_ckpts": k, "saves": n,
          "step_exports": steps,
          "max_checkpoints": min(k + 1, n),
          "keep_final_only": bool(config.get("keep_final_only", False)),
          "peak_bytes": peak + SMALL_FILES_BYTES,
          "kept_bytes": kept + export + SMALL_FILES_BYTES}


def gb(n: float) -> str:
  """Bytes in MB, GB or TB (powers of 1,000), three significant digits."""
  for unit, size in (("TB", 1e12), ("GB", 1e9)):
    if n >= size:
      return f"{n / size:.3g} {unit}"
  return f"{n / 1e6:.3g} MB"


def describe(d: dict) -> str:
  """One line: a checkpoint, the export, the peak and what is kept."""
  kept = ("the final checkpoint and the export" if d["keep_final_only"] else
          f"{min(d['keep_ckpts'], d['saves'])} checkpoint(s) and the export")
  if d.get("step_exports"):
    kept += f", and {d['step_exports']} step export(s) (export_every)"
  return (f"disk: {gb(d['peak_bytes'])} at most while training "
          f"(up to {d['max_checkpoints']} checkpoint(s) of "
          f"{gb(d['checkpoint_bytes'])} at once with keep_ckpts="
          f"{d['keep_ckpts']}; export {gb(d['export_bytes'])}), "
          f"{gb(d['kept_bytes'])} kept after ({kept})")


def dir_bytes(path: str) -> int:
  """Bytes of the files under a local directory (0 if it is missing)."""
  total = 0
  for d, _, names in os.walk(path):
    for name in names:
      try:
        total += os.lstat(os.path.join(d, name)).st_size
      except OSError:
        pass
  return total


def _existing(path: str) -> str:
  while not os.path.exists(path):
    parent = os.path.dirname(path)
    if parent == path:
      break
    path = parent
  return path


def check_free(config, scfg, workdir: str, *, finished: bool = False) -> dict:
  """Refuses (ValueError, one line) a local workdir whose file system lacks
  the free space for the run's peak, less what its checkpoints and export
  already take (a resumed run). A finished run (`finished`: its final
  checkpoint is kept) writes no more checkpoints and is not checked, nor is
  a gs:// workdir. Returns need()'s dict."""
  d = need(config, scfg)
  if storage.is_gs(workdir):
    logging.info("%s; %s: free space on gs:// is not checked", describe(d),
                 workdir)
    return d
  if finished:
    return d
  have = (dir_bytes(os.path.join(workdir, "checkpoints"))
          + dir_bytes(os.path.join(workdir, "hf_student")))
  needed = max(d["peak_bytes"] - have, 0)
  free = shutil.disk_usage(_existing(workdir)).free
  if free < needed:
    raise ValueError(
        f"{workdir}: {gb(free)} free, the run needs {gb(needed)} more "
        f"({describe(d)}); free space, lower config.keep_ckpts, or use "
        "another --workdir")
  logging.info("%s; %s free in %s", describe(d), gb(free), workdir)
  return d


def check_run(config, scfg, workdir: str) -> dict:
  """check_free for a run about to start or resume in `workdir`: finished
  when its final checkpoint is kept."""
  done = int(config.total_steps) in ckpt_lib.kept_steps(
      os.path.join(workdir, "checkpoints"))
  return check_free(config, scfg, workdir, finished=done)
