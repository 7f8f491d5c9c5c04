"""HDF5 through the real export pipeline: a synthetic raw v2.1 dataset is split and exported,
verified, read back with h5py, compared with a PyAV decode of the source MP4s; bad cameras abort
the export and nothing is published."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from video_helpers import encode_video, pyav_decode

from eva._native import load
from eva.capture.synthetic import write_synthetic_dataset
from eva.dataset import swscale
from eva.dataset.errors import DatasetError
from eva.dataset.reader import DatasetReader
from eva.export.pipeline import export_dataset
from eva.formats import hdf5
from eva.formats.base import ExportOptions
from eva.formats.options import Hdf5Options

CAMERAS = ["observation.images.front", "observation.images.wrist"]


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    return write_synthetic_dataset(
        tmp_path / "pick" / "raw",
        episodes=3,
        frames=[12, 15, 10],
        cameras=CAMERAS,
        quality=["green", "red", "green"],
        extra_rows=[{"operator": {"name": "ann", "shift": [1, 2]}}, None, None],
    )


def test_export_verify_and_read_back(raw: Path) -> None:
    result = export_dataset(
        raw, "hdf5", options=ExportOptions(format=Hdf5Options(frames_per_chunk=4))
    )
    accepted, rejected = result.accepted_dir, result.rejected_dir
    assert accepted == raw.parent / "export" / "hdf5" / "accepted"
    assert hdf5.verify(accepted) == []
    assert hdf5.verify(rejected) == []

    info = json.loads((accepted / "meta" / "info.json").read_text())
    assert info["embedded_images"] is True and info["total_videos"] == 0
    assert "video_path" not in info
    assert info["total_episodes"] == 2 and info["total_frames"] == 22
    for key in CAMERAS:
        assert info["features"][key]["dtype"] == "image"
        assert info["features"][key]["shape"] == [48, 64, 3]
    for name in ("episodes.jsonl", "tasks.jsonl", "stats.json", "quality_split.json"):
        assert (accepted / "meta" / name).is_file()
    marker = json.loads((accepted / "meta" / "quality_split.json").read_text())
    assert marker["dataset_format"] == "hdf5" and marker["source_episode_indices"] == [0, 2]

    source = DatasetReader(raw)
    offset = 0
    for new, src in enumerate([0, 2]):
        path = accepted / "data" / "chunk-000" / f"episode_{new:06d}.hdf5"
        source_table = source.read_table(src)
        with hdf5.read_episode(path) as episode:
            columns = episode.columns
            assert list(columns) == source_table.column_names
            state = columns["observation.state"]
            assert state.dtype == np.float32 and state.shape == (source_table.num_rows, 14)
            np.testing.assert_array_equal(state, source.read_vector(src, "observation.state"))
            np.testing.assert_array_equal(columns["episode_index"], np.full(len(state), new))
            np.testing.assert_array_equal(columns["index"], np.arange(offset, offset + len(state)))
            offset += len(state)
            for key in CAMERAS:
                images = episode.images[key]
                assert images.maxshape == (None, 48, 64, 3) and images.chunks == (4, 48, 64, 3)
                np.testing.assert_array_equal(images[()], pyav_decode(source.video_path(src, key)))
            meta = episode.metadata
            assert meta["fps"] == 30 and meta["episode_index"] == new
            assert meta["length"] == len(state) and meta["video_keys"] == CAMERAS
            if src == 0:
                assert meta["operator"] == {"name": "ann", "shift": [1, 2]}
    rejected_file = rejected / "data" / "chunk-000" / "episode_000000.hdf5"
    with hdf5.read_episode(rejected_file) as episode:
        assert episode.metadata["quality"] == "red"
        assert episode.metadata["quality_issues"][0]["code"] == "frozen_camera"

    h5ls = shutil.which("h5ls")
    assert h5ls is not None, "h5ls missing: install Debian hdf5-tools (scripts/system_deps.sh)"
    listing = subprocess.run(
        [h5ls, "-r", str(rejected_file)], capture_output=True, text=True, check=True
    ).stdout
    assert "/images/item_000001/value Dataset {15/Inf, 48, 64, 3}" in listing


def test_verify_reports_a_truncated_image(raw: Path) -> None:
    import h5py

    accepted = export_dataset(raw, "hdf5").accepted_dir
    path = accepted / "data" / "chunk-000" / "episode_000001.hdf5"
    with h5py.File(path, "r+") as h5:
        h5["images/item_000000/value"].resize(9, axis=0)
        del h5["metadata/item_000000"].attrs["kind"]
    problems = hdf5.verify(accepted)
    codes = {p.code for p in problems}
    assert {"frame_count", "missing_attrs"} <= codes
    assert all(p.episode == 1 for p in problems)


@pytest.mark.parametrize("defect", ["short", "long", "resized"])
def test_bad_camera_aborts_and_publishes_nothing(raw: Path, tmp_path: Path, defect: str) -> None:
    # A good export first: a failed re-export must leave this pair untouched.
    first = export_dataset(raw, "hdf5")
    before = sorted(p.relative_to(first.export_root) for p in first.export_root.rglob("*.hdf5"))
    assert len(before) == 3

    target = DatasetReader(raw).video_path(2, CAMERAS[1])  # accepted episode 1, 10 rows
    rng = np.random.default_rng(0)
    if defect == "short":
        encode_video(target, rng.integers(0, 255, (7, 48, 64, 3), dtype=np.uint8))
    elif defect == "long":
        encode_video(target, rng.integers(0, 255, (11, 48, 64, 3), dtype=np.uint8))
    else:
        first_part, second_part = tmp_path / "a.h264", tmp_path / "b.h264"
        encode_video(first_part, rng.integers(0, 255, (4, 48, 64, 3), dtype=np.uint8), "h264")
        encode_video(second_part, rng.integers(0, 255, (6, 48, 80, 3), dtype=np.uint8), "h264")
        target.write_bytes(first_part.read_bytes() + second_part.read_bytes())

    # Source validation (container frame counts) or the HDF5 writer (decoded frames, shapes)
    # stops it; either way the one-line error names the episode and the camera.
    with pytest.raises(DatasetError, match=r"episode 2\)?:? camera observation\.images\.wrist"):
        export_dataset(raw, "hdf5")
    root = first.export_root
    after = sorted(p.relative_to(root) for p in root.rglob("*.hdf5"))
    assert after == before  # the old pair is still the published one, nothing else appeared
    assert hdf5.verify(first.accepted_dir) == []
    leftovers = [p.name for p in root.parent.iterdir() if p.name.startswith(".eva-staging")]
    assert leftovers == []
    job = json.loads((root / "job.json").read_text())
    assert job["state"] == "failed" and "observation.images.wrist" in job["error"]


def test_no_cameras_and_an_empty_subset(tmp_path: Path) -> None:
    raw = write_synthetic_dataset(tmp_path / "d" / "raw", episodes=2, frames=8, cameras=0)
    result = export_dataset(raw, "hdf5")
    assert hdf5.verify(result.accepted_dir) == []
    assert hdf5.verify(result.rejected_dir) == []  # complete, valid and empty
    info = json.loads((result.rejected_dir / "meta" / "info.json").read_text())
    assert info["total_episodes"] == 0 and info["embedded_images"] is True
    assert not (result.rejected_dir / "data").exists()
    with hdf5.read_episode(result.accepted_dir / "data/chunk-000/episode_000001.hdf5") as episode:
        assert episode.images == {}
        np.testing.assert_array_equal(episode.columns["index"], np.arange(8, 16))


FIXTURE = Path(__file__).parent / "fixtures" / "lerobot_v21_fixture"


def test_lerobot_written_fixture_exports_with_identical_pixels(tmp_path: Path) -> None:
    """A dataset written by LeRobot itself (AV1, limited-range yuv420p) exports losslessly."""
    raw = tmp_path / "fixture" / "raw"
    shutil.copytree(FIXTURE, raw)
    result = export_dataset(raw, "hdf5")
    assert hdf5.verify(result.accepted_dir) == [] and hdf5.verify(result.rejected_dir) == []
    source = DatasetReader(raw)
    marker = json.loads((result.accepted_dir / "meta" / "quality_split.json").read_text())
    assert marker["source_episode_indices"]
    for new, src in enumerate(marker["source_episode_indices"]):
        path = result.accepted_dir / "data" / "chunk-000" / f"episode_{new:06d}.hdf5"
        with hdf5.read_episode(path) as episode:
            assert episode.columns["observation.state"].dtype == np.float32
            for key in source.video_keys:
                expected = pyav_decode(source.video_path(src, key))
                np.testing.assert_array_equal(episode.images[key][()], expected)

    # libswscale straight into the batch reproduces PyAV for this colour description too (not
    # a silent fallback to PyAV's conversion and a copy).
    writer = hdf5.EpisodeWriter()
    key = source.video_keys[0]
    writer.write_episode(
        tmp_path / "one.hdf5",
        columns=source.read_table(0),
        videos={key: source.video_path(0, key)},
        metadata={},
        label="fixture episode 0",
    )
    if load("rgb") is not None and swscale.available():
        assert writer.stats.pyav_frames == 0 and writer.stats.native_frames == source.length(0)


# A child process writes one episode file on a tiny tmpfs with less and less room left: every
# write either succeeds or raises one error naming the file, and nothing else reaches stderr.
_FULL_DISK_CHILD = r"""
import os, sys
from pathlib import Path
from eva.dataset.errors import WriteError
from eva.dataset.reader import DatasetReader
from eva.formats.hdf5 import EpisodeWriter, Hdf5Options

source, disk, compression = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
reader = DatasetReader(source)
table = reader.read_table(0)
videos = {key: reader.video_path(0, key) for key in reader.video_keys}
target = disk / "episode.hdf5"
writer = EpisodeWriter(Hdf5Options(compression=compression, frames_per_chunk=2))
room = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
for left in range(room, -1, -4096):
    filler = disk / "filler"
    filler.write_bytes(b"\0" * (room - left))
    try:
        writer.write_episode(target, columns=table, videos=videos, metadata={}, label="ep")
        print("ok")
    except WriteError as e:
        assert str(e) == f"{target}: No space left on device", e
        print("full")
    assert sorted(p.name for p in disk.iterdir()) in (["filler"], ["episode.hdf5", "filler"])
    target.unlink(missing_ok=True)
    filler.unlink()
writer.close()
"""


@pytest.mark.parametrize("compression", ["none", "gzip", "lzf"])
def test_a_full_disk_at_any_point_is_one_error(tmp_path: Path, compression: str) -> None:
    """HDF5 keeps no written bytes back to fail later (a dataset closed by Python's collector
    on a full disk failed unseen, "Exception ignored" on stderr, and left the process to
    segfault), and the file's close cannot run out of room: wherever the disk fills up, the
    writer raises one error naming the file, or writes it whole."""
    import sys

    source = write_synthetic_dataset(tmp_path / "raw", episodes=1, frames=[9], width=64, height=48)
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=160k", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        done = subprocess.run(
            [sys.executable, "-c", _FULL_DISK_CHILD, str(source), str(disk), compression],
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        subprocess.run(["umount", str(disk)], check=True, timeout=30)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-3000:]
    outcomes = done.stdout.split()
    assert outcomes[0] == "ok" and outcomes[-1] == "full" and set(outcomes) == {"ok", "full"}
