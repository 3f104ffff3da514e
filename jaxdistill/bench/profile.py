"""Where a compiled program spends its time: per-op times from a profile.

  os.environ["XLA_FLAGS"] += " " + profile.dump_flags(dump_dir)  # before JAX starts
  ...                                                      # compile, warm up
  ops = profile.op_times(run, dump_dir)                    # run() once, traced
  profile.by_scope(ops)  # {'up_proj/dot_general': ms, ...}, slowest first

`op_times` runs `run()` under `jax.profiler.trace` and reads the Perfetto trace
it writes: every event that names an XLA op (`hlo_op`, `hlo_module`), summed
per op. The op's source is the `op_name` metadata of the optimized HLO that
XLA dumps (`dump_flags`; the dump is the only place it can be read back for a
program compiled inside a library call such as `rollout.generate`). Times are
wall-clock durations of each op on its thread: ops that run concurrently both
count, and profiling adds a little overhead per op, so compare shares within
one profile rather than with untraced timings.
"""
from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import tempfile

import jax

_INSTR = re.compile(r'\s*(?:ROOT )?%?([\w.\-]+) = .*?op_name="([^"]*)"')


def dump_flags(dump_dir: str) -> str:
  """XLA flags that make XLA write each program's optimized HLO (text) to
  `dump_dir`; add them to XLA_FLAGS before JAX initialises its backend."""
  return f"--xla_dump_to={dump_dir} --xla_dump_hlo_as_text"


def op_names(dump_dir: str, module: str, ops=()) -> dict[str, str]:
  """{instruction name: op_name metadata} of `module`'s optimized HLO.

  A module name can have several dumps (the same function compiled for other
  shapes); the one holding the most of `ops` (the ops a trace saw) is read.
  """
  best, best_hits = {}, -1
  pattern = os.path.join(dump_dir, f"*.{module}.*after_optimizations.txt")
  for path in sorted(glob.glob(pattern)):
    names = {}
    with open(path) as f:
      for line in f:
        m = _INSTR.match(line)
        if m:
          names.setdefault(m.group(1), m.group(2))
    hits = sum(op in names for op in ops)
    if hits > best_hits:
      best, best_hits = names, hits
  return best


def _trace_events(trace_dir: str):
  paths = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"),
                    recursive=True)
  if not paths:
    raise RuntimeError(f"no profiler trace written under {trace_dir}")
  with gzip.open(max(paths, key=os.path.getmtime)) as f:
    return json.load(f)["traceEvents"]


def op_times(run, dump_dir: str | None = None, calls: int = 1) -> list[dict]:
  """Runs `run()` `calls` times under the profiler; one row per XLA op seen,
  slowest first: {module, op, op_name, ms (per call of run), count (per
  call)}. `op_name` is '' when `dump_dir` is None or holds no dump of the
  op's module. Raises RuntimeError if the trace names no XLA op."""
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d, create_perfetto_trace=True):
      for _ in range(calls):
        jax.block_until_ready(run())
    events = _trace_events(d)
  total, count = collections.Counter(), collections.Counter()
  for e in events:
    args = e.get("args", {})
    if e.get("ph") == "X" and "hlo_op" in args:
      key = (args.get("hlo_module", ""), args["hlo_op"])
      total[key] += e["dur"]
      count[key] += 1
  if not total:
    raise RuntimeError("the trace holds no XLA op events (hlo_op) to read")
  names = {}
  if dump_dir:
    for module in {m for m, _ in total}:
      names[module] = op_names(dump_dir, module,
                               [op for m, op in total if m == module])
  rows = []
  for (module, op), us in total.most_common():
    rows.append({"module": module, "op": op,
                 "op_name": names.get(module, {}).get(op, ""),
                 "ms": us / 1e3 / calls, "count": count[(module, op)] / calls})
  return rows


def scope(op_name: str, op: str = "", groups=()) -> str:
  """A short label for an op: the last two parts of its op_name (the layer
  part and the primitive, e.g. 'up_proj/dot_general'), after the first of
  `groups` (named scopes, e.g. 'teacher') that the op_name passes through,
  marked 'bwd:' inside a transpose (the backward pass) or else 'fwd:' inside a
  jvp (traced inside the differentiated function: also a frozen teacher called
  there); the op's own name if it has no op_name."""
  if not op_name:
    return op.split(".")[0]
  parts = op_name.split("/")
  label = "/".join(parts[-2:])
  # A named scope inside a transformation reads e.g. 'jvp(teacher)'.
  inner = {x.split("(")[-1].rstrip(")") for x in parts[:-2]}
  group = next((g for g in groups if g in inner), None)
  if group:
    label = f"{group}:{label}"
  if "transpose(" in op_name:
    return "bwd:" + label
  return ("fwd:" if "jvp(" in op_name else "") + label


def by_scope(rows: list[dict], groups=()) -> dict[str, float]:
  """{scope: ms per call}, slowest first (ops of the same scope summed)."""
  ms = collections.Counter()
  for r in rows:
    ms[scope(r["op_name"], r["op"], groups)] += r["ms"]
  return {k: round(v, 4) for k, v in ms.most_common()}


def summary(rows: list[dict], top: int = 20, groups=()) -> dict:
  """The JSON section a benchmark prints: the traced time of one call and
  its `top` slowest scopes (by_scope) with their shares."""
  scopes = by_scope(rows, groups)
  total = sum(scopes.values())
  return {"traced_ms": round(total, 3),
          "by_scope": [{"scope": k, "ms": v, "share": round(v / total, 3)}
                       for k, v in list(scopes.items())[:top]],
          "note": "op durations per source scope for one call, under the "
                  "profiler (bench.profile); fwd:/bwd: = forward/backward of "
                  "what is differentiated"}
