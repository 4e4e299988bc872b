"""Framed messages between the evaluator, its workers and their sandboxed children.

A frame is a 4-byte big-endian length followed by UTF-8 JSON. Arrays travel inside the JSON as
`{"__ndarray__": [dtype, shape, base64 bytes]}`. Nothing is ever unpickled: a child runs untrusted
code, so the parent decodes its frames with a dtype allow-list and checks every byte count.
"""
from __future__ import annotations

import base64
import json
import math
import struct
from typing import Any, BinaryIO

import ml_dtypes
import numpy as np

MAX_FRAME_BYTES = 256 << 20
MAX_FRAMES = 4096                       # per stream: an honest job step writes a few dozen
MAX_CONTAINERS = 16384                  # JSON arrays and objects per frame (a frame's decoded size stays bounded)
MAX_DIM = 1 << 40
ARRAY_DTYPES = {
    "float64": np.dtype(np.float64), "float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16), "int64": np.dtype(np.int64), "int32": np.dtype(np.int32),
    "int16": np.dtype(np.int16), "int8": np.dtype(np.int8), "uint32": np.dtype(np.uint32),
    "uint8": np.dtype(np.uint8), "bool": np.dtype(np.bool_),
}
_HEADER = struct.Struct(">I")


class WireError(ValueError):
  """A frame is malformed, too large or holds an array that does not add up."""


def _to_jsonable(obj: Any) -> Any:
  if isinstance(obj, np.ndarray) or type(obj).__module__.startswith(("jax", "jaxlib")):
    arr = np.asarray(obj)
    name = arr.dtype.name
    if name not in ARRAY_DTYPES:
      raise WireError(f"array dtype {name} cannot be sent (allowed: {sorted(ARRAY_DTYPES)})")
    data = np.ascontiguousarray(arr).tobytes()
    return {"__ndarray__": [name, list(arr.shape), base64.b64encode(data).decode("ascii")]}
  if isinstance(obj, dict):
    return {str(k): _to_jsonable(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_to_jsonable(v) for v in obj]
  if isinstance(obj, np.generic):
    return obj.item()
  return obj


def _decode_array(spec: Any) -> np.ndarray:
  if not (isinstance(spec, list) and len(spec) == 3):
    raise WireError("array record must be [dtype, shape, data]")
  name, shape, data = spec
  if name not in ARRAY_DTYPES:
    raise WireError(f"array dtype {name!r} is not allowed")
  if not (isinstance(shape, list) and len(shape) <= 32
          and all(isinstance(d, int) and 0 <= d <= MAX_DIM for d in shape)):
    raise WireError(f"array shape {str(shape)[:100]} is not a list of at most 32 sizes in [0, 2**40]")
  raw = base64.b64decode(data, validate=True)
  dtype = ARRAY_DTYPES[name]
  if len(raw) != math.prod(shape) * dtype.itemsize:
    raise WireError(f"array of shape {shape} and dtype {name} has {len(raw)} bytes")
  return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def _from_jsonable(obj: Any) -> Any:
  if isinstance(obj, dict):
    if set(obj) == {"__ndarray__"}:
      return _decode_array(obj["__ndarray__"])
    return {k: _from_jsonable(v) for k, v in obj.items()}
  if isinstance(obj, list):
    return [_from_jsonable(v) for v in obj]
  return obj


def encode(msg: Any) -> bytes:
  """Returns one frame (header + JSON payload) for `msg`."""
  payload = json.dumps(_to_jsonable(msg), allow_nan=True).encode("utf-8")
  if len(payload) > MAX_FRAME_BYTES:
    raise WireError(f"message of {len(payload)} bytes exceeds {MAX_FRAME_BYTES}")
  return _HEADER.pack(len(payload)) + payload


def decode_payload(payload: bytes) -> Any:
  if payload.count(b"[") + payload.count(b"{") > MAX_CONTAINERS:
    raise WireError(f"more than {MAX_CONTAINERS} arrays and objects in one frame")
  try:
    return _from_jsonable(json.loads(payload.decode("utf-8")))
  except (UnicodeDecodeError, ValueError, TypeError, ArithmeticError, RecursionError, MemoryError) as e:
    raise WireError(f"undecodable frame: {type(e).__name__}: {str(e)[:200]}") from e


def split_frames(data: bytes) -> tuple[list[Any], str | None]:
  """Decodes a byte stream of frames: (the messages decoded, None) when every byte made a frame, else
  (the messages before the first bad one, what is wrong: a cut-off tail, an oversized or undecodable frame)."""
  out, pos = [], 0
  while pos < len(data):
    if len(out) == MAX_FRAMES:
      return out, f"more than {MAX_FRAMES} frames"
    if pos + _HEADER.size > len(data):
      return out, f"{len(data) - pos} stray bytes after {len(out)} frames"
    (n,) = _HEADER.unpack_from(data, pos)
    if n > MAX_FRAME_BYTES:
      return out, f"a frame of {n} bytes (cap {MAX_FRAME_BYTES}) after {len(out)} frames"
    if pos + _HEADER.size + n > len(data):
      return out, f"a cut-off frame after {len(out)} frames"
    try:
      out.append(decode_payload(data[pos + _HEADER.size: pos + _HEADER.size + n]))
    except WireError as e:
      return out, f"frame {len(out)}: {e}"
    pos += _HEADER.size + n
  return out, None


def read_exact(stream: BinaryIO, n: int) -> bytes:
  chunks, left = [], n
  while left:
    chunk = stream.read(left)
    if not chunk:
      raise EOFError(f"stream closed with {left} of {n} bytes unread")
    chunks.append(chunk)
    left -= len(chunk)
  return b"".join(chunks)


def read_frame(stream: BinaryIO) -> Any:
  (n,) = _HEADER.unpack(read_exact(stream, _HEADER.size))
  if n > MAX_FRAME_BYTES:
    raise WireError(f"frame of {n} bytes exceeds {MAX_FRAME_BYTES}")
  return decode_payload(read_exact(stream, n))


def write_frame(stream: BinaryIO, msg: Any) -> None:
  stream.write(encode(msg))
  stream.flush()
