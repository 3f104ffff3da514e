"""tensorflow-datasets builders (array_record files, read back without TensorFlow).

Two builders, both `tfds.core.GeneratorBasedBuilder` writing `array_record`
shards; records are read back with `tfds.data_source` / `as_data_source`, which
is random access and TensorFlow-free (grain can consume it directly):

  countdown_tasks   configs n3, n4, n5, n6 (Countdown-N), splits train / test
                    with disjoint targets; fields numbers, target, solution.
  paper_countdown   configs countdown3, countdown4e, countdown4: the paper's
                    Countdown sets (tasks.countdown.PRESETS, App. D.1/D.6),
                    each split its preset's count and seed; fields numbers,
                    target, solution (steps), variant.
  mcq_files         configs generic, sciq, gpqa, medmcqa, medqa, pubmedqa,
                    sciknoweval, medreason; reads the user's downloaded files
                    from `manual_dir` (split from each file name, see
                    sources.split_of_file); fields question, options, answer
                    (sciknoweval also response: a worked trace, or none).
                    `python -m jaxdistill.data.prepare NAME` builds the
                    sciknoweval and medreason configs (the paper's, drawn by
                    data.paper_mcq) and the sciq, medmcqa and gpqa ones (not
                    the paper's) from the hub (HUB_DATASETS), recorded in
                    <data_dir>/prepared/NAME.json; `mcq_builder` reads either.

`data_dir` is always explicit: nothing is written to ~/tensorflow_datasets by
accident. Custom sizes or seeds: pass a config object, e.g.
`CountdownTasks(config=CountdownConfig(name='n3_small', n_numbers=3,
train_size=100, test_size=20), data_dir=...)`.

Metadata is built with `tfds.core.DatasetInfo` directly, not
`dataset_info_from_configs`, because the latter reads package metadata files
that these in-repo builders do not have.

A prepared dataset whose dataset_info.json or array_record files are damaged
(truncated, edited, half-copied) is a ValueError naming the file, with the
remedy: delete the dataset's directory and it is prepared again.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import os

from array_record.python import array_record_data_source
from etils import epath
import numpy as np
import tensorflow_datasets as tfds

from jaxdistill import storage
from jaxdistill.data import sources
from jaxdistill.tasks import countdown


class _Builder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Base of our builders: the source file is found with `inspect`.

  TFDS's default `code_path` resolves packages through `importlib_resources`,
  which this environment does not install (and nothing else needs); the
  `inspect` fallback TFDS itself uses for other modules gives the same path.
  """

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls):
    return epath.Path(inspect.getfile(cls))


@dataclasses.dataclass(eq=False, kw_only=True)
class CountdownConfig(tfds.core.BuilderConfig):
  n_numbers: int = 3
  train_size: int = 50_000
  test_size: int = 1_000
  seed: int = 0
  max_number: int = 100
  max_target: int = 1000


def countdown_config(n_numbers: int, train_size: int, seed: int) -> CountdownConfig:
  """The Countdown-N builder config of a training run's data (the test split
  gets a tenth of train_size): one name per (N, size, seed), so runs and
  `python -m jaxdistill.data.prepare countdown` share what they build."""
  return CountdownConfig(
      name=f"n{n_numbers}_train{train_size}_seed{seed}", n_numbers=n_numbers,
      train_size=train_size, test_size=max(1, train_size // 10), seed=seed)


class CountdownTasks(_Builder):
  """Countdown-N problems, solvable by construction (jaxdistill.tasks.countdown)."""

  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [
      CountdownConfig(name=f"n{n}", n_numbers=n,
                      description=f"Countdown with {n} numbers")
      for n in range(3, 7)
  ]

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self,
        description="Countdown arithmetic problems with reference solutions.",
        features=tfds.features.FeaturesDict({
            "numbers": tfds.features.Tensor(shape=(None,), dtype=np.int64),
            "target": tfds.features.Scalar(dtype=np.int64),
            "solution": tfds.features.Text(),
        }),
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    c = self.builder_config
    return {
        "train": self._generate_examples("train", c.train_size),
        "test": self._generate_examples("test", c.test_size),
    }

  def _generate_examples(self, split, size):
    c = self.builder_config
    problems = countdown.generate_problems(
        c.n_numbers, size, c.seed, split=split, max_number=c.max_number,
        max_target=c.max_target)
    for i, p in enumerate(problems):
      yield i, {"numbers": np.asarray(p.numbers, np.int64), "target": p.target,
                "solution": p.solution}


class PaperCountdown(_Builder):
  """The paper's Countdown-3 / -4E / -4 (tasks.countdown.paper_problems)."""

  # A prepared version is read back as it is: bump this whenever
  # paper_problems would draw other problems.
  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=n, description=n)
                     for n in countdown.PRESETS]

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self,
        description="The paper's Countdown problems, step-form solutions.",
        # Stored in generation order: evaluation takes the first N.
        disable_shuffling=True,
        features=tfds.features.FeaturesDict({
            "numbers": tfds.features.Tensor(shape=(None,), dtype=np.int64),
            "target": tfds.features.Scalar(dtype=np.int64),
            "solution": tfds.features.Text(),
            "variant": tfds.features.Text(),
        }),
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    name = self.builder_config.name
    return {split: self._generate_examples(name, split)
            for split in countdown.PRESETS[name].splits}

  def _generate_examples(self, name, split):
    for i, p in enumerate(countdown.paper_problems(name, split)):
      yield i, {"numbers": np.asarray(p.numbers, np.int64), "target": p.target,
                "solution": p.solution, "variant": name}


@dataclasses.dataclass(eq=False, kw_only=True)
class McqConfig(tfds.core.BuilderConfig):
  source: str = "generic"
  seed: int = 0               # Option shuffling for SciQ / GPQA.
  cop_base: int | None = None  # MedMCQA only; None = detect per file.


class McqFiles(_Builder):
  """Multiple-choice questions from user files in `manual_dir`."""

  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [McqConfig(name=s, source=s) for s in sources.SOURCES]
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      "Download the public files (JSONL, JSON, CSV or Parquet) and put them in "
      "one directory; name them with train / valid|dev / test so the split is "
      "known (other files become 'test'). Pass it as "
      "download_config=tfds.download.DownloadConfig(manual_dir=...).")

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self,
        description="Multiple-choice questions: question, options, gold letter.",
        # The paper's sets keep the order they were drawn in (data.paper_mcq).
        disable_shuffling=self.builder_config.name in PAPER_MCQ,
        features=tfds.features.FeaturesDict({
            "question": tfds.features.Text(),
            "options": tfds.features.Sequence(tfds.features.Text()),
            "answer": tfds.features.Text(),
            # A worked trace ('' for none: to_record drops it).
            **({"response": tfds.features.Text()}
               if self.builder_config.source in sources.RESPONSES else {}),
        }),
    )

  def _split_generators(self, dl_manager):
    files = sources.find_files(os.fspath(dl_manager.manual_dir))
    return {split: self._generate_examples(paths) for split, paths in files.items()}

  def _generate_examples(self, paths):
    c = self.builder_config
    for path in paths:
      records = sources.convert_file(path, c.source, seed=c.seed, cop_base=c.cop_base)
      for i, r in enumerate(records):
        if c.source in sources.RESPONSES:
          r = {"response": "", **r}
        yield f"{os.path.basename(path)}/{i}", r


def prepare(builder_cls, *, data_dir: str, config=None, manual_dir: str | None = None):
  """Builds (once) and returns a builder; writes array_record files under data_dir."""
  if not data_dir:
    raise ValueError("data_dir must be given explicitly")
  try:
    builder = builder_cls(data_dir=data_dir, config=config,
                          file_format="array_record")
  except Exception as e:  # The one file read here: a prepared dataset_info.json.
    name = config if isinstance(config, str) else getattr(
        config, "name", None) or builder_cls.BUILDER_CONFIGS[0].name
    info = os.path.join(data_dir, builder_cls.name, name,
                        str(builder_cls.VERSION), "dataset_info.json")
    if not os.path.isfile(info):
      raise
    raise ValueError(_damaged(info, os.path.dirname(info), e)) from None
  download_config = None
  if manual_dir is not None:
    if not os.path.isdir(manual_dir):
      raise FileNotFoundError(f"manual_dir not found: {manual_dir}")
    download_config = tfds.download.DownloadConfig(manual_dir=manual_dir)
  builder.download_and_prepare(download_config=download_config)
  return builder


def to_record(example: dict) -> dict:
  """A decoded data-source example as plain Python (str, int, list)."""
  out = {}
  for k, v in example.items():
    if isinstance(v, bytes):
      v = v.decode("utf-8")
    elif isinstance(v, np.ndarray):
      v = [x.decode("utf-8") if isinstance(x, bytes) else x.item() for x in v]
    elif isinstance(v, list):
      v = [x.decode("utf-8") if isinstance(x, bytes) else x for x in v]
    elif isinstance(v, np.generic):
      v = v.item()
    if k == "response" and v == "":
      continue  # no worked trace (mcq_files stores '')
    out[k] = v
  return out


def load_records(builder, split: str) -> list[dict]:
  """All examples of a prepared builder's split as plain dicts, in stored order.

  A damaged array_record file is a ValueError naming it."""
  if split not in builder.info.splits:
    raise ValueError(f"split {split!r} not in {sorted(builder.info.splits)}")
  try:
    source = builder.as_data_source(split=split)
    return [to_record(source[i]) for i in range(len(source))]
  except Exception:
    for path in builder.info.splits[split].filepaths:
      try:
        shard = array_record_data_source.ArrayRecordDataSource([os.fspath(path)])
        shard.__getitems__(range(len(shard)))
      except Exception as bad:  # The first shard that cannot be read whole.
        raise ValueError(_damaged(os.fspath(path), os.fspath(builder.data_dir),
                                  bad)) from None
    raise


def _damaged(path: str, directory: str, error: Exception) -> str:
  first = (str(error).strip().splitlines() or [type(error).__name__])[0]
  return (f"{path}: damaged prepared data ({first}); delete {directory} and "
          "it is prepared again")


# -- data sets prepared by name (python -m jaxdistill.data.prepare) ------------

@dataclasses.dataclass(frozen=True)
class HubData:
  repo: str                 # hub dataset id
  files: tuple[str, ...]    # patterns of the repo files converted
  splits: tuple[str, ...]   # splits kept (sources.split_of_file of each file)
  revision: str | None = None  # when --revision is not given (None: main)


SCIKNOWEVAL_COMMIT = "3284f6fbf3b8063ab8a0408a65fb00157dbdc9fa"

# The name is also the converter (data.sources.SOURCES) and the mcq_files
# builder config: data.source='sciq' reads what `prepare sciq` wrote.
HUB_DATASETS = {
    "sciq": HubData("allenai/sciq", ("data/*.parquet",),
                    ("train", "validation", "test")),
    "medmcqa": HubData("openlifescienceai/medmcqa",
                       ("data/train-*.parquet", "data/validation-*.parquet"),
                       ("train", "validation")),
    "gpqa": HubData("Idavidrein/gpqa", ("gpqa_diamond.csv",), ("test",)),
    # The paper's (App. D.1): drawn from every matching file (data.paper_mcq).
    # Pinned to the commit the paper's Science data was drawn from (its
    # source, the self-distillation study's release, records it).
    "sciknoweval": HubData("hicai-zju/SciKnowEval", ("data/Chemistry/*.jsonl",),
                           ("train", "test"), revision=SCIKNOWEVAL_COMMIT),
    "medreason": HubData("UCSC-VLAA/MedReason", ("ours_quality_33000.jsonl",),
                         ("train", "test")),
}
# The sets above that are the paper's; sciq, medmcqa and gpqa are not.
PAPER_MCQ = ("sciknoweval", "medreason")
RECORDS = "prepared"  # DIR/prepared/NAME.json: where a data set came from


def record_path(data_dir: str, name: str) -> str:
  return os.path.join(os.path.expanduser(data_dir), RECORDS, f"{name}.json")


# What a record must hold, by data set kind, for prepare and the runs to use it.
_RECORD_FIELDS = {"hub": {"repo": str, "commit": str, "records": dict},
                  "countdown": {"configs": list},
                  "paper_countdown": {"generated": str, "records": dict}}


def read_record(data_dir: str, name: str) -> dict | None:
  """What DIR/prepared/NAME.json says of a prepared data set (DIR local or
  gs://), or None. ValueError naming the file if it is not JSON or lacks a
  field."""
  path = record_path(data_dir, name)
  if not storage.isfile(path):
    return None
  again = f"prepare {name} again with --overwrite"
  try:
    with storage.open(path) as f:
      record = json.load(f)
  except ValueError as e:
    raise ValueError(f"{path}: not valid JSON ({e}); {again}") from None
  if not isinstance(record, dict):
    raise ValueError(f"{path}: not a JSON object; {again}")
  kind = ("countdown" if name == "countdown" else "paper_countdown"
          if name in countdown.PRESETS else "hub")
  for field, typ in _RECORD_FIELDS[kind].items():
    if not isinstance(record.get(field), typ):
      raise ValueError(f"{path}: field {field!r} missing or not a "
                       f"{typ.__name__} ({record.get(field)!r:.40}); {again}")
  return record


def parts_of(name: str) -> tuple[str, ...]:
  """The paths, relative to a data_dir, that `prepare NAME` writes besides
  its record."""
  if name == "countdown":
    return (CountdownTasks.name,)
  if name in countdown.PRESETS:
    return (f"{PaperCountdown.name}/{name}",)
  if name in ("numina_math", "math500"):
    return (f"math_files/{name}",)  # numina_math.files_dir
  return (f"{McqFiles.name}/{name}",)


def local_data_dir(data_dir: str, name: str, field: str, *,
                   missing_ok: bool = False) -> str:
  """The local directory data set `name` of `data_dir` is read from:
  `data_dir` itself (~ expanded), or for gs://bucket/dir a local mirror of
  its record and files (storage.mirror_parts; downloaded again only when
  `prepare NAME --data_dir gs://...` uploaded it again). A gs:// data_dir
  without it is a FileNotFoundError naming `field` and the command to run;
  with `missing_ok` (prepare itself), the empty mirror to prepare it in."""
  if not storage.looks_remote(data_dir):
    return os.path.expanduser(data_dir)
  url = storage.check(data_dir, field, gs_ok=True)
  marker = os.path.relpath(record_path(".", name), ".")
  try:
    return storage.mirror_parts(url, field, marker=marker,
                                parts=parts_of(name), missing_ok=missing_ok)
  except FileNotFoundError as e:
    if "holds no" not in str(e):
      raise
    raise FileNotFoundError(
        f"{field}: {url} holds no prepared {name!r} ({marker} is missing): "
        f"run `{prepare_command(name, url)}`") from None


def publish(data_dir: str, name: str, log=print) -> None:
  """Uploads data set `name` from gs:// `data_dir`'s local mirror, where
  prepare built it, to `data_dir`: its files, then its record (the
  marker readers wait for)."""
  marker = os.path.relpath(record_path(".", name), ".")
  storage.publish_parts(data_dir, marker=marker, parts=parts_of(name))
  log(f"{name}: uploaded to {data_dir} ({', '.join(parts_of(name))}, "
      f"{marker} last)")


def _info_file(data_dir: str, name: str) -> str:
  return os.path.join(os.path.expanduser(data_dir), McqFiles.name, name,
                      str(McqFiles.VERSION), "dataset_info.json")


def is_prepared(data_dir: str, name: str) -> bool:
  """DIR holds data set NAME as `python -m jaxdistill.data.prepare` left it:
  its record and its mcq_files builder's prepared version (the directory the
  damaged-data error says to delete)."""
  return bool(read_record(data_dir, name)) and os.path.isfile(
      _info_file(data_dir, name))


def damage(data_dir: str, name: str) -> str | None:
  """Why prepared hub data set NAME under DIR is not whole, or None: its
  splits' record counts differ from its record's, or an array_record shard
  is missing or cannot be read to its last record (a truncated file).
  Reads every record: what a run would read."""
  if not is_prepared(data_dir, name):
    return f"{_info_file(data_dir, name)} is missing"
  want = read_record(data_dir, name)["records"]
  try:
    splits = McqFiles(data_dir=os.path.expanduser(data_dir), config=name,
                      file_format="array_record").info.splits
  except Exception as e:  # pylint: disable=broad-except
    return f"{_info_file(data_dir, name)}: {_first_line(e)}"
  have = {k: int(splits[k].num_examples) for k in splits}
  if have != want:
    return f"its splits hold {have} records, its record says {want}"
  for k in splits:
    for path, n in zip(splits[k].filepaths, splits[k].shard_lengths):
      try:
        shard = array_record_data_source.ArrayRecordDataSource([os.fspath(path)])
        if len(shard) != n:
          return f"{path}: {len(shard)} records, {n} expected"
        shard.__getitems__(range(n))
      except Exception as e:  # pylint: disable=broad-except
        return f"{path}: {_first_line(e)}"
  return None


def _first_line(e: Exception) -> str:
  return (str(e).strip().splitlines() or [type(e).__name__])[0]


def prepare_command(name: str, data_dir: str) -> str:
  return f"python -m jaxdistill.data.prepare {name} --data_dir {data_dir}"


def mcq_builder(spec, field: str):
  """The prepared mcq_files builder a data block or an evaluation suite names
  (`field`: 'data', 'config.suites.science'): over the user's files in
  `manual_dir`, or, without one, the hub data set prepared under `data_dir`
  by `python -m jaxdistill.data.prepare` (its name is `source`). One-line
  errors name the field and the command to run."""
  data_dir, manual = spec.get("data_dir"), spec.get("manual_dir")
  source = spec.get("source") or "generic"
  if not data_dir:
    raise ValueError(f"{field}.data_dir: required for multiple-choice data "
                     "(where its TFDS files are prepared)")
  if manual:
    if storage.looks_remote(data_dir):
      raise ValueError(f"{field}.data_dir: {data_dir}: files from a "
                       "manual_dir are built into a local data_dir (gs:// "
                       "holds data sets prepared by name)")
    return prepare(McqFiles, data_dir=os.path.expanduser(data_dir),
                   config=source, manual_dir=os.path.expanduser(manual))
  if source in HUB_DATASETS:
    data_dir = local_data_dir(data_dir, source, f"{field}.data_dir")
  if source in HUB_DATASETS and is_prepared(data_dir, source):
    return prepare(McqFiles, data_dir=data_dir, config=source)
  if source in HUB_DATASETS:
    raise ValueError(f"{field}.manual_dir: not set, and {data_dir} holds no "
                     f"prepared {source!r}: run `{prepare_command(source, data_dir)}` "
                     "(or set manual_dir to your own files)")
  raise ValueError(f"{field}.manual_dir: required for source {source!r} (a "
                   "directory of your files; prepared by name: "
                   f"{', '.join(HUB_DATASETS)})")
