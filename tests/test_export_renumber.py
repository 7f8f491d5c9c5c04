"""Renumbered reuse (``eva.formats._renumber``): after a verdict change in the middle of the
dataset, the later episodes of both subsets are copied from the published pair and their
numbering patched; the trees (sha256 of every file) are those of a full export of the changed
source, and whatever cannot be patched exactly (another subset, compressed items, the foxglove
profile, a published file that is not what was recorded) is written anew."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import h5py
import pytest
from test_export_executors import CONFIGS, _synthetic_source
from test_export_incremental import _counts, _set_verdict
from test_golden_exports import export_manifest

from eva.dataset.errors import WriteError
from eva.export.incremental import FINGERPRINTS, previous_task, read_fingerprints
from eva.export.pipeline import ExportResult, export_dataset, prepare
from eva.formats import catalog
from eva.formats.base import ExportOptions
from eva.formats.options import Hdf5Options, McapOptions

RENUMBERING = ("hdf5", "mcap")
COMPRESSED = {
    "hdf5": ExportOptions(format=Hdf5Options(compression="gzip:1")),
    "mcap": ExportOptions(format=McapOptions(compression="zstd")),
}


def _middle_change(
    source: Path, fmt: str, options: ExportOptions | None = None
) -> tuple[ExportResult, dict[str, str]]:
    """Source episode 1 (rejected 0) becomes accepted 1: accepted 1.. and rejected 0.. are
    renumbered. The incremental export's tree must be a full export's of the changed source."""
    root = catalog.parse(fmt).export_root(source)
    _set_verdict(source, 1, "pass")
    result = export_dataset(source, fmt, options=options, incremental=True)
    tree = export_manifest(root)
    full = export_dataset(source, fmt, options=options)
    assert export_manifest(root) == tree
    assert any(path.startswith("accepted/data/") for path in tree)
    assert full.job.progress["bytes"] == result.job.progress["bytes"]
    assert full.job.progress["files"] == result.job.progress["files"]
    assert full.job.warnings == result.job.warnings
    return result, tree


@pytest.mark.parametrize("config", ["hdf5", "mcap", "mcap-foxglove"])
def test_a_middle_verdict_change_gives_a_full_exports_bytes(tmp_path: Path, config: str) -> None:
    fmt, options = CONFIGS[config]
    source = _synthetic_source(tmp_path)
    export_dataset(source, fmt, options=options)
    result, _ = _middle_change(source, fmt, options)
    # accepted 0 linked; source episode 1 changed subset: written (a renumbered reuse never
    # crosses subsets); accepted 2, 3 and rejected 0 copied and patched. The foxglove profile
    # writes its frame columns as JSON, whose lengths follow the digits: written.
    assert _counts(result) == ((1, 0, 4) if config == "mcap-foxglove" else (1, 3, 1))


@pytest.mark.parametrize("fmt", RENUMBERING)
def test_an_episode_changing_subset_at_the_same_index_is_written(tmp_path: Path, fmt: str) -> None:
    source = _synthetic_source(tmp_path)
    export_dataset(source, fmt)
    root = catalog.parse(fmt).export_root(source)
    # source episode 0, rejected 0, becomes accepted 0: the same index, offset and path in
    # the other subset, written; sources 2, 3 move to accepted 1, 2 and 1, 4 to rejected 0, 1
    _set_verdict(source, 0, "fail")
    export_dataset(source, fmt)
    _set_verdict(source, 0, "pass")
    result = export_dataset(source, fmt, incremental=True)
    tree = export_manifest(root)
    assert _counts(result) == (0, 4, 1)
    export_dataset(source, fmt)
    assert export_manifest(root) == tree


@pytest.mark.parametrize("fmt", RENUMBERING)
def test_renumbered_files_are_new_files_and_the_published_ones_are_untouched(
    tmp_path: Path, fmt: str
) -> None:
    source = _synthetic_source(tmp_path)
    export_dataset(source, fmt)
    root = catalog.parse(fmt).export_root(source)
    published = {p: p.read_bytes() for p in (root / "accepted" / "data").rglob("*.*")}
    _set_verdict(source, 1, "pass")
    reader, _, metas, _ = prepare(source)
    episodes = importlib.import_module(f"eva.formats.{fmt}").TASKS  # an EpisodeFormat
    staging = tmp_path / "staging"
    tasks = episodes.subset_tasks(reader, metas["accepted"], staging, ExportOptions())
    task = tasks[2]  # source episode 2, published as accepted 1
    key = f"accepted/{Path(str(tasks[1].path))}"
    entry = read_fingerprints(root)[key]
    previous = previous_task(task, key, entry)
    assert (previous.index, task.index) == (1, 2)
    renumber = episodes.renumber
    result = renumber(reader, task, previous, root / key)
    assert result is not None and result.path == task.path
    staged = staging / task.path
    assert staged.stat().st_ino != (root / key).stat().st_ino
    assert staged.stat().st_nlink == 1
    assert {p: p.read_bytes() for p in published} == published  # the published pair as it was
    # a staged file is never replaced: a second renumber into it is refused
    with pytest.raises(WriteError, match="File exists"):
        renumber(reader, task, previous, root / key)


@pytest.mark.parametrize("published_with", ["the same compressed options", "the defaults"])
@pytest.mark.parametrize("fmt", RENUMBERING)
def test_compressed_files_and_other_options_are_written_not_patched(
    tmp_path: Path, fmt: str, published_with: str
) -> None:
    source = _synthetic_source(tmp_path)
    compressed = published_with != "the defaults"
    export_dataset(source, fmt, options=COMPRESSED[fmt] if compressed else None)
    result, _ = _middle_change(source, fmt, COMPRESSED[fmt])
    # compressed items or chunks are not patched in place; other options reuse nothing
    assert _counts(result) == ((1, 0, 4) if compressed else (0, 0, 5))


@pytest.mark.parametrize(
    "tampering", ["an older record version", "a path out of the subset", "a bad task remap"]
)
def test_a_record_that_does_not_say_how_a_file_was_numbered_is_not_followed(
    tmp_path: Path, tampering: str
) -> None:
    source = _synthetic_source(tmp_path)
    export_dataset(source, "hdf5")
    record = catalog.parse("hdf5").export_root(source) / FINGERPRINTS
    data = json.loads(record.read_text(encoding="utf-8"))
    episodes = data["episodes"]
    key = "accepted/data/chunk-000/episode_000001.hdf5"  # source episode 2, renumbered next
    if tampering == "an older record version":
        data["version"] = 1  # a version-1 record (before renumbering) reuses nothing
    elif tampering == "a path out of the subset":
        episodes["accepted/../accepted/" + key.partition("/")[2]] = episodes.pop(key)
    else:
        episodes[key]["numbering"]["task_remap"] = [[None, 0]]
    record.write_text(json.dumps(data), encoding="utf-8")
    result, _ = _middle_change(source, "hdf5")
    assert _counts(result) == ((0, 0, 5) if tampering == "an older record version" else (1, 2, 2))


def _overwrite_keeping_identity(path: Path, offset: int, data: bytes) -> None:
    """``data`` at ``offset`` in place: same inode, size and mtime, as a careless tool might."""
    st = path.stat()
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _hdf5_offset(path: Path, group: str, key: str) -> int:
    with h5py.File(path, "r") as h5:
        for name in h5[group]:
            if h5[group][name].attrs["key"] == key:
                return int(h5[group][name]["value"].id.get_offset())
    raise KeyError(key)


def _published(source: Path, fmt: str, subset: str, index: int) -> Path:
    return (
        catalog.parse(fmt).export_root(source)
        / subset
        / "data"
        / "chunk-000"
        / (f"episode_{index:06d}.{fmt}")
    )


@pytest.mark.parametrize("fmt", RENUMBERING)
def test_a_truncated_published_file_is_written_anew(tmp_path: Path, fmt: str) -> None:
    source = _synthetic_source(tmp_path)
    export_dataset(source, fmt)
    episode = _published(source, fmt, "accepted", 1)
    os.truncate(episode, episode.stat().st_size - 100)
    result, _ = _middle_change(source, fmt)
    assert _counts(result) == (1, 2, 2)


def test_an_hdf5_file_changed_in_place_at_a_patch_site_is_written_anew(tmp_path: Path) -> None:
    source = _synthetic_source(tmp_path)
    export_dataset(source, "hdf5")
    episode = _published(source, "hdf5", "accepted", 1)
    offset = _hdf5_offset(episode, "columns", "index")
    _overwrite_keeping_identity(episode, offset, (999).to_bytes(8, "little"))
    result, _ = _middle_change(source, "hdf5")
    assert _counts(result) == (1, 2, 2)


@pytest.mark.parametrize("where", ["episode message", "frame in its chunk"])
def test_an_mcap_file_changed_in_place_in_its_first_chunk_is_written_anew(
    tmp_path: Path, where: str
) -> None:
    from eva.formats.mcap.renumber import _first_chunk

    source = _synthetic_source(tmp_path)
    export_dataset(source, "mcap")
    episode = _published(source, "mcap", "rejected", 1)
    fd = os.open(episode, os.O_RDONLY)
    try:
        _, _, records_at, records_size = _first_chunk(fd)
        offset = records_at + (40 if where == "episode message" else records_size - 10)
        old = os.pread(fd, 1, offset)
    finally:
        os.close(fd)
    # the episode message by its payload check, a frame by the chunk's CRC
    _overwrite_keeping_identity(episode, offset, bytes([old[0] ^ 0xFF]))
    result, _ = _middle_change(source, "mcap")
    assert _counts(result) == (1, 2, 2)


def test_a_renumbered_episode_crossing_a_messagepack_width_is_written(tmp_path: Path) -> None:
    """metadata.episode_index 128 -> 127 is one byte shorter in MessagePack: no patch of the
    same length exists, the file is written (and the rest of the subset renumbered)."""
    from eva.capture.synthetic import write_synthetic_dataset

    count = 131
    source = write_synthetic_dataset(
        tmp_path / "raw",
        episodes=count,
        frames=2,
        cameras=1,
        width=32,
        height=24,
        qc_verdicts=["pass"] * count,
        seed=5,
    )
    export_dataset(source, "mcap")
    _set_verdict(source, 126, "fail")  # accepted 127.. become 126..
    root = catalog.parse("mcap").export_root(source)
    result = export_dataset(source, "mcap", incremental=True)
    tree = export_manifest(root)
    export_dataset(source, "mcap")
    assert export_manifest(root) == tree
    # 0..125 linked; 126 moved subset and 128 -> 127 changed width: written; 127, 129, 130
    assert _counts(result) == (126, 3, 2)
