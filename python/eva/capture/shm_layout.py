"""The byte layout of a shared-memory ring file (``capture/shm_ring.py``), and its validation.

The header fields and their offsets mirror ``native/shm_ring.hpp`` (the native module exports the
same numbers as ``eva_fast.shm_ring.LAYOUT``, which the tests compare with :data:`LAYOUT`).
:class:`ShmLayout` is the geometry of one ring (slots, strides, offsets, file size) and the
header its creator writes; :func:`parse_header` checks a header an attaching producer reads,
with a ``ValueError`` naming the path and the field.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

MAGIC = b"EVASHMR1"
VERSION = 1
ALIGN = 64
HEADER_BYTES = 320
MAX_DIMS = 8
DTYPE_BYTES = 16
# identity line (written once by the creator; the magic last)
OFF_MAGIC = 0
OFF_VERSION = 8  # u32
OFF_HEADER_BYTES = 12  # u32
OFF_ITEM_BYTES = 16
OFF_SLOTS = 24
OFF_SLOT_STRIDE = 32
OFF_TIMES_OFFSET = 40
OFF_DATA_OFFSET = 48
OFF_FILE_BYTES = 56
# descriptor
OFF_NDIM = 64  # u32
OFF_CONSUMER_PID = 72
OFF_DTYPE = 80  # char[16]
OFF_SHAPE = 96  # u64[8]
# producer line
OFF_HEAD = 192
OFF_OVERFLOW = 200
OFF_HEARTBEAT = 208
OFF_PRODUCER_PID = 216
OFF_HIGH_WATER = 224
# consumer line
OFF_TAIL = 256
OFF_STOP = 264

# Every constant above, by the names of the native module's LAYOUT (the tests compare them).
LAYOUT = {
    "magic": MAGIC,
    "version": VERSION,
    "align": ALIGN,
    "header_bytes": HEADER_BYTES,
    "max_dims": MAX_DIMS,
    "dtype_bytes": DTYPE_BYTES,
    "magic_offset": OFF_MAGIC,
    "version_offset": OFF_VERSION,
    "header_bytes_offset": OFF_HEADER_BYTES,
    "item_bytes_offset": OFF_ITEM_BYTES,
    "slots_offset": OFF_SLOTS,
    "slot_stride_offset": OFF_SLOT_STRIDE,
    "times_offset_offset": OFF_TIMES_OFFSET,
    "data_offset_offset": OFF_DATA_OFFSET,
    "file_bytes_offset": OFF_FILE_BYTES,
    "ndim_offset": OFF_NDIM,
    "consumer_pid_offset": OFF_CONSUMER_PID,
    "dtype_offset": OFF_DTYPE,
    "shape_offset": OFF_SHAPE,
    "head_offset": OFF_HEAD,
    "overflow_offset": OFF_OVERFLOW,
    "heartbeat_offset": OFF_HEARTBEAT,
    "producer_pid_offset": OFF_PRODUCER_PID,
    "high_water_offset": OFF_HIGH_WATER,
    "tail_offset": OFF_TAIL,
    "stop_offset": OFF_STOP,
}


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def check_dtype(dtype: npt.DTypeLike) -> np.dtype:
    """The sample dtype, if a ring can carry it: plain numeric/bool, native byte order."""
    dt = np.dtype(dtype)
    if dt.kind not in "biufc" or dt.fields is not None or dt.subdtype is not None:
        raise ValueError(f"a shm ring carries plain numeric samples, not dtype {dt.str!r}")
    if not dt.isnative:
        raise ValueError(f"a shm ring carries native byte order samples, not dtype {dt.str!r}")
    if len(dt.str.encode("ascii")) > DTYPE_BYTES:
        raise ValueError(f"dtype {dt.str!r} does not fit the shm ring header")
    return dt


@dataclass(frozen=True)
class ShmLayout:
    """Geometry of one ring file (see native/shm_ring.hpp)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    slots: int
    item_bytes: int
    slot_stride: int
    times_offset: int
    data_offset: int
    file_bytes: int

    @classmethod
    def compute(cls, shape: tuple[int, ...], dtype: npt.DTypeLike, slots: int) -> ShmLayout:
        shape = tuple(int(s) for s in shape)
        dt = check_dtype(dtype)
        if len(shape) > MAX_DIMS:
            raise ValueError(f"shm ring sample shape {shape} has more than {MAX_DIMS} dims")
        if any(s <= 0 for s in shape):
            raise ValueError(f"shm ring sample shape {shape} holds no bytes")
        if int(slots) != slots or slots <= 0:
            raise ValueError(f"shm ring slots must be a positive integer, not {slots!r}")
        slots = int(slots)
        item = math.prod(shape) * dt.itemsize
        stride = _align(item)
        times = HEADER_BYTES
        data = _align(times + 8 * slots)
        return cls(shape, dt, slots, item, stride, times, data, data + slots * stride)

    def header(self, consumer_pid: int) -> bytes:
        """The HEADER_BYTES the creator writes (counters zero)."""
        buf = bytearray(HEADER_BYTES)
        buf[OFF_MAGIC : OFF_MAGIC + 8] = MAGIC
        struct.pack_into("<II", buf, OFF_VERSION, VERSION, HEADER_BYTES)
        struct.pack_into(
            "<6Q",
            buf,
            OFF_ITEM_BYTES,
            self.item_bytes,
            self.slots,
            self.slot_stride,
            self.times_offset,
            self.data_offset,
            self.file_bytes,
        )
        struct.pack_into("<I", buf, OFF_NDIM, len(self.shape))
        struct.pack_into("<Q", buf, OFF_CONSUMER_PID, consumer_pid)
        buf[OFF_DTYPE : OFF_DTYPE + DTYPE_BYTES] = self.dtype.str.encode("ascii").ljust(
            DTYPE_BYTES, b"\0"
        )
        struct.pack_into(
            f"<{MAX_DIMS}Q", buf, OFF_SHAPE, *self.shape, *[0] * (MAX_DIMS - len(self.shape))
        )
        return bytes(buf)


def parse_header(path: str, raw: bytes, file_size: int) -> ShmLayout:
    """Validate a ring file's header; ValueError naming ``path`` and the field."""

    def bad(field: str, message: str) -> ValueError:
        return ValueError(f"{path}: bad shm ring header: {field} {message}")

    if file_size < HEADER_BYTES or len(raw) < HEADER_BYTES:
        raise ValueError(
            f"{path}: truncated shm ring file: {min(file_size, len(raw))} bytes, the header alone needs "
            f"{HEADER_BYTES}"
        )
    magic = raw[OFF_MAGIC : OFF_MAGIC + 8]
    if magic != MAGIC:
        raise bad(
            "magic", f"is {magic!r}, expected {MAGIC!r} (not a shm ring, or still being created)"
        )
    version, header_bytes = struct.unpack_from("<II", raw, OFF_VERSION)
    if version != VERSION:
        raise bad("version", f"is {version}, this eva reads version {VERSION}")
    if header_bytes != HEADER_BYTES:
        raise bad("header_bytes", f"is {header_bytes}, expected {HEADER_BYTES}")
    (ndim,) = struct.unpack_from("<I", raw, OFF_NDIM)
    if ndim > MAX_DIMS:
        raise bad("ndim", f"is {ndim}, at most {MAX_DIMS}")
    dims = struct.unpack_from(f"<{MAX_DIMS}Q", raw, OFF_SHAPE)
    shape = tuple(int(d) for d in dims[:ndim])
    if any(d == 0 for d in shape) or any(dims[ndim:]):
        raise bad("shape", f"is {dims} with ndim {ndim}")
    dtype_raw = raw[OFF_DTYPE : OFF_DTYPE + DTYPE_BYTES].rstrip(b"\0")
    try:
        dtype = check_dtype(np.dtype(dtype_raw.decode("ascii")))
    except (TypeError, ValueError, UnicodeDecodeError) as error:
        raise bad("dtype", f"is {dtype_raw!r}: {error}") from None
    (slots,) = struct.unpack_from("<Q", raw, OFF_SLOTS)
    if slots == 0:
        raise bad("slots", "is 0")
    expected = ShmLayout.compute(shape, dtype, slots)
    fields = struct.unpack_from("<6Q", raw, OFF_ITEM_BYTES)
    for name, got in zip(
        ("item_bytes", "slots", "slot_stride", "times_offset", "data_offset", "file_bytes"),
        fields,
        strict=True,
    ):
        want = getattr(expected, name)
        if got != want:
            raise bad(
                name,
                f"is {got}, expected {want} for shape {shape}, dtype {dtype.str!r} and "
                f"{slots} slots",
            )
    if file_size < expected.file_bytes:
        raise ValueError(
            f"{path}: truncated shm ring file: {file_size} bytes, the header says "
            f"{expected.file_bytes}"
        )
    return expected
