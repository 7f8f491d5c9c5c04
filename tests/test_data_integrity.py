"""Bad data that used to pass, and metadata consistency (issue 13: B5-B9, C11, C14, D17, D18).

Every case is a real dataset (the synthetic writer), broken in one way on disk, then run through
validate / export / verify / qc / cleanup as the CLI does: a one-line error naming the file,
episode or field, a non-zero exit, and nothing written where nothing may be.
"""

from __future__ import annotations

import json
import random
import shutil
import struct
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from eva.capture.save_worker import SAVED, SaveJob, commit_episode
from eva.capture.synthetic import SyntheticScene
from eva.cli import main
from eva.config import ConfigError, load_config
from eva.dataset import atomic, layout
from eva.dataset.decode_check import check_full_decode, check_keyframes, verify_videos
from eva.dataset.errors import DatasetError
from eva.dataset.reader import DatasetReader
from eva.dataset.repair import MetadataNotUpdated, repair_metadata
from eva.dataset.validate import validate_dataset
from eva.dataset.writer import CameraSpec, DatasetWriter, VectorSpec
from eva.export.options import parse_options
from eva.export.pipeline import export_dataset
from eva.export.source import prepare
from eva.export.verify import verify_export
from eva.formats import catalog
from eva.formats.base import ExportOptions
from eva.formats.options import LeRobotV21Options

FRONT = "observation.images.front"
STATE = "observation.state"
FORMATS = catalog.names()  # every format the catalogue holds, zarr included


@pytest.fixture
def raw(qc_failed_dataset: Path) -> Path:
    """P: 3 episodes, episode 1 QC-failed."""
    return qc_failed_dataset


def _codes(root: Path) -> list[str]:
    return sorted(p.code for p in validate_dataset(root))


def _problems(root: Path, code: str) -> list[str]:
    return [p.message for p in validate_dataset(root) if p.code == code]


def _edit_info(root: Path, **changes: object) -> None:
    info = json.loads((root / layout.INFO).read_text())
    info.update(changes)
    (root / layout.INFO).write_text(json.dumps(info))


def _rewrite(root: Path, ep: int, edit: Callable[[pa.Table], pa.Table]) -> Path:
    path = DatasetReader(root).data_path(ep)
    pq.write_table(edit(pq.read_table(path)), path)
    return path


def _replace(table: pa.Table, name: str, array: pa.Array) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, pa.field(name, array.type), array)


def _state(table: pa.Table) -> np.ndarray:
    return np.asarray(table.column(STATE).to_pylist(), np.float32)


def _export_root(source: Path) -> Path:
    return source.parent / "export"


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def _one_line_failure(*args: str) -> str:
    code, output = _run(*args)
    assert code != 0, output
    lines = [line for line in output.splitlines() if line.startswith("eva: error")]
    assert len(lines) == 1, output
    return lines[0]


# ---- B5: every feature column against info.json ------------------------------------------------


def test_missing_feature_column_is_named_and_export_writes_nothing(raw: Path) -> None:
    path = _rewrite(raw, 1, lambda t: t.drop_columns(["action"]))
    assert _problems(raw, "missing_column") == [
        f"{path}: episode 1: column action missing (a feature in info.json)"
    ]
    line = _one_line_failure("export", str(raw), "--format", "v21")
    assert "column action missing" in line and "episode 1" in line
    assert not _export_root(raw).exists()


def test_vector_of_wrong_length_is_named(raw: Path) -> None:
    def shorter(t: pa.Table) -> pa.Table:
        values = _state(t)[:, :3].reshape(-1)
        return _replace(t, STATE, pa.FixedSizeListArray.from_arrays(pa.array(values), 3))

    path = _rewrite(raw, 0, shorter)
    [message] = _problems(raw, "wrong_column_type")
    assert message.startswith(f"{path}: episode 0: column {STATE} is fixed_size_list")
    assert "float32[4]" in message


def test_variable_length_list_of_wrong_length_names_the_row(raw: Path) -> None:
    def ragged(t: pa.Table) -> pa.Table:
        rows = _state(t).tolist()
        rows[5] = rows[5][:2]
        return _replace(t, STATE, pa.array(rows, pa.list_(pa.float32())))

    path = _rewrite(raw, 2, ragged)
    assert _problems(raw, "wrong_column_type") == [
        f"{path}: episode 2: column {STATE}: row 5 holds 2 values, shape is [4]"
    ]


def test_list_of_strings_state_is_named(raw: Path) -> None:
    def strings(t: pa.Table) -> pa.Table:
        rows = [[str(v) for v in row] for row in _state(t).tolist()]
        return _replace(t, STATE, pa.array(rows, pa.list_(pa.string())))

    path = _rewrite(raw, 0, strings)
    assert _problems(raw, "wrong_column_type") == [
        f"{path}: episode 0: column {STATE} holds string values, expected float32[4]"
    ]
    assert "holds string values" in _one_line_failure("export", str(raw), "--format", "hdf5")
    assert not _export_root(raw).exists()


def test_float_index_is_named(raw: Path) -> None:
    path = _rewrite(
        raw, 1, lambda t: _replace(t, "index", pa.array(t.column("index").to_numpy() * 1.0))
    )
    assert f"{path}: episode 1: column index is double, must be int64" in _problems(
        raw, "wrong_column_type"
    )


def test_null_in_vector_is_named(raw: Path) -> None:
    def with_null(t: pa.Table) -> pa.Table:
        rows: list[list[float] | None] = _state(t).tolist()
        rows[3] = None
        return _replace(t, STATE, pa.array(rows, pa.list_(pa.float32(), 4)))

    path = _rewrite(raw, 0, with_null)
    assert _problems(raw, "null_values") == [f"{path}: episode 0: column {STATE}: row 3 is null"]


def test_valid_datasets_stay_valid(raw: Path, lerobot_fixture_dir: Path) -> None:
    assert validate_dataset(raw) == []
    assert validate_dataset(lerobot_fixture_dir) == []


# ---- B6: NaN / inf ----------------------------------------------------------------------------


def _poison(raw: Path) -> Path:
    def nan(t: pa.Table) -> pa.Table:
        values = _state(t)
        values[4, 1] = np.nan
        values[7, 0] = np.inf
        return _replace(t, STATE, pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), 4))

    return _rewrite(raw, 0, nan)


def test_non_finite_values_are_named_with_the_first_row(raw: Path) -> None:
    path = _poison(raw)
    assert _problems(raw, "non_finite_values") == [
        f"{path}: episode 0: column {STATE}: 2 NaN/inf values, the first in row 4 (nan)"
    ]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_refuses_non_finite_by_default_and_carries_them_on_request(
    raw: Path, fmt: str
) -> None:
    path = _poison(raw)
    with pytest.raises(DatasetError, match=r"NaN/inf values, the first in row 4") as refused:
        export_dataset(raw, fmt)
    assert str(path) in str(refused.value) and "--allow-non-finite" in str(refused.value)
    assert not _export_root(raw).exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # v3 quantiles: no NaN arithmetic
        result = export_dataset(raw, fmt, options=parse_options(fmt, {"allow_non_finite": True}))
    for directory in (result.accepted_dir, result.rejected_dir):
        assert verify_export(directory) == []
    stats = json.loads((result.accepted_dir / layout.STATS).read_text())
    assert all(np.isfinite(v).all() for v in stats[STATE].values())


def test_cli_allow_non_finite(raw: Path) -> None:
    _poison(raw)
    assert "row 4" in _one_line_failure("export", str(raw), "--format", "v3")
    code, output = _run("export", str(raw), "--format", "v3", "--allow-non-finite")
    assert code == 0, output


# ---- B7: damaged MP4 bitstreams ---------------------------------------------------------------


def _mdat(data: bytes) -> tuple[int, int]:
    pos = 0
    while pos < len(data):
        size, kind = struct.unpack(">I4s", data[pos : pos + 8])
        header = 8
        if size == 1:
            size, header = struct.unpack(">Q", data[pos + 8 : pos + 16])[0], 16
        if kind == b"mdat":
            return pos + header, pos + size
        pos += size
    raise AssertionError("no mdat")


def _damage(path: Path, fraction: float = 0.6) -> None:
    """Overwrite ``fraction`` of mdat (from its start, so the keyframe goes), moov intact."""
    data = bytearray(path.read_bytes())
    start, end = _mdat(bytes(data))
    n = int((end - start) * fraction)
    data[start : start + n] = random.Random(1).randbytes(n)
    path.unlink()  # a new inode: v21 exports hard-link the raw file
    path.write_bytes(bytes(data))


def test_damaged_mp4_fails_validate_and_export(raw: Path) -> None:
    video = DatasetReader(raw).video_path(1, FRONT)
    _damage(video)
    [problem] = [p for p in validate_dataset(raw) if p.code == "undecodable_video"]
    assert problem.path == str(video) and problem.episode == 1
    assert "video data is damaged" in problem.message and "episode 1 camera" in problem.message
    for fmt in ("v21", "v3"):
        line = _one_line_failure("export", str(raw), "--format", fmt)
        assert str(video) in line
    assert not _export_root(raw).exists()


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.mark.parametrize("fmt", ["lerobot_v21", "lerobot_v3", "hdf5", "mcap"])
def test_a_damaged_mp4_found_while_the_pair_is_written_keeps_the_published_one(
    raw: Path, fmt: str
) -> None:
    # The MP4 inspections run while the staging dir is written: their refusal comes after files
    # were made, and must leave exactly what a refusal before the lock leaves.
    export_dataset(raw, fmt)
    root = catalog.parse(fmt).export_root(raw)
    published = _tree(root / "accepted"), _tree(root / "rejected")
    video = DatasetReader(raw).video_path(2, FRONT)
    _damage(video)
    expected = [p for p in validate_dataset(raw)][0].message
    with pytest.raises(DatasetError) as refused:
        export_dataset(raw, fmt)
    assert str(refused.value).startswith(expected) and str(video) in str(refused.value)
    assert (_tree(root / "accepted"), _tree(root / "rejected")) == published
    assert sorted(p.name for p in root.parent.iterdir() if p.name.startswith(".eva-")) == [
        f".eva-{fmt}.lock"
    ]  # no staging or backup dir left
    job = json.loads((root / "job.json").read_text())
    assert job["state"] == "failed" and job["error"].startswith(expected)


def test_a_damaged_mp4_refused_while_writing_a_first_export_leaves_nothing(raw: Path) -> None:
    video = DatasetReader(raw).video_path(0, FRONT)
    _damage(video)
    for fmt in ("lerobot_v3", "hdf5"):
        with pytest.raises(DatasetError, match=str(video)):
            export_dataset(raw, fmt)
        assert not _export_root(raw).exists()  # not the root, its job.json, nor the lock


def test_verify_decodes_a_whole_file_per_camera_and_full_decodes_all(raw: Path) -> None:
    result = export_dataset(
        raw, "lerobot_v21", options=ExportOptions(format=LeRobotV21Options(copy_videos=True))
    )
    assert verify_export(result.accepted_dir, full=True) == []
    files = sorted((result.accepted_dir / "videos").rglob("*.mp4"))
    assert len(files) == 2
    # Damage after the keyframe only: the keyframe check passes, a full decode does not.
    for path in files:
        data = bytearray(path.read_bytes())
        start, end = _mdat(bytes(data))
        tail = start + (end - start) * 2 // 3
        data[tail:end] = random.Random(2).randbytes(end - tail)
        path.write_bytes(bytes(data))
        check_keyframes(path)
        with pytest.raises(DatasetError, match=str(path)):
            check_full_decode(path)
    default = verify_videos(result.accepted_dir, rng=random.Random(0))
    assert [p.code for p in default] == ["undecodable_video"]  # one sampled file per camera
    assert [p.code for p in verify_export(result.accepted_dir, full=True)].count(
        "undecodable_video"
    ) == 2
    code, output = _run("verify", str(result.accepted_dir), "--full")
    assert code != 0 and "undecodable_video" in output


def test_keyframe_check_passes_every_valid_file(raw: Path) -> None:
    # (its cost, ~3 ms a file, is measured in bench/, never asserted on wall time here)
    reader = DatasetReader(raw)
    for ep in reader.episode_indices:
        check_keyframes(reader.video_path(ep, FRONT))


# ---- B8, C11: info.json fields and episodes_stats.jsonl -----------------------------------------


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"chunks_size": -1}, "field 'chunks_size' -1 is not an integer >= 1"),
        ({"chunks_size": "abc"}, "field 'chunks_size' 'abc' is not an integer >= 1"),
        ({"fps": 0.5}, "field 'fps' 0.5 is not a whole number"),
        ({"fps": 0}, "field 'fps' 0 is not a number in 1..1000"),
        ({"total_frames": "many"}, "field 'total_frames' 'many' is not an integer >= 0"),
    ],
)
def test_bad_info_fields_are_named(raw: Path, changes: dict, needle: str) -> None:
    _edit_info(raw, **changes)
    messages = _problems(raw, "invalid_info")
    assert any(needle in m and str(raw / layout.INFO) in m for m in messages), messages
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for command in (["validate", str(raw)], ["export", str(raw), "--format", "v21"]):
            code, output = _run(*command)
            assert code != 0 and needle in output
    assert not (_export_root(raw)).exists()
    assert not list(raw.parent.glob("**/chunk--*"))


def test_feature_that_is_not_an_object(raw: Path) -> None:
    info = json.loads((raw / layout.INFO).read_text())
    info["features"]["action"] = "float32"
    (raw / layout.INFO).write_text(json.dumps(info))
    assert any("feature 'action' is not an object" in m for m in _problems(raw, "invalid_info"))
    for command in (
        ["validate", str(raw)],
        ["export", str(raw), "--format", "mcap"],
        ["info", str(raw)],
    ):
        code, output = _run(*command)
        assert code != 0 and "feature 'action' is not an object" in output, output


def test_malformed_episodes_stats_are_named(raw: Path) -> None:
    path = raw / layout.EPISODES_STATS
    rows = atomic.read_jsonl(path)
    rows[1]["stats"][STATE]["min"] = ["x", 1, 2, 3]
    rows[2]["stats"]["action"]["max"] = [1.0, 2.0]
    del rows[0]["stats"]["timestamp"]["count"]
    atomic.atomic_write_jsonl(path, rows)
    messages = sorted(_problems(raw, "invalid_episodes_stats"))
    assert messages == [
        f"{path}: episode 0: field 'timestamp': count missing",
        f"{path}: episode 1: field '{STATE}': min is not an array of numbers",
        f"{path}: episode 2: field 'action': max has shape [2], expected [4]",
    ]
    line = _one_line_failure("export", str(raw), "--format", "v3")
    assert str(path) in line


# ---- B9: dataset names ------------------------------------------------------------------------


def _config(tmp_path: Path, tasks: str) -> Path:
    path = tmp_path / "collect.toml"
    path.write_text(f"[collection]\nlog_dir = 'logs'\n[collection.tasks]\n{tasks}\n")
    return path


def test_dataset_names_that_share_a_directory_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'a_b' and 'a b' both map to the directory 'a_b'"):
        load_config(_config(tmp_path, '"a b" = ["x"]\n"a_b" = ["y"]'))
    with pytest.raises(ConfigError, match=r"'pick/red': '/' and .* are not allowed"):
        load_config(_config(tmp_path, '"pick/red" = ["x"]'))
    config = load_config(_config(tmp_path, '"my set" = ["x"]'))
    assert config.collection.dataset_dir("my set").parent.name == "my_set"


# ---- C11: text that is not valid Unicode -------------------------------------------------------


def _surrogate_note(raw: Path) -> None:
    path = raw / layout.EPISODES
    rows = atomic.read_jsonl(path)
    rows[0]["qc_note"] = "glare \ud800 here"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # ASCII escapes: \ud800


def test_lone_surrogate_note(raw: Path) -> None:
    _surrogate_note(raw)
    code, output = _run("qc", str(raw), "--list")
    assert code == 0 and "glare" in output
    for fmt in ("v21", "hdf5", "mcap", "v3"):
        line = _one_line_failure("export", str(raw), "--format", fmt)
        assert "episode 0: field qc_note holds a lone surrogate" in line
    # Another episode's review rewrites the file: the note is kept, escaped.
    code, output = _run("qc", str(raw), "2", "--fail")
    assert code == 0, output
    assert DatasetReader(raw).episode(0)["qc_note"] == "glare \ud800 here"
    code, output = _run("qc", str(raw), "0", "--note", "glare here")
    assert code == 0 and validate_dataset(raw) == []


def test_note_that_is_not_utf8_is_refused(raw: Path) -> None:
    before = (raw / layout.EPISODES).read_bytes()
    line = _one_line_failure(
        "qc", str(raw), "0", "--note", b"\xff".decode("utf-8", "surrogateescape")
    )
    assert line.startswith("eva: error: qc: --note: holds a lone surrogate \\udcff")
    assert "byte 0xff" in line
    assert (raw / layout.EPISODES).read_bytes() == before


# ---- C14: nothing written before validation ---------------------------------------------------


def test_export_of_a_directory_that_is_not_a_dataset_writes_nothing(tmp_path: Path) -> None:
    plain = tmp_path / "notes"
    plain.mkdir()
    (plain / "readme.txt").write_text("hello")
    for fmt in FORMATS:
        line = _one_line_failure("export", str(plain), "--format", fmt)
        assert "info.json" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes"]
    assert [p.name for p in plain.iterdir()] == ["readme.txt"]


# ---- D17: metadata behind the committed rows ---------------------------------------------------


def _interrupted_save(raw: Path, synthetic_dataset: Callable[..., Path]) -> None:
    """What a kill -9 right after the episodes.jsonl append leaves: info.json and stats.json as
    they were before the save."""
    info, stats = (raw / layout.INFO).read_bytes(), (raw / layout.STATS).read_bytes()
    synthetic_dataset(episodes=1, frames=[10], state_dim=4, tasks=["a"])
    (raw / layout.INFO).write_bytes(info)
    (raw / layout.STATS).write_bytes(stats)


def test_interrupted_save_is_named_and_cleanup_repairs_it(
    raw: Path, synthetic_dataset: Callable[..., Path]
) -> None:
    _interrupted_save(raw, synthetic_dataset)
    messages = _problems(raw, "totals_mismatch")
    assert messages and all(f"run eva cleanup {raw} to repair the metadata" in m for m in messages)
    line = _one_line_failure("export", str(raw), "--format", "v21")
    assert f"run eva cleanup {raw}" in line
    code, output = _run("cleanup", str(raw))
    assert code == 0 and "metadata:" in output and "totals derived" in output, output
    assert validate_dataset(raw) == []
    info = DatasetReader(raw).info
    assert info["total_episodes"] == 4 and info["total_frames"] == 52
    assert DatasetReader(raw).stats["index"]["count"] == [52]
    assert repair_metadata(raw) == []  # idempotent
    code, output = _run("export", str(raw), "--format", "v21")
    assert code == 0, output


def test_info_counts_the_committed_rows_and_names_the_repair(
    raw: Path, synthetic_dataset: Callable[..., Path]
) -> None:
    """eva info read info.json's totals alone: 3 episodes, 42 frames, with 4 committed."""
    _interrupted_save(raw, synthetic_dataset)
    result = CliRunner().invoke(main, ["info", str(raw)])
    assert result.exit_code == 0, result.output
    assert "episodes  4, frames 52," in result.stdout
    [warning] = result.stderr.splitlines()
    assert warning.startswith(f"eva: warning: {raw / layout.INFO}: totals 3 episodes, 42 frames")
    assert warning.endswith(f"eva cleanup {raw} repairs them")
    assert _run("cleanup", str(raw))[0] == 0
    result = CliRunner().invoke(main, ["info", str(raw)])
    assert result.stderr == "" and "episodes  4, frames 52," in result.stdout


def test_save_after_the_commit_point_reports_committed_not_failed(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    writer = DatasetWriter.create_or_open(
        root,
        fps=30,
        cameras=[CameraSpec(FRONT, 48, 64)],
        vectors=[VectorSpec(STATE, 3), VectorSpec("action", 3)],
        durable=False,
    )
    with writer:
        episode = writer.begin_episode("t")
        episode.add_frames(
            images={FRONT: SyntheticScene(48, 64).frames(0, 5)},
            vectors={STATE: np.zeros((5, 3)), "action": np.zeros((5, 3))},
        )
        # A real fault after the commit point: stats.json cannot be replaced.
        (root / layout.STATS).unlink()
        (root / layout.STATS).mkdir()
        job = SaveJob(dataset_dir=root, task="t")
        commit_episode(job, writer, episode, {})
    assert job.state == SAVED and job.episode_index == 0 and job.frames == 5
    assert job.warning is not None
    assert job.warning.startswith("episode 0 committed; metadata not updated: ")
    assert job.warning.endswith(f"run eva cleanup {root} to repair it")
    assert job.as_dict()["warning"] == job.warning
    assert DatasetReader(root).episode_indices == [0]
    (root / layout.STATS).rmdir()
    assert "totals_mismatch" in _codes(root)
    repair_metadata(root)
    assert validate_dataset(root) == []


def test_metadata_not_updated_is_a_dataset_error() -> None:
    error = MetadataNotUpdated(Path("/d"), 3, OSError(28, "No space left on device"))
    assert isinstance(error, DatasetError) and error.episode_index == 3
    assert "\n" not in str(error)


# ---- D18: one snapshot for validation and preparation ------------------------------------------


def test_episode_committed_between_validation_and_preparation(
    raw: Path, synthetic_dataset: Callable[..., Path]
) -> None:
    reader = DatasetReader(raw)
    assert validate_dataset(raw, reader=reader) == []  # the snapshot: 3 episodes
    synthetic_dataset(episodes=1, frames=[9], state_dim=4, tasks=["a"])  # a capture commits
    _, plan, metas, late = prepare(raw, reader=reader)
    assert late is None  # every check done before it returned
    assert sum(m.total_episodes for m in metas.values()) == 3
    assert sorted(plan.accepted + plan.rejected) == [0, 1, 2]
    _, plan, metas, _ = prepare(raw)  # a new export sees the new episode
    assert sum(m.total_episodes for m in metas.values()) == 4


def test_export_during_a_capture(raw: Path, synthetic_dataset: Callable[..., Path]) -> None:
    """A real writer commits episodes in a thread while exports run: never a false problem."""
    import threading

    stop = threading.Event()
    errors: list[BaseException] = []

    def capture() -> None:
        try:
            while not stop.is_set():
                synthetic_dataset(episodes=1, frames=[4], state_dim=4, tasks=["a"])
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    thread = threading.Thread(target=capture)
    thread.start()
    try:
        for _ in range(4):
            export_dataset(raw, "lerobot_v21", options=ExportOptions(durable=False))
    finally:
        stop.set()
        thread.join()
    assert errors == []
    shutil.rmtree(_export_root(raw))
