"""The MP4 box parser's frame count equals what PyAV decodes, or it steps aside for PyAV.

Real files only: eva's own writer (libx264, libsvtav1), plain PyAV muxing (moov after mdat by
default, moov first with ``+faststart``, fragmented, B-frames), the LeRobot-written fixture, a
v3.0 packet-copied shard, and byte-level edits of real files (edit lists, 64-bit sizes, cuts).
"""

from __future__ import annotations

import struct
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import av
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eva.dataset import mp4box
from eva.dataset.errors import DatasetError
from eva.dataset.video import VideoEncoder, VideoOptions, count_decoded_frames, count_frames
from eva.formats.lerobot_v3 import VideoShardWriter

pytestmark = pytest.mark.kernel_independent

FPS = 30
H, W = 48, 64


def images(n: int, seed: int = 0) -> np.ndarray:
    """Smooth, per-frame distinct images (noise would be mush after lossy coding)."""
    yy, xx = np.mgrid[0:H, 0:W]
    out = np.empty((n, H, W, 3), np.uint8)
    for i in range(n):
        out[i, ..., 0] = (xx * 3 + i * 5 + seed * 40) % 256
        out[i, ..., 1] = (yy * 4 + i * 3) % 256
        out[i, ..., 2] = (seed * 70 + i * 9) % 256
    return out


def eva_video(path: Path, n: int, options: VideoOptions | None = None) -> Path:
    with VideoEncoder(path, W, H, FPS, options) as encoder:
        encoder.write(images(n))
    return path


def pyav_video(
    path: Path,
    n: int,
    container_options: dict[str, str] | None = None,
    codec_options: dict[str, str] | None = None,
    video_streams: int = 1,
) -> Path:
    """Plain PyAV libx264 muxing (x264 defaults unless ``codec_options`` say otherwise)."""
    with av.open(str(path), "w", format="mp4", options=container_options or {}) as container:
        streams = []
        for _ in range(video_streams):
            stream = container.add_stream("libx264", rate=FPS, options=codec_options or {})
            stream.width, stream.height, stream.pix_fmt = W, H, "yuv420p"
            stream.codec_context.time_base = Fraction(1, FPS)
            streams.append(stream)
        for i, image in enumerate(images(n)):
            for stream in streams:
                frame = av.VideoFrame.from_ndarray(image, format="rgb24")
                frame.pts = i
                frame.time_base = stream.codec_context.time_base
                for packet in stream.encode(frame):
                    container.mux(packet)
        for stream in streams:
            for packet in stream.encode(None):
                container.mux(packet)
    return path


NO_BFRAMES = {"x264-params": "bframes=0"}


def top_level(path: Path) -> list[tuple[bytes, int, int]]:
    """(type, offset, size) of the top-level boxes (32-bit sizes only: what these tests write)."""
    data = path.read_bytes()
    boxes, offset = [], 0
    while offset < len(data):
        size, box_type = struct.unpack_from(">I4s", data, offset)
        boxes.append((box_type, offset, size))
        offset += size
    return boxes


def find_box(data: bytes, box_type: bytes) -> int:
    """Offset of the (only) box of that type, located by its type code (fine for tiny files)."""
    at = data.find(box_type)
    assert at >= 4 and data.find(box_type, at + 1) == -1, box_type
    return at - 4


def assert_counts(path: Path, expected: int | None = None) -> None:
    decoded = count_decoded_frames(path)
    assert count_frames(path) == decoded
    if expected is not None:
        assert decoded == expected


def demuxed_frames(path: Path) -> int:
    """FFmpeg's own view without decoding: packets with data that the edit list does not drop."""
    with av.open(str(path), metadata_errors="replace") as container:
        stream = container.streams.video[0]
        return sum(1 for p in container.demux(stream) if p.size > 0 and not p.is_discard)


# --- files eva, PyAV and LeRobot write: the box parser answers, and it is right -------------------


@pytest.mark.parametrize("frames", [1, 2, 17, 40])
@pytest.mark.parametrize("gop", [1, 5, 30])
def test_eva_h264_counts_from_boxes_equal_decoded(tmp_path: Path, frames: int, gop: int) -> None:
    path = eva_video(tmp_path / "v.mp4", frames, VideoOptions(gop=gop))
    assert mp4box.count_video_samples(path) == frames
    assert_counts(path, frames)


def test_eva_av1_counts_from_boxes_equal_decoded(tmp_path: Path) -> None:
    path = eva_video(tmp_path / "v.mp4", 12, VideoOptions(codec="libsvtav1", preset="12", gop=5))
    assert mp4box.count_video_samples(path) == 12
    assert_counts(path, 12)


def test_lerobot_fixture_counts_from_boxes_equal_decoded(lerobot_fixture_dir: Path) -> None:
    videos = sorted(lerobot_fixture_dir.glob("videos/*/*/*.mp4"))
    assert videos
    for path in videos:
        assert mp4box.count_video_samples(path) == count_decoded_frames(path)
        assert_counts(path)


def packet_copied_shard(tmp_path: Path) -> Path:
    """Two eva episodes (7 + 12 frames) concatenated by the v3 exporter's packet copy."""
    parts = [
        eva_video(tmp_path / f"e{i}.mp4", n, VideoOptions(gop=5)) for i, n in enumerate((7, 12))
    ]
    writer = VideoShardWriter(tmp_path / "shard.mp4")
    for part in parts:
        writer.append(part)
    writer.close()
    return tmp_path / "shard.mp4"


def test_v3_packet_copied_shard(tmp_path: Path) -> None:
    shard = packet_copied_shard(tmp_path)
    assert mp4box.count_video_samples(shard) == 19
    assert_counts(shard, 19)


def test_moov_after_mdat_by_default_and_first_with_faststart(tmp_path: Path) -> None:
    default = pyav_video(tmp_path / "default.mp4", 9, codec_options=NO_BFRAMES)
    faststart = pyav_video(
        tmp_path / "fast.mp4", 9, {"movflags": "+faststart"}, codec_options=NO_BFRAMES
    )
    default_order = [t for t, _, _ in top_level(default) if t in (b"moov", b"mdat")]
    fast_order = [t for t, _, _ in top_level(faststart) if t in (b"moov", b"mdat")]
    assert default_order == [b"mdat", b"moov"]
    assert fast_order == [b"moov", b"mdat"]
    for path in (default, faststart):
        assert mp4box.count_video_samples(path) == 9
        assert_counts(path, 9)


def test_64bit_largesize_mdat(tmp_path: Path) -> None:
    """FFmpeg leaves an 8-byte 'free' box before mdat so that mdat can grow a 64-bit size in place:
    do exactly that (the sample offsets stay valid)."""
    path = eva_video(tmp_path / "v.mp4", 10)
    data = bytearray(path.read_bytes())
    (free, free_at, free_size), (mdat, mdat_at, mdat_size) = top_level(path)[1:3]
    assert (free, free_size, mdat, mdat_at) == (b"free", 8, b"mdat", free_at + 8)
    data[free_at : mdat_at + 8] = struct.pack(">I4sQ", 1, b"mdat", mdat_size + 8)
    path.write_bytes(bytes(data))
    assert mp4box.count_video_samples(path) == 10
    assert_counts(path, 10)


def test_large_moov_is_walked_box_by_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Above MOOV_READ_LIMIT the moov is not read in one go: same answers, read box by box."""
    h264 = eva_video(tmp_path / "v.mp4", 11, VideoOptions(gop=4))
    bframes = pyav_video(tmp_path / "b.mp4", 13)
    monkeypatch.setattr(mp4box, "MOOV_READ_LIMIT", 0)
    assert mp4box.count_video_samples(h264) == 11
    assert mp4box.count_video_samples(bframes) == 13


def test_track_details(tmp_path: Path) -> None:
    track = mp4box.read_video_track(eva_video(tmp_path / "v.mp4", 10))
    assert track.sample_count == 10
    assert Fraction(track.sample_duration_total, track.timescale) == Fraction(10, FPS)
    assert track.duration == track.sample_duration_total
    assert track.track_id == 1


# --- files the parser cannot vouch for: PyAV counts, and is right ----------------------------------


def test_fragmented_mp4_falls_back_to_pyav(tmp_path: Path) -> None:
    path = pyav_video(
        tmp_path / "frag.mp4",
        13,
        {"movflags": "frag_keyframe+empty_moov"},
        codec_options={"g": "5", **NO_BFRAMES},
    )
    with pytest.raises(mp4box.Mp4Unsupported, match="fragmented"):
        mp4box.count_video_samples(path)
    assert_counts(path, 13)


@pytest.mark.parametrize(("frames", "codec_options"), [(20, {}), (1, {}), (31, {"g": "10"})])
def test_bframes_with_edit_list(tmp_path: Path, frames: int, codec_options: dict[str, str]) -> None:
    """x264 defaults use B-frames: composition offsets (ctts) plus an edit list starting at the
    first presentation time. The parser checks FFmpeg's edit rule sample by sample."""
    path = pyav_video(tmp_path / "b.mp4", frames, codec_options=codec_options)
    assert mp4box.count_video_samples(path) == frames
    assert_counts(path, frames)


def test_bframe_edit_list_sweep_boxes_agree_with_ffmpeg(tmp_path: Path) -> None:
    path = pyav_video(tmp_path / "b.mp4", 16, codec_options={"g": "4"})
    original = path.read_bytes()
    elst = find_box(original, b"elst")
    segment0, media_time0 = struct.unpack_from(">Ii", original, elst + 16)
    assert media_time0 > 0  # the reorder delay: B-frames present
    vouched = 0
    for segment_ms in range(segment0 - 40, segment0 + 10):
        for media_time in (0, media_time0 - 1, media_time0, media_time0 + 1, media_time0 + 512):
            variant = bytearray(original)
            struct.pack_into(">Ii", variant, elst + 16, segment_ms, media_time)
            path.write_bytes(bytes(variant))
            try:
                boxes = mp4box.count_video_samples(path)
            except mp4box.Mp4Unsupported:
                continue
            assert boxes == demuxed_frames(path) == 16, (segment_ms, media_time)
            vouched += 1
    assert vouched >= 10


def test_two_video_tracks_fall_back_to_pyav(tmp_path: Path) -> None:
    path = pyav_video(tmp_path / "two.mp4", 6, codec_options=NO_BFRAMES, video_streams=2)
    with pytest.raises(mp4box.Mp4Unsupported, match="2 video tracks"):
        mp4box.count_video_samples(path)
    assert_counts(path, 6)


def _edit(path: Path, segment_duration: int, media_time: int, rate: int = 1) -> Path:
    """Rewrite the single version-0 elst entry in place (what a trimming tool would write)."""
    data = bytearray(path.read_bytes())
    elst = find_box(bytes(data), b"elst")
    version_flags, count = struct.unpack_from(">II", data, elst + 8)
    assert (version_flags, count) == (0, 1)
    struct.pack_into(">IihH", data, elst + 16, segment_duration, media_time, rate, 0)
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize(
    ("segment_ms", "media_time", "rate", "decoded"),
    [
        (334, 0, 1, 10),  # what FFmpeg writes: covers the media, hides nothing -> boxes answer
        (2000, 0, 1, 10),  # longer than the media: hides nothing -> boxes answer
        (334, 1024, 1, 8),  # starts 2 frames (2 x 512 ticks) in: FFmpeg drops them
        (334, 700, 1, 8),  # starts inside frame 1: frames presented before it are dropped
        (300, 0, 1, 9),  # ends at the last frame's start: it is dropped
        (301, 0, 1, 10),  # ends just after the last frame's start: it is kept -> boxes answer
        (100, 0, 1, 3),
        (0, 0, 1, 0),
        (334, -1, 1, 0),  # an empty edit alone: nothing is presented
        (334, 0, 2, 10),  # rate 2: FFmpeg ignores it, the parser does not guess
    ],
)
def test_edit_lists(
    tmp_path: Path, segment_ms: int, media_time: int, rate: int, decoded: int
) -> None:
    path = eva_video(tmp_path / "v.mp4", 10)
    track = mp4box.read_video_track(path)
    assert (track.timescale, track.sample_duration_total) == (15360, 5120)  # 512 ticks a frame
    _edit(path, segment_ms, media_time, rate)
    end_ticks = round(segment_ms * 15360 / 1000)
    hides_nothing = end_ticks > 4608 and media_time == 0 and rate == 1  # last frame starts at 4608
    if hides_nothing:
        assert mp4box.count_video_samples(path) == 10
    else:
        with pytest.raises(mp4box.Mp4Unsupported, match="edit list"):
            mp4box.count_video_samples(path)
    assert_counts(path, decoded)


@pytest.mark.parametrize("gop", [1, 4, 30])
def test_edit_list_sweep_boxes_agree_with_ffmpeg_whenever_they_answer(
    tmp_path: Path, gop: int
) -> None:
    """Every segment_duration around the media's end and a few media_times: whenever the parser
    vouches for a count, FFmpeg demuxes exactly that many frames; the trivial entry is vouched."""
    path = eva_video(tmp_path / "v.mp4", 9, VideoOptions(gop=gop))
    original = path.read_bytes()
    elst = find_box(original, b"elst")
    vouched = []
    for segment_ms in range(250, 320):
        for media_time in (0, 1, 511, 512):
            variant = bytearray(original)
            struct.pack_into(">Ii", variant, elst + 16, segment_ms, media_time)
            path.write_bytes(bytes(variant))
            try:
                boxes = mp4box.count_video_samples(path)
            except mp4box.Mp4Unsupported:
                continue
            assert boxes == demuxed_frames(path) == 9, (segment_ms, media_time)
            vouched.append((segment_ms, media_time))
    # 9 frames of 512 ticks at 15360/s: the last starts at 4096 ticks = 266.67 ms
    assert vouched == [(ms, 0) for ms in range(267, 320)]


def test_size_zero_box_falls_back_to_pyav(tmp_path: Path) -> None:
    """A last box of size 0 runs to the end of the file: valid, but a cut cannot be seen."""
    path = pyav_video(
        tmp_path / "fast.mp4", 8, {"movflags": "+faststart"}, codec_options=NO_BFRAMES
    )
    box_type, offset, _ = top_level(path)[-1]
    assert box_type == b"mdat"
    data = bytearray(path.read_bytes())
    struct.pack_into(">I", data, offset, 0)
    path.write_bytes(bytes(data))
    with pytest.raises(mp4box.Mp4Unsupported, match="end of the file"):
        mp4box.count_video_samples(path)
    assert_counts(path, 8)


def test_sample_table_disagreement_falls_back(tmp_path: Path) -> None:
    path = eva_video(tmp_path / "v.mp4", 10)
    data = bytearray(path.read_bytes())
    stts = find_box(bytes(data), b"stts")
    struct.pack_into(">I", data, stts + 16, 11)  # first run: 11 samples instead of 10
    path.write_bytes(bytes(data))
    with pytest.raises(mp4box.Mp4Unsupported, match="disagrees"):
        mp4box.count_video_samples(path)


# --- broken files: one line naming the file -------------------------------------------------------


@pytest.mark.parametrize("faststart", [False, True])
def test_truncated_files_raise_naming_the_file(tmp_path: Path, faststart: bool) -> None:
    options = {"movflags": "+faststart"} if faststart else {}
    whole = pyav_video(tmp_path / "whole.mp4", 10, options, NO_BFRAMES).read_bytes()
    cuts = sorted({40, 200, len(whole) // 2, len(whole) - 300, len(whole) - 1})
    for cut in cuts:
        path = tmp_path / f"cut_{cut}.mp4"
        path.write_bytes(whole[:cut])
        with pytest.raises(DatasetError) as error:
            count_frames(path)
        message = str(error.value)
        assert str(path) in message and "\n" not in message


def test_truncated_mdat_is_reported_as_truncated(tmp_path: Path) -> None:
    whole = eva_video(tmp_path / "whole.mp4", 10).read_bytes()
    path = tmp_path / "cut.mp4"
    path.write_bytes(whole[:1000])  # inside mdat: moov (at the end) is gone
    with pytest.raises(DatasetError, match=r"cut\.mp4: truncated MP4: box 'mdat'"):
        count_frames(path)


@pytest.mark.parametrize(
    "content", [b"", b"\x00" * 7, bytes(range(256)) * 8, b"\x00\x00\x00\x20ftypisom" + b"\xff" * 24]
)
def test_garbage_raises_naming_the_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "garbage.mp4"
    path.write_bytes(content)
    with pytest.raises(DatasetError) as error:
        count_frames(path)
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_tags_in_a_broken_text_encoding_do_not_make_the_video_unreadable(tmp_path: Path) -> None:
    path = eva_video(tmp_path / "v.mp4", 7)
    data = bytearray(path.read_bytes())
    encoder_tag = data.find(b"Lavf", find_box(bytes(data), b"udta"))
    data[encoder_tag] = 0x80  # not UTF-8: PyAV's strict default raised UnicodeDecodeError
    path.write_bytes(bytes(data))
    assert_counts(path, 7)


def test_missing_file_raises_naming_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="nope.mp4: cannot open video"):
        count_frames(tmp_path / "nope.mp4")


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_corrupted_bytes_never_escape_as_other_errors(tmp_path: Path, data: st.DataObject) -> None:
    """Any byte damage: the box parser either answers (and then agrees with PyAV's count), steps
    aside, or reports a cut; nothing else escapes, and count_frames gives an int or a DatasetError."""
    source = tmp_path / "source.mp4"
    if not source.exists():
        eva_video(source, 6, VideoOptions(gop=3))
    original = source.read_bytes()
    damaged = bytearray(original)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(damaged) - 1))
        damaged[at] = data.draw(st.integers(0, 255))
    path = tmp_path / "damaged.mp4"
    path.write_bytes(bytes(damaged))
    try:
        boxes = mp4box.count_video_samples(path)
    except mp4box.Mp4Error:
        boxes = None
    try:
        counted: int | None = count_frames(path)
    except DatasetError:
        counted = None
    if boxes is None:
        return
    assert counted == boxes
    # When the boxes answer, FFmpeg's demuxer agrees (if it still opens the damaged file at all).
    try:
        demuxed = demuxed_frames(path)
    except (av.error.FFmpegError, IndexError):
        return
    assert demuxed == boxes


# --- read_video_samples: the packets FFmpeg's demuxer delivers, from the tables alone -------------


def assert_samples_equal_demuxed(path: Path) -> mp4box.VideoSamples:
    """Every sample's bytes, pts/dts, duration and keyframe flag equal PyAV's demuxed packet, and
    the sample entry equals the decoder's size and extradata."""
    samples = mp4box.read_video_samples(path)
    data = path.read_bytes()
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        packets = [p for p in container.demux(stream) if p.size > 0]
        assert len(packets) == len(samples.sizes) == samples.track.sample_count
        for i, packet in enumerate(packets):
            assert (packet.pts, packet.dts) == (samples.pts[i], samples.dts[i]), i
            assert packet.duration == samples.durations[i]
            assert packet.is_keyframe == bool(samples.keyframes[i])
            offset, size = int(samples.offsets[i]), int(samples.sizes[i])
            assert bytes(packet) == data[offset : offset + size]
        ctx = stream.codec_context
        assert bytes(ctx.extradata or b"") == samples.entry.config
        assert (ctx.width, ctx.height) == (samples.entry.width, samples.entry.height)
        assert stream.time_base == Fraction(1, samples.track.timescale)
    return samples


@pytest.mark.parametrize("gop", [1, 5, 30])
def test_samples_of_eva_h264_equal_demuxed_packets(tmp_path: Path, gop: int) -> None:
    samples = assert_samples_equal_demuxed(eva_video(tmp_path / "v.mp4", 17, VideoOptions(gop=gop)))
    assert samples.entry.fourcc == b"avc1" and samples.entry.config_type == b"avcC"


def test_samples_of_eva_av1_and_lerobot_fixture(tmp_path: Path, lerobot_fixture_dir: Path) -> None:
    av1 = eva_video(tmp_path / "v.mp4", 12, VideoOptions(codec="libsvtav1", preset="12", gop=5))
    assert assert_samples_equal_demuxed(av1).entry.config_type == b"av1C"
    for path in sorted(lerobot_fixture_dir.glob("videos/*/*/*.mp4")):
        assert assert_samples_equal_demuxed(path).entry.fourcc == b"av01"


def test_samples_of_plain_pyav_files_moov_last_and_first(tmp_path: Path) -> None:
    assert_samples_equal_demuxed(pyav_video(tmp_path / "a.mp4", 9, codec_options=NO_BFRAMES))
    assert_samples_equal_demuxed(
        pyav_video(tmp_path / "b.mp4", 9, {"movflags": "+faststart"}, codec_options=NO_BFRAMES)
    )


def test_samples_of_a_packet_copied_shard(tmp_path: Path) -> None:
    assert len(assert_samples_equal_demuxed(packet_copied_shard(tmp_path)).sizes) == 19


BFRAME_LAYOUTS = [
    pytest.param(20, {"x264-params": "bframes=2"}, {}, id="bframes2"),
    pytest.param(40, {"g": "12"}, {}, id="x264-defaults-gop12"),
    pytest.param(
        45, {"bf": "3", "preset": "medium", "profile": "high"}, {}, id="high-medium-bf3-scenecut"
    ),
    pytest.param(33, {"bf": "3", "x264-params": "b-pyramid=none"}, {}, id="bf3-no-pyramid"),
    pytest.param(30, {"bf": "2", "g": "7"}, {"movflags": "+faststart"}, id="bf2-faststart"),
    pytest.param(1, {}, {}, id="one-frame"),
    pytest.param(2, {}, {}, id="two-frames"),
]


@pytest.mark.parametrize(("frames", "codec_options", "container_options"), BFRAME_LAYOUTS)
def test_samples_of_bframe_files_equal_demuxed_packets(
    tmp_path: Path, frames: int, codec_options: dict[str, str], container_options: dict[str, str]
) -> None:
    """Composition offsets under FFmpeg's muxer's edit list (media_time = the first pts): the
    parsed pts, dts, size, keyframe flag and bytes equal what the installed PyAV demuxes."""
    path = pyav_video(tmp_path / "b.mp4", frames, container_options, codec_options)
    samples = assert_samples_equal_demuxed(path)
    if frames > 2:
        assert bool(np.any(samples.pts != samples.dts))  # B-frames present


def test_samples_of_bframe_edit_list_sweep_equal_demuxed_whenever_vouched(
    tmp_path: Path,
) -> None:
    """Whenever the parser vouches for an edited B-frame file, its packets are FFmpeg's."""
    path = pyav_video(tmp_path / "b.mp4", 16, codec_options={"g": "4"})
    original = path.read_bytes()
    elst = find_box(original, b"elst")
    segment0, media_time0 = struct.unpack_from(">Ii", original, elst + 16)
    vouched = 0
    for segment_ms in (segment0 - 40, segment0 - 1, segment0, segment0 + 10):
        for media_time in (0, media_time0 - 1, media_time0, media_time0 + 1):
            variant = bytearray(original)
            struct.pack_into(">Ii", variant, elst + 16, segment_ms, media_time)
            path.write_bytes(bytes(variant))
            try:
                mp4box.read_video_samples(path)
            except mp4box.Mp4Unsupported:
                continue
            assert_samples_equal_demuxed(path)
            vouched += 1
    assert vouched >= 2


def test_samples_refuse_composition_offsets_without_an_edit_list(tmp_path: Path) -> None:
    """Without an edit list FFmpeg's own timestamp heuristics apply: left to its demuxer."""
    path = pyav_video(tmp_path / "b.mp4", 20, codec_options={"x264-params": "bframes=2"})
    data = bytearray(path.read_bytes())
    edts = find_box(bytes(data), b"edts")
    data[edts + 4 : edts + 8] = b"free"  # the edit list becomes padding
    path.write_bytes(bytes(data))
    assert mp4box.count_video_samples(path) == 20
    with pytest.raises(mp4box.Mp4Unsupported, match="without an edit list"):
        mp4box.read_video_samples(path)


def test_sample_entry_key_ignores_the_bit_rate_box_only(tmp_path: Path) -> None:
    """Two episodes of one encoder configuration share a key although their btrt differ."""
    a = mp4box.read_video_samples(eva_video(tmp_path / "a.mp4", 10))
    b = mp4box.read_video_samples(eva_video(tmp_path / "b.mp4", 30))
    assert a.entry.key == b.entry.key
    other = mp4box.read_video_samples(
        eva_video(tmp_path / "c.mp4", 10, VideoOptions(crf=40, preset="ultrafast"))
    )
    assert other.entry.key != a.entry.key  # other SPS/PPS -> other avcC


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_corrupted_bytes_samples_never_escape_as_other_errors(
    tmp_path: Path, data: st.DataObject
) -> None:
    """Byte damage: read_video_samples answers or raises an Mp4Error; an answer has one sample
    per counted frame, every sample inside the file, and keeps the packets' order in time."""
    source = tmp_path / "source.mp4"
    if not source.exists():
        eva_video(source, 6, VideoOptions(gop=3))
    damaged = bytearray(source.read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(damaged) - 1))
        damaged[at] = data.draw(st.integers(0, 255))
    path = tmp_path / "damaged.mp4"
    path.write_bytes(bytes(damaged))
    try:
        samples = mp4box.read_video_samples(path)
    except mp4box.Mp4Error:
        return
    n = mp4box.count_video_samples(path)
    assert len(samples.sizes) == len(samples.offsets) == len(samples.dts) == n
    assert len(samples.durations) == len(samples.keyframes) == n
    if n:
        assert int((samples.offsets + samples.sizes).max()) <= len(damaged)
        assert int(samples.offsets.min()) >= 0 and int(samples.sizes.min()) > 0


def test_parsed_tables_are_reused_only_while_the_file_is_unchanged(tmp_path: Path) -> None:
    import time

    path = eva_video(tmp_path / "c.mp4", 12)
    # Just written: its times may not have moved yet on the next write (coarse clock): no reuse.
    assert mp4box.read_video_samples(path) is not mp4box.read_video_samples(path)
    time.sleep(mp4box.SETTLED_NS / 1e9 + 0.05)
    first = mp4box.read_video_samples(path)
    assert mp4box.read_video_samples(path) is first  # the validator's parse, reused by the export
    with pytest.raises(ValueError):
        first.sizes[0] = 1  # shared: read only
    data = bytearray(path.read_bytes())
    time.sleep(0.01)
    path.write_bytes(bytes(data))  # rewritten in place, same bytes and size: its ctime moves
    again = mp4box.read_video_samples(path)
    assert again is not first
    np.testing.assert_array_equal(again.sizes, first.sizes)


def test_a_table_being_parsed_is_waited_for_not_parsed_again() -> None:
    import threading
    import time

    from eva.dataset.mp4box import _SampleCache

    cache = _SampleCache()
    calls: list[str] = []
    started = threading.Event()

    def slow_parse() -> Any:
        calls.append(threading.current_thread().name)
        started.set()
        time.sleep(0.2)
        return SimpleNamespace(sizes=np.zeros(3))

    results: list[object] = []
    first = threading.Thread(target=lambda: results.append(cache.get_or_parse(("k",), slow_parse)))
    first.start()
    started.wait()
    results.append(cache.get_or_parse(("k",), slow_parse))  # waits for the first thread's
    first.join()
    assert len(calls) == 1 and results[0] is results[1]

    def failing_parse() -> Any:
        calls.append("failed")
        started.set()
        time.sleep(0.1)
        raise mp4box.Mp4Unsupported("no")

    started.clear()
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            cache.get_or_parse(("bad",), failing_parse)
        except mp4box.Mp4Unsupported as e:
            errors.append(e)

    other = threading.Thread(target=ask)
    other.start()
    started.wait()
    ask()  # the other parse failed: this one parses and fails the same way
    other.join()
    assert len(errors) == 2 and calls.count("failed") == 2
