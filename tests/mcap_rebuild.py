"""An MCAP file rebuilt from what the official ``mcap`` reader parsed, by eva's own serializer
(``eva.formats.mcap.spec``): equal bytes mean that every field eva writes is where the reader
looks for it, and that the reader sees the values eva meant."""

from __future__ import annotations

import io

import numpy as np
from mcap.records import (
    Channel,
    Chunk,
    ChunkIndex,
    DataEnd,
    Footer,
    Header,
    McapRecord,
    Message,
    MessageIndex,
    Schema,
    Statistics,
    SummaryOffset,
)
from mcap.stream_reader import StreamReader

from eva.formats.mcap import spec


def record_bytes(record: McapRecord) -> bytes:
    """``record`` (as the official reader parsed it) serialized by eva's ``spec``."""
    if isinstance(record, Header):
        return spec.header(record.profile, record.library)
    if isinstance(record, Schema):
        return spec.schema(record.id, record.name, record.encoding, record.data)
    if isinstance(record, Channel):
        assert record.metadata == {}, "eva writes channels without metadata"
        return spec.channel(record.id, record.schema_id, record.topic, record.message_encoding)
    if isinstance(record, Message):
        return spec.message(
            record.channel_id, record.sequence, record.log_time, record.publish_time, record.data
        )
    if isinstance(record, Chunk):
        head = spec.chunk_head(
            record.message_start_time,
            record.message_end_time,
            record.uncompressed_size,
            record.uncompressed_crc,
            record.compression,
            len(record.data),
        )
        return head + record.data
    if isinstance(record, MessageIndex):
        return spec.message_index(record.channel_id, np.array(record.records, np.uint64))
    if isinstance(record, ChunkIndex):
        return spec.chunk_index(
            start_time=record.message_start_time,
            end_time=record.message_end_time,
            chunk_offset=record.chunk_start_offset,
            chunk_length=record.chunk_length,
            message_index_offsets=record.message_index_offsets.items(),
            message_index_length=record.message_index_length,
            compression=record.compression,
            compressed_size=record.compressed_size,
            uncompressed_size=record.uncompressed_size,
        )
    if isinstance(record, Statistics):
        assert (record.attachment_count, record.metadata_count) == (0, 0)
        return spec.statistics(
            message_count=record.message_count,
            schema_count=record.schema_count,
            channel_count=record.channel_count,
            chunk_count=record.chunk_count,
            start_time=record.message_start_time,
            end_time=record.message_end_time,
            channel_message_counts=record.channel_message_counts.items(),
        )
    if isinstance(record, SummaryOffset):
        return spec.summary_offset(
            spec.Opcode(record.group_opcode), record.group_start, record.group_length
        )
    if isinstance(record, DataEnd):
        return spec.data_end(record.data_section_crc)
    if isinstance(record, Footer):
        return spec.footer(record.summary_start, record.summary_offset_start, record.summary_crc)
    raise AssertionError(f"eva does not write {type(record).__name__} records")


def file_records(data: bytes, emit_chunks: bool = True) -> list[McapRecord]:
    """Every record of the file, in order, as the official stream reader parses it (CRCs of
    chunks and of the summary checked)."""
    stream = StreamReader(
        io.BytesIO(data), skip_magic=False, emit_chunks=emit_chunks, validate_crcs=True
    )
    return list(stream.records)


def rebuilt(data: bytes) -> bytes:
    """The file's bytes from its parsed records (chunks whole)."""
    return spec.MAGIC + b"".join(map(record_bytes, file_records(data))) + spec.MAGIC
