"""Crash-safe file updates: write a temporary sibling, fsync it, rename it over the target.

A reader therefore sees either the old file or the new one, never a torn one. Appending to a jsonl
file is done the same way (copy + new line + rename) so a crash can never leave half a line; the
copy is a cheap sequential read of one small metadata file, not a re-parse of the dataset.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

TMP_PREFIX = ".eva-tmp-"


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX + path.name + ".", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def dumps_json(obj: Any) -> str:
    return json.dumps(obj, indent=4, ensure_ascii=False, allow_nan=False)


def atomic_write_json(path: Path, obj: Any, *, durable: bool = True) -> None:
    atomic_write_bytes(path, (dumps_json(obj) + "\n").encode(), durable=durable)


def jsonl_line(obj: Any) -> bytes:
    return (json.dumps(obj, ensure_ascii=False, allow_nan=False) + "\n").encode()


def atomic_write_jsonl(path: Path, rows: Iterable[Any], *, durable: bool = True) -> None:
    atomic_write_bytes(path, b"".join(jsonl_line(r) for r in rows), durable=durable)


def atomic_append_jsonl(path: Path, rows: Iterable[Any], *, durable: bool = True) -> None:
    """Append rows to a jsonl file without ever exposing a partial line."""
    path = Path(path)
    try:
        old = path.read_bytes()
    except FileNotFoundError:
        old = b""
    if old and not old.endswith(b"\n"):
        old += b"\n"
    atomic_write_bytes(path, old + b"".join(jsonl_line(r) for r in rows), durable=durable)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: invalid JSON line ({e.msg})") from None
    return rows


def remove_stale_temporaries(directory: Path) -> list[Path]:
    """Delete temp files a crash left behind in ``directory`` (not recursive)."""
    removed = []
    if directory.is_dir():
        for p in directory.iterdir():
            if p.name.startswith(TMP_PREFIX) and p.is_file() and not p.is_symlink():
                p.unlink()
                removed.append(p)
    return removed
