"""``eva merge``: sessions of one rig into a new raw dataset, the sources never touched.

Real datasets, real ``eva`` subprocesses (exit codes, one-line refusals, kill -9 at random
moments), read back with pyarrow and PyAV; every source tree's SHA-256, modes and mtimes are
compared before and after every command."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest

from eva.capture.synthetic import write_synthetic_dataset
from eva.dataset import layout, spool
from eva.dataset.merge import STAGING_INFIX, merge_sessions
from eva.dataset.reader import DatasetReader
from eva.dataset.validate import validate_dataset
from eva.dataset.writer import DatasetWriter

FRONT = "observation.images.front"


def tree_state(root: Path) -> dict[str, tuple[str, int, int]]:
    """Every file's SHA-256, mode and mtime, and every directory's mode and mtime."""
    state: dict[str, tuple[str, int, int]] = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        state[str(p.relative_to(root))] = (digest, st.st_mode, st.st_mtime_ns)
    return state


def eva(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eva.cli", *map(str, args)], capture_output=True, text=True
    )


@pytest.fixture
def sessions(tmp_path: Path) -> tuple[Path, Path]:
    a = write_synthetic_dataset(
        tmp_path / "a" / "raw",
        episodes=3,
        frames=[10, 12, 9],
        cameras=2,
        qc_verdicts=["pass", None, "fail"],
        qc_notes=[None, "wobbly", None],
        tasks=["pick", "place"],
        extra_rows=[
            {"edit_trim": [1, 8], "lab_field": {"x": 1}},
            {"edit_task": "stack"},
            {"edit_drop": True},
        ],
    )
    b = write_synthetic_dataset(
        tmp_path / "b" / "raw",
        episodes=2,
        frames=[11, 8],
        cameras=2,
        quality=["red", "green"],
        tasks=["place", "wipe"],
        seed=5,
    )
    return a, b


def test_merge_renumbers_unions_and_carries_everything(
    tmp_path: Path, sessions: tuple[Path, Path]
) -> None:
    a, b = sessions
    before = {s: tree_state(s) for s in sessions}
    result = eva("merge", a, b, "--into", tmp_path / "ab" / "raw", "--json")
    assert result.returncode == 0, result.stderr
    into = tmp_path / "ab" / "raw"
    assert json.loads(result.stdout)["episodes"] == 5
    assert {s: tree_state(s) for s in sessions} == before
    assert validate_dataset(into) == []
    assert eva("validate", into).returncode == 0

    merged, ra, rb = DatasetReader(into), DatasetReader(a), DatasetReader(b)
    assert merged.tasks == {0: "pick", 1: "place", 2: "wipe"}
    origins = [(a, ra, ep) for ep in range(3)] + [(b, rb, ep) for ep in range(2)]
    offset = 0
    for new, (root, reader, old) in enumerate(origins):
        row, source_row = merged.episode(new), reader.episode(old)
        assert row.pop("source_session") == {"dataset": str(root), "episode_index": old}
        assert row == {**source_row, "episode_index": new}  # every field, unknown ones too
        table, source = merged.read_table(new), reader.read_table(old)
        assert table.column("episode_index").to_pylist() == [new] * len(source)
        assert table.column("index").to_pylist() == list(range(offset, offset + len(source)))
        texts = [merged.tasks[t] for t in table.column("task_index").to_pylist()]
        assert texts == [reader.tasks[t] for t in source.column("task_index").to_pylist()]
        for column in ("observation.state", "action", "timestamp", "frame_index"):
            assert table.column(column).equals(source.column(column))
        stats = merged.episodes_stats[new]
        assert stats["index"]["min"] == [offset] and stats["episode_index"]["max"] == [new]
        assert stats["observation.state"] == reader.episodes_stats[old]["observation.state"]
        for key in merged.video_keys:
            copied, original = merged.video_path(new, key), reader.video_path(old, key)
            assert copied.read_bytes() == original.read_bytes()
            assert copied.stat().st_ino != original.stat().st_ino  # never a hard link
            assert copied.stat().st_nlink == 1 and copied.stat().st_mode & 0o222 == 0
            hist = merged.image_histograms(new)
            assert hist is not None
            np.testing.assert_array_equal(hist[key], reader.image_histograms(old)[key])  # type: ignore[index]
        offset += len(source)
    assert merged.info["total_episodes"] == 5 and merged.info["total_frames"] == offset
    assert merged.info["total_tasks"] == 3 and merged.info["total_videos"] == 10


def test_a_merged_merge_keeps_the_original_recording(
    tmp_path: Path, sessions: tuple[Path, Path]
) -> None:
    a, b = sessions
    merge_sessions([a, b], tmp_path / "ab" / "raw", durable=False)
    c = write_synthetic_dataset(tmp_path / "c" / "raw", episodes=1, cameras=2, seed=9)
    merge_sessions([tmp_path / "ab" / "raw", c], tmp_path / "abc" / "raw", durable=False)
    rows = DatasetReader(tmp_path / "abc" / "raw").episodes
    assert rows[4]["source_session"] == {"dataset": str(b), "episode_index": 1}
    assert rows[5]["source_session"] == {"dataset": str(c), "episode_index": 0}


def test_the_export_traces_each_episode_to_its_recording(
    tmp_path: Path, sessions: tuple[Path, Path]
) -> None:
    from eva.export.pipeline import export_dataset

    a, b = sessions
    into = tmp_path / "ab" / "raw"
    merge_sessions([a, b], into, durable=False)
    export_dataset(into, "lerobot_v3")
    for subset in ("accepted", "rejected"):
        split = json.loads(
            (tmp_path / "ab" / "export" / "lerobot_v3" / subset / layout.QUALITY_SPLIT).read_text()
        )
        rows = DatasetReader(into).episodes
        assert split["source_sessions"] == [
            rows[i]["source_session"] for i in split["source_episode_indices"]
        ]


def _camera_renamed(tmp_path: Path) -> tuple[Path, Path]:
    a = write_synthetic_dataset(
        tmp_path / "a" / "raw", episodes=2, cameras=["observation.images.top"]
    )
    b = write_synthetic_dataset(
        tmp_path / "b" / "raw", episodes=2, cameras=["observation.images.high"], seed=3
    )
    return a, b


def test_map_renames_a_camera_of_one_session(tmp_path: Path) -> None:
    a, b = _camera_renamed(tmp_path)
    into = tmp_path / "ab" / "raw"
    refused = eva("merge", a, b, "--into", into)
    assert refused.returncode == 1 and not into.exists()
    lines = refused.stderr.splitlines()
    assert any(f"{a} and {b}: feature observation.images.top is in {a} only" in x for x in lines)
    assert any(f"{a} and {b}: feature observation.images.high is in {b} only" in x for x in lines)
    result = eva(
        "merge",
        a,
        b,
        "--into",
        into,
        "--map",
        f"{b}:observation.images.high=observation.images.top",
    )
    assert result.returncode == 0, result.stderr
    merged = DatasetReader(into)
    assert merged.video_keys == ["observation.images.top"]
    assert merged.episode(3)["video_keys"] == ["observation.images.top"]
    assert set(merged.image_histograms(3) or {}) == {"observation.images.top"}
    assert validate_dataset(into) == []


def test_map_renames_a_vector_and_the_table_metadata_follows(tmp_path: Path) -> None:
    a = write_synthetic_dataset(tmp_path / "a" / "raw", episodes=1)
    b = write_synthetic_dataset(tmp_path / "b" / "raw", episodes=1, seed=2)
    into = tmp_path / "ab" / "raw"
    merge_sessions([a, b], into, ["observation.state=observation.joints"], durable=False)
    merged = DatasetReader(into)
    assert "observation.joints" in merged.features and "observation.state" not in merged.features
    schema = pq.read_schema(merged.data_path(1))
    assert b"observation.joints" in schema.metadata[b"huggingface"]
    assert validate_dataset(into) == []


def _reencode_with_b_frames(path: Path) -> None:
    with av.open(str(path)) as src:
        frames = [f.to_ndarray(format="rgb24") for f in src.decode(video=0)]
    os.chmod(path, 0o644)
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = (
            frames[0].shape[1],
            frames[0].shape[0],
            "yuv420p",
        )
        stream.codec_context.max_b_frames = 2
        stream.options = {"bf": "2", "g": "30"}
        for frame in frames:
            out.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        out.mux(stream.encode())


def test_rig_differences_refuse_with_one_line_each(tmp_path: Path) -> None:
    a = write_synthetic_dataset(tmp_path / "a" / "raw", episodes=2, frames=12)
    b = write_synthetic_dataset(tmp_path / "b" / "raw", episodes=2, frames=12, fps=15, width=80)
    c = write_synthetic_dataset(tmp_path / "c" / "raw", episodes=2, frames=12, seed=4)
    for ep in range(2):
        _reencode_with_b_frames(DatasetReader(c).video_path(ep, FRONT))
    states = {s: tree_state(s) for s in (a, b, c)}
    into = tmp_path / "abc" / "raw"
    result = eva("merge", a, b, c, "--into", into)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert f"eva: error: {a} and {b}: fps 30 != 15" in lines
    assert any(
        f"{a} and {b}: feature {FRONT}: shape [48, 64, 3] != [48, 80, 3]" in x for x in lines
    )
    assert any(
        f"{a} and {b}: camera {FRONT}: h264" in x and "64x48" in x and "80x48" in x for x in lines
    )
    b_frames = [x for x in lines if f"{a} and {c}: camera {FRONT}" in x]
    assert len(b_frames) == 1 and "no B-frames (episode 0) != " in b_frames[0], lines
    assert b_frames[0].endswith("B-frames (episode 0)")
    assert not into.exists() and not list(into.parent.glob(".*")) if into.parent.exists() else True
    assert {s: tree_state(s) for s in (a, b, c)} == states


def test_a_session_mixing_layouts_is_named_with_its_episodes(tmp_path: Path) -> None:
    a = write_synthetic_dataset(tmp_path / "a" / "raw", episodes=2, frames=12)
    b = write_synthetic_dataset(tmp_path / "b" / "raw", episodes=2, frames=12, seed=1)
    _reencode_with_b_frames(DatasetReader(b).video_path(1, FRONT))
    result = eva("merge", a, b, "--into", tmp_path / "ab")
    assert result.returncode == 1
    assert f"{b}: camera {FRONT}: episode 0 is h264" in result.stderr
    assert ", episode 1 is h264" in result.stderr


@pytest.mark.parametrize(
    ("case", "code", "says"),
    [
        ("exists", 2, "exists: eva merge writes a new dataset"),
        ("itself", 2, "into itself"),
        ("twice", 2, "are the same dataset"),
        ("nested", 2, "merge sources may not overlap"),
        ("inside", 2, "the merged dataset must be new"),
        ("one", 2, "at least two sessions"),
        ("bad_map", 2, "write [SESSION:]OLD_KEY=NEW_KEY"),
        ("map_unknown", 2, "no session has a feature nope"),
        ("map_session", 2, "is not one of the sessions merged"),
        ("map_index", 2, "index is renumbered, not renamed"),
        ("map_collision", 2, "has a feature action already"),
        ("not_dataset", 1, "info.json"),
        ("invalid", 1, "not merged:"),
        ("damaged_video", 1, "video data is damaged"),  # found by the inspections, not the walk
        ("writer", 1, "another writer holds it"),
        ("spool", 1, "await crash recovery"),
    ],
)
def test_refusals_are_one_line_and_write_nothing(
    tmp_path: Path, sessions: tuple[Path, Path], case: str, code: int, says: str
) -> None:
    a, b = sessions
    into = tmp_path / "ab" / "raw"
    args: list[str | Path] = [a, b, "--into", into]
    held: DatasetWriter | None = None
    if case == "exists":
        into.mkdir(parents=True)
    elif case == "itself":
        args = [a, b, "--into", a]
    elif case == "twice":
        args = [a, tmp_path / "a" / ".." / "a" / "raw", "--into", into]
    elif case == "nested":
        nested = shutil.copytree(b, a / "inner")
        args = [a, nested, "--into", into]
    elif case == "inside":
        args = [a, b, "--into", a / "merged"]
    elif case == "one":
        args = [a, "--into", into]
    elif case == "bad_map":
        args += ["--map", "observation.state"]
    elif case == "map_unknown":
        args += ["--map", "nope=observation.x"]
    elif case == "map_session":
        args += ["--map", f"{tmp_path}:action=act"]
    elif case == "map_index":
        args += ["--map", "index=i"]
    elif case == "map_collision":
        args += ["--map", f"{b}:observation.state=action"]
    elif case == "not_dataset":
        empty = tmp_path / "empty"
        empty.mkdir()
        args = [a, empty, "--into", into]
    elif case == "invalid":
        (DatasetReader(b).data_path(1)).unlink()
    elif case == "damaged_video":
        reader = DatasetReader(b)
        _damage_samples(reader.video_path(1, reader.video_keys[0]))
    elif case == "writer":
        held = DatasetWriter.open_existing(b, durable=False)
    elif case == "spool":
        work = b / layout.WORK_DIR / "episode-x"
        work.mkdir()
        (work / spool.MANIFEST).write_text(json.dumps({"format": spool.SPOOL_FORMAT}))
    before = {s: tree_state(s) for s in (a, b)}
    try:
        result = eva("merge", *args)
    finally:
        if held is not None:
            held.close()
    assert result.returncode == code, result.stderr
    assert len(result.stderr.splitlines()) == 1 and says in result.stderr, result.stderr
    assert {s: tree_state(s) for s in (a, b)} == before
    if case not in ("exists",):
        assert not into.exists()
    leftovers = [p for p in tmp_path.rglob(f"*{STAGING_INFIX}*")]
    assert leftovers == []


def _damage_samples(path: Path) -> None:
    """Overwrite most of the MP4's sample data (its keyframe first), the boxes intact."""
    from eva.dataset import mp4box

    samples = mp4box.read_video_samples(path)
    start, end = int(samples.offsets.min()), int((samples.offsets + samples.sizes).max())
    data = bytearray(path.read_bytes())
    n = int((end - start) * 0.6)
    data[start : start + n] = random.Random(1).randbytes(n)
    path.unlink()
    path.write_bytes(bytes(data))


def _no_merge_leftovers(parent: Path) -> bool:
    return not parent.exists() or not [p for p in parent.iterdir() if STAGING_INFIX in p.name]


@pytest.mark.slow
def test_kill_9_at_random_moments_leaves_no_dataset_and_the_next_run_cleans(
    tmp_path: Path,
) -> None:
    a = write_synthetic_dataset(tmp_path / "a" / "raw", episodes=6, frames=20, cameras=2)
    b = write_synthetic_dataset(tmp_path / "b" / "raw", episodes=6, frames=20, cameras=2, seed=2)
    before = {s: tree_state(s) for s in (a, b)}
    into = tmp_path / "ab" / "raw"
    argv = [sys.executable, "-m", "eva.cli", "merge", str(a), str(b), "--into", str(into)]
    start = time.monotonic()
    assert subprocess.run(argv, capture_output=True).returncode == 0
    full = time.monotonic() - start
    shutil.rmtree(into)
    rng = random.Random(29)
    outcomes = {"none": 0, "complete": 0}
    for _ in range(8):
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.0, full))
        process.send_signal(signal.SIGKILL)
        process.wait()
        assert {s: tree_state(s) for s in (a, b)} == before
        if into.exists():  # killed after the rename: complete and valid
            assert validate_dataset(into) == []
            assert DatasetReader(into).info["total_episodes"] == 12
            outcomes["complete"] += 1
            shutil.rmtree(into)
        else:
            outcomes["none"] += 1
        rerun = subprocess.run(argv, capture_output=True, text=True)
        assert rerun.returncode == 0, rerun.stderr
        assert _no_merge_leftovers(into.parent)
        assert validate_dataset(into) == []
        shutil.rmtree(into)
    assert outcomes["none"] >= 1, outcomes


def test_a_leftover_of_a_live_merge_is_left_alone(
    tmp_path: Path, sessions: tuple[Path, Path]
) -> None:
    from eva.dataset import locks
    from eva.dataset.merge import remove_leftovers

    into = tmp_path / "ab" / "raw"
    into.parent.mkdir()
    live = into.parent / f".raw{STAGING_INFIX}live"
    dead = into.parent / f".raw{STAGING_INFIX}dead"
    for staging in (live, dead):
        (staging / layout.WORK_DIR).mkdir(parents=True)
        (staging / layout.WORK_DIR / layout.WRITER_LOCK).touch()
    fd = locks.try_flock(live / layout.WORK_DIR / layout.WRITER_LOCK, create=False)
    try:
        assert remove_leftovers(into) == [dead]
        assert live.exists()
    finally:
        assert fd is not None
        locks.release_flock(fd)


def test_eva_cleanup_removes_what_a_killed_merge_left(
    tmp_path: Path, sessions: tuple[Path, Path]
) -> None:
    from eva.dataset import locks

    a, b = sessions
    into = tmp_path / "ab" / "raw"
    process = subprocess.Popen(
        [sys.executable, "-m", "eva.cli", "merge", str(a), str(b), "--into", str(into)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while process.poll() is None and not list(tmp_path.glob(f"ab/.raw{STAGING_INFIX}*")):
        time.sleep(0.001)
    process.send_signal(signal.SIGKILL)  # while it writes its staging dir (or done, if fast)
    process.wait()
    shutil.rmtree(into, ignore_errors=True)
    for staging in into.parent.iterdir():  # killed between its mkdir and its lock: kept 60 s
        if not (staging / layout.WORK_DIR / layout.WRITER_LOCK).exists():
            shutil.rmtree(staging)
    dead = into.parent / f".raw{STAGING_INFIX}dead"
    live = into.parent / f".raw{STAGING_INFIX}live"
    for staging in (dead, live):
        (staging / layout.WORK_DIR).mkdir(parents=True)
        (staging / layout.WORK_DIR / layout.WRITER_LOCK).touch()
    killed = sorted(p for p in into.parent.iterdir() if p not in (dead, live))
    fd = locks.try_flock(live / layout.WORK_DIR / layout.WRITER_LOCK, create=False)
    try:
        result = eva("cleanup", into, "--json")  # the target was never published
        assert result.returncode == 0, result.stderr
        removed = json.loads(result.stdout)["actions"]["merge"]
        assert sorted(removed) == sorted(
            f"removed {p} (left by a killed eva merge)" for p in [*killed, dead]
        )
        assert sorted(into.parent.iterdir()) == [live]  # a live merge's staging stays
    finally:
        assert fd is not None
        locks.release_flock(fd)
    again = eva("cleanup", into)
    assert (
        again.returncode == 0 and "left by a killed eva merge" in again.stdout
    )  # live is dead now
    assert list(into.parent.iterdir()) == []
    missing = eva("cleanup", tmp_path / "ab" / "nothing")
    assert missing.returncode == 2 and "no such dataset" in missing.stderr


def test_merge_options_are_checked_by_click(tmp_path: Path, sessions: tuple[Path, Path]) -> None:
    a, _ = sessions
    result = eva("merge", a, tmp_path / "missing", "--into", tmp_path / "x")
    assert result.returncode == 2
