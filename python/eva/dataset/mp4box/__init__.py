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

Layers: ``boxes`` (box headers and tables, the errors), ``track`` (the sample-table model and
its checks); this module walks the top level, finds the video track and keeps recently parsed
sample tables.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from eva.dataset.fsafe import Readable, name_of, open_readable
from eva.dataset.identity import fd_identity
from eva.dataset.mp4box.boxes import (
    TABLE_ENTRY_LIMIT,
    Box,
    BoxReader,
    Mp4Error,
    Mp4Truncated,
    Mp4Unsupported,
    box_at,
    child_boxes,
    need_box,
    timescale_duration,
)
from eva.dataset.mp4box.track import (
    CONFIG_BOXES,
    SampleEntry,
    VideoSamples,
    VideoTrack,
    video_track_of,
)

__all__ = [
    "CONFIG_BOXES",
    "MOOV_READ_LIMIT",
    "SETTLED_NS",
    "TABLE_ENTRY_LIMIT",
    "Mp4Error",
    "Mp4Truncated",
    "Mp4Unsupported",
    "SampleEntry",
    "VideoSamples",
    "VideoTrack",
    "count_video_samples",
    "read_video_samples",
    "read_video_track",
]

# A file changed less than this long ago is parsed again on every read (see _SampleCache.key).
SETTLED_NS = 100_000_000
# moov boxes up to this size are read with one pread and parsed in memory (a 30 fps hour of
# video has ~0.5 MB of sample tables); larger ones are walked header by header.
MOOV_READ_LIMIT = 4 << 20


def _top_level_moov(reader: BoxReader) -> Box:
    """Walk every top-level box (truncation check) and return the single moov."""
    path = reader.path
    first = box_at(reader, 0, reader.file_size) if reader.file_size >= 8 else None
    if first is None or first.type != b"ftyp":
        raise Mp4Unsupported(f"{path}: does not start with an ftyp box")
    moov: Box | None = None
    offset = 0
    while offset < reader.file_size:
        box = box_at(reader, offset, reader.file_size)
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


def _read_track(fd: int, path: Path, samples: bool) -> VideoTrack | VideoSamples:
    """The video track of the open file ``fd`` (``path`` names it in messages)."""
    reader = BoxReader(fd, path, os.fstat(fd).st_size)
    moov = _top_level_moov(reader)
    if moov.end - moov.start <= MOOV_READ_LIMIT:
        reader.hold(moov.start, moov.end)
    moov_boxes = child_boxes(reader, moov)
    if any(box.type == b"mvex" for box in moov_boxes):
        raise Mp4Unsupported(f"{path}: fragmented MP4 (mvex box)")
    movie_timescale, _ = timescale_duration(reader, need_box(reader, moov_boxes, b"mvhd", "moov"))
    tracks = [
        track
        for box in moov_boxes
        if box.type == b"trak"
        and (track := video_track_of(reader, box, movie_timescale, samples)) is not None
    ]
    if len(tracks) != 1:
        raise Mp4Unsupported(f"{path}: {len(tracks)} video tracks")
    return tracks[0]


def read_video_track(source: Readable) -> VideoTrack:
    """The single video track's sample counts, checked to equal FFmpeg's decoded frame count.

    ``source``: a path, or a dataset file opened beneath its root (``fsafe.FileBeneath``); it is
    opened once and parsed from that fd. Raises ``Mp4Unsupported`` when the count cannot be told
    from the boxes (ask FFmpeg), ``Mp4Truncated`` for a file cut short, ``OSError`` when the file
    cannot be read, ``DatasetError`` for a link on its way (``FileBeneath``).
    """
    fd = open_readable(source)
    try:
        track = _read_track(fd, name_of(source), samples=False)
    finally:
        os.close(fd)
    assert isinstance(track, VideoTrack)
    return track


def read_video_samples(source: Readable) -> VideoSamples:
    """``read_video_track`` plus the sample entry and every sample (what a packet copy needs:
    ``eva.formats._v3_video`` splices the bytes at ``offsets``/``sizes`` without FFmpeg).

    Same checks and errors as ``read_video_track``; additionally ``Mp4Unsupported`` for several
    sample descriptions, or composition offsets (B-frames) without an edit list.

    Parsed tables are kept (``_SampleCache``) while the identity and times of the file opened
    are unchanged: an export's validation and its writer read every MP4 once. The arrays are
    shared: read only.
    """
    path = name_of(source)
    fd = open_readable(source)
    try:
        key = _SampleCache.key(fd, path)
        if key is None:
            return _parse_samples(fd, path)
        return _CACHE.get_or_parse(key, lambda: _parse_samples(fd, path))
    finally:
        os.close(fd)


def _parse_samples(fd: int, path: Path) -> VideoSamples:
    track = _read_track(fd, path, samples=True)
    assert isinstance(track, VideoSamples)
    for array in (track.offsets, track.sizes, track.dts, track.pts, track.durations):
        array.flags.writeable = False
    track.keyframes.flags.writeable = False
    return track


class _SampleCache:
    """Recently parsed sample tables, keyed by the file's (path, device, inode, size, mtime,
    ctime): any write to the file or replacement of it changes the key. Bounded by the total
    number of samples held (``limit``; ~50 bytes each), least recently used out first. A file
    being parsed on one thread is waited for by another that asks for it (an export's planner
    and validation's inspection threads ask for the same files at the same time), not parsed
    twice."""

    def __init__(self, limit: int = 2_000_000) -> None:
        import threading
        from collections import OrderedDict

        self._items: OrderedDict[tuple[object, ...], VideoSamples] = OrderedDict()
        self._samples = 0
        self._limit = limit
        self._lock = threading.Lock()
        self._parsing: dict[tuple[object, ...], threading.Event] = {}

    def get_or_parse(
        self, key: tuple[object, ...], parse: Callable[[], VideoSamples]
    ) -> VideoSamples:
        """The cached table of ``key``, else ``parse()``'s (kept), parsed by one thread at a
        time: a caller that finds it being parsed waits, then takes the result, or parses
        itself when that parse failed (and so raises its error)."""
        import threading

        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
                return item
            busy = self._parsing.get(key)
            if busy is None:
                done = self._parsing[key] = threading.Event()
        if busy is not None:
            busy.wait()
            with self._lock:
                item = self._items.get(key)
            # None: the other parse failed (its error is ours too) or its table was not kept
            return item if item is not None else parse()
        try:
            item = parse()
            self.put(key, item)
            return item
        finally:
            with self._lock:
                del self._parsing[key]
            done.set()

    @staticmethod
    def key(fd: int, path: Path) -> tuple[object, ...] | None:
        """The open file's key; None (not cached) for a file changed within ``SETTLED_NS``: file
        times come from a coarse clock (a few ms), so a rewrite in place right after the parse
        could keep them."""
        identity = fd_identity(fd)
        if time.time_ns() - identity[2] < SETTLED_NS:
            return None
        return (str(path), *identity)

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


def count_video_samples(source: Readable) -> int:
    """Frames of the single video track (see ``read_video_track`` for the errors)."""
    return read_video_track(source).sample_count
