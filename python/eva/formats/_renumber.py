"""Renumbered reuse of a published episode file: a copy, patched where the numbering shows.

An incremental re-export (``eva.export.incremental``) finds an episode whose content is the
published one's but whose output index, global index offset or task numbering moved (a verdict
change earlier in the dataset renumbers every later episode of both subsets). A per-episode
format whose file holds those numbers in fixed places (``EpisodeFormat.renumber``: hdf5, and
mcap's eva-client profile without chunk compression) copies the published file into the staging
directory and rewrites those bytes, which is what writing it again would give, at the cost of a
copy instead of a video decode.

Safety: the published file is only read; the staged copy is a new file (a new inode, never a
link to the published one; on btrfs or xfs a reflink, whose shared blocks are copied on write)
created exclusively, so patching it cannot reach the published pair.
Every patch names the bytes it replaces: they are checked in the copy first, and a copy whose
size is not the published file's, or whose bytes at a patch site are not the old numbering's,
is removed and the caller writes the episode anew (``Renumbered`` is None).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from eva.dataset.errors import naming_write_errors
from eva.dataset.share import reflink

# Bytes per copy_file_range call (the kernel copies; nothing passes through this process).
COPY_STEP = 1 << 30


@dataclass(frozen=True)
class Patch:
    """``old`` at ``offset`` becomes ``new`` (same length)."""

    offset: int
    old: bytes
    new: bytes

    def __post_init__(self) -> None:
        if len(self.old) != len(self.new):
            raise ValueError(f"patch at {self.offset}: {len(self.old)} bytes -> {len(self.new)}")


def copy_published(published: Path, staged: Path) -> int:
    """Copy ``published`` to the new file ``staged`` (a reflink, else ``os.copy_file_range``,
    else a plain copy); return the bytes copied. ``staged`` must not exist."""
    staged.parent.mkdir(parents=True, exist_ok=True)
    copied = 0
    with naming_write_errors(staged):
        source = os.open(published, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            size = os.fstat(source).st_size
            target = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
            try:
                # a clone where the filesystem has one (btrfs, xfs): the patches below then
                # copy only the blocks they touch, the published file keeps its own
                copied = size if reflink(source, target) else _copy(source, target, size)
            except BaseException:
                os.close(target)
                staged.unlink(missing_ok=True)
                raise
            os.close(target)
        finally:
            os.close(source)
    return copied


def _copy(source: int, target: int, size: int) -> int:
    copied = 0
    try:
        while copied < size:
            step = os.copy_file_range(source, target, min(COPY_STEP, size - copied))
            if step == 0:
                break  # the file shrank meanwhile: the caller's size check sees it
            copied += step
        return copied
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise
    while True:  # no copy_file_range here: through this process, 1 MiB at a time
        data = os.pread(source, 1 << 20, copied)
        if not data:
            return copied
        os.pwrite(target, data, copied)
        copied += len(data)


def apply_patches(staged: Path, patches: Sequence[Patch]) -> bool:
    """Each patch's ``new`` bytes into ``staged``, once every site was found to hold its ``old``
    bytes; False (nothing written) when one does not."""
    with naming_write_errors(staged):
        fd = os.open(staged, os.O_RDWR | os.O_NOFOLLOW)
        try:
            if any(os.pread(fd, len(p.old), p.offset) != p.old for p in patches):
                return False
            for patch in patches:
                if os.pwrite(fd, patch.new, patch.offset) != len(patch.new):
                    raise OSError(errno.EIO, "short write")
        finally:
            os.close(fd)
    return True


def copy_and_patch(published: Path, staged: Path, patches: Sequence[Patch]) -> int | None:
    """``published`` copied to ``staged`` and patched (module doc): the staged file's size, or
    None (``staged`` removed) when the copy is not the published file's size or a site does not
    hold its old bytes."""
    expected = os.stat(published).st_size
    size = copy_published(published, staged)
    if (
        size != expected
        or os.stat(staged).st_size != expected
        or not apply_patches(staged, patches)
    ):
        staged.unlink(missing_ok=True)
        return None
    return size
