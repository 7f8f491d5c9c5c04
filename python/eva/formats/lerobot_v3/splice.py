"""An MP4 with one video track spliced from byte ranges of other files (used by the v3 video shards).

A v3.0 video shard is a concatenation: every sample of every episode MP4, unchanged, with its
timestamps shifted. Muxing that packet by packet through FFmpeg costs ~10 us of Python and muxer
work per frame; here the shard's sample tables are written from the ones ``eva.dataset.mp4box``
parsed, and the sample bytes go from file to file in one read per run of adjacent samples
(typically one per episode), written past the page cache where the filesystem allows it, else
with ``eva.dataset.share.copy_range`` (``copy_file_range``).

The layout is what FFmpeg's MP4 muxer writes with ``movflags=faststart``: ``ftyp``, ``moov``
(``mvhd``; one ``trak`` with ``tkhd``, one edit, ``mdhd``, ``hdlr`` "vide", ``vmhd``, a
self-reference ``dref``, and ``stsd`` holding the first episode's sample entry, ``stts``, ``ctts``
when presentation and decode order differ, ``stss``, ``stsc``, ``stsz``, ``stco``/``co64``),
then ``mdat``. The edit starts at the first presentation time (``media_time``), so a reader sees
the same pts and dts as it would in FFmpeg's output (the tests compare the two packet by packet
and frame by frame). The movie timescale is the media's, so the edit is exact.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eva.dataset import fsafe, mp4box
from eva.dataset.share import copy_range
from eva.formats._direct_io import SequentialWriter

__all__ = ["SpliceError", "SplicedMp4"]

_U32_MAX = (1 << 32) - 1
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_IDENTITY_MATRIX = struct.pack(">9I", 0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000)
_BRANDS = {b"avc1": b"avc1", b"avc3": b"avc1", b"av01": b"av01"}


class SpliceError(ValueError):
    """A source cannot be spliced (a file shrank, timestamps out of range)."""


@dataclass(frozen=True)
class _SampleTables:
    """The shard's samples in decode order, as its sample tables hold them."""

    sizes: np.ndarray
    dts: np.ndarray
    pts: np.ndarray
    keys: np.ndarray
    deltas: np.ndarray  # each sample's decode duration (stts)
    chunk_samples: np.ndarray  # samples per chunk: one chunk per run of adjacent samples


def _create(path: Path) -> int:
    """A new file at ``path`` (truncated if it exists, never through a link), for writing."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, 0o644)


def _box(kind: bytes, *payload: bytes) -> bytes:
    body = b"".join(payload)
    if len(body) + 8 > _U32_MAX:
        raise SpliceError(f"{kind.decode()} box too large")
    return struct.pack(">I4s", len(body) + 8, kind) + body


def _full_box(kind: bytes, version: int, flags: int, *payload: bytes) -> bytes:
    return _box(kind, struct.pack(">I", (version << 24) | flags), *payload)


def _runs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Run-length encoding: (counts, values) of the runs of equal consecutive values."""
    starts = np.flatnonzero(np.concatenate(([True], values[1:] != values[:-1])))
    counts = np.diff(np.append(starts, len(values)))
    return counts, values[starts]


def _pairs(first: np.ndarray, second: np.ndarray, second_type: str) -> bytes:
    """(u32, ``second_type``) pairs, big-endian: the entries of stts and ctts."""
    packed = np.empty(len(first), dtype=[("a", ">u4"), ("b", second_type)])
    packed["a"] = first
    packed["b"] = second
    return packed.tobytes()


def _mvhd(timescale: int, duration: int, wide: bool) -> bytes:
    """The movie header (its timescale the media's, so the edit is exact; next track ID 2)."""
    if wide:
        times = struct.pack(">QQIQ", 0, 0, timescale, duration)
    else:
        times = struct.pack(">IIII", 0, 0, timescale, duration)
    rate_volume = struct.pack(">IH10x", 0x10000, 0x100)
    next_track = struct.pack(">I", 2)
    return _full_box(
        b"mvhd", int(wide), 0, times, rate_volume, _IDENTITY_MATRIX, bytes(24), next_track
    )


def _tkhd(entry: mp4box.SampleEntry, duration: int, wide: bool) -> bytes:
    """Track 1's header, enabled and in the movie (flags 3), sized as the sample entry."""
    if wide:
        times = struct.pack(">QQIIQ", 0, 0, 1, 0, duration)
    else:
        times = struct.pack(">IIIII", 0, 0, 1, 0, duration)
    layer_volume = struct.pack(">8xhhH2x", 0, 0, 0)
    size = struct.pack(">II", entry.width << 16, entry.height << 16)
    return _full_box(b"tkhd", int(wide), 3, times, layer_volume, _IDENTITY_MATRIX, size)


def _edts(duration: int, media_time: int, wide: bool) -> bytes:
    """One edit, rate 1, from the first presentation time (``media_time``) for ``duration``."""
    if wide:
        entry = struct.pack(">QqhH", duration, media_time, 1, 0)
    else:
        entry = struct.pack(">IihH", duration, media_time, 1, 0)
    return _box(b"edts", _full_box(b"elst", int(wide), 0, struct.pack(">I", 1), entry))


def _mdhd(timescale: int, duration: int, wide: bool) -> bytes:
    if wide:
        times = struct.pack(">QQIQ", 0, 0, timescale, duration)
    else:
        times = struct.pack(">IIII", 0, 0, timescale, duration)
    return _full_box(b"mdhd", int(wide), 0, times, struct.pack(">HH", 0x55C4, 0))  # "und"


_HDLR = _full_box(b"hdlr", 0, 0, struct.pack(">I4s12x", 0, b"vide"), b"VideoHandler\x00")
_VMHD = _full_box(b"vmhd", 0, 1, bytes(8))
# A self-reference: the samples are in this file.
_DINF = _box(b"dinf", _full_box(b"dref", 0, 0, struct.pack(">I", 1), _full_box(b"url ", 0, 1)))


def _sample_entry(entry: mp4box.SampleEntry) -> bytes:
    """The entry's box (``key``: header, fields and children but ``btrt``) with its size fixed."""
    key = bytearray(entry.key)
    size = struct.unpack(">I", key[:4])[0]
    if size == 1:  # 64-bit size in the header
        key[8:16] = struct.pack(">Q", len(key))
    else:
        key[:4] = struct.pack(">I", len(key))
    return bytes(key)


def _open_source(source: fsafe.Readable) -> int:
    """A run's file: a dataset's episode MP4 opened beneath its root (no link at any component,
    whatever the path named when the sample table was read), or the shard's own spill file."""
    if isinstance(source, fsafe.FileBeneath):
        return source.open()
    return os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)


class SplicedMp4:
    """One shard being assembled at ``path``: ``add`` episodes' sample ranges (or packets, for
    sources the box parser does not vouch for), then ``close(end)`` writes the file."""

    def __init__(self, path: Path, entry: mp4box.SampleEntry, timescale: int) -> None:
        self.path = Path(path)
        self.entry = entry
        self.timescale = int(timescale)
        self._sizes: list[np.ndarray] = []
        self._dts: list[np.ndarray] = []
        self._pts: list[np.ndarray] = []
        self._keys: list[np.ndarray] = []
        # (source, offset, length, samples) per run of adjacent samples, in decode order; a
        # dataset's file is opened beneath its root again when the shard is written
        self._runs: list[tuple[fsafe.Readable, int, int, int]] = []
        self._last_duration = 1
        self._spill: Path = self.path.with_name(self.path.name + ".spill")
        self._spill_fd: int | None = None
        self._spill_size = 0
        self._pending: list[tuple[int, int, bool, int]] = []  # spilled packets: dts, pts, key, size

    # ---- input ---------------------------------------------------------------------------

    def add_samples(
        self,
        source: fsafe.Readable,
        offsets: np.ndarray,
        sizes: np.ndarray,
        dts: np.ndarray,
        pts: np.ndarray,
        keyframes: np.ndarray,
        last_duration: int,
    ) -> None:
        """Samples of ``source`` at ``offsets``/``sizes``, with shard timestamps, in decode
        order."""
        self._flush_spilled()
        n = len(sizes)
        if n == 0:
            return
        offsets = np.asarray(offsets, np.int64)
        sizes = np.asarray(sizes, np.int64)
        self._sizes.append(sizes)
        self._dts.append(np.asarray(dts, np.int64))
        self._pts.append(np.asarray(pts, np.int64))
        self._keys.append(np.asarray(keyframes, bool))
        self._last_duration = max(int(last_duration), 1)
        breaks = np.flatnonzero(offsets[1:] != offsets[:-1] + sizes[:-1]) + 1
        starts = np.concatenate(([0], breaks))
        stops = np.append(breaks, n)
        ends = np.cumsum(sizes)
        for a, b in zip(starts.tolist(), stops.tolist(), strict=True):
            length = int(ends[b - 1] - (ends[a - 1] if a else 0))
            self._runs.append((source, int(offsets[a]), length, b - a))

    def add_packet(self, data: bytes, dts: int, pts: int, keyframe: bool, duration: int) -> None:
        """One packet's bytes (a demuxed source): kept in a spill file beside the shard."""
        if self._spill_fd is None:
            self._spill_fd = _create(self._spill)
        view = memoryview(data)
        while view:
            view = view[os.write(self._spill_fd, view) :]
        self._pending.append((int(dts), int(pts), bool(keyframe), len(data)))
        self._last_duration = max(int(duration), 1)

    def _flush_spilled(self) -> None:
        if not self._pending:
            return
        arr = np.array([(d, p, k, s) for d, p, k, s in self._pending], np.int64)
        self._dts.append(arr[:, 0])
        self._pts.append(arr[:, 1])
        self._keys.append(arr[:, 2].astype(bool))
        self._sizes.append(arr[:, 3])
        length = int(arr[:, 3].sum())
        self._runs.append((self._spill, self._spill_size, length, len(arr)))
        self._spill_size += length
        self._pending = []

    # ---- output --------------------------------------------------------------------------

    def close(self, end: int) -> None:
        """Write the shard; ``end`` is the presentation end of its last episode (shard ticks)."""
        self._flush_spilled()
        if self._spill_fd is not None:
            os.close(self._spill_fd)
            self._spill_fd = None
        try:
            if not self._sizes:
                raise SpliceError(f"{self.path}: no samples")
            self._write(end)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._spill)

    def abort(self) -> None:
        if self._spill_fd is not None:
            os.close(self._spill_fd)
            self._spill_fd = None
        for path in (self._spill, self.path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def _tables(self) -> _SampleTables:
        """Every added sample's table entries, checked to fit the boxes' fields."""
        sizes = np.concatenate(self._sizes)
        dts = np.concatenate(self._dts)
        if sizes.max() > _U32_MAX:
            raise SpliceError(f"{self.path}: a sample of {int(sizes.max())} bytes")
        deltas = np.append(np.diff(dts), self._last_duration)
        if deltas.min() <= 0 or deltas.max() > _U32_MAX:
            raise SpliceError(f"{self.path}: decode timestamps are not increasing")
        return _SampleTables(
            sizes=sizes,
            dts=dts,
            pts=np.concatenate(self._pts),
            keys=np.concatenate(self._keys),
            deltas=deltas,
            chunk_samples=np.array([r[3] for r in self._runs], np.int64),
        )

    def _write(self, end: int) -> None:
        tables = self._tables()
        payload = int(tables.sizes.sum())
        chunk_bytes = np.array([r[2] for r in self._runs], np.int64)
        ftyp = self._ftyp()
        large = len(ftyp) + 16 + payload + 64 * len(tables.sizes) + (1 << 20) > _U32_MAX
        mdat_header = 16 if large else 8
        # The moov's size does not depend on the chunk offsets it holds: made once to learn it.
        probe = self._moov(tables, end, np.zeros(len(chunk_bytes), np.int64), large)
        data_start = len(ftyp) + len(probe) + mdat_header
        offsets = data_start + np.concatenate(([0], np.cumsum(chunk_bytes)[:-1]))
        moov = self._moov(tables, end, offsets, large)
        assert len(moov) == len(probe)
        if large:
            mdat = struct.pack(">I4sQ", 1, b"mdat", payload + 16)
        else:
            mdat = struct.pack(">I4s", payload + 8, b"mdat")
        if self._write_direct(ftyp + moov + mdat):
            return
        fd = _create(self.path)
        try:
            head = memoryview(ftyp + moov + mdat)
            while head:
                head = head[os.write(fd, head) :]
            self._copy_runs(fd)
        finally:
            os.close(fd)

    def _write_direct(self, head: bytes) -> bool:
        """The shard written past the page cache: the sample bytes read into an aligned buffer
        and written a buffer at a time with ``O_DIRECT``. ``copy_file_range`` fills a new cache
        page per 4 KiB instead (the ranges are not block-aligned, so no filesystem can share
        their blocks): 0.7-3.7 s of system time per GiB on the project's VMs, against 0.06-0.08
        s direct. False when the filesystem refuses ``O_DIRECT`` (nothing written: the caller
        copies in the kernel)."""
        out = SequentialWriter(self.path)
        if not out.direct:
            out.abandon()
            return False
        try:
            out.write(head)
            for src_fd, path, offset, length in self._run_sources():
                try:
                    out.copy_from(src_fd, offset, length)
                except EOFError:
                    raise SpliceError(f"{path}: file shrank while being copied") from None
        except BaseException:
            out.abandon()
            raise
        out.close()
        return True

    def _run_sources(self) -> Iterator[tuple[int, fsafe.Readable, int, int]]:
        """(open source file, its name, offset, length) of every run, in order; one open file
        at a time, closed when the next run is in another file or the iteration ends."""
        src_fd = -1
        src_path: fsafe.Readable | None = None
        try:
            for path, offset, length, _ in self._runs:
                if path != src_path:
                    if src_fd >= 0:
                        os.close(src_fd)
                        src_fd = -1
                    src_fd = _open_source(path)
                    src_path = path
                yield src_fd, path, offset, length
        finally:
            if src_fd >= 0:
                os.close(src_fd)

    def _copy_runs(self, out: int) -> None:
        for src_fd, path, offset, length in self._run_sources():
            if copy_range(src_fd, out, offset, length) < length:
                raise SpliceError(f"{path}: file shrank while being copied")

    # ---- boxes ---------------------------------------------------------------------------

    def _ftyp(self) -> bytes:
        brands = [b"isom", b"iso2"]
        extra = _BRANDS.get(self.entry.fourcc)
        if extra:
            brands.append(extra)
        brands.append(b"mp41")
        return _box(b"ftyp", b"isom", struct.pack(">I", 0x200), *brands)

    def _moov(
        self, tables: _SampleTables, end: int, chunk_offsets: np.ndarray, large: bool
    ) -> bytes:
        first_pts = int(tables.pts.min())
        media_duration = int(tables.deltas.sum())
        media_time = first_pts - int(tables.dts[0])  # raw time of the first presented sample
        edit_duration = int(end - first_pts)
        if edit_duration <= 0 or media_time < 0:
            raise SpliceError(f"{self.path}: presentation times out of order")
        wide = max(media_duration, edit_duration, media_time) > _U32_MAX
        minf = _box(b"minf", _VMHD, _DINF, self._stbl(tables, chunk_offsets, large))
        mdia = _box(b"mdia", _mdhd(self.timescale, media_duration, wide), _HDLR, minf)
        tkhd = _tkhd(self.entry, edit_duration, wide)
        trak = _box(b"trak", tkhd, _edts(edit_duration, media_time, wide), mdia)
        return _box(b"moov", _mvhd(self.timescale, edit_duration, wide), trak)

    def _stbl(self, tables: _SampleTables, chunk_offsets: np.ndarray, large: bool) -> bytes:
        sizes = tables.sizes
        stsz = _full_box(
            b"stsz", 0, 0, struct.pack(">II", 0, len(sizes)), sizes.astype(">u4").tobytes()
        )
        return _box(
            b"stbl",
            _full_box(b"stsd", 0, 0, struct.pack(">I", 1), _sample_entry(self.entry)),
            self._stts(tables.deltas),
            self._ctts(tables.pts - tables.dts),
            self._stss(tables.keys),
            self._stsc(tables.chunk_samples),
            stsz,
            self._chunk_offsets(chunk_offsets, large),
        )

    @staticmethod
    def _stts(deltas: np.ndarray) -> bytes:
        counts, values = _runs(deltas)
        return _full_box(
            b"stts", 0, 0, struct.pack(">I", len(counts)), _pairs(counts, values, ">u4")
        )

    def _ctts(self, offsets: np.ndarray) -> bytes:
        if not offsets.any():
            return b""
        if offsets.min() < _I32_MIN or offsets.max() > _I32_MAX:
            raise SpliceError(f"{self.path}: composition offsets out of range")
        signed = bool(offsets.min() < 0)
        counts, values = _runs(offsets)
        entries = _pairs(counts, values, ">i4" if signed else ">u4")
        return _full_box(b"ctts", 1 if signed else 0, 0, struct.pack(">I", len(counts)), entries)

    @staticmethod
    def _stss(keys: np.ndarray) -> bytes:
        if keys.all():
            return b""
        numbers = (np.flatnonzero(keys) + 1).astype(">u4")
        return _full_box(b"stss", 0, 0, struct.pack(">I", len(numbers)), numbers.tobytes())

    @staticmethod
    def _stsc(chunk_samples: np.ndarray) -> bytes:
        starts = np.flatnonzero(np.concatenate(([True], chunk_samples[1:] != chunk_samples[:-1])))
        entries = np.empty(len(starts), dtype=[("a", ">u4"), ("b", ">u4"), ("c", ">u4")])
        entries["a"] = starts + 1
        entries["b"] = chunk_samples[starts]
        entries["c"] = 1
        return _full_box(b"stsc", 0, 0, struct.pack(">I", len(entries)), entries.tobytes())

    @staticmethod
    def _chunk_offsets(offsets: np.ndarray, large: bool) -> bytes:
        if large:
            return _full_box(
                b"co64", 0, 0, struct.pack(">I", len(offsets)), offsets.astype(">u8").tobytes()
            )
        return _full_box(
            b"stco", 0, 0, struct.pack(">I", len(offsets)), offsets.astype(">u4").tobytes()
        )
