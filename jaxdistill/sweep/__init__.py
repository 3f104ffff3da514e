"""The study as experiments: `python -m jaxdistill.sweep` (a grid of runs).

  cli.py       the command: run every arm, or print their launch commands
  grid.py      grid configs -> runs (names, configs, commands, snapshots)
  runner.py    runs the arms one after another (train, evaluate), resumes
  rlvr.py      the optional GRPO stage after the arms
  runlocal.py  runlocal grids' tiny tokenizer and student (grid.local_assets)
  table.py     results.csv / results.md: per arm mean, std, n over seeds
  figures.py   the summary figures
"""
