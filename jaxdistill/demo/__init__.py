"""The whole study in miniature on a laptop CPU: `python -m jaxdistill.demo`.

  from jaxdistill import demo
  result = demo.main(['--quick', '--workdir', '/tmp/demo'])   # same as the CLI

Modules: tasks (step-by-step arithmetic, the addition suite), build (tokenizer,
teacher and student, cached), study (the grid through jaxdistill.sweep and the
evaluation), report (table, figures, findings), checks (every setting,
before any work). The settings, and why the grid's learning rates are 5e-7
and 2e-4 (what was measured at seven rates), are in configs/demo.py.
"""
from jaxdistill.demo.cli import main  # pylint: disable=unused-import
