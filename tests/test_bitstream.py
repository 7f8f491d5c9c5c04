"""The framing check (every sample parses into whole NAL units/OBUs) and the video inspection
validation runs on every MP4: real encoder output passes, damage the keyframe decode cannot see
is caught, and synthetic sample layouts agree with a plain one-unit-at-a-time walk."""

from __future__ import annotations

import os
import random
import struct
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eva.dataset import bitstream, decode_check, mp4box
from eva.dataset.errors import DatasetError

pytestmark = pytest.mark.kernel_independent

FPS = 30
H, W = 96, 128


def _frames(n: int) -> np.ndarray:
    yy, xx = np.mgrid[0:H, 0:W]
    rng = np.random.default_rng(0)
    out = np.empty((n, H, W, 3), np.uint8)
    for i in range(n):
        out[i, ..., 0] = (xx * 3 + i * 7) % 256
        out[i, ..., 1] = (yy * 2 + i * 5) % 256
        out[i, ..., 2] = rng.integers(0, 40, (H, W))  # some texture: real-sized P-frames
    return out


def _encode(path: Path, codec: str, options: dict[str, str], n: int = 60) -> Path:
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream(codec, rate=FPS, options=options)
        stream.width, stream.height, stream.pix_fmt = W, H, "yuv420p"
        stream.codec_context.time_base = Fraction(1, FPS)
        for image in _frames(n):
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


ENCODINGS = {
    # x264 High with B-frames and scene cuts, as camera footage is
    "h264_bframes": ("libx264", {"preset": "medium", "bf": "3", "g": "250"}),
    # sliced threads (tune zerolatency): several slice NAL units per sample
    "h264_slices": ("libx264", {"tune": "zerolatency", "threads": "4", "slices": "4"}),
    "hevc": ("libx265", {"preset": "ultrafast", "x265-params": "log-level=none"}),
    "av1": ("libsvtav1", {"preset": "12", "g": "2"}),  # as LeRobot records
}


@pytest.fixture(scope="module", params=sorted(ENCODINGS))
def encoded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    codec, options = ENCODINGS[request.param]
    if codec not in av.codecs_available:
        pytest.fail(f"PyAV has no {codec} encoder: the wheel is expected to bundle it")
    return _encode(tmp_path_factory.mktemp(request.param) / "v.mp4", codec, options)


def _check(path: Path) -> None:
    table = mp4box.read_video_samples(path)
    framing = bitstream.framing_of(table.entry.config_type, table.entry.config)
    assert framing is not None
    fd = os.open(path, os.O_RDONLY)
    try:
        bitstream.check_samples(fd, path, table.offsets, table.sizes, framing, window=4096)
    finally:
        os.close(fd)


def test_real_encoder_output_is_well_framed_and_inspects(encoded: Path) -> None:
    _check(encoded)  # a small window: many windows, samples larger than a window
    assert decode_check.inspect_video(encoded) == 60
    assert decode_check.inspect_video(encoded, keyframes=1000) == 60
    decode_check.check_keyframes(encoded)


def _damage_sample(path: Path, index: int, fill: bytes, at: int = 0) -> Path:
    table = mp4box.read_video_samples(path)
    data = bytearray(path.read_bytes())
    start = int(table.offsets[index]) + at
    data[start : start + len(fill)] = fill
    out = path.with_name(f"damaged-{index}-{at}.mp4")
    out.write_bytes(bytes(data))
    return out


def test_a_zeroed_predicted_frame_is_caught_where_keyframe_decodes_pass(encoded: Path) -> None:
    table = mp4box.read_video_samples(encoded)
    predicted = int(np.flatnonzero(~table.keyframes)[len(np.flatnonzero(~table.keyframes)) // 2])
    damaged = _damage_sample(encoded, predicted, bytes(min(16, int(table.sizes[predicted]))))
    decode_check.check_keyframes(damaged)  # the keyframes are intact
    with pytest.raises(decode_check.UndecodableVideo, match=rf"sample {predicted} of 60"):
        decode_check.inspect_video(damaged)
    random_bytes = random.Random(5).randbytes(int(table.sizes[predicted]))
    with pytest.raises(decode_check.UndecodableVideo, match="video data is damaged"):
        decode_check.inspect_video(_damage_sample(encoded, predicted, random_bytes))


def test_h264_payload_damage_inside_the_first_keyframe_does_not_decode(tmp_path: Path) -> None:
    # FFmpeg's H.264 decoder conceals a damaged slice unless told to fail (err_detect=explode):
    # the framing stays intact here, only the decode can tell.
    path = _encode(tmp_path / "v.mp4", *ENCODINGS["h264_bframes"])
    table = mp4box.read_video_samples(path)
    size = int(table.sizes[0])
    data = path.read_bytes()
    start = int(table.offsets[0])
    # the slice NAL unit of the first sample (after SPS/PPS/SEI units, if any)
    pos, slice_at = start, None
    while pos < start + size:
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        if data[pos + 4] & 0x1F == 5:
            slice_at, slice_len = pos + 4, length
        pos += 4 + length
    assert slice_at is not None
    caught = 0
    for frac in (0.2, 0.3, 0.7):
        at = slice_at - start + 8 + int((slice_len - 72) * frac)
        damaged = _damage_sample(path, 0, random.Random(3).randbytes(64), at)
        _check(damaged)  # still well framed
        try:
            decode_check.inspect_video(damaged)
        except decode_check.UndecodableVideo as e:
            assert "keyframe at" in str(e) and "does not decode" in str(e)
            caught += 1
    assert caught >= 2  # CABAC garbage can happen to parse; most of it does not


def test_samples_past_the_end_of_the_file(encoded: Path) -> None:
    table = mp4box.read_video_samples(encoded)
    framing = bitstream.framing_of(table.entry.config_type, table.entry.config)
    assert framing is not None
    size = encoded.stat().st_size
    fd = os.open(encoded, os.O_RDONLY)
    try:
        with pytest.raises(bitstream.FramingError, match="ends early"):
            bitstream.check_samples(fd, encoded, np.array([size - 10]), np.array([100]), framing)
    finally:
        os.close(fd)


def test_inspect_names_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="missing|cannot open"):
        decode_check.inspect_video(tmp_path / "nope.mp4")
    link = tmp_path / "link.mp4"
    link.symlink_to("/etc/hostname")
    with pytest.raises(DatasetError, match=str(link)):
        decode_check.inspect_video(link)


def test_unknown_configurations_are_not_checked() -> None:
    assert bitstream.framing_of(None, b"") is None
    assert bitstream.framing_of(b"avcC", b"\x01\x64\x00\x1e\xfe") is None  # 3-byte lengths
    assert bitstream.framing_of(b"avcC", b"\x01") is None
    assert bitstream.framing_of(b"avcC", b"\x01\x64\x00\x1e\xff").length_size == 4  # type: ignore[union-attr]
    assert bitstream.framing_of(b"av1C", b"\x81").kind == "obu"  # type: ignore[union-attr]


# ---- synthetic layouts against a one-unit-at-a-time walk ------------------------------------


def _walk(sample: bytes, framing: bitstream.Framing) -> bool:
    """The plain definition: units one after another, ending exactly at the sample's end."""
    pos = 0
    while pos < len(sample):
        if framing.kind == "nal":
            size = framing.length_size
            if pos + size + 1 > len(sample):
                return False
            length = int.from_bytes(sample[pos : pos + size], "big")
            first = sample[pos + size]
            if framing.codec == "hevc":
                second = sample[pos + size + 1] if pos + size + 1 < len(sample) else 0
                ok = length >= 2 and not first & 0x80 and second & 7
            else:
                ok = length >= 1 and not first & 0x80 and first & 0x1F
            if not ok or pos + size + length > len(sample):
                return False
            pos += size + length
        else:
            h = sample[pos]
            if h & 0x81 or ((h >> 3) & 15) not in (1, 2, 3, 4, 5, 6, 7, 8, 15):
                return False
            q = pos + 1 + ((h >> 2) & 1)
            if not h & 2:
                return q <= len(sample)
            value = 0
            for i in range(9):
                if i == 8 or q >= len(sample):
                    return False
                b = sample[q]
                value |= (b & 0x7F) << (7 * i)
                q += 1
                if not b & 0x80:
                    break
            if q + value > len(sample):
                return False
            pos = q + value
    return True


def _nal_unit(draw: st.DrawFn, framing: bitstream.Framing) -> bytes:
    body = draw(st.binary(min_size=2, max_size=40))
    first = draw(st.integers(1, 31)) if framing.codec == "h264" else draw(st.integers(0, 126))
    second = draw(st.integers(1, 255)) | 1
    unit = bytes([first, second]) + body[2:]
    return len(unit).to_bytes(framing.length_size, "big") + unit


def _obu(draw: st.DrawFn, last: bool) -> bytes:
    kind = draw(st.sampled_from([1, 2, 3, 4, 5, 6, 7, 8, 15]))
    ext = draw(st.booleans())
    sized = True if not last else draw(st.booleans())
    payload = draw(st.binary(max_size=300))
    header = bytes([(kind << 3) | (4 if ext else 0) | (2 if sized else 0)])
    header += b"\x00" if ext else b""
    if not sized:
        return header + payload
    n, leb = len(payload), b""
    while True:
        byte = n & 0x7F
        n >>= 7
        leb += bytes([byte | (0x80 if n else 0)])
        if not n:
            return header + leb + payload


@st.composite
def _layout(draw: st.DrawFn) -> tuple[bitstream.Framing, list[bytes]]:
    framing = draw(
        st.sampled_from(
            [
                bitstream.Framing("nal", "h264", 4),
                bitstream.Framing("nal", "h264", 2),
                bitstream.Framing("nal", "h264", 1),
                bitstream.Framing("nal", "hevc", 4),
                bitstream.Framing("obu", "av1"),
            ]
        )
    )
    samples = []
    for _ in range(draw(st.integers(1, 12))):
        count = draw(st.integers(1, 20))  # beyond VECTOR_STEPS: the one-by-one tail
        if framing.kind == "nal":
            sample = b"".join(_nal_unit(draw, framing) for _ in range(count))
        else:
            sample = b"".join(_obu(draw, i == count - 1) for i in range(count))
        if draw(st.booleans()):  # damage: overwrite a few bytes somewhere
            at = draw(st.integers(0, len(sample) - 1))
            junk = draw(st.binary(min_size=1, max_size=6))
            sample = sample[:at] + junk + sample[at + len(junk) :]
            sample = sample[: max(1, len(sample))]
        samples.append(sample)
    return framing, samples


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(_layout(), st.integers(16, 512))
def test_vectorised_walk_agrees_with_the_plain_walk(
    tmp_path: Path, case: tuple[bitstream.Framing, list[bytes]], window: int
) -> None:
    framing, samples = case
    path = tmp_path / "samples.bin"
    gap = b"\xaa" * 3  # bytes between samples belong to no sample
    blob = b"".join(gap + s for s in samples)
    path.write_bytes(blob)
    offsets, pos = [], 0
    for s in samples:
        offsets.append(pos + len(gap))
        pos += len(gap) + len(s)
    order = list(range(len(samples)))
    random.Random(len(blob)).shuffle(order)  # sample tables need not be in file order
    offs = np.array([offsets[i] for i in order], np.int64)
    sizes = np.array([len(samples[i]) for i in order], np.int64)
    expected_bad = [k for k, i in enumerate(order) if not _walk(samples[i], framing)]
    fd = os.open(path, os.O_RDONLY)
    try:
        if expected_bad:
            with pytest.raises(bitstream.FramingError, match=rf"sample {expected_bad[0]} of "):
                bitstream.check_samples(fd, path, offs, sizes, framing, window=window)
        else:
            bitstream.check_samples(fd, path, offs, sizes, framing, window=window)
    finally:
        os.close(fd)
