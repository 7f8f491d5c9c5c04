"""The one exception type the dataset layer raises for bad input on disk or from callers."""

from __future__ import annotations


class DatasetError(ValueError):
    """A dataset (or a request against it) is invalid.

    The message is one line naming the file, episode or field at fault, so the CLI can print it
    as is.
    """


def error_line(error: BaseException) -> str:
    """``Type: message`` cut to its first line, for job records and errors naming a failure."""
    return f"{type(error).__name__}: {error}".splitlines()[0]
