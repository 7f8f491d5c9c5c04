"""A file's identity: what says a file is still the one eva read, wrote or checked.

Every decision to reuse work done on a file without reading it again (an incremental export's
fingerprints, ``video_checks.json``, the reader's table cache, the MP4 sample-table cache, the
console's cached counts) compares all five fields: size, mtime_ns, ctime_ns, inode, device.
Size and mtime alone can be put back after a rewrite in place (``os.utime``), and the inode stays
when the file is written through; the ctime is the one field no system call can set, so a
rewrite in place always shows there. Identity, not a content hash: hashing would read every
byte, which the reuse exists to avoid.

The ctime also moves when a hard link to the inode is made or removed (the link count is part of
the inode). Where eva links files itself (an export sharing a raw MP4, an incremental export
linking a published file), the record is brought up to date after eva's own links
(``eva.export.incremental.settle_records``); a link made by anything else costs one re-read.
"""

from __future__ import annotations

import os
from pathlib import Path

# size, mtime_ns, ctime_ns, inode, device
Identity = tuple[int, int, int, int, int]
FIELDS = ("size", "mtime_ns", "ctime_ns", "inode", "device")


def stat_identity(st: os.stat_result) -> Identity:
    """The identity of the file ``st`` describes."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def file_identity(path: Path | str) -> Identity | None:
    """The identity of the file at ``path`` (a link is not followed: its own identity), or None
    when it cannot be stat'ed."""
    try:
        return stat_identity(os.stat(path, follow_symlinks=False))
    except OSError:
        return None


def fd_identity(fd: int) -> Identity:
    """The identity of the open file ``fd``."""
    return stat_identity(os.fstat(fd))


def matches(recorded: object, current: Identity | None) -> bool:
    """Whether ``recorded`` (an identity as a record keeps it: a JSON list or a tuple of five
    ints) is ``current``. Anything else (a forged or older record, a missing file) is not."""
    if current is None or not isinstance(recorded, (list, tuple)) or len(recorded) != 5:
        return False
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in recorded):
        return False
    return tuple(recorded) == current


def same_but_ctime(recorded: object, current: Identity | None) -> bool:
    """Whether ``recorded`` and ``current`` differ at most in their ctime (a link made or
    removed, or a rewrite in place: only the caller knows which)."""
    if current is None or not isinstance(recorded, (list, tuple)) or len(recorded) != 5:
        return False
    return matches([*recorded[:2], current[2], *recorded[3:]], current)
