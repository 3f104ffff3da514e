r"""Prepare the study's data sets by name: `python -m jaxdistill.data.prepare`.

  python -m jaxdistill.data.prepare sciq --data_dir ~/data
  python -m jaxdistill.data.prepare medmcqa --data_dir ~/data --revision <commit>
  python -m jaxdistill.data.prepare gpqa --data_dir ~/data     # gated: HF_TOKEN
  python -m jaxdistill.data.prepare countdown --data_dir ~/data

  NAME       source                      files converted               splits
  sciq       allenai/sciq                data/*.parquet                train, validation, test
  medmcqa    openlifescienceai/medmcqa   data/{train,validation}-*     train, validation
                                         (the test split is unlabelled)
  gpqa       Idavidrein/gpqa (gated)     gpqa_diamond.csv              test
  countdown  generated (tasks.countdown) -                             train, test

A hub data set is resolved like a checkpoint (models.hub: `--revision` a
branch, tag or commit; HF_HOME / HF_HUB_CACHE, HF_HUB_OFFLINE, HF_TOKEN), and
its files go through the same converters as files given by path
(data.sources, the mcq_files builder) into DIR/mcq_files/NAME/: what a run
with data.task='mcq', data.source=NAME, data.data_dir=DIR reads, and an
evaluation suite with source NAME and data_dir DIR. DIR/prepared/NAME.json
records where it came from (repo, revision, commit, files, records per
split). A second run at the same commit does nothing; another commit is
refused unless --overwrite, and the old data stays until the new is
complete. Countdown is generated as a run would generate it
(builders.countdown_config) for each --n_numbers.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import fnmatch
import json
import os
import shutil

from jaxdistill import cli
from jaxdistill import storage
from jaxdistill.data import builders
from jaxdistill.data import sources
from jaxdistill.models import hub

NAMES = tuple(builders.HUB_DATASETS) + ("countdown",)
COUNTDOWN_NUMBERS = (3, 4)  # what the grids train on


def _staged_files(snapshot: str, data: builders.HubData,
                  out: str) -> dict[str, list[str]]:
  """Links the snapshot's files of `data` into `out` (one directory, as the
  mcq_files builder reads it); returns {split: [repo paths]}."""
  os.makedirs(out)
  found: dict[str, list[str]] = {}
  for root, _, names in os.walk(snapshot):
    for n in sorted(names):
      rel = os.path.relpath(os.path.join(root, n), snapshot).replace(os.sep, "/")
      if not any(fnmatch.fnmatch(rel, p) for p in data.files):
        continue
      split = sources.split_of_file(n)
      if split not in data.splits:
        continue
      if os.path.exists(os.path.join(out, n)):
        raise ValueError(f"{data.repo}: two files named {n}")
      os.symlink(os.path.realpath(os.path.join(root, n)), os.path.join(out, n))
      found.setdefault(split, []).append(rel)
  if not found:
    raise ValueError(f"{data.repo}: no file matching {list(data.files)} in its "
                     f"snapshot {snapshot}")
  return found


def _prepare_hub(name: str, data_dir: str, revision: str | None,
                 overwrite: bool, log) -> dict:
  data = builders.HUB_DATASETS[name]
  spec = data.repo + (f"@{revision}" if revision else "")
  snapshot, info = hub.resolve(spec, repo_type="dataset",
                               allow_patterns=data.files)
  old = _old_record(data_dir, name, overwrite)
  target = os.path.join(data_dir, "mcq_files", name)
  same = bool(old) and old["commit"] == info["commit"]
  if same:
    damage = builders.damage(data_dir, name)
    if damage is None:
      log(f"{name}: already prepared in {data_dir} from {data.repo} at commit "
          f"{info['commit']}; nothing to do")
      return old
    log(f"{name}: the data prepared in {target} is not whole ({damage}); "
        "preparing it again")
  if old and not same and not overwrite:
    raise ValueError(
        f"--data_dir {data_dir} holds {name} from {old['repo']} at commit "
        f"{old['commit']}; {spec} is commit {info['commit']}: pass --revision "
        f"{old['commit']} to keep it, or --overwrite to replace it")
  if not old and os.path.exists(target) and not overwrite:
    raise ValueError(
        f"--data_dir {data_dir}: {target} exists and was not written by this "
        "command (built from your files in a manual_dir?): pass --overwrite "
        "to replace it, or use another --data_dir")
  tmp = os.path.join(data_dir, f".prepare-{name}-{os.getpid()}")
  shutil.rmtree(tmp, ignore_errors=True)
  try:
    files = _staged_files(snapshot, data, os.path.join(tmp, "files"))
    log(f"{name}: converting {sum(map(len, files.values()))} file(s) of "
        f"{data.repo} at commit {info['commit']}")
    built = builders.prepare(builders.McqFiles, data_dir=os.path.join(tmp, "tfds"),
                             config=name, manual_dir=os.path.join(tmp, "files"))
    counts = {s: int(built.info.splits[s].num_examples) for s in built.info.splits}
    os.makedirs(os.path.dirname(target), exist_ok=True)
    # Swapped in only when complete: a failure above leaves the old data.
    if os.path.exists(target):
      os.replace(target, os.path.join(tmp, "old"))
    os.replace(os.path.join(tmp, "tfds", "mcq_files", name), target)
    record = {"name": name, "repo": data.repo, "revision": info["revision"],
              "commit": info["commit"], "files": files, "records": counts}
    _write_record(data_dir, name, record)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  sizes = ", ".join(f"{s} {n}" for s, n in sorted(counts.items()))
  log(f"{name}: prepared in {target} (records: {sizes})")
  return record


def _old_record(data_dir, name, overwrite) -> dict | None:
  """The data set's record; with `overwrite`, a broken one counts as none
  (what the error of read_record asks for)."""
  try:
    return builders.read_record(data_dir, name)
  except ValueError:
    if overwrite:
      return None
    raise


def _check_data_dir(data_dir: str) -> None:
  """Refuses a --data_dir that is a file or cannot be written, naming it
  (the first write is otherwise into an internal temporary path)."""
  try:
    cli.check_writable_dir(data_dir)
  except ValueError as e:
    raise ValueError(f"--data_dir {e}") from None


@contextlib.contextmanager
def _locked(data_dir: str, name: str):
  """One prepare of NAME per --data_dir at a time: a second, of another
  revision, would otherwise replace the first's data without a word. The
  kernel drops the lock when its process ends, however it ends."""
  path = builders.record_path(data_dir, name) + ".lock"  # beside its record
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "a") as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise ValueError(f"--data_dir {data_dir}: another prepare of {name} is "
                       f"running there (it holds {path}); wait for it to "
                       "finish") from None
    yield


def _write_record(data_dir, name, record):
  path = builders.record_path(data_dir, name)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + ".tmp", "w") as f:
    json.dump(record, f, indent=2, sort_keys=True)
  os.replace(path + ".tmp", path)


def _prepare_countdown(data_dir, n_numbers, num_problems, seed, overwrite,
                       log) -> dict:
  old = _old_record(data_dir, "countdown", overwrite) or {}
  for n in n_numbers:
    builders.prepare(builders.CountdownTasks, data_dir=data_dir,
                     config=builders.countdown_config(n, num_problems, seed))
  record = {"name": "countdown", "generated": "jaxdistill.tasks.countdown",
            "configs": sorted(set(old.get("configs", [])) | {
                builders.countdown_config(n, num_problems, seed).name
                for n in n_numbers})}
  _write_record(data_dir, "countdown", record)
  log(f"countdown: Countdown-{'/'.join(map(str, n_numbers))}, {num_problems} "
      f"training problems each (seed {seed}), in {data_dir}/countdown_tasks")
  return record


def prepare(name: str, data_dir: str, *, revision: str | None = None,
            overwrite: bool = False, n_numbers=COUNTDOWN_NUMBERS,
            num_problems: int | None = None, seed: int = 0,
            log=print) -> dict:
  """Prepares one data set by name under data_dir; returns its record (see
  the module docstring). Idempotent; another revision needs `overwrite`."""
  storage.check(data_dir, "--data_dir")  # before any download
  if name not in NAMES:
    raise ValueError(f"NAME: unknown data set {name!r}; choose from "
                     f"{', '.join(NAMES)}")
  if not data_dir:
    raise ValueError("--data_dir: required (where the prepared data goes)")
  data_dir = os.path.abspath(os.path.expanduser(data_dir))
  if name == "countdown" and revision:
    raise ValueError("--revision: countdown is generated, not downloaded")
  _check_data_dir(data_dir)
  with _locked(data_dir, name):
    if name == "countdown":
      size = int(num_problems or builders.CountdownConfig.train_size)
      return _prepare_countdown(data_dir, tuple(n_numbers), size, seed,
                                overwrite, log)
    return _prepare_hub(name, data_dir, revision, overwrite, log)


def ensure(name: str, data_dir: str, log=print) -> dict:
  """The record of hub data set `name` under data_dir, preparing it first if
  missing (whatever commit a prepared one came from: a sweep reads what is
  there)."""
  if builders.is_prepared(data_dir, name):
    return builders.read_record(data_dir, name)
  return prepare(name, data_dir, log=log)


def main(argv):
  ap = argparse.ArgumentParser(
      prog="python -m jaxdistill.data.prepare",
      description=__doc__.splitlines()[0])
  ap.add_argument("name", choices=NAMES, metavar="NAME",
                  help=f"one of {', '.join(NAMES)}")
  ap.add_argument("--data_dir", required=True,
                  help="where the prepared data goes (the configs' data_dir)")
  ap.add_argument("--revision", default=None,
                  help="a branch, tag or commit of the hub data set")
  ap.add_argument("--overwrite", action="store_true",
                  help="replace data prepared from another revision")
  ap.add_argument("--n_numbers", default="+".join(map(str, COUNTDOWN_NUMBERS)),
                  help="countdown: the N of Countdown-N, joined by '+'")
  ap.add_argument("--num_problems", type=int, default=None,
                  help="countdown: training problems per N (default 50,000)")
  ap.add_argument("--seed", type=int, default=0, help="countdown: data seed")
  args = ap.parse_args(argv)
  n_numbers = tuple(int(x) for x in args.n_numbers.split("+") if x)
  prepare(args.name, args.data_dir, revision=args.revision,
          overwrite=args.overwrite, n_numbers=n_numbers,
          num_problems=args.num_problems, seed=args.seed)


if __name__ == "__main__":
  cli.run(main)
