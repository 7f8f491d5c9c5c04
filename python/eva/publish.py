"""Publish an accepted/rejected pair so that a reader only ever sees a complete pair.

Layout, for an export root ``R = <parent>/export/<fmt>`` (docs/formats.md, "Where exports go"):

    <parent>/export/
      .eva-<fmt>.lock                    flock: one export of this source+format at a time
      .eva-staging-<fmt>-<id>/           the new pair being written (hidden)
        accepted/ rejected/ job.json .eva-complete   (the marker is written last)
      .eva-backup-<fmt>-<id>/            the old R during a two-step swap (fallback only)
      <fmt>/ = R                         accepted/ rejected/ job.json: the visible pair

Publication swaps the complete staging directory with R in ONE ``renameat2(RENAME_EXCHANGE)``
(Linux >= 3.15 on ext4/xfs/btrfs/tmpfs), so at every instant R holds either the complete old pair or
the complete new pair; the old pair ends up under the staging name and is deleted. Where the
filesystem lacks the exchange, R is renamed to the backup name and the staging dir to R; a failure
of the second rename puts the backup back. A ``kill -9`` between those two renames leaves no R at
all (never a mixed pair); ``recover`` then rolls forward (the staging dir is complete) or back.

The lock file sits beside R, not inside it, because R itself is swapped.

Neither ``<parent>/export`` nor R may be a symlink, and the lock is opened without following one
(``eva.dataset.fsafe``): a planted link must not make an export, cleanup or upload truncate a
file or write a job record somewhere else. Such a tree is refused before anything is written.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from eva import libc
from eva.dataset import fsafe
from eva.dataset.atomic import (
    atomic_write_bytes,
    fsync_dir,
    remove_stale_temporaries,
    sync_filesystem,
)
from eva.dataset.errors import DatasetError
from eva.dataset.locks import flock_fd
from eva.jobs import EXPORT_JOB, mark_interrupted

STAGING_PREFIX = ".eva-staging-"
BACKUP_PREFIX = ".eva-backup-"
COMPLETE_MARKER = ".eva-complete"
LOCK_ATTEMPTS = 3  # opens of the lock file when the one locked was unlinked meanwhile


class ExportBusy(DatasetError):
    """Another export of the same source and format holds the lock."""


def lock_path(root: Path) -> Path:
    return Path(root).parent / f".eva-{Path(root).name}.lock"


def staging_dir(root: Path, export_id: str) -> Path:
    return Path(root).parent / f"{STAGING_PREFIX}{Path(root).name}-{export_id}"


def backup_dir(root: Path, export_id: str) -> Path:
    return Path(root).parent / f"{BACKUP_PREFIX}{Path(root).name}-{export_id}"


@contextlib.contextmanager
def export_lock(root: Path, description: str) -> Iterator[None]:
    """Hold the exclusive export lock of ``root`` or raise ``ExportBusy`` at once."""
    path = lock_path(root)
    fsafe.check_export_tree(root)
    for _ in range(LOCK_ATTEMPTS):
        fsafe.real_directory(path.parent, create=True)
        try:
            fd = fsafe.create_file(path)
        except OSError as e:  # EROFS, EACCES: one line naming the lock
            raise fsafe.os_error(e, path) from None
        if not flock_fd(fd, wait=False):
            try:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            finally:
                os.close(fd)
            raise ExportBusy(
                f"{path}: another export (or an upload) of {description} is already running "
                f"(pid {holder}); wait for it to finish"
            )
        if _still_linked(fd, path):
            break
        # a refused export removed the lock file it had made, after this open: lock the new one
        os.close(fd)
    else:
        raise ExportBusy(f"{path}: replaced while it was being locked; try again")
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def _still_linked(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def make_staging(root: Path, export_id: str) -> Path:
    path = staging_dir(root, export_id)
    path.mkdir(parents=True)
    return path


def mark_complete(staging: Path, export_id: str, *, durable: bool = True) -> None:
    """The last write into a staging dir: from now on it may be rolled forward by ``recover``.

    ``durable`` first flushes everything staged, so the marker never precedes the data on disk.
    """
    if durable:
        sync_filesystem(Path(staging))
    atomic_write_bytes(Path(staging) / COMPLETE_MARKER, f"{export_id}\n".encode(), durable=durable)


def is_complete(staging: Path) -> bool:
    return (Path(staging) / COMPLETE_MARKER).is_file()


def _remove_tree(path: Path) -> None:
    if path.is_symlink() or not path.exists():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    shutil.rmtree(path, ignore_errors=True)


def publish_pair(
    root: Path,
    staging: Path,
    *,
    exchange: bool = True,
    between_steps: Callable[[], None] | None = None,
) -> None:
    """Make the complete ``staging`` dir the visible export root ``root``.

    ``exchange=False`` forces the two-step swap with backup (what filesystems without
    RENAME_EXCHANGE get); ``between_steps`` runs after the old pair went to the backup and before
    the new pair moves in (a seam to exercise the rollback).
    """
    root, staging = Path(root), Path(staging)
    if not is_complete(staging):
        raise DatasetError(f"{staging}: staging directory is incomplete; not publishing")
    export_id = fsafe.read_text(staging / COMPLETE_MARKER).strip()
    parent = root.parent
    if not root.exists():
        os.rename(staging, root)
        with contextlib.suppress(OSError):
            fsync_dir(parent)
        return
    if exchange:
        try:
            libc.rename_exchange(staging, root)
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
        else:
            # Published. Nothing after this point may fail the export: the new pair is visible.
            with contextlib.suppress(OSError):
                fsync_dir(parent)
            _remove_tree(staging)  # now holds the old pair
            return
    backup = backup_dir(root, export_id)
    os.rename(root, backup)
    try:
        if between_steps is not None:
            between_steps()
        os.rename(staging, root)
    except BaseException:
        if not root.exists():
            os.rename(backup, root)
        with contextlib.suppress(OSError):  # must not mask the error being re-raised
            fsync_dir(parent)
        raise
    with contextlib.suppress(OSError):
        fsync_dir(parent)
    _remove_tree(backup)


def _hidden_leftovers(root: Path) -> tuple[list[Path], list[Path]]:
    parent, name = Path(root).parent, Path(root).name
    if not parent.is_dir():
        return [], []
    stagings, backups = [], []
    for entry in parent.iterdir():
        if entry.is_symlink() or not entry.is_dir():
            continue
        if entry.name.startswith(f"{STAGING_PREFIX}{name}-"):
            stagings.append(entry)
        elif entry.name.startswith(f"{BACKUP_PREFIX}{name}-"):
            backups.append(entry)
    return sorted(stagings), sorted(backups)


def recover(root: Path) -> list[str]:
    """Finish or undo an interrupted publication of ``root`` and delete hidden leftovers.

    Call it holding ``export_lock(root)``. Returns one line per action taken (for the CLI).
    """
    root = Path(root)
    actions: list[str] = []
    stagings, backups = _hidden_leftovers(root)
    if not root.exists() and backups:
        # Interrupted two-step swap: the backup id names the staging dir it was swapping in.
        backup = backups[-1]
        export_id = backup.name[len(f"{BACKUP_PREFIX}{root.name}-") :]
        candidate = staging_dir(root, export_id)
        if candidate.is_dir() and is_complete(candidate):
            os.rename(candidate, root)
            actions.append(f"rolled forward: published {root} from {candidate.name}")
        else:
            os.rename(backup, root)
            actions.append(f"rolled back: restored {root} from {backup.name}")
        fsync_dir(root.parent)
    stagings, backups = _hidden_leftovers(root)
    for leftover in stagings + backups:
        _remove_tree(leftover)
        actions.append(f"removed {leftover}")
    if root.is_dir():
        for temp in remove_stale_temporaries(root):
            actions.append(f"removed {temp}")
        job = mark_interrupted(root / EXPORT_JOB)
        if job is not None:
            actions.append(f"job {job.job_id}: marked failed (interrupted)")
    return actions
