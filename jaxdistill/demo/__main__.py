from jaxdistill.demo.cli import main

if __name__ == "__main__":
  from jaxdistill import cli  # pylint: disable=g-import-not-at-top
  cli.run(main)
