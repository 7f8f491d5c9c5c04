"""HDF5 export: item kinds round trip, pixels equal a PyAV decode, errors leave nothing behind,
the native rgb kernel against its reference, and the files open in HDF5's own h5ls."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from video_helpers import encode_video, pyav_decode

from eva._native import load
from eva.dataset import rgb, swscale
from eva.dataset.errors import DatasetError
from eva.formats import hdf5

W, H = 64, 48

native_rgb = load("rgb")
KERNELS = [
    pytest.param(
        native_rgb,
        id="native",
        marks=pytest.mark.skipif(native_rgb is None, reason="native core not in use"),
    ),
    pytest.param(None, id="reference"),
]


def scene(n: int, width: int = W, height: int = H, seed: int = 0) -> np.ndarray:
    """Moving gradient + noise so every frame differs and chroma varies."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    frames = np.empty((n, height, width, 3), dtype=np.uint8)
    for i in range(n):
        frames[i, ..., 0] = (xx * 4 + i * 7) % 256
        frames[i, ..., 1] = (yy * 5 + i * 3) % 256
        frames[i, ..., 2] = ((xx + yy) * 3 + i * 11) % 256
    frames ^= rng.integers(0, 32, frames.shape, dtype=np.uint8)
    return frames


def episode_table(n: int) -> pa.Table:
    state = np.arange(n * 14, dtype=np.float32).reshape(n, 14) / 7
    action = state[:, :7] * 2
    return pa.table(
        {
            "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(state.ravel()), 14),
            "action": pa.FixedSizeListArray.from_arrays(pa.array(action.ravel()), 7),
            "timestamp": pa.array(np.arange(n, dtype=np.float32) / 30),
            "capture_time": pa.array(np.arange(n, dtype=np.float64) * 0.033 + 1e9),
            "frame_index": pa.array(np.arange(n, dtype=np.int64)),
            "episode_index": pa.array(np.zeros(n, dtype=np.int64)),
            "index": pa.array(np.arange(n, dtype=np.int64)),
            "task_index": pa.array(np.zeros(n, dtype=np.int64)),
        }
    )


@pytest.fixture(scope="module")
def video_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("videos")
    encode_video(root / "front.mp4", scene(13, seed=1))
    encode_video(root / "wrist.mp4", scene(13, seed=2))
    encode_video(root / "short.mp4", scene(9, seed=3))
    encode_video(root / "ten.mp4", scene(10, seed=5))
    encode_video(root / "odd.mp4", scene(13, width=66, height=50, seed=4))
    # A raw H.264 stream whose resolution changes after 5 frames (the decoder follows the new SPS).
    first = encode_video(root / "a.h264", scene(5), fmt="h264")
    second = encode_video(root / "b.h264", scene(8, width=80, height=48), fmt="h264")
    (root / "resized.mp4").write_bytes(first.read_bytes() + second.read_bytes())
    return root


# ---- item kinds ---------------------------------------------------------------------------------


def test_round_trip_every_kind(tmp_path: Path) -> None:
    n = 4
    columns = {
        "observation.state": np.arange(n * 3, dtype=np.float32).reshape(n, 3),
        "nested/key.with.dots": np.arange(n, dtype=np.int16),
        "flags": np.array([True, False, True, True]),
        "names": ["a", "b", None, "d"],
    }
    metadata = {
        "episode_index": 3,
        "fps": 30,
        "duration_seconds": 1.25,
        "ok": True,
        "quality": "green",
        "émoji/ключ.x": "ü ✓",
        "qc_note": None,
        "blob": b"\x00\x01\xff",
        "scalar_f32": np.float32(1.5),
        "scalar_0d": np.array(7, dtype=np.uint8),
        "tasks": ["pick the red cube"],
        "quality_issues": [{"severity": "red", "code": "frozen_camera", "detail": "x"}],
        "nested": {"a": {"b": [1, 2.5, None, "s", b"b"]}, "arr": np.arange(6).reshape(2, 3)},
        "tuple": (1, "two"),
        "strings": np.array(["x", "yz"]),
        "objects": np.array([1, "a"], dtype=object),
        "complex": np.array([1 + 2j]),
        "huge": 2**64 - 1,
        "empty": {},
    }
    path = tmp_path / "ep.hdf5"
    writer = hdf5.EpisodeWriter()
    size = writer.write_episode(path, columns=columns, videos={}, metadata=metadata, label="ep 0")
    assert size == path.stat().st_size > 0

    with hdf5.read_episode(path) as episode:
        assert list(episode.columns) == list(columns)
        assert episode.columns["observation.state"].dtype == np.float32
        np.testing.assert_array_equal(
            episode.columns["observation.state"], columns["observation.state"]
        )
        assert episode.columns["nested/key.with.dots"].dtype == np.int16
        assert episode.columns["flags"].dtype == np.bool_
        assert episode.columns["names"] == ["a", "b", None, "d"]
        meta = episode.metadata
    assert list(meta) == list(metadata)
    for key in ("episode_index", "fps", "duration_seconds", "ok"):
        assert meta[key] == metadata[key] and type(meta[key]) is type(metadata[key])
    assert meta["quality"] == "green" and meta["émoji/ключ.x"] == "ü ✓"
    assert meta["qc_note"] is None
    assert meta["blob"] == b"\x00\x01\xff"
    assert meta["scalar_f32"] == np.float32(1.5) and meta["scalar_f32"].dtype == np.float32
    assert meta["scalar_0d"] == 7 and meta["scalar_0d"].dtype == np.uint8
    assert meta["tasks"] == ["pick the red cube"]
    assert meta["quality_issues"] == metadata["quality_issues"]
    assert meta["nested"]["a"] == {"b": [1, 2.5, None, "s", b"b"]}
    np.testing.assert_array_equal(meta["nested"]["arr"], np.arange(6).reshape(2, 3))
    assert meta["tuple"] == [1, "two"]  # MessagePack has no tuple
    np.testing.assert_array_equal(meta["strings"], np.array(["x", "yz"]))
    assert meta["objects"] == [1, "a"]
    np.testing.assert_array_equal(meta["complex"], np.array([1 + 2j]))
    assert meta["huge"] == 2**64 - 1
    assert meta["empty"] == {}

    with h5py.File(path, "r") as h5:
        kinds = {
            h5["metadata"][name].attrs["key"]: h5["metadata"][name].attrs["kind"]
            for name in h5["metadata"]
        }
        assert kinds["émoji/ключ.x"] == "string"
        assert kinds["qc_note"] == "none" and h5["metadata/item_000006/value"].shape == (0,)
        assert kinds["blob"] == "bytes" and h5["metadata/item_000007/value"].dtype == np.uint8
        assert kinds["scalar_f32"] == "array" and h5["metadata/item_000008/value"].shape == ()
        assert kinds["nested"] == kinds["tuple"] == kinds["objects"] == "msgpack"
        assert h5["metadata/item_000004/value"].dtype.kind == "O"  # vlen UTF-8 string


def test_unstorable_value_names_key(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="key 'bad'"):
        hdf5.EpisodeWriter().write_episode(
            tmp_path / "ep.hdf5",
            columns={"x": np.arange(3)},
            videos={},
            metadata={"bad": object()},
            label="ep 0",
        )
    assert list(tmp_path.iterdir()) == []


def test_table_columns_keep_dtypes(tmp_path: Path) -> None:
    n = 5
    table = episode_table(n).append_column("note", pa.array(["a", None, "c", "d", "e"]))
    table = table.append_column(
        "varlist", pa.array([[1], [1, 2], [], [3], [4]], type=pa.list_(pa.int32()))
    )
    sliced = pa.concat_tables([table.slice(0, 2), table.slice(2)])  # several chunks, offsets
    columns = {name: hdf5.column_value(sliced.column(name)) for name in sliced.column_names}
    assert columns["observation.state"].dtype == np.float32
    assert columns["observation.state"].shape == (n, 14)
    assert columns["action"].shape == (n, 7)
    assert columns["timestamp"].dtype == np.float32
    assert columns["capture_time"].dtype == np.float64
    assert columns["index"].dtype == np.int64
    assert columns["note"] == ["a", None, "c", "d", "e"]
    assert columns["varlist"] == [[1], [1, 2], [], [3], [4]]
    path = tmp_path / "ep.hdf5"
    hdf5.EpisodeWriter().write_episode(path, columns=sliced, videos={}, metadata={}, label="e")
    with hdf5.read_episode(path) as episode:
        for name in table.column_names:
            got = episode.columns[name]
            if isinstance(columns[name], np.ndarray):
                assert got.dtype == columns[name].dtype
                np.testing.assert_array_equal(got, columns[name])
            else:
                assert got == columns[name]


# ---- images -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frames_per_chunk", "compression", "native_convert", "batch"),
    [
        (1, None, True, 32),
        (1, None, False, 4),
        (4, None, True, 8),
        (3, "gzip:1", True, 2),
        (1, "gzip", False, 5),
        (5, "lzf", False, 32),
    ],
)
def test_pixels_equal_pyav_decode(
    tmp_path: Path,
    video_dir: Path,
    frames_per_chunk: int,
    compression: str | None,
    native_convert: bool,
    batch: int,
) -> None:
    name = hdf5.parse_compression(compression)[0]
    options = hdf5.Hdf5Options(
        compression=compression or "none",
        frames_per_chunk=frames_per_chunk,
        batch_frames=batch,
        native_convert=native_convert,
    )
    videos = {
        "observation.images.front": video_dir / "front.mp4",
        "observation.images.wrist": video_dir / "wrist.mp4",
        "cam/odd.size": video_dir / "odd.mp4",
    }
    path = tmp_path / "data" / "chunk-000" / "episode_000000.hdf5"
    writer = hdf5.EpisodeWriter(options)
    writer.write_episode(
        path, columns=episode_table(13), videos=videos, metadata={"fps": 30}, label="episode 0"
    )
    with hdf5.read_episode(path) as episode:
        assert list(episode.images) == list(videos)
        for key, video in videos.items():
            dataset = episode.images[key]
            expected = pyav_decode(video)
            assert dataset.shape == expected.shape and dataset.dtype == np.uint8
            assert dataset.chunks == (frames_per_chunk, *expected.shape[1:])
            assert dataset.maxshape == (None, *expected.shape[1:])
            assert dataset.compression == name
            np.testing.assert_array_equal(dataset[()], expected)
            np.testing.assert_array_equal(dataset[7], expected[7])  # random access
            if name == "gzip":  # our zlib chunks are what HDF5's deflate filter reads
                assert dataset.id.get_chunk_info(0).filter_mask == 0
                assert dataset.id.get_storage_size() < dataset.nbytes
    loaded = hdf5.read_episode(path, load_images=True)
    assert loaded.file is None and isinstance(loaded.images["cam/odd.size"], np.ndarray)
    uses_native = native_convert and native_rgb is not None and swscale.available()
    assert (writer.stats.native_frames > 0) == uses_native
    assert writer.stats.frames == 3 * 13


def test_images_are_appendable(tmp_path: Path, video_dir: Path) -> None:
    path = tmp_path / "ep.hdf5"
    hdf5.EpisodeWriter().write_episode(
        path,
        columns=episode_table(13),
        videos={"front": video_dir / "front.mp4"},
        metadata={},
        label="e",
    )
    with h5py.File(path, "r+") as h5:
        value = h5["images/item_000000/value"]
        value.resize(14, axis=0)
        value[13] = 9
        assert value.shape == (14, H, W, 3)


@pytest.mark.parametrize(
    ("video", "rows", "message"),
    [
        (
            "short.mp4",
            13,
            r"episode 4: camera wrist: short.mp4 decodes to 9 frames but the table has 13 rows",
        ),
        (
            "front.mp4",
            10,
            r"episode 4: camera wrist: front.mp4 has more frames than the 10 table rows",
        ),
        (
            "resized.mp4",
            13,
            r"episode 4: camera wrist: frame 5 is 80x48, but the first frame was 64x48",
        ),
    ],
)
def test_camera_errors_leave_no_file(
    tmp_path: Path, video_dir: Path, video: str, rows: int, message: str
) -> None:
    path = tmp_path / "ep.hdf5"
    with pytest.raises(DatasetError, match=message):
        hdf5.EpisodeWriter().write_episode(
            path,
            columns=episode_table(rows),
            videos={
                "front": video_dir / ("ten.mp4" if rows == 10 else "front.mp4"),
                "wrist": video_dir / video,
            },
            metadata={},
            label="episode 4",
        )
    assert list(tmp_path.iterdir()) == []


def test_empty_episode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no rows"):
        hdf5.EpisodeWriter().write_episode(
            tmp_path / "e.hdf5", columns=episode_table(0), videos={}, metadata={}, label="ep 1"
        )


def test_h5ls_lists_the_file(tmp_path: Path, video_dir: Path) -> None:
    h5ls = shutil.which("h5ls")
    assert h5ls is not None, "h5ls missing: install Debian hdf5-tools (scripts/system_deps.sh)"
    path = tmp_path / "ep.hdf5"
    hdf5.EpisodeWriter().write_episode(
        path,
        columns=episode_table(13),
        videos={"observation.images.front": video_dir / "front.mp4"},
        metadata={"fps": 30, "tasks": ["t"]},
        label="e",
    )
    out = subprocess.run([h5ls, "-r", str(path)], capture_output=True, text=True, check=True)
    listing = out.stdout
    assert "/columns/item_000000/value Dataset {13, 14}" in listing
    assert "/images/item_000000/value Dataset {13/Inf, 48, 64, 3}" in listing
    assert "/metadata/item_000001/value Dataset {" in listing


def test_parse_compression() -> None:
    assert hdf5.parse_compression(None) == (None, None)
    assert hdf5.parse_compression("none") == (None, None)
    assert hdf5.parse_compression("gzip") == ("gzip", 4)
    assert hdf5.parse_compression("gzip:9") == ("gzip", 9)
    assert hdf5.parse_compression("LZF") == ("lzf", None)
    for bad in ("gzip:10", "zstd", "lzf:3", "gzip:x"):
        with pytest.raises(DatasetError, match="hdf5 compression"):
            hdf5.parse_compression(bad)
    opts = hdf5.Hdf5Options.from_values({"hdf5_compression": "gzip:2", "hdf5_frames_per_chunk": 8})
    assert (opts.h5py_compression, opts.compression_level, opts.frames_per_chunk) == ("gzip", 2, 8)
    with pytest.raises(DatasetError, match="^options.hdf5_frames_per_chunk: 0 must be >= 1"):
        hdf5.Hdf5Options(frames_per_chunk=0)
    with pytest.raises(DatasetError, match="^options.hdf5_compression: hdf5 compression 'zip'"):
        hdf5.Hdf5Options(compression="zip")


def test_batch_length_is_whole_chunks_and_bounded() -> None:
    vga = 480 * 640 * 3
    assert hdf5.Hdf5Options(batch_frames=32).batch_length(vga) == 32
    assert hdf5.Hdf5Options(batch_frames=30, frames_per_chunk=8).batch_length(vga) == 32
    assert hdf5.Hdf5Options(batch_frames=1000).batch_length(vga) * vga <= hdf5.MAX_BATCH_BYTES
    # A chunk larger than the cap is still one whole chunk.
    assert hdf5.Hdf5Options(frames_per_chunk=200).batch_length(vga) == 200


# ---- the native rgb kernel (eva.dataset.rgb) ---------------------------------------------


def _kernel(native: object | None, name: str):  # noqa: ANN202 - picks native or reference
    if native is None:
        return getattr(rgb, f"{name}_reference")
    return getattr(native, name)


@pytest.mark.kernels
@pytest.mark.parametrize("native", KERNELS)
@settings(max_examples=40, deadline=None)
@given(
    height=st.integers(1, 9),
    width=st.integers(1, 9),
    pad=st.integers(0, 7),
    slots=st.integers(1, 4),
    data=st.data(),
)
def test_pack_frame_matches_reference(
    native: object | None, height: int, width: int, pad: int, slots: int, data: st.DataObject
) -> None:
    rng = np.random.default_rng(height * 100 + width * 10 + pad)
    padded = rng.integers(0, 256, (height, width * 3 + pad), dtype=np.uint8)
    frame = padded[:, : width * 3].reshape(height, width, 3)  # row stride > W*3, like a plane
    slot = data.draw(st.integers(0, slots - 1))
    batch = np.zeros((slots, height, width, 3), dtype=np.uint8)
    _kernel(native, "pack_frame")(frame, batch, slot)
    expected = np.zeros_like(batch)
    expected[slot] = frame
    np.testing.assert_array_equal(batch, expected)


@pytest.mark.kernels
@pytest.mark.parametrize("native", KERNELS)
def test_pack_frame_rejects_bad_input(native: object | None) -> None:
    pack = _kernel(native, "pack_frame")
    batch = np.zeros((2, 4, 4, 3), dtype=np.uint8)
    with pytest.raises(ValueError):
        pack(np.zeros((4, 5, 3), dtype=np.uint8), batch, 0)
    with pytest.raises(IndexError):
        pack(np.zeros((4, 4, 3), dtype=np.uint8), batch, 2)
