"""The sweep's baseline scores: one evaluation per baseline and config.

With grid.eval.baseline every arm compares its checkpoint with the student
it started from, on the baseline's suites (evaluate/run.py baseline_plan:
the OOD ones, for forgetting). Arms of one family and task share that
student and that evaluation config, so all of them would decode the same
baseline completions again: with the study's default forgetting suite (the
seven lm-eval benchmarks, 3,935 examples) that is the largest share of an
arm's evaluation. The first arm evaluates the baseline; process 0 keeps its
scores (and lm-eval's own results of the harness suites) in
<workdir>/baselines/<key>.json; the later arms pass them to evaluate.run as
`before` and decode only their own checkpoint (sparsity still compares the
weights). Exact: the same program on the same weights, data and key gives
the same completions, so results.json and the tables do not change.

The key is a digest of what the baseline's scores depend on: the whole
evaluation config, the baseline checkpoint (its pinned hub name, path or
URL, and the fingerprint of the weights its local directory holds:
train/teacher_cache.weights_fingerprint), the process and device count, the
platform and the JAX version. A changed config or other weights give
another key, so a stale file is never read; `--rerun_stale` leaves the store
alone (its files are keyed, not overwritten); deleting <workdir>/baselines
evaluates the baseline again. Each file holds its key and a sha256 of its
scores: a file copied under another key's name, edited or damaged is refused,
naming it, when the sweep starts (`check`) and when an arm reads it.

Several hosts: every host reads the store at the same point (after the
"trained" barrier of an arm) and process 0 writes it before the "finished"
barrier of the arm that evaluated it, so all hosts agree whether an arm
decodes the baseline.
"""
from __future__ import annotations

import hashlib
import json
import os

import jax

from jaxdistill import config_lib
from jaxdistill import storage
from jaxdistill.evaluate import run as evaluate_run
from jaxdistill.train import teacher_cache

DIR = "baselines"
PREFIX = "baseline/"


def key(config, baseline: str) -> str:
  """The store's key of `baseline` evaluated with the evaluation `config`."""
  local = evaluate_run.resolve_checkpoint(baseline, "--baseline")
  blob = json.dumps({
      "config": json.loads(config_lib.to_json(config)),
      "baseline": baseline,
      "weights": teacher_cache.weights_fingerprint(local),
      "processes": jax.process_count(), "devices": jax.device_count(),
      "platform": jax.devices()[0].platform, "jax": jax.__version__,
  }, sort_keys=True, default=str).encode()
  return hashlib.sha256(blob).hexdigest()[:16]


def path(workdir: str, k: str) -> str:
  return os.path.join(workdir, DIR, f"{k}.json")


def _digest(metrics: dict, lmeval: dict) -> str:
  return hashlib.sha256(json.dumps([metrics, lmeval], sort_keys=True).encode()
                        ).hexdigest()


def _read(p: str, k: str) -> tuple[dict, dict]:
  def bad(why):
    return ValueError(f"{p}: {why}; delete it to evaluate the baseline again")
  try:
    d = json.loads(storage.read_text(p))
    metrics, lmeval = d["metrics"], d.get("lmeval") or {}
    held, digest = d.get("key"), d.get("sha256")
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    raise bad(f"not a baseline store file ({type(e).__name__}: {e})") from None
  if held is None or digest is None:
    raise bad("has no key or checksum (written before they were kept)")
  if held != k:
    raise bad(f"holds the baseline of key {held!r}, not {k!r}")
  if not (isinstance(metrics, dict) and isinstance(lmeval, dict) and all(
      isinstance(v, (int, float)) and not isinstance(v, bool)
      for v in metrics.values())):
    raise bad("its metrics are not {name: number}")
  if digest != _digest(metrics, lmeval):
    raise bad("its scores do not match their checksum (edited or damaged)")
  return dict(metrics), dict(lmeval)


def load(workdir: str, k: str) -> tuple[dict, dict] | None:
  """(metrics without their 'baseline/' prefix, lm-eval's results) of an
  earlier evaluation under key `k`, or None; ValueError naming a file that
  is not one (_read)."""
  p = path(workdir, k)
  if not storage.isfile(p):
    return None
  return _read(p, k)


def check(workdir: str) -> None:
  """Every file of <workdir>/baselines read as an arm would (before the
  sweep trains anything)."""
  d = os.path.join(workdir, DIR)
  if not storage.isdir(d):
    return
  for name in sorted(storage.listdir(d)):
    if name.endswith(".json"):
      _read(os.path.join(d, name), name[:-len(".json")])


def save(workdir: str, k: str, result: dict, baseline: str) -> None:
  """Keeps the baseline's scores of evaluate.run's `result` under `k`."""
  metrics = {m.removeprefix(PREFIX): v for m, v in result["metrics"].items()
             if m.startswith(PREFIX)}
  if not metrics:
    return  # no baseline suite was scored
  lmeval = (result.get("lmeval") or {}).get("baseline") or {}
  storage.makedirs(os.path.join(workdir, DIR))
  storage.write_text(path(workdir, k), json.dumps(
      {"baseline": baseline, "key": k, "metrics": metrics, "lmeval": lmeval,
       "sha256": _digest(metrics, lmeval)}, indent=1, sort_keys=True))
