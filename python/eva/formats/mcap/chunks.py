"""A full chunk of ``eva.formats.mcap.writer`` as it goes to the file: its messages' index, the
chunk record (CRC'd, optionally compressed), its message index records and its chunk index.

Run by the writer's helper thread while the next chunk fills: the CRC and the compressors
(zstd, lz4 frame) release the GIL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from eva.formats.mcap import spec
from eva.formats.mcap.records import Bytes, StreamRecords, crc32

ZSTD_LEVEL = 1  # about 3x level 3's speed on camera frames for about 10% more bytes

Compressor = Callable[[Bytes], bytes]


@dataclass
class ChunkState:
    """The messages of the chunk being filled: their count, time range and index."""

    used: int = 0
    start_time: int = 0
    end_time: int = 0
    messages: int = 0
    # channel id -> [(log_time, offset in the chunk), ...]
    index: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    # the same for messages added in batches: (channel ids, log times, offsets) arrays
    batches: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)

    def index_entries(self) -> Iterator[tuple[int, np.ndarray]]:
        """(channel id, its (log_time, offset) pairs in write order) by channel id."""
        singles = [(c, t, o) for c, pairs in self.index.items() for t, o in pairs]
        parts = [np.array(singles, np.int64).reshape(-1, 3)]
        parts += [np.stack([c, t, o], axis=1) for c, t, o in self.batches]
        entries = np.concatenate(parts)
        # by channel, then offset (the order of writing)
        entries = entries[np.lexsort((entries[:, 2], entries[:, 0]))]
        channels, firsts = np.unique(entries[:, 0], return_index=True)
        yield from zip(channels.tolist(), np.split(entries[:, 1:], firsts[1:]), strict=True)


def index_length(chunk: ChunkState) -> int:
    """The bytes of ``chunk``'s MessageIndex records: one per channel (opcode, length, channel
    id, array length: 15 bytes) plus 16 per message."""
    channels = set(chunk.index)
    for channel_ids, _, _ in chunk.batches:
        channels.update(np.unique(channel_ids).tolist())
    return 15 * len(channels) + 16 * chunk.messages


def make_compressor(compression: str) -> Compressor | None:
    """The chunk compressor of ``compression`` ("none": None)."""
    if compression == "none":
        return None
    if compression == "zstd":
        import zstandard

        compress: Compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress
        return compress
    import lz4.frame

    compress = lz4.frame.compress
    return compress


def add_chunk(
    out: StreamRecords,
    records: memoryview,
    chunk: ChunkState,
    offset: int,
    *,
    crc: bool,
    compressor: Compressor | None,
    compression: str,
) -> bytes:
    """Add the chunk record of ``records`` (``chunk``'s messages), then its message index
    records, to ``out`` (empty; they start at file offset ``offset``); return its chunk index
    record. ``records`` goes in by reference when not compressed: write ``out`` before
    releasing it."""
    checksum = crc32(records) if crc else 0
    data: Bytes = records if compressor is None else compressor(records)
    name = compression if compressor is not None else ""
    out.add(
        spec.chunk_head(chunk.start_time, chunk.end_time, chunk.used, checksum, name, len(data))
    )
    out.add(data)
    chunk_length = out.count
    index_offsets: list[tuple[int, int]] = []
    for channel_id, pairs in chunk.index_entries():
        index_offsets.append((channel_id, offset + out.count))
        out.add(spec.message_index(channel_id, pairs))
    return spec.chunk_index(
        start_time=chunk.start_time,
        end_time=chunk.end_time,
        chunk_offset=offset,
        chunk_length=chunk_length,
        message_index_offsets=index_offsets,
        message_index_length=out.count - chunk_length,
        compression=name,
        compressed_size=len(data),
        uncompressed_size=chunk.used,
    )
