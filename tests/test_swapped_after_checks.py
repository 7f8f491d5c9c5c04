"""Issue 27: a dataset file is opened beneath the root when it is read, not when it was checked.

Validation and planning check every path first; these tests swap a directory of the dataset for
a symlink to an outside copy *after* those checks (a hook between planning and writing, or a
hook just before a v3 shard copies its samples, or a thread swapping all the time) and then let
the export read: the decoders (PyAV through ``/proc/self/fd``), the box parser, the packet
copies and the v2.1 exporter's reflink/link/copy all open the file beneath the root, so the
export is refused with one line naming the file (exit 1) and nothing of the outside copy is
exported.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from click.testing import CliRunner
from swap_helpers import exchanging

from eva.cli import main
from eva.dataset import fsafe, share, video
from eva.dataset.errors import DatasetError, UnsafePathError
from eva.dataset.reader import DatasetReader
from eva.export import pipeline
from eva.export.pipeline import export_dataset
from eva.formats.lerobot_v3 import splice

FRONT = "observation.images.front"
OUTSIDE_GRAY = 200  # every pixel of the outside copy's frames
EXPORTED = (".mp4", ".parquet", ".h5", ".hdf5", ".mcap")


@pytest.fixture
def raw(qc_failed_dataset: Path) -> Path:
    return qc_failed_dataset


def _gray_copy(camera_dir: Path, outside: Path) -> Path:
    """``camera_dir``'s MP4s re-encoded with flat gray frames (same size, count and rate): a
    read of the copy would pass every check and export other pictures."""
    outside.mkdir(parents=True)
    for path in sorted(camera_dir.glob("*.mp4")):
        with av.open(str(path)) as src:
            stream = src.streams.video[0]
            width, height, rate = stream.width, stream.height, stream.average_rate
            frames = sum(1 for _ in src.decode(stream))
        with av.open(str(outside / path.name), "w", format="mp4") as out:
            encoded = out.add_stream("libx264", rate=rate)
            encoded.width, encoded.height, encoded.pix_fmt = width, height, "yuv420p"
            encoded.options = {"g": "30", "bf": "0", "sc_threshold": "0"}
            gray = np.full((height, width, 3), OUTSIDE_GRAY, np.uint8)
            for _ in range(frames):
                out.mux(encoded.encode(av.VideoFrame.from_ndarray(gray, format="rgb24")))
            out.mux(encoded.encode(None))
    return outside


def _swap_for_link(directory: Path, outside: Path) -> None:
    directory.rename(directory.with_name(directory.name + "-aside"))
    directory.symlink_to(outside, target_is_directory=True)


def _run(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result.exit_code, result.output


def _one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("eva: error:")]
    assert len(lines) == 1, output
    return lines[0]


def _exported_files(raw: Path) -> list[Path]:
    return [p for p in (raw.parent / "export").rglob("*") if p.suffix in EXPORTED]


def _swap_after_planning(monkeypatch: pytest.MonkeyPatch, swap: Callable[[], None]) -> list[bool]:
    """Run ``swap`` when the export makes its staging directory: after validation and the
    plan, before any episode file is read for writing."""
    done: list[bool] = []
    make_staging = pipeline.make_staging

    def hooked(*args: Any) -> Path:
        swap()
        done.append(True)
        return make_staging(*args)

    monkeypatch.setattr(pipeline, "make_staging", hooked)
    return done


@pytest.mark.parametrize("what", ["videos", "data"])
@pytest.mark.parametrize("fmt", ["v21", "v21-copy", "v3", "hdf5", "mcap", "mcap-foxglove"])
def test_a_directory_swapped_after_the_checks_is_refused(
    raw: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, what: str
) -> None:
    directory = raw / "data" / "chunk-000"
    if what == "videos":
        directory = raw / "videos" / "chunk-000" / FRONT
        outside = _gray_copy(directory, tmp_path / "outside")
    else:
        outside = tmp_path / "outside"
        shutil.copytree(directory, outside)
    done = _swap_after_planning(monkeypatch, lambda: _swap_for_link(directory, outside))
    extra = {
        "v21-copy": ["--copy-videos"],
        "mcap-foxglove": ["--mcap-profile", "foxglove"],
    }.get(fmt, [])
    code, output = _run("export", raw, "--format", fmt.split("-")[0], *extra)
    assert done, output
    assert code == 1, output
    line = _one_error_line(output)
    assert str(directory) in line and "symlink" in line, line
    assert not _exported_files(raw), _exported_files(raw)


def test_v3_sample_copy_opens_the_source_again_beneath_the_root(
    raw: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The v3 shard's sample table is read when each episode is appended; the bytes are copied
    when the shard is closed: a swap in between is refused there too."""
    directory = raw / "videos" / "chunk-000" / FRONT
    outside = _gray_copy(directory, tmp_path / "outside")
    close = splice.SplicedMp4.close
    swapped: list[bool] = []

    def hooked(self: splice.SplicedMp4, *args: Any, **kwargs: Any) -> Any:
        if not swapped and not self.path.name.endswith(".parquet"):
            _swap_for_link(directory, outside)
            swapped.append(True)
        return close(self, *args, **kwargs)

    monkeypatch.setattr(splice.SplicedMp4, "close", hooked)
    with pytest.raises(UnsafePathError, match="symlink") as refused:
        export_dataset(raw, "lerobot_v3")
    assert swapped
    assert str(directory) in str(refused.value) and "\n" not in str(refused.value)
    assert not _exported_files(raw)


def test_reader_frames_and_counts_open_beneath_the_root(raw: Path, tmp_path: Path) -> None:
    reader = DatasetReader(raw)
    ep = reader.episode_indices[0]
    frames = np.concatenate([b.copy() for b in reader.iter_frames(ep, FRONT)])
    assert reader.count_frames(ep, FRONT) == len(frames)
    directory = reader.video_path(ep, FRONT).parent
    outside = _gray_copy(directory, tmp_path / "outside")
    aside = directory.with_name(directory.name + "-aside")
    _swap_for_link(directory, outside)
    for read in (
        lambda: next(reader.iter_frames(ep, FRONT)),
        lambda: reader.count_frames(ep, FRONT),
        lambda: video.count_decoded_frames(reader.video_file(ep, FRONT)),
        lambda: share.share_file(reader.video_file(ep, FRONT), tmp_path / "shared.mp4"),
    ):
        with pytest.raises(UnsafePathError, match="symlink") as refused:
            read()
        assert str(reader.video_path(ep, FRONT)) in str(refused.value)
    assert not (tmp_path / "shared.mp4").exists()
    directory.unlink()
    aside.rename(directory)
    again = np.concatenate([b.copy() for b in reader.iter_frames(ep, FRONT)])
    assert np.array_equal(again, frames)


def test_ffmpeg_reads_and_seeks_the_open_file_through_proc(raw: Path) -> None:
    """The magic link FFmpeg is given names the open file: decoding and seeking read the same
    frames as the path does."""
    from eva.formats._decode import decode_frames, frame_at

    reader = DatasetReader(raw)
    ep = reader.episode_indices[1]
    by_path = list(decode_frames(reader.video_path(ep, FRONT)))
    by_fd = list(decode_frames(reader.video_file(ep, FRONT)))
    assert len(by_fd) == len(by_path) > 0
    for (t_fd, frame_fd), (t_path, frame_path) in zip(by_fd, by_path, strict=True):
        assert t_fd == t_path and np.array_equal(frame_fd, frame_path)
    t = by_path[-3][0]
    seek_path = frame_at(reader.video_path(ep, FRONT), t, 1e-6)
    seek_fd = frame_at(reader.video_file(ep, FRONT), t, 1e-6)
    assert seek_path is not None and seek_fd is not None
    assert seek_fd[0] == seek_path[0] == t and np.array_equal(seek_fd[1], seek_path[1])


def test_share_file_links_the_open_inode(tmp_path: Path) -> None:
    """A read-only file is hard-linked through its /proc/self/fd magic link (linkat with
    AT_SYMLINK_FOLLOW, no privilege needed): the link is the inode opened beneath the root."""
    root = tmp_path / "root"
    (root / "videos").mkdir(parents=True)
    src = root / "videos" / "a.mp4"
    src.write_bytes(b"raw bytes")
    fsafe.make_read_only(src)
    how = share.share_file(fsafe.FileBeneath(root, "videos/a.mp4"), tmp_path / "out.mp4")
    assert how in ("reflink", "link")
    if how == "link":
        assert os.stat(tmp_path / "out.mp4").st_ino == os.stat(src).st_ino
    src.chmod(0o644)
    assert share.share_file(fsafe.FileBeneath(root, "videos/a.mp4"), tmp_path / "w") != "link"


def test_frames_read_while_a_thread_swaps_the_camera_directory(raw: Path, tmp_path: Path) -> None:
    """A thread exchanges the camera directory with a link to the gray copy (``renameat2``: the
    path is always one or the other) while the frames are read again and again: each read is
    the dataset's frames or refused, never gray."""
    reader = DatasetReader(raw)
    ep = reader.episode_indices[0]
    inside = np.concatenate([b.copy() for b in reader.iter_frames(ep, FRONT)])
    directory = reader.video_path(ep, FRONT).parent
    link = directory.with_name("camera-link")
    link.symlink_to(_gray_copy(directory, tmp_path / "outside"), target_is_directory=True)
    outcomes: set[str] = set()
    with exchanging(directory, link):
        for _ in range(60):
            try:
                frames = np.concatenate([b.copy() for b in reader.iter_frames(ep, FRONT)])
            except DatasetError as e:
                assert "symlink" in str(e) or "missing" in str(e), e
                outcomes.add("refused")
                continue
            assert np.array_equal(frames, inside)  # never OUTSIDE_GRAY
            outcomes.add("ok")
    assert outcomes <= {"ok", "refused"}
