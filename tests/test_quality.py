"""QC verdicts (the accept/reject priority of docs/formats.md), the split plan and `eva qc` on real episodes.jsonl files."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from eva.cli import main
from eva.dataset import layout
from eva.dataset.atomic import atomic_write_jsonl, read_jsonl
from eva.dataset.errors import DatasetError
from eva.quality.split import plan_split
from eva.quality.verdicts import (
    ACCEPTED,
    REJECTED,
    is_being_saved,
    review_episode,
    saving_marker,
    subset_of,
)

pytestmark = pytest.mark.kernel_independent


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"quality": "green"}, ACCEPTED),
        ({"quality": "red"}, REJECTED),
        ({"quality": "red", "qc_verdict": "pass"}, ACCEPTED),
        ({"quality": "green", "qc_verdict": "fail"}, REJECTED),
        ({"quality": "green", "qc_note": "looks odd"}, ACCEPTED),
        ({"quality": "red", "qc_note": "keep?"}, REJECTED),
        ({"quality": "RED"}, REJECTED),
        ({"quality": "Red", "qc_verdict": "PASS"}, ACCEPTED),
        ({"quality": "Green", "qc_verdict": " Fail "}, REJECTED),
        ({}, ACCEPTED),
        ({"quality": "red", "qc_verdict": "maybe"}, REJECTED),
    ],
)
def test_priority(row: dict, expected: str) -> None:
    assert subset_of(row) == expected


def test_plan_split_keeps_source_order() -> None:
    rows = [
        {"episode_index": 3, "quality": "green"},
        {"episode_index": 0, "quality": "green"},
        {"episode_index": 2, "quality": "red", "qc_verdict": "pass"},
        {"episode_index": 1, "quality": "red"},
        {"episode_index": 4, "quality": "green", "qc_verdict": "fail"},
    ]
    plan = plan_split(rows)
    assert plan.accepted == [0, 2, 3]
    assert plan.rejected == [1, 4]


def _dataset(tmp_path: Path, rows: list[dict]) -> Path:
    root = tmp_path / "raw"
    (root / "meta").mkdir(parents=True)
    atomic_write_jsonl(root / layout.EPISODES, rows)
    return root


ROWS = [
    {"episode_index": 0, "length": 10, "quality": "green", "quality_issues": [], "extra": {"k": 1}},
    {
        "episode_index": 1,
        "length": 12,
        "quality": "red",
        "quality_issues": [{"severity": "red", "code": "frozen_camera", "detail": "cam0 frame 3"}],
    },
]


def test_review_pass_keeps_issues_and_unknown_keys(tmp_path: Path) -> None:
    root = _dataset(tmp_path, ROWS)
    update = review_episode(root, 1, verdict="PASS", note="glitch only")
    assert update.changed
    rows = read_jsonl(root / layout.EPISODES)
    assert rows[1]["qc_verdict"] == "pass"
    assert rows[1]["qc_note"] == "glitch only"
    assert rows[1]["quality_issues"][0]["code"] == "frozen_camera"
    assert rows[0] == ROWS[0]
    assert subset_of(rows[1]) == ACCEPTED


def test_note_only_leaves_verdict(tmp_path: Path) -> None:
    root = _dataset(tmp_path, ROWS)
    review_episode(root, 0, verdict="fail")
    review_episode(root, 0, note="second look")
    row = read_jsonl(root / layout.EPISODES)[0]
    assert row["qc_verdict"] == "fail" and row["qc_note"] == "second look"
    # A note alone on an unreviewed episode adds no verdict.
    review_episode(root, 1, note="n")
    row1 = read_jsonl(root / layout.EPISODES)[1]
    assert "qc_verdict" not in row1 and subset_of(row1) == REJECTED


def test_review_errors(tmp_path: Path) -> None:
    root = _dataset(tmp_path, ROWS)
    with pytest.raises(DatasetError, match="episode 7 does not exist"):
        review_episode(root, 7, verdict="pass")
    with pytest.raises(DatasetError, match="use pass or fail"):
        review_episode(root, 0, verdict="maybe")
    with pytest.raises(DatasetError, match="control characters"):
        review_episode(root, 0, note="two\nlines")
    with pytest.raises(DatasetError, match="missing"):
        review_episode(tmp_path / "nowhere", 0, verdict="pass")


def test_refused_while_saving(tmp_path: Path) -> None:
    root = _dataset(tmp_path, ROWS)
    marker = saving_marker(root, 1)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    assert not is_being_saved(root, 1)  # a leftover file without a holder does not block
    fd = os.open(marker, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(DatasetError, match="still being saved"):
            review_episode(root, 1, verdict="pass")
        review_episode(root, 0, verdict="pass")  # other episodes stay reviewable
    finally:
        os.close(fd)
    review_episode(root, 1, verdict="pass")


def test_cli_qc_and_list(tmp_path: Path) -> None:
    root = _dataset(tmp_path, ROWS)
    runner = CliRunner()
    r = runner.invoke(main, ["qc", str(root), "1", "--pass", "--note", "ok by operator"])
    assert r.exit_code == 0, r.output
    assert "accepted" in r.output
    r = runner.invoke(main, ["qc", str(root), "--list", "--json"])
    assert r.exit_code == 0, r.output
    entries = [json.loads(line) for line in r.output.splitlines()]
    assert [e["subset"] for e in entries] == ["accepted", "accepted"]
    assert entries[1]["issues"] == ["frozen_camera"]
    assert entries[1]["qc_note"] == "ok by operator"
    assert entries[1]["reason"] == "verdict pass (overrides red)"
    r = runner.invoke(main, ["qc", str(root), "--list"])
    assert r.exit_code == 0 and "frozen_camera" in r.output and "ok by operator" in r.output
    r = runner.invoke(main, ["qc", str(root), "0"])
    assert r.exit_code == 2
    r = runner.invoke(main, ["qc", str(root), "9", "--fail"])
    assert r.exit_code == 1 and "episode 9 does not exist" in r.output


def test_cli_qc_pass_and_fail_exclude_each_other(tmp_path: Path) -> None:
    root = _dataset(tmp_path, ROWS)
    r = CliRunner().invoke(main, ["qc", str(root), "0", "--pass", "--fail"])
    assert r.exit_code == 2 and "exclude" in r.output
    assert read_jsonl(root / layout.EPISODES) == ROWS


@pytest.mark.parametrize("bad", [{"episode_index": "1"}, {"episode_index": -1}, [1, 2], {}])
def test_cli_qc_list_refuses_a_malformed_row_in_one_line(tmp_path: Path, bad: object) -> None:
    root = _dataset(tmp_path, [ROWS[0], bad])
    r = CliRunner().invoke(main, ["qc", str(root), "--list"])
    assert r.exit_code == 1
    assert r.output.count("\n") == 1 and "episodes.jsonl: row 2: episode_index" in r.output
