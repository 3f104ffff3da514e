"""The package's import rules, read from the source with `ast`: the library
layers import nothing from the commands, and modules import at the top except
optional heavy dependencies."""
import ast
import pathlib

import pytest

PKG = pathlib.Path(__file__).resolve().parents[1] / "jaxdistill"
LIBRARY = ("models", "losses", "tasks", "data", "rollout")
COMMANDS = ("train", "evaluate", "sweep", "rl", "analysis", "demo", "bench")
# Imported inside functions on purpose: heavy, optional or only for one path.
LOCAL_OK = ("matplotlib", "transformers", "tokenizers", "pyarrow",
            "tensorboardX", "torch", "trl", "datasets",
            "configs")  # the checkout's configs/: absent from an installed package


def _imports(path):
  """(module name, is_top_level) of every import in a file."""
  tree = ast.parse(path.read_text())
  top = set(map(id, tree.body))
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0:
      names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    else:
      continue
    for n in names:
      yield n, id(node) in top


def _files(*parts):
  return sorted((PKG.joinpath(*parts)).rglob("*.py"))


@pytest.mark.parametrize("layer", LIBRARY)
def test_library_layers_import_no_command(layer):
  bad = [(str(f.relative_to(PKG)), n) for f in _files(layer)
         for n, _ in _imports(f)
         if n.split(".")[0] == "jaxdistill" and len(n.split(".")) > 1
         and n.split(".")[1] in COMMANDS
         and not f.name == "inspect.py"]  # models.inspect is a command
  assert not bad, bad


def test_imports_are_at_the_top():
  bad = [(str(f.relative_to(PKG)), n) for f in _files()
         for n, top in _imports(f)
         if not top and n.split(".")[0] not in LOCAL_OK]
  assert not bad, bad
