"""Siblings of the hostile-dataset cases (issue 13), found by the audit that closed it.

The issue's cases are examples of classes; these are further members of the same classes:
an exported subset handed over is hostile input too (links and FIFOs in it hang or mislead
``eva verify`` and ``eva info``), the console's status reads episodes.jsonl without following
links or blocking on a FIFO, the upload takes the export lock the same way export and cleanup
do, and metadata fields the first pass did not validate (NaN/inf in episodes_stats.jsonl, the
review fields of episodes.jsonl) are named problems before anything is written. Every case runs
the real CLI (a subprocess with a timeout where a hang is the failure) on a real dataset.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from swap_helpers import exchanging

from eva.cli import main
from eva.console.errors import ConsoleError
from eva.console.review import EpisodeReview
from eva.dataset import atomic, layout
from eva.dataset.errors import UnsafePathError
from eva.dataset.reader import DatasetReader
from eva.dataset.validate import validate_dataset
from eva.export.pipeline import export_dataset
from eva.export.verify import verify_export_report

EVA = [sys.executable, "-m", "eva.cli"]
FRONT = "observation.images.front"
STATE = "observation.state"


@pytest.fixture
def raw(qc_failed_dataset: Path) -> Path:
    return qc_failed_dataset


def _cli(*args: object, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess: a hang is a TimeoutExpired, not a stuck test run."""
    return subprocess.run(
        [*EVA, *map(str, args)], capture_output=True, text=True, timeout=timeout, check=False
    )


def _run(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def _one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("eva: error:")]
    assert len(lines) == 1, output
    return lines[0]


# ---- C10/A3 for exports: eva verify and eva info on a handed-over subset ---------------------


@pytest.fixture
def moved(raw: Path, tmp_path: Path) -> Path:
    """The accepted v2.1 subset, copied somewhere else (as someone would hand it over)."""
    result = export_dataset(raw, "lerobot_v21")
    copy = tmp_path / "handed-over"
    shutil.copytree(result.accepted_dir, copy)
    assert _cli("verify", copy).returncode == 0
    return copy


def _first_video(export: Path) -> Path:
    return sorted((export / "videos").rglob("*.mp4"))[0]


@pytest.mark.parametrize("rel", [layout.INFO, layout.QUALITY_SPLIT, layout.EPISODES, "mp4"])
def test_fifo_in_an_export_fails_verify_and_info_at_once(moved: Path, rel: str) -> None:
    target = _first_video(moved) if rel == "mp4" else moved / rel
    target.unlink()
    os.mkfifo(target)
    for args in (["verify", moved], ["verify", moved, "--full"]):
        done = _cli(*args)  # before the fix: blocked forever in open()
        assert done.returncode == 1, done
        assert "Traceback" not in done.stderr
        assert f"unsafe_path: {target}: not a regular file (a FIFO)" in done.stdout + done.stderr
    done = _cli("info", moved)
    if rel == "mp4":  # info reads metadata only
        assert done.returncode == 0, done
    else:
        assert done.returncode == 1 and "Traceback" not in done.stderr, done
        assert done.stderr.strip() == (
            f"eva: error: {target}: not a regular file (a FIFO); eva reads only regular files"
        )


def test_verify_refuses_a_link_to_another_file_of_the_export(moved: Path) -> None:
    """A relative link inside the export (episode 0's MP4 -> episode 1's) resolved inside it,
    so verify read episode 1's frames as episode 0's and said ok."""
    videos = sorted((moved / "videos").rglob("*.mp4"))
    assert len(videos) == 2
    videos[0].unlink()
    videos[0].symlink_to(videos[1].name)
    done = _cli("verify", moved)
    assert done.returncode == 1, done
    assert f"unsafe_path: {videos[0]}: is a symlink" in done.stdout + done.stderr


def test_info_refuses_a_linked_export_marker(moved: Path, tmp_path: Path) -> None:
    marker = moved / layout.QUALITY_SPLIT
    outside = tmp_path / "outside.json"
    marker.rename(outside)
    marker.symlink_to(outside)
    code, output = _run("info", moved)
    assert code == 1
    assert _one_error_line(output) == (
        f"eva: error: {marker}: is a symlink; eva follows no links inside a dataset or an "
        "export tree"
    )


# ---- A2/C10 for the console: the status counts episodes without following or blocking -------


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_console_status_neither_blocks_on_nor_follows_episodes_jsonl(
    raw: Path, tmp_path: Path, kind: str
) -> None:
    from eva.config import config_from_dict
    from eva.console.datasets import DatasetDirs

    log_dir = raw.parent.parent
    config = config_from_dict(
        {"collection": {"log_dir": str(log_dir), "tasks": {raw.parent.name: ["a"]}}}
    )
    dirs = DatasetDirs(config.collection)
    assert dirs.root(raw.parent.name) == raw
    episodes = raw / layout.EPISODES
    episodes.unlink()
    if kind == "fifo":
        os.mkfifo(episodes)
    else:
        outside = tmp_path / "outside.jsonl"
        outside.write_text("{}\n" * 7)
        episodes.symlink_to(outside)
    listed: list[dict[str, object]] = []
    # The status is built on a server thread: before the fix a FIFO's open blocked it forever.
    worker = threading.Thread(target=lambda: listed.extend(dirs.listing()), daemon=True)
    worker.start()
    worker.join(20)
    assert not worker.is_alive(), "the dataset listing blocked on episodes.jsonl"
    assert [d["episodes"] for d in listed] == [0]  # not the 7 lines of the outside file
    assert dirs.episode_count(raw) is None


# ---- A1 for upload: the same export lock, never followed -------------------------------------


def test_upload_refuses_a_linked_export_lock(raw: Path, tmp_path: Path) -> None:
    export_dataset(raw, "lerobot_v21")
    lock = raw.parent / "export" / ".eva-lerobot_v21.lock"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    lock.unlink()
    lock.symlink_to(victim)
    config = tmp_path / "eva.toml"
    config.write_text(
        "[collection]\n"
        f'log_dir = "{tmp_path}"\n'
        "[collection.storage.sftp]\n"
        'host = "127.0.0.1"\n'
        "port = 1\n"
        'user = "nobody"\n'
        f'remote_dir = "{tmp_path / "remote"}"\n'
    )
    code, output = _run("upload", raw, "--format", "v21", "--config", config)
    assert code == 1
    line = _one_error_line(output)
    assert str(lock) in line and "is a symlink" in line
    assert victim.read_text() == "precious\n"


# ---- B8: NaN/inf in episodes_stats.jsonl -------------------------------------------------------


def test_non_finite_episode_stats_are_named_and_export_writes_nothing(raw: Path) -> None:
    path = raw / layout.EPISODES_STATS
    rows = atomic.read_jsonl(path)
    rows[0]["stats"][STATE]["mean"] = [float("nan")] * 4  # Python's json writes NaN, reads it
    rows[2]["stats"]["action"]["max"] = [float("inf")] * 4
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert sorted(p.message for p in validate_dataset(raw)) == [
        f"{path}: episode 0: field '{STATE}': mean holds NaN/inf (not JSON numbers)",
        f"{path}: episode 2: field 'action': max holds NaN/inf (not JSON numbers)",
    ]
    for fmt in ("v21", "v3", "hdf5", "mcap"):
        # before the fix: "export failed: ValueError: Out of range float values are not JSON
        # compliant: nan", naming no file, after the export root was made
        code, output = _run("export", raw, "--format", fmt)
        assert code == 1
        assert _one_error_line(output).startswith(f"eva: error: {path}: episode 0: field")
    assert not (raw.parent / "export").exists()


# ---- B5/B8: the review fields of episodes.jsonl ------------------------------------------------


def _edit_row(raw: Path, ep: int, **fields: object) -> Path:
    path = raw / layout.EPISODES
    rows = atomic.read_jsonl(path)
    rows[ep].update(fields)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"qc_verdict": "failed"}, "field qc_verdict 'failed' is not one of pass, fail"),
        ({"qc_verdict": 0}, "field qc_verdict 0 is not one of pass, fail"),
        ({"quality": "RED!"}, "field quality 'RED!' is not one of green, red"),
        ({"tasks": "a"}, "field tasks 'a' is not a list of strings"),
        ({"qc_note": 5}, "field qc_note 5 is not a string"),
        ({"quality_issues": "x"}, "field quality_issues 'x' is not a list of objects"),
    ],
)
def test_review_fields_are_validated(raw: Path, fields: dict[str, object], needle: str) -> None:
    """A hand-edited verdict the rule does not know read as no verdict: episode 1, failed by the
    operator, was published as accepted."""
    path = _edit_row(raw, 1, **fields)
    [problem] = validate_dataset(raw)
    assert problem.code == "invalid_episode_row" and problem.episode == 1
    assert problem.message.startswith(f"{path}: episode 1: {needle}")
    code, output = _run("export", raw, "--format", "v21")
    assert code == 1 and needle in _one_error_line(output)
    assert not (raw.parent / "export").exists()


def test_review_fields_in_every_case_the_rule_reads_stay_valid(raw: Path) -> None:
    _edit_row(raw, 0, qc_verdict=" PASS ", quality="Green", qc_note=None, quality_issues=[])
    _edit_row(raw, 1, qc_verdict=None)
    assert validate_dataset(raw) == []


# ---- C11: what shows a review never iterates a field that is not a list ------------------------


def test_qc_list_info_and_console_show_rows_with_odd_fields(raw: Path) -> None:
    """``quality_issues: true`` was a TypeError traceback in qc --list and info -v (and a 500 in
    the console); ``tasks: "a"`` reached the console page, whose ``tasks.join`` then failed."""
    from eva.config import config_from_dict
    from eva.console.datasets import DatasetDirs
    from eva.console.review import EpisodeReview

    _edit_row(raw, 0, quality_issues=True, tasks="a", video_keys="cam")
    code, output = _run("qc", raw, "--list")
    assert code == 0 and "True" in output.splitlines()[1], output
    for args in (["info", raw, "-v"], ["info", raw, "--json", "-v"]):
        code, output = _run(*args)
        assert code == 0, output
    config = config_from_dict(
        {"collection": {"log_dir": str(raw.parent.parent), "tasks": {raw.parent.name: ["a"]}}}
    )
    review = EpisodeReview(DatasetDirs(config.collection), lambda: None)
    first = review.episodes(raw.parent.name)["episodes"][0]
    assert first["quality_issues"] == [] and first["tasks"] == ["a"]
    assert first["video_keys"] == ["cam"]


# ---- C11 for exports: eva verify on metadata of the wrong shape --------------------------------

EXPORT_DAMAGE = {
    "feature": (layout.INFO, lambda info: info["features"].update(episode_index=[None])),
    "fps": (layout.INFO, lambda info: info.update(fps=[None])),
    "row": (layout.EPISODES, None),
}


@pytest.mark.parametrize("damage", sorted(EXPORT_DAMAGE))
@pytest.mark.parametrize("fmt", ["lerobot_v21", "lerobot_v3", "hdf5", "mcap"])
def test_verify_names_export_metadata_of_the_wrong_shape(raw: Path, fmt: str, damage: str) -> None:
    """Before the fix: AttributeError/TypeError tracebacks from the format verifiers."""
    accepted = export_dataset(raw, fmt).accepted_dir
    rel, edit = EXPORT_DAMAGE[damage]
    path = accepted / rel
    if edit is None:  # a row that is a JSON string, not an object
        rows = path.read_text().splitlines()
        path.write_text("\n".join([rows[0], '""', *rows[2:]]) + "\n")
        needle = f"{path}: row 2 is not a JSON object"
    else:
        info = json.loads(path.read_text())
        edit(info)
        path.write_text(json.dumps(info))
        needle = f"{path}: " + ("feature 'episode_index' is not an object" if damage == "feature"
                                else "field 'fps' [None] is not a number")  # fmt: skip
    code, output = _run("verify", accepted)
    assert code == 1, output
    assert needle in output, output


# ---- B6: NaN in the timestamp column names its row ---------------------------------------------


def test_nan_timestamp_names_the_row(raw: Path) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = DatasetReader(raw).data_path(0)
    table = pq.read_table(path)
    timestamps = table.column("timestamp").to_numpy().copy()
    timestamps[3] = np.nan
    i = table.schema.get_field_index("timestamp")
    path.chmod(0o644)
    pq.write_table(table.set_column(i, "timestamp", pa.array(timestamps)), path)
    [problem] = validate_dataset(raw)  # was: "off frame_index/fps by up to nan s"
    assert problem.code == "timestamp_off_grid"
    assert problem.message == (
        f"{path}: episode 0: column timestamp: row 3 is nan (must be frame_index/fps)"
    )


def test_upload_refuses_a_review_the_rule_cannot_read(raw: Path) -> None:
    """Episode 0 (green, no verdict) marked "failed" by hand after the export: read as no
    verdict, the split did not change, nothing was stale, and the upload sent it as accepted."""
    from eva.upload.gate import UploadRefused, check_upload

    export_dataset(raw, "lerobot_v21")
    check_upload(raw, "lerobot_v21", backend_configured=True)
    path = _edit_row(raw, 0, qc_verdict="failed")
    with pytest.raises(UploadRefused) as refused:
        check_upload(raw, "lerobot_v21", backend_configured=True)
    assert refused.value.reason == "review_unreadable"
    assert f"{path}: episode 0: field qc_verdict 'failed' is not one of pass, fail" in str(
        refused.value
    )


def test_verify_does_not_read_the_sibling_subset_through_a_link(raw: Path, tmp_path: Path) -> None:
    """A moved pair whose rejected/ is a link elsewhere: its marker was read through the link."""
    result = export_dataset(raw, "lerobot_v21")
    pair = tmp_path / "pair"
    shutil.copytree(result.accepted_dir, pair / "accepted")
    shutil.copytree(result.rejected_dir, tmp_path / "elsewhere")
    (pair / "rejected").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    problems = [p for p in verify_export_report(pair / "accepted").problems if p.code == "pair"]
    assert [p.message for p in problems] == [
        f"{pair / 'rejected'}: sibling subset: {pair / 'rejected'}: is a symlink; eva follows no "
        "links inside a dataset or an export tree"
    ]


# ---- issue 27: a file is opened beneath the root when it is read, whatever was checked before --


def _outside_copy(directory: Path, outside: Path) -> Path:
    """A copy of ``directory`` whose tables hold other values (7777.0 in every state value): a
    read of the copy would show in what is returned."""
    shutil.copytree(directory, outside)
    for path in outside.glob("*.parquet"):
        table = pq.read_table(path)
        column = table.column(STATE).combine_chunks()
        marked = pa.FixedSizeListArray.from_arrays(
            pa.array(np.full(len(column.flatten()), 7777.0), column.type.value_type),
            column.type.list_size,
        )
        table = table.set_column(table.schema.get_field_index(STATE), STATE, marked)
        path.chmod(0o644)
        pq.write_table(table, path)
    return outside


@contextlib.contextmanager
def _swapped_for_link(directory: Path, outside: Path) -> Iterator[None]:
    aside = directory.with_name(directory.name + "-aside")
    directory.rename(aside)
    directory.symlink_to(outside, target_is_directory=True)
    try:
        yield
    finally:
        directory.unlink()
        aside.rename(directory)


def test_reader_opens_each_table_beneath_the_root_on_every_read(raw: Path, tmp_path: Path) -> None:
    reader = DatasetReader(raw)
    ep = reader.episode_indices[0]
    inside = reader.read_table(ep)  # paths checked and remembered, the table cached
    states = reader.read_vector(ep, STATE)
    data_dir = reader.data_path(ep).parent
    outside = _outside_copy(data_dir, tmp_path / "outside-data")
    reads = {
        "read_table": lambda: reader.read_table(ep),
        "read_table(columns)": lambda: reader.read_table(ep, [STATE]),
        "read_vector": lambda: reader.read_vector(ep, STATE),
        "count_rows": lambda: reader.count_rows(ep),
        "read_schema": lambda: reader.read_schema(ep),
    }
    with _swapped_for_link(data_dir, outside):
        for name, read in reads.items():
            with pytest.raises(UnsafePathError, match="symlink") as refused:
                read()
            assert str(reader.data_path(ep)) in str(refused.value), name
            assert "\n" not in str(refused.value)
    assert reader.read_table(ep).equals(inside)  # the real directory back: read again
    assert np.array_equal(reader.read_vector(ep, STATE), states)


def test_reader_reads_metadata_beneath_the_root(raw: Path, tmp_path: Path) -> None:
    reader = DatasetReader(raw)  # the root checked; nothing read yet
    meta = raw / layout.META_DIR
    outside = tmp_path / "outside-meta"
    shutil.copytree(meta, outside)
    info = json.loads((outside / "info.json").read_text())
    (outside / "info.json").write_text(json.dumps({**info, "fps": 7}))
    with _swapped_for_link(meta, outside):
        for name in ("info", "episodes", "tasks", "stats", "episodes_stats"):
            with pytest.raises(UnsafePathError, match="symlink"):
                getattr(reader, name)
    assert reader.fps == info["fps"] != 7


def _review(raw: Path) -> EpisodeReview:
    from eva.config import config_from_dict
    from eva.console.datasets import DatasetDirs

    config = config_from_dict(
        {"collection": {"log_dir": str(raw.parent.parent), "tasks": {raw.parent.name: ["a"]}}}
    )
    return EpisodeReview(DatasetDirs(config.collection), changed=lambda: None)


def test_console_series_never_reads_a_table_swapped_in_mid_request(
    raw: Path, tmp_path: Path
) -> None:
    """A thread exchanges ``data/chunk-000`` with a link to an outside copy (``renameat2``:
    the path is always one or the other) while the series is asked for again and again: each
    answer is the dataset's values or ``unsafe_path``, never the copy's."""
    review, name = _review(raw), raw.parent.name
    inside = review.series(name, 0)
    data_dir = raw / "data" / "chunk-000"
    link = data_dir.with_name("chunk-link")
    link.symlink_to(_outside_copy(data_dir, tmp_path / "outside-data"), target_is_directory=True)
    outcomes: list[str] = []
    with exchanging(data_dir, link):
        for _ in range(300):
            try:
                answer = review.series(name, 0)
            except ConsoleError as e:
                outcomes.append(e.code)
                continue
            assert answer["series"] == inside["series"]  # not 7777.0
            outcomes.append("ok")
    assert set(outcomes) <= {"ok", "unsafe_path"}, sorted(set(outcomes))
    assert review.series(name, 0) == inside
