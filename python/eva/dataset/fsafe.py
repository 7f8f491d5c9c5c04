"""Filesystem safety for every path eva reads or writes inside a dataset or an export root.

A dataset someone hands over is hostile input: any file or directory in it may be a symlink (to
somewhere outside, or to another episode's file), a FIFO (an open that blocks forever) or a
device. The rules, applied here in one place:

- The root the user names is taken as given (it may itself be a symlink: that is the user's
  choice of path). Below it, eva never follows a symlink: ``contained`` lstat()s each component
  and refuses a link or a ``..``; ``check_dataset_tree`` does that for every path eva manages
  (``meta/``, the metadata files, ``.eva-work/`` and its locks, ``data/``, ``videos/``);
  ``check_export_tree`` for an export root and the directory beside it that holds its lock.
- Files are read only through ``open_regular``: ``O_NOFOLLOW`` (the last component cannot be a
  link), ``O_NONBLOCK`` (opening a FIFO returns at once instead of waiting for a writer), then
  ``fstat`` must say regular file, then ``O_NONBLOCK`` is cleared. ``read_bytes`` and
  ``open_binary`` wrap it (JSON and JSONL).
- Files read below a dataset root (info.json, the jsonl files, stats, episode parquet tables,
  the episode MP4s decoded, parsed or shared by validation and the exports, the videos and
  series the console serves) are opened by ``open_beneath`` on every read: relative to a
  directory fd of the root, refusing a link at every component (``openat2`` with
  ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`` where the kernel has it, else a walk of
  ``O_NOFOLLOW`` directory fds), and the bytes are read from that fd (json, pyarrow through a
  file object, the MP4 box parser and packet copies with ``pread``). The reader hands such a
  file out as a ``FileBeneath`` (root and relative path, no ``__fspath__``); a library that
  opens paths itself (FFmpeg, through PyAV) gets ``proc_path(fd)``, the magic link naming the
  file already opened. No swap between a check and an open exists to exploit.
- Files are created only through ``create_file`` (``O_NOFOLLOW``, mode 0o666 so the umask
  decides, as for any other program) in a parent checked by ``real_directory``. A rewrite keeps
  the old file's mode (``eva.dataset.atomic``).
- Committed raw episode files are read-only (``make_read_only``). ``eva.dataset.share``
  gives an export its own copy of a raw file (reflink, hard link to a read-only file, or copy).
- ``os_error`` turns an ``OSError`` (EACCES, EROFS, ENOSPC, ELOOP...) into a one-line
  ``DatasetError`` naming the path.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from eva import libc
from eva.dataset import layout
from eva.dataset.errors import DatasetError, UnsafePathError

__all__ = [
    "FileBeneath",
    "Readable",
    "check_dataset_tree",
    "check_export_tree",
    "check_subtree",
    "contained",
    "create_file",
    "is_read_only",
    "make_read_only",
    "name_of",
    "named",
    "open_beneath",
    "open_binary",
    "open_binary_beneath",
    "open_readable",
    "open_regular",
    "os_error",
    "has_proc_fd",
    "proc_path",
    "read_bytes",
    "read_text",
    "real_directory",
]

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


def _symlink_error(path: Path | str) -> DatasetError:
    return UnsafePathError(
        f"{path}: is a symlink; eva follows no links inside a dataset or an export tree"
    )


def os_error(error: OSError, path: Path | str | None = None) -> DatasetError:
    """A one-line ``DatasetError`` for ``error``, naming ``path`` (else the error's filename)."""
    where = path if path is not None else error.filename
    if error.errno == errno.ELOOP:
        return _symlink_error(where)
    reason = error.strerror or str(error)
    return DatasetError(f"{where}: {reason}" if where is not None else reason)


def named(error: OSError, path: Path | str) -> OSError:
    """``error`` as the same ``OSError`` subclass naming ``path`` (ENOSPC, EIO... from a write
    name no file on their own); keeps its type so ``except OSError`` callers still see it."""
    if error.filename is not None or error.errno is None:
        return error
    return type(error)(error.errno, error.strerror or str(error), str(path))


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def _not_regular(path: Path | str, mode: int) -> DatasetError:
    return DatasetError(f"{path}: not a regular file ({_kind(mode)}); eva reads only regular files")


def _lstat(path: Path | str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None  # a parent is a file: the component is missing, reported by the caller
    except OSError as e:
        raise os_error(e, path) from None


def contained(root: Path | str, rel: Path | str, what: str | None = None) -> Path:
    """``root / rel``, refusing a ``..`` or a symlink in any component below ``root``.

    ``rel`` may also be a path under ``root``. Components that do not exist yet are fine (the
    caller reports a missing file in its own words). ``what`` is ``"file"`` or ``"dir"``: an
    existing final component must then be a regular file / a real directory.
    """
    root = Path(root)
    rel_path = Path(rel)
    if rel_path.is_absolute():
        try:
            rel_path = rel_path.relative_to(root)
        except ValueError:
            raise DatasetError(f"{rel}: not inside {root}") from None
    path = root
    parts = rel_path.parts
    for i, part in enumerate(parts):
        if part in ("..", "") or "\x00" in part:
            raise UnsafePathError(f"{root / rel_path}: leads outside {root} ('..')")
        if part == ".":
            continue
        path = path / part
        st = _lstat(path)
        if st is None:
            return root / rel_path
        if stat.S_ISLNK(st.st_mode):
            raise _symlink_error(path)
        last = i == len(parts) - 1
        if not last and not stat.S_ISDIR(st.st_mode):
            return root / rel_path  # e.g. a file where a directory should be: "missing" below
        if last and what == "file" and not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, st.st_mode)
        if last and what == "dir" and not stat.S_ISDIR(st.st_mode):
            raise DatasetError(f"{path}: not a directory ({_kind(st.st_mode)})")
    return root / rel_path


def real_directory(path: Path | str, *, create: bool = False) -> Path:
    """``path`` as an existing real directory (not a symlink), made first if ``create``."""
    path = Path(path)
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            pass  # a dangling symlink or a file: refused below
        except OSError as e:
            raise named(e, path) from None  # EACCES/EROFS/ENOSPC stay OSErrors
    st = _lstat(path)
    if st is None:
        raise DatasetError(f"{path}: missing directory")
    if stat.S_ISLNK(st.st_mode):
        raise _symlink_error(path)
    if not stat.S_ISDIR(st.st_mode):
        raise DatasetError(f"{path}: not a directory ({_kind(st.st_mode)})")
    return path


# Paths eva manages in a raw dataset, and what each must be if it exists.
_DATASET_DIRS = (layout.META_DIR, layout.WORK_DIR, "data", "videos")
_DATASET_FILES = (
    layout.INFO,
    layout.EPISODES,
    layout.EPISODES_STATS,
    layout.TASKS,
    layout.STATS,
    layout.IMAGE_HISTOGRAMS,
    f"{layout.WORK_DIR}/{layout.WRITER_LOCK}",
    f"{layout.WORK_DIR}/{layout.META_LOCK}",
)


def check_dataset_tree(root: Path | str, *, episode_files: bool = False) -> Path:
    """Refuse a dataset where an eva-managed path is a symlink or of the wrong kind.

    The one containment check shared by qc, cleanup, the writer, the console, validate and
    export. ``episode_files`` also walks ``data/`` and ``videos/`` (every episode file must be a
    regular file in real directories); without it, those are checked as they are opened.
    """
    root = Path(root)
    for rel in _DATASET_DIRS:
        contained(root, rel, "dir")
    for rel in _DATASET_FILES:
        contained(root, rel, "file")
    work = root / layout.WORK_DIR
    if work.is_dir():
        for entry in _scandir(work):
            if entry.name.endswith(".lock"):
                contained(root, Path(layout.WORK_DIR, entry.name), "file")
    if episode_files:
        for top in ("data", "videos"):
            check_subtree(root / top)
    return root


def _scandir(directory: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as it:
            return list(it)
    except FileNotFoundError:
        return []
    except OSError as e:
        raise os_error(e, directory) from None


def check_subtree(directory: Path | str) -> None:
    """Refuse a symlink or a file that is not regular (a FIFO, a socket, a device) anywhere
    below ``directory`` (itself taken as given; missing: nothing to check). For trees eva reads
    through libraries that open paths themselves (pyarrow, PyAV, h5py, mcap): an exported
    subset someone hands over is checked this way before any of its files is opened."""
    directory = Path(directory)
    if _lstat(directory) is None:
        return
    for entry in _scandir(directory):
        path = Path(entry.path)
        if entry.is_symlink():
            raise _symlink_error(path)
        if entry.is_dir(follow_symlinks=False):
            check_subtree(path)
        elif not entry.is_file(follow_symlinks=False):
            raise _not_regular(path, entry.stat(follow_symlinks=False).st_mode)


def check_export_tree(root: Path | str) -> Path:
    """Refuse an export root ``<parent>/export/<fmt>`` where ``<parent>/export`` or the root
    itself is a symlink or not a directory (the export would write outside), or where the lock
    beside it is a symlink. Nothing is created."""
    root = Path(root)
    for path, what in ((root.parent, "dir"), (root, "dir")):
        st = _lstat(path)
        if st is None:
            continue
        if stat.S_ISLNK(st.st_mode):
            raise DatasetError(f"{path}: is a symlink; eva does not export through links")
        if what == "dir" and not stat.S_ISDIR(st.st_mode):
            raise DatasetError(f"{path}: not a directory ({_kind(st.st_mode)})")
    return root


def open_regular(path: Path | str, flags: int = os.O_RDONLY, mode: int = 0o666) -> int:
    """An fd of ``path``, which must be a regular file and not a symlink.

    ``flags`` may add ``O_RDWR``/``O_WRONLY``/``O_APPEND``/``O_CREAT``... A FIFO does not block
    the open (``O_NONBLOCK``, cleared once ``fstat`` has said regular file). Raises
    ``FileNotFoundError`` for a missing file (callers word that themselves), ``DatasetError``
    for a link, a non-regular file or another ``OSError``.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno == errno.ENXIO:  # write-only open of a FIFO without a reader
            raise DatasetError(
                f"{path}: not a regular file (a FIFO); eva reads only regular files"
            ) from None
        raise os_error(e, path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, st.st_mode)
        fl = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, fl & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


_openat2_missing = False


def _openat2(dir_fd: int, rel: str, flags: int) -> int | None:
    """``openat2`` beneath ``dir_fd`` following no link; None where the kernel lacks it or a
    seccomp filter denies it (the caller walks instead)."""
    global _openat2_missing
    if _openat2_missing:
        return None
    resolve = libc.RESOLVE_BENEATH | libc.RESOLVE_NO_SYMLINKS | libc.RESOLVE_NO_MAGICLINKS
    try:
        return libc.openat2(dir_fd, rel, flags, resolve)
    except OSError as e:
        if e.errno in (errno.ENOSYS, errno.EPERM):
            _openat2_missing = True
            return None
        if e.errno == errno.EXDEV:  # RESOLVE_BENEATH: the path would leave the root
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), rel) from None
        raise


def _walk_open(dir_fd: int, parts: list[str], flags: int) -> int:
    """The ``openat2`` fallback: each directory opened ``O_NOFOLLOW`` from its parent's fd."""
    current = dir_fd
    try:
        for part in parts[:-1]:
            fd = os.open(part, _DIR_FLAGS, dir_fd=current)
            if current != dir_fd:
                os.close(current)
            current = fd
        return os.open(parts[-1], flags, dir_fd=current)
    finally:
        if current != dir_fd:
            os.close(current)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_beneath(root: Path | str, rel: Path | str, *, root_may_link: bool = False) -> int:
    """An fd of the regular file ``root / rel``, opened now without following a link at the
    root or any component below it (``..`` refused too). Nothing is remembered between calls:
    a directory swapped for a link after an earlier call is refused by the next one.
    ``root_may_link``: the root itself may be a symlink (a path the user named: their choice).

    Raises ``FileNotFoundError`` for a missing file or directory, ``DatasetError`` for a link
    (naming ``root / rel``), a non-regular file or another ``OSError``.
    """
    path = Path(root) / rel
    parts = [p for p in Path(rel).parts if p != "."]
    if not parts or Path(rel).is_absolute() or any(p == ".." or "\x00" in p for p in parts):
        raise UnsafePathError(f"{path}: leads outside {root}")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        root_fd = os.open(root, _DIR_FLAGS & ~os.O_NOFOLLOW if root_may_link else _DIR_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno == errno.ENOTDIR and os.path.islink(root):
            raise _symlink_error(root) from None
        raise os_error(e, root) from None
    try:
        fd = _openat2(root_fd, "/".join(parts), flags)
        if fd is None:
            fd = _walk_open(root_fd, parts, flags)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):  # a link (or a file) on the way
            raise UnsafePathError(
                f"{path}: it or a directory on its way is a symlink (or not a directory); "
                "eva follows no links inside a dataset"
            ) from None
        if e.errno == errno.ENXIO:
            raise _not_regular(path, stat.S_IFIFO) from None
        raise os_error(e, path) from None
    finally:
        os.close(root_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, st.st_mode)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_binary_beneath(root: Path | str, rel: Path | str, *, root_may_link: bool) -> BinaryIO:
    """``open(root / rel, "rb")`` through ``open_beneath``: what the dataset reader reads from
    (pyarrow and json take the file object, so no path is opened a second time)."""
    return os.fdopen(open_beneath(root, rel, root_may_link=root_may_link), "rb")


@dataclass(frozen=True)
class FileBeneath:
    """A regular file of a dataset named by its root and its path below it, to be opened
    beneath the root (``open_beneath``) every time it is read: what the reader hands to the
    decoders, the box parser and the exports instead of a path. It has no ``__fspath__`` on
    purpose: it cannot be given to a library that would open a path itself; ``path`` is its
    name in messages, ``proc_path`` names an fd of it for a library that must open a path."""

    root: Path
    rel: str
    root_may_link: bool = True

    @property
    def path(self) -> Path:
        return self.root / self.rel

    def open(self) -> int:
        """An fd of the file, opened now beneath the root (see ``open_beneath`` for errors)."""
        return open_beneath(self.root, self.rel, root_may_link=self.root_may_link)

    def __str__(self) -> str:
        return str(self.path)


# A file read by a decoder, the box parser or an export: a path eva wrote or was handed (opened
# as it is), or a dataset file opened beneath its root.
Readable = Path | FileBeneath


def name_of(source: Readable) -> Path:
    """The path naming ``source`` in messages."""
    return source.path if isinstance(source, FileBeneath) else Path(source)


def open_readable(source: Readable) -> int:
    """An fd of ``source``: beneath its root for a ``FileBeneath``, else the path opened as it
    is (a path eva wrote itself, or one a user named). ``FileNotFoundError`` when missing."""
    if isinstance(source, FileBeneath):
        return source.open()
    return os.open(source, os.O_RDONLY | os.O_CLOEXEC)


def proc_path(fd: int) -> str:
    """``/proc/self/fd/<fd>``: a path that names the open file ``fd`` itself (the kernel's
    magic link resolves to that file, whatever happens to its path meanwhile). For libraries
    that open a path and then do their own fast I/O (FFmpeg): no Python callback per read."""
    return f"/proc/self/fd/{fd}"


def has_proc_fd() -> bool:
    """Whether ``proc_path`` works here (/proc is mounted)."""
    return os.path.isdir("/proc/self/fd")


def open_binary(path: Path | str) -> BinaryIO:
    """``open(path, "rb")`` through ``open_regular`` (for pyarrow, PyAV and json)."""
    return os.fdopen(open_regular(path), "rb")


def read_bytes(path: Path | str) -> bytes:
    with open_binary(path) as f:
        return f.read()


def read_text(path: Path | str) -> str:
    """``Path.read_text(encoding="utf-8")`` through ``open_regular`` (a link or a FIFO is a
    ``DatasetError``, a ``ValueError`` like the ``UnicodeDecodeError`` of bad bytes)."""
    return read_bytes(path).decode("utf-8")


def create_file(path: Path | str, flags: int = os.O_RDWR, mode: int = 0o666) -> int:
    """An fd of ``path``, created if missing (``mode`` before the umask), never through a
    symlink; an existing file must be regular. The parent must be a real directory."""
    path = Path(path)
    real_directory(path.parent)
    try:
        return open_regular(path, flags | os.O_CREAT, mode)
    except FileNotFoundError as e:
        raise os_error(e, path) from None


def is_read_only(st: os.stat_result) -> bool:
    return not st.st_mode & _WRITE_BITS


def make_read_only(path: Path | str) -> None:
    """Drop every write bit (committed raw evidence: 0444 under the usual umask)."""
    st = os.lstat(path)
    os.chmod(path, stat.S_IMODE(st.st_mode) & ~_WRITE_BITS, follow_symlinks=False)
