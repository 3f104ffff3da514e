"""Evaluation: `python -m jaxdistill.evaluate` (a checkpoint on the study's suites).

  run.py       the command: load a checkpoint (and a baseline), evaluate, report;
               forgetting and update sparsity against the baseline
  core.py      suites -> rollouts -> verifier -> per-suite metrics
  report.py    tables, group means, forgetting and sparsity keys
  suites.py    the suites an eval config names (Countdown splits, MCQ files)
  metrics.py   accuracy, pass@k, distinct correct answers, forgetting
  harness.py   lm-evaluation-harness on our models (`python -m
               jaxdistill.evaluate.harness`, the paper's seven OOD benchmarks;
               needs the `lmeval` extra, imported only there)
Update sparsity itself is jaxdistill/sparsity.py.
"""
