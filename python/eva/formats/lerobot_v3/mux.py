"""Appending episode MP4s to a v3 video shard: spliced from the sample tables, or muxed by FFmpeg packet by packet (see ``eva.formats.lerobot_v3.video``); the keyframes the copy keeps, decoded."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TypeVar, cast

import av
import numpy as np

from eva.dataset import fsafe, mp4box
from eva.formats._decode import rgb_arrays
from eva.formats.lerobot_v3.splice import SplicedMp4, SpliceError
from eva.formats.lerobot_v3.video import EpisodeVideo, StreamParams, VideoConcatError

T = TypeVar("T")

# Receives decoded frames as (H, W, 3) uint8 RGB arrays.
FrameSink = Callable[[np.ndarray], None]

# LeRobot writes its shards with the moov atom first so a reader can start without seeking to the
# end of a large file (streaming from the Hub, or a remote copy after the SFTP upload).
MUXER_OPTIONS = {"movflags": "faststart"}

READ_BLOCK_BYTES = 4 << 20


@dataclass(frozen=True)
class AppendedEpisode:
    """Where an appended episode landed in the shard, in seconds of the shard's stream."""

    from_timestamp: float
    to_timestamp: float
    packets: int  # frames copied (one video packet = one frame in MP4)
    container_frames: int  # the source container's own sample count
    bytes: int  # compressed payload bytes copied


class VideoShardWriter:
    """One camera's MP4 shard: episodes appended by packet copy, timestamps running on.

    The shard is written at ``path`` directly (the whole export lives in a staging directory that
    is published only when complete). ``close()`` finalises the MP4; ``abort()`` deletes it.
    """

    def __init__(self, path: Path, *, splice: bool = True) -> None:
        self.path = Path(path)
        self.splice = splice  # False: FFmpeg muxes every shard (the tests' reference)
        self.params: StreamParams | None = None
        self.episodes = 0
        self._container: av.container.OutputContainer | None = None
        self._stream: av.video.stream.VideoStream | None = None
        # A shard whose first episode the box parser vouches for is spliced (sample tables
        # written from the parsed ones, bytes copied by the kernel); otherwise FFmpeg muxes it.
        self._splice: SplicedMp4 | None = None
        # Start of the next episode, in ticks of the shard's time base.
        self._next_start = 0
        self._last_dts: int | None = None

    @property
    def duration_s(self) -> float:
        if self.params is None:
            return 0.0
        return float(self._next_start * self.params.time_base)

    def append(
        self,
        source: fsafe.Readable | EpisodeVideo,
        keyframes: list[bytes] | None = None,
        keyframe_limit: int = 0,
    ) -> AppendedEpisode:
        """Copy every video packet of ``source`` to the end of the shard.

        ``source`` is a path or an already opened ``EpisodeVideo`` (the caller that probed the
        file to decide on a new shard saves a second open). ``keyframes``, when given, receives a
        copy of the episode's keyframe packets, at most ``keyframe_limit`` of them evenly spread
        (``spread_sample``; 0: all): a keyframe decodes on its own, so ``decode_keyframes`` can
        turn them into pixels later, in another thread. A spliced shard reads only those.
        Raises ``VideoConcatError`` when the source is incompatible with the shard; the caller
        checks ``compatible_with`` first and opens a new shard instead.
        """
        if not isinstance(source, EpisodeVideo):
            with EpisodeVideo(source) as opened:
                return self.append(opened, keyframes)
        if (
            self._container is None
            and self._splice is None
            and self.splice
            and source.samples is not None
        ):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._splice = SplicedMp4(
                self.path, source.samples.entry, source.samples.track.timescale
            )
            self.params = source.info.params
        elif self._container is None and self._splice is None:
            in_stream = source.stream
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._container = av.open(str(self.path), "w", format="mp4", options=MUXER_OPTIONS)
            # The template copies codec id, size, pixel format and extradata into the new
            # stream; the time base is not part of the codec parameters, so set it too.
            self._stream = self._container.add_stream_from_template(in_stream, opaque=True)
            self._stream.time_base = in_stream.time_base
            self.params = source.info.params
        else:
            assert self.params is not None  # set with the shard's first episode
            if not source.info.params.compatible_with(self.params):
                raise VideoConcatError(
                    f"{source.path}: stream parameters differ from shard {self.path.name}: "
                    + "; ".join(self.params.differences(source.info.params))
                )
        if source.samples is not None:
            return self._copy_samples(source.source, source.samples, keyframes, keyframe_limit)
        first = len(keyframes) if keyframes is not None else 0
        appended = self._copy_packets(
            source.path, source.container, source.stream, source.info.frames, keyframes
        )
        if keyframes is not None:
            keyframes[first:] = spread_sample(keyframes[first:], keyframe_limit)
        return appended

    def _copy_samples(
        self,
        source: fsafe.Readable,
        samples: mp4box.VideoSamples,
        keyframes: list[bytes] | None,
        keyframe_limit: int = 0,
    ) -> AppendedEpisode:
        """The packet copy from the sample table: the same packets, timestamps and checks as
        ``_copy_packets`` (which sees the same pts/dts from FFmpeg's demuxer: with B-frames the
        first frame at pts 0 and a negative dts, the reorder delay)."""
        assert self.params is not None
        n = len(samples.sizes)
        if n == 0:
            raise VideoConcatError(f"{source}: no video packets")
        if not samples.keyframes[0]:
            raise VideoConcatError(
                f"{source}: first packet is not a keyframe, the episode cannot be "
                "appended without re-encoding"
            )
        # The episode's t = 0 (its first packet's pts) lands right at the shard's end.
        shift = self._next_start - int(samples.pts[0])
        times = samples.pts + shift
        decode_times = samples.dts + shift
        if (self._last_dts is not None and int(decode_times[0]) <= self._last_dts) or (
            n > 1 and not bool(np.all(np.diff(decode_times) > 0))
        ):
            raise VideoConcatError(
                f"{source}: decode timestamps go backwards after shifting; the stream's "
                "timestamps are not monotonic"
            )
        if self._splice is not None:
            self._splice.add_samples(
                source,
                samples.offsets,
                samples.sizes,
                decode_times,
                times,
                samples.keyframes,
                int(samples.durations[-1]),
            )
            if keyframes is not None:
                chosen = spread_sample(np.flatnonzero(samples.keyframes).tolist(), keyframe_limit)
                keyframes.extend(_read_samples(source, samples, chosen))
        else:
            first = len(keyframes) if keyframes is not None else 0
            self._mux_samples(source, samples, times, decode_times, keyframes)
            if keyframes is not None:
                keyframes[first:] = spread_sample(keyframes[first:], keyframe_limit)
        end = max(self._next_start, int(np.max(times + np.maximum(samples.durations, 1))))
        self._last_dts = int(decode_times[-1])
        return self._finish_episode(
            int(times.min()), end, n, samples.track.sample_count, int(samples.sizes.sum())
        )

    def _mux_samples(
        self,
        source: fsafe.Readable,
        samples: mp4box.VideoSamples,
        times: np.ndarray,
        decode_times: np.ndarray,
        keyframes: list[bytes] | None,
    ) -> None:
        """Samples muxed one packet at a time by FFmpeg (a shard that FFmpeg writes)."""
        assert self._container is not None and self._stream is not None
        n = len(samples.sizes)
        time_base = Fraction(1, samples.track.timescale)
        offsets = samples.offsets.tolist()
        sizes = samples.sizes.tolist()
        durations = samples.durations.tolist()
        flags = samples.keyframes.tolist()
        pts_list = times.tolist()
        dts_list = pts_list if samples.pts is samples.dts else decode_times.tolist()
        fd = fsafe.open_readable(source)  # a dataset's file: beneath its root, no link followed
        try:
            i = 0
            while i < n:
                # One read for a run of adjacent samples (FFmpeg's muxer writes them so).
                block_start = offsets[i]
                j, stop = i + 1, block_start + sizes[i]
                while j < n and offsets[j] == stop and stop - block_start < READ_BLOCK_BYTES:
                    stop += sizes[j]
                    j += 1
                block = os.pread(fd, stop - block_start, block_start)
                if len(block) != stop - block_start:
                    raise VideoConcatError(f"{source}: file shrank while being copied")
                view = memoryview(block)
                for k in range(i, j):
                    at = offsets[k] - block_start
                    data = view[at : at + sizes[k]]
                    if keyframes is not None and flags[k]:
                        keyframes.append(bytes(data))
                    # PyAV's stub says bytes, but Packet takes any buffer: the slice of the
                    # read block goes in without a copy.
                    packet = av.Packet(data)  # type: ignore[arg-type]
                    packet.pts = pts_list[k]
                    packet.dts = dts_list[k]
                    packet.duration = durations[k]
                    packet.time_base = time_base
                    packet.is_keyframe = flags[k]
                    packet.stream = self._stream
                    self._container.mux(packet)
                i = j
        finally:
            os.close(fd)

    def _copy_packets(
        self,
        source: Path,
        src: av.container.InputContainer,
        in_stream: av.video.stream.VideoStream,
        container_frames: int,
        keyframes: list[bytes] | None,
    ) -> AppendedEpisode:
        assert self._splice is not None or (
            self._container is not None and self._stream is not None
        )
        shift: int | None = None
        end = self._next_start
        first_pts: int | None = None
        packets = 0
        payload = 0
        for packet in src.demux(in_stream):
            if packet.dts is None and packet.pts is None:
                continue  # the demuxer's end-of-stream flush packet
            if shift is None:
                if not packet.is_keyframe:
                    raise VideoConcatError(
                        f"{source}: first packet is not a keyframe, the episode cannot be "
                        "appended without re-encoding"
                    )
                # The episode's t = 0 (its first keyframe's pts) lands right at the shard's end.
                # With B-frames the demuxer reports that frame at pts 0 with a negative dts (the
                # reorder delay); the previous episode's last dts is lower still, so decode order
                # stays monotonic (checked below).
                # Not both None: the flush packet is skipped above.
                start_ts = packet.pts if packet.pts is not None else cast(int, packet.dts)
                shift = self._next_start - int(start_ts)
            pts = None if packet.pts is None else int(packet.pts) + shift
            dts = None if packet.dts is None else int(packet.dts) + shift
            if dts is not None and self._last_dts is not None and dts <= self._last_dts:
                raise VideoConcatError(
                    f"{source}: decode timestamps go backwards after shifting ({dts} <= "
                    f"{self._last_dts}); the stream's timestamps are not monotonic"
                )
            if keyframes is not None and packet.is_keyframe:
                keyframes.append(bytes(packet))  # muxing takes the packet's buffer
            duration = int(packet.duration or 0)
            if pts is not None:
                end = max(end, pts + max(duration, 1))
                first_pts = pts if first_pts is None else min(first_pts, pts)
            payload += packet.size
            if self._splice is not None:
                if pts is None or dts is None:
                    raise VideoConcatError(f"{source}: a packet without timestamps")
                self._splice.add_packet(bytes(packet), dts, pts, packet.is_keyframe, duration)
            else:
                assert self._container is not None and self._stream is not None
                packet.pts, packet.dts = pts, dts
                packet.stream = self._stream
                self._container.mux(packet)
            if dts is not None:
                self._last_dts = dts
            packets += 1
        if packets == 0:
            raise VideoConcatError(f"{source}: no video packets")
        start = self._next_start if first_pts is None else first_pts
        return self._finish_episode(start, end, packets, container_frames, payload)

    def _finish_episode(
        self, start: int, end: int, packets: int, container_frames: int, payload: int
    ) -> AppendedEpisode:
        """Account one appended episode spanning ``[start, end)`` (shard time base ticks)."""
        assert self.params is not None
        self._next_start = end
        self.episodes += 1
        tb = self.params.time_base
        return AppendedEpisode(
            from_timestamp=float(start * tb),
            to_timestamp=float(end * tb),
            packets=packets,
            container_frames=container_frames,
            bytes=payload,
        )

    def close(self) -> None:
        if self._splice is not None:
            splice, self._splice = self._splice, None
            try:
                splice.close(self._next_start)
            except SpliceError as e:
                splice.abort()
                raise VideoConcatError(f"{self.path}: {e}") from None
            except OSError as e:  # a full disk, EIO: the caller names the file it was writing
                splice.abort()
                if e.filename is None:
                    e.filename = str(self.path)
                raise
        if self._container is not None:
            self._container.close()
            self._container = None

    def abort(self) -> None:
        if self._splice is not None:
            self._splice.abort()
            self._splice = None
        if self._container is not None:
            with contextlib.suppress(Exception):
                self._container.close()
            self._container = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def spread_sample(items: list[T], limit: int) -> list[T]:
    """At most ``limit`` of ``items`` (all when ``limit`` is 0), evenly spread: item
    ``(2j + 1) * n // (2 * limit)`` for j < limit, i.e. the middle one for a limit of 1.

    Keyframe packets of one episode (or their sample indices), in order; each IDR keyframe
    decodes on its own."""
    n = len(items)
    if limit == 0 or n <= limit:
        return items
    return [items[(2 * j + 1) * n // (2 * limit)] for j in range(limit)]


def _read_samples(
    source: fsafe.Readable, samples: mp4box.VideoSamples, indices: list[int]
) -> list[bytes]:
    """The bytes of samples ``indices`` of ``source`` (the keyframes a shard's quantile sample
    decodes)."""
    fd = fsafe.open_readable(source)
    try:
        out = []
        for k in indices:
            size = int(samples.sizes[k])
            data = os.pread(fd, size, int(samples.offsets[k]))
            if len(data) != size:
                raise VideoConcatError(f"{source}: file shrank while being copied")
            out.append(data)
        return out
    finally:
        os.close(fd)


def decode_keyframes(params: StreamParams, packets: list[bytes], sink: FrameSink) -> int:
    """Decode keyframe packets (from ``VideoShardWriter.append``) with a fresh decoder of the
    stream's codec and extradata; each RGB frame goes to ``sink``. Returns the frame count.

    PyAV releases the GIL while decoding and converting, so this runs well in a worker thread
    next to the packet copy.
    """
    ctx = cast(av.VideoCodecContext, av.CodecContext.create(params.codec, "r"))
    if params.extradata:
        ctx.extradata = params.extradata
    ctx.thread_count = 1
    frames = (
        frame
        for data in [*packets, None]
        for frame in ctx.decode(av.Packet(data) if data is not None else None)
    )
    n = 0
    for rgb in rgb_arrays(frames):
        sink(rgb)
        n += 1
    return n
