"""Moving a recorded episode's files into its dataset, with the way back.

``DatasetWriter.commit_episode`` publishes an episode in steps: the parquet, the MP4s, the jsonl
rows before the commit point, then the episodes row. A ``Publication`` remembers each step, so
that a failure before the commit point takes every one of them back: published files removed,
videos returned to the work dir (a retry or ``eva recover`` needs them), the spool's commit
marker removed and appended rows truncated away.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from eva.dataset import atomic, fsafe, spool

__all__ = ["Publication", "real_parent"]


def real_parent(root: Path, path: Path) -> None:
    """Make ``path``'s parent directories, each a real directory inside the dataset ``root``."""
    rel = path.parent.relative_to(root)
    fsafe.contained(root, rel, "dir")
    path.parent.mkdir(parents=True, exist_ok=True)
    fsafe.contained(root, rel, "dir")


def _size_mark(path: Path) -> tuple[Path, int]:
    try:
        return path, path.stat().st_size
    except FileNotFoundError:
        return path, 0


class Publication:
    """The steps one episode's commit has taken so far in the dataset ``root``; ``undo`` takes
    them back."""

    def __init__(self, root: Path, *, durable: bool, spool_dir: Path | None) -> None:
        self.root = root
        self.durable = durable
        self.spool_dir = spool_dir
        self._moved: list[Path] = []
        self._videos: list[tuple[Path, Path]] = []  # (published, where it came from)
        self._temporaries: list[Path] = []
        self._sizes: list[tuple[Path, int]] = []

    def claim(self, episode_index: int, length: int) -> None:
        """Before any file moves: a recovery after a kill learns which index to look for."""
        if self.spool_dir is not None:
            spool.write_marker(
                self.spool_dir, spool.COMMITTING, {"episode_index": episode_index, "length": length}
            )

    def publish_table(self, table: pa.Table, dest: Path) -> None:
        """Write ``table`` under a temporary name beside ``dest``, then rename it into place."""
        tmp = dest.with_name(atomic.TMP_PREFIX + dest.name)
        self._temporaries.append(tmp)
        real_parent(self.root, dest)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # a planted link there would be written through
        pq.write_table(table, tmp)
        # Committed raw evidence is read-only (0444 under the usual umask): an export may then
        # share it by hard link without exposing it to writes.
        fsafe.make_read_only(tmp)
        if self.durable:
            fd = fsafe.open_regular(tmp)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, dest)
        self._moved.append(dest)

    def publish_video(self, source: Path, dest: Path) -> None:
        """Rename a finished MP4 from the work dir to ``dest``, read-only like the parquet."""
        real_parent(self.root, dest)
        fsafe.make_read_only(source)
        os.replace(source, dest)
        self._videos.append((dest, source))

    def sync_directories(self) -> None:
        """fsync the directories the published files were renamed into (when durable)."""
        if self.durable:
            for d in {p.parent for p in self._moved + [v for v, _ in self._videos]}:
                atomic.fsync_dir(d)

    def append_row(self, rel: str, row: dict[str, Any]) -> None:
        """Append one jsonl row, remembering the old size to take it back on failure."""
        path = self.root / rel
        self._sizes.append(_size_mark(path))
        atomic.append_jsonl_inplace(path, [row], durable=self.durable)

    def undo(self) -> None:
        """Take back every step (best effort: each one is tried whatever the others do)."""
        for p in self._moved:
            with contextlib.suppress(OSError):
                p.unlink()
        # The videos go back where they came from: a retry (or eva recover) needs them.
        for published, origin in self._videos:
            with contextlib.suppress(OSError):
                os.replace(published, origin)
        for tmp in self._temporaries:
            with contextlib.suppress(OSError):
                tmp.unlink()
        if self.spool_dir is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.spool_dir / spool.COMMITTING)
        # Take back the rows appended before the commit point (nobody else writes these files);
        # a torn episodes.jsonl fragment is healed by the next append.
        for path, size in reversed(self._sizes):
            with contextlib.suppress(OSError):
                os.truncate(path, size)
