"""The one exception type the dataset layer raises for bad input on disk or from callers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class DatasetError(ValueError):
    """A dataset (or a request against it) is invalid.

    The message is one line naming the file, episode or field at fault, so the CLI can print it
    as is. A message built from a library's multi-line text (pyarrow, FFmpeg) is folded onto one
    line here, so no caller can break that promise.
    """

    def __init__(self, message: object = "", *args: object) -> None:
        super().__init__(one_line(str(message)), *args)


def one_line(text: str) -> str:
    """``text`` with its line breaks folded into ``"; "`` (trailing ones dropped)."""
    parts = [p.strip() for p in text.splitlines() if p.strip()]
    return "; ".join(parts)


def error_line(error: BaseException) -> str:
    """``Type: message`` cut to its first line, for job records and errors naming a failure."""
    return f"{type(error).__name__}: {error}".splitlines()[0]


class UnsafePathError(DatasetError):
    """A path leads through a symlink or out of the dataset (``..``): refused, never followed.
    Its own type so a server can answer ``unsafe_path`` rather than ``bad_dataset``."""


class WriteError(DatasetError):
    """An output file could not be written (a full disk, a quota, a file size limit, EIO); the
    message is ``<file>: <reason>``, e.g. ``.../episode_000000.hdf5: No space left on device``."""


def write_error_line(path: Path | str, error: OSError) -> str:
    """``<file>: <reason>``: the file the error names itself (a copy's source, say), else
    ``path``, the one being written; the reason is the errno's text when there is one (h5py and
    pyarrow wrap it in longer messages that name no file)."""
    where = error.filename if error.filename else path
    reason = (
        os.strerror(error.errno) if error.errno else one_line(str(error)) or type(error).__name__
    )
    return f"{where}: {reason}"


@contextmanager
def naming_write_errors(path: Path | str) -> Iterator[None]:
    """Turn an ``OSError`` raised while ``path`` is written into a ``WriteError`` naming it."""
    try:
        yield
    except OSError as e:
        raise WriteError(write_error_line(path, e)) from e
