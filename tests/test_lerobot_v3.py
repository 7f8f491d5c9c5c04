"""LeRobot v3.0 export (eva.formats.lerobot_v3) on real synthetic v2.1 datasets.

Sources are written by the real capture writer (``write_synthetic_dataset``, H.264 MP4s), read by
the real ``DatasetReader``, exported by ``write_subset`` and read back with pyarrow and PyAV. The
LeRobot oracle itself runs in ``make compat`` (scripts/compat.sh), not here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eva.capture.synthetic import write_synthetic_dataset
from eva.dataset.errors import DatasetError
from eva.dataset.reader import DatasetReader
from eva.dataset.subset import SubsetMeta, build_subset_meta
from eva.dataset.video import VideoEncoder, VideoOptions
from eva.export.source import complete_episode_stats
from eva.formats import lerobot_v3
from eva.formats.base import ExportOptions
from eva.formats.lerobot_v3 import probe
from eva.formats.options import LeRobotV3Options
from eva.progress import Progress

CAMS = ["observation.images.cam0", "observation.images.cam1"]
FRAMES = [20, 31, 17, 40]


def subset_meta(reader: DatasetReader, indices: list[int], subset: str = "accepted") -> SubsetMeta:
    """The pipeline's subset description (eva.export.pipeline.prepare minus source validation)."""
    rows = {row["episode_index"]: row for row in reader.episodes}
    return build_subset_meta(
        subset,
        source_info=reader.info,
        source_episodes=rows,
        source_tasks=reader.tasks,
        source_episodes_stats={ep: complete_episode_stats(reader, ep) for ep in rows},
        source_indices=indices,
        task_index_values={
            ep: reader.read_table(ep, ["task_index"]).column("task_index").to_numpy() for ep in rows
        },
    )


def export(
    source: Path, dest: Path, indices: list[int] | None = None, **extra: Any
) -> tuple[DatasetReader, SubsetMeta]:
    reader = DatasetReader(source)
    if indices is None:
        indices = [r["episode_index"] for r in reader.episodes]
    meta = subset_meta(reader, indices)
    lerobot_v3.write_subset(
        reader, meta, dest, Progress(), ExportOptions(format=LeRobotV3Options(**extra))
    )
    return reader, meta


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("v3src") / "raw"
    write_synthetic_dataset(
        root, episodes=len(FRAMES), frames=FRAMES, cameras=CAMS, tasks=["pick", "place"], seed=3
    )
    return root


def locators(root: Path) -> list[dict[str, Any]]:
    return lerobot_v3.read_episode_locators(root).to_pylist()


def decode_with_times(path: Path) -> list[tuple[float, np.ndarray]]:
    with av.open(str(path)) as container:
        return [
            (float(f.pts * f.time_base), f.to_ndarray(format="rgb24"))
            for f in container.decode(video=0)
        ]


def info_of(root: Path) -> dict[str, Any]:
    return json.loads((root / "meta/info.json").read_text())


def test_locators_lead_to_every_source_frame_and_row(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "v3"
    # Small shards: several data and video files.
    reader, meta = export(
        source, dest, [3, 0, 2], data_files_size_in_mb=0.004, video_files_size_in_mb=0.03
    )
    info = info_of(dest)
    assert info["codebase_version"] == "v3.0" and "dataset_format" not in info
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["video_path"] == (
        "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    )
    assert info["total_episodes"] == 3 and info["total_frames"] == 40 + 20 + 17
    assert info["features"]["observation.state"]["fps"] == 30
    rows = locators(dest)
    assert [r["episode_index"] for r in rows] == [0, 1, 2]
    assert len({(r["data/chunk_index"], r["data/file_index"]) for r in rows}) > 1

    fps = info["fps"]
    shard_cache: dict[Path, list[tuple[float, np.ndarray]]] = {}
    for ep, row in enumerate(rows):
        src_ep = meta.source_index(ep)
        n = FRAMES[src_ep]
        assert row["length"] == n
        assert row["dataset_to_index"] - row["dataset_from_index"] == n
        # Table rows through the locator equal the source rows (index columns renumbered).
        data = pq.read_table(
            dest
            / info["data_path"].format(
                chunk_index=row["data/chunk_index"], file_index=row["data/file_index"]
            )
        )
        start = data.column("index").to_pylist().index(row["dataset_from_index"])
        part = data.slice(start, n)
        src = reader.read_table(src_ep)
        assert part.column("observation.state").equals(src.column("observation.state"))
        assert part.column("action").equals(src.column("action"))
        assert part.column("episode_index").to_pylist() == [ep] * n
        assert part.column("index").to_pylist() == list(
            range(row["dataset_from_index"], row["dataset_to_index"])
        )
        for key in CAMS:
            shard = dest / info["video_path"].format(
                video_key=key,
                chunk_index=row[f"videos/{key}/chunk_index"],
                file_index=row[f"videos/{key}/file_index"],
            )
            if shard not in shard_cache:
                shard_cache[shard] = decode_with_times(shard)
            by_time = {round(t, 4): img for t, img in shard_cache[shard]}
            t0 = row[f"videos/{key}/from_timestamp"]
            assert row[f"videos/{key}/to_timestamp"] == pytest.approx(t0 + n / fps, abs=1e-9)
            source_frames = decode_with_times(reader.video_path(src_ep, key))
            assert len(source_frames) == n
            for t, (_, img) in enumerate(source_frames):
                np.testing.assert_array_equal(by_time[round(t0 + t / fps, 4)], img)
    assert lerobot_v3.verify(dest) == []


def test_data_rolls_by_size_and_videos_roll_with_data(source: Path, tmp_path: Path) -> None:
    one_episode_bytes = DatasetReader(source).read_table(0).nbytes
    dest = tmp_path / "v3"
    # Room for about two 20-40 frame episodes per data file.
    export(source, dest, data_files_size_in_mb=2.2 * one_episode_bytes / 2**20)
    rows = locators(dest)
    files = [(r["data/chunk_index"], r["data/file_index"]) for r in rows]
    assert files[0] == (0, 0) and files[-1][1] >= 1
    assert files == sorted(files)
    for key in CAMS:
        # One video shard per data shard (videos are far below their own limit).
        assert [r[f"videos/{key}/file_index"] for r in rows] == [f for _, f in files]
    written = sorted((dest / "data").glob("*/*.parquet"))
    assert len(written) == len(set(files))
    for path in written:
        assert pq.read_table(path).nbytes <= 2.2 * one_episode_bytes * 1.05
    assert lerobot_v3.verify(dest) == []


def greedy_files(sizes: list[int], limit: float, starts: set[int]) -> list[int]:
    """Each episode's file number by the planning rule: consecutive episodes while their
    source files together stay within ``limit``; an episode in ``starts`` opens a new file."""
    numbers, number, total = [], 0, 0
    for ep, size in enumerate(sizes):
        if ep and (total + size > limit or ep in starts):
            number, total = number + 1, 0
        numbers.append(number)
        total += size
    return numbers


def test_files_are_planned_from_the_source_file_sizes(source: Path, tmp_path: Path) -> None:
    reader = DatasetReader(source)
    parquet = [reader.data_path(ep).stat().st_size for ep in range(len(FRAMES))]
    videos = {key: [reader.video_path(ep, key).stat().st_size for ep in range(4)] for key in CAMS}
    # Room for about two source parquet files per data file, and for the largest MP4 alone in a
    # video file: two episodes of one data file then never share a video file, whatever the
    # encoder made of them (MP4 sizes differ with x264's thread count, which the host sets)
    data_mb = 2.1 * max(parquet) / 2**20
    video_mb = max(max(v) for v in videos.values()) / 2**20
    dest = tmp_path / "v3"
    export(source, dest, data_files_size_in_mb=data_mb, video_files_size_in_mb=video_mb)
    rows = locators(dest)
    data = greedy_files(parquet, data_mb * 2**20, set())
    assert [r["data/file_index"] for r in rows] == data
    assert len(set(data)) > 1
    starts = {ep for ep in range(1, 4) if data[ep] != data[ep - 1]}
    for key in CAMS:
        expected = greedy_files(videos[key], video_mb * 2**20, starts)
        assert [r[f"videos/{key}/file_index"] for r in rows] == expected
        assert len(set(expected)) > len(set(data))  # some roll within a data file
    assert lerobot_v3.verify(dest) == []


def test_video_rolls_at_its_own_size_limit(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "v3"
    export(source, dest, video_files_size_in_mb=1e-6)  # every episode its own MP4
    rows = locators(dest)
    assert [r["data/file_index"] for r in rows] == [0, 0, 0, 0]
    for key in CAMS:
        assert [r[f"videos/{key}/file_index"] for r in rows] == [0, 1, 2, 3]
        assert all(r[f"videos/{key}/from_timestamp"] == 0.0 for r in rows)
    assert lerobot_v3.verify(dest) == []


def test_schema_change_starts_a_new_data_file(tmp_path: Path) -> None:
    src = write_synthetic_dataset(tmp_path / "raw", episodes=3, frames=[12, 14, 10], cameras=1)
    reader = DatasetReader(src)
    # Episode 1 carries an extra column (as if a sensor had been added for that episode).
    path = reader.data_path(1)
    table = pq.read_table(path)
    pq.write_table(
        table.append_column(
            "observation.extra", pa.array(np.arange(table.num_rows, dtype=np.int64))
        ),
        path,
    )
    dest = tmp_path / "v3"
    export(src, dest)
    rows = locators(dest)
    assert [r["data/file_index"] for r in rows] == [0, 1, 2]
    assert [r["videos/observation.images.cam0/file_index"] for r in rows] == [0, 1, 2]
    schemas = [pq.read_schema(p) for p in sorted((dest / "data/chunk-000").glob("*.parquet"))]
    assert ["observation.extra" in s.names for s in schemas] == [False, True, False]


def test_file_index_wraps_into_the_next_chunk(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "v3"
    export(source, dest, chunks_size=3, data_files_size_in_mb=1e-6, video_files_size_in_mb=1e-6)
    rows = locators(dest)
    expected = [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert [(r["data/chunk_index"], r["data/file_index"]) for r in rows] == expected
    for key in CAMS:
        got = [(r[f"videos/{key}/chunk_index"], r[f"videos/{key}/file_index"]) for r in rows]
        assert got == expected
    assert (dest / "data/chunk-001/file-000.parquet").is_file()
    assert (dest / f"videos/{CAMS[1]}/chunk-001/file-000.mp4").is_file()
    assert info_of(dest)["chunks_size"] == 3
    assert lerobot_v3.verify(dest) == []


def test_differing_stream_parameters_start_a_new_video_file(tmp_path: Path) -> None:
    src = write_synthetic_dataset(
        tmp_path / "raw", episodes=3, frames=[12, 14, 10], cameras=CAMS, seed=5
    )
    reader = DatasetReader(src)
    # Re-encode episode 1 of cam0 with other x264 settings: same size, other codec headers.
    path = reader.video_path(1, CAMS[0])
    frames = np.concatenate(list(b.copy() for b in reader.iter_frames(1, CAMS[0])))
    other = tmp_path / "other.mp4"
    encoder = VideoEncoder(other, 64, 48, 30, VideoOptions(preset="ultrafast", crf=35))
    encoder.write(frames)
    encoder.close()
    assert not probe(other).params.compatible_with(probe(reader.video_path(0, CAMS[0])).params)
    other.replace(path)

    dest = tmp_path / "v3"
    export(src, dest)
    rows = locators(dest)
    # cam0: the odd episode opens a new file, and the next episode differs from it again.
    assert [r[f"videos/{CAMS[0]}/file_index"] for r in rows] == [0, 1, 2]
    assert [r[f"videos/{CAMS[1]}/file_index"] for r in rows] == [0, 0, 0]
    assert [r["data/file_index"] for r in rows] == [0, 0, 0]
    assert lerobot_v3.verify(dest) == []
    shard = dest / f"videos/{CAMS[0]}/chunk-000/file-001.mp4"
    decoded = decode_with_times(shard)
    assert len(decoded) == 14


def test_frame_count_mismatch_aborts_naming_episode_and_camera(tmp_path: Path) -> None:
    src = write_synthetic_dataset(tmp_path / "raw", episodes=2, frames=[12, 14], cameras=CAMS)
    reader = DatasetReader(src)
    path = reader.video_path(1, CAMS[1])
    frames = np.concatenate(list(b.copy() for b in reader.iter_frames(1, CAMS[1])))
    short = tmp_path / "short.mp4"
    encoder = VideoEncoder(short, 64, 48, 30, VideoOptions())
    encoder.write(frames[:-1])
    encoder.close()
    short.replace(path)
    dest = tmp_path / "v3"
    with pytest.raises(DatasetError, match=rf"episode 1, camera {CAMS[1]}: .*13 frames.*14 rows"):
        export(src, dest)
    # The writer closed nothing half-way into a looking-complete dataset: no metadata written.
    assert not (dest / "meta/info.json").exists()


def test_verify_decode_counts_decoded_frames(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "v3"
    export(source, dest, verify_decode=True, video_files_size_in_mb=0.02)
    assert lerobot_v3.verify(dest) == []


def _quantiles(values: np.ndarray, axis: int = 0) -> dict[str, np.ndarray]:
    qs = (0.01, 0.10, 0.50, 0.90, 0.99)
    table = np.quantile(values, qs, axis=axis)
    return {f"q{round(q * 100):02d}": table[i] for i, q in enumerate(qs)}


def test_quantiles_match_numpy(tmp_path: Path) -> None:
    """Vectors: exact. Images with verify_decode: exact over every pixel; by default: exact over
    the documented keyframe sample (the middle keyframe of each episode; every keyframe with
    image_quantile_keyframes=0)."""
    # A short GOP, so that every episode has several keyframes to choose from.
    source = write_synthetic_dataset(
        tmp_path / "raw",
        episodes=4,
        frames=[12, 14, 10, 9],
        cameras=CAMS,
        seed=3,
        video=VideoOptions(gop=4),
    )
    reader = DatasetReader(source)
    episodes = [0, 1, 2, 3]
    exact_dir, sampled_dir = tmp_path / "exact", tmp_path / "sampled"
    every_dir = tmp_path / "every"
    export(source, exact_dir, verify_decode=True)
    export(source, sampled_dir)
    export(source, every_dir, image_quantile_keyframes=0)
    exact = json.loads((exact_dir / "meta/stats.json").read_text())
    sampled = json.loads((sampled_dir / "meta/stats.json").read_text())
    every = json.loads((every_dir / "meta/stats.json").read_text())

    state = np.concatenate([reader.read_vector(ep, "observation.state") for ep in episodes])
    for name, want in _quantiles(state.astype(np.float64)).items():
        np.testing.assert_allclose(exact["observation.state"][name], want, rtol=0, atol=1e-12)
        np.testing.assert_allclose(sampled["observation.state"][name], want, rtol=0, atol=1e-12)

    key = CAMS[0]
    all_frames, keyframes, middle_keyframes = [], [], []
    for ep in episodes:
        episode_keyframes = []
        with av.open(str(reader.video_path(ep, key))) as container:
            for frame in container.decode(video=0):
                img = frame.to_ndarray(format="rgb24")
                all_frames.append(img)
                if frame.key_frame:
                    episode_keyframes.append(img)
        assert len(episode_keyframes) >= 2  # the sample is a real choice here
        keyframes += episode_keyframes
        middle_keyframes.append(episode_keyframes[len(episode_keyframes) // 2])
    for frames, stats in (
        (all_frames, exact),
        (middle_keyframes, sampled),
        (keyframes, every),
    ):
        pixels = np.stack(frames).reshape(-1, 3).astype(np.float64) / 255.0
        for name, want in _quantiles(pixels).items():
            got = np.asarray(stats[key][name]).reshape(3)
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    # Per-episode quantile columns exist beside min/max/mean/std/count.
    rows = locators(exact_dir)
    row = rows[0]
    assert {f"stats/{key}/q50", "stats/observation.state/q99"} <= set(row)
    assert np.asarray(row[f"stats/{key}/q50"]).shape == (3, 1, 1)
    # ... and the vector ones are numpy's over that episode's rows, column by column.
    for ep, episode_row in enumerate(rows):
        for column in ("observation.state", "action", "timestamp", "frame_index"):
            values = reader.read_table(ep, [column]).column(column).combine_chunks()
            if pa.types.is_fixed_size_list(values.type):
                values = values.flatten().to_numpy().reshape(len(values), -1)
            else:
                values = values.to_numpy().reshape(-1, 1)
            for name, want in _quantiles(values.astype(np.float64)).items():
                got = episode_row[f"stats/{column}/{name}"]
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_tasks_parquet_carries_the_pandas_index(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "v3"
    export(source, dest)
    table = pq.read_table(dest / "meta/tasks.parquet")
    pandas_meta = json.loads(table.schema.metadata[b"pandas"])
    assert pandas_meta["index_columns"] == ["__index_level_0__"]
    assert table.column("task_index").to_pylist() == [0, 1]
    assert table.column("__index_level_0__").to_pylist() == ["pick", "place"]
    for name in ("episodes.jsonl", "tasks.jsonl", "stats.json", "info.json"):
        assert (dest / "meta" / name).is_file()


def test_empty_subset_is_a_complete_empty_dataset(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "v3"
    export(source, dest, [])
    info = info_of(dest)
    assert info["total_episodes"] == 0 and info["total_frames"] == 0
    assert pq.read_table(dest / "data/chunk-000/file-000.parquet").num_rows == 0
    assert lerobot_v3.read_episode_locators(dest).num_rows == 0
    assert not (dest / "videos").exists()
    assert lerobot_v3.verify(dest) == []


def test_verify_reports_a_broken_shard(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "v3"
    export(source, dest, video_files_size_in_mb=1e-6)
    (dest / f"videos/{CAMS[0]}/chunk-000/file-002.mp4").write_bytes(b"broken")
    data = dest / "data/chunk-000/file-000.parquet"
    table = pq.read_table(data)
    pq.write_table(table.slice(0, table.num_rows - 1), data)
    problems = lerobot_v3.verify(dest)
    codes = {p.code for p in problems}
    assert "unreadable_video" in codes
    assert "row_range" in codes or "row_count" in codes
    # Each message (what ``eva verify`` prints) starts with the file it is about.
    assert all(p.message.startswith(f"{p.path}: ") for p in problems)


def test_verify_refuses_a_video_key_that_leaves_the_export(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "v3"
    export(source, dest)
    info = json.loads((dest / "meta/info.json").read_text())
    info["features"]["../../escape"] = info["features"].pop(CAMS[0])
    (dest / "meta/info.json").write_text(json.dumps(info))
    problems = lerobot_v3.verify(dest)
    assert [p.code for p in problems] == ["video_key"]


def test_pipeline_publishes_both_subsets_or_nothing(tmp_path: Path) -> None:
    from eva.export.pipeline import export_dataset
    from eva.export.verify import verify_export

    src = write_synthetic_dataset(
        tmp_path / "raw",
        episodes=3,
        frames=[12, 14, 10],
        cameras=CAMS,
        quality=["green", "red", "green"],
    )
    result = export_dataset(src, "v3")
    assert result.accepted_dir == tmp_path / "export/lerobot_v3/accepted"
    for subset, eps in (("accepted", [0, 2]), ("rejected", [1])):
        out = tmp_path / "export/lerobot_v3" / subset
        marker = json.loads((out / "meta/quality_split.json").read_text())
        assert marker["dataset_format"] == "lerobot_v3"
        assert marker["source_episode_indices"] == eps
        assert info_of(out)["total_episodes"] == len(eps)
        assert verify_export(out) == []

    # A frame-count mismatch in the source aborts the export: the published pair stays the old one.
    reader = DatasetReader(src)
    frames = np.concatenate(list(b.copy() for b in reader.iter_frames(2, CAMS[0])))
    short = tmp_path / "short.mp4"
    encoder = VideoEncoder(short, 64, 48, 30, VideoOptions())
    encoder.write(frames[:-2])
    encoder.close()
    short.replace(reader.video_path(2, CAMS[0]))
    old_marker = (tmp_path / "export/lerobot_v3/accepted/meta/quality_split.json").read_bytes()
    with pytest.raises(DatasetError, match="episode 2"):
        export_dataset(src, "v3")
    assert (
        tmp_path / "export/lerobot_v3/accepted/meta/quality_split.json"
    ).read_bytes() == old_marker
    leftovers = [
        p.name for p in (tmp_path / "export").iterdir() if p.name.startswith(".eva-staging")
    ]
    assert leftovers == []


def test_info_json_holds_only_lerobot_keys_and_old_exports_still_verify(tmp_path: Path) -> None:
    """LeRobot 0.6 warns of every info.json key its schema lacks: the format's name is in the
    marker only. An older export (``dataset_format`` in info.json too) still verifies and is
    described as v3; a wrong name there is still refused."""
    from eva.export.describe import describe_directory
    from eva.export.pipeline import export_dataset
    from eva.export.verify import verify_export

    src = write_synthetic_dataset(tmp_path / "raw", episodes=2, frames=[8, 9], cameras=CAMS[:1])
    out = export_dataset(src, "v3").accepted_dir
    lerobot_keys = {
        *("codebase_version", "fps", "features", "total_episodes", "total_frames", "total_tasks"),
        *("chunks_size", "data_files_size_in_mb", "video_files_size_in_mb", "data_path"),
        *("video_path", "robot_type", "splits"),
    }
    assert set(info_of(out)) <= lerobot_keys
    assert describe_directory(out)["format"] == "lerobot_v3"
    for tagged, codes in (("lerobot_v3", []), ("hdf5", ["wrong_format"])):
        info = {**info_of(out), "dataset_format": tagged}
        (out / "meta/info.json").write_text(json.dumps(info))
        assert [p.code for p in verify_export(out)] == codes
        assert describe_directory(out)["format"] == "lerobot_v3"


def test_lerobot_written_av1_fixture_exports(tmp_path: Path) -> None:
    """A v2.1 dataset written by LeRobot 0.3.3 itself (AV1 video) goes through the packet copy."""
    fixture = Path(__file__).parent / "fixtures" / "lerobot_v21_fixture"
    dest = tmp_path / "v3"
    reader, meta = export(fixture, dest)
    assert lerobot_v3.verify(dest) == []
    stats = json.loads((dest / "meta/stats.json").read_text())
    key = "observation.images.front"
    assert np.asarray(stats[key]["q50"]).shape == (3, 1, 1)
    rows = locators(dest)
    shard = dest / f"videos/{key}/chunk-000/file-000.mp4"
    decoded = decode_with_times(shard)
    assert len(decoded) == sum(r["length"] for r in rows) == meta.total_frames
    for row in rows:
        src = decode_with_times(reader.video_path(meta.source_index(row["episode_index"]), key))
        by_time = {round(t, 4): img for t, img in decoded}
        for t, (_, img) in enumerate(src):
            ts = round(row[f"videos/{key}/from_timestamp"] + t / reader.fps, 4)
            np.testing.assert_array_equal(by_time[ts], img)


def test_image_quantiles_can_be_skipped(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "v3"
    export(source, dest, image_quantiles="none")
    stats = json.loads((dest / "meta/stats.json").read_text())
    assert "q50" not in stats[CAMS[0]] and "mean" in stats[CAMS[0]]
    assert "q50" in stats["observation.state"]
    with pytest.raises(DatasetError, match="image_quantiles"):
        export(source, tmp_path / "bad", image_quantiles="some")
    with pytest.raises(DatasetError, match="image_quantile_keyframes"):
        export(source, tmp_path / "bad2", image_quantile_keyframes=-1)


def test_spread_sample_bound() -> None:
    from eva.formats.lerobot_v3 import spread_sample

    items = [bytes([i]) for i in range(7)]
    assert spread_sample(items, 0) == items
    assert spread_sample(items, 9) == items
    assert spread_sample(items, 1) == [items[3]]
    assert spread_sample(items, 2) == [items[1], items[5]]
    assert spread_sample(items[:3], 2) == [items[0], items[2]]


def test_verify_reports_wrong_locators(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "v3"
    export(source, dest)
    path = dest / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    column = f"videos/{CAMS[1]}/from_timestamp"
    shifted = [t + (0.5 if i == 2 else 0.0) for i, t in enumerate(table.column(column).to_pylist())]
    table = table.set_column(
        table.schema.get_field_index(column), column, pa.array(shifted, pa.float64())
    )
    to_index = table.column("dataset_to_index").to_pylist()
    to_index[1] += 1
    table = table.set_column(
        table.schema.get_field_index("dataset_to_index"),
        "dataset_to_index",
        pa.array(to_index, pa.int64()),
    )
    pq.write_table(table, path)
    problems = lerobot_v3.verify(dest)
    assert {(p.code, p.episode) for p in problems} >= {("timestamp_range", 2), ("row_range", 1)}


def test_column_matrix_reads_vector_columns_from_arrow_buffers() -> None:
    rows = [[1.0, 2.0], [3.0, 4.5], [5.0, 6.0]]
    table = pa.table(
        {
            "fixed": pa.array(rows, pa.list_(pa.float32(), 2)),
            "variable": pa.array(rows, pa.list_(pa.float32())),
            "scalar": pa.array([1, 2, 3], pa.int64()),
            "ragged": pa.array([[1.0], [2.0, 3.0], [4.0]], pa.list_(pa.float64())),
        }
    )
    fixed = lerobot_v3.column_matrix(table, "fixed", "f.parquet: episode 0")
    assert fixed.dtype == np.float32 and fixed.tolist() == rows
    variable = lerobot_v3.column_matrix(table, "variable", "f.parquet: episode 0")
    assert variable.dtype == np.float64 and variable.tolist() == rows
    scalar = lerobot_v3.column_matrix(table, "scalar", "f.parquet: episode 0")
    assert scalar.shape == (3, 1) and scalar.dtype == np.int64
    with pytest.raises(DatasetError, match=r"f\.parquet: episode 0: field 'ragged'"):
        lerobot_v3.column_matrix(table, "ragged", "f.parquet: episode 0")


def test_episode_tasks_come_from_the_table_when_the_row_has_none(
    source: Path, tmp_path: Path
) -> None:
    reader = DatasetReader(source)
    meta = subset_meta(reader, [1, 0])
    for row in meta.episodes:
        row.pop("tasks", None)
    lerobot_v3.write_subset(reader, meta, tmp_path / "v3", Progress(), ExportOptions())
    tasks_of = {r["episode_index"]: r["tasks"] for r in locators(tmp_path / "v3")}
    expected = {
        new: [
            meta.tasks[i]
            for i in sorted(
                {meta.task_remap[int(t)] for t in reader.read_vector(src, "task_index")}
            )
        ]
        for new, src in enumerate(meta.source_episode_indices)
    }
    assert tasks_of == expected


def test_verify_keeps_info_paths_inside_the_export(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "v3"
    export(source, dest)
    info_path = dest / "meta/info.json"
    info = json.loads(info_path.read_text())
    for field, template in (
        ("video_path", "videos/{video_key:03d}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"),
        ("data_path", "../data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"),
    ):
        info_path.write_text(json.dumps({**info, field: template}))
        problems = lerobot_v3.verify(dest)
        assert [p.code for p in problems] == ["unsafe_path_template"], field
    info_path.write_text(json.dumps(info))
    # A shard replaced by a symlink to a file outside the export is reported, not read.
    outside = tmp_path / "outside.parquet"
    data = dest / "data/chunk-000/file-000.parquet"
    data.rename(outside)
    data.symlink_to(outside)
    assert "unsafe_path" in {p.code for p in lerobot_v3.verify(dest)}


@pytest.mark.parametrize(
    "planted",
    [
        "data/chunk-000/file-000.parquet",
        "meta/tasks.parquet",
        "meta/episodes/chunk-000/file-000.parquet",
    ],
)
def test_a_full_disk_names_the_parquet_file_being_written(
    source: Path, tmp_path: Path, planted: str
) -> None:
    # pyarrow's ENOSPC names no file: the writer must (a full disk otherwise names the subset).
    # /dev/full behind the file's path fails every write with ENOSPC, deterministically.
    dest = tmp_path / "v3"
    (dest / planted).parent.mkdir(parents=True)
    (dest / planted).symlink_to("/dev/full")
    with pytest.raises(DatasetError) as failed:
        export(source, dest)
    assert str(failed.value) == f"{dest / planted}: No space left on device"
