"""`python -m jaxdistill.sweep`: the command line of jaxdistill/sweep/cli.py."""
from jaxdistill import cli
from jaxdistill.sweep import cli as sweep_cli

__doc__ = sweep_cli.__doc__  # what absl's --help prints

if __name__ == "__main__":
  cli.run_absl(sweep_cli.main, sweep_cli.define_flags)
