"""Where eva's MCAP records go: a chunk buffer and a stream sink.

The records' bytes are ``eva.formats.mcap.spec``'s; the two sinks here only decide where they
go, so that no payload is copied more often than the file needs:

- ``ChunkBuffer`` frames messages into a reused bytearray (the chunk being filled). A payload
  already at its place in that buffer (a frame encoded there by the native kernel) is not copied
  again: ``add_in_place`` writes only the record's head before it.
- ``StreamRecords`` collects records for a stream and keeps large payloads (a chunk's data) by
  reference, so a chunk reaches the file without passing through a ``BytesIO``.

Many messages are framed at once by a *record fill* (``RecordFill``): a callable that writes
message records straight into the chunk buffer while the chunk takes them
(``McapEpisodeWriter.add_records``). ``PayloadFill`` is the numpy one, over given payload parts;
the foxglove profile's frames have a native one (``eva.formats.mcap.frame_records``).

``crc32`` is zlib's, by the native ``mcap_chunk`` kernel's carry-less multiply folding where the
CPU has it (about twice zlib's speed on a chunk; bench/README.md, ``bench_foxglove.py``).
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from eva._native import load
from eva.formats.mcap.spec import MESSAGE_HEADER, MESSAGE_OVERHEAD, Opcode, pack_message_head
from eva.formats.mcap.wire import Ragged, spans

_native = load("mcap_chunk")
# On a CPU without the folding instructions the kernel's table walk is slower than zlib's.
_native_crc = _native is not None and _native.crc32_folds()

# Payloads from this size on are kept by reference by StreamRecords (below it a copy is cheaper
# than one more write call).
LARGE_PAYLOAD = 64 * 1024

Bytes = bytes | bytearray | memoryview


def crc32(data: Bytes, value: int = 0) -> int:
    """``zlib.crc32(data, value)`` (the reference), natively where that is faster."""
    if _native_crc:
        assert _native is not None
        return int(_native.crc32(data, value))
    return zlib.crc32(data, value)


class BinaryOutput(Protocol):
    """Where an MCAP file's bytes go: an open binary file, ``io.BytesIO``, or eva's
    ``formats._direct_io.SequentialWriter``."""

    def write(self, data: bytes | bytearray | memoryview, /) -> int: ...


class RecordFill(Protocol):
    """Writes message records ``first``, ``first + 1``, ... of a batch into ``buffer`` at
    ``used`` while the chunk takes them (a record goes in when the chunk is empty and the buffer
    holds it, or when ``used`` + its size <= ``chunk_size``; none after the one that brings
    ``used`` to ``chunk_size``), each record's offset into ``offsets[m]``. Returns (the first
    message not written, ``used`` after them, the size of the record that did not fit or 0)."""

    def __call__(
        self,
        buffer: bytearray | memoryview,
        used: int,
        chunk_size: int,
        first: int,
        offsets: np.ndarray,
        /,
    ) -> tuple[int, int, int]: ...


class PayloadFill:
    """A ``RecordFill`` of messages (publish time = log time) whose payload *i* is row *i* of
    ``heads``, ``datas[i]`` and row *i* of ``tails``, framed with numpy for as many records as
    the chunk takes at once; each data is copied once, straight into the chunk buffer."""

    def __init__(
        self,
        channel_ids: np.ndarray,
        sequences: np.ndarray,
        log_times: np.ndarray,
        heads: Ragged,
        datas: Sequence[Bytes],
        tails: Ragged,
    ) -> None:
        self.channel_ids, self.sequences, self.log_times = channel_ids, sequences, log_times
        self.heads, self.datas, self.tails = heads, datas, tails
        self.data_sizes = np.fromiter(map(len, datas), np.int64, len(datas))
        self.records = MESSAGE_OVERHEAD + heads.lengths + self.data_sizes + tails.lengths
        self.head_starts, self.tail_starts = heads.starts, tails.starts

    def __call__(
        self,
        buffer: bytearray | memoryview,
        used: int,
        chunk_size: int,
        first: int,
        offsets: np.ndarray,
    ) -> tuple[int, int, int]:
        count = len(self.records)
        if first >= count:
            return first, used, 0
        reach = used + np.cumsum(self.records[first:])
        fit = int(np.searchsorted(reach, chunk_size, side="right"))
        if fit == 0 and (used or int(reach[0]) > len(buffer)):
            return first, used, int(self.records[first])
        last = first + max(fit, 1)  # a record larger than a chunk goes alone
        sizes = self.records[first:last]
        at = np.concatenate([[used], used + np.cumsum(sizes[:-1])])
        header = np.zeros(last - first, MESSAGE_HEADER)
        header["opcode"] = Opcode.MESSAGE
        header["length"] = sizes - 9  # the record's bytes after its opcode and length
        header["channel"] = self.channel_ids[first:last]
        header["sequence"] = self.sequences[first:last]
        header["log_time"] = header["publish_time"] = self.log_times[first:last]
        buf = np.frombuffer(buffer, np.uint8)
        buf[spans(at, np.full(last - first, MESSAGE_OVERHEAD))] = header.view(np.uint8)
        head_at = at + MESSAGE_OVERHEAD
        _scatter(buf, head_at, self.heads, self.head_starts, first, last)
        data_at = head_at + self.heads.lengths[first:last]
        data_sizes = self.data_sizes
        for i in np.flatnonzero(data_sizes[first:last]).tolist():
            start = int(data_at[i])
            buffer[start : start + int(data_sizes[first + i])] = self.datas[first + i]
        _scatter(buf, data_at + data_sizes[first:last], self.tails, self.tail_starts, first, last)
        del buf
        offsets[first:last] = at
        used = int(at[-1] + sizes[-1])
        needed = int(self.records[last]) if last < count and used < chunk_size else 0
        return last, used, needed


def _scatter(
    buf: np.ndarray, at: np.ndarray, rows: Ragged, starts: np.ndarray, first: int, last: int
) -> None:
    """Rows ``first`` to ``last - 1`` of ``rows`` (row starts ``starts``) into ``buf`` at ``at``."""
    lengths = rows.lengths[first:last]
    begin = int(starts[first])
    end = int(starts[last - 1] + lengths[-1])
    if end > begin:
        buf[spans(at, lengths)] = rows.flat[begin:end]


class ChunkBuffer:
    """Message records framed into a preallocated bytearray; ``used`` is the bytes used so far.

    The buffer never grows: the caller checks ``room`` first and swaps in a larger buffer (``reset``)
    for a record that does not fit.
    """

    def __init__(self, buffer: bytearray | memoryview) -> None:
        # A memoryview: a part of a larger buffer (the MCAP writer places chunks so).
        self.buffer = buffer
        self.used = 0

    @property
    def room(self) -> int:
        return len(self.buffer) - self.used

    def reset(self, buffer: bytearray | memoryview | None = None) -> None:
        """Start a new chunk (in ``buffer`` when given)."""
        if buffer is not None:
            self.buffer = buffer
        self.used = 0

    def add_message(
        self, channel_id: int, sequence: int, log_time: int, publish_time: int, data: Bytes
    ) -> None:
        """A message record with a copy of ``data``."""
        size = len(data)
        start = self.used + MESSAGE_OVERHEAD
        pack_message_head(
            self.buffer, self.used, channel_id, sequence, log_time, publish_time, size
        )
        self.buffer[start : start + size] = data
        self.used = start + size

    def add_in_place(
        self, channel_id: int, sequence: int, log_time: int, publish_time: int, size: int
    ) -> None:
        """A message record whose ``size``-byte payload the caller already put at its place,
        ``MESSAGE_OVERHEAD`` bytes past ``used``."""
        pack_message_head(
            self.buffer, self.used, channel_id, sequence, log_time, publish_time, size
        )
        self.used += MESSAGE_OVERHEAD + size


class StreamRecords:
    """Records bound for a stream, written by ``write_to``, large payloads uncopied."""

    def __init__(self) -> None:
        self._parts: list[Bytes] = [bytearray()]
        self._count = 0

    @property
    def count(self) -> int:
        return self._count

    def add(self, data: Bytes) -> None:
        """Bytes of a record (or of its part), appended; large ones kept by reference."""
        size = len(data)
        if size >= LARGE_PAYLOAD:
            self._parts.append(data)
            self._parts.append(bytearray())
        else:
            head = self._parts[-1]
            assert isinstance(head, bytearray)
            head += data
        self._count += size

    def write_to(self, stream: BinaryOutput) -> int:
        """Write every record collected so far to ``stream``; return the byte count."""
        for part in self._parts:
            if part:
                stream.write(part)
        written = self._count
        self._parts = [bytearray()]
        self._count = 0
        return written

    def end(self) -> bytes:
        data = b"".join(self._parts)
        self._parts = [bytearray()]
        self._count = 0
        return data


class SpareBuffers:
    """Chunk buffers of finished files, kept for the next file of the same chunk size.

    A new bytearray costs a page fault per 4 KiB page on its first fill (about a third of a
    millisecond per MiB here, as much as copying the frames into it); an export writes one file
    after another, so the second file on reuses the first one's pages. At most ``keep`` buffers
    are kept (the two of one writer; the read windows of a file's cameras).
    """

    def __init__(self, keep: int = 2) -> None:
        self._keep = keep
        self._spare: list[bytearray] = []
        self._lock = threading.Lock()

    def take(self, size: int, at_least: bool = False) -> bytearray:
        """A buffer of ``size`` bytes, or of ``size`` or more when ``at_least`` (not zeroed
        when it is a spare one)."""
        with self._lock:
            for i, buffer in enumerate(self._spare):
                if len(buffer) == size or (at_least and len(buffer) > size):
                    return self._spare.pop(i)
        return bytearray(size)

    def give_back(self, buffers: list[bytearray]) -> None:
        with self._lock:
            self._spare = (buffers + self._spare)[: self._keep]


spare_buffers = SpareBuffers()
