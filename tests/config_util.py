"""Config helpers the tests share."""


def set_fields(config, updates):
  """Sets dotted fields ({'optim.lr': 1e-4}) of a ConfigDict; returns it."""
  for key, value in updates.items():
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return config


def runlocal_distill(**updates):
  """configs/distill.py:runlocal, quiet, with dotted-field `updates`."""
  from jaxdistill import config_lib  # pylint: disable=g-import-not-at-top
  c = config_lib.load_config("configs/distill.py:runlocal")
  c.progress = False
  return set_fields(c, updates)


def restore_checkpoint(workdir, step):
  """(state as NumPy, meta) of the checkpoint a run saved at `step`."""
  import os  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from jaxdistill.train import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  mngr = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"))
  out = mngr._mngr.restore(step, args=ocp.args.Composite(  # pylint: disable=protected-access
      state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()))
  mngr.close()
  return jax.tree.map(np.asarray, out["state"]), dict(out["meta"])
