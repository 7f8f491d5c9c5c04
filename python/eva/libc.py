"""The C library functions eva calls through ctypes, each behind one typed wrapper.

Python's ``os`` module has no ``syncfs``, ``renameat2``, ``openat2``, ``mallopt`` or ``fallocate``
(its ``posix_fallocate`` writes into every block where a filesystem cannot allocate); these are
the only libc calls eva makes outside it, and this is the only module that loads libc (it also raises
the open-file limit, through ``resource``). It imports nothing of
eva, so every layer (capture, export, publish) may use it.

Each wrapper says what happens where the function is missing (a non-glibc libc, an old kernel):
``syncfs``, ``mallopt`` and ``fallocate`` return False, ``rename_exchange`` and ``openat2`` raise
``OSError(ENOSYS)``.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
from collections.abc import Callable

RENAME_EXCHANGE = 2  # renameat2 flag: swap the two paths atomically (linux/fs.h)
AT_FDCWD = -100  # dirfd meaning "relative to the working directory" (fcntl.h)
M_MMAP_THRESHOLD = -3  # mallopt parameter (malloc.h)
SYS_OPENAT2 = 437  # the same number on every architecture eva runs on (asm-generic/unistd.h)
RESOLVE_NO_MAGICLINKS = 0x02  # openat2 resolve flags (linux/openat2.h)
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The process's C library (the symbols already loaded), or None where it cannot be opened."""
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _function(name: str) -> Callable[..., int] | None:
    libc = _libc()
    return getattr(libc, name, None) if libc is not None else None


def syncfs(fd: int) -> bool:
    """Flush every dirty page of the filesystem holding the open ``fd``; False when ``syncfs``
    is unavailable or failed (the caller then falls back to ``os.sync``)."""
    function = _function("syncfs")
    return function is not None and function(ctypes.c_int(fd)) == 0


def rename_exchange(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> None:
    """Swap the paths ``a`` and ``b`` atomically (``renameat2(RENAME_EXCHANGE)``).

    ``OSError(ENOSYS)`` when libc has no ``renameat2``; the call's ``OSError`` (``EINVAL`` on a
    filesystem that cannot exchange) naming ``a`` otherwise.
    """
    function = _function("renameat2")
    if function is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    rc = function(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(a))


RENAME_NOREPLACE = 1  # renameat2 flag: fail with EEXIST rather than replace the target


def rename_noreplace(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> None:
    """Rename ``a`` to ``b`` only if ``b`` does not exist (``renameat2(RENAME_NOREPLACE)``):
    ``OSError(EEXIST)`` naming ``b`` when it does, even an empty directory a plain rename would
    replace. ``OSError(ENOSYS)`` when libc has no ``renameat2``; ``EINVAL`` where the
    filesystem cannot honour the flag."""
    function = _function("renameat2")
    if function is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    rc = function(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_NOREPLACE)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(b))


def mallopt(param: int, value: int) -> bool:
    """Set a glibc malloc parameter; False where ``mallopt`` is unavailable or refused it."""
    function = _function("mallopt")
    if function is None:
        return False
    return bool(function(ctypes.c_int(param), ctypes.c_int(value)))


# fallocate mode: allocate the blocks, leave the file's size (linux/falloc.h)
FALLOC_FL_KEEP_SIZE = 0x01


def fallocate(fd: int, offset: int, length: int, *, keep_size: bool = False) -> bool:
    """Allocate the blocks of bytes ``offset`` to ``offset + length`` of the open ``fd``, so that
    writes there cannot run out of space. False where ``fallocate`` is unavailable or the
    filesystem cannot allocate ahead (nothing was done); the call's ``OSError`` otherwise
    (``ENOSPC``: the blocks are not there to allocate)."""
    if length <= 0:
        return True  # nothing to allocate (the call refuses a zero length)
    function = _function("fallocate64") or _function("fallocate")
    if function is None:
        return False
    mode = FALLOC_FL_KEEP_SIZE if keep_size else 0
    rc = function(
        ctypes.c_int(fd), ctypes.c_int(mode), ctypes.c_int64(offset), ctypes.c_int64(length)
    )
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EOPNOTSUPP, errno.ENOSYS):
        return False
    raise OSError(err, os.strerror(err))


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def openat2(dir_fd: int, path: str, flags: int, resolve: int) -> int:
    """``openat2(dir_fd, path, {flags, 0, resolve})``: an fd, or the call's ``OSError`` naming
    ``path``; ``OSError(ENOSYS)`` where libc has no ``syscall`` or the kernel no ``openat2``
    (before Linux 5.6; a seccomp filter may answer ``EPERM`` instead)."""
    function = _function("syscall")
    if function is None:
        raise OSError(errno.ENOSYS, "syscall is not available")
    how = _OpenHow(flags, 0, resolve)
    fd = function(
        ctypes.c_long(SYS_OPENAT2),
        ctypes.c_int(dir_fd),
        ctypes.c_char_p(os.fsencode(path)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def raise_open_file_limit() -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit; returns the soft limit in
    force. Entry points that record call it (``eva collect``, ``eva console``): the usual soft
    limit of 1024 is small beside a console's clients, and saving an episode must never fail
    for want of a file descriptor."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # e.g. above fs.nr_open: keep the soft limit
            pass
    return soft


PR_SET_PDEATHSIG = 1  # prctl option: the signal a process gets when its parent dies (linux/prctl.h)


def die_with_parent(parent: int, signum: int) -> bool:
    """Have the kernel send ``signum`` to this process when ``parent`` (the pid that started it)
    dies, a ``kill -9`` included: ``prctl(PR_SET_PDEATHSIG)``. A parent already gone before the
    call sends nothing, so this process then exits at once (``os._exit(1)``). Returns False
    where ``prctl`` is unavailable (the caller needs another watch: its parent pid, a pipe).

    The signal comes when the *thread* that started this process exits: only for children of
    a thread that outlives them (a process pool's, stopped by the thread that made it)."""
    function = _function("prctl")
    armed = (
        function is not None
        and function(ctypes.c_int(PR_SET_PDEATHSIG), ctypes.c_ulong(signum)) == 0
    )
    if os.getppid() != parent:
        os._exit(1)
    return armed
