"""Quality export to native v2.1, end to end on real synthetic datasets (PyAV MP4s, pyarrow)."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from eva.capture.synthetic import write_synthetic_dataset
from eva.cli import main
from eva.dataset import layout
from eva.dataset.atomic import atomic_write_json, atomic_write_jsonl, read_jsonl
from eva.dataset.errors import DatasetError
from eva.dataset.subset import rewrite_index_columns
from eva.export.pipeline import export_dataset
from eva.export.verify import verify_export
from eva.formats import catalog, lerobot_v21
from eva.formats.catalog import FormatEntry, FormatUnavailable
from eva.formats.options import LeRobotV21Options
from eva.jobs import read_job
from eva.publish import ExportBusy, staging_dir

# Episode plan: 0 green, 1 red+pass, 2 red, 3 green+fail, 4 green with a note only, 5 RED (case).
QUALITY = ["green", "red", "red", "green", "green", "red"]
VERDICTS = [None, "pass", None, "fail", None, None]
NOTES = [None, "override: glitch", None, "bad grasp", "note only", None]
FRAMES = [12, 15, 10, 14, 11, 9]
TASKS = [
    "pick",
    "place",
    "push",
]  # cycled: tasks of episodes 0..5 = pick place push pick place push
ACCEPTED = [0, 1, 4]
REJECTED = [2, 3, 5]


@pytest.fixture(scope="module")
def source_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("template") / "raw"
    write_synthetic_dataset(
        root,
        episodes=6,
        frames=FRAMES,
        cameras=2,
        state_dim=4,
        quality=QUALITY,
        qc_verdicts=VERDICTS,
        qc_notes=NOTES,
        tasks=TASKS,
        extra_rows=[{"operator": f"op{i}"} for i in range(6)],
    )
    # Upper-case values must be compared case-insensitively (the split rule).
    rows = read_jsonl(root / layout.EPISODES)
    rows[5]["quality"] = "RED"
    rows[1]["qc_verdict"] = "Pass"
    atomic_write_jsonl(root / layout.EPISODES, rows)
    shutil.rmtree(root / layout.WORK_DIR, ignore_errors=True)
    return root


@pytest.fixture
def source(tmp_path: Path, source_template: Path) -> Path:
    dest = tmp_path / "site" / "raw"
    shutil.copytree(source_template, dest)
    return dest


def tree_hash(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_the_catalogue_parses_names_and_loads_the_module() -> None:
    # The alias loads the module itself (getmodule: a Format is typed without __name__).
    assert inspect.getmodule(catalog.parse("V21").load()) is lerobot_v21
    assert catalog.parse(" v2.1 ") is catalog.parse("lerobot_v21")
    with pytest.raises(ValueError, match="unknown format"):
        catalog.parse("parquet-please")


def test_split_renumbering_and_metadata(source: Path) -> None:
    before = tree_hash(source)
    result = export_dataset(source, "v2.1")
    assert tree_hash(source) == before  # the source is untouched
    root = source.parent / "export" / "lerobot_v21"
    assert result.accepted_dir == root / "accepted" and result.rejected_dir == root / "rejected"
    src_rows = {r["episode_index"]: r for r in read_jsonl(source / layout.EPISODES)}
    src_tasks = {r["task_index"]: r["task"] for r in read_jsonl(source / layout.TASKS)}

    for subset, indices in (("accepted", ACCEPTED), ("rejected", REJECTED)):
        out = root / subset
        marker = json.loads((out / layout.QUALITY_SPLIT).read_text())
        assert marker["source_dir"] == str(source.resolve())
        assert marker["subset"] == subset and marker["dataset_format"] == "lerobot_v21"
        assert marker["source_episode_indices"] == indices
        assert "pass" in marker["rule"]
        rows = read_jsonl(out / layout.EPISODES)
        tasks = {r["task_index"]: r["task"] for r in read_jsonl(out / layout.TASKS)}
        assert sorted(tasks) == list(range(len(tasks)))
        info = json.loads((out / layout.INFO).read_text())
        assert info["total_episodes"] == len(indices)
        assert info["total_frames"] == sum(FRAMES[i] for i in indices)
        assert info["total_tasks"] == len(tasks)
        assert info["total_videos"] == 2 * len(indices)
        assert info["splits"] == {"train": f"0:{len(indices)}"}
        offset = 0
        for new, src in enumerate(indices):
            # Every row field is kept; only episode_index changes.
            assert rows[new] == {**src_rows[src], "episode_index": new}
            table = pq.read_table(out / f"data/chunk-000/episode_{new:06d}.parquet")
            src_table = pq.read_table(source / f"data/chunk-000/episode_{src:06d}.parquet")
            assert table.schema == src_table.schema  # types and huggingface metadata kept
            n = table.num_rows
            assert n == FRAMES[src]
            assert table.column("episode_index").to_pylist() == [new] * n
            assert table.column("index").to_pylist() == list(range(offset, offset + n))
            new_task = table.column("task_index").to_pylist()
            old_task = src_table.column("task_index").to_pylist()
            assert [tasks[t] for t in new_task] == [src_tasks[t] for t in old_task]
            for column in (
                "observation.state",
                "action",
                "timestamp",
                "frame_index",
                "capture_time",
            ):
                assert table.column(column).equals(src_table.column(column))
            out_parquet = out / f"data/chunk-000/episode_{new:06d}.parquet"
            src_parquet = source / f"data/chunk-000/episode_{src:06d}.parquet"
            if new == src and offset == sum(FRAMES[i] for i in range(src)):
                # Its numbering stays: the file is shared, not rewritten.
                assert out_parquet.read_bytes() == src_parquet.read_bytes()
            else:
                assert os.stat(out_parquet).st_ino != os.stat(src_parquet).st_ino
            for cam in ("observation.images.cam0", "observation.images.cam1"):
                out_mp4 = out / f"videos/chunk-000/{cam}/episode_{new:06d}.mp4"
                src_mp4 = source / f"videos/chunk-000/{cam}/episode_{src:06d}.mp4"
                assert out_mp4.read_bytes() == src_mp4.read_bytes()
                assert os.stat(out_mp4).st_ino == os.stat(src_mp4).st_ino  # hard link, same fs
            offset += n
        assert verify_export(out) == []
    rejected_rows = read_jsonl(root / "rejected" / layout.EPISODES)
    assert rejected_rows[0]["quality_issues"][0]["code"] == "frozen_camera"
    assert rejected_rows[1]["qc_note"] == "bad grasp"
    job = read_job(root / "job.json")
    assert job is not None and job.state == "completed" and job.progress["episodes"] == 6
    assert [p.name for p in root.parent.iterdir() if p.name.startswith(".eva-staging")] == []


def _direct_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    values = values.astype(np.float64)
    return {
        "min": values.min(axis=0),
        "max": values.max(axis=0),
        "mean": values.mean(axis=0),
        "std": values.std(axis=0),
    }


def test_subset_stats_match_direct_computation(source: Path) -> None:
    export_dataset(source, "lerobot_v21")
    src_ep_stats = {
        r["episode_index"]: r["stats"] for r in read_jsonl(source / layout.EPISODES_STATS)
    }
    for subset, indices in (("accepted", ACCEPTED), ("rejected", REJECTED)):
        out = source.parent / "export" / "lerobot_v21" / subset
        stats = json.loads((out / layout.STATS).read_text())
        tables = [pq.read_table(p) for p in sorted((out / "data").rglob("*.parquet"))]
        table = pa.concat_tables(tables)
        for column in ("observation.state", "action"):
            values = np.array(table.column(column).to_pylist())
            for key, expected in _direct_stats(values).items():
                np.testing.assert_allclose(stats[column][key], expected, rtol=1e-6, atol=1e-7)
        for column in ("episode_index", "index", "task_index", "frame_index", "timestamp"):
            values = table.column(column).to_numpy().reshape(-1, 1)
            for key, expected in _direct_stats(values).items():
                np.testing.assert_allclose(stats[column][key], expected, rtol=1e-6, atol=1e-6)
            assert stats[column]["count"] == [table.num_rows]
        # Image stats: pooled over exactly this subset's episodes (count-weighted, population std).
        cam = "observation.images.cam0"
        counts = np.array([src_ep_stats[i][cam]["count"][0] for i in indices], dtype=np.float64)
        means = np.array([np.ravel(src_ep_stats[i][cam]["mean"]) for i in indices])
        stds = np.array([np.ravel(src_ep_stats[i][cam]["std"]) for i in indices])
        mean = (counts[:, None] * means).sum(0) / counts.sum()
        var = (counts[:, None] * (stds**2 + (means - mean) ** 2)).sum(0) / counts.sum()
        np.testing.assert_allclose(np.ravel(stats[cam]["mean"]), mean, rtol=1e-9)
        np.testing.assert_allclose(np.ravel(stats[cam]["std"]), np.sqrt(var), rtol=1e-9)
        # Per-episode stats of the renumbered index columns describe the rewritten values.
        ep_stats = read_jsonl(out / layout.EPISODES_STATS)
        assert [r["episode_index"] for r in ep_stats] == list(range(len(indices)))
        assert ep_stats[1]["stats"]["episode_index"]["min"] == [1]
        assert ep_stats[1]["stats"]["index"]["min"] == [FRAMES[indices[0]]]


@pytest.mark.parametrize(
    ("quality", "verdicts", "empty"),
    [(["red"] * 3, [None] * 3, "accepted"), (["green"] * 3, [None] * 3, "rejected")],
)
def test_empty_subsets_are_complete_datasets(
    tmp_path: Path, quality: list[str], verdicts: list, empty: str
) -> None:
    source = write_synthetic_dataset(
        tmp_path / "raw",
        episodes=3,
        frames=10,
        cameras=1,
        state_dim=3,
        quality=quality,
        qc_verdicts=verdicts,
    )
    export_dataset(source, "lerobot_v21")
    out = tmp_path / "export" / "lerobot_v21" / empty
    info = json.loads((out / layout.INFO).read_text())
    assert info["total_episodes"] == 0 and info["total_frames"] == 0 and info["total_videos"] == 0
    assert info["features"] == json.loads((source / layout.INFO).read_text())["features"]
    for rel in (layout.EPISODES, layout.TASKS, layout.EPISODES_STATS):
        assert (out / rel).read_text() == ""
    assert json.loads((out / layout.STATS).read_text()) == {}
    assert json.loads((out / layout.QUALITY_SPLIT).read_text())["source_episode_indices"] == []
    for subset in ("accepted", "rejected"):
        assert verify_export(tmp_path / "export" / "lerobot_v21" / subset) == []


def test_source_not_named_raw_and_rerun_replaces_pair(
    tmp_path: Path, source_template: Path
) -> None:
    source = tmp_path / "session-7"
    shutil.copytree(source_template, source)
    first = export_dataset(source, "lerobot_v21")
    assert first.accepted_dir == tmp_path / "session-7_export" / "lerobot_v21" / "accepted"
    # Review change, then re-export: the pair is replaced as a whole.
    runner = CliRunner()
    assert runner.invoke(main, ["qc", str(source), "2", "--pass"]).exit_code == 0
    problems = verify_export(first.accepted_dir)
    assert [p.code for p in problems] == ["source_episode_indices"]
    second = export_dataset(source, "lerobot_v21")
    for subset in ("accepted", "rejected"):
        marker = json.loads(
            (tmp_path / "session-7_export/lerobot_v21" / subset / layout.QUALITY_SPLIT).read_text()
        )
        assert marker["export_id"] == second.job.job_id
    assert second.plan.accepted == [0, 1, 2, 4]
    assert verify_export(second.accepted_dir) == []
    hidden = [
        p.name
        for p in (tmp_path / "session-7_export").iterdir()
        if p.name.startswith(".eva-") and p.is_dir()
    ]
    assert hidden == []


def test_verify_finds_tampering(source: Path) -> None:
    result = export_dataset(source, "lerobot_v21")
    out = result.accepted_dir
    marker = json.loads((out / layout.QUALITY_SPLIT).read_text())
    atomic_write_json(
        out / layout.QUALITY_SPLIT, {**marker, "source_dir": "/elsewhere/raw", "subset": "rejected"}
    )
    (out / "videos/chunk-000/observation.images.cam1/episode_000001.mp4").unlink()
    codes = {p.code for p in verify_export(out)}
    assert {"source_dir", "subset", "missing_video"} <= codes
    info = json.loads((result.rejected_dir / layout.INFO).read_text())
    atomic_write_json(result.rejected_dir / layout.INFO, {**info, "total_frames": 1})
    r = CliRunner().invoke(main, ["verify", str(result.rejected_dir)])
    assert r.exit_code == 1 and "total_frames" in r.output


def test_verify_refuses_a_video_key_that_leaves_the_export(source: Path) -> None:
    out = export_dataset(source, "lerobot_v21").accepted_dir
    info = json.loads((out / layout.INFO).read_text())
    features = dict(info["features"])
    features["../../../escape"] = features.pop("observation.images.cam1")
    atomic_write_json(out / layout.INFO, {**info, "features": features})
    problems = lerobot_v21.verify(out)
    assert [p.code for p in problems if p.code in ("video_key", "missing_video")] == ["video_key"]
    assert "total_videos" not in {p.code for p in problems}


def test_verify_does_not_follow_links_out_of_the_export(source: Path, tmp_path: Path) -> None:
    out = export_dataset(source, "lerobot_v21").accepted_dir
    video = out / "videos/chunk-000/observation.images.cam1/episode_000001.mp4"
    outside = tmp_path / "outside.mp4"
    video.rename(outside)
    video.symlink_to(outside)
    problems = lerobot_v21.verify(out)
    assert [(p.code, p.episode) for p in problems] == [("unsafe_path", 1)]


def test_missing_vector_stats_are_computed_from_the_table(source: Path) -> None:
    from eva.dataset.reader import DatasetReader
    from eva.export.source import complete_episode_stats

    rows = read_jsonl(source / layout.EPISODES_STATS)
    written = rows[1]["stats"].pop("observation.state")
    rows[1]["stats"].pop("timestamp")
    atomic_write_jsonl(source / layout.EPISODES_STATS, rows)
    stats = complete_episode_stats(DatasetReader(source), 1)
    for key in ("min", "max", "mean", "std"):
        np.testing.assert_allclose(stats["observation.state"][key], written[key], rtol=1e-5)
    assert stats["observation.state"]["count"] == written["count"]
    assert stats["timestamp"]["count"] == [FRAMES[1]]


def test_rewrite_index_columns_is_columnwise_and_checks_tasks() -> None:
    table = pa.table(
        {
            "x": pa.array([1.0, 2.0, 3.0], pa.float32()),
            "episode_index": pa.array([7, 7, 7], pa.int64()),
            "index": pa.array([40, 41, 42], pa.int64()),
            "task_index": pa.array([5, 2, 5], pa.int64()),
        }
    ).replace_schema_metadata({"huggingface": "{}"})
    out = rewrite_index_columns(table, 1, 10, {5: 0, 2: 1})
    assert out.column("episode_index").to_pylist() == [1, 1, 1]
    assert out.column("index").to_pylist() == [10, 11, 12]
    assert out.column("task_index").to_pylist() == [0, 1, 0]
    assert out.schema == table.schema and out.column("x").equals(table.column("x"))
    with pytest.raises(DatasetError, match="task_index 2"):
        rewrite_index_columns(table, 1, 10, {5: 0})
    with pytest.raises(DatasetError, match=r"^src\.parquet: episode 7: task_index 2"):
        rewrite_index_columns(table, 1, 10, {5: 0}, where="src.parquet: episode 7")


def _drop_file(rel: str):
    return lambda root: (root / rel).unlink()


def _edit_info(**changes):
    def edit(root: Path) -> None:
        info = json.loads((root / layout.INFO).read_text())
        atomic_write_json(root / layout.INFO, {**info, **changes})

    return edit


def _edit_rows(edit_rows):
    def edit(root: Path) -> None:
        rows = read_jsonl(root / layout.EPISODES)
        atomic_write_jsonl(root / layout.EPISODES, edit_rows(rows))

    return edit


def _drop_column(column: str):
    def edit(root: Path) -> None:
        path = root / "data/chunk-000/episode_000002.parquet"
        table = pq.read_table(path)
        pq.write_table(table.drop_columns([column]), path)

    return edit


def _drop_task(root: Path) -> None:
    rows = read_jsonl(root / layout.TASKS)
    atomic_write_jsonl(root / layout.TASKS, [r for r in rows if r["task"] != "push"])


def _drop_video_stats(root: Path) -> None:
    rows = read_jsonl(root / layout.EPISODES_STATS)
    del rows[4]["stats"]["observation.images.cam1"]
    atomic_write_jsonl(root / layout.EPISODES_STATS, rows)


def _zero_length(rows: list[dict]) -> list[dict]:
    rows[3]["length"] = 0
    return rows


VALIDATION_CASES = {
    "missing_info": (_drop_file(layout.INFO), "info.json"),
    "missing_episodes": (_drop_file(layout.EPISODES), "episodes.jsonl"),
    "wrong_version": (_edit_info(codebase_version="v3.0"), "codebase_version"),
    "wrong_format": (_edit_info(dataset_format="hdf5"), "dataset_format"),
    "duplicate_index": (_edit_rows(lambda rows: [*rows, rows[2]]), "episode_index 2"),
    "missing_parquet": (
        _drop_file("data/chunk-000/episode_000003.parquet"),
        "episode_000003.parquet",
    ),
    "missing_video": (
        _drop_file("videos/chunk-000/observation.images.cam0/episode_000001.mp4"),
        "episode_000001.mp4",
    ),
    "missing_index_column": (_drop_column("index"), "index"),
    "missing_episode_index_column": (_drop_column("episode_index"), "episode_index"),
    "missing_task_index_column": (_drop_column("task_index"), "column task_index missing"),
    "unknown_task": (_drop_task, "task_index"),
    "missing_video_stats": (_drop_video_stats, "observation.images.cam1"),
    "empty_episode": (_edit_rows(_zero_length), "episode 3"),
}


@pytest.mark.parametrize("case", sorted(VALIDATION_CASES))
def test_validation_errors_stop_before_writing(source: Path, case: str) -> None:
    corrupt, needle = VALIDATION_CASES[case]
    corrupt(source)
    r = CliRunner().invoke(main, ["export", str(source), "--format", "v21", "--json"])
    assert r.exit_code == 1, r.output
    error_lines = [line for line in r.output.splitlines() if line.startswith("eva: error:")]
    assert len(error_lines) == 1 and needle in error_lines[0], r.output
    # Nothing is written before validation passes: no export root, lock or job record.
    assert not (source.parent / "export").exists()


def test_cli_export_json_lines_and_lock_refusal(source: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(main, ["export", str(source), "--format", "lerobot_v21", "--json"])
    assert r.exit_code == 0, r.output
    events = [json.loads(line) for line in r.output.splitlines()]
    assert events[-1]["event"] == "completed"
    assert events[-1]["accepted_episodes"] == 3 and events[-1]["rejected_episodes"] == 3
    assert any(e["event"] == "progress" for e in events)
    assert {"publishing", "writing"} <= {e.get("stage") for e in events}
    # Without --json the same run prints text, whatever stdout is (here not a terminal).
    text = runner.invoke(main, ["export", str(source), "--format", "v21"])
    assert text.exit_code == 0 and text.output.startswith("accepted: "), text.output
    # A second export of the same source+format while the lock is held is refused.
    root = source.parent / "export" / "lerobot_v21"
    code = (
        "import sys, time\nfrom pathlib import Path\nfrom eva.publish import export_lock\n"
        "with export_lock(Path(sys.argv[1]), 'x'):\n    print('locked', flush=True)\n    time.sleep(30)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(root)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        r = runner.invoke(main, ["export", str(source), "--format", "v21"])
        assert r.exit_code == 1 and "already running" in r.output
        with pytest.raises(ExportBusy):
            export_dataset(source, "lerobot_v21")
    finally:
        holder.kill()
        holder.wait()
    assert verify_export(root / "accepted") == []  # the published pair is untouched


def test_unavailable_format_is_reported() -> None:
    # A format module that does not exist yet must be "unavailable", not an import crash.
    future = FormatEntry("future_fmt", "eva.formats.future_fmt", LeRobotV21Options, "not yet")
    with pytest.raises(FormatUnavailable, match="not available"):
        future.load()


def test_failed_rerun_keeps_the_published_pair(source: Path) -> None:
    first = export_dataset(source, "lerobot_v21")
    before = {s: tree_hash(first.export_root / s) for s in ("accepted", "rejected")}
    (source / "videos/chunk-000/observation.images.cam1/episode_000004.mp4").unlink()
    with pytest.raises(DatasetError, match="episode_000004.mp4"):
        export_dataset(source, "lerobot_v21")
    assert {s: tree_hash(first.export_root / s) for s in ("accepted", "rejected")} == before
    job = read_job(first.export_root / "job.json")
    assert job is not None and job.state == "failed" and "episode_000004.mp4" in (job.error or "")
    hidden = [
        p for p in first.export_root.parent.iterdir() if p.name.startswith(".eva-") and p.is_dir()
    ]
    assert hidden == []


def test_lerobot_written_source(tmp_path: Path, lerobot_fixture_dir: Path) -> None:
    """A dataset LeRobot 0.3.3 wrote itself (AV1, no quality fields, no stats.json) splits too."""
    source = tmp_path / "lerobot-run"
    shutil.copytree(lerobot_fixture_dir, source)
    runner = CliRunner()
    assert (
        runner.invoke(main, ["qc", str(source), "1", "--fail", "--note", "wrong bin"]).exit_code
        == 0
    )
    result = export_dataset(source, "lerobot_v21")
    assert result.accepted_dir == tmp_path / "lerobot-run_export" / "lerobot_v21" / "accepted"
    assert (result.plan.accepted, result.plan.rejected) == ([0], [1])
    rejected = result.rejected_dir
    assert read_jsonl(rejected / layout.TASKS) == [{"task_index": 0, "task": "place it in the bin"}]
    table = pq.read_table(rejected / "data/chunk-000/episode_000000.parquet")
    assert table.column("index").to_pylist() == list(range(31))
    assert set(table.column("task_index").to_pylist()) == {0}
    assert read_jsonl(rejected / layout.EPISODES)[0]["qc_note"] == "wrong bin"
    for subset_dir in (result.accepted_dir, rejected):
        r = runner.invoke(main, ["verify", str(subset_dir)])
        assert r.exit_code == 0, r.output


def test_cli_cleanup_removes_a_crash_leftover_and_reports_json(source: Path) -> None:
    export_dataset(source, "lerobot_v21")
    root = catalog.parse("lerobot_v21").export_root(source)
    # What a kill -9 in the middle of staging leaves: a hidden, incomplete staging tree.
    leftover = staging_dir(root, "20261130T000000Z-deadbeef")
    (leftover / "accepted" / "meta").mkdir(parents=True)
    r = CliRunner().invoke(main, ["cleanup", str(source), "--format", "v21", "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    assert report["actions"]["lerobot_v21"] == [f"removed {leftover}"]
    assert not leftover.exists()
    assert verify_export(root / "accepted") == [] and verify_export(root / "rejected") == []
    r = CliRunner().invoke(main, ["cleanup", str(source)])
    assert r.exit_code == 0 and "nothing to clean up" in r.output


def test_cli_cleanup_that_cannot_repair_the_metadata_does_the_rest_and_exits_1(
    source: Path,
) -> None:
    """A duplicated episode row is not an interrupted save: cleanup still removes a staging
    leftover, then names what it could not repair and fails (documented exit code 1)."""
    export_dataset(source, "lerobot_v21")
    root = catalog.parse("lerobot_v21").export_root(source)
    leftover = staging_dir(root, "20261130T000000Z-deadbeef")
    (leftover / "accepted" / "meta").mkdir(parents=True)
    episodes = source / "meta" / "episodes.jsonl"
    rows = episodes.read_text().splitlines()
    episodes.write_text("\n".join([*rows, rows[0]]) + "\n")
    r = CliRunner().invoke(main, ["cleanup", str(source), "--json"])
    assert r.exit_code == 1, r.output
    report = json.loads(r.stdout.splitlines()[0])
    assert report["actions"]["lerobot_v21"] == [f"removed {leftover}"]
    assert report["failed"] == [
        f"metadata not repaired: {episodes}: duplicate episode_index; not repairable"
    ]
    assert not leftover.exists()
    r = CliRunner().invoke(main, ["cleanup", str(source)])
    assert r.exit_code == 1
    assert r.stderr.strip().splitlines() == [
        f"eva: error: metadata not repaired: {episodes}: duplicate episode_index; not repairable"
    ]
