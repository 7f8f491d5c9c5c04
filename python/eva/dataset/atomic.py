"""Crash-safe file updates: write a temporary sibling, fsync it, rename it over the target.

A reader therefore sees either the old file or the new one, never a torn one. Appending lines to
a small file can be done the same way (``atomic_append_lines``: copy + new lines + rename), so a
crash can never leave half a line; its cost grows with the file.

``append_jsonl_inplace`` is the O(1) alternative for files that grow by one row per episode
(the dataset writer's episodes.jsonl / episodes_stats.jsonl / tasks.jsonl): one ``write`` of
complete lines to an ``O_APPEND`` descriptor, then fsync. A line only counts once its ``\n`` is
there: ``read_jsonl`` ignores an unterminated final fragment that does not parse (an append in
progress, or one cut short by a crash), and ``heal_jsonl_tail`` / the next in-place append drop
such a fragment, so readers still see either the old rows or the old rows plus the new ones.
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


def atomic_append_lines(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Append complete lines (``data``) to a small text file by copy + rename, so no reader ever
    sees a partial line; a final line that lacks its newline is terminated first."""
    path = Path(path)
    try:
        old = path.read_bytes()
    except FileNotFoundError:
        old = b""
    if old and not old.endswith(b"\n"):
        old += b"\n"
    atomic_write_bytes(path, old + data, durable=durable)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a jsonl file. An unterminated final fragment that does not parse is an append in
    progress (or cut short by a crash) and is ignored; any other bad line raises ValueError."""
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    torn_tail_possible = not data.endswith(b"\n")
    rows = []
    for lineno, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8").strip()
            if not line:
                continue
            rows.append(json.loads(line))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            if torn_tail_possible and lineno == len(lines):
                break
            reason = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8"
            raise ValueError(f"{path}:{lineno}: invalid JSON line ({reason})") from None
    return rows


def _unterminated_tail(fd: int) -> tuple[int, bytes]:
    """(offset, bytes) of what follows the file's last newline; reads only the tail."""
    size = os.fstat(fd).st_size
    tail = b""
    pos = size
    while pos > 0:
        step = min(65536, pos)
        pos -= step
        block = os.pread(fd, step, pos)
        cut = block.rfind(b"\n")
        if cut >= 0:
            tail = block[cut + 1 :] + tail
            break
        tail = block + tail
    return size - len(tail), tail


def _heal_fd(fd: int) -> bool:
    """Make the file end at a line boundary; True if it had to change anything."""
    start, tail = _unterminated_tail(fd)
    if not tail:
        return False
    try:
        json.loads(tail.decode("utf-8"))
        complete = bool(tail.strip())
    except (UnicodeDecodeError, json.JSONDecodeError):
        complete = False
    if complete:
        _write_all(fd, b"\n")  # a whole row that only lacks its newline (e.g. a hand edit)
    else:
        os.ftruncate(fd, start)  # the torn fragment of an interrupted append
    return True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def has_torn_tail(path: Path) -> bool:
    """True when the file ends in an unterminated fragment that is not a complete JSON row."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        _, tail = _unterminated_tail(fd)
    finally:
        os.close(fd)
    if not tail.strip():
        return bool(tail)
    try:
        json.loads(tail.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return True
    return False


def heal_jsonl_tail(path: Path, *, durable: bool = True) -> bool:
    """Drop a torn final fragment (or terminate a complete final row); True if changed."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND)
    except FileNotFoundError:
        return False
    try:
        changed = _heal_fd(fd)
        if changed and durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    return changed


def append_jsonl_inplace(path: Path, rows: Iterable[Any], *, durable: bool = True) -> None:
    """Append complete lines in O(1) (no copy of the file); see the module docstring.

    Concurrent writers of the same file must be serialised by the caller (a lock).
    """
    path = Path(path)
    data = b"".join(jsonl_line(r) for r in rows)
    created = not path.exists()
    if created:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        _heal_fd(fd)
        _write_all(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    if created and durable:
        fsync_dir(path.parent)


def remove_stale_temporaries(directory: Path) -> list[Path]:
    """Delete temp files a crash left behind in ``directory`` (not recursive)."""
    removed = []
    if directory.is_dir():
        for p in directory.iterdir():
            if p.name.startswith(TMP_PREFIX) and p.is_file() and not p.is_symlink():
                p.unlink()
                removed.append(p)
    return removed
