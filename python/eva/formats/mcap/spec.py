"""The bytes of every MCAP record eva writes, laid out as the MCAP specification says
(https://mcap.dev/spec, format version 0): eva serializes its records itself.

Why not the ``mcap`` package's writer: ``mcap.writer.Writer`` copies each payload into a
``BytesIO`` twice over and compresses in the caller's thread (``eva.formats.mcap.writer``), and
its record types serialize only through the package's undocumented ``RecordBuilder``, whose
internals a release may change. The file is read back by the official reader, with every CRC
checked, for each record type here (tests/test_mcap_canary.py), so a change of either side shows.

Layout rules of the spec used below: little-endian integers; a record is its opcode (u8), the
length of its body (u64), then the body; a string is a u32 byte length and UTF-8 bytes; a map or
an array is a u32 byte length and its entries back to back. Maps are written in the order given.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from enum import IntEnum

import numpy as np

MAGIC = b"\x89MCAP0\r\n"


class Opcode(IntEnum):
    """The spec's record opcodes (those of the records eva writes or looks for)."""

    HEADER = 0x01
    FOOTER = 0x02
    SCHEMA = 0x03
    CHANNEL = 0x04
    MESSAGE = 0x05
    CHUNK = 0x06
    MESSAGE_INDEX = 0x07
    CHUNK_INDEX = 0x08
    STATISTICS = 0x0B
    SUMMARY_OFFSET = 0x0E
    DATA_END = 0x0F


PREFIX = struct.Struct("<BQ")  # opcode, body length
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_ID_U64 = struct.Struct("<HQ")  # a map<u16, u64> entry
_MESSAGE_HEAD = struct.Struct("<BQHIQQ")  # prefix, channel id, sequence, log and publish time
_CHUNK_FIELDS = struct.Struct("<QQQI")  # start and end time, uncompressed size, CRC
_MESSAGE_INDEX_HEAD = struct.Struct("<BQHI")  # prefix, channel id, byte length of the entries
_STATISTICS_FIELDS = struct.Struct("<QHIIIIQQ")
_FOOTER = struct.Struct("<BQQQI")
_SUMMARY_OFFSET = struct.Struct("<BQBQQ")

# Bytes of a Message record before its payload.
MESSAGE_OVERHEAD = _MESSAGE_HEAD.size
# Those bytes as a numpy record, for framing many messages at once.
MESSAGE_HEADER = np.dtype(
    [
        ("opcode", "u1"),
        ("length", "<u8"),
        ("channel", "<u2"),
        ("sequence", "<u4"),
        ("log_time", "<u8"),
        ("publish_time", "<u8"),
    ]
)
assert MESSAGE_HEADER.itemsize == MESSAGE_OVERHEAD


def record(opcode: Opcode, *body: bytes) -> bytes:
    """A whole record: its prefix, then ``body``'s parts."""
    data = b"".join(body)
    return PREFIX.pack(opcode, len(data)) + data


def string(value: str) -> bytes:
    data = value.encode()
    return _U32.pack(len(data)) + data


def id_map(entries: Iterable[tuple[int, int]]) -> bytes:
    """A map<u16, u64> (channel id -> count or offset), in the order given."""
    data = b"".join(_ID_U64.pack(key, value) for key, value in entries)
    return _U32.pack(len(data)) + data


def header(profile: str, library: str) -> bytes:
    return record(Opcode.HEADER, string(profile), string(library))


def schema(schema_id: int, name: str, encoding: str, data: bytes) -> bytes:
    return record(
        Opcode.SCHEMA,
        _U16.pack(schema_id),
        string(name),
        string(encoding),
        _U32.pack(len(data)),
        data,
    )


def channel(channel_id: int, schema_id: int, topic: str, message_encoding: str) -> bytes:
    """A channel record with empty metadata (eva's channels carry none)."""
    return record(
        Opcode.CHANNEL,
        _U16.pack(channel_id),
        _U16.pack(schema_id),
        string(topic),
        string(message_encoding),
        _U32.pack(0),
    )


def pack_message_head(
    buffer: bytearray | memoryview,
    at: int,
    channel_id: int,
    sequence: int,
    log_time: int,
    publish_time: int,
    size: int,
) -> None:
    """The first ``MESSAGE_OVERHEAD`` bytes of a message record with a ``size``-byte payload,
    into ``buffer`` at ``at`` (the payload follows them)."""
    length = MESSAGE_OVERHEAD - PREFIX.size + size
    _MESSAGE_HEAD.pack_into(
        buffer, at, Opcode.MESSAGE, length, channel_id, sequence, log_time, publish_time
    )


def message(channel_id: int, sequence: int, log_time: int, publish_time: int, data: bytes) -> bytes:
    head = bytearray(MESSAGE_OVERHEAD)
    pack_message_head(head, 0, channel_id, sequence, log_time, publish_time, len(data))
    return bytes(head) + data


def chunk_head(
    start_time: int, end_time: int, uncompressed_size: int, crc: int, compression: str, size: int
) -> bytes:
    """A chunk record's bytes before its ``size`` bytes of (compressed) records."""
    name = string(compression)
    fields = _CHUNK_FIELDS.pack(start_time, end_time, uncompressed_size, crc)
    length = len(fields) + len(name) + _U64.size + size
    return PREFIX.pack(Opcode.CHUNK, length) + fields + name + _U64.pack(size)


# The bytes of an uncompressed chunk's head: prefix, times, size, CRC, "" and the records' length.
CHUNK_HEAD = len(chunk_head(0, 0, 0, 0, "", 0))


def message_index(channel_id: int, pairs: np.ndarray) -> bytes:
    """The MessageIndex record of ``channel_id`` over (log_time, offset) ``pairs`` (an (n, 2)
    array), packed by numpy."""
    entries = np.ascontiguousarray(pairs, "<u8").tobytes()
    head = _MESSAGE_INDEX_HEAD.pack(
        Opcode.MESSAGE_INDEX, _U16.size + _U32.size + len(entries), channel_id, len(entries)
    )
    return head + entries


def chunk_index(
    *,
    start_time: int,
    end_time: int,
    chunk_offset: int,
    chunk_length: int,
    message_index_offsets: Iterable[tuple[int, int]],
    message_index_length: int,
    compression: str,
    compressed_size: int,
    uncompressed_size: int,
) -> bytes:
    return record(
        Opcode.CHUNK_INDEX,
        struct.pack("<QQQQ", start_time, end_time, chunk_offset, chunk_length),
        id_map(message_index_offsets),
        _U64.pack(message_index_length),
        string(compression),
        struct.pack("<QQ", compressed_size, uncompressed_size),
    )


def statistics(
    *,
    message_count: int,
    schema_count: int,
    channel_count: int,
    chunk_count: int,
    start_time: int,
    end_time: int,
    channel_message_counts: Iterable[tuple[int, int]],
) -> bytes:
    """Statistics of a file without attachments and metadata records."""
    fields = _STATISTICS_FIELDS.pack(
        message_count, schema_count, channel_count, 0, 0, chunk_count, start_time, end_time
    )
    return record(Opcode.STATISTICS, fields, id_map(channel_message_counts))


def summary_offset(group_opcode: Opcode, group_start: int, group_length: int) -> bytes:
    return _SUMMARY_OFFSET.pack(Opcode.SUMMARY_OFFSET, 17, group_opcode, group_start, group_length)


def data_end(data_section_crc: int) -> bytes:
    return record(Opcode.DATA_END, _U32.pack(data_section_crc))


def footer(summary_start: int, summary_offset_start: int, summary_crc: int) -> bytes:
    return _FOOTER.pack(Opcode.FOOTER, 20, summary_start, summary_offset_start, summary_crc)


# The bytes of the footer the summary CRC covers: all but its CRC field.
FOOTER_CRC_START = _FOOTER.size - _U32.size


def summary(start: int, groups: Iterable[tuple[Opcode, Sequence[bytes]]]) -> tuple[bytes, int]:
    """The summary section at file offset ``start``: each non-empty group's records, then a
    summary offset per group. Returns (its bytes, the file offset of the summary offsets)."""
    parts: list[bytes] = []
    offsets: list[bytes] = []
    at = start
    for opcode, records in groups:
        if not records:
            continue  # no empty groups (nor their offsets) in the summary
        length = sum(map(len, records))
        parts += records
        offsets.append(summary_offset(opcode, at, length))
        at += length
    return b"".join(parts + offsets), at
