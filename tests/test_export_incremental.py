"""Incremental re-export (hdf5, mcap): unchanged episode files are linked from the published pair,
the rest rewritten, and the result is the same bytes as a full export of the same source."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_export_executors import _synthetic_source
from test_golden_exports import export_manifest

from eva.dataset import layout
from eva.dataset.reader import DatasetReader
from eva.export.incremental import FINGERPRINTS
from eva.export.pipeline import ExportResult, export_dataset
from eva.formats.base import ExportOptions
from eva.formats.options import Hdf5Options, McapOptions

FORMATS = ("hdf5", "mcap")
OTHER_OPTIONS = {
    "hdf5": ExportOptions(format=Hdf5Options(compression="lzf")),
    "mcap": ExportOptions(format=McapOptions(compression="lz4")),
}


def _set_verdict(source: Path, episode: int, verdict: str) -> None:
    path = source / layout.EPISODES
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    rows[episode]["qc_verdict"] = verdict
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _incremental_then_full(
    source: Path, fmt: str, options: ExportOptions | None = None, executor: str = "serial"
) -> tuple[ExportResult, dict[str, str]]:
    """An incremental export, its tree, and the check that a full export of the same source
    writes the same tree."""
    root = layout.export_root(source, fmt)
    result = export_dataset(
        source, fmt, options=options, incremental=True, executor=executor, workers=2
    )
    tree = export_manifest(root)
    full = export_dataset(source, fmt, options=options)
    assert full.job.episodes_reused == 0 and full.job.episodes_rewritten == 5
    assert export_manifest(root) == tree
    assert full.job.warnings == result.job.warnings
    assert full.job.progress["bytes"] == result.job.progress["bytes"]
    return result, tree


def _counts(result: ExportResult) -> tuple[int, int]:
    return result.job.episodes_reused, result.job.episodes_rewritten


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_unchanged_source_reuses_every_episode_file(tmp_path: Path, fmt: str) -> None:
    source = _synthetic_source(tmp_path)
    first = export_dataset(source, fmt, incremental=True)  # nothing published yet
    assert _counts(first) == (0, 5)
    root = layout.export_root(source, fmt)
    episode = root / "accepted" / "data" / "chunk-000" / f"episode_000000.{fmt}"
    inode = episode.stat().st_ino
    again, _ = _incremental_then_full(source, fmt)
    assert _counts(again) == (5, 0)
    assert again.job.progress["episodes"] == 5
    # the full export wrote new files; the incremental one had linked the published ones
    assert episode.stat().st_ino != inode


@pytest.mark.parametrize("executor", ["serial", "processes"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_verdict_change_rewrites_only_the_episodes_it_renumbers(
    tmp_path: Path, fmt: str, executor: str
) -> None:
    source = _synthetic_source(tmp_path)
    export_dataset(source, fmt)
    # The last episode joins the accepted subset at its end and leaves the rejected one's end:
    # no other episode moves.
    _set_verdict(source, 4, "pass")
    last, _ = _incremental_then_full(source, fmt, executor=executor)
    assert _counts(last) == (4, 1)
    # Episode 1 (rejected 0) becomes accepted 1: accepted 1.. and rejected 0.. are renumbered.
    _set_verdict(source, 1, "pass")
    middle, _ = _incremental_then_full(source, fmt, executor=executor)
    assert _counts(middle) == (1, 4)  # accepted episode 0 alone keeps its index


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_touched_source_file_rewrites_its_episode(tmp_path: Path, fmt: str) -> None:
    source = _synthetic_source(tmp_path)
    export_dataset(source, fmt)
    reader = DatasetReader(source)
    video = reader.video_path(2, reader.video_keys[1])
    st = video.stat()
    os.utime(video, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    touched, _ = _incremental_then_full(source, fmt)
    assert _counts(touched) == (4, 1)


@pytest.mark.parametrize("fmt", FORMATS)
def test_other_format_options_reuse_nothing(tmp_path: Path, fmt: str) -> None:
    source = _synthetic_source(tmp_path)
    export_dataset(source, fmt)
    changed, _ = _incremental_then_full(source, fmt, OTHER_OPTIONS[fmt])
    assert _counts(changed) == (0, 5)


def test_a_published_file_replaced_since_is_rewritten(tmp_path: Path) -> None:
    source = _synthetic_source(tmp_path)
    export_dataset(source, "mcap")
    root = layout.export_root(source, "mcap")
    episode = root / "rejected" / "data" / "chunk-000" / "episode_000001.mcap"
    data = episode.read_bytes()
    episode.unlink()
    episode.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, another inode
    replaced, _ = _incremental_then_full(source, "mcap")
    assert _counts(replaced) == (4, 1)


def test_an_unreadable_record_reuses_nothing(tmp_path: Path) -> None:
    source = _synthetic_source(tmp_path)
    export_dataset(source, "hdf5")
    (layout.export_root(source, "hdf5") / FINGERPRINTS).write_text("{not json", encoding="utf-8")
    result, _ = _incremental_then_full(source, "hdf5")
    assert _counts(result) == (0, 5)


def test_eva_export_incremental_reports_reused_and_rewritten(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from eva.cli import main

    source = _synthetic_source(tmp_path)
    args = ["export", str(source), "--format", "mcap", "--incremental"]
    assert CliRunner().invoke(main, args).exit_code == 0
    _set_verdict(source, 4, "pass")
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    completed = json.loads(result.output.splitlines()[-1])
    assert (completed["episodes_reused"], completed["episodes_rewritten"]) == (4, 1)
    text = CliRunner().invoke(main, args)
    assert "episodes: 5 reused, 0 rewritten" in text.output
