"""libswscale called straight into a batch slot (``eva.dataset.swscale``) gives exactly PyAV's
``to_ndarray(format="rgb24")``, and ``FrameConverter`` takes it only when it does."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest

from eva._native import pure_python_forced
from eva.dataset import rgb, swscale
from eva.dataset.video import iter_frame_batches

pytestmark = pytest.mark.skipif(not swscale.available(), reason="libswscale not found")

SIZES = [(64, 48), (96, 50), (320, 242), (640, 480), (1280, 720), (848, 480)]
ODD_SIZES = [(66, 50), (100, 36), (322, 242), (33, 17), (424, 240)]


def _frame(
    width: int,
    height: int,
    pix_fmt: str = "yuv420p",
    colorspace: int = 2,
    color_range: int = 0,
    seed: int = 0,
) -> av.VideoFrame:
    rng = np.random.default_rng([width, height, seed])
    chroma_w, chroma_h = {
        "yuv420p": ((width + 1) // 2, (height + 1) // 2),
        "yuvj420p": ((width + 1) // 2, (height + 1) // 2),
        "yuv422p": ((width + 1) // 2, height),
        "yuv444p": (width, height),
    }[pix_fmt]
    frame = av.VideoFrame(width, height, pix_fmt)
    sizes = [(width, height), (chroma_w, chroma_h), (chroma_w, chroma_h)]
    for plane, (w, h) in zip(frame.planes, sizes, strict=True):
        view = np.frombuffer(plane, np.uint8).reshape(-1, plane.line_size)
        view[:h, :w] = rng.integers(0, 256, (h, w), dtype=np.uint8)
    frame.colorspace = colorspace
    frame.color_range = color_range
    return frame


def _convert_video(frames: list[av.VideoFrame]) -> rgb.FrameConverter:
    """``frames`` through one converter as one video; every slot must hold PyAV's pixels."""
    first = frames[0]
    batch = np.zeros((len(frames), first.height, first.width, 3), np.uint8)
    converter = rgb.FrameConverter()
    converter.start_video(first, batch, 0)
    for slot in range(1, len(frames)):
        converter.convert(frames[slot], batch, slot)
    for slot, frame in enumerate(frames):
        np.testing.assert_array_equal(batch[slot], frame.to_ndarray(format="rgb24"))
    return converter


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_scaler_equals_pyav_at_widths_of_16_pixels(width: int, height: int) -> None:
    frame = _frame(width, height)
    out = np.zeros((height, width, 3), np.uint8)
    scaler = swscale.Rgb24Scaler(width, height, "yuv420p", frame.colorspace, frame.color_range)
    scaler.convert(frame, out)
    scaler.close()
    np.testing.assert_array_equal(out, frame.to_ndarray(format="rgb24"))


@pytest.mark.parametrize(("width", "height"), ODD_SIZES)
def test_other_widths_are_converted_by_pyav_and_copied(width: int, height: int) -> None:
    assert not swscale.Rgb24Scaler.supports("yuv420p", width)
    converter = _convert_video([_frame(width, height), _frame(width, height, seed=1)])
    assert converter._scaler is None and converter.pyav_frames == 2


@pytest.mark.parametrize(
    ("pix_fmt", "colorspace", "color_range"),
    [
        ("yuv420p", 1, 0),  # BT.709
        ("yuv420p", 1, 1),  # BT.709, limited range said explicitly
        ("yuv420p", 2, 2),  # full range
        ("yuv420p", 5, 0),  # BT.470BG
        ("yuv420p", 6, 0),  # SMPTE 170M
        ("yuv420p", 9, 0),  # BT.2020
        ("yuvj420p", 2, 2),
        ("yuv422p", 2, 0),
        ("yuv444p", 1, 0),
    ],
)
def test_converter_matches_pyav_for_every_colour_description(
    pix_fmt: str, colorspace: int, color_range: int
) -> None:
    """Whatever path the converter takes for a description, its pixels are PyAV's."""
    frames = [_frame(96, 64, pix_fmt, colorspace, color_range, seed=i) for i in range(3)]
    converter = _convert_video(frames)
    assert converter.native_frames + converter.pyav_frames == 3
    # libswscale reproduces PyAV for each of these (so none pays the slower paths)
    assert (converter._scaler is not None) == (not pure_python_forced())


def test_converter_uses_the_scaler_for_plain_yuv420p() -> None:
    frame = _frame(96, 64)
    batch = np.zeros((2, 64, 96, 3), np.uint8)
    converter = rgb.FrameConverter()
    converter.start_video(frame, batch, 0)
    converter.convert(frame, batch, 1)
    if pure_python_forced():  # the references everywhere: PyAV's own conversion
        assert converter._scaler is None and converter.pyav_frames == 2
    else:
        assert converter._scaler is not None and converter.native_frames == 2


def test_a_scaler_that_differs_from_pyav_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first-frame check: a scaler whose pixels differ (here: one that writes zeros) is
    dropped and the video is converted another way, with PyAV's pixels."""

    def wrong(self: swscale.Rgb24Scaler, frame: av.VideoFrame, out: np.ndarray) -> None:
        out[:] = 0

    monkeypatch.setattr(swscale.Rgb24Scaler, "convert", wrong)
    converter = _convert_video([_frame(96, 64), _frame(96, 64, colorspace=1)])
    assert converter._scaler is None


def test_a_frame_of_another_description_mid_video_is_not_given_to_the_scaler() -> None:
    first, other = _frame(96, 64), _frame(96, 64, colorspace=1)
    batch = np.zeros((2, 64, 96, 3), np.uint8)
    converter = rgb.FrameConverter()
    converter.start_video(first, batch, 0)
    converter.convert(other, batch, 1)
    np.testing.assert_array_equal(batch[1], other.to_ndarray(format="rgb24"))


def test_scaler_refuses_what_it_cannot_convert() -> None:
    assert not swscale.Rgb24Scaler.supports("nv12", 64)
    with pytest.raises(ValueError):
        swscale.Rgb24Scaler(64, 48, "nv12", 2, 0)
    scaler = swscale.Rgb24Scaler(64, 48, "yuv420p", 2, 0)
    with pytest.raises(ValueError):
        scaler.convert(_frame(64, 48), np.zeros((48, 64, 4), np.uint8))
    with pytest.raises(ValueError):
        scaler.convert(_frame(80, 48), np.zeros((48, 64, 3), np.uint8))
    unaligned = np.zeros(48 * 64 * 3 + 1, np.uint8)[1:].reshape(48, 64, 3)
    with pytest.raises(ValueError):
        scaler.convert(_frame(64, 48), unaligned)


def test_decoded_h264_batches_equal_pyav(tmp_path: Path) -> None:
    """A real PyAV-encoded MP4 (x264, B-frames): every decoded batch equals to_ndarray."""
    path = tmp_path / "clip.mp4"
    rng = np.random.default_rng(3)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = 160, 120, "yuv420p"
        stream.options = {"bf": "2", "g": "12"}
        base = rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)
        for i in range(24):
            image = np.roll(base, i * 3, axis=1)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    with av.open(str(path)) as container:
        want = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    got = np.concatenate([batch.copy() for batch in iter_frame_batches(path, batch_size=5)])
    np.testing.assert_array_equal(got, want)
