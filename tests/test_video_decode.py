"""``iter_frame_batches``: pixels identical to PyAV's own rgb24 conversion (the batch is filled
in place by ``rgb.FrameConverter``), and frame-size errors that name the file."""

from __future__ import annotations

import io
from pathlib import Path

import av
import numpy as np
import pytest

from eva.dataset.errors import DatasetError
from eva.dataset.reader import DatasetReader
from eva.dataset.video import FrameSizeError, VideoEncoder, iter_frame_batches
from eva.dataset.writer import CameraSpec, DatasetWriter
from eva.formats.mcap import camera_batches


def _noise(n: int, h: int, w: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 4, y * 5, (x + y) * 2], axis=-1)
    return np.clip(base[None] + rng.integers(-30, 30, (n, h, w, 3)), 0, 255).astype(np.uint8)


def _pyav_frames(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


@pytest.mark.parametrize("pix_fmt", ["yuv420p", "yuv444p"])
def test_batches_equal_pyav_pixels(tmp_path: Path, pix_fmt: str) -> None:
    # yuv420p: the native converter's path; yuv444p: PyAV's conversion (eva never writes it).
    path = tmp_path / f"{pix_fmt}.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = 64, 48, pix_fmt
        for frame in _noise(11, 48, 64):
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    want = _pyav_frames(path)
    out = np.empty((4, 48, 64, 3), np.uint8)
    got = [b.copy() for b in iter_frame_batches(path, 4, out=out)]
    assert [len(b) for b in got] == [4, 4, 3]
    np.testing.assert_array_equal(np.concatenate(got), want)


def test_out_buffer_of_another_size_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "v.mp4"
    with VideoEncoder(path, 64, 48, 30) as encoder:
        encoder.write(_noise(3, 48, 64))
    with pytest.raises(FrameSizeError, match=str(path)):
        list(iter_frame_batches(path, 2, out=np.empty((2, 16, 32, 3), np.uint8)))


def _raw_h264(w: int, h: int, n: int) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format="h264") as container:
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        for frame in _noise(n, h, w):
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def test_frame_size_change_mid_file_is_a_dataset_error(tmp_path: Path) -> None:
    # Two H.264 streams back to back: the decoder switches size at the second SPS.
    path = tmp_path / "sizechange.h264"
    path.write_bytes(_raw_h264(64, 48, 3) + _raw_h264(32, 16, 3))
    with pytest.raises(DatasetError, match=rf"{path}: frame 3 is 32x16, stream is 64x48"):
        list(iter_frame_batches(path, 2))


def test_mcap_reports_a_shape_mismatch_only_for_frame_size_errors(tmp_path: Path) -> None:
    key = "observation.images.front"
    root = tmp_path / "raw"
    with DatasetWriter.create_or_open(
        root, fps=30, cameras=[CameraSpec(key, 48, 64)], durable=False
    ) as writer:
        for _ in range(2):
            with writer.begin_episode("pick") as episode:
                episode.add_frames({key: _noise(4, 48, 64)})
                episode.commit()
    reader = DatasetReader(root)
    buffers = {key: np.empty((4, 48, 64, 3), np.uint8)}
    with VideoEncoder(reader.video_path(0, key), 32, 16, 30) as encoder:  # not info.json's size
        encoder.write(_noise(4, 16, 32))
    with pytest.raises(DatasetError, match="as declared in info.json") as info:
        list(camera_batches(reader, 0, key, 4, buffers, "episode 0"))
    assert str(reader.video_path(0, key)) in str(info.value)
    reader.video_path(1, key).write_bytes(b"not a video")
    with pytest.raises(DatasetError) as info:
        list(camera_batches(reader, 1, key, 4, buffers, "episode 1"))
    assert "as declared" not in str(info.value)


def test_alternating_batches_fill_the_two_halves_in_turn(tmp_path: Path) -> None:
    """``alternate=True``: batch k stays intact while batch k+1 is decoded into the other half,
    and the frames are those of the one-buffer iteration."""
    path = tmp_path / "clip.mp4"
    with VideoEncoder(path, 64, 48, 30) as encoder:
        encoder.write(_noise(23, 48, 64, seed=4))
    want = np.concatenate([b.copy() for b in iter_frame_batches(path, 5)])
    out = np.zeros((10, *want.shape[1:]), np.uint8)
    kept: list[tuple[np.ndarray, np.ndarray]] = []
    previous: tuple[np.ndarray, np.ndarray] | None = None
    for batch in iter_frame_batches(path, 5, out=out, alternate=True):
        if previous is not None:  # the batch before this one is untouched by this decode
            np.testing.assert_array_equal(previous[0], previous[1])
            assert not np.shares_memory(previous[0], batch)
        previous = (batch, batch.copy())
        kept.append(previous)
    np.testing.assert_array_equal(np.concatenate([copy for _, copy in kept]), want)
    assert [len(b) for b, _ in kept] == [5, 5, 5, 5, 3]
    with pytest.raises(FrameSizeError):
        next(iter_frame_batches(path, 5, out=out[:1], alternate=True))
