"""Crash-safe file updates: write a temporary sibling, fsync it, rename it over the target.

A reader therefore sees either the old file or the new one, never a torn one. Appending lines to
a file that way (copy + new lines + rename) costs time that grows with the file, so files that
grow are appended to in place instead (bench/bench_dataset.py measures both).

``append_jsonl_inplace`` appends in O(1), for files that grow by one row per episode (the
dataset writer's episodes.jsonl / episodes_stats.jsonl / tasks.jsonl): one ``write`` of
complete lines to an ``O_APPEND`` descriptor, then fsync. A line only counts once its ``\n`` is
there: ``read_jsonl`` ignores an unterminated final fragment that does not parse (an append in
progress, or one cut short by a crash), and ``heal_jsonl_tail`` / the next in-place append drop
such a fragment, so readers still see either the old rows or the old rows plus the new ones.

Every file is opened without following symlinks and must be a regular file
(``eva.dataset.fsafe``). A new file gets mode 0o666 minus the umask, like any other program's; a
rewrite keeps the mode of the file it replaces (a 0644 episodes.jsonl stays readable by the
training account after ``eva qc``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from eva import libc
from eva.dataset import fsafe
from eva.dataset.errors import DatasetError

TMP_PREFIX = ".eva-tmp-"


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_filesystem(path: Path) -> None:
    """Flush every dirty page of the filesystem holding ``path`` (one ``syncfs``, not N fsyncs)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if not libc.syncfs(fd):
            os.sync()
    finally:
        os.close(fd)


def _create_temporary(path: Path) -> tuple[int, Path]:
    """A new, exclusive temp file beside ``path`` (``O_EXCL|O_NOFOLLOW``, mode 0o666 minus the
    umask; ``tempfile.mkstemp`` would make it 0600)."""
    for _ in range(100):
        tmp = path.parent / f"{TMP_PREFIX}{path.name}.{secrets.token_hex(4)}"
        try:
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666
            )
        except FileExistsError:
            continue
        except OSError as e:
            raise fsafe.named(e, tmp) from None
        return fd, tmp
    raise OSError(errno.EEXIST, "no free temporary file name", str(path))


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` (see the module docstring); the parent directory must be a
    real directory (it is made if missing) and ``path``, if it exists, a regular file whose mode
    the new file keeps."""
    path = Path(path)
    fsafe.real_directory(path.parent, create=True)
    try:
        old = os.lstat(path)
    except FileNotFoundError:
        old = None
    except OSError as e:
        raise fsafe.named(e, path) from None
    if old is not None and not stat.S_ISREG(old.st_mode):
        if stat.S_ISLNK(old.st_mode):
            raise fsafe.os_error(OSError(errno.ELOOP, "symlink"), path)
        raise DatasetError(f"{path}: not a regular file; eva does not replace it")
    fd, tmp = _create_temporary(path)
    try:
        with os.fdopen(fd, "wb") as f:
            if old is not None:
                os.fchmod(f.fileno(), stat.S_IMODE(old.st_mode))
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename is None:
            raise fsafe.named(e, path) from None  # ENOSPC/EIO name no file by themselves
        raise
    if durable:
        fsync_dir(path.parent)


class NotJSONError(DatasetError):
    """A value read back from a hand-edited file that JSON has no text for (``NaN``): eva
    writes JSON only, so the rewrite is refused, naming the file, the row and the field."""


def first_problem(
    value: Any, problem_of: Callable[[Any], str | None], where: str = ""
) -> tuple[str, str] | None:
    """``(dotted field, why)`` of the first scalar in the JSON value ``value`` (objects and lists
    walked in order) for which ``problem_of`` gives a reason, None when it gives none."""
    if not isinstance(value, dict | list):
        problem = problem_of(value)
        return None if problem is None else (where or "value", problem)
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        found = first_problem(item, problem_of, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def _non_json_number(value: Any) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"{json.dumps(value)} is not a JSON number"
    return None


def non_json_value(value: Any) -> tuple[str, str] | None:
    """``(dotted field, why)`` of the first number in ``value`` that JSON cannot hold, None when
    there is none. Python's json reads ``NaN``, ``Infinity`` and ``1e999`` (a hand edit); JSON
    has no text for them, and eva writes strict JSON (another reader would refuse the file)."""
    return first_problem(value, _non_json_number)


# How to get past a NotJSONError: eva keeps the file as it is and does not guess a value.
_FIX = "write a number or null there by hand, then run this again"


def _not_json(obj: Any, error: Exception) -> NotJSONError:
    found = non_json_value(obj)
    if found is not None:
        return NotJSONError(f"field {found[0]}: {found[1]}")
    return NotJSONError(f"cannot be written as JSON ({type(error).__name__}: {error})")


def _utf8_json(obj: Any, indent: int | None) -> str:
    """JSON text that encodes as UTF-8: a lone surrogate (a JSON ``\\ud800`` escape read back,
    a mis-decoded note) cannot be written as UTF-8, so such a document is written with ASCII
    escapes, which store the same string exactly. NotJSONError for a NaN (``non_json_value``)."""
    try:
        text = json.dumps(obj, indent=indent, ensure_ascii=False, allow_nan=False)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return json.dumps(obj, indent=indent, ensure_ascii=True, allow_nan=False)
    except (ValueError, RecursionError) as e:  # NaN/Infinity; an int past the digit limit
        raise _not_json(obj, e) from None
    return text


def dumps_json(obj: Any) -> str:
    return _utf8_json(obj, 4)


def json_file_bytes(path: Path, obj: Any) -> bytes:
    """The text of a JSON file ``path`` (for ``atomic_write_json`` and staged copies);
    NotJSONError ``<path>: field F: why``."""
    try:
        return (dumps_json(obj) + "\n").encode()
    except NotJSONError as e:
        raise NotJSONError(
            f"{path}: {e}; nothing was written: fix the hand-edited value it comes from "
            "(eva validate names it), then run this again"
        ) from None


def atomic_write_json(path: Path, obj: Any, *, durable: bool = True) -> None:
    atomic_write_bytes(path, json_file_bytes(path, obj), durable=durable)


def jsonl_line(obj: Any) -> bytes:
    return (_utf8_json(obj, None) + "\n").encode()


def jsonl_bytes(path: Path, rows: Iterable[Any]) -> bytes:
    """The lines of the jsonl file ``path``; NotJSONError ``<path>: row N (episode E): field F:
    why``, before anything is written (a hand-edited NaN read back: the file is left as it is)."""
    lines = []
    for number, row in enumerate(rows, 1):
        try:
            lines.append(jsonl_line(row))
        except NotJSONError as e:
            episode = row.get("episode_index") if isinstance(row, dict) else None
            which = f"row {number}" + (f" (episode {episode})" if isinstance(episode, int) else "")
            raise NotJSONError(f"{path}: {which}: {e}; {_FIX}") from None
    return b"".join(lines)


def atomic_write_jsonl(path: Path, rows: Iterable[Any], *, durable: bool = True) -> None:
    atomic_write_bytes(path, jsonl_bytes(path, rows), durable=durable)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a jsonl file. An unterminated final fragment that does not parse is an append in
    progress (or cut short by a crash) and is ignored; any other bad line raises ValueError."""
    return parse_jsonl(fsafe.read_bytes(path), path)


def parse_jsonl(data: bytes, path: Path) -> list[dict[str, Any]]:
    """``read_jsonl`` of the bytes ``data`` read from ``path`` (named in the errors)."""
    lines = data.split(b"\n")
    torn_tail_possible = not data.endswith(b"\n")
    rows = []
    for lineno, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8").strip()
            if not line:
                continue
            rows.append(json.loads(line))
        except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError too
            if torn_tail_possible and lineno == len(lines):
                break
            reason = unparsable(e)
            raise ValueError(f"{path}:{lineno}: invalid JSON line ({reason})") from None
    return rows


def unparsable(error: BaseException) -> str:
    """Why a line is not JSON eva reads, in a few words: ``json.loads`` raises more than
    JSONDecodeError on hostile text (an integer past Python's 4300-digit limit, deep nesting)."""
    if isinstance(error, json.JSONDecodeError):
        return error.msg
    if isinstance(error, UnicodeDecodeError):
        return "not UTF-8"
    if isinstance(error, RecursionError):
        return "nested too deeply"
    return "an integer of more than 4300 digits" if "digits" in str(error) else str(error)


class UnreadableJSON(DatasetError):
    """A metadata file that is not the JSON its reader needs: ``<path>: <reason>``, where
    ``reason`` (a few words, kept for callers that word the error themselves) is
    ``unreadable JSON (why)``, ``not a JSON object`` or ``field F: NaN is not a JSON number``."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason

    def __reduce__(self) -> tuple[type[UnreadableJSON], tuple[str, str]]:
        return type(self), (self.path, self.reason)  # a worker process's error pickles back


def parse_json(data: bytes, path: Path | str, *, strict: bool = False) -> Any:
    """The JSON value of ``data``, the bytes of the metadata file ``path``. ``UnreadableJSON``
    for anything ``json.loads`` raises on hostile text, not only ``JSONDecodeError``: bytes
    that are not UTF-8, an integer past Python's 4300-digit limit, nesting past the recursion
    limit; with ``strict`` (a file eva writes back) a ``NaN``/``Infinity``/``1e999`` too."""
    try:
        value = json.loads(data.decode("utf-8"))
        found = non_json_value(value) if strict else None
    except json.JSONDecodeError as e:
        why = f"{e.msg} at line {e.lineno} column {e.colno}"
        raise UnreadableJSON(path, f"unreadable JSON ({why})") from None
    except (ValueError, RecursionError) as e:
        raise UnreadableJSON(path, f"unreadable JSON ({unparsable(e)})") from None
    if found is not None:
        raise UnreadableJSON(path, f"field {found[0]}: {found[1]}")
    return value


def read_json(path: Path | str, *, strict: bool = False) -> Any:
    """The JSON value of the metadata file ``path``, read without following a link or blocking
    on a FIFO (``fsafe.read_bytes``). ``FileNotFoundError`` when it is missing (each caller
    words that itself); any other failure a one-line ``DatasetError`` naming the file."""
    try:
        data = fsafe.read_bytes(path)
    except FileNotFoundError:
        raise
    except OSError as e:  # EACCES, EIO, EISDIR
        raise fsafe.os_error(e, path) from None
    return parse_json(data, path, strict=strict)


def read_json_object(path: Path | str, *, strict: bool = False) -> dict[str, Any]:
    """``read_json`` of a file whose top level must be an object (every eva metadata file)."""
    value = read_json(path, strict=strict)
    if not isinstance(value, dict):
        raise UnreadableJSON(path, "not a JSON object")
    return value


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
    except (ValueError, RecursionError):  # not JSON (UnicodeDecodeError is a ValueError)
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
        fd = fsafe.open_regular(path)
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
    except (ValueError, RecursionError):  # not JSON (UnicodeDecodeError is a ValueError)
        return True
    return False


def heal_jsonl_tail(path: Path, *, durable: bool = True) -> bool:
    """Drop a torn final fragment (or terminate a complete final row); True if changed."""
    try:
        fd = fsafe.open_regular(path, os.O_RDWR | os.O_APPEND)
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
    data = jsonl_bytes(path, rows)
    created = not os.path.lexists(path)
    fsafe.real_directory(path.parent, create=created)
    fd = fsafe.create_file(path, os.O_RDWR | os.O_APPEND)
    try:
        _heal_fd(fd)
        _write_all(fd, data)
        if durable:
            os.fsync(fd)
    except OSError as e:
        raise fsafe.named(e, path) from None
    finally:
        os.close(fd)
    if created and durable:
        fsync_dir(path.parent)


def remove_stale_temporaries(
    directory: Path, *, target: str | None = None, older_than_s: float | None = None
) -> list[Path]:
    """Delete temp files a crash left behind in ``directory`` (not recursive).

    A temp file of a live writer must survive: call this holding the lock that serialises the
    writers of those files, or narrow it with ``target`` (only temps of that file name, e.g.
    ``episodes.jsonl``, whose rewrites one held lock serialises) and/or ``older_than_s`` (only
    temps not modified for that long). Never follows a link; a directory that is a link is left
    alone.
    """
    removed: list[Path] = []
    directory = Path(directory)
    if os.path.islink(directory) or not directory.is_dir():
        return removed
    prefix = TMP_PREFIX + (f"{target}." if target is not None else "")
    now = time.time()
    for p in directory.iterdir():
        if not p.name.startswith(prefix):
            continue
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            continue  # eva's temporaries are files (a link is removed, never followed)
        if older_than_s is not None and now - st.st_mtime < older_than_s:
            continue
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            removed.append(p)
    return removed
