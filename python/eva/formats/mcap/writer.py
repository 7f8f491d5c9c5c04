"""The MCAP file writer of the export: chunked messages, message and chunk indexes, a summary.

Each image message (record header + MessagePack ndarray map) is encoded by the native
``msgpack_image`` kernel straight from the decoded frame into a reused chunk buffer: one copy of
the pixels, GIL released, no per-frame allocation. A full chunk is CRC'd, optionally compressed
(zstd / lz4 frame, both release the GIL) and written with its message indexes by a helper thread
while the next chunk fills; the summary holds schemas, channels, statistics and chunk indexes, so
the official reader can filter by topic and time without scanning the file.

Defaults: ``compression = "none"``, ``chunk_size = 4 MiB``, chunk CRCs on.

- none: the images were already lossily compressed in the source MP4s, and decoded camera-like
  frames barely compress losslessly, while compression costs about a third of the export speed
  (bench/README.md, ``bench_mcap.py``). Choose ``zstd`` when storage matters more than time; level
  1 because it runs about 3x faster than level 3 for about a tenth more bytes on camera frames.
- 4 MiB chunks hold one or two frame indices of three 640x480 cameras, so reading one frame index
  touches one or two chunks, the per-chunk records (message index, chunk index) stay negligible,
  and the writer's memory is two chunk buffers.
- CRCs let a consumer (``make_reader(..., validate_crcs=True)``) detect a damaged transfer.
"""

from __future__ import annotations

import contextlib
import struct
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from eva.dataset.msgpack_codec import encode_ndarray_into, encoded_ndarray_size
from eva.formats.mcap.layout import LIBRARY, PROFILE

COMPRESSIONS = ("none", "zstd", "lz4")
DEFAULT_COMPRESSION = "none"
DEFAULT_CHUNK_SIZE = 4 * 1024 * 1024
ZSTD_LEVEL = 1  # about 3x level 3's speed on camera frames for about 10% more bytes

# --- MCAP records (https://mcap.dev/spec) -----------------------------------------------------

MAGIC = b"\x89MCAP0\r\n"
OP_HEADER = 0x01
OP_FOOTER = 0x02
OP_SCHEMA = 0x03
OP_CHANNEL = 0x04
OP_MESSAGE = 0x05
OP_CHUNK = 0x06
OP_MESSAGE_INDEX = 0x07
OP_CHUNK_INDEX = 0x08
OP_STATISTICS = 0x0B
OP_SUMMARY_OFFSET = 0x0E
OP_DATA_END = 0x0F

# opcode u8, record length u64, channel_id u16, sequence u32, log_time u64, publish_time u64
_MESSAGE_HEADER = struct.Struct("<BQHIQQ")
_MESSAGE_FIXED = _MESSAGE_HEADER.size - 9


def _string(value: str) -> bytes:
    raw = value.encode("utf-8")
    return struct.pack("<I", len(raw)) + raw


def _record(opcode: int, body: bytes) -> bytes:
    return struct.pack("<BQ", opcode, len(body)) + body


@dataclass
class _Channel:
    id: int
    schema_id: int
    topic: str
    message_count: int = 0


@dataclass
class _ChunkIndex:
    start_time: int
    end_time: int
    offset: int
    length: int
    message_index_offsets: dict[int, int]
    message_index_length: int
    compression: str
    compressed_size: int
    uncompressed_size: int


@dataclass
class _ChunkState:
    used: int = 0
    start_time: int = 0
    end_time: int = 0
    messages: int = 0
    # channel id -> flat [log_time, offset, log_time, offset, ...]
    index: dict[int, list[int]] = field(default_factory=dict)


class McapEpisodeWriter:
    """Write one MCAP file: header, schema, channels, chunked messages, summary, footer.

    Only what the eva layout needs: one schema, channels registered up front, messages appended
    in log-time order. One instance per file, used from one thread.

    With ``background=True`` (default) a full chunk is CRC'd, compressed and written by a helper
    thread while the caller fills the second of two chunk buffers: those steps release the GIL,
    so they overlap with the video decode on another core. ``finish()`` (or ``close()`` on
    error) joins the helper.
    """

    def __init__(
        self,
        stream: IO[bytes],
        *,
        compression: str = DEFAULT_COMPRESSION,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        crc: bool = True,
        background: bool = True,
    ) -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(f"mcap compression {compression!r}: choose one of {COMPRESSIONS}")
        if chunk_size < 1024:
            raise ValueError(f"mcap chunk size {chunk_size} is below 1024 bytes")
        self._stream = stream
        self._pos = 0
        self._compression = compression
        self._compressor = _make_compressor(compression)
        self._chunk_size = int(chunk_size)
        self._crc = crc
        # Two chunk buffers, reused for every chunk (the second is allocated when first needed);
        # a buffer only grows (once) for a message larger than the chunk size.
        self._bufs: list[bytearray | None] = [bytearray(self._chunk_size + 64 * 1024), None]
        self._buf_index = 0
        self._buf: bytearray = self._bufs[0]  # type: ignore[assignment]
        self._executor = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="eva-mcap-flush")
            if background
            else None
        )
        self._pending: Future[None] | None = None
        self._chunk = _ChunkState()
        self._schemas: list[bytes] = []
        self._channels: dict[int, _Channel] = {}
        self._channel_records: list[bytes] = []
        self._chunk_indexes: list[_ChunkIndex] = []
        self._message_count = 0
        self._start_time: int | None = None
        self._end_time = 0
        self._finished = False
        self._write(MAGIC)
        self._write(_record(OP_HEADER, _string(PROFILE) + _string(LIBRARY)))

    # -- plumbing ------------------------------------------------------------------------------

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        self._stream.write(data)
        self._pos += len(data)

    def register_schema(self, schema_id: int, name: str, encoding: str, data: bytes) -> None:
        body = (
            struct.pack("<H", schema_id)
            + _string(name)
            + _string(encoding)
            + struct.pack("<I", len(data))
            + data
        )
        record = _record(OP_SCHEMA, body)
        self._check_no_messages_yet("schema")
        self._schemas.append(record)
        self._write(record)

    def register_channel(
        self, channel_id: int, topic: str, message_encoding: str, schema_id: int = 0
    ) -> None:
        metadata = b""  # empty Map<string, string>
        body = (
            struct.pack("<HH", channel_id, schema_id)
            + _string(topic)
            + _string(message_encoding)
            + struct.pack("<I", len(metadata))
            + metadata
        )
        record = _record(OP_CHANNEL, body)
        self._check_no_messages_yet("channel")
        self._channels[channel_id] = _Channel(channel_id, schema_id, topic)
        self._channel_records.append(record)
        # Channels (and the schema) sit in the data section before the first chunk, where every
        # reader, streaming or seeking, sees them before any message.
        self._write(record)

    def _check_no_messages_yet(self, what: str) -> None:
        # Schemas and channels go straight to the stream, which the helper thread owns once
        # chunks are being flushed.
        if self._message_count:
            raise RuntimeError(f"register every {what} before the first message")

    def _reserve(self, size: int) -> int:
        """Make room for a ``size``-byte record in the chunk buffer; return its offset."""
        if self._chunk.used and self._chunk.used + size > self._chunk_size:
            self._flush_chunk()
        if size > len(self._buf) - self._chunk.used:
            self._buf = bytearray(max(size, self._chunk_size) + 64 * 1024)
            self._bufs[self._buf_index] = self._buf
        return self._chunk.used

    def _account(self, channel_id: int, log_time: int, offset: int, size: int) -> None:
        chunk = self._chunk
        if chunk.messages == 0:
            chunk.start_time = chunk.end_time = log_time
        else:
            chunk.start_time = min(chunk.start_time, log_time)
            chunk.end_time = max(chunk.end_time, log_time)
        chunk.messages += 1
        chunk.used = offset + size
        entries = chunk.index.get(channel_id)
        if entries is None:
            entries = chunk.index[channel_id] = []
        entries.append(log_time)
        entries.append(offset)
        self._channels[channel_id].message_count += 1
        self._message_count += 1
        if self._start_time is None or log_time < self._start_time:
            self._start_time = log_time
        self._end_time = max(self._end_time, log_time)
        if chunk.used >= self._chunk_size:
            self._flush_chunk()

    # -- messages ------------------------------------------------------------------------------

    def add_message(
        self, channel_id: int, sequence: int, log_time: int, publish_time: int, data: bytes
    ) -> None:
        size = _MESSAGE_HEADER.size + len(data)
        offset = self._reserve(size)
        _MESSAGE_HEADER.pack_into(
            self._buf,
            offset,
            OP_MESSAGE,
            _MESSAGE_FIXED + len(data),
            channel_id,
            sequence,
            log_time,
            publish_time,
        )
        start = offset + _MESSAGE_HEADER.size
        self._buf[start : start + len(data)] = data
        self._account(channel_id, log_time, offset, size)

    def add_ndarray_message(
        self,
        channel_id: int,
        sequence: int,
        log_time: int,
        publish_time: int,
        array: np.ndarray,
        encoded_size: int | None = None,
    ) -> None:
        """Append a message whose payload is ``array``'s ndarray map, encoded in place.

        ``encoded_size`` (``encoded_ndarray_size(array)``) may be passed when the caller knows it,
        e.g. for every frame of one camera.
        """
        if encoded_size is None:
            encoded_size = encoded_ndarray_size(array)
        size = _MESSAGE_HEADER.size + encoded_size
        offset = self._reserve(size)
        _MESSAGE_HEADER.pack_into(
            self._buf,
            offset,
            OP_MESSAGE,
            _MESSAGE_FIXED + encoded_size,
            channel_id,
            sequence,
            log_time,
            publish_time,
        )
        written = encode_ndarray_into(array, self._buf, offset + _MESSAGE_HEADER.size)
        if written != encoded_size:
            raise ValueError(f"ndarray map is {written} bytes, expected {encoded_size}")
        self._account(channel_id, log_time, offset, size)

    def _wait_pending(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()  # re-raises a failed write here, in the caller's thread

    def _flush_chunk(self) -> None:
        chunk = self._chunk
        if chunk.messages == 0:
            return
        # The other buffer is free once its flush (the only one in flight) has finished.
        self._wait_pending()
        self._chunk = _ChunkState()
        if self._executor is None:
            self._write_chunk(self._buf, chunk)
            return
        self._pending = self._executor.submit(self._write_chunk, self._buf, chunk)
        self._buf_index ^= 1
        other = self._bufs[self._buf_index]
        if other is None:
            other = self._bufs[self._buf_index] = bytearray(len(self._buf))
        self._buf = other

    def _write_chunk(self, buf: bytearray, chunk: _ChunkState) -> None:
        records = memoryview(buf)[: chunk.used]
        crc = zlib.crc32(records) if self._crc else 0
        if self._compressor is None:
            data: bytes | memoryview = records
            compression = ""
        else:
            data = self._compressor(records)
            compression = self._compression
        compression_field = _string(compression)
        body_head = (
            struct.pack("<QQQI", chunk.start_time, chunk.end_time, chunk.used, crc)
            + compression_field
            + struct.pack("<Q", len(data))
        )
        chunk_offset = self._pos
        self._write(struct.pack("<BQ", OP_CHUNK, len(body_head) + len(data)) + body_head)
        self._write(data)
        chunk_length = self._pos - chunk_offset
        compressed_size = len(data)
        records.release()

        index_offsets: dict[int, int] = {}
        index_start = self._pos
        for channel_id in sorted(chunk.index):
            flat = np.asarray(chunk.index[channel_id], dtype="<u8")
            entries = flat.tobytes()
            index_offsets[channel_id] = self._pos
            self._write(
                _record(
                    OP_MESSAGE_INDEX,
                    struct.pack("<HI", channel_id, len(entries)) + entries,
                )
            )
        self._chunk_indexes.append(
            _ChunkIndex(
                start_time=chunk.start_time,
                end_time=chunk.end_time,
                offset=chunk_offset,
                length=chunk_length,
                message_index_offsets=index_offsets,
                message_index_length=self._pos - index_start,
                compression=compression,
                compressed_size=compressed_size,
                uncompressed_size=chunk.used,
            )
        )

    # -- summary -------------------------------------------------------------------------------

    def finish(self) -> None:
        """Flush the last chunk and write DataEnd, the summary and the footer."""
        if self._finished:
            return
        self._flush_chunk()
        self._wait_pending()
        self.close()
        self._write(_record(OP_DATA_END, struct.pack("<I", 0)))
        summary_start = self._pos
        groups: list[tuple[int, bytes]] = []
        groups.append((OP_SCHEMA, b"".join(self._schemas)))
        groups.append((OP_CHANNEL, b"".join(self._channel_records)))
        counts = b"".join(
            struct.pack("<HQ", ch.id, ch.message_count) for ch in self._channels.values()
        )
        statistics = _record(
            OP_STATISTICS,
            struct.pack(
                "<QHIIIIQQ",
                self._message_count,
                len(self._schemas),
                len(self._channels),
                0,  # attachments
                0,  # metadata
                len(self._chunk_indexes),
                self._start_time or 0,
                self._end_time,
            )
            + struct.pack("<I", len(counts))
            + counts,
        )
        groups.append((OP_STATISTICS, statistics))
        chunk_index_records = []
        for ci in self._chunk_indexes:
            offsets = b"".join(
                struct.pack("<HQ", ch, off) for ch, off in ci.message_index_offsets.items()
            )
            chunk_index_records.append(
                _record(
                    OP_CHUNK_INDEX,
                    struct.pack("<QQQQ", ci.start_time, ci.end_time, ci.offset, ci.length)
                    + struct.pack("<I", len(offsets))
                    + offsets
                    + struct.pack("<Q", ci.message_index_length)
                    + _string(ci.compression)
                    + struct.pack("<QQ", ci.compressed_size, ci.uncompressed_size),
                )
            )
        groups.append((OP_CHUNK_INDEX, b"".join(chunk_index_records)))

        summary = bytearray()
        offsets_records = bytearray()
        for opcode, group in groups:
            if not group:
                continue
            offsets_records += _record(
                OP_SUMMARY_OFFSET,
                struct.pack("<BQQ", opcode, summary_start + len(summary), len(group)),
            )
            summary += group
        summary_offset_start = summary_start + len(summary)
        summary += offsets_records
        footer_head = struct.pack("<BQQQ", OP_FOOTER, 20, summary_start, summary_offset_start)
        summary_crc = zlib.crc32(footer_head, zlib.crc32(summary))
        self._write(summary)
        self._write(footer_head + struct.pack("<I", summary_crc))
        self._write(MAGIC)
        self._finished = True

    def close(self) -> None:
        """Stop the helper thread (after its current write); the file is complete only after
        ``finish()``."""
        if self._executor is not None:
            pending, self._pending = self._pending, None
            if pending is not None:
                with contextlib.suppress(BaseException):
                    pending.result()
            self._executor.shutdown(wait=True)
            self._executor = None


def _make_compressor(compression: str) -> Any:
    if compression == "none":
        return None
    if compression == "zstd":
        import zstandard

        return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress
    import lz4.frame

    return lz4.frame.compress
