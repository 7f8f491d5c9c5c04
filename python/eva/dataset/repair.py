"""Crash repair of a raw dataset: what a killed save, writer or ``eva qc`` leaves behind.

Metadata a save derives from its committed row (``eva cleanup DIR``, and every writer's open).

An episode exists once its ``meta/episodes.jsonl`` row is there (the commit point). What the
writer writes after that row, the totals in ``meta/info.json`` and ``meta/stats.json``, follows
from the committed rows and their ``meta/episodes_stats.jsonl`` rows alone. A save killed (or out
of disk space) between the two leaves info.json behind the committed rows: validation reports
``totals_mismatch`` and says to run ``eva cleanup DIR``, which calls ``repair_metadata``. The next
capture that opens the dataset repairs it the same way (``repair_after_crash``: it also drops
per-episode stats and image histograms of episodes that never reached their commit point).

Temporaries: ``.eva-tmp-*`` files in ``meta/`` and ``data/chunk-*/`` of a killed writer or qc
(``remove_stale_temporaries``, never a live writer's) and a killed writer's episode work
directories (``clean_stale_work``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from eva.dataset import atomic, fsafe, layout, spool
from eva.dataset.errors import DatasetError, error_line
from eva.dataset.locks import meta_lock, try_flock
from eva.dataset.reader import DatasetReader
from eva.dataset.stats_merge import RunningMerge, merge_stats

__all__ = [
    "MetadataNotUpdated",
    "clean_stale_work",
    "derived_totals",
    "read_meta_json",
    "read_meta_jsonl",
    "remove_stale_temporaries",
    "remove_temporaries_as_writer",
    "repair_after_crash",
    "repair_metadata",
]

# The start of an eva_image_histograms.jsonl row (json.dumps of {"episode_index": N, ...}).
_HISTOGRAM_ROW_START = re.compile(rb'\{"episode_index": (\d+),')


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


def read_meta_json(path: Path) -> Any:
    """A metadata JSON file (info.json, stats.json) the writer will write back; a
    ``DatasetError`` naming it otherwise. A hand-edited ``NaN`` is refused here, when the
    writer opens the dataset, not after it has recorded an episode (``atomic.NotJSONError``)."""
    try:
        value = json.loads(fsafe.read_bytes(path).decode("utf-8"))
    except OSError as e:
        raise DatasetError(f"{path}: cannot read ({e})") from None
    except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, a 5000-digit integer
        raise DatasetError(f"{path}: cannot read ({atomic.unparsable(e)})") from None
    found = atomic.non_json_value(value)
    if found is not None:
        raise atomic.NotJSONError(
            f"{path}: field {found[0]}: {found[1]}; eva writes this file back: write a number "
            "or null there by hand"
        )
    return value


def read_meta_jsonl(path: Path) -> list[dict[str, Any]]:
    """A metadata jsonl file's rows ([] when it is missing); a ``DatasetError`` otherwise."""
    if not path.exists():
        return []
    try:
        return atomic.read_jsonl(path)
    except (OSError, ValueError) as e:
        raise DatasetError(str(e)) from None


def _has_temporaries(directory: Path) -> bool:
    if not directory.is_dir() or directory.is_symlink():
        return False
    return any(p.name.startswith(atomic.TMP_PREFIX) for p in directory.iterdir())


def remove_temporaries_as_writer(root: Path) -> list[Path]:
    """Temp files of ``meta/`` and ``data/chunk-*/``; the caller holds the writer lock.

    The writer lock excludes other writers; the meta lock (taken only when there is something
    to remove, so a fresh dataset gets no lock file) excludes a concurrent ``eva qc``, whose
    episodes.jsonl rewrite would lose its temp.
    """
    removed: list[Path] = []
    meta = root / layout.META_DIR
    if _has_temporaries(meta):
        with meta_lock(root):
            removed += atomic.remove_stale_temporaries(meta)
    data = root / "data"
    if data.is_dir() and not data.is_symlink():
        for chunk in data.iterdir():  # a parquet temp file a crash left before its rename
            if chunk.is_dir() and not chunk.is_symlink():
                removed += atomic.remove_stale_temporaries(chunk)
    return removed


def remove_stale_temporaries(root: Path | str) -> list[Path]:
    """What ``eva cleanup`` does to a raw dataset: delete the temp files killed writers or a
    killed ``eva qc`` left (``.eva-tmp-*`` in ``meta/`` and ``data/chunk-*/``), never a live
    writer's. With a writer open (``writer.lock`` held) only the episodes.jsonl copies of a
    killed qc go, under the meta lock; otherwise the writer lock is taken first. Returns the
    removed paths; a filesystem error is a one-line ``DatasetError`` naming the path."""
    root = Path(root)
    fsafe.check_dataset_tree(root)
    if not (root / layout.META_DIR).is_dir():
        return []
    data = root / "data"
    chunks = (
        [c for c in data.iterdir() if c.is_dir() and not c.is_symlink()]
        if data.is_dir() and not data.is_symlink()
        else []
    )
    if not _has_temporaries(root / layout.META_DIR) and not any(map(_has_temporaries, chunks)):
        return []
    try:
        fsafe.real_directory(root / layout.WORK_DIR, create=True)
        lock_fd = try_flock(root / layout.WORK_DIR / layout.WRITER_LOCK)
        if lock_fd is None:  # a writer is open: its own temps stay
            with meta_lock(root):
                return atomic.remove_stale_temporaries(
                    root / layout.META_DIR, target=Path(layout.EPISODES).name
                )
        try:
            return remove_temporaries_as_writer(root)
        finally:
            os.close(lock_fd)
    except OSError as e:
        raise fsafe.os_error(e) from None


def clean_stale_work(root: Path, work_root: Path) -> None:
    """Work dirs and temp files left by a crashed writer; the caller holds the writer lock.
    Work dirs holding a crash spool stay: the writer recovers them (``eva.dataset.recover``)."""
    for entry in work_root.iterdir():
        if entry.is_dir() and not entry.is_symlink() and not spool.is_spool(entry):
            shutil.rmtree(entry, ignore_errors=True)
    remove_temporaries_as_writer(root)


def repair_after_crash(
    root: Path,
    info: dict[str, Any],
    episode_indices: Collection[int],
    total_frames: int,
    totals: Mapping[str, Any],
    *,
    durable: bool,
) -> RunningMerge:
    """Bring per-episode stats, stats.json and the info.json ``totals`` (updated in ``info``, the
    dataset's info.json as read) in line with the committed rows of ``episode_indices``, which
    hold ``total_frames`` frames; returns the running merge of the committed episodes' stats.

    Only needed if a previous writer died after the commit point; costs one read of
    episodes_stats.jsonl, once per open.
    """
    stats_rows = read_meta_jsonl(root / layout.EPISODES_STATS)
    kept = [r for r in stats_rows if r.get("episode_index") in episode_indices]
    seen: set[int] = set()
    deduped = []
    for row in reversed(kept):  # a re-committed index: the later row is the real one
        if row["episode_index"] not in seen:
            seen.add(row["episode_index"])
            deduped.append(row)
    deduped.reverse()
    if len(deduped) != len(stats_rows):
        atomic.atomic_write_jsonl(root / layout.EPISODES_STATS, deduped, durable=durable)
    _prune_image_histograms(root, episode_indices, durable=durable)
    stats_path = root / layout.STATS
    stats = read_meta_json(stats_path) if stats_path.exists() else None
    counted = None
    if isinstance(stats, dict) and "frame_index" in stats:
        with contextlib.suppress(KeyError, TypeError, ValueError, IndexError):
            counted = int(stats["frame_index"]["count"][0])
    if counted == total_frames and isinstance(stats, dict):
        try:
            # mean, std and count fully describe the pooled moments: no per-episode re-read.
            running = RunningMerge.from_stats(stats)
        except (ValueError, TypeError) as e:
            raise DatasetError(f"{stats_path}: unusable stats ({e})") from None
    else:
        merged = merge_stats([r["stats"] for r in deduped]) if deduped else {}
        running = RunningMerge.from_stats(merged)
        atomic.atomic_write_json(stats_path, merged, durable=durable)
    if any(info.get(k) != v for k, v in totals.items()):
        info.update(totals)
        atomic.atomic_write_json(root / layout.INFO, info, durable=durable)
    return running


def _prune_image_histograms(root: Path, episode_indices: Collection[int], *, durable: bool) -> None:
    """Drop sidecar rows of episodes that never reached episodes.jsonl and the earlier row of
    a re-committed index. Only each line's leading ``{"episode_index": N`` is looked at (the
    writer puts it first), so the histograms are not parsed on every open."""
    path = root / layout.IMAGE_HISTOGRAMS
    try:
        lines = fsafe.read_bytes(path).splitlines(keepends=True)
    except FileNotFoundError:
        return
    except OSError as e:
        raise DatasetError(f"{path}: cannot read ({e})") from None
    last: dict[int, int] = {}
    for i, line in enumerate(lines):
        match = _HISTOGRAM_ROW_START.match(line)
        if match is not None:
            last[int(match.group(1))] = i
    keep = sorted(i for ep, i in last.items() if ep in episode_indices)
    if len(keep) != len(lines):
        atomic.atomic_write_bytes(path, b"".join(lines[i] for i in keep), durable=durable)
