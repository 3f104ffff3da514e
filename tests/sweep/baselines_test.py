"""The sweep's baseline store (sweep/baselines.py): a file is read back only
under its own key with its own scores; a copied, edited, damaged or old file
is refused, naming it, by the check at the sweep's start and by load."""
import json
import os
import shutil

import pytest

from jaxdistill.sweep import baselines

RESULT = {"metrics": {"baseline/ood/score": 0.25, "baseline/ood/a": 0.5,
                      "ood/score": 0.75},
          "lmeval": {"baseline": {"ood": {"a": {"acc,none": 0.5}}}}}


def _store(tmp_path):
  work = str(tmp_path / "work")
  baselines.save(work, "k1", RESULT, "Qwen/x")
  baselines.save(work, "k2", {"metrics": {"baseline/ood/score": 0.1}}, "y")
  return work


def test_round_trip_and_the_check_of_a_good_store(tmp_path):
  work = _store(tmp_path)
  metrics, lmeval = baselines.load(work, "k1")
  assert metrics == {"ood/score": 0.25, "ood/a": 0.5}  # prefix dropped
  assert lmeval == {"ood": {"a": {"acc,none": 0.5}}}
  assert baselines.load(work, "k3") is None
  baselines.check(work)
  baselines.check(str(tmp_path / "none"))  # no store yet


def _damaged(tmp_path, damage):
  work = _store(tmp_path)
  damage(os.path.join(work, baselines.DIR))
  return work


def _edit(d, name, change):
  p = os.path.join(d, name)
  with open(p) as f:
    doc = json.load(f)
  change(doc)
  with open(p, "w") as f:
    json.dump(doc, f)


@pytest.mark.parametrize("damage,match", [
    # k2's scores copied under k1's name: read as k1's before.
    (lambda d: shutil.copy(os.path.join(d, "k2.json"),
                           os.path.join(d, "k1.json")),
     r"k1\.json: holds the baseline of key 'k2', not 'k1'"),
    (lambda d: _edit(d, "k1.json",
                     lambda doc: doc["metrics"].update({"ood/score": 0.9})),
     r"k1\.json: its scores do not match their checksum"),
    (lambda d: _edit(d, "k1.json",
                     lambda doc: [doc.pop("key"), doc.pop("sha256")]),
     r"k1\.json: has no key or checksum"),
    (lambda d: _edit(d, "k1.json",
                     lambda doc: doc["metrics"].update({"ood/score": "high"})),
     r"k1\.json: its metrics are not \{name: number\}"),
    (lambda d: open(os.path.join(d, "k1.json"), "w").write('{"metrics": '),
     r"k1\.json: not a baseline store file \(JSONDecodeError"),
    (lambda d: open(os.path.join(d, "k1.json"), "w").write("[1]"),
     r"k1\.json: not a baseline store file"),
])
def test_a_damaged_file_is_refused_naming_it(tmp_path, damage, match):
  work = _damaged(tmp_path, damage)
  with pytest.raises(ValueError, match=match + ".*; delete it to evaluate "
                     "the baseline again$"):
    baselines.check(work)
  with pytest.raises(ValueError, match=match):
    baselines.load(work, "k1")
  assert baselines.load(work, "k2")[0] == {"ood/score": 0.1}
