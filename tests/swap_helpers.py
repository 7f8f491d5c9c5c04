"""A directory exchanged with a symlink again and again on a thread (issue 27's race tests)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from eva import libc


@contextlib.contextmanager
def exchanging(directory: Path, link: Path) -> Iterator[None]:
    """While inside, a thread exchanges ``directory`` with the symlink ``link`` in a loop
    (``renameat2(RENAME_EXCHANGE)``: the path is always one or the other); the directory is put
    back on exit. Skips the test where the kernel cannot exchange."""
    try:
        libc.rename_exchange(directory, link)
        libc.rename_exchange(directory, link)
    except OSError as e:
        pytest.skip(f"no renameat2(RENAME_EXCHANGE) here: {e}")
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            libc.rename_exchange(directory, link)

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    try:
        yield
    finally:
        stop.set()
        swapper.join(10)
        if directory.is_symlink():
            libc.rename_exchange(directory, link)
