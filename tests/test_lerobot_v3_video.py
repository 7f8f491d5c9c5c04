"""Packet-copy MP4 concatenation for LeRobot v3.0 video shards, on real PyAV-encoded H.264 files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from eva.dataset import mp4box
from eva.dataset.video import count_decoded_frames
from eva.formats.lerobot_v3 import (
    VideoConcatError,
    VideoShardWriter,
    decode_frame_times,
    probe,
)

pytestmark = pytest.mark.kernel_independent

FPS = 30


def encode_h264(
    path: Path, frames: np.ndarray, fps: int = FPS, gop: int = 10, bframes: int = 0
) -> None:
    """Like the raw writer: libx264, yuv420p, fixed GOP, no scene-cut keyframes, no B-frames."""
    n, h, w, _ = frames.shape
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        stream.codec_context.options = {
            "g": str(gop),
            "keyint_min": str(gop),
            "sc_threshold": "0",
            "bf": str(bframes),
            "preset": "ultrafast",
        }
        for i in range(n):
            frame = av.VideoFrame.from_ndarray(frames[i], format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def synthetic_frames(n: int, seed: int, w: int = 64, h: int = 48) -> np.ndarray:
    """Smooth, distinct-per-frame images (random noise would be mush after lossy coding)."""
    yy, xx = np.mgrid[0:h, 0:w]
    out = np.empty((n, h, w, 3), np.uint8)
    for i in range(n):
        out[i, ..., 0] = (xx * 3 + i * 5 + seed * 40) % 256
        out[i, ..., 1] = (yy * 4 + i * 3) % 256
        out[i, ..., 2] = (seed * 70 + i * 9) % 256
    return out


def decode_all(path: Path) -> list[tuple[float, np.ndarray]]:
    with av.open(str(path)) as container:
        return [
            (float(f.pts * f.time_base), f.to_ndarray(format="rgb24"))
            for f in container.decode(video=0)
        ]


@pytest.fixture
def episodes(tmp_path: Path) -> list[tuple[Path, int]]:
    out = []
    for seed, n in enumerate((12, 7, 23)):
        p = tmp_path / f"episode_{seed:06d}.mp4"
        encode_h264(p, synthetic_frames(n, seed))
        out.append((p, n))
    return out


def test_concatenation_decodes_every_source_frame_at_from_timestamp_plus_t(
    tmp_path: Path, episodes: list[tuple[Path, int]]
) -> None:
    shard = tmp_path / "shard.mp4"
    writer = VideoShardWriter(shard)
    placed = [writer.append(p) for p, _ in episodes]
    writer.close()

    decoded = decode_all(shard)
    assert len(decoded) == sum(n for _, n in episodes)
    by_time = {round(t, 4): img for t, img in decoded}
    for (source, n), ep in zip(episodes, placed, strict=True):
        assert ep.packets == n == ep.container_frames
        assert ep.to_timestamp == pytest.approx(ep.from_timestamp + n / FPS, abs=1e-9)
        source_frames = decode_all(source)
        assert len(source_frames) == n
        for t, (src_t, src_img) in enumerate(source_frames):
            assert src_t == pytest.approx(t / FPS, abs=1e-9)
            img = by_time[round(ep.from_timestamp + t / FPS, 4)]
            # Same compressed packets, decoded from the same keyframe: bit-identical pixels.
            np.testing.assert_array_equal(img, src_img)
    # Episodes abut: the next starts where the previous ended.
    for a, b in zip(placed, placed[1:], strict=False):
        assert b.from_timestamp == a.to_timestamp


def test_timestamps_are_continuous_and_counts_agree(
    tmp_path: Path, episodes: list[tuple[Path, int]]
) -> None:
    shard = tmp_path / "shard.mp4"
    writer = VideoShardWriter(shard)
    for p, _ in episodes:
        writer.append(p)
    writer.close()
    total = sum(n for _, n in episodes)
    times = decode_frame_times(shard)
    np.testing.assert_allclose(times, np.arange(total) / FPS, atol=1e-9)
    info = probe(shard)
    assert info.frames == total
    assert count_decoded_frames(shard) == total
    assert writer.duration_s == pytest.approx(total / FPS)


def test_incompatible_stream_is_refused_and_names_the_difference(
    tmp_path: Path, episodes: list[tuple[Path, int]]
) -> None:
    small = tmp_path / "small.mp4"
    encode_h264(small, synthetic_frames(5, 9, w=32, h=48))
    other_rate = tmp_path / "rate.mp4"
    encode_h264(other_rate, synthetic_frames(5, 9), fps=15)
    writer = VideoShardWriter(tmp_path / "shard.mp4")
    writer.append(episodes[0][0])
    with pytest.raises(VideoConcatError, match="width 64 != 32"):
        writer.append(small)
    assert not probe(episodes[0][0]).params.compatible_with(probe(other_rate).params)
    # A refused episode leaves the shard usable.
    writer.append(episodes[1][0])
    writer.close()
    assert count_decoded_frames(tmp_path / "shard.mp4") == episodes[0][1] + episodes[1][1]


def test_abort_removes_the_partial_shard(tmp_path: Path, episodes: list[tuple[Path, int]]) -> None:
    shard = tmp_path / "shard.mp4"
    writer = VideoShardWriter(shard)
    writer.append(episodes[0][0])
    writer.abort()
    assert not shard.exists()


def test_unreadable_source_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"not a video")
    with pytest.raises(VideoConcatError, match="bad.mp4"):
        probe(bad)
    writer = VideoShardWriter(tmp_path / "shard.mp4")
    with pytest.raises(VideoConcatError, match="bad.mp4"):
        writer.append(bad)
    writer.abort()


def test_streams_with_b_frames_concatenate_with_exact_lookups(tmp_path: Path) -> None:
    """Not what the raw writer produces, but LeRobot-written H.264 has B-frames: the shifted
    negative first dts keeps decode order monotonic and every frame is at from_timestamp + t."""
    sources = []
    for seed, n in enumerate((16, 11, 20)):
        p = tmp_path / f"b{seed}.mp4"
        encode_h264(p, synthetic_frames(n, seed), bframes=2)
        sources.append((p, n))
    with av.open(str(sources[0][0])) as container:
        packets = [pk for pk in container.demux(video=0) if pk.size]
        assert any(pk.pts != pk.dts for pk in packets)  # really reordered
    shard = tmp_path / "shard.mp4"
    writer = VideoShardWriter(shard)
    placed = [writer.append(p) for p, _ in sources]
    writer.close()
    by_time = {round(t, 4): img for t, img in decode_all(shard)}
    assert len(by_time) == sum(n for _, n in sources)
    previous_end = 0.0
    for (source, n), ep in zip(sources, placed, strict=True):
        assert ep.packets == n
        assert ep.from_timestamp == pytest.approx(previous_end, abs=1e-9)
        assert ep.to_timestamp == pytest.approx(ep.from_timestamp + n / FPS, abs=1e-9)
        previous_end = ep.to_timestamp
        for t, (_, img) in enumerate(decode_all(source)):
            np.testing.assert_array_equal(by_time[round(ep.from_timestamp + t / FPS, 4)], img)


def test_sample_table_copy_writes_the_same_shard_as_the_demux_copy(
    tmp_path: Path, episodes: list[tuple[Path, int]]
) -> None:
    """The packet copy from the box tables (no FFmpeg open per episode) produces the very bytes
    of the copy through FFmpeg's demuxer, and the same locators."""
    from eva.formats.lerobot_v3 import EpisodeVideo, ParamsCache

    cache = ParamsCache()
    fast = VideoShardWriter(tmp_path / "fast.mp4", splice=False)
    slow = VideoShardWriter(tmp_path / "slow.mp4")
    fast_keys: list[bytes] = []
    slow_keys: list[bytes] = []
    for path, _ in episodes:
        with EpisodeVideo(path, cache) as video:
            assert video.samples is not None
            placed_fast = fast.append(video, fast_keys)
        with EpisodeVideo(path) as video:
            video.samples = None  # force FFmpeg's demuxer
            placed_slow = slow.append(video, slow_keys)
        assert placed_fast == placed_slow
    fast.close()
    slow.close()
    assert (tmp_path / "fast.mp4").read_bytes() == (tmp_path / "slow.mp4").read_bytes()
    assert fast_keys == slow_keys and fast_keys
    # The three episodes share one encoder configuration: FFmpeg was opened for the first only.
    assert cache.opens == 1


def _demuxed(path: Path) -> list[tuple[Any, ...]]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        packets = [
            (p.pts, p.dts, p.duration, p.is_keyframe, bytes(p))
            for p in container.demux(stream)
            if p.size
        ]
        return [(stream.time_base, stream.frames, stream.codec_context.extradata)] + packets


@pytest.mark.parametrize("bframes", [0, 2])
def test_spliced_shard_demuxes_and_decodes_as_ffmpegs_muxer_output(
    tmp_path: Path, bframes: int
) -> None:
    """The spliced shard (sample tables written by eva, bytes copied by the kernel) gives every
    reader what FFmpeg's muxer output gives: the same packets with the same pts, dts, duration
    and flags, the same frames, and the same locators; mixed with a demuxed episode (spilled)."""
    from eva.formats.lerobot_v3 import EpisodeVideo

    sources = []
    for seed, n in enumerate((16, 11, 20)):
        p = tmp_path / f"s{seed}.mp4"
        encode_h264(p, synthetic_frames(n, seed), bframes=bframes)
        sources.append(p)
    outputs = {}
    for name, splice, demux_second in (
        ("ffmpeg", False, False),
        ("spliced", True, False),
        ("mixed", True, True),
    ):
        writer = VideoShardWriter(tmp_path / f"{name}.mp4", splice=splice)
        placed, keys = [], []
        for i, path in enumerate(sources):
            with EpisodeVideo(path) as video:
                assert video.samples is not None
                if demux_second and i == 1:
                    video.samples = None
                placed.append(writer.append(video, keys))
        writer.close()
        outputs[name] = (placed, keys, _demuxed(writer.path), decode_all(writer.path))
        assert not list(tmp_path.glob("*.spill"))
    reference = outputs["ffmpeg"]
    for name in ("spliced", "mixed"):
        placed, keys, packets, frames = outputs[name]
        assert placed == reference[0] and keys == reference[1], name
        assert packets == reference[2], name
        assert len(frames) == len(reference[3])
        for (t, img), (t_ref, img_ref) in zip(frames, reference[3], strict=True):
            assert t == t_ref
            np.testing.assert_array_equal(img, img_ref)
    # the box parser reads the spliced shard back (a later export's source could be one)
    table = mp4box.read_video_samples(tmp_path / "spliced.mp4")
    assert table.track.sample_count == 47


def test_abort_removes_a_spliced_shard_and_its_spill(tmp_path: Path) -> None:
    from eva.formats.lerobot_v3 import EpisodeVideo

    src = tmp_path / "a.mp4"
    encode_h264(src, synthetic_frames(8, 0))
    writer = VideoShardWriter(tmp_path / "out" / "shard.mp4")
    writer.append(src)
    with EpisodeVideo(src) as video:
        video.samples = None
        writer.append(video)
    assert list((tmp_path / "out").glob("*.spill"))
    writer.abort()
    assert list((tmp_path / "out").iterdir()) == []


def test_params_from_the_cache_equal_ffmpegs(
    tmp_path: Path, episodes: list[tuple[Path, int]]
) -> None:
    from eva.formats.lerobot_v3 import EpisodeVideo, ParamsCache

    cache = ParamsCache()
    for path, n in episodes:
        with EpisodeVideo(path, cache) as cached:
            assert cached.info.params == probe(path).params
            assert cached.info.frames == n
    other = tmp_path / "other.mp4"
    encode_h264(other, synthetic_frames(5, 0, w=32, h=32))
    with EpisodeVideo(other, cache) as video:
        assert video.info.params == probe(other).params
    assert cache.opens == 2
