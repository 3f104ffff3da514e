"""Every notebook in colab/ runs top to bottom on CPU (tiny / quick settings)."""
import glob
import os

import nbclient
import nbformat
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(REPO, "colab", "*.ipynb")))


def test_every_family_has_a_notebook():
  names = {os.path.basename(p) for p in NOTEBOOKS}
  assert {"quickstart.ipynb", "llama.ipynb", "qwen.ipynb"} <= names


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_executes(path, tmp_path, monkeypatch, request):
  # The kernel inherits the environment: small settings and scratch dirs.
  monkeypatch.setenv("JAXDISTILL_NOTEBOOK_TINY", "1")
  monkeypatch.setenv("JAXDISTILL_NOTEBOOK_QUICK", "1")
  monkeypatch.setenv("JAXDISTILL_NOTEBOOK_WORKDIR", str(tmp_path / "nb"))
  # The quickstart runs the quick demo: in the session's quick_demo workdir,
  # whose models and arms it reuses (tests/demo_test.py covers the training).
  demo_dir = (request.getfixturevalue("quick_demo")[0]
              if os.path.basename(path) == "quickstart.ipynb"
              else tmp_path / "demo")
  monkeypatch.setenv("JAXDISTILL_DEMO_WORKDIR", str(demo_dir))
  monkeypatch.setenv("PYTHONPATH", REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  nb = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(nb, timeout=1800, kernel_name="python3",
                                   resources={"metadata": {"path": REPO}})
  client.execute()  # raises CellExecutionError with the failing cell's traceback
  errors = [o for c in nb.cells if c.cell_type == "code"
            for o in c.get("outputs", []) if o.get("output_type") == "error"]
  assert not errors
