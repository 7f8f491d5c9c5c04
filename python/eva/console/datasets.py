"""The console's datasets: the names of ``collection.tasks`` and the raw directories they stand for.

Clients never send paths: a dataset is a name of ``collection.tasks`` and every directory is
derived here, checked to be a real directory inside the log directory before anything reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eva.config import CollectionConfig, ConfigError
from eva.console.errors import conflict, not_found
from eva.dataset import fsafe, layout
from eva.dataset.errors import DatasetError
from eva.dataset.identity import Identity, fd_identity


class DatasetDirs:
    """Dataset names to checked directories, and the episode counts of the status."""

    def __init__(self, config: CollectionConfig) -> None:
        self.config = config
        self._counts: dict[Path, tuple[Identity, int]] = {}

    def root(self, name: str) -> Path:
        """The raw directory of a dataset of ``collection.tasks``; anything else is refused."""
        if not isinstance(name, str) or name not in self.config.tasks:
            raise not_found(
                "unknown_dataset", f"dataset {name!r} is not in collection.tasks", "dataset"
            )
        try:
            return self.config.dataset_dir(name)
        except ConfigError as e:  # e.g. a symlinked directory that leads out of log_dir
            raise conflict("unsafe_path", str(e), "dataset") from None

    def checked_root(self, name: str) -> Path:
        """``root`` that must exist and be a real directory inside the log directory."""
        root = self.root(name)
        log_dir = Path(self.config.log_dir).resolve()
        if root.is_symlink() or root.parent.is_symlink():
            raise conflict("unsafe_path", f"{root}: a symlink; the console does not follow it")
        if not root.is_dir():
            raise conflict("no_episodes", f"dataset {name!r} has no recorded episodes yet")
        if not layout.is_within(root.resolve(), log_dir):
            raise conflict("unsafe_path", f"{root}: resolves outside the log directory")
        try:  # the containment check qc, cleanup, the writer and export share
            fsafe.check_dataset_tree(root)
        except DatasetError as e:
            raise conflict("unsafe_path", str(e)) from None
        return root

    def episode_count(self, root: Path) -> int | None:
        """Rows of episodes.jsonl, re-counted only when the file's identity changed (the
        status is built several times a second)."""
        path = root / layout.EPISODES
        try:
            # No link followed at any component, the root included (``checked_root`` refuses a
            # linked root too), and no FIFO opened (a blocking open would hang the status): the
            # count is None, and the dataset's own requests name the problem.
            with fsafe.open_binary_beneath(root, layout.EPISODES, root_may_link=False) as f:
                key = fd_identity(f.fileno())
                cached = self._counts.get(path)
                if cached is not None and cached[0] == key:
                    return cached[1]
                count = sum(1 for line in f if line.strip())
        except (OSError, DatasetError):
            return None
        self._counts[path] = (key, count)
        return count

    def listing(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for name, prompts in self.config.tasks.items():
            try:
                root = self.config.dataset_dir(name)
            except ConfigError as e:
                out.append({"name": name, "tasks": list(prompts), "dir": None, "error": str(e)})
                continue
            out.append(
                {
                    "name": name,
                    "tasks": list(prompts),
                    "dir": str(root),
                    "episodes": self.episode_count(root) or 0,
                }
            )
        return out
