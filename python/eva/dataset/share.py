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
from pathlib import Path

from eva.dataset.errors import DatasetError
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

__all__ = ["FICLONE", "reflink", "share_file"]

# linux/fs.h: _IOW(0x94, 9, int)
FICLONE = 0x40049409
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


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
    try:
        src_fd = src.open() if isinstance(src, FileBeneath) else open_regular(src)
    except FileNotFoundError as e:
        raise os_error(e, name) from None
    try:
        st = os.fstat(src_fd)
        dest_fd = _create_new(dest)
        try:
            if link and reflink(src_fd, dest_fd):
                return "reflink"
            if link and is_read_only(st):
                os.close(dest_fd)
                dest_fd = -1
                os.unlink(dest)
                if _hard_link(src_fd, name, dest, st):
                    return "link"
                dest_fd = _create_new(dest)
            _copy_fd(src_fd, dest_fd, st.st_size, dest)
            return "copy"
        except BaseException:
            if dest_fd >= 0:
                os.close(dest_fd)
                dest_fd = -1
            with contextlib.suppress(OSError):
                os.unlink(dest)
            raise
        finally:
            if dest_fd >= 0:
                os.close(dest_fd)
    finally:
        os.close(src_fd)


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


def _create_new(path: Path) -> int:
    real_directory(path.parent)
    try:
        return os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666
        )
    except OSError as e:
        raise os_error(e, path) from None


def _copy_fd(src_fd: int, dest_fd: int, size: int, dest: Path) -> None:
    offset = 0
    try:
        while offset < size:
            try:
                n = os.copy_file_range(src_fd, dest_fd, size - offset, offset, offset)
            except OSError as e:
                if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                n = _copy_blocks(src_fd, dest_fd, offset)
                offset += n
                break
            if n == 0:
                break
            offset += n
    except OSError as e:
        raise os_error(e, dest) from None


def _copy_blocks(src_fd: int, dest_fd: int, offset: int) -> int:
    copied = 0
    while True:
        block = os.pread(src_fd, 1 << 20, offset + copied)
        if not block:
            return copied
        view = memoryview(block)
        while view:
            written = os.pwrite(dest_fd, view, offset + copied)
            view = view[written:]
            copied += written
