import sys

from jaxdistill.demo.cli import main

if __name__ == "__main__":
  main(sys.argv[1:])
