"""The MCAP file writer of the export: chunked messages, message and chunk indexes, a summary.

Every record is serialized by ``eva.formats.mcap.spec`` (the MCAP specification's layout;
``eva.formats.mcap.records`` chooses where the bytes go, ``eva.formats.mcap.chunks`` turns a full
chunk into its records). ``mcap.writer.Writer`` is not used: it copies each payload into a
``BytesIO`` twice over (slow to grow to 4 MiB chunks), compresses zstd at level 3 only, and
compresses and writes a chunk in the caller's thread (bench/README.md, ``bench_mcap.py``, has the
measured cost).

Each image message (record header + MessagePack ndarray map) is encoded by the native
``msgpack_image`` kernel straight from the decoded frame into a reused chunk buffer: one copy of
the pixels, GIL released, no per-frame allocation. A full chunk is CRC'd, optionally compressed
(zstd / lz4 frame, both release the GIL) and written with its message indexes by a helper thread
while the next chunk fills; the summary holds schemas, channels, statistics and chunk indexes, so
the official reader can filter by topic and time without scanning the file.

Defaults (``McapOptions``, ``eva.formats.options``): ``compression = "none"``,
``chunk_size = 4 MiB``; chunk CRCs on.

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
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from eva.dataset.errors import naming_write_errors
from eva.dataset.msgpack_codec import encode_ndarray_into, encoded_ndarray_size
from eva.formats._direct_io import ALIGN, SequentialWriter
from eva.formats.mcap import spec
from eva.formats.mcap.chunks import ZSTD_LEVEL as ZSTD_LEVEL  # a package name (formats.mcap)
from eva.formats.mcap.chunks import ChunkState, add_chunk, index_length, make_compressor
from eva.formats.mcap.layout import LIBRARY, PROFILE
from eva.formats.mcap.records import (
    BinaryOutput,
    Bytes,
    ChunkBuffer,
    RecordFill,
    StreamRecords,
    crc32,
    spare_buffers,
)
from eva.formats.mcap.spec import CHUNK_HEAD, MESSAGE_OVERHEAD, Opcode
from eva.formats.options import McapOptions

# Stated once, in the export's options (the writer also serves callers that pass no options).
COMPRESSIONS = McapOptions.COMPRESSIONS
DEFAULT_COMPRESSION = McapOptions.compression
DEFAULT_CHUNK_SIZE = McapOptions.chunk_size
MIN_CHUNK_SIZE = McapOptions.MIN_CHUNK_SIZE
MAX_CHUNK_SIZE = McapOptions.MAX_CHUNK_SIZE
# Headroom of a chunk buffer over the chunk size: the record that fills a chunk may overshoot.
BUFFER_SLACK = 64 * 1024


class McapEpisodeWriter:
    """Write one MCAP file: header, schema, channels, chunked messages, summary, footer.

    Only what the eva layout needs: schemas and channels registered up front (in the data section
    before the first chunk, where every reader, streaming or seeking, sees them before any
    message), messages appended in log-time order. One instance per file, used from one thread.

    With ``background=True`` (default) a full chunk is CRC'd, compressed and written by a helper
    thread while the caller fills the second of two chunk buffers: those steps release the GIL,
    so they overlap with the video decode on another core. ``finish()`` (or ``close()`` on
    error) joins the helper.
    """

    def __init__(
        self,
        stream: BinaryOutput,
        *,
        compression: str = DEFAULT_COMPRESSION,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        crc: bool = True,
        background: bool = True,
        profile: str = PROFILE,
        library: str = LIBRARY,
    ) -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(f"mcap compression {compression!r}: choose one of {COMPRESSIONS}")
        if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
            raise ValueError(
                f"mcap chunk size {chunk_size} is not in {MIN_CHUNK_SIZE}..{MAX_CHUNK_SIZE} bytes"
            )
        self._stream = stream
        self._pos = 0
        self._compression = compression
        self._compressor = make_compressor(compression)
        self._chunk_size = int(chunk_size)
        self._crc = crc
        # Uncompressed chunks into a file written past the page cache: each chunk's records are
        # placed in their buffer at the offset from a block boundary they will have in the file,
        # so the stream writes them from the buffer uncopied (formats/_direct_io). ``_planned``
        # is the file offset of the next chunk record, known once the messages begin.
        self._placing = compression == "none" and bool(getattr(stream, "direct", False))
        self._buffer_size = self._chunk_size + BUFFER_SLACK + (ALIGN if self._placing else 0)
        self._planned: int | None = None
        # Two chunk buffers, reused for every chunk (the second is allocated when first needed);
        # a buffer only grows (once) for a message larger than the chunk size. The records of a
        # chunk are written into a view of one (``_view``).
        first = spare_buffers.take(self._buffer_size)
        self._bufs: list[bytearray | None] = [first, None]
        self._buf_index = 0
        self._records = ChunkBuffer(first)
        # Records outside chunks: the caller's thread writes the data section before the first
        # chunk and the summary; the helper thread writes chunks and message indexes.
        self._out = StreamRecords()
        self._chunk_out = StreamRecords()
        # Started with the first chunk that is not the last (a file of one chunk needs none).
        self._background = background
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None
        self._chunk = ChunkState()
        # The summary's records, serialized when known.
        self._schemas: list[bytes] = []
        self._channels: list[bytes] = []
        self._channel_counts: dict[int, int] = {}
        self._chunk_indexes: list[bytes] = []
        self._message_count = 0
        self._start_time: int | None = None
        self._end_time = 0
        self._finished = False
        self._emit(spec.MAGIC, spec.header(profile, library))

    # -- plumbing ------------------------------------------------------------------------------

    def _emit(self, *records: bytes) -> None:
        """Write records outside the chunks, from the caller's thread."""
        for record in records:
            self._out.add(record)
        self._pos += self._out.write_to(self._stream)

    def register_schema(self, schema_id: int, name: str, encoding: str, data: bytes) -> None:
        self._check_no_messages_yet("schema")
        schema = spec.schema(schema_id, name, encoding, data)
        self._schemas.append(schema)
        self._emit(schema)

    def register_channel(
        self, channel_id: int, topic: str, message_encoding: str, schema_id: int = 0
    ) -> None:
        self._check_no_messages_yet("channel")
        channel = spec.channel(channel_id, schema_id, topic, message_encoding)
        self._channels.append(channel)
        self._channel_counts[channel_id] = 0
        self._emit(channel)

    def _view(self, index: int) -> bytearray | memoryview:
        """Chunk buffer ``index`` as the next chunk's records go into it: placed (a view from
        the right offset) when the next chunk's file offset is known, else the whole buffer."""
        buffer = self._bufs[index]
        assert buffer is not None
        if self._planned is None or len(buffer) != self._buffer_size or not self._placing:
            return buffer
        address = np.frombuffer(buffer, np.uint8).ctypes.data
        shift = (self._planned + CHUNK_HEAD - address) % ALIGN
        return memoryview(buffer)[shift : shift + self._chunk_size + BUFFER_SLACK]

    def _begin_messages(self) -> None:
        """The first message: the data section before the chunks is written, so the first
        chunk's offset is known and its buffer can be placed."""
        self._planned = self._pos
        if self._records.used == 0:
            self._records.reset(self._view(self._buf_index))

    def _check_no_messages_yet(self, what: str) -> None:
        # Schemas and channels go straight to the stream, which the helper thread owns once
        # chunks are being flushed.
        if self._message_count:
            raise RuntimeError(f"register every {what} before the first message")

    def _reserve(self, size: int) -> int:
        """Make room for a ``size``-byte record in the chunk buffer; return its offset."""
        if self._planned is None:
            self._begin_messages()
        if self._records.used and self._records.used + size > self._chunk_size:
            self._flush_chunk()
        if size > self._records.room:
            buffer = bytearray(max(size, self._chunk_size) + BUFFER_SLACK)
            self._bufs[self._buf_index] = buffer
            self._records.reset(buffer)
        return self._records.used

    def _account(self, channel_id: int, log_time: int, offset: int) -> None:
        chunk = self._chunk
        if chunk.messages == 0:
            chunk.start_time = chunk.end_time = log_time
        else:
            chunk.start_time = min(chunk.start_time, log_time)
            chunk.end_time = max(chunk.end_time, log_time)
        chunk.messages += 1
        entries = chunk.index.get(channel_id)
        if entries is None:
            entries = chunk.index[channel_id] = []
        entries.append((log_time, offset))
        self._channel_counts[channel_id] += 1
        self._message_count += 1
        if self._start_time is None or log_time < self._start_time:
            self._start_time = log_time
        self._end_time = max(self._end_time, log_time)
        if self._records.used >= self._chunk_size:
            self._flush_chunk()

    # -- messages ------------------------------------------------------------------------------

    def add_message(
        self, channel_id: int, sequence: int, log_time: int, publish_time: int, data: bytes
    ) -> None:
        offset = self._reserve(MESSAGE_OVERHEAD + len(data))
        self._records.add_message(channel_id, sequence, log_time, publish_time, data)
        self._account(channel_id, log_time, offset)

    def add_message_parts(
        self,
        channel_id: int,
        sequence: int,
        log_time: int,
        publish_time: int,
        parts: Sequence[Bytes],
    ) -> None:
        """Append a message whose payload is the concatenation of ``parts`` (byte-like, each
        copied once, straight into the chunk buffer: no joined payload is made)."""
        size = sum(len(part) for part in parts)
        offset = self._reserve(MESSAGE_OVERHEAD + size)
        start = offset + MESSAGE_OVERHEAD
        buffer = self._records.buffer
        for part in parts:
            end = start + len(part)
            buffer[start:end] = part
            start = end
        self._add_in_place(channel_id, sequence, log_time, publish_time, offset, size)

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
        offset = self._reserve(MESSAGE_OVERHEAD + encoded_size)
        written = encode_ndarray_into(array, self._records.buffer, offset + MESSAGE_OVERHEAD)
        if written != encoded_size:
            raise ValueError(f"ndarray map is {written} bytes, expected {encoded_size}")
        self._add_in_place(channel_id, sequence, log_time, publish_time, offset, encoded_size)

    def _add_in_place(
        self,
        channel_id: int,
        sequence: int,
        log_time: int,
        publish_time: int,
        offset: int,
        size: int,
    ) -> None:
        """The message record at ``offset`` whose ``size``-byte payload is already in place."""
        self._records.add_in_place(channel_id, sequence, log_time, publish_time, size)
        self._account(channel_id, log_time, offset)

    def add_records(self, channel_ids: np.ndarray, log_times: np.ndarray, fill: RecordFill) -> None:
        """Append ``len(channel_ids)`` message records (of these channels and log times, in
        order) that ``fill`` writes straight into the chunk buffer, a chunk's share at a time."""
        count = len(channel_ids)
        offsets = np.empty(count, np.int64)
        first = 0
        if self._planned is None:
            self._begin_messages()
        while first < count:
            records = self._records
            done, used, needed = fill(
                records.buffer, records.used, self._chunk_size, first, offsets
            )
            if done > first:
                records.used = used
                self._account_batch(
                    channel_ids[first:done], log_times[first:done], offsets[first:done]
                )
                first = done
            if first < count and needed:
                if self._records.used:
                    self._flush_chunk()  # the next record starts the next chunk
                else:
                    self._reserve(needed)  # a record larger than the buffer: a larger buffer

    def _account_batch(
        self, channels: np.ndarray, log_times: np.ndarray, offsets: np.ndarray
    ) -> None:
        chunk = self._chunk
        low, high = int(log_times.min()), int(log_times.max())
        if chunk.messages == 0:
            chunk.start_time, chunk.end_time = low, high
        else:
            chunk.start_time = min(chunk.start_time, low)
            chunk.end_time = max(chunk.end_time, high)
        chunk.messages += len(channels)
        chunk.batches.append(
            (np.asarray(channels, np.int64), np.asarray(log_times, np.int64), offsets)
        )
        for channel_id, count in zip(*np.unique(channels, return_counts=True), strict=True):
            self._channel_counts[int(channel_id)] += int(count)
        self._message_count += len(channels)
        if self._start_time is None or low < self._start_time:
            self._start_time = low
        self._end_time = max(self._end_time, high)
        if self._records.used >= self._chunk_size:
            self._flush_chunk()

    def _wait_pending(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()  # re-raises a failed write here, in the caller's thread

    def _flush_chunk(self, last: bool = False) -> None:
        chunk = self._chunk
        if chunk.messages == 0:
            return
        chunk.used = self._records.used
        buffer = self._records.buffer
        if self._planned is not None:  # where the chunk after this one starts in the file
            self._planned += CHUNK_HEAD + chunk.used + index_length(chunk)
        # The other buffer is free once its flush (the only one in flight) has finished.
        self._wait_pending()
        self._chunk = ChunkState()
        if last or not self._background:
            self._write_chunk(buffer, chunk)
            self._records.reset(self._view(self._buf_index))
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eva-mcap-flush")
        self._pending = self._executor.submit(self._write_chunk, buffer, chunk)
        self._buf_index ^= 1
        if self._bufs[self._buf_index] is None:
            self._bufs[self._buf_index] = spare_buffers.take(self._buffer_size)
        self._records.reset(self._view(self._buf_index))

    def _write_chunk(self, buf: bytearray | memoryview, chunk: ChunkState) -> None:
        out = self._chunk_out
        with memoryview(buf)[: chunk.used] as records:
            index = add_chunk(
                out,
                records,
                chunk,
                self._pos,
                crc=self._crc,
                compressor=self._compressor,
                compression=self._compression,
            )
            self._pos += out.write_to(self._stream)
        self._chunk_indexes.append(index)

    # -- summary -------------------------------------------------------------------------------

    def finish(self) -> None:
        """Flush the last chunk and write DataEnd, the summary and the footer."""
        if self._finished:
            return
        self._flush_chunk(last=True)
        self._wait_pending()
        self.close()
        self._emit(spec.data_end(0))
        summary_start = self._pos
        statistics = spec.statistics(
            message_count=self._message_count,
            schema_count=len(self._schemas),
            channel_count=len(self._channels),
            chunk_count=len(self._chunk_indexes),
            start_time=self._start_time or 0,
            end_time=self._end_time,
            channel_message_counts=self._channel_counts.items(),
        )
        summary, summary_offset_start = spec.summary(
            summary_start,
            [
                (Opcode.SCHEMA, self._schemas),
                (Opcode.CHANNEL, self._channels),
                (Opcode.STATISTICS, [statistics]),
                (Opcode.CHUNK_INDEX, self._chunk_indexes),
            ],
        )
        footer = spec.footer(summary_start, summary_offset_start, 0)
        # The summary CRC covers the summary and the footer up to (not including) the CRC field.
        summary_crc = crc32(footer[: spec.FOOTER_CRC_START], crc32(summary))
        footer = spec.footer(summary_start, summary_offset_start, summary_crc)
        self._emit(summary, footer, spec.MAGIC)
        self._finished = True

    def close(self) -> None:
        """Stop the helper thread (after its current write) and hand the chunk buffers back
        for the next file; the file is complete only after ``finish()``."""
        if self._executor is not None:
            pending, self._pending = self._pending, None
            if pending is not None:
                with contextlib.suppress(BaseException):
                    pending.result()
            self._executor.shutdown(wait=True)
            self._executor = None
        # No thread writes from them now; a message added after this gets a buffer of its own.
        spare_buffers.give_back([b for b in self._bufs if b is not None])
        self._bufs = [None, None]
        self._records.reset(bytearray())


@contextlib.contextmanager
def episode_file(
    path: Path,
    *,
    compression: str = DEFAULT_COMPRESSION,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    profile: str = PROFILE,
    library: str = LIBRARY,
    background: bool = True,
) -> Iterator[McapEpisodeWriter]:
    """A writer on a new file at ``path`` (its directory made), finished when the block ends;
    when the block (or the finish) fails, the partial file is removed and the error raised,
    a write error naming the file. ``background``: as ``McapEpisodeWriter``'s."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # frames written past the page cache where the filesystem allows (formats/_direct_io)
        with naming_write_errors(path), SequentialWriter(path) as stream:
            writer = McapEpisodeWriter(
                stream,
                compression=compression,
                chunk_size=chunk_size,
                profile=profile,
                library=library,
                background=background,
            )
            try:
                yield writer
                writer.finish()
            finally:
                writer.close()
    except BaseException:
        path.unlink(missing_ok=True)
        raise
