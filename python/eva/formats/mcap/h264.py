"""An MP4's H.264 samples as Annex B access units, for ``foxglove.CompressedVideo`` messages.

An MP4 (``avc1``/``avc3`` with an ``avcC`` box) stores each frame as a run of NAL units, each
after its big-endian length (1, 2 or 4 bytes, ``avcC``'s ``lengthSizeMinusOne``), and the
sequence and picture parameter sets (SPS/PPS) once, in ``avcC``. Foxglove wants each message to
be one frame in Annex B form (every NAL unit after a ``00 00 00 01`` start code), every keyframe
carrying its SPS/PPS, and no B-frames (its decoder does not reorder frames). So:

- a track is carried only when it is H.264 and each sample is presented in decode order with no
  composition offset (``carry_problem`` says why not, and the caller decodes it instead);
- the samples are read in windows of ``WINDOW`` bytes (one ``pread`` for many frames); with
  4-byte lengths each length is overwritten by a start code in the window itself (same size), so
  a frame reaches the MCAP chunk with one copy; 1- and 2-byte lengths are rebuilt;
- a keyframe without an SPS of its own gets ``avcC``'s SPS/PPS in front (eva's recorder repeats
  them in-band on every keyframe, so eva's own videos pass unchanged).

The in-place conversion of a window runs in the native ``mcap_chunk`` kernel
(``annexb_in_place_batch`` is its numpy reference, and words its errors).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from eva._native import load
from eva.dataset.errors import DatasetError
from eva.dataset.fsafe import Readable, open_readable
from eva.dataset.mp4box import VideoSamples
from eva.formats.mcap.records import Bytes, SpareBuffers

_native = load("mcap_chunk")

# Sample entries whose samples are H.264 NAL units framed by avcC's length size.
H264_FOURCCS = (b"avc1", b"avc3")
START_CODE = b"\x00\x00\x00\x01"
NAL_SPS = 7
_START_CODE = np.frombuffer(START_CODE, np.uint8)
_LENGTH_BYTES = np.arange(4)
# Bytes of samples read per pread (a sample larger than this is read alone).
WINDOW = 4 << 20
# Read windows of finished files, for the next file's cameras (no page faults on each read).
spare_windows = SpareBuffers(keep=4)


@dataclass(frozen=True)
class AvcConfig:
    """What ``avcC`` says about the samples: the NAL length size and the parameter sets."""

    length_size: int
    parameter_sets: bytes  # every SPS, then every PPS, each after a start code


def parse_avcc(config: bytes) -> AvcConfig:
    """The ``avcC`` payload (ISO/IEC 14496-15 AVCDecoderConfigurationRecord); ValueError when
    it does not parse."""
    if len(config) < 7 or config[0] != 1:
        raise ValueError("avcC is not an AVCDecoderConfigurationRecord version 1")
    length_size = (config[4] & 3) + 1
    if length_size == 3:
        raise ValueError("avcC NAL length size 3 is reserved")
    units: list[bytes] = []
    pos = 5
    for count_mask in (0x1F, 0xFF):  # SPS count (5 bits), then PPS count (8 bits)
        if pos >= len(config):
            raise ValueError("avcC ends before its parameter sets")
        count = config[pos] & count_mask
        pos += 1
        for _ in range(count):
            size = int.from_bytes(config[pos : pos + 2], "big")
            unit = config[pos + 2 : pos + 2 + size]
            if len(unit) != size or size == 0:
                raise ValueError("avcC parameter set runs past the box")
            units.append(unit)
            pos += 2 + size
    if not any(unit[0] & 0x1F == NAL_SPS for unit in units):
        raise ValueError("avcC has no SPS")
    return AvcConfig(length_size, b"".join(START_CODE + unit for unit in units))


def carry_problem(samples: VideoSamples) -> str | None:
    """Why this track cannot be carried as Foxglove H.264 (None: it can)."""
    entry = samples.entry
    if entry.fourcc not in H264_FOURCCS or entry.config_type != b"avcC":
        return f"codec {entry.fourcc.decode('latin-1')!r} is not H.264 (Foxglove plays H.264)"
    if not np.array_equal(samples.pts, samples.dts):
        return "B-frames (frames presented out of decode order), which Foxglove cannot play"
    try:
        parse_avcc(entry.config)
    except ValueError as e:
        return str(e)
    return None


def annexb_in_place(window: bytearray, start: int, end: int) -> bool:
    """Overwrite the 4-byte NAL lengths of the sample ``window[start:end]`` with start codes;
    return whether it holds an SPS. ValueError when the lengths do not add up."""
    has_sps = False
    pos = start
    while pos < end:
        size = int.from_bytes(window[pos : pos + 4], "big")
        if size == 0 or pos + 4 + size > end:
            raise ValueError(f"NAL unit of {size} bytes at sample byte {pos - start}")
        has_sps = has_sps or window[pos + 4] & 0x1F == NAL_SPS
        window[pos : pos + 4] = START_CODE
        pos += 4 + size
    return has_sps


def _annexb_copy(sample: memoryview, length_size: int) -> tuple[bytes, bool]:
    """A sample with 1- or 2-byte NAL lengths as Annex B bytes, and whether it holds an SPS."""
    out = bytearray()
    has_sps = False
    pos = 0
    while pos < len(sample):
        size = int.from_bytes(sample[pos : pos + length_size], "big")
        unit = sample[pos + length_size : pos + length_size + size]
        if size == 0 or len(unit) != size:
            raise ValueError(f"NAL unit of {size} bytes at sample byte {pos}")
        has_sps = has_sps or unit[0] & 0x1F == NAL_SPS
        out += START_CODE
        out += unit
        pos += length_size + size
    return bytes(out), has_sps


def annexb_in_place_batch(window: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``annexb_in_place`` of every sample ``window[starts[i]:ends[i]]`` at once (one numpy
    step per NAL unit position, not per unit); return whether each holds an SPS. ValueError
    (naming the sample's place in ``starts``, as ``(index, message)`` args) for the first sample
    whose lengths do not add up."""
    pos = np.asarray(starts, np.int64).copy()
    ends = np.asarray(ends, np.int64)
    limit = len(window)
    has_sps = np.zeros(len(pos), bool)
    failed: dict[int, str] = {}
    active = np.flatnonzero(pos < ends)
    while active.size:
        p, e = pos[active], ends[active]
        if int(p.max()) + 4 <= limit:
            heads = p[:, None] + _LENGTH_BYTES
            size = window[heads].view(">u4")[:, 0].astype(np.int64)
        else:  # a length cut off by the window reads as its bytes so far (as a slice does)
            size = np.zeros(active.size, np.int64)
            for i in range(4):
                inside = p + i < limit
                byte = window[np.minimum(p + i, limit - 1)].astype(np.int64)
                size = np.where(inside, size << 8 | byte, size)
        ok = (size != 0) & (p + 4 + size <= e)
        if not ok.all():
            for k in np.flatnonzero(~ok).tolist():
                sample = int(active[k])
                failed[sample] = (
                    f"NAL unit of {size[k]} bytes at sample byte {p[k] - starts[sample]}"
                )
            active, p, size = active[ok], p[ok], size[ok]
        has_sps[active] |= window[p + 4] & 0x1F == NAL_SPS
        window[p[:, None] + _LENGTH_BYTES] = _START_CODE
        pos[active] = nxt = p + 4 + size
        active = active[nxt < ends[active]]
    if failed:
        first = min(failed)
        raise ValueError(first, failed[first])
    return has_sps


def annexb_window(window: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``annexb_in_place_batch``, by the native kernel unless ``EVA_PUREPYTHON=1``; a window
    whose lengths do not add up is left to the reference (after the kernel: the caller reads
    the window again), which words the error."""
    if _native is None:
        return annexb_in_place_batch(window, starts, ends)
    has_sps = np.empty(len(starts), np.uint8)
    if _native.annexb_in_place(window, starts, ends, has_sps) >= 0:
        raise _Damaged
    return has_sps.view(bool)


class _Damaged(Exception):
    """The native conversion found a sample whose NAL lengths do not add up."""


@dataclass(frozen=True)
class UnitBatch:
    """Consecutive samples of a track as Annex B access units: frame *i*'s data is
    ``prefix`` (``avcC``'s SPS/PPS) where ``prefixed[i]``, then unit *i*, ``data[starts[i] :
    starts[i] + sizes[i]]`` (``data``: the reader's window, valid until its next ``read``)."""

    data: np.ndarray  # uint8
    starts: np.ndarray  # int64
    sizes: np.ndarray  # int64 bytes of each unit (without the prefix)
    prefixed: np.ndarray  # bool: a keyframe without an SPS of its own
    prefix: bytes

    @property
    def units(self) -> list[Bytes]:
        """Each unit, as a view of ``data``."""
        view = self.data.data
        ends = (self.starts + self.sizes).tolist()
        return [view[a:b] for a, b in zip(self.starts.tolist(), ends, strict=True)]


class AccessUnitReader:
    """Batches of a carried track's samples, in decode order, as Annex B access units: one
    ``pread`` per run of samples adjacent in the file, the NAL lengths turned into start codes
    in the read window itself (4-byte lengths; 1- and 2-byte ones are rebuilt sample by
    sample). ``DatasetError`` (naming ``label``) for a file shorter than its sample table or a
    sample whose NAL lengths do not add up."""

    def __init__(self, path: Readable, samples: VideoSamples, label: str) -> None:
        self.path, self.samples, self.label = path, samples, label
        self.config = parse_avcc(samples.entry.config)
        sizes = samples.sizes
        # At most WINDOW bytes (a short video gets a buffer of its own size), never smaller
        # than the largest sample.
        # (A spare window of the previous file may be larger: batches are then longer.)
        largest = int(sizes.max()) if len(sizes) else 0
        self.window = spare_windows.take(max(largest, min(WINDOW, int(sizes.sum()))), True)
        self.fd = open_readable(path)  # a dataset's MP4: beneath its root, no link followed

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            spare_windows.give_back([self.window])

    def batch_end(self, first: int) -> int:
        """The end of the longest batch from ``first`` whose samples fit the window together."""
        sizes = self.samples.sizes
        reach = np.cumsum(sizes[first:])
        return first + max(1, int(np.searchsorted(reach, len(self.window), side="right")))

    def read(self, first: int, last: int) -> UnitBatch:
        """Samples ``first`` to ``last - 1`` (together at most the window, or a single one)."""
        starts = self._read_window(first, last)
        sizes = self.samples.sizes[first:last].astype(np.int64)
        ends = starts + sizes
        window = np.frombuffer(self.window, np.uint8)
        try:
            if self.config.length_size != 4:
                data, starts, sizes, has_sps = self._copies(memoryview(self.window), starts, ends)
            else:
                data = window
                try:
                    has_sps = annexb_window(window, starts, ends)
                except _Damaged:
                    self._read_window(first, last)
                    annexb_in_place_batch(window, starts, ends)  # raises, naming the sample
                    raise AssertionError("the kernel and its reference disagree") from None
        except ValueError as e:
            index, why = e.args
            raise DatasetError(
                f"{self.label}: {self.path}: sample {first + index}: {why}"
            ) from None
        prefixed = self.samples.keyframes[first:last] & ~has_sps
        return UnitBatch(data, starts, sizes, prefixed, self.config.parameter_sets)

    def _read_window(self, first: int, last: int) -> np.ndarray:
        """Samples ``first`` to ``last - 1`` into the window; where each starts there."""
        offsets = self.samples.offsets[first:last].astype(np.int64)
        sizes = self.samples.sizes[first:last].astype(np.int64)
        view = memoryview(self.window)
        # Runs of samples that follow each other in the file: one read each, back to back.
        breaks = np.flatnonzero(offsets[1:] != offsets[:-1] + sizes[:-1]) + 1
        run_firsts = np.concatenate([[0], breaks]).tolist()
        run_lasts = [*breaks.tolist(), len(sizes)]
        starts = np.zeros(len(sizes), np.int64)
        at = 0
        for a, b in zip(run_firsts, run_lasts, strict=True):
            span = int(offsets[b - 1] + sizes[b - 1] - offsets[a])
            if os.preadv(self.fd, [view[at : at + span]], int(offsets[a])) != span:
                raise DatasetError(f"{self.label}: {self.path}: ends inside sample {first + b - 1}")
            starts[a:b] = at + offsets[a:b] - offsets[a]
            at += span
        return starts

    def _copies(
        self, view: memoryview, starts: np.ndarray, ends: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The samples with 1- or 2-byte lengths rebuilt as Annex B: (their bytes back to back,
        each unit's start and size there, whether each holds an SPS)."""
        units: list[bytes] = []
        has_sps = np.zeros(len(starts), bool)
        for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
            try:
                unit, has_sps[i] = _annexb_copy(view[a:b], self.config.length_size)
            except ValueError as e:
                raise ValueError(i, str(e)) from None
            units.append(unit)
        sizes = np.fromiter(map(len, units), np.int64, len(units))
        unit_starts = np.cumsum(sizes) - sizes
        return np.frombuffer(b"".join(units), np.uint8), unit_starts, sizes, has_sps


def access_units(path: Readable, samples: VideoSamples, label: str) -> Iterator[list[Bytes]]:
    """Every sample of the track, in decode order, as the parts of one Annex B access unit
    (SPS/PPS first on a keyframe that lacks them): ``AccessUnitReader`` one frame at a time.
    The parts are valid until the next one is asked for."""
    reader = AccessUnitReader(path, samples, label)
    try:
        first, count = 0, len(samples.sizes)
        while first < count:
            last = reader.batch_end(first)
            batch = reader.read(first, last)
            for unit, prefixed in zip(batch.units, batch.prefixed.tolist(), strict=True):
                yield [batch.prefix, unit] if prefixed else [unit]
            first = last
    finally:
        reader.close()
