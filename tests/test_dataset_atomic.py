"""eva.dataset.atomic: in-place jsonl appends, torn-tail tolerance and healing, atomic replace."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from eva.dataset import atomic

pytestmark = pytest.mark.kernel_independent


def test_append_inplace_creates_and_appends(tmp_path: Path) -> None:
    path = tmp_path / "meta" / "rows.jsonl"
    atomic.append_jsonl_inplace(path, [{"a": 1}])
    inode = path.stat().st_ino
    atomic.append_jsonl_inplace(path, [{"a": 2}, {"a": "é"}])
    assert path.stat().st_ino == inode  # in place, not a copy + rename
    assert atomic.read_jsonl(path) == [{"a": 1}, {"a": 2}, {"a": "é"}]
    assert path.read_bytes().endswith(b"\n")


def test_read_jsonl_ignores_only_an_unterminated_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}\n{"a": 3, "b": [1, 2')
    assert atomic.read_jsonl(path) == [{"a": 1}, {"a": 2}]
    # A torn multi-byte character is a torn tail too.
    path.write_bytes(b'{"a": 1}\n{"t": "\xc3')
    assert atomic.read_jsonl(path) == [{"a": 1}]
    # A complete last row without its newline is a row.
    path.write_bytes(b'{"a": 1}\n{"a": 2}')
    assert atomic.read_jsonl(path) == [{"a": 1}, {"a": 2}]
    # A bad line that IS terminated is corruption, not an append in progress.
    path.write_bytes(b'{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(ValueError, match=r"rows\.jsonl:2"):
        atomic.read_jsonl(path)
    path.write_bytes(b'{"a": 1}\n{"a": 2, oops}\n')
    with pytest.raises(ValueError, match=r"rows\.jsonl:2"):
        atomic.read_jsonl(path)


def test_heal_and_append_after_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2, "b')
    assert atomic.heal_jsonl_tail(path) is True
    assert path.read_bytes() == b'{"a": 1}\n'
    assert atomic.heal_jsonl_tail(path) is False
    assert atomic.heal_jsonl_tail(tmp_path / "missing.jsonl") is False
    # The append heals on its own: a torn fragment is dropped, a complete row is terminated.
    path.write_bytes(b'{"a": 1}\n{"a": 2, "b')
    atomic.append_jsonl_inplace(path, [{"a": 3}])
    assert atomic.read_jsonl(path) == [{"a": 1}, {"a": 3}]
    path.write_bytes(b'{"a": 1}\n{"a": 2}')
    atomic.append_jsonl_inplace(path, [{"a": 3}])
    assert path.read_bytes() == b'{"a": 1}\n{"a": 2}\n{"a": 3}\n'


def test_long_torn_tail_is_found_across_read_blocks(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    big = json.dumps({"x": "y" * 200_000})
    path.write_bytes(b'{"a": 1}\n' + big[:150_000].encode())
    atomic.append_jsonl_inplace(path, [{"a": 2}])
    assert atomic.read_jsonl(path) == [{"a": 1}, {"a": 2}]


def test_atomic_replace_keeps_old_file_when_rename_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "info.json"
    atomic.atomic_write_json(path, {"v": 1})

    def fail(*_args: object, **_kwargs: object) -> None:
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="simulated"):
        atomic.atomic_write_json(path, {"v": 2})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["info.json"]  # temp file removed
