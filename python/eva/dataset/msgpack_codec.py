"""MessagePack with numpy values, in the ndarray-map convention of docs/formats.md ("MessagePack";
openpi / msgpack-numpy style).

An ndarray is the map ``{"__ndarray__": True, "data": <bin, C-order bytes>, "dtype": dtype.str,
"shape": [..]}`` (keys in that order, so the bytes are reproducible); a numpy scalar is
``{"__npgeneric__": True, "data": <bin>, "dtype": dtype.str}``. Strings are str, bytes are bin.
Decoding accepts these maps with str or bin keys (openpi's own packer uses bin keys) and any plain
MessagePack value.

Shared by the HDF5 (``msgpack`` item kind) and MCAP formats, which may not import each other.
The hot image path uses the native ``msgpack_image`` kernel: it writes a frame's map straight into
a reused buffer with one copy of the pixels, and decodes a frame as a zero-copy view of the payload.
The ``*_reference`` functions are the plain msgpack/numpy definitions the kernel is tested against.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import msgpack
import numpy as np

from eva._native import load

_native = load("msgpack_image")

# Anything with the buffer protocol (collections.abc.Buffer needs Python 3.12).
Buffer = bytes | bytearray | memoryview | np.ndarray

NDARRAY_KEY = "__ndarray__"
NPGENERIC_KEY = "__npgeneric__"
# msgpack bin32 carries at most this many bytes.
MAX_BIN_BYTES = 0xFFFFFFFF


def _contiguous(array: np.ndarray) -> np.ndarray:
    if array.dtype.hasobject or array.dtype.names is not None:
        raise TypeError(f"dtype {array.dtype} has no raw-bytes form for an ndarray map")
    if array.nbytes > MAX_BIN_BYTES:
        raise ValueError(f"ndarray of {array.nbytes} bytes exceeds msgpack bin32")
    return array if array.flags.c_contiguous else array.copy(order="C")


def _byte_view(obj: Buffer) -> memoryview:
    """A flat unsigned-byte memoryview of ``obj`` (no copy)."""
    # numpy's stubs declare ndarray's buffer protocol for Python 3.12+ only
    return memoryview(obj).cast("B")  # type: ignore[arg-type]


def _raw_bytes(array: np.ndarray) -> memoryview:
    """The C-order bytes of a contiguous array as a flat memoryview (no copy)."""
    return _byte_view(array.reshape(-1).view(np.uint8))


def ndarray_map(array: np.ndarray) -> dict[str, Any]:
    """The contract's ndarray map; ``data`` is a memoryview of the array (no copy)."""
    array = _contiguous(array)
    return {
        NDARRAY_KEY: True,
        "data": _raw_bytes(array),
        "dtype": array.dtype.str,
        "shape": list(array.shape),
    }


def npgeneric_map(value: np.generic) -> dict[str, Any]:
    return {NPGENERIC_KEY: True, "data": value.tobytes(), "dtype": value.dtype.str}


def _default(obj: Any) -> Any:
    # strict_types=True sends subclasses here too, so numpy scalars that subclass float/str/int
    # (np.float64, np.str_) get the npgeneric map instead of silently becoming plain values.
    if isinstance(obj, np.ndarray):
        return ndarray_map(obj)
    if isinstance(obj, np.generic):
        return npgeneric_map(obj)
    if isinstance(obj, tuple):
        return list(obj)
    if isinstance(obj, Mapping):
        return dict(obj)
    if isinstance(obj, bool):
        return bool(obj)
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, bytes | bytearray | memoryview):
        return bytes(obj)
    raise TypeError(f"cannot encode {type(obj).__name__} as MessagePack")


def packb(obj: Any) -> bytes:
    """MessagePack of ``obj`` with ndarrays and numpy scalars in the contract convention."""
    packed: bytes = msgpack.packb(obj, default=_default, strict_types=True, use_bin_type=True)
    return packed


def _field(obj: dict[Any, Any], name: str) -> Any:
    if name in obj:
        return obj[name]
    return obj[name.encode()]


def _text(value: str | bytes) -> str:
    return value.decode("ascii") if isinstance(value, bytes) else value


def _object_hook(obj: dict[Any, Any]) -> Any:
    if obj.get(NDARRAY_KEY, obj.get(NDARRAY_KEY.encode())) is True:
        dtype = np.dtype(_text(_field(obj, "dtype")))
        shape = tuple(int(n) for n in _field(obj, "shape"))
        return np.frombuffer(_field(obj, "data"), dtype=dtype).reshape(shape)
    if obj.get(NPGENERIC_KEY, obj.get(NPGENERIC_KEY.encode())) is True:
        dtype = np.dtype(_text(_field(obj, "dtype")))
        return np.frombuffer(_field(obj, "data"), dtype=dtype)[0]
    return obj


def unpackb(data: Buffer) -> Any:
    """Decode MessagePack, turning ndarray / npgeneric maps back into numpy values.

    Arrays are read-only views of the decoded bin values.
    """
    return msgpack.unpackb(data, raw=False, object_hook=_object_hook, strict_map_key=False)


# ---- the image kernel: encode into a buffer, decode zero-copy ---------------------------------


def encode_ndarray_reference(array: np.ndarray) -> bytes:
    return packb(ndarray_map(array))


def encode_ndarray_into_reference(array: np.ndarray, out: Buffer, offset: int = 0) -> int:
    encoded = encode_ndarray_reference(array)
    view = _byte_view(out)
    if offset < 0 or offset + len(encoded) > len(view):
        raise ValueError(
            f"buffer of {len(view)} bytes cannot hold {len(encoded)} bytes at offset {offset}"
        )
    view[offset : offset + len(encoded)] = encoded
    return len(encoded)


def encoded_ndarray_size_reference(array: np.ndarray) -> int:
    return len(encode_ndarray_reference(array))


def decode_ndarray_reference(data: Buffer) -> np.ndarray:
    value = unpackb(data)
    if not isinstance(value, np.ndarray):
        raise ValueError(f"MessagePack payload is a {type(value).__name__}, not an ndarray map")
    return value


def encode_ndarray(array: np.ndarray) -> bytes:
    """The ndarray map as bytes (native: one allocation, one copy of the data)."""
    if _native is not None:
        return cast(bytes, _native.encode(array))
    return encode_ndarray_reference(array)


def encode_ndarray_into(array: np.ndarray, out: Buffer, offset: int = 0) -> int:
    """Write the ndarray map into ``out`` at ``offset`` and return its length in bytes."""
    if _native is not None:
        return cast(int, _native.encode_into(array, out, offset))
    return encode_ndarray_into_reference(array, out, offset)


def encoded_ndarray_size(array: np.ndarray) -> int:
    if _native is not None:
        return cast(int, _native.size(array))
    return encoded_ndarray_size_reference(array)


def decode_ndarray(data: Buffer) -> np.ndarray:
    """Decode one ndarray map; the strict four-key form becomes a zero-copy view of ``data``."""
    if _native is not None:
        view = _byte_view(data)
        parsed = _native.parse(view)
        if parsed is not None and parsed[4] == len(view):
            data_offset, data_len, dtype_str, shape, _ = parsed
            dtype = np.dtype(dtype_str)
            # A data length that is not whole items is left to the reference, which refuses it.
            if dtype.itemsize and data_len % dtype.itemsize == 0:
                count = data_len // dtype.itemsize
                array = np.frombuffer(data, dtype=dtype, count=count, offset=data_offset)
                return array.reshape(shape)
    return decode_ndarray_reference(data)
