"""Every ```python block of README.md runs as written, each on its own (a
fresh namespace, nothing from the blocks before it), offline: the hub names
it uses are served by the seeded Hugging Face cache (tests/hub_cache.py)."""
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", README.read_text(),
                    flags=re.S | re.M)


def test_the_readme_has_python_blocks():
  assert len(BLOCKS) >= 4


@pytest.mark.slow  # compiles the losses, a forward pass and a rollout (~30 s)
@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_block_runs_as_written(i, hf_cache, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # a block may write files (save_pretrained)
  code = compile(BLOCKS[i], f"README.md python block {i + 1}", "exec")
  exec(code, {"__name__": "__readme__"})  # pylint: disable=exec-used
