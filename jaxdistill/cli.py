"""What every command line entry point shares (train, rl.train, evaluate,
sweep, analysis, demo, models.inspect):

- `--config configs/x.py[:arg]` is found from any working directory: a relative
  path missing there is taken from the project's configs (config_lib.find_config);
- libraries log warnings and errors only (Orbax, absl, JAX, TFDS, grain ...
  write INFO lines by the hundred); jaxdistill's own INFO lines stay; Orbax's
  errors with a traceback (each failure of a background save, which
  jaxdistill reports in one line when Orbax raises it) only with --verbose;
- on an NVIDIA GPU, JAX's allocator takes 90 % of the card, not its default
  75 % (XLA_PYTHON_CLIENT_MEM_FRACTION, unless set; sharding.py);
- transformers' "PyTorch was not found" notice is not printed: jaxdistill
  uses transformers for tokenizers and configs only;
- on a host with libtpu installed (the test extra brings it, for compiling
  for TPUs) but no TPU, JAX does not try the TPU backend (which prints
  libtpu's errors about TPU hostnames): JAX_PLATFORMS is taken as 'cpu', or
  'cuda,cpu' with an NVIDIA GPU and JAX's CUDA plugin, unless set;
- an error is printed as one line, `error: <message>`, exit status 1; with
  `--verbose` (or JAXDISTILL_DEBUG=1) the full traceback and library INFO logs;
- a run stopped by SIGTERM / SIGINT after saving its state prints one line
  saying what is kept and exits with 128 + the signal (train.preempt).

  if __name__ == "__main__":
    cli.run_absl(main, define_flags)     # absl flags + ml_collections --config
    cli.run(main)                        # main(argv) parses argv itself
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
import glob
import importlib.util
import logging
import os
import re
import sys

from absl import app
from absl import flags
from absl import logging as absl_logging
import jax
import ml_collections

from jaxdistill import config_lib
from jaxdistill import sharding
from jaxdistill import storage


def check_writable_dir(path: str) -> None:
  """Raises ValueError (one line naming `path`) unless `path` is, or can be
  created as, a writable local directory (a URL, gs:// included, is refused:
  callers that take gs:// use storage.check_writable_dir)."""
  storage.check_writable_dir(storage.check(path, path))

VERBOSE_ARGS = ("--verbose", "--verbose=true", "--verbose=True", "--debug")
_QUIET_TRANSFORMERS = "TRANSFORMERS_NO_ADVISORY_WARNINGS"
_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_ORBAX = os.sep + "orbax" + os.sep


def is_verbose(argv: Sequence[str]) -> bool:
  return (any(a in VERBOSE_ARGS for a in argv) or
          os.environ.get("JAXDISTILL_DEBUG", "") not in ("", "0"))


def _own_or_important(record: logging.LogRecord) -> bool:
  if (record.exc_info and _ORBAX in record.pathname and
      record.levelno < logging.CRITICAL):
    # Orbax logs each failure of its background threads with a traceback,
    # then raises it in the main thread, where jaxdistill reports it in one
    # line (a failed checkpoint: train.checkpoint.CheckpointWriteError).
    return False
  return (record.levelno >= logging.WARNING or
          os.path.abspath(record.pathname).startswith(_OWN_DIR))


def quiet_library_logs(verbose: bool = False) -> None:
  """INFO/DEBUG records from outside jaxdistill are dropped by every handler
  on the root logger (absl's included, which Orbax and TFDS write through)."""
  if verbose:
    if not logging.getLogger().handlers:
      logging.basicConfig(level=logging.INFO)
    logging.getLogger().setLevel(logging.INFO)
    return
  handlers = list(logging.getLogger().handlers)
  handlers.append(absl_logging.get_absl_handler())
  for h in handlers:
    if _own_or_important not in h.filters:
      h.addFilter(_own_or_important)


def resolve_config_args(argv: Sequence[str]) -> list[str]:
  """`--config SPEC` / `--config=SPEC` with SPEC's file resolved (see
  config_lib.find_config); `--config.x=y` overrides are left alone."""

  def resolve(spec):
    path, sep, arg = spec.partition(":")
    return config_lib.find_config(path) + sep + arg

  out = list(argv)
  for i, a in enumerate(out):
    if a == "--config" and i + 1 < len(out):
      out[i + 1] = resolve(out[i + 1])
    elif a.startswith("--config="):
      out[i] = "--config=" + resolve(a[len("--config="):])
  return out


def one_line(e: BaseException) -> str:
  """The exception's message on one line. A message that embeds a traceback
  (absl's flag errors do) is cut to its first and last lines."""
  lines = [l.strip() for l in str(e).splitlines() if l.strip()]
  if not lines:
    return type(e).__name__
  if any(l.startswith("Traceback") for l in lines):
    lines = [lines[0], lines[-1]] if len(lines) > 1 else lines
  msg = " ".join(lines)
  # Our messages name the field or file; a bare KeyError('x') needs its type.
  if isinstance(e, (KeyError, AttributeError, TypeError, IndexError)):
    msg = f"{type(e).__name__}: {msg}"
  return msg


def _writable_parent(path: str, flag: str) -> None:
  parent = os.path.dirname(os.path.abspath(path))
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise ValueError(f"{flag}: {parent} (in {path}) is not a directory")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise ValueError(f"{flag}: {parent} is not writable")


def check_out_file(path: str, flag: str = "--out", *,
                   gs_ok: bool = False) -> None:
  """Refuses, before any compute, an output file path that names a
  directory or lies where nothing can be written (with `gs_ok`, a gs://
  object whose bucket cannot be written)."""
  path = storage.check(path, flag, gs_ok=gs_ok)
  if storage.is_gs(path):
    storage.check_writable_dir(path.rsplit("/", 1)[0])
    return
  if os.path.isdir(path):
    raise ValueError(f"{flag}: {path} is a directory; give a file path (e.g. "
                     f"{os.path.join(path, 'eval.json')})")
  if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
    raise ValueError(f"{flag}: the directory of {path} does not exist")
  _writable_parent(path, flag)


def check_out_dir(path: str, flag: str = "--out") -> None:
  """Refuses, before any compute, an output directory path that names a
  file or cannot be created."""
  path = storage.check(path, flag)
  if os.path.exists(path) and not os.path.isdir(path):
    raise ValueError(f"{flag}: {path} is a file; give a directory")
  _writable_parent(os.path.join(path, "x"), flag)


def _config_specs(argv: Sequence[str]) -> list[str]:
  """The `--config SPEC` / `--config=SPEC` values of argv."""
  specs = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"]
  return specs + [a[len("--config="):] for a in argv
                  if a.startswith("--config=")]


def _unknown_override(argv: Sequence[str]) -> ValueError | None:
  """Names the first `--config.a.b=v` flag whose field the config lacks."""
  specs = _config_specs(argv)
  if len(specs) != 1:
    return None
  try:
    node0 = config_lib.load_config(specs[0])
  except Exception:  # pylint: disable=broad-except
    return None
  for a in argv:
    if not a.startswith("--config."):
      continue
    field = a[len("--config."):].split("=")[0]
    node = node0
    for i, part in enumerate(field.split(".")):
      if not isinstance(node, (dict, ml_collections.ConfigDict)) or part not in node:
        have = (sorted(node.keys()) if isinstance(
            node, (dict, ml_collections.ConfigDict)) else None)
        where = ".".join(field.split(".")[:i]) or "the config"
        return ValueError(f"--config.{field}: {where} has no field {part!r}" +
                          (f" (it has {', '.join(map(str, have))})" if have else ""))
      node = node[part]
  return None


def _fail(e: BaseException, verbose: bool):
  if isinstance(getattr(e, "exit_code", None), int):
    # Stopped by a signal with its state saved (train.preempt.Preempted): the
    # message says what is kept; the status is 128 + the signal.
    print(one_line(e), file=sys.stderr, flush=True)
    sys.exit(e.exit_code)
  if verbose:
    raise e
  if isinstance(e, KeyboardInterrupt):
    print("interrupted", file=sys.stderr, flush=True)
    sys.exit(130)
  lost = peer_lost(e)
  print(f"error: {lost or one_line(e)}  (--verbose shows the traceback)",
        file=sys.stderr, flush=True)
  if lost:
    # JAX's exit would wait at the distributed shutdown barrier for the lost
    # process, then abort with a C++ stack trace: end here instead.
    sys.stdout.flush()
    logging.shutdown()
    os._exit(1)  # pylint: disable=protected-access
  sys.exit(1)


# What a --distributed process sees when another one of its run has died
# (killed, preempted, crashed): a collective's or the coordination service's
# timeout.
_PEER_LOST = re.compile(
    r"Gloo context initialization failed|heartbeat timeout|"
    r"tasks are unhealthy|GetKeyValue\(\) timed out|Connection reset by peer"
    r"|Barrier timed out")


def peer_lost(e: BaseException) -> str | None:
  """For an error of a --distributed run that says another process stopped
  answering: a line saying so and what to do (the library's words kept after
  it); None otherwise."""
  if jax.process_count() < 2 or not _PEER_LOST.search(str(e)):
    return None
  return ("another process of this --distributed run stopped answering "
          "(killed, preempted or crashed: its own log says why); start the "
          "same command again on every host, which resumes from the last "
          f"checkpoint. ({one_line(e)})")


def quiet_closed_loop_noise() -> None:
  """After a failed Orbax save, tensorstore's callbacks into the event loop
  Orbax has closed print 'RuntimeError: Event loop is closed' tracebacks
  (as unraisable exceptions), by the dozen: dropped; any other unraisable
  exception is printed as before."""
  previous = sys.unraisablehook

  def hook(unraisable):
    if (unraisable.exc_type is RuntimeError and
        str(unraisable.exc_value) == "Event loop is closed"):
      return
    previous(unraisable)
  sys.unraisablehook = hook


def platforms_without_a_tpu(chosen: str | None) -> str | None:
  """What JAX should try on a host with libtpu installed and no TPU ('cpu',
  or 'cuda,cpu' with an NVIDIA GPU and the CUDA plugin); None where JAX's
  own choice is quiet or the user chose (`chosen`: jax_platforms, as
  JAX_PLATFORMS sets it)."""
  if (chosen or importlib.util.find_spec("libtpu") is None
      or glob.glob("/dev/accel*") or os.path.isdir("/dev/vfio")
      or os.environ.get("TPU_ACCELERATOR_TYPE")):
    return None
  cuda = any(importlib.util.find_spec(p) for p in ("jax_cuda12_plugin",
                                                   "jax_cuda13_plugin"))
  return "cuda,cpu" if cuda and os.path.exists("/dev/nvidiactl") else "cpu"


def _prepare(argv):
  os.environ.setdefault(_QUIET_TRANSFORMERS, "1")
  platforms = platforms_without_a_tpu(jax.config.jax_platforms)
  if platforms:  # read when JAX's backends start, after this
    jax.config.update("jax_platforms", platforms)
  # On a GPU, JAX's allocator takes this share of the card when its backend
  # starts (after this); --compile_only judges fit against the same pool.
  os.environ.setdefault(sharding.MEM_FRACTION_ENV,
                        str(sharding.GPU_MEM_FRACTION))
  argv = list(sys.argv if argv is None else argv)
  verbose = is_verbose(argv)
  if not verbose:
    quiet_closed_loop_noise()
  return argv, verbose


def run(main: Callable[[list[str]], object], argv=None) -> None:
  """main(args) for an entry point that parses its own arguments (argparse);
  `--verbose`/`--debug` are taken out of the arguments it sees."""
  argv, verbose = _prepare(argv)
  args = [a for a in argv[1:] if a not in VERBOSE_ARGS]
  quiet_library_logs(verbose)
  try:
    main(resolve_config_args(args))
  except SystemExit:
    raise
  except BaseException as e:  # pylint: disable=broad-except
    _fail(e, verbose)


def parse_flags(argv: Sequence[str]):
  """absl's flag parsing, plus `--config.x.y=None`, which sets an optional
  field to None (ml_collections would parse 'None' as the field's type), and
  the refusal of a `--config file.py:arg` argument the config does not use."""
  pat = re.compile(r"--config\.([A-Za-z_][\w.]*)=(None|none)$")
  nones = [m.group(1) for m in map(pat.match, argv[1:]) if m]
  rest = [a for a in argv if not pat.match(a)]
  saved, sys.argv = sys.argv, rest  # config_flags reads sys.argv
  try:
    # config_flags calls get_config here: its arguments must all be used.
    specs = _config_specs(rest)
    where = specs[0].partition(":")[0] if len(specs) == 1 else "--config"
    with config_lib.checking_args(where):
      out = flags.FLAGS(rest)
  finally:
    sys.argv = saved
  for path in nones:
    node, *parents, leaf = [flags.FLAGS.config] + path.split(".")
    try:
      for p in parents:
        node = node[p]
      node[leaf]  # pylint: disable=pointless-statement
    except (AttributeError, KeyError, TypeError):
      raise KeyError(path) from None  # named by _unknown_override
    node[leaf] = None
  return out


def run_absl(main: Callable[[list[str]], object], define_flags: Callable[[], None],
             argv=None) -> None:
  """absl's app.run(main) after define_flags(), with a `--verbose` flag."""
  argv, verbose = _prepare(argv)
  define_flags()
  flags.DEFINE_bool("verbose", False, "Print the full traceback of an error and "
                    "the libraries' INFO logs.")
  flags.DEFINE_alias("debug", "verbose")

  def parse(args):
    try:
      return parse_flags(args)
    except flags.Error as e:
      _fail(e, verbose)
    except (KeyError, AttributeError) as e:  # ml_collections: no such field
      if verbose:
        raise
      _fail(_unknown_override(args) or e, verbose)

  def wrapped(args):
    quiet_library_logs(verbose)
    return main(args)

  quiet_library_logs(verbose)
  try:
    app.run(wrapped, argv=resolve_config_args(argv), flags_parser=parse)
  except SystemExit:
    raise
  except BaseException as e:  # pylint: disable=broad-except
    _fail(e, verbose)
