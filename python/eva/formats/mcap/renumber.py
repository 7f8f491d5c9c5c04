"""Renumbered reuse of a published MCAP episode file, eva-client profile (``eva.formats._renumber``).

The numbering of an episode shows only in its ``episode`` message (``columns`` arrays
``episode_index``, ``index``, ``task_index`` and ``metadata.episode_index``; layout in
``eva.formats.mcap.layout``), which ``write_episode_file`` makes the first record of the first
chunk. When that message keeps its length under the new numbering (the arrays always do; the
MessagePack integer ``metadata.episode_index`` grows by a byte at 128, 256, 65536...) and chunks
are not compressed, a new export differs from the published file in those bytes and in the
chunk's ``uncompressed_crc`` only: message indexes, chunk indexes and statistics hold offsets,
times and counts; the summary CRC covers the summary; the writer leaves ``DataEnd``'s
``data_section_crc`` 0. So the copy gets the new payload and the chunk's new CRC, both checked
against the old ones first (the old CRC also over the published chunk's bytes).

The foxglove profile writes the frame columns as one JSON message per frame, whose lengths
change with the digits of ``index``: its episodes are written anew (no decode there, for the
cameras it carries: a rewrite costs about what a copy does).
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

from eva.dataset.reader import DatasetReader
from eva.formats._renumber import Patch, copy_and_patch
from eva.formats.mcap.layout import FOXGLOVE_PROFILE
from eva.formats.mcap.spec import MAGIC, MESSAGE_OVERHEAD, Opcode
from eva.formats.options import McapOptions
from eva.formats.tasks import EpisodeResult, EpisodeTask

_PREFIX = struct.Struct("<BQ")  # opcode, record length
# A chunk's fields before its compression string: start, end, uncompressed size, CRC.
_CHUNK_HEAD = struct.Struct("<QQQI")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_MESSAGE_HEAD = struct.Struct("<BQH")  # a message record's opcode, length, channel id
EPISODE_CHANNEL = 1  # write_episode_file's ``episode`` channel
# Records before the first chunk: the header, one schema, a channel per topic.
MAX_RECORDS_BEFORE_CHUNK = 1 << 16


def _first_chunk(fd: int) -> tuple[int, int, int, int]:
    """(CRC offset, stored CRC, records offset, records size) of the file's first chunk,
    which must be uncompressed; ``ValueError`` otherwise."""
    if os.pread(fd, len(MAGIC), 0) != MAGIC:
        raise ValueError("no MCAP magic")
    at = len(MAGIC)
    for _ in range(MAX_RECORDS_BEFORE_CHUNK):
        head = os.pread(fd, _PREFIX.size, at)
        if len(head) != _PREFIX.size:
            raise ValueError("no chunk")
        opcode, length = _PREFIX.unpack(head)
        if opcode == Opcode.CHUNK:
            break
        if opcode in (Opcode.DATA_END, Opcode.FOOTER):
            raise ValueError("no chunk")
        at += _PREFIX.size + length
    else:
        raise ValueError("no chunk")
    body = at + _PREFIX.size
    _, _, size, crc = _CHUNK_HEAD.unpack(os.pread(fd, _CHUNK_HEAD.size, body))
    compression_at = body + _CHUNK_HEAD.size
    (name_length,) = _U32.unpack(os.pread(fd, _U32.size, compression_at))
    if name_length:
        raise ValueError("compressed chunk")
    records_at = compression_at + _U32.size + _U64.size
    (records_size,) = _U64.unpack(os.pread(fd, _U64.size, records_at - _U64.size))
    end = records_at + records_size
    if records_size != size or end > body + length or end > os.fstat(fd).st_size:
        raise ValueError("chunk sizes")
    return body + _CHUNK_HEAD.size - _U32.size, crc, records_at, records_size


def episode_patches(published: Path, old: bytes, new: bytes) -> list[Patch]:
    """The patches turning ``published``'s episode message ``old`` into ``new`` (the same
    length) and its chunk's CRC; ``ValueError`` when the file is not laid out so."""
    fd = os.open(published, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        crc_at, crc, records_at, records_size = _first_chunk(fd)
        records = os.pread(fd, records_size, records_at)
    finally:
        os.close(fd)
    if len(records) != records_size or records_size < MESSAGE_OVERHEAD + len(old):
        raise ValueError("short chunk")
    opcode, length, channel = _MESSAGE_HEAD.unpack_from(records)
    if (
        opcode != Opcode.MESSAGE
        or channel != EPISODE_CHANNEL
        or length != MESSAGE_OVERHEAD - _PREFIX.size + len(old)
        or records[MESSAGE_OVERHEAD : MESSAGE_OVERHEAD + len(old)] != old
    ):
        raise ValueError("not the episode message")
    if crc and zlib.crc32(records) != crc:
        raise ValueError("chunk CRC")
    patched = records[:MESSAGE_OVERHEAD] + new + records[MESSAGE_OVERHEAD + len(old) :]
    patches = [Patch(records_at + MESSAGE_OVERHEAD, old, new)]
    if crc:  # a chunk written without CRC keeps 0
        patches.append(Patch(crc_at, _U32.pack(crc), _U32.pack(zlib.crc32(patched))))
    return patches


def renumber_episode(
    reader: DatasetReader, task: EpisodeTask, previous: EpisodeTask, published: Path
) -> EpisodeResult | None:
    """``task``'s file, from ``published`` (``previous``'s file, the same episode numbered
    otherwise): copied into the staging directory and patched; None when it cannot be."""
    from eva.formats.mcap.export import episode_payload, renumbered_table, result_current

    opts = task.options.format_options(McapOptions)
    if opts.profile == FOXGLOVE_PROFILE or opts.compression != "none":
        return None
    images = [k for k, f in reader.features.items() if f.get("dtype") == "image"]
    table = reader.read_table(task.source_index)
    if table.num_rows != (task.source_length or task.length):
        return None
    old, new = (
        episode_payload(renumbered_table(table, t), t.row, reader.fps, images)
        for t in (previous, task)
    )
    if len(old) != len(new):
        return None
    try:
        patches = episode_patches(published, old, new)
    except (OSError, ValueError, struct.error):
        return None  # not this layout, or not what was published: written anew
    size = copy_and_patch(published, task.subset_dir / task.path, patches)
    if size is None:
        return None
    return EpisodeResult(task.subset, task.index, task.path, size, result_current(task))
