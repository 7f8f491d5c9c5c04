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
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eva.dataset.errors import DatasetError
from eva.dataset.mp4box import VideoSamples
from eva.formats.mcap.records import Bytes

# Sample entries whose samples are H.264 NAL units framed by avcC's length size.
H264_FOURCCS = (b"avc1", b"avc3")
START_CODE = b"\x00\x00\x00\x01"
NAL_SPS = 7
NAL_PPS = 8
# Bytes of samples read per pread (a sample larger than this is read alone).
WINDOW = 4 << 20


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


def _annexb_in_place(window: bytearray, start: int, end: int) -> bool:
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


def access_units(path: Path, samples: VideoSamples, label: str) -> Iterator[list[Bytes]]:
    """Every sample of the track, in decode order, as the parts of one Annex B access unit
    (SPS/PPS first on a keyframe that lacks them). The parts are valid until the next one is
    asked for (they are views of a reused read window). ``DatasetError`` (naming ``label``) for
    a file shorter than its sample table or a sample whose NAL lengths do not add up."""
    config = parse_avcc(samples.entry.config)
    offsets, sizes, keyframes = samples.offsets, samples.sizes, samples.keyframes
    count = len(sizes)
    # A window of at most WINDOW bytes (a short video gets a buffer of its own size), and never
    # smaller than the largest sample.
    largest = int(sizes.max()) if count else 0
    window = bytearray(max(largest, min(WINDOW, int(sizes.sum()))))
    view = memoryview(window)
    fd = os.open(path, os.O_RDONLY)
    try:
        first = 0
        while first < count:
            # One read for the samples that follow each other in the file within a window.
            start = int(offsets[first])
            last = first + 1
            while (
                last < count
                and offsets[last] == offsets[last - 1] + sizes[last - 1]
                and offsets[last] + sizes[last] - start <= len(window)
            ):
                last += 1
            span = int(offsets[last - 1] + sizes[last - 1]) - start
            if os.preadv(fd, [view[:span]], start) != span:
                raise DatasetError(f"{label}: {path}: ends inside sample {last - 1}")
            for i in range(first, last):
                at = int(offsets[i]) - start
                end = at + int(sizes[i])
                try:
                    if config.length_size == 4:
                        has_sps = _annexb_in_place(window, at, end)
                        unit: Bytes = view[at:end]
                    else:
                        unit, has_sps = _annexb_copy(view[at:end], config.length_size)
                except ValueError as e:
                    raise DatasetError(f"{label}: {path}: sample {i}: {e}") from None
                if keyframes[i] and not has_sps:
                    yield [config.parameter_sets, unit]
                else:
                    yield [unit]
            first = last
    finally:
        os.close(fd)
