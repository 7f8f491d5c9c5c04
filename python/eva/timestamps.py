"""Wall-clock timestamps in eva's records (job files, save jobs, capture sessions).

A base module like ``eva.progress``: it imports nothing of eva, so every layer (capture, jobs,
export) can use the one definition.
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["utc_now"]


def utc_now() -> str:
    """Now in UTC, ISO 8601 with milliseconds and a ``Z`` suffix (``2026-11-30T17:44:19.123Z``)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
