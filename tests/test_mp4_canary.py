"""Canary: eva's MP4 box parser and its v3 shard splice against FFmpeg's demuxer, through PyAV.

eva reads episode MP4s from their sample tables (``eva.dataset.mp4box``) and writes v3 video
shards from them without FFmpeg (``eva.formats.lerobot_v3.splice``): both must give exactly the
packets FFmpeg's demuxer gives. A PyAV (FFmpeg) release that demuxed differently (another edit
list rule, other timestamps, other keyframe flags) fails here, naming the layout, the file and the
packet, before a shard that LeRobot would read otherwise is written.

For each codec and B-frame layout eva vouches for, encoded here by the installed PyAV: H.264
without B-frames (eva's own writer; a keyframe per frame; one keyframe in the whole episode),
H.264 with B-frames (x264's defaults, B-pyramid; moov first), HEVC with and without B-frames,
and AV1 (eva's libsvtav1 writer), whichever this PyAV build can encode:

- each episode file: every sample's byte offset and size (its bytes), pts, dts, duration and
  keyframe flag equal PyAV's demuxed packet, packet by packet;
- a v3 shard spliced from the episodes (eva's own boxes) read back by PyAV: the same packets, in
  the same order, with the same timestamps and flags as the shard FFmpeg's muxer writes from them,
  the episodes' timestamps running on; eva's parser agrees with PyAV on the spliced shard too; and
  both shards decode to the same pixels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from eva.dataset import mp4box
from eva.dataset.video import VideoEncoder, VideoOptions
from eva.formats.lerobot_v3 import VideoShardWriter

pytestmark = pytest.mark.kernel_independent

FPS = 30
H, W = 48, 64
ADAPT = (
    f"eva's MP4 parser or shard splice and FFmpeg's demuxer (PyAV {av.__version__}) disagree: "
    "adapt eva/dataset/mp4box or eva/formats/lerobot_v3/splice.py, then move the av bound in "
    "pyproject.toml and the Makefile"
)


@dataclass(frozen=True)
class Layout:
    """How an episode is encoded: by eva's writer (``options``) or plain PyAV (``codec``)."""

    codec: str
    frames: tuple[int, ...]  # one episode each
    options: VideoOptions | None = None  # eva's own writer
    codec_options: dict[str, str] = field(default_factory=dict)  # plain PyAV
    container_options: dict[str, str] = field(default_factory=dict)
    bframes: bool = False


LAYOUTS = {
    "h264": Layout("libx264", (17, 30), VideoOptions(gop=5)),
    "h264-all-keyframes": Layout("libx264", (9, 4), VideoOptions(gop=1)),
    "h264-long-gop": Layout("libx264", (40, 25), VideoOptions(gop=300)),
    # x264's B-frame defaults (3, B-pyramid), keyframes at fixed places (a scene cut right after
    # the first keyframe is a layout the parser leaves to FFmpeg)
    "h264-bframes": Layout(
        "libx264", (40, 23), codec_options={"x264-params": "keyint=12:scenecut=0"}, bframes=True
    ),
    "h264-bframes-faststart": Layout(
        "libx264",
        (30, 31),
        codec_options={"bf": "2", "x264-params": "keyint=7:scenecut=0"},
        container_options={"movflags": "+faststart"},
        bframes=True,
    ),
    "hevc": Layout(
        "libx265", (20, 12), codec_options={"x265-params": "bframes=0:keyint=10:log-level=none"}
    ),
    "hevc-bframes": Layout(
        "libx265",
        (24, 18),
        codec_options={"x265-params": "bframes=3:keyint=12:log-level=none"},
        bframes=True,
    ),
    "av1": Layout("libsvtav1", (12, 9), VideoOptions(codec="libsvtav1", preset="12", gop=5)),
}


def _encodable(codec: str) -> bool:
    return codec in av.codecs_available


def images(n: int, seed: int) -> np.ndarray:
    """Smooth, per-frame distinct images (noise would be mush after lossy coding)."""
    yy, xx = np.mgrid[0:H, 0:W]
    out = np.empty((n, H, W, 3), np.uint8)
    for i in range(n):
        out[i, ..., 0] = (xx * 3 + i * 5 + seed * 40) % 256
        out[i, ..., 1] = (yy * 4 + i * 3) % 256
        out[i, ..., 2] = (seed * 70 + i * 9) % 256
    return out


def encode(layout: Layout, path: Path, n: int, seed: int) -> Path:
    if layout.options is not None:
        with VideoEncoder(path, W, H, FPS, layout.options) as encoder:
            encoder.write(images(n, seed))
        return path
    with av.open(str(path), "w", format="mp4", options=layout.container_options) as container:
        stream = container.add_stream(layout.codec, rate=FPS, options=layout.codec_options)
        stream.width, stream.height, stream.pix_fmt = W, H, "yuv420p"
        stream.codec_context.time_base = Fraction(1, FPS)
        for i, image in enumerate(images(n, seed)):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts = i
            frame.time_base = stream.codec_context.time_base
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path


@dataclass(frozen=True)
class Packet:
    pts: int
    dts: int
    duration: int
    keyframe: bool
    data: bytes


def demuxed(path: Path) -> list[Packet]:
    """Every packet FFmpeg's demuxer delivers (the end-of-stream flush packet left out)."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return [
            Packet(int(p.pts), int(p.dts), int(p.duration or 0), p.is_keyframe, bytes(p))
            for p in container.demux(stream)
            if p.size > 0
        ]


def decoded(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def assert_parser_is_the_demuxer(path: Path, what: str) -> mp4box.VideoSamples:
    """eva's sample table of ``path`` against PyAV's packets, packet by packet."""
    samples = mp4box.read_video_samples(path)
    packets = demuxed(path)
    data = path.read_bytes()
    assert len(packets) == len(samples.sizes), f"{what}: packet count: {ADAPT}"
    for i, packet in enumerate(packets):
        offset, size = int(samples.offsets[i]), int(samples.sizes[i])
        parsed = Packet(
            int(samples.pts[i]),
            int(samples.dts[i]),
            int(samples.durations[i]),
            bool(samples.keyframes[i]),
            data[offset : offset + size],
        )
        assert parsed == packet, f"{what}: packet {i} (byte {offset}, {size} bytes): {ADAPT}"
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert stream.time_base == Fraction(1, samples.track.timescale), f"{what}: {ADAPT}"
        assert bytes(stream.codec_context.extradata or b"") == samples.entry.config, what
    return samples


def shard(parts: list[Path], path: Path, splice: bool) -> Path:
    writer = VideoShardWriter(path, splice=splice)
    for part in parts:
        writer.append(part)
    writer.close()
    return path


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def episodes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, list[Path]]:
    name = str(request.param)
    layout = LAYOUTS[name]
    if not _encodable(layout.codec):
        pytest.skip(f"this PyAV build has no {layout.codec} encoder")
    root = tmp_path_factory.mktemp(f"mp4-canary-{name}")
    parts = [encode(layout, root / f"e{i}.mp4", n, i) for i, n in enumerate(layout.frames)]
    return name, parts


def test_episode_samples_are_the_demuxed_packets(episodes: tuple[str, list[Path]]) -> None:
    name, parts = episodes
    layout = LAYOUTS[name]
    for path, frames in zip(parts, layout.frames, strict=True):
        samples = assert_parser_is_the_demuxer(path, f"{name} {path.name}")
        assert len(samples.sizes) == frames
        reordered = bool(np.any(samples.pts != samples.dts))
        assert reordered == layout.bframes, f"{name}: B-frames {reordered}, expected otherwise"


def test_spliced_shard_is_what_ffmpeg_muxes(episodes: tuple[str, list[Path]]) -> None:
    name, parts = episodes
    root = parts[0].parent
    spliced = shard(parts, root / "spliced.mp4", splice=True)
    muxed = shard(parts, root / "muxed.mp4", splice=False)
    # eva's boxes, not FFmpeg's muxer: the parser vouched for the episodes
    assert spliced.read_bytes() != muxed.read_bytes(), f"{name}: the shard was not spliced"
    packets = demuxed(spliced)
    assert packets == demuxed(muxed), f"{name}: spliced shard read back by PyAV: {ADAPT}"
    # The episodes' packets, their timestamps running on from one episode to the next.
    expected: list[Packet] = []
    start = 0
    for part in parts:
        source = demuxed(part)
        shift = start - source[0].pts
        expected += [
            Packet(p.pts + shift, p.dts + shift, p.duration, p.keyframe, p.data) for p in source
        ]
        start = max(p.pts + shift + max(p.duration, 1) for p in source)
    assert [(p.pts, p.dts, p.keyframe, p.data) for p in packets] == [
        (p.pts, p.dts, p.keyframe, p.data) for p in expected
    ], f"{name}: {ADAPT}"
    assert_parser_is_the_demuxer(spliced, f"{name} spliced shard")
    frames = decoded(spliced)
    assert len(frames) == sum(LAYOUTS[name].frames)
    assert all(np.array_equal(a, b) for a, b in zip(frames, decoded(muxed), strict=True)), name
