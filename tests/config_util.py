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
