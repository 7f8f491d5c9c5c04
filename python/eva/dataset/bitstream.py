"""Framing check of MP4 video samples: every sample parses into whole NAL units or OBUs.

An MP4 sample of H.264/HEVC (``avcC``/``hvcC``) is a run of NAL units, each preceded by its
big-endian length (1, 2 or 4 bytes, from the decoder configuration); an AV1 sample (``av1C``) is
a run of OBUs, each with a header byte and, normally, a LEB128 size. Bytes that are not what the
muxer wrote (an overwritten or zeroed ``mdat``, a copy that went wrong) almost never keep that
framing: the lengths stop adding up to the sample's size, a length is zero, or a header has its
forbidden bit set. The check reads every sample of the file once, in windows of ``WINDOW`` bytes,
and walks all samples of a window together with numpy (one step per NAL unit/OBU position, not
per sample), so it costs about what reading the file from the page cache costs.

It proves that each sample is well framed, not that its payload decodes: damage inside a unit
that keeps its length is found by decoding (``eva.dataset.decode_check``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

__all__ = ["Framing", "FramingError", "WINDOW", "check_samples", "framing_of"]

# Bytes read per pread: a few hundred samples of 640x480 footage; bounded memory per check.
WINDOW = 4 << 20
# Steps of the vectorised walk before the samples still open are walked one by one (a sample of
# more NAL units than this is legal, just unusual).
VECTOR_STEPS = 16


class FramingError(ValueError):
    """A sample whose bytes do not parse; the message says which sample and why."""


@dataclass(frozen=True)
class Framing:
    """How samples of a track are framed: ``kind`` "nal" (``length_size``-byte prefixes, and the
    NAL header layout of ``codec``: "h264" or "hevc") or "obu" (AV1)."""

    kind: str
    codec: str
    length_size: int = 0


def framing_of(config_type: bytes | None, config: bytes) -> Framing | None:
    """The framing a decoder configuration box implies; None when eva cannot check it."""
    if config_type == b"avcC" and len(config) >= 5:
        size = (config[4] & 3) + 1
        return Framing("nal", "h264", size) if size != 3 else None
    if config_type == b"hvcC" and len(config) >= 22:
        size = (config[21] & 3) + 1
        return Framing("nal", "hevc", size) if size != 3 else None
    if config_type == b"av1C":
        return Framing("obu", "av1")
    return None


def _nal_header_ok(codec: str, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    # Only what no encoder writes is refused (unspecified NAL types have private uses, such as
    # Dolby Vision's): H.264 forbidden_zero_bit 0 and nal_unit_type not 0; HEVC forbidden bit 0
    # and nuh_temporal_id_plus1 not 0.
    ok: np.ndarray
    if codec == "h264":
        ok = ((first & 0x80) == 0) & ((first & 0x1F) != 0)
    else:
        ok = ((first & 0x80) == 0) & ((second & 7) != 0)
    return ok


_OBU_TYPES = np.zeros(16, bool)
_OBU_TYPES[[1, 2, 3, 4, 5, 6, 7, 8, 15]] = True


def _walk_window(
    buf: np.ndarray, start: np.ndarray, end: np.ndarray, framing: Framing
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised walk of samples ``[start, end)`` of ``buf``: (final positions, failed mask).
    A sample is done when its position reaches its end exactly."""
    pos = start.copy()
    failed = np.zeros(len(pos), bool)
    limit = len(buf)
    for _ in range(VECTOR_STEPS):
        active = np.flatnonzero((pos < end) & ~failed)
        if active.size == 0:
            break
        p = pos[active]
        e = end[active]
        if framing.kind == "nal":
            size = framing.length_size
            ok = p + size + 1 <= e  # a length and at least one header byte
            length = np.zeros(active.size, np.int64)
            for i in range(size):
                length = (length << 8) | buf[np.minimum(p + i, limit - 1)].astype(np.int64)
            header = p + size
            ok &= length >= (2 if framing.codec == "hevc" else 1)
            first = buf[np.minimum(header, limit - 1)]
            second = buf[np.minimum(header + 1, limit - 1)]
            ok &= _nal_header_ok(framing.codec, first, second)
            nxt = header + length
        else:
            h = buf[np.minimum(p, limit - 1)]
            ok = ((h & 0x81) == 0) & _OBU_TYPES[(h >> 3) & 0x0F]
            header = p + 1 + ((h >> 2) & 1).astype(np.int64)
            has_size = (h & 2) != 0
            value = np.zeros(active.size, np.int64)
            more = has_size.copy()
            q = header.copy()
            for i in range(8):  # LEB128, at most 8 bytes
                if not more.any():
                    break
                b = buf[np.minimum(q, limit - 1)].astype(np.int64)
                value = np.where(more, value | ((b & 0x7F) << (7 * i)), value)
                q = np.where(more, q + 1, q)
                more &= (b & 0x80) != 0
            ok &= ~more & (header <= e)  # a size longer than 8 bytes; a header cut off
            # An OBU without a size field runs to the end of the sample.
            nxt = np.where(has_size, q + value, e)
        ok &= nxt <= e
        failed[active[~ok]] = True
        pos[active] = np.where(ok, nxt, p)
    return pos, failed


def check_samples(
    fd: int,
    path: object,
    offsets: np.ndarray,
    sizes: np.ndarray,
    framing: Framing,
    window: int = WINDOW,
) -> None:
    """Raise ``FramingError`` naming the first badly framed sample (in decode order) of the
    samples at ``offsets``/``sizes`` of the file open as ``fd``; ``OSError`` when it cannot be
    read. ``path`` is only for the message."""
    n = len(offsets)
    if n == 0:
        return
    order = np.argsort(offsets, kind="stable")
    offs = np.asarray(offsets, np.int64)[order]
    lens = np.asarray(sizes, np.int64)[order]
    ends = offs + lens
    reach = np.maximum.accumulate(ends)  # a window's span: its first offset to its furthest end
    bad: list[int] = []
    # One buffer for every window: a fresh ``bytes`` per pread costs its page faults each time
    # (more than the copy out of the page cache).
    scratch = bytearray(min(window, int(reach[-1] - offs[0])))
    i = 0
    while i < n:
        j = int(np.searchsorted(reach, offs[i] + window, side="right"))
        j = max(j, i + 1)  # a sample larger than the window is read alone
        base = int(offs[i])
        span = int(reach[j - 1]) - base
        if span > len(scratch):
            scratch = bytearray(span)
        view = memoryview(scratch)[:span]
        got = 0
        while got < span:
            k = os.preadv(fd, [view[got:]], base + got)
            if k == 0:
                raise FramingError(
                    f"{path}: sample data ends early (the file is shorter than its index)"
                )
            got += k
        buf = np.frombuffer(scratch, np.uint8, span)
        start = offs[i:j] - base
        stop = ends[i:j] - base
        pos, failed = _walk_window(buf, start, stop, framing)
        open_ = np.flatnonzero(~failed & (pos < stop))
        for k in open_.tolist():  # more units than VECTOR_STEPS: finish one by one
            p, f = _walk_window(buf, pos[k : k + 1], stop[k : k + 1], framing)
            while not f[0] and p[0] < stop[k]:
                p, f = _walk_window(buf, p, stop[k : k + 1], framing)
            failed[k] = f[0]
        if failed.any():
            bad.extend(int(order[i + k]) for k in np.flatnonzero(failed))
        i = j
    if bad:
        first = min(bad)
        unit = "NAL units" if framing.kind == "nal" else "OBUs"
        raise FramingError(
            f"{path}: sample {first} of {n} (and {len(bad) - 1} more) does not parse into whole "
            f"{unit}: the video data is damaged"
            if len(bad) > 1
            else f"{path}: sample {first} of {n} does not parse into whole {unit}: the video data "
            "is damaged"
        )
