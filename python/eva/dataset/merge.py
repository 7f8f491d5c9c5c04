"""``eva merge``: one new raw dataset from several sessions of one rig (docs/cli.md).

Order of work; nothing is published before the last check has passed, and a refused merge
leaves nothing behind:

1. the places (``MergeUsageError``, exit 2): every source a different dataset, none inside
   another, the target new (not even an empty directory) and outside every source;
2. what a run killed before left beside the target is removed (``remove_leftovers``);
3. each source, held for the whole merge by its writer lock (``.eva-work/writer.lock``, when it
   has one: a capture or the console recording into it refuses the merge, and none can start
   meanwhile): no crash spool waiting for ``eva recover``, and valid (``validate_dataset``'s
   checks; NaN/inf values are evidence and are carried). Each walk (metadata, every parquet
   table) passes before anything is written; the MP4 inspections it starts (framing, first
   keyframe decoded) go on, on their threads, while step 5 writes, and are waited for before
   the rename: the refusal is the one an up-front validation would give (``_SourceChecks``);
4. one rig (``merge_rig``): every difference is a line of ``RigMismatch``;
5. ``merge_write`` writes into ``.<target>.eva-merge-<random>`` beside the target, holding
   that directory's own ``.eva-work/writer.lock`` (a live merge's staging is never taken for a
   leftover); one ``syncfs`` (while the last inspections finish); then one
   ``renameat2(RENAME_NOREPLACE)`` publishes it. A refusal removes the staging directory.

A kill at any moment leaves either no target or the complete one. The sources are only read:
their bytes, modes and times stay as they were (tests hash them before and after).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from eva import libc
from eva.dataset import atomic, fsafe, layout, locks
from eva.dataset.errors import DatasetError
from eva.dataset.merge_rig import (
    CameraLayout,
    MergeUsageError,
    parse_renames,
    rig_differences,
    rig_of,
)
from eva.dataset.merge_write import Session, WrittenMerge, write_merged
from eva.dataset.reader import DatasetReader

if TYPE_CHECKING:
    from eva.dataset.validate import Problem, Validation

__all__ = ["MergeResult", "MergeUsageError", "RigMismatch", "merge_sessions", "remove_leftovers"]

STAGING_INFIX = ".eva-merge-"
# A staging dir without its lock file this old is a kill between mkdir and lock: a leftover.
_UNLOCKED_GRACE_S = 60.0
# Validation problems a merge carries: the values are what was recorded.
_CARRIED = ("non_finite_values",)


class RigMismatch(DatasetError):
    """The sessions are not one rig: ``lines`` holds one line per difference."""

    def __init__(self, lines: Sequence[str]) -> None:
        super().__init__(lines[0])
        self.lines = list(lines)


@dataclass(frozen=True)
class MergeResult:
    into: Path
    sources: list[Path]
    written: WrittenMerge
    leftovers_removed: list[Path]


def _resolved_sources(sources: Sequence[str | os.PathLike[str]]) -> list[Path]:
    roots: list[Path] = []
    for given in sources:
        root = Path(given).resolve()
        if not root.is_dir():
            raise MergeUsageError(f"{given}: not a directory")
        roots.append(root)
    if len(roots) < 2:
        raise MergeUsageError("eva merge takes at least two sessions")
    for i, a in enumerate(roots):
        for j, b in enumerate(roots):
            if i < j and a == b:
                raise MergeUsageError(f"{sources[i]} and {sources[j]} are the same dataset")
            if i != j and layout.is_within(a, b):
                raise MergeUsageError(
                    f"{sources[i]} lies inside {sources[j]}: merge sources may not overlap"
                )
    return roots


def _target(into: str | os.PathLike[str], roots: Sequence[Path], given: Sequence[str]) -> Path:
    into = Path(into)
    try:
        layout.check_component(into.name, "dataset directory name")
    except layout.UnsafeNameError as e:
        raise MergeUsageError(f"{into}: {e}") from None
    parent = into.parent.resolve()
    if os.path.lexists(parent) and not parent.is_dir():
        raise MergeUsageError(f"{into.parent}: not a directory")
    target = parent / into.name
    for root, name in zip(roots, given, strict=True):
        if target == root or (os.path.lexists(target) and _same_dir(target, root)):
            raise MergeUsageError(f"{into}: merge of {name} into itself")
        if layout.is_within(target, root):
            raise MergeUsageError(f"{into} lies inside {name}: the merged dataset must be new")
    if os.path.lexists(target):
        raise MergeUsageError(f"{into} exists: eva merge writes a new dataset, give a new name")
    return target


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return os.path.samestat(os.stat(a), os.stat(b))
    except OSError:
        return False


def _lock_is_free(staging: Path) -> bool:
    lock = staging / layout.WORK_DIR / layout.WRITER_LOCK
    if os.path.lexists(lock):
        return not locks.is_flocked(lock)
    with contextlib.suppress(OSError):
        return time.time() - staging.lstat().st_mtime > _UNLOCKED_GRACE_S
    return False


def remove_leftovers(target: Path) -> list[Path]:
    """Remove the staging dirs of merges into ``target`` that were killed (no live merge holds
    their lock); returns them."""
    prefix = f".{target.name}{STAGING_INFIX}"
    removed = []
    with os.scandir(target.parent) as entries:
        found = [Path(e.path) for e in entries if e.name.startswith(prefix)]
    for staging in found:
        if staging.is_symlink() or not staging.is_dir() or not _lock_is_free(staging):
            continue
        shutil.rmtree(staging, ignore_errors=True)
        if not os.path.lexists(staging):
            removed.append(staging)
    return removed


def _hold_source(root: Path, name: str) -> int | None:
    """The fd holding ``root``'s writer lock for the merge (None: it has no lock file, so no eva
    writer ever opened it); a held lock or a crash spool refuses the merge."""
    from eva.dataset.recover import find_spools

    fsafe.check_dataset_tree(root)
    lock = root / layout.WORK_DIR / layout.WRITER_LOCK
    fd: int | None = None
    if os.path.lexists(lock):
        fd = locks.try_flock(lock, create=False)
        if fd is None:
            raise DatasetError(
                f"{name}: another writer holds it ({lock}: eva collect or eva console is "
                "recording into it); stop it, then merge"
            )
    spools = find_spools(root / layout.WORK_DIR)
    if spools:
        if fd is not None:
            locks.release_flock(fd)
        raise DatasetError(
            f"{name}: {len(spools)} episode(s) await crash recovery ({spools[0]}): "
            f"run eva recover {name}, then merge"
        )
    return fd


class _SourceChecks:
    """The validation of every source (``validate_dataset``'s checks, NaN/inf carried): each
    walk runs before anything is written; the MP4 inspections it starts go on, on their worker
    threads, while the merge writes its staging dir, and ``refusal()`` waits for them before
    anything is published. The refusal is the one an up-front validation of the sources, in
    the order given, would raise."""

    def __init__(self) -> None:
        self._started: list[tuple[str, Validation]] = []
        self._stack = contextlib.ExitStack()
        self._refusal: DatasetError | None = None
        self._settled = False

    def start(self, reader: DatasetReader, name: str) -> None:
        from eva.dataset.validate import start_validation

        validation = self._stack.enter_context(start_validation(reader.root, reader=reader))
        self._started.append((name, validation))
        if _merge_problems(validation.found):  # which one comes first: ask every inspection
            refusal = self.refusal()
            assert refusal is not None
            raise refusal

    def refusal(self) -> DatasetError | None:
        """The first source's problem once every inspection has answered (None: all valid)."""
        if not self._settled:
            self._settled = True
            self._refusal = self._first_refusal()
        return self._refusal

    def _first_refusal(self) -> DatasetError | None:
        for name, validation in self._started:
            problems = _merge_problems(validation.complete())
            if problems:
                more = f" (and {len(problems) - 1} more: eva validate {name})"
                return DatasetError(
                    f"{name}: not merged: {problems[0].message}{more if len(problems) > 1 else ''}"
                )
        return None

    def close(self) -> None:
        self._stack.close()


def _merge_problems(problems: Sequence[Problem]) -> list[Problem]:
    return [p for p in problems if p.code not in _CARRIED]


@contextlib.contextmanager
def _held_sources(roots: Sequence[Path], given: Sequence[str]) -> Iterator[None]:
    held: list[int] = []
    try:
        for root, name in zip(roots, given, strict=True):
            fd = _hold_source(root, name)
            if fd is not None:
                held.append(fd)
        yield
    finally:
        for fd in held:
            locks.release_flock(fd)


@contextlib.contextmanager
def _staging(target: Path) -> Iterator[Path]:
    """A new staging dir beside ``target`` holding its writer lock; removed unless published."""
    staging = target.parent / f".{target.name}{STAGING_INFIX}{secrets.token_hex(4)}"
    os.mkdir(staging)
    fd: int | None = None
    try:
        work = fsafe.real_directory(staging / layout.WORK_DIR, create=True)
        fd = locks.try_flock(work / layout.WRITER_LOCK)
        yield staging
    finally:
        if os.path.lexists(staging):
            shutil.rmtree(staging, ignore_errors=True)
        if fd is not None:
            locks.release_flock(fd)


def _publish(staging: Path, target: Path, *, durable: bool) -> None:
    """Make the staged (and, ``durable``, synced) dataset the target in one rename that never
    replaces anything."""
    try:
        libc.rename_noreplace(staging, target)
    except OSError as e:
        if e.errno == errno.EEXIST or e.errno == errno.ENOTEMPTY:
            raise MergeUsageError(f"{target} appeared while merging; nothing published") from None
        if e.errno not in (errno.ENOSYS, errno.EINVAL):
            raise fsafe.os_error(e, target) from None
        if os.path.lexists(target):  # no renameat2 here: the check just before the rename
            raise MergeUsageError(f"{target} appeared while merging; nothing published") from None
        os.rename(staging, target)
    if durable:
        atomic.fsync_dir(target.parent)


def _check_rig(
    roots: Sequence[Path],
    given: Sequence[str],
    readers: Sequence[DatasetReader],
    maps: Sequence[str],
) -> list[Session]:
    """The sessions to write, renamed; ``RigMismatch`` when they are not one rig."""
    renames = parse_renames(maps, roots, given, [r.features for r in readers])
    probes: dict[bytes, CameraLayout] = {}  # one FFmpeg open per distinct sample entry
    rigs = [rig_of(n, r, m, probes) for n, r, m in zip(given, readers, renames, strict=True)]
    differences = rig_differences(rigs)
    if differences:
        raise RigMismatch(differences)
    return [Session(*s) for s in zip(roots, readers, renames, strict=True)]


def _write_and_publish(
    target: Path,
    sessions: Sequence[Session],
    checks: _SourceChecks,
    durable: bool,
    on_episode: Callable[[int, int], None] | None,
) -> WrittenMerge:
    target.parent.mkdir(parents=True, exist_ok=True)
    with _staging(target) as staging:
        written = write_merged(staging, sessions, on_episode=on_episode)
        # the flush takes the disk while the last inspections take the CPU; neither publishes
        with ThreadPoolExecutor(1, thread_name_prefix="eva-merge-sync") as pool:
            synced = pool.submit(atomic.sync_filesystem, staging) if durable else None
            refusal = checks.refusal()
            if synced is not None:
                synced.result()
        if refusal is not None:
            raise refusal
        _publish(staging, target, durable=durable)
    return written


def merge_sessions(
    sources: Sequence[str | os.PathLike[str]],
    into: str | os.PathLike[str],
    maps: Sequence[str] = (),
    *,
    durable: bool = True,
    on_episode: Callable[[int, int], None] | None = None,
) -> MergeResult:
    """Merge ``sources`` (in that order) into the new dataset ``into``; see the module doc.
    ``maps``: ``--map [SESSION:]OLD=NEW`` renames (``merge_rig.parse_renames``)."""
    given = [str(s) for s in sources]
    roots = _resolved_sources(sources)
    target = _target(into, roots, given)
    removed = remove_leftovers(target) if target.parent.is_dir() else []
    with _held_sources(roots, given), contextlib.closing(_SourceChecks()) as checks:
        readers = [DatasetReader(root) for root in roots]
        for reader, name in zip(readers, given, strict=True):
            checks.start(reader, name)
        try:
            sessions = _check_rig(roots, given, readers, maps)
            written = _write_and_publish(target, sessions, checks, durable, on_episode)
        except DatasetError as e:
            # an invalid source refuses the merge whatever failed first because of it
            refusal = checks.refusal()
            if refusal is not None and refusal is not e:
                raise refusal from None
            raise
    return MergeResult(target, roots, written, removed)
