"""Edits applied by every export, exactly (issue 29 part 2): a trim keeps the frames
``[start, end)`` and nothing else, with ``frame_index`` and ``timestamp`` from 0 and the global
``index`` running on; an edited task joins the exported subset's task table; stats cover the kept
frames only; the raw tree is never touched. Every format's files are read back by the official
readers (pyarrow + PyAV, h5py, mcap), and each kept frame is compared with the raw frame at its
index plus the trim start."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import h5py
import numpy as np
import pyarrow.parquet as pq
import pytest

from eva.dataset.reader import DatasetReader
from eva.export.pipeline import ExportResult, export_dataset
from eva.export.verify import verify_export
from eva.formats.hdf5.items import ITEM_NAME
from eva.formats.hdf5.reader import read_episode as read_hdf5
from eva.formats.mcap.reader import read_episode as read_mcap
from eva.quality.edits import EditRequest, edit_episodes

FPS = 30
CAMERA = "observation.images.front"
TRIM = (5, 25)  # of source episode 0 (30 frames)


def tree_digest(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def raw_frames(reader: DatasetReader, episode: int) -> np.ndarray:
    return np.concatenate([b.copy() for b in reader.iter_frames(episode, CAMERA)])


@pytest.fixture(scope="module")
def edited(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 episodes (30, 32, 20, 12 frames): 0 trimmed to [5, 25), 1 re-tasked, 2 dropped, 3 as
    recorded; one camera, textured frames (every frame differs)."""
    from eva.capture.synthetic import write_synthetic_dataset

    root = write_synthetic_dataset(
        tmp_path_factory.mktemp("edits") / "raw",
        episodes=4,
        frames=[30, 32, 20, 12],
        cameras=[CAMERA],
        tasks=["pick", "place", "pick", "place"],
        fps=FPS,
    )
    edit_episodes(root, [0], EditRequest(trim=TRIM))
    edit_episodes(root, [1], EditRequest(task="stack the cups"))
    edit_episodes(root, [2], EditRequest(drop=True))
    return root


@pytest.fixture(scope="module")
def exports(edited: Path) -> Iterator[Callable[[str], ExportResult]]:
    """One export per format, made once; the raw tree's SHA-256 is checked after each."""
    before = tree_digest(edited)
    done: dict[str, ExportResult] = {}

    def get(fmt: str) -> ExportResult:
        if fmt not in done:
            done[fmt] = export_dataset(edited, fmt)
            assert tree_digest(edited) == before, f"{fmt} export changed the raw tree"
        return done[fmt]

    yield get


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_subset_meta_applies_the_edits_once(exports: Callable[[str], ExportResult]) -> None:
    result = exports("lerobot_v3")
    meta = result.metas["accepted"]
    assert meta.source_episode_indices == [0, 1, 3]
    assert meta.lengths == [20, 32, 12]
    assert meta.index_offsets == [0, 20, 52]
    assert meta.trims == {0: TRIM} and meta.source_lengths == {0: 30}
    assert meta.tasks == {0: "pick", 1: "stack the cups", 2: "place"}
    rows = meta.episodes
    assert [r["length"] for r in rows] == [20, 32, 12]
    assert rows[1]["tasks"] == ["stack the cups"]
    assert not any(k.startswith("edit_") for r in rows for k in r)
    split = json.loads((result.accepted_dir / "meta/quality_split.json").read_text())
    assert split["dropped"] == [2]
    assert split["edits"] == {"0": {"trim": list(TRIM)}, "1": {"task": "stack the cups"}}


def _check_rows(table: Any, first_index: int, n: int, task_index: int | None = None) -> None:
    assert table.num_rows == n
    assert table.column("frame_index").to_pylist() == list(range(n))
    assert table.column("index").to_pylist() == list(range(first_index, first_index + n))
    expected = (np.arange(n) / FPS).astype(np.float32)
    assert np.array_equal(table.column("timestamp").to_numpy(), expected)
    if task_index is not None:
        assert set(table.column("task_index").to_pylist()) == {task_index}


def _kept_state(reader: DatasetReader) -> np.ndarray:
    state = reader.read_table(0).column("observation.state").to_pylist()
    return np.asarray(state[TRIM[0] : TRIM[1]], dtype=np.float64)


def test_v21_rows_videos_tasks_and_stats(
    exports: Callable[[str], ExportResult], edited: Path
) -> None:
    pytest.importorskip("eva.dataset.video_cut")  # the v2.1 cutter (cut_episode_video)
    out = exports("lerobot_v21").accepted_dir
    reader = DatasetReader(edited)
    ep0 = pq.read_table(out / "data/chunk-000/episode_000000.parquet")
    _check_rows(ep0, 0, 20)
    assert np.allclose(ep0.column("observation.state").to_pylist(), _kept_state(reader))
    _check_rows(pq.read_table(out / "data/chunk-000/episode_000001.parquet"), 20, 32, 1)
    tasks = _jsonl(out / "meta/tasks.jsonl")
    assert tasks == [
        {"task_index": 0, "task": "pick"},
        {"task_index": 1, "task": "stack the cups"},
        {"task_index": 2, "task": "place"},
    ]
    # the raw tasks.jsonl does not learn the edited task
    assert "stack the cups" not in (edited / "meta/tasks.jsonl").read_text()
    with av.open(str(out / f"videos/chunk-000/{CAMERA}/episode_000000.mp4")) as video:
        frames = [f.to_ndarray(format="rgb24") for f in video.decode(video=0)]
    assert len(frames) == 20
    stats = {r["episode_index"]: r["stats"] for r in _jsonl(out / "meta/episodes_stats.jsonl")}
    s0 = stats[0]
    assert s0["frame_index"]["min"] == [0] and s0["frame_index"]["max"] == [19]
    assert s0["index"]["count"] == [20]
    kept = _kept_state(reader)
    assert np.allclose(s0["observation.state"]["mean"], kept.mean(axis=0))
    assert np.allclose(s0["observation.state"]["max"], kept.max(axis=0))
    assert s0[CAMERA]["count"] == [20]
    decoded = raw_frames(reader, 0)[TRIM[0] : TRIM[1]]
    mean = decoded.reshape(-1, 3).mean(axis=0) / 255.0
    assert np.allclose(np.asarray(s0[CAMERA]["mean"]).ravel(), mean)
    totals = json.loads((out / "meta/info.json").read_text())
    assert totals["total_frames"] == 64 and totals["total_tasks"] == 3
    assert verify_export(out) == []


def test_v3_selects_the_kept_frames_of_the_copied_shard(
    exports: Callable[[str], ExportResult], edited: Path
) -> None:
    """LeRobot decodes frame i of an episode at from_timestamp + i / fps: each must be the raw
    frame at i plus the trim start (the shard holds every recorded frame, packet-copied)."""
    out = exports("lerobot_v3").accepted_dir
    reader = DatasetReader(edited)
    data = pq.read_table(out / "data/chunk-000/file-000.parquet")
    ep0 = data.filter(np.asarray(data.column("episode_index").to_pylist()) == 0)
    _check_rows(ep0, 0, 20)
    episodes = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    row = episodes[0]
    assert row["length"] == 20 and row["dataset_from_index"] == 0 and row["dataset_to_index"] == 20
    assert episodes[1]["tasks"] == ["stack the cups"]
    start = row[f"videos/{CAMERA}/from_timestamp"]
    end = row[f"videos/{CAMERA}/to_timestamp"]
    assert end - start == pytest.approx(20 / FPS, abs=1e-6)
    shard = out / f"videos/{CAMERA}/chunk-000/file-{row[f'videos/{CAMERA}/file_index']:03d}.mp4"
    decoded = _decode_by_time(shard)
    raw = raw_frames(reader, 0)
    for i in range(20):
        t = start + i / FPS
        nearest = min(decoded, key=lambda ts: abs(ts - t))
        assert abs(nearest - t) < 1e-4, f"no frame within 1e-4 s of {t}"
        assert np.array_equal(decoded[nearest], raw[i + TRIM[0]]), f"frame {i}"
    stats = episodes[0]
    assert stats["stats/frame_index/max"] == [19]
    assert stats[f"stats/{CAMERA}/count"] == [20]
    assert verify_export(out) == []


def _decode_by_time(path: Path) -> dict[float, np.ndarray]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        tb = Fraction(stream.time_base or 1)
        return {
            float(frame.pts * tb): frame.to_ndarray(format="rgb24")
            for frame in container.decode(stream)
        }


def test_hdf5_holds_exactly_the_kept_frames(
    exports: Callable[[str], ExportResult], edited: Path
) -> None:
    out = exports("hdf5").accepted_dir
    reader = DatasetReader(edited)
    files = sorted(p for p in (out / "data").rglob("*") if p.is_file())
    with read_hdf5(files[0], load_images=True) as episode:  # h5py underneath
        assert list(np.asarray(episode.columns["frame_index"]).ravel()) == list(range(20))
        assert list(np.asarray(episode.columns["index"]).ravel()) == list(range(20))
        images = np.asarray(episode.images[CAMERA])
    with h5py.File(files[0], "r") as h5:  # the raw h5py view: one image item of 20 frames
        assert h5["images"][ITEM_NAME.format(0)]["value"].shape[0] == 20
    assert images.shape[0] == 20
    raw = raw_frames(reader, 0)
    assert np.array_equal(images, raw[TRIM[0] : TRIM[1]])
    assert verify_export(out) == []


def test_mcap_holds_exactly_the_kept_frames(
    exports: Callable[[str], ExportResult], edited: Path
) -> None:
    out = exports("mcap").accepted_dir
    reader = DatasetReader(edited)
    files = sorted((out / "data").rglob("*.mcap"))
    raw = raw_frames(reader, 0)
    with read_mcap(files[0]) as episode:
        columns = episode.columns
        assert list(np.asarray(columns["frame_index"]).ravel()) == list(range(20))
        frames = [(i, image.copy()) for i, _, image in episode.iter_camera(CAMERA)]
    assert [i for i, _ in frames] == list(range(20))
    for i, image in frames:
        assert np.array_equal(image, raw[i + TRIM[0]]), f"frame {i}"
    with read_mcap(files[1]) as episode:
        assert episode.metadata["tasks"] == ["stack the cups"]
    assert verify_export(out) == []


def test_incremental_reuses_what_no_edit_touched_and_verify_checks_the_edits(
    tmp_path: Path,
) -> None:
    """--incremental links every episode file an edit did not touch; a trim or task changed
    since the export is what ``eva verify`` reports against the source (re-export)."""
    from eva.capture.synthetic import write_synthetic_dataset

    root = write_synthetic_dataset(
        tmp_path / "raw", episodes=3, frames=[16, 18, 20], cameras=[CAMERA], fps=FPS
    )
    edit_episodes(root, [1], EditRequest(trim=(2, 10)))
    first = export_dataset(root, "hdf5")
    assert verify_export(first.accepted_dir) == []
    edit_episodes(root, [2], EditRequest(trim=(0, 19)))
    stale = [p.code for p in verify_export(first.accepted_dir)]
    assert stale == ["edits"]
    again = export_dataset(root, "hdf5", incremental=True)
    assert again.job.episodes_reused == 2  # episodes 0 and 1: 2 is re-trimmed
    assert again.metas["accepted"].lengths == [16, 8, 19]
    assert verify_export(again.accepted_dir) == []
    edit_episodes(root, [1], EditRequest(task="wave"))
    third = export_dataset(root, "hdf5", incremental=True)
    assert third.job.episodes_reused == 2  # only episode 1's task changed
    with read_hdf5(next(third.accepted_dir.rglob("episode_000001*")), load_images=False) as ep:
        assert ep.metadata["tasks"] == ["wave"]
