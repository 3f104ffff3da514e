"""bench.cache_check: one JSON object whose headline is the check's time over
one read, both from the rounds it reports (checked by hand here)."""
import json
import statistics
import subprocess
import sys


def test_cache_check_prints_its_headline_from_its_own_rounds():
  out = subprocess.run(
      [sys.executable, "-m", "jaxdistill.bench.cache_check", "--mib", "2",
       "--rounds", "3"], check=True, capture_output=True, text=True, timeout=300)
  r = json.loads(out.stdout)
  h = r["headline"]
  assert set(h) == {"name", "value", "unit", "goal", "meets_goal"}
  assert h["unit"] == "x" and h["goal"] == "<= 2"
  where = "disk" if "(from disk)" in h["name"] else "page_cache"
  rounds = r[where]["rounds"]
  assert all(len(v) == 3 for v in rounds.values())
  check = max(statistics.median(rounds["open_checked"])
              - statistics.median(rounds["open_unchecked"]), 0.0)
  ratio = check / statistics.median(rounds["read"])
  # the rounds are in microseconds, the headline to 2 decimals
  assert abs(h["value"] - ratio) <= 0.01 + 0.01 * ratio
  assert h["meets_goal"] == (h["value"] <= 2)
  assert r["records_bytes"] > 2 * 2**20 * 0.5
