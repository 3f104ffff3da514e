"""Test-wide setup: simulate 8 CPU devices so sharding tests can build meshes,
and share compiled programs between the commands tests start as subprocesses
through JAX's persistent cache (many compile the same tiny models; this
changes no result). The pytest processes themselves neither read nor write
that cache: serializing a CPU executable for it segfaulted a long-lived xdist
worker (jaxlib 0.10.2, twice at the same program, in CI on a cold cache; the
same test passes alone), and short-lived subprocesses never did. The quick
demo runs once per session (the `quick_demo` fixture).

With pytest-xdist (`-n auto`, the README's test command), each test file runs
whole on one worker, so module and session fixtures are built once per file;
the files that share the quick demo run on one worker, so it runs once."""
import contextlib
import io
import os

import pytest

# Must happen before JAX initialises its backends; subprocesses inherit these.
# XLA_FLAGS is often set already (GPU machines): add the device count to it.
_DEVICES = "--xla_force_host_platform_device_count"
if _DEVICES not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = " ".join(
      f for f in (os.environ.get("XLA_FLAGS", ""), f"{_DEVICES}=8") if f)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.expanduser(
    "~/.cache/jaxdistill/jax-compile-cache-tests"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# After the environment above: it is what subprocesses inherit; this process
# turns the persistent cache off for itself only (see the module docstring).
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

jax.config.update("jax_enable_compilation_cache", False)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
  """A crashed xdist worker fails the run at once: pytest-xdist 3.8's file
  scheduling (ByFile below, like its own --dist loadfile) hangs after it
  replaces a crashed worker, and CI would wait out its time limit. An
  explicit --max-worker-restart still wins."""
  if getattr(config.option, "maxworkerrestart", "") is None:
    config.option.maxworkerrestart = "0"


# Files whose tests request the `quick_demo` fixture: one worker runs them all.
QUICK_DEMO_FILES = ("demo_test.py", "colab_test.py")


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: absent without it
def pytest_xdist_make_scheduler(config, log):
  """Work units for xdist's workers: a test file, or all of QUICK_DEMO_FILES."""
  from xdist import scheduler  # pylint: disable=g-import-not-at-top

  class ByFile(scheduler.LoadScopeScheduling):

    def _split_scope(self, nodeid):
      path = nodeid.split("::", 1)[0]
      return ("quick_demo" if os.path.basename(path) in QUICK_DEMO_FILES
              else path)

  return ByFile(config, log)


@pytest.fixture(scope="session")
def quick_demo(tmp_path_factory):
  """`python -m jaxdistill.demo --quick`, run once per session (about 2 min):
  (workdir, summary, what it printed). The demo test goes on in this workdir;
  the quickstart notebook runs the same command there and finds its caches."""
  # Imported here: this file must set the XLA flags before JAX is imported.
  from jaxdistill import demo  # pylint: disable=g-import-not-at-top
  workdir = tmp_path_factory.mktemp("quick_demo")
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    summary = demo.main(["--quick", "--workdir", str(workdir)])
  return workdir, summary, out.getvalue()


@pytest.fixture(scope="session")
def seeded_hub(tmp_path_factory):
  """A Hugging Face hub cache seeded once per session (tests/hub_cache.py):
  (its directory, the commits of its repos). Tests must not change it: copy
  it first (shutil.copytree(..., symlinks=True)) to move a ref."""
  from tests import hub_cache  # pylint: disable=g-import-not-at-top
  d = tmp_path_factory.mktemp("hf_hub")
  return str(d), hub_cache.build(str(d))


@pytest.fixture
def hf_cache(seeded_hub, monkeypatch):
  """huggingface_hub pointed at the seeded cache, offline, in this process
  and its subprocesses (hub_cache.use); returns the commits of its repos."""
  from tests import hub_cache  # pylint: disable=g-import-not-at-top
  hub_cache.use(monkeypatch, seeded_hub[0])
  return seeded_hub[1]
