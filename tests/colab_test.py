"""Every notebook in colab/ runs top to bottom on CPU (tiny / quick settings),
as a Colab user gets it: jaxdistill installed NOT editable into a fresh virtual
environment (so configs/ must come from the installed package), the kernel
started by that environment's Python in a directory outside the checkout."""
import glob
import os
import pathlib
import site
import subprocess
import sys
import sysconfig
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(REPO, "colab", "*.ipynb")))


def test_every_family_has_a_notebook():
  names = {os.path.basename(p) for p in NOTEBOOKS}
  assert {"quickstart.ipynb", "llama.ipynb", "qwen.ipynb"} <= names


def _clean_env(**extra) -> dict:
  env = {k: v for k, v in os.environ.items()
         if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
  env.update(extra)
  return env


@pytest.fixture(scope="module")
def installed_python(tmp_path_factory):
  """A fresh venv's python with jaxdistill installed from a build of a copy
  of the checkout's files (`pip install <dir>`, not -e). The dependencies come
  from the environment running the tests (--no-deps: no downloads in tests):
  a .pth file puts its site-packages after the venv's own, so `import
  jaxdistill` finds the installed copy, not an editable install of the
  checkout. (Not --system-site-packages: when the tests run in a venv, that
  would be the base interpreter's packages, without this environment's pip
  setup, setuptools and dependencies.)"""
  root = tmp_path_factory.mktemp("nb_venv")
  venv = root / "venv"
  # --without-pip: the venv runs this environment's pip and setuptools (3.11's
  # ensurepip would bring a setuptools too old to build a wheel offline).
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                 check=True)
  python = str(venv / "bin" / "python")
  own = subprocess.run([python, "-c", "import sysconfig; print(sysconfig."
                        "get_path('purelib'))"], check=True,
                       capture_output=True, text=True).stdout.strip()
  outer = [p for p in site.getsitepackages() + [sysconfig.get_path("purelib")]
           if os.path.isdir(p)]
  # As --system-site-packages would: added after the venv's own, with their
  # .pth files.
  pathlib.Path(own, "zz_outer_environment.pth").write_text("".join(
      f"import site; site.addsitedir({p!r})\n" for p in dict.fromkeys(outer)))
  # A copy, so the build's egg-info / build/ never land in the checkout.
  src = root / "src"
  files = subprocess.run(["git", "-C", REPO, "ls-files", "-co",
                          "--exclude-standard"], check=True, capture_output=True,
                         text=True).stdout.split()
  for f in files:
    if os.path.isfile(os.path.join(REPO, f)):
      dst = src / f
      dst.parent.mkdir(parents=True, exist_ok=True)
      dst.write_bytes(open(os.path.join(REPO, f), "rb").read())
  subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps",
                  "--no-build-isolation", str(src)], check=True,
                 env=_clean_env(), cwd=str(root))
  where = subprocess.run(
      [python, "-c", "import jaxdistill, os; print(jaxdistill.__file__)"],
      check=True, capture_output=True, text=True, env=_clean_env(),
      cwd=str(root)).stdout.strip()
  assert where.startswith(str(venv)), where  # the installed copy, not REPO
  return python, root


def test_installed_package_finds_its_configs(installed_python):
  python, root = installed_python
  out = subprocess.run(
      [python, "-c", textwrap.dedent("""
        from jaxdistill import config_lib
        print(config_lib.find_config('configs/distill.py'))
        c = config_lib.load_config('configs/grpo_after_distill.py:runlocal')
        print(c.total_steps > 0)""")],
      check=True, capture_output=True, text=True, env=_clean_env(),
      cwd=str(root)).stdout.split()
  assert "site-packages" in out[0] and out[0].endswith(
      os.path.join("jaxdistill", "configs", "distill.py")), out
  assert out[1] == "True"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_executes(path, installed_python, tmp_path, request):
  python, root = installed_python
  # The kernel inherits the environment: small settings and scratch dirs.
  # The quickstart runs the quick demo: in the session's quick_demo workdir,
  # whose models and arms it reuses (tests/demo_test.py covers the training).
  demo_dir = (request.getfixturevalue("quick_demo")[0]
              if os.path.basename(path) == "quickstart.ipynb"
              else tmp_path / "demo")
  env = _clean_env(JAXDISTILL_NOTEBOOK_TINY="1", JAXDISTILL_NOTEBOOK_QUICK="1",
                   JAXDISTILL_NOTEBOOK_WORKDIR=str(tmp_path / "nb"),
                   JAXDISTILL_DEMO_WORKDIR=str(demo_dir))
  # nbclient in the venv's python: its default kernel is that interpreter.
  runner = textwrap.dedent(f"""
      import nbclient, nbformat
      nb = nbformat.read({path!r}, as_version=4)
      client = nbclient.NotebookClient(nb, timeout=1800, kernel_name="python3",
                                       resources={{"metadata": {{"path": {str(tmp_path)!r}}}}})
      client.execute()  # raises CellExecutionError with the failing cell's traceback
      errors = [o for c in nb.cells if c.cell_type == "code"
                for o in c.get("outputs", []) if o.get("output_type") == "error"]
      assert not errors, errors
      text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.get("outputs", []))
      print(text)""")
  done = subprocess.run([python, "-c", runner], env=env, cwd=str(tmp_path),
                        capture_output=True, text=True)
  assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
  # The install cell's own report: the kernel imported the installed copy.
  assert "jaxdistill from " + os.path.dirname(python).rsplit("/bin", 1)[0] in done.stdout
