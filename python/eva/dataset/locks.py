"""The flocks shared by the capture writer, the save worker and ``eva qc`` (docs/design.md,
"Saving marker"); their file names live in ``eva.dataset.layout``.

Every read-modify-write of ``meta/episodes.jsonl`` holds ``meta_lock``; the writer holds the
saving marker of the episode it is committing and ``WRITER_LOCK`` while the dataset is open.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from eva.dataset import layout

__all__ = ["flocked", "meta_lock", "try_flock"]


@contextlib.contextmanager
def flocked(path: Path, *, unlink: bool = False) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (created if needed); optionally unlink before release."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if unlink:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        os.close(fd)


def try_flock(path: Path, *, create: bool = True) -> int | None:
    """Take an exclusive flock on ``path`` without waiting: the open fd that holds it (closing it
    releases the lock), or None when another open file holds the lock. Without ``create`` a
    missing file raises ``FileNotFoundError``."""
    fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def meta_lock(root: Path) -> Iterator[None]:
    """Exclusive lock serialising read-modify-write of ``meta/episodes.jsonl`` with the writer."""
    work = Path(root) / layout.WORK_DIR
    work.mkdir(exist_ok=True)
    with flocked(work / layout.META_LOCK):
        yield
