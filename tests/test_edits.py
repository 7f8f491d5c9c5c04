"""Edits as reviewed decisions (``eva edit``): trim, task and drop stored beside the verdicts in
meta/episodes.jsonl, one rule (``eva.dataset.edits``) for the writer, the validator and the
split; refusals are one line naming the dataset, episode and field, leave the raw tree
byte-identical, and no edit ever touches a recorded frame."""

from __future__ import annotations

import hashlib
import json
from fractions import Fraction
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from eva.cli import main
from eva.dataset.edits import (
    EditError,
    EpisodeEdits,
    edit_problems,
    episode_edits,
    parse_trim,
    seconds_to_frame,
)
from eva.dataset.validate import validate_dataset
from eva.export.pipeline import export_dataset
from eva.export.staleness import stale_exports
from eva.quality.edits import EditRequest, edit_episodes
from eva.quality.split import plan_split
from eva.quality.verdicts import read_episode_rows
from eva.upload.gate import UploadRefused, check_upload


def run_cli(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def tree_digest(root: Path) -> dict[str, str]:
    """SHA-256 of every file below ``root`` (the lock files' bytes included)."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def raw(synthetic_dataset) -> Path:  # noqa: ANN001 - the conftest factory
    """3 episodes of 30, 32 and 1 frames at 30 fps; episode 1 QC-failed."""
    return synthetic_dataset(episodes=3, frames=[30, 32, 1], qc_verdicts=[None, "fail", None])


# ---- the rule: parsing and validation ----------------------------------------------------------


def test_trim_takes_frames_seconds_and_open_ends() -> None:
    assert parse_trim("5:20", 30, 30) == (5, 20)
    assert parse_trim("1.5s:9s", 300, 30) == (45, 270)  # 9 s ends before frame 270
    assert parse_trim("0.5s:", 30, 30) == (15, 30)
    assert parse_trim(":10", 30, 30) == (0, 10)
    assert parse_trim(" 2 : 0.5s ", 30, 30) == (2, 15)
    # A time names the nearest frame, halves rounding up.
    assert seconds_to_frame(Fraction(1, 60), 30) == 1
    assert seconds_to_frame(Fraction(1, 61), 30) == 0
    assert parse_trim("0.05s:", 30, 30) == (2, 30)  # 1.5 frames -> 2


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("5:5", "not a non-empty range inside the episode's 30 frames"),
        ("20:10", "frames [20, 10)"),
        ("0:31", "episode's 30 frames"),
        ("2s:", "frames [60, 30)"),
        ("5", "use START:END"),
        ("1:2:3", "use START:END"),
        ("-1:5", "not a frame index"),
        ("a:5", "not a frame index"),
        ("1e3s:", "not a time"),
        ("nans:", "not a time"),
        ("٣:5", "not a number"),
        ("9" * 40 + ":", "not a number"),
    ],
)
def test_bad_trims_are_refused_naming_the_length(text: str, words: str) -> None:
    with pytest.raises(EditError) as refused:
        parse_trim(text, 30, 30)
    assert words in str(refused.value)
    assert "\n" not in str(refused.value)


@settings(max_examples=300, deadline=None)
@given(
    length=st.integers(1, 500),
    start=st.integers(-2, 502),
    end=st.integers(-2, 502),
    fps=st.sampled_from([1, 15, 30, 60, 200]),
)
def test_trim_boundaries(length: int, start: int, end: int, fps: int) -> None:
    """Every range is accepted exactly when it is non-empty and inside the episode (first and
    last frames included, one-frame episodes too); what is accepted is what the stored rule
    accepts, and keeps end - start frames."""
    inside = 0 <= start < end <= length
    text = f"{start}:{end}"
    if not inside:
        with pytest.raises(EditError):
            parse_trim(text, length, fps)
        row = {"episode_index": 0, "length": length, "edit_trim": [start, end]}
        assert [f for f, _ in edit_problems(row)] == ["edit_trim"]
        return
    assert parse_trim(text, length, fps) == (start, end)
    row = {"episode_index": 0, "length": length, "edit_trim": [start, end]}
    edits = episode_edits(row)
    assert edits.kept(length) == range(start, end)
    assert edits.kept_length(length) == end - start
    assert edits.cuts(length) == ((start, end) != (0, length))
    # The same frames typed as times: each frame's timestamp names that frame.
    seconds = f"{Fraction(start, fps).__float__():.9f}s:{Fraction(end, fps).__float__():.9f}s"
    assert parse_trim(seconds, length, fps) == (start, end)


def test_one_frame_episode_keeps_its_frame_or_refuses() -> None:
    assert parse_trim("0:1", 1, 30) == (0, 1)
    assert parse_trim(":", 1, 30) == (0, 1)
    for text in ("0:0", "1:1", "1:", "0:2"):
        with pytest.raises(EditError, match="episode's 1 frames"):
            parse_trim(text, 1, 30)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"edit_trim": [3, 3]}, "edit_trim"),
        ({"edit_trim": [0, 31]}, "edit_trim"),
        ({"edit_trim": "0:10"}, "edit_trim"),
        ({"edit_trim": [0, 10, 20]}, "edit_trim"),
        ({"edit_trim": [True, 10]}, "edit_trim"),
        ({"edit_task": "   "}, "edit_task"),
        ({"edit_task": "a\nb"}, "edit_task"),
        ({"edit_task": "a\x1b[2Jb"}, "edit_task"),
        ({"edit_task": 3}, "edit_task"),
        ({"edit_task": "x" * 2001}, "edit_task"),
        ({"edit_drop": "yes"}, "edit_drop"),
        ({"edit_drop": 1}, "edit_drop"),
    ],
)
def test_validator_refuses_malformed_edits_in_one_line(
    raw: Path, fields: dict[str, object], field: str
) -> None:
    episodes = raw / "meta" / "episodes.jsonl"
    rows = [json.loads(line) for line in episodes.read_text().splitlines()]
    rows[0].update(fields)
    episodes.write_text("".join(json.dumps(r) + "\n" for r in rows))
    problems = [p for p in validate_dataset(raw) if p.code == "invalid_episode_row"]
    assert len(problems) == 1, problems
    message = str(problems[0])
    assert "episode 0" in message and f"field {field}" in message and "eva edit" in message
    assert "\n" not in message
    with pytest.raises(EditError, match=f"episode 0: field {field}"):
        plan_split(rows)
    code, _, err = run_cli("validate", raw)
    assert code == 1 and f"field {field}" in err + _


def test_validator_accepts_what_the_writer_writes(raw: Path) -> None:
    edit_episodes(raw, [0], EditRequest(trim="0.5s:", task="pick up the cube"))
    edit_episodes(raw, [1], EditRequest(trim=(0, 32)))  # the whole episode: kept as written
    edit_episodes(raw, [2], EditRequest(trim="0:1", drop=True))
    assert validate_dataset(raw) == []
    rows = {r["episode_index"]: r for r in read_episode_rows(raw)}
    assert rows[0]["edit_trim"] == [15, 30] and rows[0]["edit_task"] == "pick up the cube"
    assert rows[2]["edit_drop"] is True
    assert episode_edits(rows[0]) == EpisodeEdits(trim=(15, 30), task="pick up the cube")
    assert episode_edits(rows[0]).tasks(["old"]) == ["pick up the cube"]
    assert episode_edits(rows[1]).tasks(["old"]) == ["old"]
    assert not episode_edits(rows[1]).cuts(32)
    # Every edit undone: the fields are gone, the rows as they were.
    edit_episodes(raw, [0, 1, 2], EditRequest(clear_trim=True, clear_task=True, drop=False))
    assert all(not episode_edits(r) for r in read_episode_rows(raw))
    assert not any(k.startswith("edit_") for r in read_episode_rows(raw) for k in r)


# ---- eva edit: all or none, exit codes, nothing changed on refusal -----------------------------


def test_edit_applies_to_every_episode_or_to_none(raw: Path) -> None:
    before = tree_digest(raw)
    # Episode 2 has 1 frame: 0:2 fits 0 and 1 but not 2, so none is trimmed.
    code, out, err = run_cli("edit", raw, "0-2", "--trim", "0:2")
    assert code == 1 and out == ""
    assert err.count("\n") == 1
    assert str(raw) in err and "episode 2" in err and "trim" in err and "1 frames" in err
    assert tree_digest(raw) == before

    code, out, err = run_cli("edit", raw, "0-1", "--trim", "0:2", "--task", "pick")
    assert code == 0, err
    assert out.splitlines() == [
        "episode 0 (30 frames): trim 0:2, task 'pick' -> accepted",
        "episode 1 (32 frames): trim 0:2, task 'pick' -> rejected",
    ]
    code, out, _ = run_cli("edit", raw, "0", "--trim", "0:2")
    assert code == 0 and out.endswith("(unchanged)\n")


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["7", "--drop"], 1, "episode 7 does not exist"),
        (["0", "--trim", "0:31"], 1, "episode 0: trim '0:31'"),
        (["0", "--trim", "1s:"], 1, "episode 0: trim '1s:' is frames [30, 30)"),
        (["0", "--trim", "x:3"], 2, "trim 'x:3'"),
        (["0", "--task", "   "], 2, "empty or only whitespace"),
        (["0", "--task", "a\tb"], 2, "--task: control character"),
        (["0", "--trim", "0:3", "--clear-trim"], 2, "exclude each other"),
        (["0", "--task", "a", "--clear-task"], 2, "exclude each other"),
        (["0"], 2, "give an edit"),
        (["x", "--drop"], 2, "EPISODES"),
        (["0", "--drop", "--undrop"], 2, "exclude each other"),
    ],
)
def test_refusals_name_episode_and_field_and_change_nothing(
    raw: Path, args: list[str], code: int, words: str
) -> None:
    before = tree_digest(raw)
    got, out, err = run_cli("edit", raw, *args)
    assert got == code, (out, err)
    assert words in err
    assert tree_digest(raw) == before


def test_edit_of_a_missing_or_linked_dataset_is_one_line(raw: Path, tmp_path: Path) -> None:
    code, _, err = run_cli("edit", tmp_path / "nope", "0", "--drop")  # a usage error
    assert code == 2 and err.count("\n") == 1 and "nope' does not exist" in err
    (raw / "meta" / "info.json").unlink()
    before = tree_digest(raw)
    code, _, err = run_cli("edit", raw, "0", "--trim", "1s:")  # seconds need the fps
    assert code == 1 and err.count("\n") == 1 and "info.json" in err
    assert tree_digest(raw) == before


def test_edits_never_touch_recorded_frames(raw: Path) -> None:
    # what an edit writes: its fields, and the kept frames' histograms of a trim (a cache)
    written = {"meta/episodes.jsonl", "meta/eva_kept_histograms.jsonl"}
    before = tree_digest(raw)
    for args in (
        ["0-2", "--drop"],
        ["0-1", "--trim", "1:5", "--task", "other task"],
        ["0-2", "--undrop", "--clear-trim", "--clear-task"],
    ):
        code, _, err = run_cli("edit", raw, *args)
        assert code == 0, err
        after = tree_digest(raw)
        assert {k: v for k, v in after.items() if k not in written} == {
            k: v for k, v in before.items() if k not in written
        }
    assert tree_digest(raw) == before  # every edit undone: episodes.jsonl as it was too


def test_qc_list_and_info_show_the_edits(raw: Path) -> None:
    run_cli("edit", raw, "0", "--trim", "3:9")
    run_cli("edit", raw, "2", "--drop")
    code, out, _ = run_cli("qc", raw, "--list")
    assert code == 0
    lines = out.splitlines()
    assert "edits: trim 3:9" in lines[1]
    assert "dropped" in lines[3] and "edit drop" in lines[3]
    assert lines[-1] == "accepted 1, rejected 1, dropped 1"
    code, out, _ = run_cli("qc", raw, "--list", "--json")
    entries = [json.loads(line) for line in out.splitlines()]
    assert entries[0]["edits"] == {"edit_trim": [3, 9]}
    assert entries[2]["subset"] == "dropped"
    code, out, _ = run_cli("info", raw, "--episodes")
    assert "edits: trim 1, drop 1" in out
    assert any(line.startswith(" 0") and line.endswith("trim 3:9") for line in out.splitlines())


# ---- drop, the split and staleness -------------------------------------------------------------


def test_dropped_episodes_are_in_neither_subset_and_listed(raw: Path) -> None:
    run_cli("edit", raw, "1", "--drop")  # a failed episode dropped: not even rejected
    result = export_dataset(raw, "lerobot_v21")
    assert result.plan.accepted == [0, 2] and result.plan.rejected == []
    assert result.plan.dropped == [1]
    for subset in ("accepted", "rejected"):
        marker = json.loads((result.export_root / subset / "meta/quality_split.json").read_text())
        assert marker["dropped"] == [1]
        assert marker["source_total_episodes"] == 3
    assert stale_exports(raw) == []


def test_a_changed_edit_makes_the_export_stale_and_the_gate_refuses(raw: Path) -> None:
    export_dataset(raw, "hdf5")
    check_upload(raw, "hdf5", backend_configured=True)
    marker = raw.parent / "export" / "hdf5" / "accepted" / "meta" / "quality_split.json"
    assert "edits" not in json.loads(marker.read_text())  # an unedited export records none

    for args, detail in (
        (["0", "--trim", "2:"], "episode 0 edited since the export"),
        (["0", "--task", "new"], "episode 0 edited since the export"),
        (["2", "--drop"], "episode 2 dropped since the export"),
    ):
        code, _, err = run_cli("edit", raw, *args)
        assert code == 0 and "hdf5" in err and detail in err, err
        with pytest.raises(UploadRefused) as refused:
            check_upload(raw, "hdf5", backend_configured=True)
        assert refused.value.reason == "stale_review" and detail in str(refused.value)
        code, _, err = run_cli("edit", raw, "0-2", "--clear-trim", "--clear-task", "--undrop")
        assert code == 0 and "stale" not in err
        check_upload(raw, "hdf5", backend_configured=True)

    # Exported with a drop and an edit: undropping or changing the edit is stale, the edits as
    # exported are current.
    run_cli("edit", raw, "2", "--drop")
    run_cli("edit", raw, "0", "--task", "new")
    export_dataset(raw, "hdf5")
    assert json.loads(marker.read_text())["edits"] == {"0": {"task": "new"}}
    check_upload(raw, "hdf5", backend_configured=True)
    code, _, err = run_cli("edit", raw, "2", "--undrop")
    assert "episode 2 undropped since the export" in err
    run_cli("edit", raw, "2", "--drop")
    code, _, err = run_cli("edit", raw, "0", "--clear-task")
    assert "episode 0 edited since the export" in err
