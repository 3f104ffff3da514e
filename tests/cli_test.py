"""The command lines as a newcomer meets them: configs found from any working
directory, errors in one line, quiet library logs, no torch notice, a help
example that parses, a runlocal workdir that jaxdistill.evaluate accepts."""
import importlib.util
import io
import logging
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import types

from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags
import orbax.checkpoint as ocp
import pytest

from jaxdistill import cli
from jaxdistill import compile_only
from jaxdistill import config_lib
from jaxdistill.sweep import cli as sweep_cli
from jaxdistill.sweep import grid as grid_lib
from jaxdistill.train import distributed
from jaxdistill.train import loop as train_loop

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(args, cwd, timeout=600, env=None):
  """`python -m <args>` in `cwd` with this checkout first on the path."""
  env = dict(os.environ if env is None else env)
  env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
  return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=timeout)


def _lines(text):
  # tqdm redraws with \r; a progress bar is not an error line.
  return [l for l in re.split(r"[\r\n]", text) if l.strip()]


def test_config_paths_resolve_from_another_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert not (tmp_path / "configs").exists()
  found = config_lib.find_config("configs/distill.py")
  assert pathlib.Path(found).resolve() == ROOT / "configs" / "distill.py"
  # The loader the demo and the grid configs use ('configs/distill.py').
  cfg = config_lib.load_config("configs/distill.py:runlocal")
  assert cfg.total_steps > 0
  # A file in the working directory wins over the project's.
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "distill.py").write_text(
      "def get_config(arg=None):\n  return {'mine': True}\n")
  assert config_lib.load_config("configs/distill.py") == {"mine": True}
  with pytest.raises(FileNotFoundError) as e:
    config_lib.find_config("configs/nope.py")
  assert str(tmp_path / "configs" / "nope.py") in str(e.value)
  assert str(ROOT / "configs" / "nope.py") in str(e.value)
  args = cli.resolve_config_args(["--config", "configs/eval.py:runlocal",
                                  "--config.seed=1", "--workdir", "w",
                                  "--config=configs/distill.py:x"])
  assert args[1] == str(ROOT / "configs" / "eval.py") + ":runlocal"
  assert args[2:] == ["--config.seed=1", "--workdir", "w",
                      "--config=configs/distill.py:x"]


def test_one_line_keeps_first_and_last_line_of_an_embedded_traceback():
  e = ValueError("flag --config=x: Error whilst parsing config file:\n\n"
                 "Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                 "ValueError: config arg: unknown key 'foo'\n")
  assert cli.one_line(e) == ("flag --config=x: Error whilst parsing config file: "
                             "ValueError: config arg: unknown key 'foo'")
  assert cli.one_line(KeyError("families")) == "KeyError: 'families'"
  assert cli.one_line(ValueError("a\n  b")) == "a b"


def test_library_info_logs_are_dropped_own_and_warnings_kept():
  stream = io.StringIO()
  handler = logging.StreamHandler(stream)
  root = logging.getLogger()
  old_level = root.level
  root.addHandler(handler)
  root.setLevel(logging.INFO)
  try:
    cli.quiet_library_logs()
    own = os.path.join(ROOT, "jaxdistill", "train.py")
    lib = os.path.join(os.path.dirname(logging.__file__), "orbax_like.py")
    orbax = os.path.join(os.path.dirname(ocp.__file__), "future.py")
    try:
      raise ValueError("RESOURCE_EXHAUSTED: Failed to write 50968 bytes")
    except ValueError:
      exc = sys.exc_info()
    for name, level, path, msg, info in (
        ("absl", logging.INFO, lib, "library info", None),
        ("jax._src.xla_bridge", logging.INFO, lib, "backend info", None),
        ("absl", logging.WARNING, lib, "library warning", None),
        ("absl", logging.ERROR, orbax, "background save failed", exc),
        ("absl", logging.ERROR, orbax, "orbax error, no traceback", None),
        ("root", logging.INFO, own, "own info", None)):
      handler.handle(logging.LogRecord(name, level, path, 1, msg, None, info))
  finally:
    root.removeHandler(handler)
    root.setLevel(old_level)
    absl_logging.get_absl_handler().removeFilter(cli._own_or_important)  # pylint: disable=protected-access
  out = stream.getvalue()
  assert "library info" not in out and "backend info" not in out
  assert "library warning" in out and "own info" in out
  # Orbax's tracebacks of a failed background save (330-530 lines on a full
  # disk): the error reaches the user as one line when Orbax raises it.
  assert "background save failed" not in out and "Traceback" not in out
  assert "orbax error, no traceback" in out


def test_closed_event_loop_noise_is_dropped(monkeypatch, capsys):
  """Printed by the dozen after a failed Orbax save (a full disk)."""
  seen = []
  monkeypatch.setattr(sys, "unraisablehook", seen.append)
  cli.quiet_closed_loop_noise()
  for error in (RuntimeError("Event loop is closed"), RuntimeError("other")):
    sys.unraisablehook(types.SimpleNamespace(
        exc_type=type(error), exc_value=error, exc_traceback=None,
        err_msg=None, object=None))
  assert [str(u.exc_value) for u in seen] == ["other"]


BAD = {  # entry point -> arguments with one bad setting, and the message
    "jaxdistill.train": (["--config", "configs/distill.py:runlocal",
                          "--config.loss.kind=bogus", "--workdir", "w"],
                         "config.loss.kind"),
    "jaxdistill.rl.train": (["--config", "configs/grpo_countdown.py:runlocal",
                             "--config.grpo.clip_low=2.0", "--workdir", "w"],
                            "config.grpo.clip_low"),
    "jaxdistill.evaluate": (["--config", "configs/eval.py:task=bogus",
                             "--checkpoint", "x"], "task"),
    "jaxdistill.sweep": (["--config", "configs/grid_main.py",
                          "--config.families.llama.student.path=/x",
                          "--workdir", "w"], "families"),
    "jaxdistill.analysis": (["--config", "configs/distill.py:runlocal",
                             "--batches", "0"], "--batches"),
    "jaxdistill.demo": (["--config", "configs/nope.py"], "configs/nope.py"),
    "jaxdistill.models.inspect": (["no/such/checkpoint"], "no/such/checkpoint"),
}


@pytest.mark.parametrize("module", sorted(BAD))
def test_cli_error_is_one_line_from_another_directory(module, tmp_path):
  args, needle = BAD[module]
  r = _run([module, *args], cwd=tmp_path)
  assert r.returncode != 0
  lines = _lines(r.stderr)
  assert len(lines) == 1, r.stderr
  assert lines[0].startswith("error: ") and needle in lines[0], lines[0]
  assert "Traceback" not in r.stderr


@pytest.mark.slow  # a subprocess importing jaxdistill.train (several seconds)
def test_config_argument_the_config_never_reads_is_one_line(tmp_path):
  """The --config flag path (config_flags calls get_config itself)."""
  (tmp_path / "mine.py").write_text(
      "from jaxdistill import config_lib\n"
      "def get_config(arg=None):\n"
      "  arg = config_lib.parse_arg(arg, used=1, unused=2)\n"
      "  return config_lib.load_config('configs/distill.py:runlocal')\n")
  r = _run(["jaxdistill.train", "--config", "mine.py:unused=3", "--workdir",
            "w"], cwd=tmp_path)
  assert r.returncode == 1
  assert _lines(r.stderr) == [
      "error: config arg unused=3: mine.py does not use it  (--verbose shows "
      "the traceback)"], r.stderr
  assert not (tmp_path / "w").exists()


def test_a_run_stopped_by_a_signal_exits_128_plus_it(capsys):
  """train, rl.train, the sweep and teacher_cache raise Preempted after saving
  their state (the sweep used to exit 1)."""
  msg = "stopped by SIGTERM after step 3; checkpoint 3 written to /w"

  def main(argv):
    del argv
    raise train_loop.Preempted(msg, signal.SIGTERM)
  for argv in (["x"], ["x", "--verbose"]):
    with pytest.raises(SystemExit) as e:
      cli.run(main, argv=argv)
    assert e.value.code == 128 + signal.SIGTERM
    assert capsys.readouterr().err == msg + "\n"


def test_verbose_shows_the_traceback(tmp_path):
  args, _ = BAD["jaxdistill.train"]
  r = _run(["jaxdistill.train", *args, "--verbose"], cwd=tmp_path)
  assert r.returncode != 0
  assert "Traceback" in r.stderr and "config.loss.kind" in r.stderr


def test_transformers_torch_notice_is_silenced(tmp_path):
  hide_torch = (
      "import importlib.util as u\n"
      "_find = u.find_spec\n"
      "u.find_spec = lambda n, *a, **k: None if n == 'torch' else _find(n, *a, **k)\n")
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  env.pop("TRANSFORMERS_NO_ADVISORY_WARNINGS", None)
  plain = subprocess.run([sys.executable, "-c", hide_torch + "import transformers"],
                         env=env, capture_output=True, text=True, cwd=tmp_path)
  assert "PyTorch was not found" in plain.stderr  # the notice exists
  ours = subprocess.run(
      [sys.executable, "-c", hide_torch +
       "from jaxdistill.data import tokenizer\n"
       "t = tokenizer.import_transformers()\n"
       "import os; assert 'TRANSFORMERS_NO_ADVISORY_WARNINGS' not in os.environ\n"],
      env=env, capture_output=True, text=True, cwd=tmp_path)
  assert ours.returncode == 0, ours.stderr
  assert "PyTorch was not found" not in ours.stderr


def _doc_commands(text, module):
  """The `python -m <module> ...` commands of a docstring or a Markdown page."""
  joined = re.sub(r"\\\n\s*", " ", text)
  out = []
  for line in joined.splitlines():
    line = line.split("#")[0].strip()
    if line.startswith(f"python -m {module} ") and " ... " not in line:
      line = re.sub(r"\[[^\]]*\]", "", line)  # optional flags in brackets
      out.append(shlex.split(line)[3:])
  return out


def _field(cfg, dotted):
  for part in dotted.split("."):
    cfg = cfg[part]
  return cfg


def _pages():
  """README.md and every docs/*.md page, the commands of which must parse."""
  return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_sweep_help_and_readme_examples_parse(monkeypatch):
  pages = [_doc_commands(p.read_text(), "jaxdistill.sweep") for p in _pages()]
  assert pages[0], "README.md shows no sweep command"
  examples = (_doc_commands(sweep_cli.__doc__, "jaxdistill.sweep") +
              [args for page in pages for args in page])
  assert len(examples) >= 3
  for args in examples:
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=fv,
                                     lock_config=False)
    flags.DEFINE_string("workdir", None, "", flag_values=fv)
    flags.DEFINE_bool("print_commands", False, "", flag_values=fv)
    flags.DEFINE_string("only", None, "", flag_values=fv)
    compile_only.define_flags(flag_values=fv)
    distributed.define_flags(flag_values=fv)
    argv = ["sweep", *cli.resolve_config_args(args)]
    monkeypatch.setattr(sys, "argv", argv)  # config_flags reads overrides there
    fv(argv)
    grid = fv.config
    for a in args:
      if a.startswith("--config."):
        field, _, value = a[len("--config."):].partition("=")
        assert str(_field(grid, field)) == value, (args, field)
    assert grid_lib.expand(grid, fv.only), args


@pytest.mark.parametrize("value,words", [
    ("", "no slice given"), ("v5e:3x3", "v5e has no topology '3x3'")])
def test_compile_only_slice_is_refused_when_parsed(value, words):
  """train, sweep, evaluate and teacher_cache share these flags: an empty
  --compile_only= used to run the command for real, v5e:3x3 to be blamed
  on libtpu after the config was built."""
  fv = flags.FlagValues()
  compile_only.define_flags(flag_values=fv)
  with pytest.raises(flags.IllegalFlagValueError, match=words) as e:
    fv(["prog", f"--compile_only={value}"])
  assert "\n" not in str(e.value)
  fv(["prog", "--compile_only=v5e:2x4"])
  assert fv.compile_only == "v5e:2x4"


@pytest.mark.slow  # a subprocess importing jaxdistill.train (several seconds)
def test_empty_compile_only_is_one_line_before_the_run(tmp_path):
  r = _run(["jaxdistill.train", "--config", "configs/distill.py:runlocal",
            "--workdir", "w", "--compile_only="], cwd=tmp_path)
  assert r.returncode == 1
  lines = _lines(r.stderr)
  assert len(lines) == 1 and "no slice given" in lines[0], r.stderr
  assert not (tmp_path / "w").exists()


def test_conftest_appends_the_device_count_to_existing_xla_flags(tmp_path):
  env = dict(os.environ, XLA_FLAGS="--xla_dump_hlo_as_text=false",
             JAX_PLATFORMS="cpu")
  r = subprocess.run(
      [sys.executable, "-c",
       f"import runpy; runpy.run_path({str(ROOT / 'tests' / 'conftest.py')!r})\n"
       "import os, jax; print(os.environ['XLA_FLAGS']); print(jax.device_count())"],
      env=env, capture_output=True, text=True, cwd=tmp_path)
  assert r.returncode == 0, r.stderr
  flags_line, count = r.stdout.split("\n")[:2]
  assert flags_line.startswith("--xla_dump_hlo_as_text=false ")
  assert int(count) == 8


@pytest.mark.slow
def test_runlocal_train_then_evaluate_from_another_directory(tmp_path):
  """docs/training.md's local pair: quiet logs, a tokenizer in hf_student/, and
  jaxdistill.evaluate accepting the workdir."""
  work = tmp_path / "jd"
  # One device: runlocal's batch of 4 does not split over the 8 test devices.
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
  r = _run(["jaxdistill.train", "--config", "configs/distill.py:runlocal",
            "--config.total_steps=2", "--config.ckpt_every=2",
            "--config.progress=False", "--workdir", str(work)], cwd=tmp_path,
           env=env)
  assert r.returncode == 0, r.stderr[-3000:]
  # absl-formatted INFO lines ('I1130 12:00:00.000 123 file.py:12] ...'):
  # before, Orbax alone wrote about 100 per run; jaxdistill's own may stay.
  info = [l for l in _lines(r.stderr) if re.match(r"I\d{4} ", l)]
  assert len(info) <= 3, info[:5]
  assert not [l for l in info if re.search(
      r"orbax|checkpoint_manager|CheckpointManager|xla_bridge|Metadata", l)]
  assert "checkpoint_manager" not in r.stderr
  hf = work / "hf_student"
  assert (hf / "tokenizer.json").is_file() and (hf / "tokenizer_config.json").is_file()
  e = _run(["jaxdistill.evaluate", "--config", "configs/eval.py:runlocal",
            "--config.progress=False", "--checkpoint", str(work),
            "--out", str(tmp_path / "eval.json")], cwd=tmp_path, env=env)
  assert e.returncode == 0, e.stderr[-3000:]
  assert "countdown3" in e.stdout and (tmp_path / "eval.json").is_file()


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="the noise comes from libtpu")
def test_a_cpu_command_with_libtpu_installed_prints_no_tpu_errors():
  # libtpu (the test extra) printed about five lines of errors about TPU
  # hostnames in every CPU command, when JAX tried its TPU backend.
  code = ("from jaxdistill import cli; cli._prepare([]); import jax; "
          "print(jax.devices()[0].platform)")
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  res = subprocess.run([sys.executable, "-c", code], env=env, text=True,
                       capture_output=True, timeout=300, cwd=ROOT)
  assert res.returncode == 0, res.stderr[-2000:]
  assert res.stdout.strip() == "cpu"
  assert "TPU" not in res.stderr and "libtpu" not in res.stderr, res.stderr
  # The user's choice stands.
  res = subprocess.run([sys.executable, "-c", code + "; print(jax.config.jax_platforms)"],
                       env=dict(env, JAX_PLATFORMS="cpu"), text=True,
                       capture_output=True, timeout=300, cwd=ROOT)
  assert res.stdout.split() == ["cpu", "cpu"], res.stderr[-2000:]


def test_platforms_without_a_tpu(monkeypatch):
  have = {"libtpu"}
  real_find = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda n, *a: object() if n in have else (
                          None if n.startswith(("libtpu", "jax_cuda"))
                          else real_find(n, *a)))
  devs = set()
  monkeypatch.setattr(cli.glob, "glob", lambda p: sorted(
      d for d in devs if d.startswith(p.rstrip("*"))))
  monkeypatch.setattr(cli.os.path, "isdir", lambda p: p in devs)
  monkeypatch.setattr(cli.os.path, "exists", lambda p: p in devs)
  monkeypatch.delenv("TPU_ACCELERATOR_TYPE", raising=False)
  assert cli.platforms_without_a_tpu(None) == "cpu"
  have.add("jax_cuda12_plugin")
  assert cli.platforms_without_a_tpu(None) == "cpu"  # the plugin, no GPU
  devs.add("/dev/nvidiactl")
  assert cli.platforms_without_a_tpu(None) == "cuda,cpu"
  for tpu in ("/dev/accel0", "/dev/vfio"):
    devs.add(tpu)
    assert cli.platforms_without_a_tpu(None) is None  # a TPU VM: JAX decides
    devs.discard(tpu)
  monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-8")
  assert cli.platforms_without_a_tpu(None) is None
  monkeypatch.delenv("TPU_ACCELERATOR_TYPE")
  have.discard("libtpu")
  assert cli.platforms_without_a_tpu(None) is None  # no libtpu: no noise
  have.add("libtpu")
  assert cli.platforms_without_a_tpu("cpu") is None  # the user's JAX_PLATFORMS


def test_a_lost_peer_of_a_distributed_run_is_said_in_one_line(monkeypatch):
  # What process 0 of a 2-process sweep printed when process 1 was
  # SIGKILLed mid-arm (then JAX's shutdown barrier aborted it with a C++
  # stack trace).
  e = RuntimeError(
      "UNKNOWN: Gloo context initialization failed: DEADLINE_EXCEEDED: "
      "GetKeyValue() timed out with key: cpu:gloo/0,2048/1 and duration: 30s")
  import jax  # pylint: disable=g-import-not-at-top
  assert cli.peer_lost(e) is None  # one process: not a lost peer
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  got = cli.peer_lost(e)
  assert got.startswith("another process of this --distributed run stopped "
                        "answering (killed, preempted or crashed")
  assert "start the same command again on every host" in got
  assert got.endswith("(UNKNOWN: Gloo context initialization failed: "
                      "DEADLINE_EXCEEDED: GetKeyValue() timed out with key: "
                      "cpu:gloo/0,2048/1 and duration: 30s)")
  assert cli.peer_lost(ValueError("config.seed: must be an int")) is None
