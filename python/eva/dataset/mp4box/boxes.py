"""The ISO-BMFF box layer of ``eva.dataset.mp4box``: box headers, children, full-box versions
and fixed-size entry tables, read with ``pread`` (from one in-memory window when held). Every
size is checked against the parent; anything this strict parser cannot vouch for raises
``Mp4Unsupported`` (ask FFmpeg), a file cut short ``Mp4Truncated``.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "INT32_MAX",
    "TABLE_ENTRY_LIMIT",
    "U32",
    "Box",
    "BoxReader",
    "Mp4Error",
    "Mp4Truncated",
    "Mp4Unsupported",
    "box_at",
    "child_boxes",
    "entry_table",
    "full_box_version",
    "need_box",
    "only_box",
    "payload",
    "timescale_duration",
]

# Sample tables (stts, stsc, stsz, stco, ctts, stss) are read whole; more entries than this (over
# nine hours at 30 fps in one file) is left to FFmpeg.
TABLE_ENTRY_LIMIT = 1 << 20

INT32_MAX = (1 << 31) - 1
_HEADER = struct.Struct(">I4s")
_LARGESIZE = struct.Struct(">Q")
U32 = struct.Struct(">I")
_TWO_U32 = struct.Struct(">II")


class Mp4Error(ValueError):
    """Base class: the message names the file."""


class Mp4Unsupported(Mp4Error):
    """The frame count cannot be read soundly from the boxes alone: ask FFmpeg instead."""


class Mp4Truncated(Mp4Error):
    """A top-level box extends past the end of the file."""


class Box(NamedTuple):  # a tuple: a frozen dataclass costs ~1 us per box here
    type: bytes
    start: int  # offset of the box header
    body: int  # offset of the payload (after size/type/largesize)
    end: int  # offset one past the box
    to_end: bool = False  # size field 0: the box runs to the end of its parent


class BoxReader:
    """pread-based access to the file, served from an in-memory copy of one range when held."""

    def __init__(self, fd: int, path: Path, file_size: int) -> None:
        self.fd = fd
        self.path = path
        self.file_size = file_size
        self._window_start = 0
        self._window = b""

    def hold(self, start: int, end: int) -> None:
        self._window = os.pread(self.fd, end - start, start)
        self._window_start = start
        if len(self._window) != end - start:
            raise Mp4Truncated(f"{self.path}: file shrank while being read")

    def read(self, offset: int, size: int) -> bytes:
        rel = offset - self._window_start
        if rel >= 0 and rel + size <= len(self._window):
            return self._window[rel : rel + size]
        data = os.pread(self.fd, size, offset)
        if len(data) != size:
            raise Mp4Unsupported(f"{self.path}: short read of {size} bytes at byte {offset}")
        return data


def box_at(reader: BoxReader, offset: int, limit: int) -> Box:
    """The box whose header starts at ``offset`` inside a parent ending at ``limit``."""
    path = reader.path
    if limit - offset < 8:
        raise Mp4Unsupported(f"{path}: {limit - offset} stray bytes at byte {offset}")
    size, box_type = _HEADER.unpack(reader.read(offset, 8))
    header = 8
    to_end = size == 0
    if size == 1:
        if limit - offset < 16:
            raise Mp4Unsupported(f"{path}: box {box_type!r} at byte {offset}: cut largesize")
        (size,) = _LARGESIZE.unpack(reader.read(offset + 8, 8))
        header = 16
    elif size == 0:
        size = limit - offset
    if size < header:
        raise Mp4Unsupported(f"{path}: box {box_type!r} at byte {offset}: bad size {size}")
    return Box(box_type, offset, offset + header, offset + size, to_end)


def child_boxes(reader: BoxReader, parent: Box) -> list[Box]:
    boxes = []
    offset = parent.body
    while offset < parent.end:
        box = box_at(reader, offset, parent.end)
        if box.end > parent.end:
            raise Mp4Unsupported(
                f"{reader.path}: box {box.type!r} at byte {box.start} overruns its parent "
                f"{parent.type!r}"
            )
        boxes.append(box)
        offset = box.end
    return boxes


def only_box(reader: BoxReader, boxes: list[Box], box_type: bytes, where: str) -> Box | None:
    found = [box for box in boxes if box.type == box_type]
    if len(found) > 1:
        raise Mp4Unsupported(f"{reader.path}: {len(found)} {box_type.decode()} boxes in {where}")
    return found[0] if found else None


def need_box(reader: BoxReader, boxes: list[Box], box_type: bytes, where: str) -> Box:
    box = only_box(reader, boxes, box_type, where)
    if box is None:
        raise Mp4Unsupported(f"{reader.path}: no {box_type.decode()} box in {where}")
    return box


def payload(reader: BoxReader, box: Box, size: int) -> bytes:
    if box.end - box.body < size:
        raise Mp4Unsupported(f"{reader.path}: {box.type.decode()} box too short")
    return reader.read(box.body, size)


def full_box_version(reader: BoxReader, box: Box, versions: tuple[int, ...]) -> int:
    version = payload(reader, box, 4)[0]
    if version not in versions:
        raise Mp4Unsupported(f"{reader.path}: {box.type.decode()} version {version}")
    return version


def timescale_duration(reader: BoxReader, box: Box) -> tuple[int, int]:
    """(timescale, duration) of an mvhd or mdhd box (same layout up to duration)."""
    if full_box_version(reader, box, (0, 1)) == 1:
        timescale, duration = struct.unpack(">IQ", payload(reader, box, 32)[20:32])
    else:
        timescale, duration = _TWO_U32.unpack(payload(reader, box, 20)[12:20])
    if not 0 < timescale <= INT32_MAX:  # FFmpeg reads it as a signed int and resets others to 1
        raise Mp4Unsupported(f"{reader.path}: {box.type.decode()} timescale {timescale}")
    return timescale, duration


def entry_table(reader: BoxReader, box: Box, entry_size: int) -> tuple[int, bytes]:
    """(entry_count, entries) of a full box holding a count and a table of fixed-size entries."""
    full_box_version(reader, box, (0,))
    (count,) = U32.unpack(payload(reader, box, 8)[4:8])
    if count > TABLE_ENTRY_LIMIT or box.end - box.body < 8 + count * entry_size:
        raise Mp4Unsupported(f"{reader.path}: {box.type.decode()} table of {count} entries")
    return count, reader.read(box.body + 8, count * entry_size)
