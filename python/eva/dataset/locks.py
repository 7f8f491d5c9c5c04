"""Every flock eva takes: those shared by the capture writer, the save worker and ``eva qc``
(docs/design.md, "Saving marker"; their file names live in ``eva.dataset.layout``) and the
export lock of ``eva.publish``.

Every read-modify-write of ``meta/episodes.jsonl`` holds ``meta_lock``; the writer holds the
saving marker of the episode it is committing and ``WRITER_LOCK`` while the dataset is open.

Lock files are opened without following symlinks, in a parent that must be a real directory
(``eva.dataset.fsafe.create_file``): a planted link can never make eva truncate or create a file
elsewhere. Failures are one-line ``DatasetError``s naming the lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from eva.dataset import fsafe, layout

__all__ = ["flock_fd", "flocked", "is_flocked", "meta_lock", "release_flock", "try_flock"]


def flock_fd(fd: int, *, wait: bool = True) -> bool:
    """Take an exclusive flock on the open ``fd``: True once held; without ``wait`` False at
    once when another open file holds it."""
    if wait:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def release_flock(fd: int) -> None:
    """Unlock and close an fd ``try_flock`` returned; errors are ignored (closing releases)."""
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    with contextlib.suppress(OSError):
        os.close(fd)


@contextlib.contextmanager
def flocked(path: Path, *, unlink: bool = False) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (created if needed); optionally unlink before release."""
    fd = fsafe.create_file(path)
    try:
        flock_fd(fd)
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
    if create:
        fd = fsafe.create_file(path)
    else:
        fsafe.real_directory(Path(path).parent)
        fd = fsafe.open_regular(path, os.O_RDWR)
    try:
        held = flock_fd(fd, wait=False)
    except BaseException:
        os.close(fd)
        raise
    if not held:
        os.close(fd)
        return None
    return fd


def is_flocked(path: Path) -> bool:
    """True when another process holds a flock on ``path`` (a leftover file alone does not count).

    Probes with a shared lock, opened without following a symlink, and lets it go at once."""
    try:
        fd = fsafe.open_regular(path)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return True
        raise
    finally:
        os.close(fd)
    return False


@contextlib.contextmanager
def meta_lock(root: Path) -> Iterator[None]:
    """Exclusive lock serialising read-modify-write of ``meta/episodes.jsonl`` with the writer."""
    work = fsafe.real_directory(Path(root) / layout.WORK_DIR, create=True)
    with flocked(work / layout.META_LOCK):
        yield
