"""Repair the metadata a save derives from its committed row (``eva cleanup DIR``).

An episode exists once its ``meta/episodes.jsonl`` row is there (the commit point). What the
writer writes after that row, the totals in ``meta/info.json`` and ``meta/stats.json``, follows
from the committed rows and their ``meta/episodes_stats.jsonl`` rows alone. A save killed (or out
of disk space) between the two leaves info.json behind the committed rows: validation reports
``totals_mismatch`` and says to run ``eva cleanup DIR``, which calls ``repair_metadata``. The next
capture that opens the dataset repairs it the same way.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from eva.dataset import atomic, layout
from eva.dataset.errors import DatasetError, error_line
from eva.dataset.locks import try_flock
from eva.dataset.reader import DatasetReader
from eva.dataset.stats import merge_stats

__all__ = ["MetadataNotUpdated", "derived_totals", "repair_metadata"]


class MetadataNotUpdated(DatasetError):
    """A save reached its commit point (the episode exists) but info.json / stats.json were not
    rewritten after it; ``eva cleanup`` (or the next capture) derives them from the rows."""

    def __init__(self, root: Path, episode_index: int, cause: BaseException) -> None:
        self.episode_index = episode_index
        super().__init__(
            f"episode {episode_index} committed; metadata not updated: {error_line(cause)}; "
            f"run eva cleanup {root} to repair it"
        )


def derived_totals(reader: DatasetReader) -> dict[str, Any]:
    """The info.json totals the committed rows give (what the writer would have written)."""
    indices = reader.episode_indices
    videos = sum(1 for f in reader.features.values() if f.get("dtype") == "video")
    chunks = {layout.episode_chunk(ep, reader.chunks_size) for ep in indices}
    return {
        "total_episodes": len(indices),
        "total_frames": reader.total_frames,
        "total_tasks": len(reader.tasks),
        "total_videos": len(indices) * videos,
        "total_chunks": max(chunks) + 1 if chunks else 0,
        "splits": {"train": f"0:{max(indices) + 1 if indices else 0}"},
    }


def repair_metadata(root: Path | str) -> list[str]:
    """Bring info.json totals and stats.json in line with the committed episodes.jsonl rows;
    returns one line per file rewritten (empty: nothing to repair, or no dataset at ``root``).

    Runs only while no writer has the dataset open (it keeps its own running state and repairs
    on open); one that opens meanwhile is refused as busy until this returns.
    """
    root = Path(root)
    if not (root / layout.INFO).is_file() or not (root / layout.EPISODES).is_file():
        return []
    lock = root / layout.WORK_DIR / layout.WRITER_LOCK
    fd: int | None = None
    if lock.is_file() and not lock.is_symlink():
        try:
            fd = try_flock(lock, create=False)
        except OSError:
            fd = -1  # unreadable lock (another account's dataset): repair without it
        if fd is None:
            return [f"{root}: a capture has the dataset open; it repairs the metadata itself"]
    try:
        return _repair(root)
    finally:
        if fd is not None and fd >= 0:
            os.close(fd)


def _repair(root: Path) -> list[str]:
    reader = DatasetReader(root)
    info = dict(reader.info)
    if len(set(reader.episode_indices)) != len(reader.episodes):
        raise DatasetError(f"{root / layout.EPISODES}: duplicate episode_index; not repairable")
    actions: list[str] = []
    expected = derived_totals(reader)
    # Only totals behind the rows are an interrupted save; others are reported by validate.
    changed = {
        k: v
        for k, v in expected.items()
        if k in ("total_episodes", "total_frames") and info.get(k) != v
    }
    if not changed:
        return actions
    stats_rows = reader.episodes_stats
    committed = {ep: stats_rows[ep] for ep in reader.episode_indices if ep in stats_rows}
    stats_path = root / layout.STATS
    with contextlib.suppress(DatasetError):
        if reader.stats == merge_stats(committed.values()):
            committed = {}
    if committed:
        atomic.atomic_write_json(stats_path, merge_stats(committed.values()))
        actions.append(f"{stats_path}: merged again from {len(committed)} committed episodes")
    old = ", ".join(f"{k} {info.get(k)!r} -> {v!r}" for k, v in changed.items())
    info.update(expected)
    atomic.atomic_write_json(root / layout.INFO, info)
    actions.append(f"{root / layout.INFO}: totals derived from episodes.jsonl ({old})")
    return actions
