"""The C library functions eva calls through ctypes, each behind one typed wrapper.

Python's ``os`` module has no ``syncfs``, ``renameat2`` or ``mallopt``; these are the only libc
calls eva makes outside it, and this is the only module that loads libc. It imports nothing of
eva, so every layer (capture, export, publish) may use it.

Each wrapper says what happens where the function is missing (a non-glibc libc, an old kernel):
``syncfs`` and ``mallopt`` return False, ``rename_exchange`` raises ``OSError(ENOSYS)``.
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


def mallopt(param: int, value: int) -> bool:
    """Set a glibc malloc parameter; False where ``mallopt`` is unavailable or refused it."""
    function = _function("mallopt")
    if function is None:
        return False
    return bool(function(ctypes.c_int(param), ctypes.c_int(value)))
