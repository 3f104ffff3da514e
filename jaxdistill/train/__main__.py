"""`python -m jaxdistill.train`: the command line of jaxdistill/train/loop.py."""
from jaxdistill import cli
from jaxdistill.train import loop

__doc__ = loop.__doc__  # what absl's --help prints

if __name__ == "__main__":
  cli.run_absl(loop.main, loop.define_train_flags)
