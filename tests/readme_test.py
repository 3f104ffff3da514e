"""Every ```python block of README.md and of each docs/*.md page runs as
written, each on its own (a fresh namespace, nothing from the blocks before
it), offline: the hub names they use are served by the seeded Hugging Face
cache (tests/hub_cache.py)."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _blocks(page):
  return re.findall(r"^```python\n(.*?)^```$", page.read_text(),
                    flags=re.S | re.M)


BLOCKS = [(p.relative_to(ROOT).as_posix(), i, code)
          for p in PAGES for i, code in enumerate(_blocks(p))]


def test_the_pages_have_python_blocks():
  per_page = {}
  for name, _, _ in BLOCKS:
    per_page[name] = per_page.get(name, 0) + 1
  assert per_page.get("README.md", 0) >= 1  # the losses in ten lines
  assert len(BLOCKS) >= 5
  assert {"docs/losses.md", "docs/models_and_rollouts.md"} <= set(per_page)


@pytest.mark.slow  # compiles the losses, a forward pass and a rollout (~30 s)
@pytest.mark.parametrize("name,i,code", BLOCKS,
                         ids=[f"{n}:{i + 1}" for n, i, _ in BLOCKS])
def test_block_runs_as_written(name, i, code, hf_cache, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # a block may write files (save_pretrained)
  compiled = compile(code, f"{name} python block {i + 1}", "exec")
  exec(compiled, {"__name__": "__readme__"})  # pylint: disable=exec-used


def test_the_readme_is_a_page_a_newcomer_holds():
  # Measured tables live in docs/; the README stays short (issue 63).
  lines = (ROOT / "README.md").read_text().splitlines()
  assert len(lines) <= 150, len(lines)
