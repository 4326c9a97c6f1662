"""Read and write safetensors files with numpy alone (no `safetensors` package here).

Layout: an 8-byte little-endian header length N, N bytes of JSON, then the data buffer.
The JSON maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}, the
offsets relative to the start of the data buffer, plus an optional "__metadata__" object
of string to string. Tensors are little-endian and C-contiguous; the buffer must be
covered exactly, without holes or overlaps.
"""

import json
import struct

import numpy as np


class SafetensorsError(ValueError):
    """The file is not a well-formed safetensors file."""


# safetensors dtype name -> numpy little-endian dtype. BF16 has no numpy dtype: it is
# read as uint16 and widened to float32 (a bfloat16 is the top half of a float32).
_DTYPES = {
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
    "U8": np.dtype("u1"),
    "BF16": np.dtype("<u2"),
}
_WRITABLE = {np.dtype(d).newbyteorder("<"): name for name, d in _DTYPES.items() if name != "BF16"}

# The reference implementation refuses headers above 100 MB; so do we, so that a corrupt
# length is reported instead of attempting a huge read.
_MAX_HEADER_BYTES = 100 * 1000 * 1000


def read(path):
    """Returns (tensors, metadata): an insertion-ordered dict of name -> np.ndarray and a
    dict of str -> str. Raises SafetensorsError for a malformed file."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise SafetensorsError(f"{path}: {len(blob)} bytes, too short for a header length")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if header_len > _MAX_HEADER_BYTES or 8 + header_len > len(blob):
        raise SafetensorsError(f"{path}: header length {header_len} exceeds the file size {len(blob)}")
    try:
        header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")

    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise SafetensorsError(f"{path}: __metadata__ must map strings to strings")

    data = memoryview(blob)[8 + header_len:]
    tensors = {}
    spans = []
    for name, entry in header.items():
        array, span = _decode_entry(path, name, entry, data)
        tensors[name] = array
        spans.append(span)

    # Every byte of the buffer belongs to exactly one tensor.
    position = 0
    for begin, end in sorted(spans):
        if begin != position:
            raise SafetensorsError(f"{path}: data buffer has a hole or overlap at byte {position}")
        position = end
    if position != len(data):
        raise SafetensorsError(f"{path}: data buffer is {len(data)} bytes, tensors cover {position}")
    return tensors, metadata


def _decode_entry(path, name, entry, data):
    where = f"{path}: tensor '{name}'"
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise SafetensorsError(f"{where}: entry must have exactly dtype, shape and data_offsets")
    dtype = _DTYPES.get(entry["dtype"])
    if dtype is None:
        raise SafetensorsError(f"{where}: unsupported dtype {entry['dtype']!r}")
    shape = entry["shape"]
    offsets = entry["data_offsets"]
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise SafetensorsError(f"{where}: bad shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
        raise SafetensorsError(f"{where}: bad data_offsets {offsets!r}")
    begin, end = offsets
    count = int(np.prod(shape, dtype=np.int64))
    if not 0 <= begin <= end <= len(data) or end - begin != count * dtype.itemsize:
        raise SafetensorsError(
            f"{where}: data_offsets {offsets} do not hold {shape} x {entry['dtype']} "
            f"inside a {len(data)}-byte buffer")
    # Copy, so that the array owns writable memory (torch.from_numpy wants that).
    array = np.frombuffer(data, dtype=dtype, count=count, offset=begin).reshape(shape).copy()
    if entry["dtype"] == "BF16":
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return array, (begin, end)


def write(path, tensors, metadata=None):
    """Writes name -> np.ndarray (F32/F64/I32/I64/U8) in the given order, with optional
    str -> str metadata."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    chunks = []
    offset = 0
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        little = array.dtype.newbyteorder("<")
        if little not in _WRITABLE:
            raise SafetensorsError(f"tensor '{name}': cannot write dtype {array.dtype}")
        raw = array.astype(little, copy=False).tobytes()
        header[name] = {"dtype": _WRITABLE[little], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    # Pad with spaces so that the data buffer starts 8-byte aligned, as the reference does.
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for raw in chunks:
            f.write(raw)
