"""Minimal streaming safetensors reader/writer (numpy + ml_dtypes).

We parse the format ourselves instead of using `safetensors.numpy`, because
(1) numpy has no bfloat16 without ml_dtypes, and (2) we want to read a slice of
rows of one tensor into a fresh buffer with `readinto`, so that loading never
maps or copies a whole file: peak host memory stays near the parameters' size.

Format: u64 little-endian header length, a JSON header
{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
then the raw little-endian tensor bytes (offsets relative to the data start).
"""
from __future__ import annotations

from collections.abc import Iterable
import dataclasses
import json
import os
import struct

import ml_dtypes
import numpy as np

DTYPES = {
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F64": np.dtype(np.float64),
}
_CODES = {v: k for k, v in DTYPES.items()}


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  file: str
  dtype: np.dtype
  shape: tuple[int, ...]
  offset: int  # absolute byte offset of the first element in `file`

  @property
  def nbytes(self) -> int:
    return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def read_header(path: str) -> dict[str, TensorInfo]:
  """Tensor name -> TensorInfo for one .safetensors file."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"safetensors file not found: {path}")
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    raw = f.read(8)
    if len(raw) != 8:
      raise ValueError(f"{path}: not a safetensors file (too short)")
    (n,) = struct.unpack("<Q", raw)
    if n > size - 8:
      raise ValueError(f"{path}: corrupt safetensors header length {n}")
    try:
      header = json.loads(f.read(n))
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
      raise ValueError(f"{path}: corrupt safetensors header: "
                       f"{type(e).__name__}: {e}") from None
  if not isinstance(header, dict):
    raise ValueError(f"{path}: corrupt safetensors header (not a JSON object)")
  out = {}
  for name, h in header.items():
    if name == "__metadata__":
      continue
    if (not isinstance(h, dict) or
        not {"dtype", "shape", "data_offsets"} <= set(h)):
      raise ValueError(f"{path}: corrupt safetensors header entry for "
                       f"tensor {name!r}")
    if h["dtype"] not in DTYPES:
      raise ValueError(f"{path}: tensor {name!r} has unsupported dtype "
                       f"{h['dtype']}; supported: {sorted(DTYPES)}")
    info = TensorInfo(path, DTYPES[h["dtype"]], tuple(h["shape"]),
                      8 + n + h["data_offsets"][0])
    if h["data_offsets"][1] - h["data_offsets"][0] != info.nbytes or (
        8 + n + h["data_offsets"][1] > size):
      raise ValueError(f"{path}: tensor {name!r} byte range does not match "
                       f"its shape {info.shape} / file size")
    out[name] = info
  return out


def read_rows(info: TensorInfo, start: int = 0, stop: int | None = None,
              f=None) -> np.ndarray:
  """Rows [start, stop) of a tensor (leading axis), read into a new array."""
  stop = info.shape[0] if stop is None else stop
  if not info.shape:
    start, stop, rest = 0, 1, ()
  else:
    rest = info.shape[1:]
  row_bytes = int(np.prod(rest, dtype=np.int64)) * info.dtype.itemsize
  buf = np.empty((stop - start) * row_bytes, np.uint8)
  own = f is None
  f = open(info.file, "rb") if own else f
  try:
    f.seek(info.offset + start * row_bytes)
    if f.readinto(memoryview(buf)) != buf.nbytes:
      raise ValueError(f"{info.file}: truncated tensor data")
  finally:
    if own:
      f.close()
  arr = buf.view(info.dtype)
  return arr.reshape(info.shape if not info.shape else (stop - start,) + rest)


def write_file(path: str, tensors: Iterable[tuple[str, tuple, np.dtype]],
               produce, metadata: dict[str, str] | None = None) -> None:
  """Writes tensors one at a time: `produce(name)` returns each array.

  `tensors` lists (name, shape, dtype) up front so the header can be written
  before any tensor is materialised.
  """
  header, off = {}, 0
  tensors = list(tensors)
  for name, shape, dtype in tensors:
    dtype = np.dtype(dtype)
    if dtype not in _CODES:
      raise ValueError(f"cannot save tensor {name!r} of dtype {dtype}")
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    header[name] = {"dtype": _CODES[dtype], "shape": list(shape),
                    "data_offsets": [off, off + nbytes]}
    off += nbytes
  header["__metadata__"] = dict(metadata or {"format": "pt"})
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)  # align the data start to 8 bytes
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for name, shape, dtype in tensors:
      arr = np.ascontiguousarray(produce(name), dtype=np.dtype(dtype))
      if tuple(arr.shape) != tuple(shape):
        raise ValueError(f"tensor {name!r}: produced shape {arr.shape}, "
                         f"declared {tuple(shape)}")
      f.write(arr.reshape(-1).view(np.uint8).data)
