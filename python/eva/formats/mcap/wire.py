"""Byte strings of many messages at once, with numpy: ragged rows and protobuf varints.

The foxglove profile writes several small messages per frame (a ``CompressedVideo`` header per
camera, a JSON object per vector column). Built one at a time in Python these cost tens of
microseconds each, more than copying the frame itself; built for a whole batch of frames with a
few numpy operations they cost a fraction of a microsecond. ``Ragged`` holds such a batch: every
row's bytes back to back in one uint8 array, with each row's length.

The protobuf wire format (https://protobuf.dev/programming-guides/encoding/) needs only varints
here: a field is its tag (``number << 3 | wire type`` as a varint), then a varint value, or a
varint length and that many bytes. ``eva.formats.mcap.foxglove`` builds its messages from these;
its tests compare them with the ``protobuf`` package's own serializer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# A varint carries 7 bits per byte: a uint64 needs at most 10.
MAX_VARINT = 10
# The smallest value of each varint length after the first: 2**7, 2**14, ..., 2**63.
_VARINT_LIMITS = np.array([1 << (7 * k) for k in range(1, MAX_VARINT)], np.uint64)
_VARINT_SHIFTS = np.arange(MAX_VARINT, dtype=np.uint64) * np.uint64(7)
_VARINT_COLUMNS = np.arange(MAX_VARINT)


@dataclass(frozen=True)
class Ragged:
    """Rows of bytes: row *i* is ``flat[starts[i] : starts[i] + lengths[i]]``."""

    flat: np.ndarray  # uint8, every row back to back
    lengths: np.ndarray  # int64, one per row

    @property
    def starts(self) -> np.ndarray:
        starts = np.zeros(len(self.lengths), np.int64)
        np.cumsum(self.lengths[:-1], out=starts[1:])
        return starts

    def __len__(self) -> int:
        return len(self.lengths)

    def row(self, i: int) -> bytes:
        start = int(self.lengths[:i].sum())
        return self.flat[start : start + int(self.lengths[i])].tobytes()

    def rows(self, first: int, last: int) -> Ragged:
        """Rows ``first`` to ``last - 1``."""
        begin = int(self.lengths[:first].sum())
        lengths = self.lengths[first:last]
        return Ragged(self.flat[begin : begin + int(lengths.sum())], lengths)

    def to_list(self) -> list[bytes]:
        """Every row as a byte string."""
        data = self.flat.tobytes()
        ends = np.cumsum(self.lengths).tolist()
        return [data[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]

    @staticmethod
    def empty(rows: int) -> Ragged:
        """``rows`` empty rows."""
        return Ragged(np.zeros(0, np.uint8), np.zeros(rows, np.int64))

    @staticmethod
    def of(rows: Sequence[bytes]) -> Ragged:
        """The rows given as byte strings."""
        flat = np.frombuffer(b"".join(rows), np.uint8)
        return Ragged(flat, np.fromiter(map(len, rows), np.int64, len(rows)))

    @staticmethod
    def constant(data: bytes, rows: int) -> Ragged:
        """``rows`` rows of the same bytes."""
        flat = np.tile(np.frombuffer(data, np.uint8), rows)
        return Ragged(flat, np.full(rows, len(data), np.int64))


@dataclass(frozen=True)
class Padded:
    """Rows of at most ``matrix.shape[1]`` bytes each: row *i* is ``matrix[i, :lengths[i]]``."""

    matrix: np.ndarray  # (rows, width) uint8
    lengths: np.ndarray  # int64 per row, each <= width

    @staticmethod
    def constant(data: bytes, rows: int, present: np.ndarray | None = None) -> Padded:
        """``data`` in every row (only where ``present``, when given; else empty)."""
        matrix = np.broadcast_to(np.frombuffer(data, np.uint8), (rows, len(data)))
        lengths = np.full(rows, len(data), np.int64)
        if present is not None:
            lengths = np.where(present, lengths, 0)
        return Padded(matrix, lengths)


def varints(values: np.ndarray) -> Padded:
    """Each value as a protobuf varint (int64 values as their two's complement, 10 bytes when
    negative, as protobuf encodes int64)."""
    unsigned = np.asarray(values).astype(np.int64).view(np.uint64)
    lengths = np.searchsorted(_VARINT_LIMITS, unsigned, side="right") + 1
    width = int(lengths.max()) if len(lengths) else 1
    groups = (unsigned[:, None] >> _VARINT_SHIFTS[:width]) & np.uint64(0x7F)
    continued = _VARINT_COLUMNS[:width] < (lengths - 1)[:, None]
    matrix = groups.astype(np.uint8) | (continued.view(np.uint8) << 7)
    return Padded(matrix, lengths)


def tag(number: int, wire_type: int) -> bytes:
    """A field's key: its number and wire type as a varint (fields 1-15 take one byte)."""
    key = number << 3 | wire_type
    out = bytearray()
    while key > 0x7F:
        out.append(key & 0x7F | 0x80)
        key >>= 7
    out.append(key)
    return bytes(out)


def concat(pieces: Sequence[Padded]) -> Ragged:
    """Row *i* of every piece, in order, as one ragged row *i*."""
    matrix = np.hstack([piece.matrix for piece in pieces])
    present = np.hstack(
        [np.arange(p.matrix.shape[1]) < p.lengths[:, None] for p in pieces]
    )  # row-major boolean selection keeps each row's bytes in order
    lengths = np.stack([p.lengths for p in pieces]).sum(axis=0, dtype=np.int64)
    return Ragged(matrix[present], lengths)


def interleave(columns: Sequence[Ragged]) -> Ragged:
    """Rows taken in turn from each column (all of the same length): column 0's row 0, column
    1's row 0, ..., column 0's row 1, ..."""
    flat = np.concatenate([c.flat for c in columns])
    bases = np.cumsum([0] + [len(c.flat) for c in columns[:-1]])
    starts = np.stack([c.starts + base for c, base in zip(columns, bases, strict=True)], axis=1)
    lengths = np.stack([c.lengths for c in columns], axis=1).ravel()
    return Ragged(gather(flat, starts.ravel(), lengths), lengths)


def gather(flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``flat[starts[i] : starts[i] + lengths[i]]`` for every *i*, back to back."""
    picked: np.ndarray = flat[spans(starts, lengths)]
    return picked


def spans(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Every index of the ranges ``[starts[i], starts[i] + lengths[i])``, in order."""
    nonempty = lengths > 0
    starts = np.asarray(starts, np.int64)[nonempty]
    lengths = np.asarray(lengths, np.int64)[nonempty]
    if not len(lengths):
        return np.zeros(0, np.int64)
    # Steps of 1 within a range and a jump to the next range's start at its first index:
    # a cumulative sum (faster than np.repeat of the offsets for many short ranges).
    steps = np.ones(int(lengths.sum()), np.int64)
    steps[0] = starts[0]
    firsts = np.cumsum(lengths[:-1])
    steps[firsts] = starts[1:] - (starts[:-1] + lengths[:-1] - 1)
    return np.cumsum(steps)
