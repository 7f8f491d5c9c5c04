"""Reuse needs proof: a file rewritten in place, its size, mtime and inode put back, is never
reused by an incremental export (its ctime tells: ``eva.dataset.identity``), and the result is
the full export's; eva's own links (a v2.1 export links the raw MP4s) do not stop the reuse."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from test_export_executors import CONFIGS, _synthetic_source
from test_golden_exports import export_manifest

from eva.dataset import layout
from eva.dataset.identity import file_identity
from eva.dataset.reader import DatasetReader
from eva.export.pipeline import ExportResult, export_dataset
from eva.formats import catalog
from eva.formats.base import ExportOptions

FORMATS = ("hdf5", "mcap", "lerobot_v21", "lerobot_v3")
EPISODE = 2  # the source episode rewritten in place (accepted episode 1)


def _options(fmt: str) -> ExportOptions | None:
    return CONFIGS[fmt][1] if fmt == "lerobot_v3" else None


def _counts(result: ExportResult) -> tuple[int, int, int]:
    job = result.job
    return job.episodes_reused, job.episodes_renumbered, job.episodes_rewritten


def _plain_parquet(table: object) -> bytes:
    """``table`` as a parquet file whose size does not depend on its values."""
    out = io.BytesIO()
    pq.write_table(table, out, compression="none", use_dictionary=False, write_statistics=False)
    return out.getvalue()


def _write_in_place(path: Path, data: bytes) -> None:
    """``data`` written through ``path`` (the same inode), its size and mtime put back: only
    the ctime shows the rewrite."""
    before = os.stat(path)
    assert len(data) == before.st_size
    mode = before.st_mode & 0o7777
    os.chmod(path, mode | 0o200)  # committed files are read-only; the rewriter does not care
    with open(path, "r+b") as f:
        f.write(data)
    os.chmod(path, mode)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns, after.st_ino, after.st_dev) == (
        before.st_size,
        before.st_mtime_ns,
        before.st_ino,
        before.st_dev,
    )
    assert after.st_ctime_ns != before.st_ctime_ns


def _changed_parquet(source: Path) -> tuple[Path, bytes]:
    """The data file of ``EPISODE`` replaced by a size-stable copy of itself (a new file, as a
    writer would), and bytes of the same size with one action value changed."""
    path = DatasetReader(source).data_path(EPISODE)
    table = pq.read_table(path)
    original = _plain_parquet(table)
    column = table.column("action").combine_chunks()
    values = column.values.to_numpy(zero_copy_only=False).copy()
    values[0] += 1.0
    changed = table.set_column(
        table.schema.get_field_index("action"),
        "action",
        type(column).from_arrays(pc.cast(values, column.type.value_type), column.type.list_size),
    )
    data = _plain_parquet(changed)
    assert len(data) == len(original) and data != original
    mode = os.stat(path).st_mode & 0o7777
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(original)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return path, data


@pytest.mark.parametrize("kind", ["parquet", "mp4"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_source_rewritten_in_place_is_exported_again(tmp_path: Path, fmt: str, kind: str) -> None:
    source = _synthetic_source(tmp_path)
    options = _options(fmt)
    root = catalog.parse(fmt).export_root(source)
    if kind == "parquet":
        path, data = _changed_parquet(source)
    else:  # the same bytes written again: nothing but the ctime says it is the same file
        reader = DatasetReader(source)
        path = reader.video_path(EPISODE, reader.video_keys[1])
        data = path.read_bytes()
    export_dataset(source, fmt, options=options)
    # the record is settled after eva's own links: an unchanged source reuses everything,
    # twice in a row (a v2.1 export links the raw MP4s, the old pair's removal unlinks them)
    for _ in range(2):
        assert _counts(export_dataset(source, fmt, options=options, incremental=True)) == (5, 0, 0)
    _write_in_place(path, data)
    again = export_dataset(source, fmt, options=options, incremental=True)
    reused, renumbered, rewritten = _counts(again)
    assert renumbered == 0 and rewritten >= 1 and reused + rewritten == 5
    if fmt != "lerobot_v3":  # (v3: the shards holding the episode, and those after it)
        assert rewritten == 1
    tree = export_manifest(root)
    full = export_dataset(source, fmt, options=options)
    assert export_manifest(root) == tree
    assert full.job.progress["bytes"] == again.job.progress["bytes"]


def test_a_published_file_rewritten_in_place_is_not_reused(tmp_path: Path) -> None:
    source = _synthetic_source(tmp_path)
    export_dataset(source, "hdf5")
    root = catalog.parse("hdf5").export_root(source)
    published = root / "accepted" / "data" / "chunk-000" / "episode_000001.hdf5"
    _write_in_place(published, published.read_bytes())
    again = export_dataset(source, "hdf5", incremental=True)
    assert _counts(again) == (4, 0, 1)


def test_a_link_made_by_another_program_costs_one_export(tmp_path: Path) -> None:
    """A hard link made outside eva moves the ctime as a rewrite would: the episode is written
    again (reuse needs proof), and reused again after that."""
    source = _synthetic_source(tmp_path)
    export_dataset(source, "mcap")
    reader = DatasetReader(source)
    video = reader.video_path(EPISODE, reader.video_keys[0])
    before = file_identity(video)
    os.link(video, tmp_path / "backup.mp4")
    assert before is not None and file_identity(video) != before
    assert _counts(export_dataset(source, "mcap", incremental=True)) == (4, 0, 1)
    assert _counts(export_dataset(source, "mcap", incremental=True)) == (5, 0, 0)


def test_the_console_video_lookup_sees_info_rewritten_in_place(
    synthetic_dataset,  # noqa: ANN001
) -> None:
    """The console remembers where an episode's MP4 is while info.json and episodes.jsonl keep
    their identity: an info.json rewritten in place (size, mtime and inode put back) whose
    template now names another file is read again, and that file is served."""
    import shutil

    from eva.config import config_from_dict
    from eva.console.datasets import DatasetDirs
    from eva.console.review import EpisodeReview

    raw = synthetic_dataset(name="site/raw", episodes=1, frames=[8])
    config = config_from_dict(
        {"collection": {"log_dir": str(raw.parent.parent), "tasks": {"site": ["a"]}}}
    )
    review = EpisodeReview(DatasetDirs(config.collection), lambda: None)
    key = DatasetReader(raw).video_keys[0]
    original = DatasetReader(raw).video_path(0, key)

    def served() -> int:
        fd = review.video_fd("site", 0, key)
        try:
            return os.fstat(fd).st_ino
        finally:
            os.close(fd)

    assert served() == os.stat(original).st_ino  # the place is remembered from here on
    moved = raw / "vidzzz" / original.relative_to(raw / "videos")
    moved.parent.mkdir(parents=True)
    shutil.copyfile(original, moved)
    info = raw / layout.INFO
    text = info.read_bytes()
    assert text.count(b'"videos/chunk-') == 1
    _write_in_place(info, text.replace(b'"videos/chunk-', b'"vidzzz/chunk-'))
    assert served() == os.stat(moved).st_ino
