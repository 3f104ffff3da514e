"""The package's import rules, read from the source with `ast`: the library
layers import nothing from the commands, the foundations nothing but each
other, no module imports itself back through others, and modules import at
the top except optional heavy dependencies."""
import ast
import pathlib

import pytest

PKG = pathlib.Path(__file__).resolve().parents[1] / "jaxdistill"
LIBRARY = ("models", "losses", "tasks", "data", "rollout")
COMMANDS = ("train", "evaluate", "sweep", "rl", "analysis", "demo", "bench")
# Every part may import these; they import nothing of the package but each other.
FOUNDATIONS = ("config_lib", "sharding", "cli", "choices", "storage")
# Imported inside functions on purpose: heavy, optional or only for one path.
LOCAL_OK = ("matplotlib", "transformers", "tokenizers", "pyarrow",
            "tensorboardX", "torch", "trl", "datasets",
            # the optional extras: lmeval, math, style
            "lm_eval", "math_verify", "langdetect", "wandb",
            "configs")  # the checkout's configs/: absent from an installed package
# The package's modules that need an optional extra to import (evaluate/run.py
# loads the harness only when an lm-eval suite is evaluated).
OPTIONAL_MODULES = ("jaxdistill.evaluate.harness",)


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
         if not top and n.split(".")[0] not in LOCAL_OK
         and n not in OPTIONAL_MODULES]
  assert not bad, bad


def _module_name(path):
  parts = path.relative_to(PKG.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph():
  """{module: the package's modules it imports at its top level}; `from a.b
  import c` points at a.b.c when that is a module, else at a.b."""
  files = {_module_name(f): f for f in _files()}
  graph = {}
  for name, path in files.items():
    deps = set()
    for node in ast.parse(path.read_text()).body:
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.level == 0:
        targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files
                   else node.module for a in node.names]
      else:
        continue
      deps |= {t for t in targets if t in files and t != name}
    graph[name] = deps
  return graph


def _cycles(graph):
  """The strongly connected components with more than one module (Tarjan)."""
  index, low, stack, on_stack, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def test_cycle_finder_finds_a_circle():
  # The check below is only as good as this: a -> b -> c -> a is found, a
  # diamond is not a circle.
  assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
      ["a", "b", "c"]]
  assert _cycles({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}) == []


def test_no_import_cycles():
  graph = _graph()
  assert "jaxdistill.sweep.table" in graph and graph["jaxdistill.sweep.runner"]
  assert not _cycles(graph), _cycles(graph)


@pytest.mark.parametrize("module", FOUNDATIONS)
def test_foundations_import_only_foundations(module):
  path = PKG / f"{module}.py"
  assert path.is_file(), path
  bad = [n for n, _ in _imports(path)
         if n.split(".")[0] == "jaxdistill" and len(n.split(".")) > 1
         and n.split(".")[1] not in FOUNDATIONS]
  assert not bad, bad
