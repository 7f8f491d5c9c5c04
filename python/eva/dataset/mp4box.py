"""Strict, read-only ISO-BMFF (MP4) box reader: the video track's frame count without FFmpeg.

Why: opening an MP4 with PyAV costs 0.2-2.5 ms (probing decodes the first frame, so it grows with
the resolution); the validator needs the frame count of every camera of every episode before
each export. The count is in the sample table (``moov/trak/mdia/minf/stbl/stsz``), which a few
``pread`` calls reach in tens of microseconds.

What is read: the top-level box headers (every one, to the end of the file, so that a file cut
short is noticed), then the ``moov`` box in one read when it is at most ``MOOV_READ_LIMIT`` bytes
(otherwise box by box). Inside ``moov``: ``mvhd`` (movie timescale), each ``trak``'s ``hdlr``
(the video track is the one with handler ``vide``), ``tkhd``, ``mdhd`` (timescale, duration),
``edts/elst``, ``dinf/dref``, and in ``stbl``: ``stsd`` (entry headers), ``stts``, ``stsc``,
``stsz``/``stz2``, ``stco``/``co64``, and ``ctts``/``stss`` when an edit list needs them.

The count is given only when it is certainly the number of packets FFmpeg's demuxer delivers, i.e.
the frames it decodes; otherwise ``Mp4Unsupported`` tells the caller to ask FFmpeg
(``eva.dataset.video.count_frames`` does). Checked (fuzzed and swept against PyAV 18.1):

* not fragmented (``mvex`` in ``moov`` or a top-level ``moof``/``mfra``: samples live in
  fragments), one ``moov``, exactly one video track (which one FFmpeg picks is its business);
* the sample table agrees with itself: ``stsz`` count == sum of ``stts`` counts == samples mapped
  to chunks by ``stsc``/``stco``; every sample has bytes and every chunk lies inside the file
  (FFmpeg drops a sample it cannot read whole); every ``stsc`` run names an existing sample
  description whose data reference is this file (a self-contained ``url ``); timescales and
  deltas fit FFmpeg's signed 32-bit fields;
* the edit list hides nothing. FFmpeg applies edit lists on demux (``mov_fix_index``): samples
  presented before ``media_time`` or at/after the edit's end are flagged discard and never come
  out of the decoder (PyAV 18.1: a ``media_time`` of two frames decodes 8 of 10 frames, a
  ``segment_duration`` ending at the last frame's start decodes 9, an empty edit alone none).
  FFmpeg's MP4 muxer (hence eva, PyAV, LeRobot) writes one entry, rate 1, ``media_time`` = the
  first presentation time (0 without B-frames) and a ``segment_duration`` covering the media.
  Vouched for: one entry, rate 1, every delta > 0, sample 0 a keyframe, and either no ``ctts``
  with ``media_time`` 0 and the last sample starting before the edit's end (O(1)), or ``ctts``
  (B-frames) with every presentation time in [media_time, end), the first sample presented at
  ``media_time``, no other keyframe decoded at or before it, and FFmpeg's early stop (after the
  second keyframe reaching the end) not before the last sample (numpy, O(samples));
* every box parses (size >= 8, children inside their parent, known versions), and no top-level
  box has size 0 ("to the end of the file", whose data cannot be checked for truncation).

``Mp4Truncated`` is raised when a top-level box claims more bytes than the file has: the file was
cut (a crash mid-copy) and decoding would yield fewer frames than the sample table lists.
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

# A file changed less than this long ago is parsed again on every read (see _SampleCache.key).
SETTLED_NS = 100_000_000
# moov boxes up to this size are read with one pread and parsed in memory (a 30 fps hour of
# video has ~0.5 MB of sample tables); larger ones are walked header by header.
MOOV_READ_LIMIT = 4 << 20
# Sample tables (stts, stsc, stsz, stco, ctts, stss) are read whole; more entries than this (over
# nine hours at 30 fps in one file) is left to FFmpeg.
TABLE_ENTRY_LIMIT = 1 << 20

_INT32_MAX = (1 << 31) - 1
_HEADER = struct.Struct(">I4s")
_LARGESIZE = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_TWO_U32 = struct.Struct(">II")
_ELST_V0 = struct.Struct(">IihH")
_ELST_V1 = struct.Struct(">QqhH")


class Mp4Error(ValueError):
    """Base class: the message names the file."""


class Mp4Unsupported(Mp4Error):
    """The frame count cannot be read soundly from the boxes alone: ask FFmpeg instead."""


class Mp4Truncated(Mp4Error):
    """A top-level box extends past the end of the file."""


@dataclass(frozen=True)
class VideoTrack:
    """What the box tables say about the one video track."""

    sample_count: int  # == frames FFmpeg decodes (checked as described in the module doc)
    timescale: int  # mdhd: ticks per second of the media
    duration: int  # mdhd duration, in ``timescale`` ticks
    sample_duration_total: int  # sum of stts deltas, in ``timescale`` ticks
    track_id: int  # tkhd track_ID (0 when tkhd is absent)


@dataclass(frozen=True)
class SampleEntry:
    """The video track's (single) sample description, as stored in ``stsd``."""

    fourcc: bytes  # sample entry type: b"avc1", b"hvc1", b"av01", ...
    width: int  # VisualSampleEntry width / height (pixels)
    height: int
    config_type: bytes | None  # b"avcC" / b"hvcC" / b"av1C" / b"vpcC", None without one
    config: bytes  # that box's payload: what FFmpeg's demuxer hands the decoder as extradata
    # The entry's bytes without its btrt child (per-file bit rates): two entries with equal
    # ``key`` and equal media timescale describe identically configured streams.
    key: bytes


@dataclass(frozen=True, eq=False)
class VideoSamples:
    """The video track's samples as FFmpeg's demuxer delivers them, one per packet, in order.

    Times are FFmpeg's packet timestamps after its edit-list pass. Without ``ctts`` ``pts`` is
    ``dts``; with composition offsets (B-frames) they are given only under an edit list that
    ``read_video_track`` vouches for (one entry, rate 1, ``media_time`` = the first presentation
    time, nothing hidden), which FFmpeg subtracts from both: the first frame is presented at 0 and
    decoded at minus the reorder delay. Checked against PyAV's demuxer packet by packet in tests.
    """

    track: VideoTrack
    entry: SampleEntry
    offsets: np.ndarray  # int64 file offset of each sample's bytes
    sizes: np.ndarray  # int64 byte size of each sample
    dts: np.ndarray  # int64 decode time, in ``track.timescale`` ticks
    pts: np.ndarray  # int64 presentation time (the same array as ``dts`` without ctts)
    durations: np.ndarray  # int64 stts delta of each sample
    keyframes: np.ndarray  # bool: sync sample (every sample when there is no stss)


# Sample entry types whose codec configuration box carries the decoder's parameter sets, so the
# decoder's parameters (size, pixel format) follow from the sample entry alone.
CONFIG_BOXES = {b"avc1": b"avcC", b"hvc1": b"hvcC", b"av01": b"av1C"}
# avc3/hev1 carry the same box, but parameter sets may also come in-band (in the samples), so the
# box alone does not fix the decoder's parameters: read it, but not listed in CONFIG_BOXES.
_CONFIG_BOX_OF = {**CONFIG_BOXES, b"avc3": b"avcC", b"hev1": b"hvcC"}
_VISUAL_SAMPLE_ENTRY_SIZE = 78  # bytes of VisualSampleEntry fields before its child boxes


class _Box(NamedTuple):  # a tuple: a frozen dataclass costs ~1 us per box here
    type: bytes
    start: int  # offset of the box header
    body: int  # offset of the payload (after size/type/largesize)
    end: int  # offset one past the box
    to_end: bool = False  # size field 0: the box runs to the end of its parent


class _Reader:
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


def _box_at(reader: _Reader, offset: int, limit: int) -> _Box:
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
    return _Box(box_type, offset, offset + header, offset + size, to_end)


def _children(reader: _Reader, parent: _Box) -> list[_Box]:
    boxes = []
    offset = parent.body
    while offset < parent.end:
        box = _box_at(reader, offset, parent.end)
        if box.end > parent.end:
            raise Mp4Unsupported(
                f"{reader.path}: box {box.type!r} at byte {box.start} overruns its parent "
                f"{parent.type!r}"
            )
        boxes.append(box)
        offset = box.end
    return boxes


def _only(reader: _Reader, boxes: list[_Box], box_type: bytes, where: str) -> _Box | None:
    found = [box for box in boxes if box.type == box_type]
    if len(found) > 1:
        raise Mp4Unsupported(f"{reader.path}: {len(found)} {box_type.decode()} boxes in {where}")
    return found[0] if found else None


def _need(reader: _Reader, boxes: list[_Box], box_type: bytes, where: str) -> _Box:
    box = _only(reader, boxes, box_type, where)
    if box is None:
        raise Mp4Unsupported(f"{reader.path}: no {box_type.decode()} box in {where}")
    return box


def _payload(reader: _Reader, box: _Box, size: int) -> bytes:
    if box.end - box.body < size:
        raise Mp4Unsupported(f"{reader.path}: {box.type.decode()} box too short")
    return reader.read(box.body, size)


def _full_box_version(reader: _Reader, box: _Box, versions: tuple[int, ...]) -> int:
    version = _payload(reader, box, 4)[0]
    if version not in versions:
        raise Mp4Unsupported(f"{reader.path}: {box.type.decode()} version {version}")
    return version


def _timescale_duration(reader: _Reader, box: _Box) -> tuple[int, int]:
    """(timescale, duration) of an mvhd or mdhd box (same layout up to duration)."""
    if _full_box_version(reader, box, (0, 1)) == 1:
        timescale, duration = struct.unpack(">IQ", _payload(reader, box, 32)[20:32])
    else:
        timescale, duration = _TWO_U32.unpack(_payload(reader, box, 20)[12:20])
    if not 0 < timescale <= _INT32_MAX:  # FFmpeg reads it as a signed int and resets others to 1
        raise Mp4Unsupported(f"{reader.path}: {box.type.decode()} timescale {timescale}")
    return timescale, duration


def _table(reader: _Reader, box: _Box, entry_size: int) -> tuple[int, bytes]:
    """(entry_count, entries) of a full box holding a count and a table of fixed-size entries."""
    _full_box_version(reader, box, (0,))
    (count,) = _U32.unpack(_payload(reader, box, 8)[4:8])
    if count > TABLE_ENTRY_LIMIT or box.end - box.body < 8 + count * entry_size:
        raise Mp4Unsupported(f"{reader.path}: {box.type.decode()} table of {count} entries")
    return count, reader.read(box.body + 8, count * entry_size)


class _Timing(NamedTuple):
    samples: int
    duration: int  # sum of all deltas
    min_delta: int
    last_delta: int


def _sample_times(reader: _Reader, stts: _Box) -> _Timing:
    """Sample count, total duration and delta extremes from the stts run-length table."""
    count, entries = _table(reader, stts, 8)
    samples = duration = last_delta = 0
    min_delta = _INT32_MAX
    for run_samples, delta in struct.iter_unpack(">II", entries):
        if delta > _INT32_MAX:  # FFmpeg's timestamps are signed: do not second-guess what it does
            raise Mp4Unsupported(f"{reader.path}: stts sample delta {delta}")
        if run_samples:
            samples += run_samples
            duration += run_samples * delta
            min_delta = min(min_delta, delta)
            last_delta = delta
    if duration >= 1 << 62:
        raise Mp4Unsupported(f"{reader.path}: media duration {duration} overflows FFmpeg's clock")
    return _Timing(samples, duration, min_delta, last_delta)


def _check_descriptions(reader: _Reader, stsd: _Box, dinf: _Box) -> int:
    """Number of sample descriptions, each of whose data must be in this file: its data reference
    must be a self-contained 'url ' entry (flag 1), what every muxer writes. Samples in another
    file would not be read (FFmpeg does not follow external references by default)."""
    _full_box_version(reader, stsd, (0,))
    (description_count,) = _U32.unpack(_payload(reader, stsd, 8)[4:8])
    descriptions = _children(reader, _Box(b"stsd", stsd.start, stsd.body + 8, stsd.end))
    if description_count == 0 or len(descriptions) != description_count:
        raise Mp4Unsupported(f"{reader.path}: stsd lists {description_count} descriptions")
    dref = _need(reader, _children(reader, dinf), b"dref", "dinf")
    _full_box_version(reader, dref, (0,))
    references = _children(reader, _Box(b"dref", dref.start, dref.body + 8, dref.end))
    for description in descriptions:
        if description.end - description.body < 8:
            raise Mp4Unsupported(f"{reader.path}: sample description too short")
        (index,) = struct.unpack(">H", reader.read(description.body + 6, 2))
        if not 1 <= index <= len(references):
            raise Mp4Unsupported(f"{reader.path}: data reference {index} does not exist")
        reference = references[index - 1]
        flags = _payload(reader, reference, 4)
        if reference.type != b"url " or flags != b"\x00\x00\x00\x01":
            raise Mp4Unsupported(f"{reader.path}: samples stored outside the file")
    return description_count


def _chunk_runs(
    reader: _Reader, stsc: _Box, chunk_count: int, description_count: int
) -> list[tuple[int, int, int]]:
    """stsc as (first chunk, end chunk, samples per chunk) runs: 0-based, end exclusive.

    Every run must name an existing sample description: FFmpeg drops samples that do not."""
    count, entries = _table(reader, stsc, 12)
    firsts = []
    for first, per_chunk, description in struct.iter_unpack(">III", entries):
        if not 1 <= description <= description_count:
            raise Mp4Unsupported(f"{reader.path}: stsc names sample description {description}")
        firsts.append((first - 1, per_chunk))
    runs = []
    for i, (first, per_chunk) in enumerate(firsts):
        end = firsts[i + 1][0] if i + 1 < count else chunk_count
        if not 0 <= first < end <= chunk_count:
            raise Mp4Unsupported(f"{reader.path}: stsc runs out of order or past the chunks")
        runs.append((first, end, per_chunk))
    return runs


def _sample_sizes(reader: _Reader, box: _Box, sample_count: int) -> tuple[int, ...] | int:
    """Per-sample byte sizes from stsz/stz2, or the one size every sample has."""
    if sample_count > TABLE_ENTRY_LIMIT:
        raise Mp4Unsupported(f"{reader.path}: {sample_count} samples")
    head = _payload(reader, box, 12)
    if box.type == b"stsz":
        (uniform,) = _U32.unpack(head[4:8])
        if uniform:
            return uniform
        code, width = "I", 4
    else:  # stz2: 4-bit fields are not something a video muxer writes
        code, width = {8: ("B", 1), 16: ("H", 2), 32: ("I", 4)}.get(head[7], ("", 0))
        if not width:
            raise Mp4Unsupported(f"{reader.path}: stz2 field size {head[7]}")
    if box.end - box.body < 12 + sample_count * width:
        raise Mp4Unsupported(f"{reader.path}: {box.type.decode()} table too short")
    return struct.unpack(f">{sample_count}{code}", reader.read(box.body + 12, sample_count * width))


def _chunk_offsets(reader: _Reader, box: _Box) -> tuple[int, ...]:
    width, code = (8, "Q") if box.type == b"co64" else (4, "I")
    count, entries = _table(reader, box, width)
    return struct.unpack(f">{count}{code}", entries)


def _check_sample_data(
    reader: _Reader,
    offsets: tuple[int, ...],
    runs: list[tuple[int, int, int]],
    sizes: tuple[int, ...] | int,
) -> None:
    """Every sample has bytes, all inside the file. FFmpeg drops a sample it cannot read whole,
    so a table damaged to point past the end (or a cut the box sizes do not show) would make the
    sample count larger than the frames that come out."""
    file_size = reader.file_size
    if isinstance(sizes, int):
        for first, end, per_chunk in runs:
            extent = per_chunk * sizes
            if max(offsets[first:end]) + extent > file_size:
                raise Mp4Unsupported(f"{reader.path}: sample data past the end of the file")
        return
    if 0 in sizes:
        raise Mp4Unsupported(f"{reader.path}: empty samples")
    sample = 0
    for first, end, per_chunk in runs:
        for chunk in range(first, end):
            if offsets[chunk] + sum(sizes[sample : sample + per_chunk]) > file_size:
                raise Mp4Unsupported(f"{reader.path}: sample data past the end of the file")
            sample += per_chunk


def _check_edit_list(
    reader: _Reader,
    elst: _Box,
    stbl_boxes: list[_Box],
    movie_timescale: int,
    media_timescale: int,
    timing: _Timing,
) -> int:
    """Raise Mp4Unsupported unless FFmpeg's edit-list pass certainly keeps every sample; return
    the edit's ``media_time`` (media ticks), which FFmpeg subtracts from every pts and dts.

    FFmpeg (``mov_fix_index``) rescales the edit into media ticks
    (``end = media_time + round(segment_duration * media_timescale / movie_timescale)``), starts
    at the last keyframe whose decode time is <= ``media_time``, flags samples presented before
    ``media_time`` or at/after ``end`` as discard, and stops adding samples after a keyframe that
    reaches ``end``. Without composition offsets (no ctts, every delta > 0) presentation time ==
    decode time and increases, so one entry with ``media_time`` 0 and rate 1 keeps every sample
    exactly when sample 0 is a keyframe and the last sample starts before ``end``: no sample is
    presented outside [0, end), the start is sample 0, and only the last sample can reach ``end``.
    With composition offsets, ``_check_composition`` checks the same sample by sample.
    """
    version = _full_box_version(reader, elst, (0, 1))
    entry = _ELST_V1 if version == 1 else _ELST_V0
    count, entries = _table(reader, elst, entry.size)
    if count != 1:
        raise Mp4Unsupported(f"{reader.path}: edit list of {count} entries")
    segment_duration, media_time, rate_integer, rate_fraction = entry.unpack(entries)
    # av_rescale: round to nearest, halves away from zero (the values are >= 0 here)
    end = (
        media_time + (segment_duration * media_timescale + movie_timescale // 2) // movie_timescale
    )
    hides = (
        f"{reader.path}: edit list may hide frames (media_time {media_time}, segment_duration "
        f"{segment_duration}/{movie_timescale} s, rate {rate_integer}+{rate_fraction}/65536)"
    )
    if media_time < 0 or (rate_integer, rate_fraction) != (1, 0):
        raise Mp4Unsupported(hides)
    if timing.samples == 0:
        return media_time
    if timing.min_delta == 0:
        raise Mp4Unsupported(f"{reader.path}: edit list over samples of zero duration")
    ctts = _only(reader, stbl_boxes, b"ctts", "stbl")
    if ctts is None:
        last_start = timing.duration - timing.last_delta
        if media_time != 0 or not last_start < end:
            raise Mp4Unsupported(hides)
        if not _first_sample_is_keyframe(reader, stbl_boxes):
            raise Mp4Unsupported(
                f"{reader.path}: edit list over a track not starting on a keyframe"
            )
        return media_time
    _check_composition(reader, stbl_boxes, ctts, timing.samples, media_time, end, hides)
    return media_time


def _runs(entries: bytes, signed: bool = False) -> np.ndarray:
    """(count, value) run-length entries as an int64 (n, 2) array."""
    return np.frombuffer(entries, ">i4" if signed else ">u4").reshape(-1, 2).astype(np.int64)


def _check_composition(
    reader: _Reader,
    stbl_boxes: list[_Box],
    ctts: _Box,
    samples: int,
    media_time: int,
    end: int,
    hides: str,
) -> None:
    """The edit rule with composition offsets (B-frames), sample by sample (numpy, O(samples)).

    Sound when: presentation times are all in [media_time, end) and the first sample is presented
    at media_time (FFmpeg's start search lands on it); sample 0 is the only keyframe decoded at or
    before media_time (the start is sample 0); and FFmpeg's stop (after the second keyframe that
    reaches ``end``, waiting for trailing B-frames) is not before the last sample.
    """
    path = reader.path
    version = _full_box_version(reader, ctts, (0, 1))
    offset_runs = _runs(_table(reader, ctts, 8)[1], signed=version == 1)
    if int(offset_runs[:, 0].sum()) != samples:
        raise Mp4Unsupported(f"{path}: ctts does not cover the {samples} samples")
    if offset_runs.size and not (
        offset_runs[:, 1].min() >= 0 and offset_runs[:, 1].max() <= _INT32_MAX
    ):
        raise Mp4Unsupported(f"{path}: negative composition offsets (FFmpeg shifts decode times)")
    delta_runs = _runs(_table(reader, _need(reader, stbl_boxes, b"stts", "stbl"), 8)[1])
    deltas = np.repeat(delta_runs[:, 1], delta_runs[:, 0])
    decode_times = np.cumsum(deltas) - deltas
    presentation = decode_times + np.repeat(offset_runs[:, 1], offset_runs[:, 0])
    if presentation[0] != media_time or presentation.min() < media_time:
        raise Mp4Unsupported(hides)
    if presentation.max() >= end:
        raise Mp4Unsupported(hides)
    keyframes = _sync_samples(reader, stbl_boxes, samples)
    if keyframes[0] != 0:
        raise Mp4Unsupported(f"{path}: edit list over a track not starting on a keyframe")
    if len(keyframes) > 1 and decode_times[keyframes[1]] <= media_time:
        raise Mp4Unsupported(hides)
    reaching = keyframes[presentation[keyframes] + deltas[keyframes] >= end]
    if len(reaching) >= 2 and reaching[1] != samples - 1:
        raise Mp4Unsupported(hides)


def _sync_samples(reader: _Reader, stbl_boxes: list[_Box], samples: int) -> np.ndarray:
    """0-based keyframe indices from stss, sorted and unique. Without stss every sample is a
    keyframe; with composition offsets that is not a file this parser vouches for."""
    stss = _only(reader, stbl_boxes, b"stss", "stbl")
    if stss is None:
        raise Mp4Unsupported(f"{reader.path}: composition offsets without a sync sample table")
    numbers = np.frombuffer(_table(reader, stss, 4)[1], ">u4").astype(np.int64)
    if not numbers.size or numbers.min() < 1 or numbers.max() > samples:
        raise Mp4Unsupported(f"{reader.path}: stss names no keyframe or samples that do not exist")
    # sorted and deduplicated by hand: np.unique imports numpy.ma on first use (~35 ms)
    numbers = np.sort(numbers)
    return numbers[np.concatenate(([True], numbers[1:] != numbers[:-1]))] - 1


def _first_sample_is_keyframe(reader: _Reader, stbl_boxes: list[_Box]) -> bool:
    stss = _only(reader, stbl_boxes, b"stss", "stbl")
    if stss is None:
        return True  # no sync sample table: every sample is a keyframe
    _full_box_version(reader, stss, (0,))
    (count,) = _U32.unpack(_payload(reader, stss, 8)[4:8])
    return count > 0 and _U32.unpack(_payload(reader, stss, 12)[8:12])[0] == 1


def _video_track(
    reader: _Reader, trak: _Box, movie_timescale: int, samples: bool = False
) -> VideoTrack | VideoSamples | None:
    """The track's counts if its handler is 'vide', None for any other track; with ``samples``
    its ``VideoSamples`` (sample entry and every sample's place, time and sync flag)."""
    trak_boxes = _children(reader, trak)
    mdia = _need(reader, trak_boxes, b"mdia", "trak")
    mdia_boxes = _children(reader, mdia)
    hdlr = _need(reader, mdia_boxes, b"hdlr", "mdia")
    if _payload(reader, hdlr, 12)[8:12] != b"vide":
        return None
    track_id = 0
    tkhd = _only(reader, trak_boxes, b"tkhd", "trak")
    if tkhd is not None:
        offset = 12 if _full_box_version(reader, tkhd, (0, 1)) == 0 else 20
        (track_id,) = _U32.unpack(_payload(reader, tkhd, offset + 4)[offset : offset + 4])
    timescale, duration = _timescale_duration(reader, _need(reader, mdia_boxes, b"mdhd", "mdia"))
    minf = _need(reader, mdia_boxes, b"minf", "mdia")
    minf_boxes = _children(reader, minf)
    stbl = _need(reader, minf_boxes, b"stbl", "minf")
    stbl_boxes = _children(reader, stbl)
    description_count = _check_descriptions(
        reader,
        _need(reader, stbl_boxes, b"stsd", "stbl"),
        _need(reader, minf_boxes, b"dinf", "minf"),
    )

    sizes = [box for box in stbl_boxes if box.type in (b"stsz", b"stz2")]
    if len(sizes) != 1:
        raise Mp4Unsupported(f"{reader.path}: {len(sizes)} sample size boxes (stsz/stz2)")
    _full_box_version(reader, sizes[0], (0,))
    (sample_count,) = _U32.unpack(_payload(reader, sizes[0], 12)[8:12])

    timing = _sample_times(reader, _need(reader, stbl_boxes, b"stts", "stbl"))
    timed_samples = timing.samples
    offsets = [box for box in stbl_boxes if box.type in (b"stco", b"co64")]
    if len(offsets) != 1:
        raise Mp4Unsupported(f"{reader.path}: {len(offsets)} chunk offset boxes (stco/co64)")
    _full_box_version(reader, offsets[0], (0,))
    chunk_offsets = _chunk_offsets(reader, offsets[0])
    runs = _chunk_runs(
        reader, _need(reader, stbl_boxes, b"stsc", "stbl"), len(chunk_offsets), description_count
    )
    chunked_samples = sum((end - first) * per_chunk for first, end, per_chunk in runs)
    if not sample_count == timed_samples == chunked_samples:
        raise Mp4Unsupported(
            f"{reader.path}: sample table disagrees: stsz {sample_count}, stts {timed_samples}, "
            f"stsc/stco {chunked_samples} samples"
        )
    sample_sizes = _sample_sizes(reader, sizes[0], sample_count)
    _check_sample_data(reader, chunk_offsets, runs, sample_sizes)

    media_time: int | None = None  # None: no edit list
    edts = _only(reader, trak_boxes, b"edts", "trak")
    if edts is not None:
        edts_boxes = _children(reader, edts)
        elst = _only(reader, edts_boxes, b"elst", "edts")
        if elst is not None:
            media_time = _check_edit_list(
                reader, elst, stbl_boxes, movie_timescale, timescale, timing
            )
        elif edts_boxes:
            raise Mp4Unsupported(f"{reader.path}: edts without elst")
    track = VideoTrack(sample_count, timescale, duration, timing.duration, track_id)
    if not samples:
        return track
    return _samples(
        reader, track, stbl_boxes, description_count, chunk_offsets, runs, sample_sizes, media_time
    )


def _sample_entry(reader: _Reader, stbl_boxes: list[_Box]) -> SampleEntry:
    stsd = _need(reader, stbl_boxes, b"stsd", "stbl")
    descriptions = _children(reader, _Box(b"stsd", stsd.start, stsd.body + 8, stsd.end))
    if len(descriptions) != 1:
        raise Mp4Unsupported(f"{reader.path}: {len(descriptions)} sample descriptions")
    entry = descriptions[0]
    if entry.end - entry.body < _VISUAL_SAMPLE_ENTRY_SIZE:
        raise Mp4Unsupported(f"{reader.path}: visual sample entry too short")
    width, height = struct.unpack(">HH", reader.read(entry.body + 24, 4))
    children = _children(
        reader, _Box(entry.type, entry.start, entry.body + _VISUAL_SAMPLE_ENTRY_SIZE, entry.end)
    )
    config_type = _CONFIG_BOX_OF.get(entry.type)
    config_box = (
        _only(reader, children, config_type, entry.type.decode("latin-1"))
        if (config_type)
        else None
    )
    config = (
        b""
        if config_box is None
        else reader.read(config_box.body, config_box.end - config_box.body)
    )
    key = reader.read(entry.start, entry.body + _VISUAL_SAMPLE_ENTRY_SIZE - entry.start) + b"".join(
        reader.read(child.start, child.end - child.start)
        for child in children
        if child.type != b"btrt"
    )
    return SampleEntry(
        fourcc=entry.type,
        width=width,
        height=height,
        config_type=None if config_box is None else config_type,
        config=config,
        key=key,
    )


def _samples(
    reader: _Reader,
    track: VideoTrack,
    stbl_boxes: list[_Box],
    description_count: int,
    chunk_offsets: tuple[int, ...],
    runs: list[tuple[int, int, int]],
    sample_sizes: tuple[int, ...] | int,
    media_time: int | None,
) -> VideoSamples:
    """Every sample's offset, size, time and sync flag (vectorised over the run tables).

    Times are FFmpeg's packet timestamps: with an edit list (which ``_check_edit_list`` vouched
    hides nothing) FFmpeg shifts pts and dts by its ``media_time``, so the first presented frame
    is at pts 0 and, with B-frames, the first dts is minus the reorder delay."""
    path = reader.path
    if description_count != 1:
        raise Mp4Unsupported(f"{path}: {description_count} sample descriptions")
    ctts = _only(reader, stbl_boxes, b"ctts", "stbl")
    if ctts is not None and media_time is None:
        # Without an edit list FFmpeg keeps the raw times but may shift them by heuristics
        # (``dts_shift``, ``start_pad``) this parser does not model.
        raise Mp4Unsupported(f"{path}: composition offsets without an edit list")
    n = track.sample_count
    per_chunk = np.zeros(len(chunk_offsets), np.int64)
    for first, end, count in runs:
        per_chunk[first:end] = count
    sizes = (
        np.full(n, sample_sizes, np.int64)
        if isinstance(sample_sizes, int)
        else np.asarray(sample_sizes, np.int64)
    )
    # A sample's offset = its chunk's offset + the sizes of the samples before it in that chunk.
    chunk_of_sample = np.repeat(np.arange(len(chunk_offsets)), per_chunk)
    before = np.cumsum(sizes) - sizes
    chunk_first_sample = np.cumsum(per_chunk) - per_chunk
    offsets = (
        np.asarray(chunk_offsets, np.int64)[chunk_of_sample]
        + before
        - before[chunk_first_sample[chunk_of_sample]]
        if n
        else np.zeros(0, np.int64)
    )
    delta_runs = _runs(_table(reader, _need(reader, stbl_boxes, b"stts", "stbl"), 8)[1])
    durations = np.repeat(delta_runs[:, 1], delta_runs[:, 0])
    dts = np.cumsum(durations) - durations
    if ctts is None:
        pts = dts
    else:  # offsets >= 0 and covering every sample: checked by _check_composition
        version = _full_box_version(reader, ctts, (0, 1))
        offset_runs = _runs(_table(reader, ctts, 8)[1], signed=version == 1)
        pts = dts + np.repeat(offset_runs[:, 1], offset_runs[:, 0])
    if media_time:
        dts = dts - media_time
        pts = pts - media_time
    keyframes = np.ones(n, bool)
    stss = _only(reader, stbl_boxes, b"stss", "stbl")
    if stss is not None:
        numbers = np.frombuffer(_table(reader, stss, 4)[1], ">u4").astype(np.int64)
        if not numbers.size or numbers.min() < 1 or numbers.max() > n:
            # an empty stss makes FFmpeg guess keyframes with a parser: not a table fact
            raise Mp4Unsupported(f"{path}: stss names no keyframe or samples that do not exist")
        keyframes[:] = False
        keyframes[numbers - 1] = True
    return VideoSamples(
        track=track,
        entry=_sample_entry(reader, stbl_boxes),
        offsets=offsets,
        sizes=sizes,
        dts=dts,
        pts=pts,
        durations=durations,
        keyframes=keyframes,
    )


def _top_level_moov(reader: _Reader) -> _Box:
    """Walk every top-level box (truncation check) and return the single moov."""
    path = reader.path
    first = _box_at(reader, 0, reader.file_size) if reader.file_size >= 8 else None
    if first is None or first.type != b"ftyp":
        raise Mp4Unsupported(f"{path}: does not start with an ftyp box")
    moov: _Box | None = None
    offset = 0
    while offset < reader.file_size:
        box = _box_at(reader, offset, reader.file_size)
        if box.end > reader.file_size:
            raise Mp4Truncated(
                f"{path}: truncated MP4: box {box.type.decode('latin-1')!r} at byte {box.start} "
                f"needs {box.end - box.start} bytes, the file ends {reader.file_size - box.start} "
                "bytes after its start"
            )
        if box.to_end:
            raise Mp4Unsupported(f"{path}: box {box.type!r} runs to the end of the file")
        if box.type in (b"moof", b"mfra"):
            raise Mp4Unsupported(f"{path}: fragmented MP4 ({box.type.decode()} box)")
        if box.type == b"moov":
            if moov is not None:
                raise Mp4Unsupported(f"{path}: several moov boxes")
            moov = box
        offset = box.end
    if moov is None:
        raise Mp4Unsupported(f"{path}: no moov box")
    return moov


def _read_track(path: Path, samples: bool) -> VideoTrack | VideoSamples:
    path = Path(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        reader = _Reader(fd, path, os.fstat(fd).st_size)
        moov = _top_level_moov(reader)
        if moov.end - moov.start <= MOOV_READ_LIMIT:
            reader.hold(moov.start, moov.end)
        moov_boxes = _children(reader, moov)
        if any(box.type == b"mvex" for box in moov_boxes):
            raise Mp4Unsupported(f"{path}: fragmented MP4 (mvex box)")
        movie_timescale, _ = _timescale_duration(reader, _need(reader, moov_boxes, b"mvhd", "moov"))
        tracks = [
            track
            for box in moov_boxes
            if box.type == b"trak"
            and (track := _video_track(reader, box, movie_timescale, samples)) is not None
        ]
    finally:
        os.close(fd)
    if len(tracks) != 1:
        raise Mp4Unsupported(f"{path}: {len(tracks)} video tracks")
    return tracks[0]


def read_video_track(path: Path) -> VideoTrack:
    """The single video track's sample counts, checked to equal FFmpeg's decoded frame count.

    Raises ``Mp4Unsupported`` when that cannot be told from the boxes (ask FFmpeg),
    ``Mp4Truncated`` for a file cut short, ``OSError`` when the file cannot be read.
    """
    track = _read_track(path, samples=False)
    assert isinstance(track, VideoTrack)
    return track


def read_video_samples(path: Path) -> VideoSamples:
    """``read_video_track`` plus the sample entry and every sample (what a packet copy needs:
    ``eva.formats._v3_video`` splices the bytes at ``offsets``/``sizes`` without FFmpeg).

    Same checks and errors as ``read_video_track``; additionally ``Mp4Unsupported`` for several
    sample descriptions, or composition offsets (B-frames) without an edit list.

    Parsed tables are kept (``_SampleCache``) while the file's identity and times are unchanged:
    an export's validation and its writer read every MP4 once. The arrays are shared: read only.
    """
    key = _SampleCache.key(path)
    cached = _CACHE.get(key) if key is not None else None
    if cached is not None:
        return cached
    track = _read_track(path, samples=True)
    assert isinstance(track, VideoSamples)
    if key is not None:
        for array in (track.offsets, track.sizes, track.dts, track.pts, track.durations):
            array.flags.writeable = False
        track.keyframes.flags.writeable = False
        _CACHE.put(key, track)
    return track


class _SampleCache:
    """Recently parsed sample tables, keyed by the file's (path, device, inode, size, mtime,
    ctime): any write to the file or replacement of it changes the key. Bounded by the total
    number of samples held (``limit``; ~50 bytes each), least recently used out first."""

    def __init__(self, limit: int = 2_000_000) -> None:
        import threading
        from collections import OrderedDict

        self._items: OrderedDict[tuple[object, ...], VideoSamples] = OrderedDict()
        self._samples = 0
        self._limit = limit
        self._lock = threading.Lock()

    @staticmethod
    def key(path: Path) -> tuple[object, ...] | None:
        """None (not cached) for a file changed within ``SETTLED_NS``: file times come from a
        coarse clock (a few ms), so a rewrite in place right after the parse could keep them."""
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            return None
        if time.time_ns() - st.st_ctime_ns < SETTLED_NS:
            return None
        return (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def get(self, key: tuple[object, ...]) -> VideoSamples | None:
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
            return item

    def put(self, key: tuple[object, ...], item: VideoSamples) -> None:
        n = len(item.sizes)
        if n > self._limit:
            return
        with self._lock:
            if key in self._items:
                return
            self._items[key] = item
            self._samples += n
            while self._samples > self._limit:
                _, old = self._items.popitem(last=False)
                self._samples -= len(old.sizes)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._samples = 0


_CACHE = _SampleCache()


def count_video_samples(path: Path) -> int:
    """Frames of the single video track (see ``read_video_track`` for the errors)."""
    return read_video_track(path).sample_count
