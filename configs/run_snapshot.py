r"""A training config read back from a JSON snapshot (one run of a sweep).

The sweep writes <workdir>/<run>/run_config.json for every run (and
<workdir>/<run>/rlvr/run_config.json, a GRPO config, for an RLVR stage:
`python -m jaxdistill.rl.train` reads it the same way). When a run's
settings cannot be written as --config.x=y flags (e.g. optim.clip_norm=None:
flags cannot set a float field to None), its launch command is

  python -m jaxdistill.train \
    --config configs/run_snapshot.py:/runs/robustness/variant=fkl_noclip,policy=student,seed=0/run_config.json \
    --workdir /runs/robustness/variant=fkl_noclip,policy=student,seed=0

Without a path (or with `runlocal`) it round-trips configs/distill.py:runlocal
through JSON, which is what the config tests check.
"""
import json

import ml_collections

from jaxdistill import config_lib
from jaxdistill import storage


def get_config(arg=None):
  if not arg or arg == "runlocal":
    return ml_collections.ConfigDict(json.loads(config_lib.to_json(
        config_lib.load_config("configs/distill.py:runlocal"))))
  path = storage.check(arg, "configs/run_snapshot.py", gs_ok=True)
  if not storage.isfile(path):
    raise FileNotFoundError(f"configs/run_snapshot.py: no snapshot at {path!r}")
  with storage.open(path) as f:
    return ml_collections.ConfigDict(json.load(f))
