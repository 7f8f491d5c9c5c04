"""Packet-copy concatenation of per-episode MP4s into LeRobot v3.0 video shards: the episode side.

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
  ``av1C`` without its sequence header) are opened with FFmpeg every time;
* for every file the box parser does not vouch for (edit lists that hide frames, B-frames
  without an edit list, fragmented files...): the demux path. B-frame files as
  FFmpeg's muxer writes them (composition offsets under one edit whose ``media_time`` is the
  first presentation time) are read from the tables too: the parser gives FFmpeg's shifted pts
  and dts, compared with its demuxer packet by packet in the tests.

Writing: a shard whose first episode the box parser vouches for is spliced
(``eva.formats.lerobot_v3.splice``): eva writes the MP4's boxes from the parsed sample tables and the
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

import os
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av

from eva.dataset import fsafe, mp4box
from eva.formats._decode import VideoOpenError, open_video


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


def probe(source: fsafe.Readable) -> EpisodeVideoInfo:
    """Read the stream parameters and the sample count of ``source`` without decoding."""
    path = fsafe.name_of(source)
    try:
        container, stream = open_video(source)
    except VideoOpenError as e:
        raise VideoConcatError(str(e)) from None
    with container:
        return EpisodeVideoInfo(
            params=_stream_params(stream, path),
            frames=int(stream.frames or 0),
            size_bytes=_file_size(source),
        )


def _file_size(source: fsafe.Readable) -> int:
    """The size of ``source``, from a new open of it (a dataset's file: beneath its root)."""
    fd = fsafe.open_readable(source)
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


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

    def __init__(self, source: fsafe.Readable, params_cache: ParamsCache | None = None) -> None:
        # a dataset's file is a FileBeneath: every open of it (the box parser's, FFmpeg's, the
        # packet copy's) is beneath the dataset root; ``path`` only names it
        self.source = source if isinstance(source, fsafe.FileBeneath) else Path(source)
        self.path = fsafe.name_of(source)
        self._container: av.container.InputContainer | None = None
        self._stream: av.video.stream.VideoStream | None = None
        self.samples: mp4box.VideoSamples | None
        try:
            self.samples = mp4box.read_video_samples(self.source)
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
        size = _file_size(self.source)
        return EpisodeVideoInfo(params=params, frames=frames, size_bytes=size)

    @property
    def stream(self) -> av.video.stream.VideoStream:
        """The PyAV video stream (the file is opened, and probed, on first use)."""
        if self._stream is None:
            try:
                self._container, self._stream = open_video(self.source)
            except VideoOpenError as e:
                raise VideoConcatError(str(e)) from None
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
def stream_frames(stream: av.video.stream.VideoStream) -> int:
    return int(stream.frames or 0)
