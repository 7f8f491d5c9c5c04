"""Write the merged dataset into its staging directory (``eva.dataset.merge`` checks, stages and
publishes; this module only writes).

Episode by episode, in the order the sessions were given: the parquet table is read, its
columns renamed (``--map``), ``episode_index``/``index``/``task_index`` renumbered
(``subset.rewrite_index_columns``) and written anew; each MP4 is copied to a new inode
(``share.copy_file``: a reflink where the filesystem has them, else ``copy_file_range``, never
a hard link, so nothing written to the merged dataset can reach a source). Both are made
read-only like the files a capture commits. The episodes.jsonl row keeps every field (verdicts,
notes, quality issues, edits, fields eva does not know) with its new ``episode_index`` and a
``source_session`` naming where it was recorded. The metadata (tasks unioned, per-episode stats
renumbered, stats merged, the image histograms sidecar renamed) is written last, by
``subset.write_common_meta``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from eva.dataset import fsafe, layout
from eva.dataset.errors import naming_write_errors
from eva.dataset.features import huggingface_schema_metadata
from eva.dataset.reader import DatasetReader
from eva.dataset.share import copy_file
from eva.dataset.subset import (
    SubsetMeta,
    renumbered_stats,
    rewrite_index_columns,
    subset_info,
    write_common_meta,
)

__all__ = ["SOURCE_SESSION", "Session", "WrittenMerge", "write_merged"]

# The episodes.jsonl field naming where a merged episode was recorded (docs/formats.md).
SOURCE_SESSION = "source_session"


@dataclass(frozen=True)
class Session:
    """One source of the merge: its dataset (``root`` resolved, ``reader`` its snapshot) and its
    renames ``{old key: new key}``."""

    root: Path
    reader: DatasetReader
    renames: Mapping[str, str]

    def key(self, name: str) -> str:
        return self.renames.get(name, name)


@dataclass(frozen=True)
class WrittenMerge:
    episodes: int
    frames: int
    tasks: int
    video_bytes: int


def _union_tasks(sessions: Sequence[Session]) -> tuple[dict[int, str], list[dict[int, int]]]:
    """The merged task table (each text once, numbered in session order) and each session's
    remap {its task_index: merged task_index}."""
    merged: dict[str, int] = {}
    remaps: list[dict[int, int]] = []
    for session in sessions:
        remap: dict[int, int] = {}
        for index, text in sorted(session.reader.tasks.items()):
            remap[index] = merged.setdefault(text, len(merged))
        remaps.append(remap)
    return {i: text for text, i in merged.items()}, remaps


def _merged_info(sessions: Sequence[Session]) -> dict[str, Any]:
    """The first session's info.json with its features renamed (the totals come later)."""
    first = sessions[0]
    info = copy.deepcopy(first.reader.info)
    info["features"] = {first.key(k): v for k, v in info.get("features", {}).items()}
    return info


@dataclass
class _Merging:
    """What the episodes written so far add up to."""

    staging: Path
    info: dict[str, Any]
    on_episode: Callable[[int, int], None] | None
    total: int
    rows: list[dict[str, Any]]
    lengths: list[int]
    offsets: list[int]
    stats: dict[int, Any]
    histograms: dict[int, dict[str, np.ndarray]]
    # The MP4 copies run on their own thread (``copy_file_range`` leaves the GIL) while this
    # one rewrites the tables.
    copier: ThreadPoolExecutor
    copies: list[Future[int]] = field(default_factory=list)

    def copied_bytes(self) -> int:
        """Wait for every copy; the first failure raises (the others are waited for first)."""
        wait(self.copies)
        return sum(pending.result() for pending in self.copies)

    @property
    def next_index(self) -> int:
        return len(self.rows)

    @property
    def next_offset(self) -> int:
        return int(sum(self.lengths))

    def path(self, template_field: str, **fields: object) -> Path:
        chunk = self.next_index // int(self.info.get("chunks_size", layout.DEFAULT_CHUNKS_SIZE))
        rel = layout.format_path_template(
            self.info[template_field], episode_chunk=chunk, episode_index=self.next_index, **fields
        )
        dest = fsafe.contained(self.staging, rel, template_field)
        dest.parent.mkdir(parents=True, exist_ok=True)
        return dest


def _renamed_table(session: Session, table: pa.Table, features: Mapping[str, Any]) -> pa.Table:
    names = [session.key(c) for c in table.column_names]
    if names == table.column_names:
        return table
    table = table.rename_columns(names)
    return table.replace_schema_metadata({"huggingface": huggingface_schema_metadata(features)})


def _write_table(
    merging: _Merging, session: Session, ep: int, remap: Mapping[int, int]
) -> np.ndarray:
    """Episode ``ep`` of ``session``'s table as the next merged episode; returns its source
    ``task_index`` values (for the renumbered stats)."""
    reader = session.reader
    table = reader.read_table(ep)
    tasks = table.column("task_index").to_numpy() if "task_index" in table.column_names else None
    table = _renamed_table(session, table, merging.info["features"])
    table = rewrite_index_columns(
        table, merging.next_index, merging.next_offset, remap, where=f"{reader.data_path(ep)}"
    )
    dest = merging.path("data_path")
    with naming_write_errors(dest):
        pq.write_table(table, dest, use_dictionary=False)  # as the v2.1 export writes them
    fsafe.make_read_only(dest)
    return np.asarray(tasks if tasks is not None else [], dtype=np.int64)


def _copy_video(source: fsafe.FileBeneath, dest: Path) -> int:
    copied = copy_file(source, dest)
    fsafe.make_read_only(dest)
    return copied


def _copy_videos(merging: _Merging, session: Session, ep: int) -> None:
    for key in session.reader.video_keys:
        dest = merging.path("video_path", video_key=session.key(key))
        source = session.reader.video_file(ep, key)
        pending = merging.copier.submit(_copy_video, source, dest)
        merging.copies.append(pending)


def _add_episode(merging: _Merging, session: Session, ep: int, remap: Mapping[int, int]) -> None:
    reader = session.reader
    new, offset = merging.next_index, merging.next_offset
    task_values = _write_table(merging, session, ep, remap)
    _copy_videos(merging, session, ep)
    row = dict(reader.episode(ep))
    length = reader.length(ep)
    row["episode_index"] = new
    if isinstance(row.get("video_keys"), list):
        row["video_keys"] = [session.key(k) if isinstance(k, str) else k for k in row["video_keys"]]
    # A merged session's episodes keep the session they were recorded in.
    row.setdefault(SOURCE_SESSION, {"dataset": str(session.root), "episode_index": ep})
    stats = {session.key(k): v for k, v in reader.episodes_stats.get(ep, {}).items()}
    merging.stats[new] = renumbered_stats(stats, new, offset, length, task_values, remap)
    histograms = reader.image_histograms(ep)
    if histograms:
        merging.histograms[new] = {session.key(k): h for k, h in histograms.items()}
    merging.rows.append(row)
    merging.lengths.append(length)
    merging.offsets.append(offset)
    if merging.on_episode is not None:
        merging.on_episode(len(merging.rows), merging.total)


def write_merged(
    staging: Path,
    sessions: Sequence[Session],
    *,
    on_episode: Callable[[int, int], None] | None = None,
) -> WrittenMerge:
    """Write the merge of ``sessions`` (checked to be one rig) into the empty dir ``staging``."""
    from eva.dataset.stats_merge import merge_stats

    tasks, remaps = _union_tasks(sessions)
    info = _merged_info(sessions)
    total = sum(len(s.reader.episode_indices) for s in sessions)
    with ThreadPoolExecutor(1, thread_name_prefix="eva-merge-copy") as copier:
        merging = _Merging(staging, info, on_episode, total, [], [], [], {}, {}, copier)
        try:
            for session, remap in zip(sessions, remaps, strict=True):
                for ep in session.reader.episode_indices:
                    _add_episode(merging, session, ep, remap)
        except BaseException:
            for pending in merging.copies:
                pending.cancel()
            raise
        video_bytes = merging.copied_bytes()
    n = len(merging.rows)
    video_keys = [k for k, f in info["features"].items() if f.get("dtype") == "video"]
    meta = SubsetMeta(
        subset="merged",
        source_episode_indices=list(range(n)),
        episodes=merging.rows,
        lengths=merging.lengths,
        index_offsets=merging.offsets,
        tasks=tasks,
        task_remap={},
        episodes_stats=merging.stats,
        stats=merge_stats([merging.stats[i] for i in range(n)]) if n else {},
        info=subset_info(info, n, merging.next_offset, len(tasks), video_keys),
        video_keys=video_keys,
        image_histograms=merging.histograms,
    )
    write_common_meta(staging, meta, meta.info)
    return WrittenMerge(n, merging.next_offset, len(tasks), video_bytes)
