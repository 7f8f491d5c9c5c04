"""The lerobot_v3 export's fast paths write what the slow ones do.

* B-frame H.264 (High profile, x264 preset medium, scene-cut keyframes, as cameras record it) is
  copied from the box tables without an FFmpeg open per episode; the shard has the very bytes of
  the copy through FFmpeg's demuxer, and every frame decodes to the source's pixels at
  ``from_timestamp + t / fps``.
* ``import eva.cli`` (what ``eva --help`` runs) loads no media or table library.
"""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from eva.formats.lerobot_v3 import EpisodeVideo, ParamsCache, VideoShardWriter

FPS = 30


def camera_frames(n: int, seed: int, w: int = 96, h: int = 64) -> np.ndarray:
    """Moving texture plus noise, with a cut in the middle so x264 places a scene-cut keyframe."""
    rng = np.random.default_rng(seed)
    texture = rng.integers(0, 256, size=(h * 2, w * 2, 3), dtype=np.uint8)
    texture = np.repeat(np.repeat(texture[::4, ::4], 4, axis=0), 4, axis=1)
    out = np.empty((n, h, w, 3), np.uint8)
    for i in range(n):
        y, x = (i * 2) % h, (i * 3) % w
        out[i] = texture[y : y + h, x : x + w]
        if i >= n // 2:  # the scene cut
            out[i] = 255 - out[i]
    return out


def encode_high(path: Path, frames: np.ndarray, options: dict[str, str]) -> Path:
    """libx264 with the given options (no fixed GOP: x264's own keyframe placement)."""
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=FPS, options=options)
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = "yuv420p"
        stream.codec_context.time_base = Fraction(1, FPS)
        for i, image in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts = i
            frame.time_base = stream.codec_context.time_base
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return path


LAYOUTS = [
    pytest.param({"preset": "medium", "profile": "high", "bf": "3"}, id="high-medium-bf3"),
    pytest.param({"preset": "veryfast", "bf": "2", "x264-params": "b-pyramid=none"}, id="bf2"),
    pytest.param({"preset": "ultrafast", "bf": "0"}, id="no-bframes"),
]


def decode(path: Path) -> list[tuple[Fraction, np.ndarray]]:
    with av.open(str(path)) as container:
        return [
            (Fraction(f.pts) * f.time_base, f.to_ndarray(format="rgb24"))
            for f in container.decode(video=0)
        ]


def demuxed(path: Path) -> list[tuple[object, ...]]:
    """Every packet as a reader's demuxer gives it: pts, dts, duration, flag, bytes."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return [(stream.time_base, stream.frames)] + [
            (p.pts, p.dts, p.duration, p.is_keyframe, bytes(p))
            for p in container.demux(stream)
            if p.size
        ]


@pytest.mark.kernel_independent
@pytest.mark.parametrize("options", LAYOUTS)
def test_bframe_sample_copy_equals_the_demux_copy_and_decodes_every_frame(
    tmp_path: Path, options: dict[str, str]
) -> None:
    sources = [
        encode_high(tmp_path / f"e{i}.mp4", camera_frames(n, i), options)
        for i, n in enumerate((40, 23, 31))
    ]
    cache = ParamsCache()
    fast = VideoShardWriter(tmp_path / "fast.mp4", splice=False)
    slow = VideoShardWriter(tmp_path / "slow.mp4")
    spliced = VideoShardWriter(tmp_path / "spliced.mp4")
    fast_keys: list[bytes] = []
    slow_keys: list[bytes] = []
    spliced_keys: list[bytes] = []
    placed = []
    for path in sources:
        with EpisodeVideo(path, cache) as video:
            assert video.samples is not None  # the box parser vouches: no FFmpeg demux
            placed.append(fast.append(video, fast_keys))
            assert spliced.append(video, spliced_keys) == placed[-1]
        with EpisodeVideo(path) as video:
            video.samples = None  # force FFmpeg's demuxer (the path every B-frame file took)
            assert slow.append(video, slow_keys) == placed[-1]
    fast.close()
    slow.close()
    spliced.close()
    assert (tmp_path / "fast.mp4").read_bytes() == (tmp_path / "slow.mp4").read_bytes()
    assert fast_keys == slow_keys == spliced_keys and fast_keys
    # The spliced shard (tables written by eva) demuxes to the very packets of FFmpeg's output.
    assert demuxed(tmp_path / "spliced.mp4") == demuxed(tmp_path / "fast.mp4")
    assert [t for t, _ in decode(tmp_path / "spliced.mp4")] == [
        t for t, _ in decode(tmp_path / "fast.mp4")
    ]
    if options["bf"] != "0":  # the layout really is what it says
        assert len(fast_keys) > len(sources)  # scene-cut keyframes
        with av.open(str(sources[0])) as container:
            assert any(p.pts != p.dts for p in container.demux(video=0) if p.size)
    assert cache.opens == 1  # one configuration: FFmpeg opened for the first episode only

    shard = decode(tmp_path / "fast.mp4")
    by_time = {t: image for t, image in shard}
    assert len(by_time) == len(shard) == sum(len(decode(p)) for p in sources)
    for path, episode in zip(sources, placed, strict=True):
        start = Fraction(episode.from_timestamp).limit_denominator(1 << 20)
        for t, (pts, image) in enumerate(decode(path)):
            assert pts == Fraction(t, FPS)
            np.testing.assert_array_equal(by_time[start + Fraction(t, FPS)], image)


def test_cli_import_loads_no_media_or_table_library() -> None:
    """``eva --help`` and ``eva export --help`` must not pay for av, pyarrow, h5py, mcap, numpy."""
    code = (
        "import sys, eva.cli\n"
        "from click.testing import CliRunner\n"
        "for args in ([], ['--help'], ['export', '--help']):\n"
        "    CliRunner().invoke(eva.cli.main, args)\n"
        "heavy = ('av', 'pyarrow', 'h5py', 'mcap', 'numpy')\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == ""


@pytest.mark.kernel_independent
@pytest.mark.parametrize("options", LAYOUTS[:2])
def test_seeking_to_a_parsed_keyframe_dts_decodes_that_keyframe(
    tmp_path: Path, options: dict[str, str]
) -> None:
    """The validator's keyframe check (``decode_check``) now gets B-frame files' keyframe times
    from the box tables too: seeking to a keyframe's pts lands on that keyframe (its dts, shifted
    by the reorder delay, would land on the keyframe before: FFmpeg seeks by presentation)."""
    from eva.dataset import decode_check, mp4box

    path = encode_high(tmp_path / "k.mp4", camera_frames(60, 3), options)
    samples = mp4box.read_video_samples(path)
    keys = np.flatnonzero(samples.keyframes)
    assert len(keys) >= 2 and samples.dts[0] < 0
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        for k in keys:
            container.seek(int(samples.pts[k]), stream=stream, backward=True, any_frame=False)
            frame = next(iter(container.decode(stream)))
            assert frame.pts == samples.pts[k]
    assert decode_check._keyframe_times(samples, len(keys))[0] == samples.pts[keys].tolist()
    decode_check.check_keyframes(path)
