"""validate_dataset: one dataset broken in exactly one way per rule, and the CLI around it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from eva.cli import main
from eva.dataset import atomic, layout
from eva.dataset.reader import DatasetReader
from eva.dataset.validate import validate_dataset
from eva.dataset.video import VideoEncoder

FRONT = "observation.images.front"


@pytest.fixture
def raw(synthetic_dataset: Callable[..., Path]) -> Path:
    return synthetic_dataset(
        episodes=2,
        frames=[6, 8],
        width=32,
        height=16,
        state_dim=4,
        tasks=["a", "b"],
        quality=["green", "red"],
        qc_verdicts=[None, "pass"],
    )


def _edit_info(root: Path, **changes: object) -> None:
    info = json.loads((root / layout.INFO).read_text())
    info.update(changes)
    atomic.atomic_write_json(root / layout.INFO, info)


def _rewrite_table(root: Path, ep: int, edit: Callable[[pa.Table], pa.Table]) -> Path:
    path = DatasetReader(root).data_path(ep)
    pq.write_table(edit(pq.read_table(path)), path)
    return path


def _set_column(table: pa.Table, name: str, values: np.ndarray) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, pa.array(values))


def _codes(root: Path, decode: bool = False) -> list[str]:
    return sorted(p.code for p in validate_dataset(root, decode=decode))


def test_valid_dataset_has_no_problems(raw: Path, lerobot_fixture_dir: Path) -> None:
    assert validate_dataset(raw) == []
    assert validate_dataset(raw, decode=True) == []
    assert validate_dataset(lerobot_fixture_dir, decode=True) == []


def test_missing_info(raw: Path) -> None:
    (raw / layout.INFO).unlink()
    problems = validate_dataset(raw)
    assert [p.code for p in problems] == ["missing_info"]
    assert problems[0].path == str(raw / layout.INFO)


def test_missing_episodes_jsonl(raw: Path) -> None:
    (raw / layout.EPISODES).unlink()
    assert _codes(raw) == ["missing_episodes"]


def test_missing_info_and_episodes_both_reported(raw: Path) -> None:
    (raw / layout.INFO).unlink()
    (raw / layout.EPISODES).unlink()
    assert _codes(raw) == ["missing_episodes", "missing_info"]


def test_bad_codebase_version(raw: Path) -> None:
    _edit_info(raw, codebase_version="v3.0")
    assert _codes(raw) == ["bad_codebase_version"]


def test_bad_dataset_format(raw: Path) -> None:
    def codes() -> list[str]:
        return sorted({p.code for p in validate_dataset(raw, dataset_format="lerobot_v21")})

    _edit_info(raw, dataset_format="lerobot_v3")
    assert codes() == ["bad_dataset_format"]
    _edit_info(raw, dataset_format="lerobot_v21")  # present and right: fine
    assert codes() == []


def test_eva_validate_checks_the_raw_layouts_format_name(raw: Path) -> None:
    _edit_info(raw, dataset_format="lerobot_v3")
    result = CliRunner().invoke(main, ["validate", str(raw)])
    assert result.exit_code == 1
    assert "dataset_format 'lerobot_v3' is not 'lerobot_v21'" in result.output


def test_duplicate_episode_index(raw: Path) -> None:
    rows = atomic.read_jsonl(raw / layout.EPISODES)
    atomic.atomic_write_jsonl(raw / layout.EPISODES, rows + [dict(rows[1])])
    problems = validate_dataset(raw)
    assert "duplicate_episode_index" in [p.code for p in problems]
    dup = next(p for p in problems if p.code == "duplicate_episode_index")
    assert dup.episode == 1 and "episode_index 1" in dup.message


def test_missing_parquet(raw: Path) -> None:
    path = DatasetReader(raw).data_path(1)
    path.unlink()
    problems = validate_dataset(raw)
    assert [p.code for p in problems] == ["missing_parquet"]
    assert problems[0].episode == 1 and problems[0].path == str(path)


def test_missing_camera_file(raw: Path) -> None:
    path = DatasetReader(raw).video_path(0, FRONT)
    path.unlink()
    problems = validate_dataset(raw)
    assert [(p.code, p.episode) for p in problems] == [("missing_video", 0)]
    assert FRONT in problems[0].message


@pytest.mark.parametrize("column", ["episode_index", "index"])
def test_missing_required_column(raw: Path, column: str) -> None:
    _rewrite_table(raw, 0, lambda t: t.drop_columns([column]))
    problems = validate_dataset(raw)
    assert [(p.code, p.episode) for p in problems] == [("missing_column", 0)]
    assert f"column {column}" in problems[0].message


def test_unknown_task_index(raw: Path) -> None:
    _rewrite_table(raw, 1, lambda t: _set_column(t, "task_index", np.full(t.num_rows, 7)))
    problems = validate_dataset(raw)
    assert [(p.code, p.episode) for p in problems] == [("unknown_task_index", 1)]
    assert "[7]" in problems[0].message


def test_missing_stats_column(raw: Path) -> None:
    rows = atomic.read_jsonl(raw / layout.EPISODES_STATS)
    del rows[0]["stats"][FRONT]  # video stats cannot come from the table
    del rows[1]["stats"]["action"]  # still computable from the table: fine
    atomic.atomic_write_jsonl(raw / layout.EPISODES_STATS, rows)
    problems = validate_dataset(raw)
    assert [(p.code, p.episode) for p in problems] == [("missing_stats", 0)]
    assert FRONT in problems[0].message
    # A feature in neither the stats nor the table.
    _rewrite_table(raw, 1, lambda t: t.drop_columns(["action"]))
    assert ("missing_stats", 1) in [(p.code, p.episode) for p in validate_dataset(raw)]


def test_empty_episode(synthetic_dataset: Callable[..., Path]) -> None:
    # No cameras, so the only thing wrong is the empty episode (an MP4 cannot hold 0 frames).
    root = synthetic_dataset("novideo", episodes=2, frames=[3, 4], cameras=0, state_dim=2)
    rows = atomic.read_jsonl(root / layout.EPISODES)
    rows[1]["length"] = 0
    atomic.atomic_write_jsonl(root / layout.EPISODES, rows)
    _rewrite_table(root, 1, lambda t: t.slice(0, 0))
    _edit_info(root, total_frames=3)
    problems = validate_dataset(root)
    assert [(p.code, p.episode) for p in problems] == [("empty_episode", 1)]


def test_frame_count_mismatch(raw: Path) -> None:
    reader = DatasetReader(raw)
    path = reader.video_path(1, FRONT)
    with VideoEncoder(path, 32, 16, 30) as enc:  # one frame short
        enc.write(np.zeros((7, 16, 32, 3), np.uint8))
    problems = validate_dataset(raw)
    assert [(p.code, p.episode) for p in problems] == [("frame_count_mismatch", 1)]
    assert "7 frames (container)" in problems[0].message and "8 rows" in problems[0].message
    decoded = validate_dataset(raw, decode=True)
    assert "7 frames (decoded)" in decoded[0].message


def test_length_mismatch(raw: Path) -> None:
    rows = atomic.read_jsonl(raw / layout.EPISODES)
    rows[1]["length"] = 9
    atomic.atomic_write_jsonl(raw / layout.EPISODES, rows)
    _edit_info(raw, total_frames=15)
    problems = validate_dataset(raw)
    assert [(p.code, p.episode) for p in problems] == [("length_mismatch", 1)]


def test_wrong_episode_index_values(raw: Path) -> None:
    _rewrite_table(
        raw, 1, lambda t: _set_column(t, "episode_index", np.zeros(t.num_rows, np.int64))
    )
    assert _codes(raw) == ["wrong_episode_index"]


def test_bad_frame_index(raw: Path) -> None:
    _rewrite_table(raw, 0, lambda t: _set_column(t, "frame_index", np.arange(1, 7, dtype=np.int64)))
    problems = validate_dataset(raw)
    assert [(p.code, p.episode) for p in problems] == [("bad_frame_index", 0)]


def test_timestamp_off_grid(raw: Path) -> None:
    late = (np.arange(8) / 30 + np.where(np.arange(8) == 5, 0.002, 0)).astype(np.float32)
    _rewrite_table(raw, 1, lambda t: _set_column(t, "timestamp", late))
    problems = validate_dataset(raw)
    assert [(p.code, p.episode) for p in problems] == [("timestamp_off_grid", 1)]
    assert "0.002" in problems[0].message


def test_index_not_contiguous_within_episode(raw: Path) -> None:
    gap = np.array([6, 7, 8, 10, 11, 12, 13, 14], dtype=np.int64)
    _rewrite_table(raw, 1, lambda t: _set_column(t, "index", gap))
    problems = validate_dataset(raw)
    assert [(p.code, p.episode) for p in problems] == [("index_not_contiguous", 1)]


def test_index_not_contiguous_across_episodes(raw: Path) -> None:
    _rewrite_table(raw, 1, lambda t: _set_column(t, "index", np.arange(8, dtype=np.int64)))
    problems = validate_dataset(raw)
    assert [(p.code, p.episode) for p in problems] == [("index_not_contiguous", 1)]
    assert "starts at 0, expected 6" in problems[0].message


def test_totals_mismatch(raw: Path) -> None:
    _edit_info(raw, total_frames=99)
    assert _codes(raw) == ["totals_mismatch"]


def test_unreadable_files(raw: Path) -> None:
    reader = DatasetReader(raw)
    reader.data_path(0).write_bytes(b"not parquet")
    reader.video_path(1, FRONT).write_bytes(b"not mp4")
    assert _codes(raw) == ["unreadable_parquet", "unreadable_video"]


def test_symlink_out_of_dataset_is_refused(raw: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    shutil.copytree(raw / "videos", outside)
    shutil.rmtree(raw / "videos")
    (raw / "videos").symlink_to(outside)
    codes = _codes(raw)
    assert codes == ["unsafe_path"]  # the shared tree check stops at the link


def test_every_problem_is_reported(raw: Path) -> None:
    _edit_info(raw, codebase_version="v2.0")
    DatasetReader(raw).data_path(0).unlink()
    DatasetReader(raw).video_path(1, FRONT).unlink()
    assert _codes(raw) == ["bad_codebase_version", "missing_parquet", "missing_video"]


# ---- CLI -----------------------------------------------------------------------------------


def test_cli_validate_exit_codes(raw: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    ok = runner.invoke(main, ["validate", str(raw)])
    assert ok.exit_code == 0, ok.output
    assert "valid" in ok.output
    as_json = runner.invoke(main, ["validate", str(raw), "--json", "--decode"])
    assert as_json.exit_code == 0 and json.loads(as_json.output)["valid"] is True

    DatasetReader(raw).data_path(1).unlink()
    bad = runner.invoke(main, ["validate", str(raw), "--json"])
    assert bad.exit_code == 1
    report = json.loads(bad.output)
    assert report["valid"] is False and report["problems"][0]["code"] == "missing_parquet"
    assert report["problems"][0]["episode"] == 1
    assert runner.invoke(main, ["validate", str(raw)]).exit_code == 1

    assert runner.invoke(main, ["validate", str(tmp_path / "missing")]).exit_code == 2
    assert runner.invoke(main, ["validate", str(raw), "--bogus"]).exit_code == 2
    assert runner.invoke(main, ["validate"]).exit_code == 2
    help_text = runner.invoke(main, ["validate", "--help"])
    assert help_text.exit_code == 0 and "Example" in help_text.output


def test_cli_info(raw: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["info", str(raw), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["episodes"] == 2 and summary["frames"] == 14 and summary["fps"] == 30
    assert summary["cameras"] == {FRONT: [16, 32, 3]}
    assert summary["tasks"] == ["a", "b"]
    assert summary["quality"] == {"green": 1, "red": 1}
    assert summary["qc_verdict"] == {"pass": 1, "fail": 0}
    text = runner.invoke(main, ["info", str(raw)])
    assert text.exit_code == 0 and "episodes  2, frames 14" in text.output
    assert "Example" in runner.invoke(main, ["info", "--help"]).output

    (raw / layout.INFO).write_text("{broken")
    broken = runner.invoke(main, ["info", str(raw)])
    assert broken.exit_code == 1 and "info.json" in broken.output
    assert runner.invoke(main, ["info", str(tmp_path / "missing")]).exit_code == 2


def test_hostile_video_key_is_reported_not_followed(raw: Path) -> None:
    info = json.loads((raw / layout.INFO).read_text())
    info["features"]["../../etc"] = dict(info["features"][FRONT])
    atomic.atomic_write_json(raw / layout.INFO, info)
    problems = validate_dataset(raw)
    codes = [p.code for p in problems]
    assert codes.count("unsafe_path") == 1
    assert all("etc" not in (p.path or "") or p.code == "unsafe_path" for p in problems)


def test_torn_jsonl_tail(raw: Path) -> None:
    with open(raw / layout.EPISODES_STATS, "ab") as f:
        f.write(b'{"episode_index": 2, "stats": {"act')
    problems = validate_dataset(raw)
    assert [p.code for p in problems] == ["torn_jsonl_tail"]
    assert problems[0].path == str(raw / layout.EPISODES_STATS)
    assert atomic.heal_jsonl_tail(raw / layout.EPISODES_STATS)
    assert validate_dataset(raw) == []


def test_symlinked_file_out_of_dataset_is_refused(raw: Path, tmp_path: Path) -> None:
    """A single episode file that is a symlink leaving the dataset (not its directory)."""
    video = DatasetReader(raw).video_path(1, FRONT)
    outside = tmp_path / "elsewhere.mp4"
    shutil.copyfile(video, outside)
    video.unlink()
    video.symlink_to(outside)
    assert _codes(raw) == ["unsafe_path"]


def test_on_table_hands_over_the_index_columns_read(raw: Path) -> None:
    """The caller gets exactly the checked columns of every episode (the export takes task_index
    from there), also beside a column whose dotted name starts with one of theirs."""
    _rewrite_table(
        raw, 1, lambda t: t.append_column("timestamp.raw", pa.array(np.zeros(t.num_rows)))
    )
    seen: dict[int, pa.Table] = {}
    assert validate_dataset(raw, on_table=lambda ep, table: seen.setdefault(ep, table)) == []
    assert sorted(seen) == [0, 1]
    for ep, table in seen.items():
        assert table.column_names == [
            "episode_index",
            "task_index",
            "index",
            "frame_index",
            "timestamp",
        ]
        source = DatasetReader(raw).read_table(ep)
        for name in table.column_names:
            assert table.column(name).equals(source.column(name))


def test_checks_run_later_keep_their_place_in_the_walk() -> None:
    from eva.dataset.validate import ProblemCollector

    out = ProblemCollector()
    out.add("a", "first")
    out.later(lambda c: c.add("b", "second"))
    out.add("c", "third")
    out.later(lambda c: None)  # a later check that finds nothing
    out.later(lambda c: (c.add("d", "fourth"), c.later(lambda cc: cc.add("e", "fifth"))))
    out.add("f", "sixth")
    assert [p.code for p in out.problems] == ["a", "c", "f"] and out.unsettled
    assert [p.code for p in out.settle()] == ["a", "b", "c", "d", "e", "f"]
    assert not out.unsettled and [p.code for p in out.problems] == ["a", "b", "c", "d", "e", "f"]


def test_a_located_problem_names_its_file_and_episode_on_one_line() -> None:
    # The one collector, as the formats' verifiers call it: the file (and episode) in front.
    from eva.dataset.validate import ProblemCollector

    out = ProblemCollector()
    out("bad_value", "action has shape (3,)", Path("d/e.hdf5"), 4)
    out("wrong_version", "codebase_version 'v2.0'\nfrom a library", Path("d/info.json"))
    assert [str(p) for p in out.problems] == [
        "[bad_value] d/e.hdf5: episode 4: action has shape (3,)",
        "[wrong_version] d/info.json: codebase_version 'v2.0'; from a library",
    ]
    assert [(p.path, p.episode) for p in out.problems] == [("d/e.hdf5", 4), ("d/info.json", None)]


def test_a_started_validation_completes_as_validate_dataset(raw: Path) -> None:
    from eva.dataset.validate import start_validation

    video = DatasetReader(raw).video_path(1, FRONT)
    video.write_bytes(video.read_bytes()[:-300])  # a truncated mdat: found by its inspection
    with start_validation(raw) as validation:
        assert validation.waiting  # the walk is done; the MP4 checks may still run
        assert all(p.path != str(video) for p in validation.found)
        problems = validation.complete()
    assert problems == validate_dataset(raw) and any(p.path == str(video) for p in problems)
