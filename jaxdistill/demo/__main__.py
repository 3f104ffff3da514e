from jaxdistill import cli
from jaxdistill.demo.cli import main

if __name__ == "__main__":
  cli.run(main)
