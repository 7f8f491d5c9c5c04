"""Incremental re-export (hdf5, mcap, lerobot_v21, lerobot_v3): unchanged episode files (v3: shard
files) are linked from the published pair, the rest rewritten, and the result is the same bytes as
a full export of the same source."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_export_executors import CONFIGS, _synthetic_source
from test_golden_exports import export_manifest

from eva.dataset import layout
from eva.dataset.errors import DatasetError
from eva.dataset.reader import DatasetReader
from eva.export.incremental import FINGERPRINTS
from eva.export.pipeline import ExportResult, export_dataset
from eva.formats import catalog
from eva.formats.base import ExportOptions
from eva.formats.options import Hdf5Options, LeRobotV21Options, McapOptions

FORMATS = ("hdf5", "mcap", "lerobot_v21")
OTHER_OPTIONS = {
    "hdf5": ExportOptions(format=Hdf5Options(compression="lzf")),
    "mcap": ExportOptions(format=McapOptions(compression="lz4")),
    "lerobot_v21": ExportOptions(format=LeRobotV21Options(copy_videos=True)),
}
EXTENSIONS = {"hdf5": "hdf5", "mcap": "mcap", "lerobot_v21": "parquet"}


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
    root = catalog.parse(fmt).export_root(source)
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


def _counts(result: ExportResult) -> tuple[int, int, int]:
    """Episodes reused (linked), renumbered (copied and patched) and rewritten."""
    job = result.job
    return job.episodes_reused, job.episodes_renumbered, job.episodes_rewritten


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_unchanged_source_reuses_every_episode_file(tmp_path: Path, fmt: str) -> None:
    source = _synthetic_source(tmp_path)
    first = export_dataset(source, fmt, incremental=True)  # nothing published yet
    assert _counts(first) == (0, 0, 5)
    root = catalog.parse(fmt).export_root(source)
    # (accepted episode 1 is renumbered: a v2.1 export writes its table, not a link)
    episode = root / "accepted" / "data" / "chunk-000" / f"episode_000001.{EXTENSIONS[fmt]}"
    inode = episode.stat().st_ino
    again, _ = _incremental_then_full(source, fmt)
    assert _counts(again) == (5, 0, 0)
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
    assert _counts(last) == (4, 0, 1)
    # Episode 1 (rejected 0) becomes accepted 1: accepted 1.. and rejected 0.. are renumbered.
    _set_verdict(source, 1, "pass")
    middle, _ = _incremental_then_full(source, fmt, executor=executor)
    # accepted episode 0 alone keeps its index; source episode 1 changed subset: written; the
    # hdf5 and mcap files of the renumbered ones are copied and patched (v2.1: written)
    assert _counts(middle) == ((1, 0, 4) if fmt == "lerobot_v21" else (1, 3, 1))


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_touched_source_file_rewrites_its_episode(tmp_path: Path, fmt: str) -> None:
    source = _synthetic_source(tmp_path)
    export_dataset(source, fmt)
    reader = DatasetReader(source)
    video = reader.video_path(2, reader.video_keys[1])
    st = video.stat()
    os.utime(video, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    touched, _ = _incremental_then_full(source, fmt)
    assert _counts(touched) == (4, 0, 1)


@pytest.mark.parametrize("fmt", FORMATS)
def test_other_format_options_reuse_nothing(tmp_path: Path, fmt: str) -> None:
    source = _synthetic_source(tmp_path)
    export_dataset(source, fmt)
    changed, _ = _incremental_then_full(source, fmt, OTHER_OPTIONS[fmt])
    assert _counts(changed) == (0, 0, 5)


def test_a_published_file_replaced_since_is_rewritten(tmp_path: Path) -> None:
    source = _synthetic_source(tmp_path)
    export_dataset(source, "mcap")
    root = catalog.parse("mcap").export_root(source)
    episode = root / "rejected" / "data" / "chunk-000" / "episode_000001.mcap"
    data = episode.read_bytes()
    episode.unlink()
    episode.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, another inode
    replaced, _ = _incremental_then_full(source, "mcap")
    assert _counts(replaced) == (4, 0, 1)


def test_an_unreadable_record_reuses_nothing(tmp_path: Path) -> None:
    source = _synthetic_source(tmp_path)
    export_dataset(source, "hdf5")
    (catalog.parse("hdf5").export_root(source) / FINGERPRINTS).write_text(
        "{not json", encoding="utf-8"
    )
    result, _ = _incremental_then_full(source, "hdf5")
    assert _counts(result) == (0, 0, 5)


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
    counts = [completed[f"episodes_{n}"] for n in ("reused", "renumbered", "rewritten")]
    assert counts == [4, 0, 1]
    text = CliRunner().invoke(main, args)
    assert "episodes: 5 reused, 0 renumbered, 0 rewritten" in text.output


V3 = CONFIGS["lerobot_v3"][1]  # small files: one or two episodes each


def _files(root: Path) -> dict[str, int]:
    """Every file of the published pair -> its inode."""
    return {p.relative_to(root).as_posix(): p.stat().st_ino for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("executor", ["serial", "processes"])
def test_v3_files_before_the_first_changed_episode_are_reused(
    tmp_path: Path, executor: str
) -> None:
    source = _synthetic_source(tmp_path)
    root = catalog.parse("lerobot_v3").export_root(source)
    first = export_dataset(source, "lerobot_v3", options=V3, incremental=True)
    assert _counts(first) == (0, 0, 5)
    unchanged, _ = _incremental_then_full(source, "lerobot_v3", V3, executor)
    assert _counts(unchanged) == (5, 0, 0)
    before = _files(root)
    # Source episode 4 joins the accepted subset at its end (accepted episode 3): every
    # accepted file stays but the last data file, which takes the new episode (its video
    # files are new ones); the rejected subset loses its episode 1, its first files stay.
    _set_verdict(source, 4, "pass")
    result = export_dataset(source, "lerobot_v3", options=V3, incremental=True, executor=executor)
    after = _files(root)
    # the pair's data files only: job.json is written after the old pair is removed, and a
    # new file may be given an inode number freed a moment before (the old job.json's)
    kept = sorted(
        p
        for p in after
        if p.startswith(("accepted/", "rejected/"))
        and "/meta/" not in p
        and before.get(p) == after[p]
    )
    assert kept == [
        "accepted/data/chunk-000/file-000.parquet",
        "accepted/videos/observation.images.cam0/chunk-000/file-000.mp4",
        "accepted/videos/observation.images.cam0/chunk-000/file-001.mp4",
        "accepted/videos/observation.images.cam0/chunk-000/file-002.mp4",
        "accepted/videos/observation.images.cam1/chunk-000/file-000.mp4",
        "accepted/videos/observation.images.cam1/chunk-000/file-001.mp4",
        "accepted/videos/observation.images.cam1/chunk-000/file-002.mp4",
        "rejected/data/chunk-000/file-000.parquet",
        "rejected/videos/observation.images.cam0/chunk-000/file-000.mp4",
        "rejected/videos/observation.images.cam1/chunk-000/file-000.mp4",
    ]
    assert _counts(result) == (3, 0, 2)
    tree = export_manifest(root)
    full = export_dataset(source, "lerobot_v3", options=V3)
    assert export_manifest(root) == tree
    assert full.job.progress["bytes"] == result.job.progress["bytes"]


def test_v3_a_middle_verdict_change_gives_the_full_export_bytes(tmp_path: Path) -> None:
    source = _synthetic_source(tmp_path)
    export_dataset(source, "lerobot_v3", options=V3)
    _set_verdict(source, 1, "pass")  # accepted 1.. and rejected 0.. are renumbered
    middle, _ = _incremental_then_full(source, "lerobot_v3", V3)
    # accepted episode 0 keeps its index, but its data file now takes accepted episode 1 too
    assert _counts(middle) == (0, 0, 5)
    # a touched source video: the data file of its episode (accepted 2, with accepted 3) and
    # its video files are written again, the rest linked
    reader = DatasetReader(source)
    video = reader.video_path(2, reader.video_keys[1])
    st = video.stat()
    os.utime(video, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    touched, _ = _incremental_then_full(source, "lerobot_v3", V3)
    assert _counts(touched) == (3, 0, 2)
    # other options: nothing reused
    changed, _ = _incremental_then_full(source, "lerobot_v3")
    assert _counts(changed) == (0, 0, 5)


# ---- the MP4 checks of an unchanged source ----------------------------------------------------


def _counting_inspections(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    from eva.dataset import decode_check, mp4box

    monkeypatch.setattr(mp4box, "SETTLED_NS", 0)  # the files were written just now
    inspected: list[str] = []
    inspect = decode_check.inspect_video

    def counting(path: Path | str, keyframes: int = 1) -> int:
        inspected.append(str(path))
        return inspect(path, keyframes)

    monkeypatch.setattr(decode_check, "inspect_video", counting)
    return inspected


@pytest.mark.parametrize("fmt", ["lerobot_v3", "hdf5"])
def test_an_incremental_export_inspects_only_the_mp4s_changed_since(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    from eva.export.incremental import VIDEO_CHECKS

    inspected = _counting_inspections(monkeypatch)
    source = _synthetic_source(tmp_path)
    export_dataset(source, fmt)  # a full export records what it found intact
    assert len(inspected) == 10
    root = catalog.parse(fmt).export_root(source)
    record = json.loads((root / VIDEO_CHECKS).read_text())["videos"]
    reader = DatasetReader(source)
    video = reader.video_path(3, reader.video_keys[0])
    assert sorted(record) == sorted(p.relative_to(source).as_posix() for p in source.rglob("*.mp4"))
    inspected.clear()
    tree = export_manifest(root)
    export_dataset(source, fmt, incremental=True)
    assert inspected == []  # every MP4 is the one inspected then
    assert export_manifest(root) == tree
    export_dataset(source, fmt)  # a full export inspects everything, whatever the record says
    assert len(inspected) == 10
    # damaged in place, size and mtime put back: the ctime still tells
    st = video.stat()
    with open(video, "r+b") as f:
        f.seek(st.st_size // 2)
        f.write(bytes(st.st_size // 4))
    os.utime(video, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (video.stat().st_size, video.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    inspected.clear()
    with pytest.raises(DatasetError, match=str(video)):
        export_dataset(source, fmt, incremental=True)
    assert inspected == [str(video)]
    assert export_manifest(root) == tree  # the published pair stays


def test_a_forged_or_stale_record_vouches_for_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eva.export.incremental import VIDEO_CHECKS

    inspected = _counting_inspections(monkeypatch)
    source = _synthetic_source(tmp_path)
    export_dataset(source, "lerobot_v3")
    root = catalog.parse("lerobot_v3").export_root(source)
    path = root / VIDEO_CHECKS
    data = json.loads(path.read_text())
    names = sorted(data["videos"])
    data["videos"][names[0]][3] += 1  # another inode
    data["videos"][names[1]] = "yes"
    data["videos"][names[2]] = [*data["videos"][names[2]], 1]
    data["videos"]["../../etc/passwd"] = data["videos"][names[3]]
    path.write_text(json.dumps(data))
    inspected.clear()
    export_dataset(source, "lerobot_v3", incremental=True)
    assert sorted(inspected) == [str(source / n) for n in names[:3]]
    path.write_text(json.dumps({**data, "version": 99}))
    inspected.clear()
    export_dataset(source, "lerobot_v3", incremental=True)
    assert len(inspected) == 10
