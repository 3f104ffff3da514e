"""The whole study in miniature on a laptop CPU: `python -m jaxdistill.demo`.

  from jaxdistill import demo
  result = demo.main(['--quick', '--workdir', '/tmp/demo'])   # same as the CLI

Modules: tasks (step-by-step arithmetic, the addition suite), build (tokenizer,
teacher and student, cached), study (the grid through jaxdistill.sweep and the
evaluation), report (table, figures, findings).
"""
from jaxdistill.demo.cli import main  # pylint: disable=unused-import
