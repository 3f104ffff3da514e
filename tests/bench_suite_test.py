"""bench.suite: the accelerator benchmarks in one run, one JSON file."""
import json

import pytest

from jaxdistill.bench import suite


def test_last_json_finds_the_printed_object():
  obj = {"headline": {"name": "x", "value": 1.5}, "details": [1, 2]}
  assert suite.last_json(json.dumps(obj, indent=2)) == obj
  assert suite.last_json("a library's line\n" + json.dumps(obj)) == obj
  assert suite.last_json("no object here\n") is None


def test_bad_arguments_fail_before_any_benchmark(tmp_path):
  out = str(tmp_path / "b.json")
  with pytest.raises(ValueError, match="--preset: unknown 'nope'"):
    suite.main(["--preset", "nope", "--out", out])
  with pytest.raises(ValueError, match="--benches"):
    suite.main(["--preset", "tiny", "--out", out, "--benches", "models,gpu"])
  with pytest.raises(FileNotFoundError, match="--out"):
    suite.main(["--preset", "tiny", "--out", str(tmp_path / "no" / "b.json")])
  assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_tiny_preset_runs_every_benchmark_into_one_file(tmp_path):
  out = tmp_path / "bench.json"
  assert suite.main(["--preset", "tiny", "--out", str(out)]) == 0
  report = json.loads(out.read_text())
  assert report["preset"] == "tiny" and report["device"]["backend"] == "cpu"
  assert set(report["benches"]) == set(suite.BENCHES)
  for name, r in report["benches"].items():
    assert r["ok"], (name, r.get("error"), r.get("stderr_tail"))
    h = r["result"]["headline"]
    assert {"name", "value", "unit", "goal", "meets_goal"} <= set(h)
    assert report["headlines"][name] == h
