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
