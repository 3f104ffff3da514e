"""Inter-chip bytes of a compiled program, read from its optimized HLO.

`count(compiled.as_text(), devices)` walks the program XLA compiled (after
SPMD partitioning: every shape is one device's) from its entry computation
and adds, per device, the bytes each collective moves into that device,
times the trips of every while loop it sits in (nested loops multiply).

Bytes into one device, with A the bytes of the collective's operands on
that device (an all-reduce whose result is narrower than its operand, f32
reduced into bf16: the result's) and n the devices of its replica group
(ring algorithms; the least a device must receive):
  all-gather          A (n - 1)          (the output is n A: the other n - 1
                                          shards come in)
  reduce-scatter      A (n - 1) / n      (n - 1 steps of one 1/n block)
  all-reduce          2 A (n - 1) / n    (a reduce-scatter, then an all-gather)
  all-to-all          A (n - 1) / n      (every block but its own comes in)
  collective-permute  A                  (one buffer from its source)
The asynchronous forms (`all-gather-start`, ...) are counted at the start.
The TPU compiler's async collective fusions put a copy of the collective in
each fusion of its start, its continuations (inside other computations it
overlaps) and its done, all with one channel_id: a collective is counted
once per channel_id (and kind and shape: distinct collectives can share an
id), at the fewest runs of any of its copies. (A
continuation can sit inside a loop that the collective overlaps: the
prefill of a rollout started the gather of its 467 MB head before the
layer scan and continued it inside; counted per copy, it moved that head 28
times.)

Trip counts: a while's `known_trip_count` where XLA wrote one (the TPU
compiler does not, in jax 0.10 / libtpu of its time), else read from the
loop: the condition compares an induction variable (plus a constant) with
a constant, the body adds a constant step to it, the loop starts it at a
constant. A condition that also tests something else (the decode loop's
"not every row is done") gives an upper bound, reported "at most". A loop
whose count cannot be read is counted once and reported "unknown", so that
the total is then a lower bound. A conditional counts its costliest branch;
a loop condition runs once more than its body.
"""
from __future__ import annotations

import dataclasses
import math
import re

# Part of compile_only's cache key: a change to what `count` reads from a
# program must not be hidden by reports cached before it. 2: fused loop
# conditions (the GPU compiler's) read through; 3: and multi-output fusions.
VERSION = 3

_ITEMSIZE = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2,
             "u16": 2, "s32": 4, "u32": 4, "s64": 8, "u64": 8, "f16": 2,
             "bf16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16}
KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all",
         "collective-permute")
_ARRAY = re.compile(r"\b([a-z]+\d*[a-z0-9]*)\[([\d,]*)\]")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_NAME = re.compile(r"%([\w.\-]+)")


@dataclasses.dataclass
class Instr:
  name: str
  shape: str
  opcode: str
  operands: list
  raw_operands: str
  attrs: str


def _closing(s: str, i: int) -> int:
  """Index just past the bracket group opening at s[i]."""
  pairs = {"(": ")", "{": "}", "[": "]"}
  depth, want = 0, []
  for j in range(i, len(s)):
    c = s[j]
    if c in pairs:
      want.append(pairs[c])
      depth += 1
    elif want and c == want[-1]:
      want.pop()
      depth -= 1
      if depth == 0:
        return j + 1
  raise ValueError(f"unbalanced HLO text: {s[i:i + 80]!r}")


def _instr(line: str) -> Instr | None:
  line = line.strip()
  if line.startswith("ROOT "):
    line = line[5:]
  m = re.match(r"%?([\w.\-]+)\s*=\s*", line)
  if not m:
    return None
  rest = line[m.end():]
  if rest.startswith("("):
    end = _closing(rest, 0)
  else:
    end = rest.index(" ")
  shape, rest = rest[:end], rest[end:].lstrip()
  op = re.match(r"([\w\-]+)\(", rest)
  if not op:
    return None
  close = _closing(rest, op.end() - 1)
  raw = re.sub(r"/\*.*?\*/", "", rest[op.end():close - 1])
  return Instr(m.group(1), shape, op.group(1), _NAME.findall(raw), raw,
               rest[close:])


def parse(text: str):
  """HLO module text -> ({computation: {instruction name: Instr}},
  {computation: root name}, entry computation name)."""
  comps, roots, entry, cur = {}, {}, None, None
  for line in text.splitlines():
    if cur is None:
      m = _HEADER.match(line)
      if m:
        cur = m.group(1)
        comps[cur] = {}
        if line.startswith("ENTRY"):
          entry = cur
      continue
    if line.strip() == "}":
      cur = None
      continue
    ins = _instr(line)
    if ins is not None:
      comps[cur][ins.name] = ins
      if line.strip().startswith("ROOT "):
        roots[cur] = ins.name
  if entry is None:
    raise ValueError("HLO text has no ENTRY computation")
  return comps, roots, entry


def shape_bytes(shape: str) -> float:
  """Bytes of an HLO shape (a tuple: the sum of its arrays; token and
  opaque types none); layouts and tiling padding are not counted."""
  total = 0.0
  for dtype, dims in _ARRAY.findall(shape):
    size = _ITEMSIZE.get(dtype, 1 if dtype.startswith("f8") else None)
    if size is not None:
      total += size * math.prod(int(d) for d in dims.split(",") if d)
  return total


def group_size(attrs: str, devices: int) -> int:
  """Devices in each replica group of a collective: explicit groups
  {{0,1},{2,3}}, iota groups [G,S]<=[...], or mesh groups
  mesh['axis_0'=2,'axis_1'=4] {'axis_1'}; none or empty: all devices."""
  m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs)
  if m:
    sizes = {k: int(v) for k, v in re.findall(r"'([^']+)'=(\d+)", m.group(1))}
    n = 1
    for axis, sub in re.findall(r"'([^']+)'(?::\(\d+\)(\d+))?", m.group(2)):
      n *= int(sub) if sub else sizes[axis]
    return n
  m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", attrs)
  if m:
    return int(m.group(2))
  m = re.search(r"replica_groups=\{\{([^}]*)\}", attrs)
  if m and m.group(1).strip():
    return len(m.group(1).split(","))
  return devices


def _kind(opcode: str) -> str | None:
  base = opcode[:-len("-start")] if opcode.endswith("-start") else opcode
  return base if base in KINDS else None


def _moved(kind: str, a: float, n: int) -> float:
  if kind == "collective-permute":
    return a
  if n <= 1:
    return 0.0
  return {"all-gather": a * (n - 1), "reduce-scatter": a * (n - 1) / n,
          "all-reduce": 2 * a * (n - 1) / n,
          "all-to-all": a * (n - 1) / n}[kind]


def _called(ins: Instr, key: str) -> list:
  m = re.search(key + r"=(\{[^}]*\}|%[\w.\-]+)", ins.attrs)
  return _NAME.findall(m.group(1)) if m else []


class _Module:

  def __init__(self, text: str, devices: int):
    self.comps, self.roots, self.entry = parse(text)
    self.devices = devices
    # channel_id -> the fewest runs of its copies (a first walk), and the
    # channel ids counted so far in the second.
    self.runs, self.fewest, self.counted = {}, None, set()

  # -- trip counts -------------------------------------------------------

  def _affine(self, comp: str, name: str, depth: int = 0):
    """An instruction of a loop's condition or body as ('const', v) or
    ('iv', tuple index, offset) of the loop state's element; None if
    neither."""
    ins = self.comps[comp].get(name)
    if ins is None or depth > 50:
      return None
    op = ins.opcode
    if op == "constant":
      try:
        return ("const", int(ins.raw_operands.strip()))
      except ValueError:
        return None
    if op in ("copy", "convert", "bitcast") and ins.operands:
      return self._affine(comp, ins.operands[0], depth + 1)
    if op == "get-tuple-element":
      src = self.comps[comp].get(ins.operands[0])
      idx = int(re.search(r"index=(\d+)", ins.attrs).group(1))
      while src is not None and src.opcode == "copy" and src.operands:
        src = self.comps[comp].get(src.operands[0])
      if src is not None and src.opcode == "parameter":
        return ("iv", idx, 0)
      if src is not None and src.opcode == "tuple":  # a multi-output fusion's
        return self._affine(comp, src.operands[idx], depth + 1)
      return None
    if op in ("add", "subtract") and len(ins.operands) == 2:
      a = self._affine(comp, ins.operands[0], depth + 1)
      b = self._affine(comp, ins.operands[1], depth + 1)
      if a is None or b is None:
        return None
      sign = 1 if op == "add" else -1
      if a[0] == "const" and b[0] == "const":
        return ("const", a[1] + sign * b[1])
      if a[0] == "iv" and b[0] == "const":
        return ("iv", a[1], a[2] + sign * b[1])
      if a[0] == "const" and b[0] == "iv" and sign == 1:
        return ("iv", b[1], b[2] + a[1])
    return None

  def _init(self, comp: str, name: str, idx: int | None, depth: int = 0):
    """The constant value of element `idx` of instruction `name` (the
    loop's initial state), or None."""
    ins = self.comps[comp].get(name)
    if ins is None or depth > 50:
      return None
    op = ins.opcode
    if idx is not None:
      if op == "tuple":
        return self._init(comp, ins.operands[idx], None, depth + 1)
      if op == "copy":
        return self._init(comp, ins.operands[0], idx, depth + 1)
      return None
    if op == "constant":
      try:
        return int(ins.raw_operands.strip())
      except ValueError:
        return None
    if op in ("copy", "convert", "bitcast"):
      return self._init(comp, ins.operands[0], None, depth + 1)
    if op == "get-tuple-element":
      i = int(re.search(r"index=(\d+)", ins.attrs).group(1))
      return self._init(comp, ins.operands[0], i, depth + 1)
    return None

  def _conjuncts(self, comp: str, name: str):
    ins = self.comps[comp].get(name)
    if ins is not None and ins.opcode == "copy" and ins.operands:
      return self._conjuncts(comp, ins.operands[0])
    if ins is not None and ins.opcode == "and" and len(ins.operands) == 2:
      return (self._conjuncts(comp, ins.operands[0])
              + self._conjuncts(comp, ins.operands[1]))
    return [ins]

  def trips(self, comp: str, w: Instr):
    """(trip count or None, 'exact' | 'at most' | 'unknown') of while `w`
    in computation `comp`."""
    m = re.search(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)', w.attrs)
    if m:
      return int(m.group(1)), "exact"
    cond, = _called(w, "condition")
    body, = _called(w, "body")
    cond, body = self._flat(cond), self._flat(body)
    root = self.comps[body].get(self.roots.get(body))
    best, other = None, False
    for c in self._conjuncts(cond, self.roots[cond]):
      n = self._compare_trips(comp, w, cond, body, root, c)
      if n is None:
        other = True
      else:
        best = n if best is None else min(best, n)
    if best is None:
      return None, "unknown"
    return best, "at most" if other else "exact"

  def _flat(self, comp: str, depth: int = 0) -> str:
    """Computation `comp` with its fusions inlined (the GPU compiler fuses
    a loop's condition and its counter's increment into loop fusions):
    a fusion becomes a copy of its fused root, each fused parameter a copy
    of the fusion's operand. Kept apart under a new name, which no walk
    reaches, so no collective is counted twice."""
    flat = comp + "#flat"
    if flat in self.comps or depth > 20:
      return flat if flat in self.comps else comp
    out = {}
    for ins in self.comps[comp].values():
      called = _called(ins, "calls") if ins.opcode == "fusion" else []
      if len(called) != 1 or called[0] not in self.comps:
        out[ins.name] = ins
        continue
      inner = self._flat(called[0], depth + 1)
      pre = ins.name + "/"
      for f in self.comps[inner].values():
        if f.opcode == "parameter":
          k = int(f.raw_operands.strip())
          src = [ins.operands[k]] if k < len(ins.operands) else []
          out[pre + f.name] = Instr(pre + f.name, f.shape, "copy", src, "", "")
        else:
          out[pre + f.name] = dataclasses.replace(
              f, name=pre + f.name,
              operands=[pre + o if o in self.comps[inner] else o
                        for o in f.operands])
      out[ins.name] = Instr(ins.name, ins.shape, "copy",
                            [pre + self.roots[inner]], "", "")
    self.comps[flat] = out
    self.roots[flat] = self.roots[comp]
    return flat

  def _compare_trips(self, comp, w, cond, body, root, c):
    if c is None or c.opcode != "compare" or root is None or root.opcode != "tuple":
      return None
    d = re.search(r"direction=(\w+)", c.attrs)
    lhs = self._affine(cond, c.operands[0])
    rhs = self._affine(cond, c.operands[1])
    if lhs is None or rhs is None or d is None:
      return None
    d = d.group(1)
    if lhs[0] == "const" and rhs[0] == "iv":
      lhs, rhs = rhs, lhs
      d = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}.get(d, d)
    if lhs[0] != "iv" or rhs[0] != "const":
      return None
    _, idx, off = lhs
    step = self._affine(body, root.operands[idx])
    start = self._init(comp, w.operands[0], idx)
    if step is None or step[0] != "iv" or step[1] != idx or start is None:
      return None
    s, gap = step[2], rhs[1] - off - start  # the loop runs while start + k s (op) 0 + gap
    if s > 0 and d in ("LT", "LE"):
      return max(0, -(-(gap + (d == "LE")) // s))
    if s < 0 and d in ("GT", "GE"):
      return max(0, -(-(-gap + (d == "GE")) // -s))
    if s != 0 and d == "NE" and gap % s == 0 and gap // s >= 0:
      return gap // s
    return None

  # -- the walk ----------------------------------------------------------

  def walk(self, comp: str, mult: float, out: dict, depth: int = 0):
    """Adds the bytes of computation `comp`'s collectives, run `mult`
    times, into `out` (by kind, plus the loops they sit in). With
    `self.fewest` None, only notes each channel id's fewest runs."""
    if depth > 200:
      raise ValueError("HLO computations nest too deep")
    for ins in self.comps[comp].values():
      kind = _kind(ins.opcode)
      if kind is not None:
        ch = re.search(r"channel_id=(\d+)", ins.attrs)
        if ch:
          # Distinct collectives may share a channel_id (a psum and an
          # all-gather of one shard_map): copies of one also match in kind
          # and shape.
          ch = (ch.group(1), kind, re.sub(r"\{[^}]*\}", "", ins.shape))
          if self.fewest is None:  # the first pass: runs of each copy
            self.runs[ch] = min(self.runs.get(ch, mult), mult)
            continue
          if ch in self.counted or mult > self.fewest[ch]:
            continue
          self.counted.add(ch)
        a = sum(shape_bytes(self.comps[comp][o].shape)
                for o in ins.operands if o in self.comps[comp])
        if kind == "all-reduce":
          a = min(a, shape_bytes(ins.shape))
        if kind == "collective-permute" and "source_target_pairs={}" in ins.attrs:
          a = 0.0
        moved = _moved(kind, a, group_size(ins.attrs, self.devices))
        out["by_kind"][kind] = out["by_kind"].get(kind, 0.0) + mult * moved
        out["count"] += 1
        continue
      if ins.opcode == "while":
        n, how = self.trips(comp, ins)
        k = 1 if n is None else n
        inner = {"by_kind": {}, "count": 0, "loops": []}
        body, = _called(ins, "body")
        cond, = _called(ins, "condition")
        self.walk(body, mult * k, inner, depth + 1)
        self.walk(cond, mult * (k + 1), inner, depth + 1)
        if inner["count"]:
          meta = re.search(r'op_name="([^"]*)"', ins.attrs)
          out["loops"].append({
              "name": ins.name, "op_name": meta.group(1) if meta else None,
              "trips": n, "trip_count": how,
              "bytes": sum(inner["by_kind"].values())})
        _merge(out, inner)
        continue
      if ins.opcode == "conditional":
        branches = (_called(ins, "branch_computations")
                    or _called(ins, "true_computation")
                    + _called(ins, "false_computation"))
        outs = []
        for b in branches:
          o = {"by_kind": {}, "count": 0, "loops": []}
          self.walk(b, mult, o, depth + 1)
          outs.append(o)
        if outs:
          _merge(out, max(outs, key=lambda o: sum(o["by_kind"].values())))
        continue
      if ins.opcode in ("async-done", "async-update"):
        continue  # their computation is the async-start's
      for key in ("calls", "called_computations"):
        for c in _called(ins, key):
          if c in self.comps:
            self.walk(c, mult, out, depth + 1)


def _merge(out: dict, inner: dict) -> None:
  for k, v in inner["by_kind"].items():
    out["by_kind"][k] = out["by_kind"].get(k, 0.0) + v
  out["count"] += inner["count"]
  out["loops"].extend(inner["loops"])


def count(text: str, devices: int) -> dict:
  """Collective traffic of one compiled program (module doc), per device:
  {"ici_bytes", "ici_bytes_by_kind": {kind: bytes}, "ici_collectives"
  (collective instructions reached), "ici_loops": [{"name", "op_name",
  "trips", "trip_count", "bytes"}] (the loops holding collectives),
  "ici_complete": False when a loop's trip count is unknown (counted
  once: the total is then a lower bound)}. `devices`: the program's
  devices, for collectives that name no replica groups."""
  mod = _Module(text, devices)
  mod.walk(mod.entry, 1, {"by_kind": {}, "count": 0, "loops": []})
  mod.fewest = dict(mod.runs)
  out = {"by_kind": {}, "count": 0, "loops": []}
  mod.walk(mod.entry, 1, out)
  by_kind = {k: out["by_kind"].get(k, 0.0) for k in KINDS}
  return {"ici_bytes": sum(by_kind.values()), "ici_bytes_by_kind": by_kind,
          "ici_collectives": out["count"], "ici_loops": out["loops"],
          "ici_complete": all(l["trip_count"] != "unknown"
                              for l in out["loops"])}
