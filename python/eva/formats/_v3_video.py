"""Packet-copy concatenation of per-episode MP4s into LeRobot v3.0 video shards (private to v3).

LeRobot v3.0 stores each camera's episodes back to back in one MP4 stream per shard and finds an
episode's frame ``t`` at ``from_timestamp + t / fps`` inside that shard. The raw v2.1 videos are
H.264 with a fixed GOP and no B-frames, so every episode starts on a keyframe and
episodes can be appended without decoding: each compressed packet is copied as is and only its
pts/dts are shifted by the duration already in the shard (streams with B-frames work too, as long
as every episode has the same reorder delay; otherwise decode timestamps would go backwards, which
is refused). That is what LeRobot's own converter
does (through FFmpeg's concat demuxer); here the shift is explicit so that the episode's start
(``from_timestamp``) is known exactly, in the stream's own time base.

Stream compatibility: a packet-copied MP4 has one sample description (codec, size, pixel format,
time base and the codec's extradata, i.e. H.264 SPS/PPS). An episode whose parameters differ from
the open shard's cannot join it; the caller starts a new shard file for it (no re-encoding: a
re-encode would silently change the pixels and cost ~100x the time; a new file costs nothing and
LeRobot addresses files per episode anyway). ``StreamParams.compatible_with`` is that test.

Frame counting without decoding is sound for MP4: a video sample is one coded frame, so the number
of demuxed video packets is the frame count. It is checked against the container's sample count
(``stream.frames``, from the sample table) and against the table rows by the caller. With the
``--verify-decode`` option every frame of a finished shard is decoded instead.

No FFmpeg open per episode: opening an MP4 with PyAV probes it by decoding its first frame (4 ms
for 320x240, more for larger frames), which cost more than the whole packet copy. An episode is
read with ``eva.dataset.mp4box.read_video_samples`` instead: the sample entry from ``stsd`` and
every sample's offset, size, decode time, duration and sync flag from the sample tables (the same
packets, bytes and timestamps FFmpeg's demuxer delivers: checked against it in the tests), and the
packets are muxed straight from the file's bytes. FFmpeg is still opened:

* once per shard that FFmpeg muxes (below), for its first episode, whose stream is the output
  stream's template (codec parameters copied as is);
* once per distinct stream configuration, to learn the decoder's view of it (codec name, coded
  size, pixel format, extradata): the ``StreamParams`` of a later episode whose sample entry is
  byte-identical (its ``btrt`` bit-rate box aside) with the same media timescale are taken from
  that cache (``ParamsCache``). That is sound because for ``avc1``/``hvc1``/``av01`` entries the
  configuration box carries the parameter sets (SPS/PPS, the AV1 sequence header) that fix the
  decoder's size and pixel format; other entry types (``avc3``: in-band parameter sets, or an
  ``av1C`` without its sequence header) are opened with FFmpeg every time, as before;
* for every file the box parser does not vouch for (edit lists that hide frames, B-frames
  without an edit list, fragmented files...): the demux path, as before. B-frame files as
  FFmpeg's muxer writes them (composition offsets under one edit whose ``media_time`` is the
  first presentation time) are read from the tables too: the parser gives FFmpeg's shifted pts
  and dts, compared with its demuxer packet by packet in the tests.

Writing: a shard whose first episode the box parser vouches for is spliced
(``eva.formats._mp4_splice``): eva writes the MP4's boxes from the parsed sample tables and the
kernel copies the sample bytes (``copy_file_range``), with no FFmpeg muxer and no per-packet
Python. Other shards are muxed by FFmpeg packet by packet. Both give readers the same packets,
timestamps and frames (tested packet by packet).

What that drops per episode is FFmpeg's probe, i.e. decoding the episode's first frame: a file
whose boxes are sound but whose first frame's bitstream is damaged is now copied as is (the demux
copy never decoded the other frames either). The frame-count checks are unchanged: the sample
count the box parser vouches for is the number of packets FFmpeg's demuxer delivers (it steps
aside otherwise), and it must equal the table rows. Damaged bitstreams show up where frames are
decoded: the keyframe sample for the image quantiles, ``--verify-decode`` (every frame), and the
validator's ``decode=True``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TypeVar

import av
import numpy as np
from av.video.reformatter import VideoReformatter

from eva.dataset import mp4box
from eva.formats._mp4_splice import SplicedMp4, SpliceError

T = TypeVar("T")

# Receives decoded frames as (H, W, 3) uint8 RGB arrays.
FrameSink = Callable[[np.ndarray], None]

# LeRobot writes its shards with the moov atom first so a reader can start without seeking to the
# end of a large file (streaming from the Hub, or a remote copy after the SFTP upload).
MUXER_OPTIONS = {"movflags": "faststart"}


class VideoConcatError(ValueError):
    """An episode video cannot be appended (unreadable, no video stream, or bad timestamps)."""


@dataclass(frozen=True)
class StreamParams:
    """What must be identical for two episodes to share one packet-copied MP4 stream."""

    codec: str
    width: int
    height: int
    pix_fmt: str | None
    time_base: Fraction
    extradata: bytes

    def differences(self, other: StreamParams) -> list[str]:
        """Names of the parameters that differ, e.g. ``["width 64 != 32"]``."""
        out = []
        for name in ("codec", "width", "height", "pix_fmt", "time_base"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                out.append(f"{name} {mine} != {theirs}")
        if self.extradata != other.extradata:
            out.append("extradata (codec headers such as H.264 SPS/PPS) differ")
        return out

    def compatible_with(self, other: StreamParams) -> bool:
        return not self.differences(other)


@dataclass(frozen=True)
class EpisodeVideoInfo:
    """An episode MP4 as seen by its container (no decoding)."""

    params: StreamParams
    frames: int  # sample count from the container's index (0 when the muxer did not record it)
    size_bytes: int


def _stream_params(stream: av.video.stream.VideoStream, path: Path) -> StreamParams:
    ctx = stream.codec_context
    if stream.time_base is None:
        raise VideoConcatError(f"{path}: video stream has no time base")
    return StreamParams(
        codec=ctx.name,
        width=int(ctx.width),
        height=int(ctx.height),
        pix_fmt=ctx.pix_fmt,
        time_base=Fraction(stream.time_base),
        extradata=bytes(ctx.extradata or b""),
    )


def probe(path: Path) -> EpisodeVideoInfo:
    """Read the stream parameters and the sample count of ``path`` without decoding."""
    path = Path(path)
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise VideoConcatError(f"{path}: no video stream")
            stream = container.streams.video[0]
            return EpisodeVideoInfo(
                params=_stream_params(stream, path),
                frames=int(stream.frames or 0),
                size_bytes=path.stat().st_size,
            )
    except av.error.FFmpegError as e:
        raise VideoConcatError(f"{path}: cannot open video ({e})") from None


class ParamsCache:
    """``StreamParams`` learnt from FFmpeg, per sample entry (see the module doc): a bounded map
    from (sample entry bytes without ``btrt``, media timescale) to the decoder's parameters."""

    def __init__(self, max_entries: int = 64) -> None:
        self._params: dict[tuple[bytes, int], StreamParams] = {}
        self._max_entries = max_entries
        self.opens = 0  # FFmpeg opens made to fill it (the bench and tests read this)

    @staticmethod
    def cacheable(entry: mp4box.SampleEntry) -> bool:
        """Whether the entry itself fixes the decoder's parameters (parameter sets inside)."""
        if entry.config_type is None or entry.config_type != mp4box.CONFIG_BOXES.get(entry.fourcc):
            return False
        # av1C: 4 fixed bytes, then configOBUs, which should hold the sequence header.
        return len(entry.config) > 4 if entry.fourcc == b"av01" else bool(entry.config)

    def get(self, samples: mp4box.VideoSamples) -> StreamParams | None:
        if not self.cacheable(samples.entry):
            return None
        return self._params.get((samples.entry.key, samples.track.timescale))

    def put(self, samples: mp4box.VideoSamples, params: StreamParams) -> None:
        if not self.cacheable(samples.entry):
            return
        if len(self._params) >= self._max_entries:
            self._params.pop(next(iter(self._params)))
        self._params[(samples.entry.key, samples.track.timescale)] = params


class EpisodeVideo:
    """An episode MP4: its ``info`` for the shard decision, then its packets for the copy.

    With a sample table the box parser vouches for (``samples``), no FFmpeg open is needed unless
    ``params_cache`` lacks its configuration or the shard needs it as its template (``stream``,
    opened on first use). Otherwise the file is opened with PyAV at once and demuxed (``samples``
    is None). Use as a context manager.
    """

    def __init__(self, path: Path, params_cache: ParamsCache | None = None) -> None:
        self.path = Path(path)
        self._container: av.container.InputContainer | None = None
        self._stream: av.video.stream.VideoStream | None = None
        self.samples: mp4box.VideoSamples | None
        try:
            self.samples = mp4box.read_video_samples(self.path)
        except mp4box.Mp4Unsupported:
            self.samples = None
        except mp4box.Mp4Truncated as e:
            raise VideoConcatError(str(e)) from None
        except OSError as e:
            raise VideoConcatError(f"{self.path}: cannot read video ({e.strerror or e})") from None
        try:
            self.info = self._info(params_cache)
        except BaseException:
            self.close()  # the caller's ``with`` has not started: nothing else would close it
            raise

    def _info(self, params_cache: ParamsCache | None) -> EpisodeVideoInfo:
        params = None
        if self.samples is not None and params_cache is not None:
            params = params_cache.get(self.samples)
        if params is None:
            params = _stream_params(self.stream, self.path)
            if self.samples is not None and params_cache is not None:
                params_cache.opens += 1
                params_cache.put(self.samples, params)
        frames = (
            self.samples.track.sample_count
            if self.samples is not None
            else stream_frames(self.stream)
        )
        return EpisodeVideoInfo(params=params, frames=frames, size_bytes=self.path.stat().st_size)

    @property
    def stream(self) -> av.video.stream.VideoStream:
        """The PyAV video stream (the file is opened, and probed, on first use)."""
        if self._stream is None:
            try:
                self._container = av.open(str(self.path))
            except av.error.FFmpegError as e:
                raise VideoConcatError(f"{self.path}: cannot open video ({e})") from None
            if not self._container.streams.video:
                self._container.close()
                self._container = None
                raise VideoConcatError(f"{self.path}: no video stream")
            self._stream = self._container.streams.video[0]
            # Only keyframes are ever decoded here, one at a time: decoder threads would cost
            # more to start per episode than they could save.
            self._stream.thread_type = "NONE"
            self._stream.codec_context.thread_count = 1
        return self._stream

    @property
    def container(self) -> av.container.InputContainer:
        self.stream  # noqa: B018 (opens the file)
        assert self._container is not None
        return self._container

    def close(self) -> None:
        if self._container is not None:
            self._container.close()
            self._container = None
            self._stream = None

    def __enter__(self) -> EpisodeVideo:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Sample bytes are read in runs of adjacent samples of up to this many bytes (one pread each).
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
        self.payload_bytes = 0
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
        source: Path | EpisodeVideo,
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
        elif not source.info.params.compatible_with(self.params):
            raise VideoConcatError(
                f"{source.path}: stream parameters differ from shard {self.path.name}: "
                + "; ".join(self.params.differences(source.info.params))
            )
        if source.samples is not None:
            return self._copy_samples(source.path, source.samples, keyframes, keyframe_limit)
        first = len(keyframes) if keyframes is not None else 0
        appended = self._copy_packets(
            source.path, source.container, source.stream, source.info.frames, keyframes
        )
        if keyframes is not None:
            keyframes[first:] = spread_sample(keyframes[first:], keyframe_limit)
        return appended

    def _copy_samples(
        self,
        source: Path,
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
        source: Path,
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
        fd = os.open(source, os.O_RDONLY)
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
                    packet = av.Packet(data)
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
                start_ts = packet.pts if packet.pts is not None else packet.dts
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
                assert self._container is not None
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
        self.payload_bytes += payload
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


def _read_samples(source: Path, samples: mp4box.VideoSamples, indices: list[int]) -> list[bytes]:
    """The bytes of samples ``indices`` of ``source`` (the keyframes a shard's quantile sample
    decodes)."""
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
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


def stream_frames(stream: av.video.stream.VideoStream) -> int:
    return int(stream.frames or 0)


def decode_frame_times(path: Path) -> list[float]:
    """Presentation time (seconds) of every decoded frame of ``path``, in order."""
    times = []
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        for frame in container.decode(stream):
            times.append(float(frame.pts * frame.time_base))
    return times


def decode_frames(path: Path) -> Iterator[tuple[float, np.ndarray]]:
    """Every frame of ``path`` in order as (presentation time in seconds, (H, W, 3) uint8 RGB)."""
    reformatter = VideoReformatter()
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        for frame in container.decode(stream):
            rgb = reformatter.reformat(frame, format="rgb24").to_ndarray()
            yield float(frame.pts * frame.time_base), rgb


def decode_keyframes(params: StreamParams, packets: list[bytes], sink: FrameSink) -> int:
    """Decode keyframe packets (from ``VideoShardWriter.append``) with a fresh decoder of the
    stream's codec and extradata; each RGB frame goes to ``sink``. Returns the frame count.

    PyAV releases the GIL while decoding and converting, so this runs well in a worker thread
    next to the packet copy.
    """
    ctx = av.CodecContext.create(params.codec, "r")
    if params.extradata:
        ctx.extradata = params.extradata
    ctx.thread_count = 1
    # One reformatter for all frames: ``frame.to_ndarray(format=...)`` builds a new swscale
    # context per frame, which costs ~100x the conversion of a small frame.
    reformatter = VideoReformatter()
    n = 0
    for data in [*packets, None]:
        for frame in ctx.decode(av.Packet(data) if data is not None else None):
            sink(reformatter.reformat(frame, format="rgb24").to_ndarray())
            n += 1
    return n
