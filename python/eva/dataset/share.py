"""Give an export its own copy of a raw dataset file, sharing blocks or the inode where safe.

``share_file`` takes the source as a ``FileBeneath`` (opened beneath the dataset root, no link
followed at any component) or a path (opened without following a final link), once, and makes
the new file from that open file only: a reflink (``FICLONE``) clones its blocks, a hard link
is made to the open inode through its ``/proc/self/fd`` magic link (``linkat`` with
``AT_SYMLINK_FOLLOW``: what is linked is the file open, never whatever the path names by
then), a copy reads the fd. The read-only rule (docs/safety.md section 1): a hard link only to a
read-only raw file, so a consumer cannot open the shared inode for writing without first
changing its mode.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from eva.dataset.errors import DatasetError, WriteError, write_error_line
from eva.dataset.fsafe import (
    FileBeneath,
    Readable,
    has_proc_fd,
    is_read_only,
    name_of,
    open_regular,
    os_error,
    proc_path,
    real_directory,
)

__all__ = ["FICLONE", "copy_file", "copy_range", "reflink", "share_file"]

# linux/fs.h: _IOW(0x94, 9, int)
FICLONE = 0x40049409
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# copy_file_range fails with these where the kernel or filesystem cannot copy between the two
# files (across filesystem types, some FUSE and network filesystems): copy through a buffer.
_NO_KERNEL_COPY = frozenset(
    {errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM}
)
_KERNEL_STEP = 1 << 30  # bytes per copy_file_range call (nothing passes through this process)
_BUFFER = 8 << 20  # bytes per read where the kernel cannot copy

T = TypeVar("T")


def reflink(src_fd: int, dest_fd: int) -> bool:
    """Clone ``src_fd``'s blocks into the empty ``dest_fd`` (``FICLONE``); False where the
    filesystem cannot (ext4, another filesystem)."""
    try:
        fcntl.ioctl(dest_fd, FICLONE, src_fd)
        return True
    except OSError as e:
        if e.errno in (
            errno.EOPNOTSUPP,
            errno.ENOTSUP,
            errno.EXDEV,
            errno.EINVAL,
            errno.ENOTTY,
            errno.EPERM,
            errno.ETXTBSY,
            errno.EBADF,
        ):
            return False
        raise


def copy_range(src_fd: int, dest_fd: int, offset: int, length: int) -> int:
    """Write ``length`` bytes of ``src_fd`` from ``offset`` at ``dest_fd``'s position (which
    advances): in the kernel (``copy_file_range``) where it can, else through a buffer. Returns
    the bytes copied, fewer than ``length`` only when ``src_fd`` ends first. ``OSError`` as
    raised (the callers name the file)."""
    done = 0
    while done < length:  # in the kernel
        try:
            n = os.copy_file_range(src_fd, dest_fd, min(length - done, _KERNEL_STEP), offset + done)
        except OSError as e:
            if e.errno not in _NO_KERNEL_COPY:
                raise
            break
        if n == 0:
            return done
        done += n
    while done < length:  # through this process
        data = os.pread(src_fd, min(length - done, _BUFFER), offset + done)
        if not data:
            return done
        view = memoryview(data)
        while view:
            view = view[os.write(dest_fd, view) :]
        done += len(data)
    return done


def copy_file(src: Readable, dest: Path | str) -> int:
    """A new file ``dest`` (in a real directory; a new inode, never a hard link, so writing it
    cannot reach ``src``) with the bytes of the regular file ``src``: a reflink where the
    filesystem has them (shared blocks are copied on write), else a copy. Returns the bytes
    ``dest`` got (fewer than ``src``'s size only when it shrank meanwhile); a write error is a
    ``WriteError`` naming ``dest``."""
    dest = Path(dest)
    src_fd = _open_source(src)
    try:
        size = os.fstat(src_fd).st_size

        def fill(dest_fd: int) -> int:
            return size if reflink(src_fd, dest_fd) else copy_range(src_fd, dest_fd, 0, size)

        return _new_file(dest, fill, lambda e: WriteError(write_error_line(dest, e)))
    finally:
        os.close(src_fd)


def share_file(src: Readable, dest: Path | str, *, link: bool = True) -> str:
    """Give ``dest`` (new, in a real directory) the content of the regular file ``src``.

    Returns how, in this order of preference: ``"reflink"`` (copy-on-write clone: no data
    copied, and writing ``dest`` never changes ``src``), ``"link"`` (hard link, only when ``src``
    is read-only, so a consumer cannot open the shared inode for writing without first changing
    its mode), or ``"copy"``.
    ``link=False`` forbids sharing blocks or inodes (always a copy). The source is opened once
    (a ``FileBeneath`` beneath its root, a path without following a final link) and everything
    is made from that open file: a link in its place is neither linked nor followed.
    """
    dest = Path(dest)
    name = name_of(src)
    src_fd = _open_source(src)
    try:
        st = os.fstat(src_fd)

        def error(e: OSError) -> DatasetError:
            return os_error(e, dest)

        # a reflink attempt's empty file is removed when the filesystem has none
        if link and _new_file(dest, lambda fd: reflink(src_fd, fd), error, keep=bool):
            return "reflink"
        if link and is_read_only(st) and _hard_link(src_fd, name, dest, st):
            return "link"
        _new_file(dest, lambda fd: copy_range(src_fd, fd, 0, st.st_size), error)
        return "copy"
    finally:
        os.close(src_fd)


def _always(_: object) -> bool:
    return True


def _open_source(src: Readable) -> int:
    try:
        return src.open() if isinstance(src, FileBeneath) else open_regular(src)
    except FileNotFoundError as e:
        raise os_error(e, name_of(src)) from None


def _new_file(
    dest: Path,
    fill: Callable[[int], T],
    error: Callable[[OSError], DatasetError],
    keep: Callable[[T], bool] = _always,
) -> T:
    """``fill``'s result on the new file ``dest`` (created exclusively in a real directory,
    never through a link), which is removed when ``fill`` raises or ``keep`` of its result is
    false; an ``OSError`` on the way raises ``error`` of it."""
    real_directory(dest.parent)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(dest, flags, 0o666)
    except OSError as e:
        raise error(e) from None
    kept = False
    try:
        result = fill(fd)
        kept = keep(result)
        return result
    except OSError as e:
        raise error(e) from None
    finally:
        os.close(fd)
        if not kept:
            with contextlib.suppress(OSError):
                os.unlink(dest)


def _hard_link(src_fd: int, name: Path, dest: Path, st: os.stat_result) -> bool:
    """Hard-link the open file ``src_fd`` (whose ``fstat`` is ``st``; ``name`` for messages) to
    ``dest``; False where /proc is missing or the filesystem or the kernel's
    protected_hardlinks refuses (then the caller copies)."""
    if not has_proc_fd():
        return False
    try:
        parent_fd = os.open(dest.parent, _DIR_FLAGS)
    except OSError as e:
        raise os_error(e, dest.parent) from None
    try:
        # linkat(AT_SYMLINK_FOLLOW) on the magic link links the inode it resolves to: the open
        # file (no privilege needed, unlike AT_EMPTY_PATH), never a path looked up again.
        # A dir fd is given because os.link without one calls link(2), which follows nothing.
        os.link(proc_path(src_fd), dest.name, dst_dir_fd=parent_fd, follow_symlinks=True)
    except OSError as e:
        if e.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES):
            return False
        if e.errno == errno.ENOENT and os.fstat(src_fd).st_nlink == 0:
            raise DatasetError(f"{name}: deleted while being linked; not exporting it") from None
        raise os_error(e, dest) from None
    finally:
        os.close(parent_fd)
    linked = os.lstat(dest)
    if (linked.st_dev, linked.st_ino) != (st.st_dev, st.st_ino):  # cannot happen; cheap to say
        os.unlink(dest)
        raise DatasetError(f"{name}: changed while being linked; not exporting it")
    return True
