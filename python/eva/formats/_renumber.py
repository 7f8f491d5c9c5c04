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
from eva.dataset.share import copy_file


@dataclass(frozen=True)
class Patch:
    """``old`` at ``offset`` becomes ``new`` (same length)."""

    offset: int
    old: bytes
    new: bytes

    def __post_init__(self) -> None:
        if len(self.old) != len(self.new):
            raise ValueError(f"patch at {self.offset}: {len(self.old)} bytes -> {len(self.new)}")


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
    staged.parent.mkdir(parents=True, exist_ok=True)
    # a reflink where the filesystem has them (btrfs, xfs): the patches then copy only the
    # blocks they touch, and the published file keeps its own
    size = copy_file(published, staged)
    if (
        size != expected
        or os.stat(staged).st_size != expected
        or not apply_patches(staged, patches)
    ):
        staged.unlink(missing_ok=True)
        return None
    return size
