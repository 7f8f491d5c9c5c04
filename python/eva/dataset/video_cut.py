"""Cut an episode's MP4 to the frames ``[start, end)`` of a trim (docs/formats.md, "Edits").

A v2.1 export gives each episode its own MP4, so a trimmed episode's video must hold only its
kept frames. The cut is a smart cut where the stream allows one:

- The source is indexed first by demuxing (no decoding): each packet's timestamps and keyframe
  flag, in decode order. A GOP runs from a keyframe to the next one; it is *closed* when the
  frames it presents are exactly the frame indices from its keyframe's up to the next GOP's
  (no leading picture of an open GOP refers to frames of the GOP before it).
- Each whole GOP inside ``[start, end)`` is packet-copied: the same bytes, only the timestamps
  shifted (bit-exact, no decode). The frames of the GOPs at the two cut points that the trim
  keeps are decoded (their GOPs only, streamed: never an episode's frames in memory) and
  re-encoded with the capture encoder's settings (``eva.dataset.video_cut_codec``): same codec,
  profile, pixel format, size, time base and frame duration. The re-encoder's SPS/PPS join the
  source's in the ``avcC`` under ids of their own, so both kinds of GOP decode in one track.
- Where a smart cut is not sound (not H.264, an open GOP, timestamps that are not one frame
  apart, an ``avcC`` this module cannot extend), the kept frames are re-encoded whole with the
  same settings.

Either way the output has exactly ``end - start`` frames, presented from 0 one source frame
duration apart, in decode timestamps that never pass the presentation ones (one reorder delay
for the whole file: the largest of the copied GOPs' and the re-encoder's). The output is
written beside ``dest`` under a temporary name and renamed over it when complete; the source
is opened beneath its dataset root when it is a ``FileBeneath`` (``eva.dataset.video``).
"""

from __future__ import annotations

import bisect
import contextlib
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, cast

import av

from eva.dataset import fsafe
from eva.dataset.atomic import TMP_PREFIX, fsync_dir
from eva.dataset.errors import DatasetError
from eva.dataset.video import open_video, use_decode_threads
from eva.dataset.video_cut_codec import (
    AvcConfig,
    EncoderSettings,
    annexb_units,
    encoder_settings,
    length_prefixed,
    nal_type,
    parse_avcc,
)

# x264 numbers its SPS and PPS with one id, 0..31.
_MAX_PARAMETER_SET_ID = 31


@dataclass(frozen=True)
class Gop:
    """One GOP of the source: decode positions ``[first, end)``, presented frames ``[lo, hi)``
    when ``closed``, and its reorder delay (how many positions a frame is decoded before it
    is shown, at most)."""

    first: int
    end: int
    lo: int
    hi: int
    closed: bool
    delay: int


@dataclass(frozen=True)
class SourceIndex:
    """What demuxing the source tells, without decoding."""

    codec: str
    time_base: Fraction
    frame_duration: int  # in time_base units
    uniform: bool  # presentation timestamps exactly one frame_duration apart
    order: tuple[int, ...]  # decode position -> presentation index
    shown_pts: tuple[int, ...]  # presentation index -> timestamp
    gops: tuple[Gop, ...]
    first_packet: bytes
    extradata: bytes
    profile: str | None

    @property
    def frames(self) -> int:
        return len(self.order)

    @property
    def first_pts(self) -> int:
        return self.shown_pts[0]

    def shown(self, pts: int) -> int:
        """The presentation index of the frame with timestamp ``pts``."""
        if self.uniform:
            return (pts - self.first_pts) // self.frame_duration
        return bisect.bisect_left(self.shown_pts, pts)


@dataclass(frozen=True)
class CutResult:
    """What a cut did: frames written, of which packet-copied, and whether it was smart."""

    frames: int
    copied: int
    smart: bool


def cut_episode_video(
    source: fsafe.Readable,
    dest: Path,
    start: int,
    end: int,
    *,
    durable: bool = True,
    smart: bool = True,
) -> CutResult:
    """Write to ``dest`` an MP4 of exactly the frames ``[start, end)`` of ``source``.

    ``DatasetError`` naming the source (or ``dest`` for a write failure) when the range is not
    inside the video or the video cannot be read; ``dest`` is then left as it was.
    ``smart=False`` re-encodes every kept frame (the baseline ``bench/bench_video_cut.py``
    measures the smart cut against)."""
    path = fsafe.name_of(source)
    index = index_source(source)
    if not 0 <= start < end <= index.frames:
        raise DatasetError(
            f"{path}: cannot cut frames [{start}, {end}) of a video of {index.frames} frames"
        )
    settings = encoder_settings(
        index.codec,
        index.first_packet,
        gop=_gop_length(index),
        b_frames=any(g.delay for g in index.gops),
        profile=index.profile,
    )
    avcc = _smart_avcc(index, settings) if smart else None
    dest = Path(dest)
    with _staged(dest, durable=durable) as out_path:
        try:
            if avcc is not None:
                copied = _write_smart(source, out_path, index, settings, avcc, start, end)
            else:
                copied = 0
                _write_reencoded(source, out_path, index, settings, start, end)
        except av.error.FFmpegError as e:
            raise DatasetError(f"{path}: cutting frames [{start}, {end}) failed ({e})") from None
    return CutResult(end - start, copied, avcc is not None)


def index_source(source: fsafe.Readable) -> SourceIndex:
    """Demux ``source`` once (no decoding) into a ``SourceIndex``."""
    path = fsafe.name_of(source)
    container, stream = open_video(source)
    with container:
        ctx = stream.codec_context
        pts: list[int] = []
        keys: list[bool] = []
        durations: list[int] = []
        first = b""
        try:
            for packet in container.demux(stream):
                if packet.size == 0 or packet.is_discard:
                    continue
                if packet.pts is None:
                    raise DatasetError(f"{path}: a video packet has no timestamp")
                if not pts:
                    first = bytes(packet)
                pts.append(int(packet.pts))
                keys.append(bool(packet.is_keyframe))
                durations.append(int(packet.duration or 0))
        except av.error.FFmpegError as e:
            raise DatasetError(f"{path}: demux failed ({e})") from None
        if not pts:
            raise DatasetError(f"{path}: the video has no frames")
        time_base = stream.time_base or Fraction(1, 1)
        rate = stream.average_rate or stream.guessed_rate
        return _build_index(
            ctx.name,
            Fraction(time_base),
            pts,
            keys,
            durations,
            first,
            bytes(ctx.extradata or b""),
            ctx.profile,
            rate,
        )


def _build_index(
    codec: str,
    time_base: Fraction,
    pts: list[int],
    keys: list[bool],
    durations: list[int],
    first: bytes,
    extradata: bytes,
    profile: str | None,
    rate: Fraction | None,
) -> SourceIndex:
    shown = sorted(pts)
    position = {value: i for i, value in enumerate(shown)}
    order = tuple(position[value] for value in pts)
    steps = {b - a for a, b in zip(shown, shown[1:], strict=False)}
    if len(steps) == 1:
        duration = steps.pop()
    elif durations[0] > 0:
        duration = durations[0]
    else:  # one frame without a duration: the stream's rate
        duration = max(1, round(1 / (Fraction(rate) * time_base))) if rate else 1
    uniform = len(position) == len(pts) and all(
        b - a == duration for a, b in zip(shown, shown[1:], strict=False)
    )
    return SourceIndex(
        codec,
        time_base,
        duration,
        uniform,
        order,
        tuple(shown),
        _gops(order, keys),
        first,
        extradata,
        profile,
    )


def _gops(order: tuple[int, ...], keys: list[bool]) -> tuple[Gop, ...]:
    starts = [k for k, key in enumerate(keys) if key]
    if not starts or starts[0] != 0:
        starts = [0, *starts]  # a stream not starting on a keyframe: never closed below
    gops = []
    for first, end in zip(starts, [*starts[1:], len(order)], strict=True):
        shown = order[first:end]
        lo, hi = min(shown), max(shown) + 1
        closed = keys[first] and shown[0] == lo and hi - lo == end - first
        delay = max(k - (order[first + k] - lo) for k in range(end - first))
        gops.append(Gop(first, end, lo, hi, closed, max(0, delay)))
    return tuple(gops)


def _gop_length(index: SourceIndex) -> int:
    """The source's keyframe interval: its first GOP's length (a whole-file GOP: its frames)."""
    return index.gops[0].end - index.gops[0].first


def _smart_avcc(index: SourceIndex, settings: EncoderSettings) -> AvcConfig | None:
    """The source's ``avcC`` when a smart cut is sound for it (None: re-encode whole)."""
    if index.codec != "h264" or settings.codec != "libx264" or not index.uniform:
        return None
    if not all(gop.closed for gop in index.gops):
        return None
    try:
        avcc = parse_avcc(index.extradata)
        used = avcc.used_ids()
    except (ValueError, IndexError):
        return None
    if avcc.length_size != 4 or len(used) > _MAX_PARAMETER_SET_ID:
        return None
    return avcc


@contextlib.contextmanager
def _staged(dest: Path, *, durable: bool) -> Iterator[str]:
    """A new temporary file beside ``dest`` (named for FFmpeg through its fd), renamed over
    ``dest`` when the block completes, removed when it fails."""
    fsafe.real_directory(dest.parent, create=True)
    for _ in range(100):
        tmp = dest.parent / f"{TMP_PREFIX}{dest.name}.{secrets.token_hex(4)}"
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC)
            break
        except FileExistsError:
            continue
        except OSError as e:
            raise fsafe.os_error(e, tmp) from None
    else:
        raise DatasetError(f"{dest}: no free temporary file name beside it")
    try:
        yield fsafe.proc_path(fd) if fsafe.has_proc_fd() else str(tmp)
        if durable:
            os.fsync(fd)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)
    if durable:
        fsync_dir(dest.parent)


def _open_encoder(
    settings: EncoderSettings, index: SourceIndex, like: av.VideoCodecContext, extra: str = ""
) -> av.VideoCodecContext:
    """A standalone encoder with the capture settings for frames like the source's (size,
    pixel format, time base, rate); its headers out of band (``extradata``)."""
    options = dict(settings.options)
    if extra:
        options["x264-params"] = f"{options.get('x264-params', '')}:{extra}".lstrip(":")
    ctx = cast(av.VideoCodecContext, av.CodecContext.create(settings.codec, "w"))
    ctx.width, ctx.height, ctx.pix_fmt = like.width, like.height, like.pix_fmt
    ctx.time_base = index.time_base
    ctx.framerate = 1 / (index.time_base * index.frame_duration)
    ctx.flags |= av.codec.context.Flags.global_header
    ctx.options = options
    ctx.open()
    return ctx


def _decoder(stream: av.video.stream.VideoStream) -> av.VideoCodecContext:
    source = stream.codec_context
    ctx = cast(av.VideoCodecContext, av.CodecContext.create(source.name, "r"))
    if source.extradata:
        ctx.extradata = source.extradata
    ctx.thread_type = "AUTO"
    return ctx


class _Output:
    """The cut's MP4: packets in decode order get decode timestamps one frame apart, delayed
    by the file's reorder ``delay``, so they never pass their presentation timestamps."""

    def __init__(
        self, container: Any, stream: Any, index: SourceIndex, delay: int, start: int
    ) -> None:
        self.container, self.stream = container, stream
        self.duration, self.time_base, self.delay = index.frame_duration, index.time_base, delay
        self.start = start
        self.count = 0

    def mux(self, packet: av.Packet[Any], shown: int) -> None:
        """``packet`` as source frame ``shown`` (its presentation index), output frame
        ``shown - start``."""
        packet.stream = self.stream
        packet.time_base = self.time_base
        packet.pts = (shown - self.start) * self.duration
        packet.dts = (self.count - self.delay) * self.duration
        packet.duration = self.duration
        if packet.dts > packet.pts:  # a reorder deeper than the delay planned: never written
            raise DatasetError(f"frame {shown}: reordered deeper than the cut planned")
        self.container.mux(packet)
        self.count += 1


def _write_smart(
    source: fsafe.Readable,
    out_path: str,
    index: SourceIndex,
    settings: EncoderSettings,
    avcc: AvcConfig,
    start: int,
    end: int,
) -> int:
    """Copy the GOPs inside ``[start, end)``, re-encode the kept frames of the others; the
    number of frames copied."""
    copy = [g for g, gop in enumerate(index.gops) if start <= gop.lo and gop.hi <= end]
    spans = _encoded_spans(index, copy, start, end)
    free = min(set(range(_MAX_PARAMETER_SET_ID + 1)) - avcc.used_ids())
    container, stream = open_video(source)
    with container, av.open(out_path, "w", format="mp4") as out:
        like = stream.codec_context
        for span in spans:
            span.encoder = _open_encoder(settings, index, like, f"sps-id={free}")
        sps, pps = _parameter_sets([span.encoder for span in spans])
        delay = max([index.gops[g].delay for g in copy] + [settings.max_b_frames if spans else 0])
        ostream = out.add_stream_from_template(stream)
        ostream.codec_context.extradata = avcc.with_sets(sps, pps).encode()
        output = _Output(out, ostream, index, delay, start)
        role: dict[int, _Span | None] = {g: None for g in copy}
        role.update({g: span for span in spans for g in span.gops})
        gop_of = _gop_of_position(index)
        needed = max(index.gops[g].end for g in role)  # the packets after it are not read
        packets = (p for p in container.demux(stream) if p.size and not p.is_discard)
        for k, packet in zip(range(needed), packets, strict=False):
            g = gop_of[k]
            if g not in role:
                continue
            owner = role[g]
            if owner is None:
                output.mux(packet, index.order[k])
            else:
                owner.feed(packet, stream, last=k == index.gops[owner.gops[-1]].end - 1)
                owner.drain(output)
    return sum(index.gops[g].hi - index.gops[g].lo for g in copy)


class _Span:
    """Kept frames ``[lo, hi)`` (source indices) to re-encode, from the decoded ``gops``."""

    def __init__(self, index: SourceIndex, lo: int, hi: int, gops: list[int]) -> None:
        self.index, self.lo, self.hi, self.gops = index, lo, hi, gops
        self.encoder: av.VideoCodecContext | None = None
        self._decoder: av.VideoCodecContext | None = None
        self._packets: list[av.Packet[Any]] = []

    def feed(
        self, packet: av.Packet[Any], stream: av.video.stream.VideoStream, *, last: bool
    ) -> None:
        """Decode ``packet``, re-encode its kept frames (all pending ones at ``last``)."""
        if self._decoder is None:
            self._decoder = _decoder(stream)
        frames = self._decoder.decode(packet)
        if last:
            frames += self._decoder.decode(None)
        assert self.encoder is not None
        for frame in frames:
            shown = self.index.shown(_pts(frame.pts))
            if self.lo <= shown < self.hi:
                self._packets += self.encoder.encode(_fresh(frame, shown, self.index))
        if last:
            self._packets += self.encoder.encode(None)

    def drain(self, output: _Output) -> None:
        for packet in self._packets:
            sample = av.Packet(length_prefixed(annexb_units(bytes(packet))))
            sample.is_keyframe = packet.is_keyframe
            output.mux(sample, _pts(packet.pts) // self.index.frame_duration)
        self._packets = []


def _pts(pts: int | None) -> int:
    if pts is None:  # FFmpeg stamps every frame and packet of a stamped stream
        raise DatasetError("a decoded frame or encoded packet has no timestamp")
    return int(pts)


def _fresh(frame: av.VideoFrame, shown: int, index: SourceIndex) -> av.VideoFrame:
    """``frame`` to encode as source frame ``shown`` (stamped ``shown`` frame durations, read
    back from its packet), and no picture type
    (libx264 would otherwise copy the source's I/P/B decisions)."""
    frame.pts = shown * index.frame_duration
    frame.time_base = index.time_base
    frame.pict_type = av.video.frame.PictureType.NONE
    return frame


def _encoded_spans(index: SourceIndex, copy: list[int], start: int, end: int) -> list[_Span]:
    """The kept frames to re-encode: before the copied GOPs and after them (one span when no
    GOP is copied), each with the GOPs to decode for it."""
    if copy:
        ranges = [(start, index.gops[copy[0]].lo), (index.gops[copy[-1]].hi, end)]
    else:
        ranges = [(start, end)]
    return [
        _Span(index, lo, hi, [g for g, gop in enumerate(index.gops) if gop.lo < hi and gop.hi > lo])
        for lo, hi in ranges
        if lo < hi
    ]


def _gop_of_position(index: SourceIndex) -> list[int]:
    out = [0] * index.frames
    for g, gop in enumerate(index.gops):
        out[gop.first : gop.end] = [g] * (gop.end - gop.first)
    return out


def _parameter_sets(encoders: list[av.VideoCodecContext | None]) -> tuple[list[bytes], list[bytes]]:
    """The re-encoders' SPS and PPS (one set: every encoder has the same settings)."""
    headers = {bytes(e.extradata or b"") for e in encoders if e is not None}
    if len(headers) > 1:
        raise DatasetError("the re-encoders of one cut made different parameter sets")
    units = annexb_units(headers.pop()) if headers else []
    return [u for u in units if nal_type(u) == 7], [u for u in units if nal_type(u) == 8]


def _write_reencoded(
    source: fsafe.Readable,
    out_path: str,
    index: SourceIndex,
    settings: EncoderSettings,
    start: int,
    end: int,
) -> None:
    """Re-encode the kept frames whole (decoded from the file's start: an open GOP's leading
    frames need the GOP before)."""
    container, stream = open_video(source)
    with container, av.open(out_path, "w", format="mp4") as out:
        like = stream.codec_context
        rate = 1 / (index.time_base * index.frame_duration)
        ostream = cast(
            av.VideoStream, out.add_stream(settings.codec, rate=rate, options=settings.options)
        )
        ostream.width, ostream.height, ostream.pix_fmt = like.width, like.height, like.pix_fmt
        ostream.time_base = index.time_base
        ostream.codec_context.time_base = index.time_base
        use_decode_threads(stream)
        # decode timestamps set here too: an encoder's own are guesses for a clip this short
        output = _Output(out, ostream, index, settings.max_b_frames, start)
        written = 0
        for frame in container.decode(stream):
            shown = index.shown(_pts(frame.pts))
            if start <= shown < end:
                for packet in ostream.encode(_fresh(frame, shown, index)):
                    output.mux(packet, _pts(packet.pts) // index.frame_duration)
                written += 1
                if written == end - start:
                    break
        for packet in ostream.encode(None):
            output.mux(packet, _pts(packet.pts) // index.frame_duration)
    if written != end - start:
        raise DatasetError(
            f"{fsafe.name_of(source)}: decoded {written} of the {end - start} frames to keep"
        )
