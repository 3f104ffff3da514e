"""`python -m jaxdistill.evaluate`: the command line of jaxdistill/evaluate/run.py."""
from jaxdistill import cli
from jaxdistill.evaluate import run

__doc__ = run.__doc__  # what absl's --help prints

if __name__ == "__main__":
  cli.run_absl(run.main, run.define_flags)
