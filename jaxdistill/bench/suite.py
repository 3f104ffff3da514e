"""The accelerator benchmarks in one go: bench.models, bench.rollout and
bench.train with one `--preset`, one JSON file.

  python -m jaxdistill.bench.suite --preset qwen-0.5b-1.5b --out bench.json   # GPU / TPU
  python -m jaxdistill.bench.suite --preset tiny --out /tmp/bench.json       # CPU check

Each benchmark runs in its own process (one's memory or a crash never
touches the next), one after another, with a time limit each; the file holds
the device, each benchmark's whole JSON (or its error and the end of its
stderr) and their headlines side by side. The presets and the device limits
the figures are fractions of (bf16 matmul rate, copy bandwidth, measured in
each benchmark's own run) are in jaxdistill/bench/presets.py.

Goals on an accelerator (issue 17): distillation step MFU >= 0.45 (bench.train),
decode within 1.5x the HBM bandwidth bound (bench.rollout).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from jaxdistill import storage
from jaxdistill.bench import presets

BENCHES = ("models", "rollout", "train")
PROFILED = ("rollout", "train")  # the ones with --profile


def _log(*a):
  print(*a, file=sys.stderr, flush=True)


def last_json(text: str):
  """The JSON object a benchmark printed: stdout from the last line that
  opens an object to the end (progress goes to stderr, but a library may
  print lines before it); None if there is none."""
  lines = text.strip().splitlines()
  for i in range(len(lines) - 1, -1, -1):
    if lines[i].startswith("{"):
      try:
        return json.loads("\n".join(lines[i:]))
      except ValueError:
        continue
  return None


_DEVICE_INFO = """
import json, jax
d = jax.devices()[0]
print(json.dumps({"backend": jax.default_backend(), "device_kind": d.device_kind,
                  "device_count": jax.device_count(), "jax": jax.__version__}))
"""


def device_info(timeout: float = 300) -> dict:
  """The device the benchmarks run on, asked in a child process: the suite's
  own process never starts a backend (on a GPU, JAX would take most of the
  memory up front and the benchmarks launched after it would run out)."""
  r = subprocess.run([sys.executable, "-c", _DEVICE_INFO], capture_output=True,
                     text=True, timeout=timeout, check=False)
  if r.returncode != 0:
    raise RuntimeError("could not start JAX to read the device: "
                       + (r.stderr.strip().splitlines() or ["no output"])[-1])
  return json.loads(r.stdout.strip().splitlines()[-1])


def run_bench(name: str, preset: str, timeout: float, extra=()) -> dict:
  """One benchmark in a subprocess -> {'ok', 'seconds', 'result' | 'error'}."""
  cmd = [sys.executable, "-m", f"jaxdistill.bench.{name}", "--preset", preset,
         *extra]
  _log(f"[suite] {' '.join(cmd[1:])}")
  t0 = time.time()
  try:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired as e:
    err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    return {"ok": False, "seconds": time.time() - t0, "command": cmd[1:],
            "error": f"timed out after {timeout:.0f} s", "stderr_tail": err[-2000:]}
  out = {"seconds": time.time() - t0, "command": cmd[1:]}
  result = last_json(p.stdout) if p.returncode == 0 else None
  if result is None:
    out.update(ok=False, error=f"exit status {p.returncode}" + (
        "" if p.returncode else "; no JSON object on stdout"),
               stderr_tail=p.stderr[-2000:])
  else:
    out.update(ok=True, result=result)
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--preset", required=True,
                  help="a jaxdistill.bench.presets name")
  ap.add_argument("--out", required=True, help="the JSON file to write")
  ap.add_argument("--benches", default=",".join(BENCHES),
                  help=f"comma-separated subset of {BENCHES}")
  ap.add_argument("--timeout", type=float, default=900,
                  help="seconds per benchmark")
  ap.add_argument("--profile", action="store_true",
                  help=f"pass --profile to {PROFILED}: time per source op")
  args = ap.parse_args(argv)
  storage.check(args.out, "--out")  # a URL would become a local gs: dir
  presets.get(args.preset)  # an unknown name fails here, before any run
  names = [b for b in args.benches.split(",") if b]
  bad = [b for b in names if b not in BENCHES]
  if bad or not names:
    raise ValueError(f"--benches: {bad or names} not in {BENCHES}")
  out_dir = os.path.dirname(os.path.abspath(args.out))
  if not os.path.isdir(out_dir):
    raise FileNotFoundError(f"--out: directory {out_dir} does not exist")
  report = {"preset": args.preset, "device": device_info(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"), "benches": {},
            "headlines": {}}
  for name in names:
    extra = ("--profile",) if args.profile and name in PROFILED else ()
    r = run_bench(name, args.preset, args.timeout, extra)
    report["benches"][name] = r
    report["headlines"][name] = (r["result"].get("headline") if r["ok"]
                                 else {"error": r["error"]})
    with open(args.out + ".tmp", "w") as f:  # kept after every benchmark
      json.dump(report, f, indent=2, sort_keys=True)
    os.replace(args.out + ".tmp", args.out)
  print(json.dumps(report["headlines"], indent=2, sort_keys=True))
  failed = [n for n in names if not report["benches"][n]["ok"]]
  if failed:
    _log(f"[suite] failed: {failed} (errors in {args.out})")
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
