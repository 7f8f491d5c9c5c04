"""The one file copy (``eva.dataset.share``): ``copy_range`` in the kernel and through a buffer,
``reflink`` where the filesystem has none, ``copy_file`` (a new inode) and ``share_file``
across filesystems, and a full disk. The buffer path is taken for real: a copy from a tmpfs
(``/dev/shm``) to the test's directory on another filesystem, which ``copy_file_range``
refuses (EXDEV); the reflink path itself needs btrfs or xfs, which the test machine may lack."""

from __future__ import annotations

import errno
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_fs_safety import tiny_tmpfs  # noqa: F401  (a fixture)

from eva.dataset import share
from eva.dataset.errors import DatasetError, WriteError
from eva.export.incremental import link_file

PAYLOAD = bytes(range(256)) * 4099  # 1 MiB and a bit, no period a block boundary hides


def _fs_type(path: Path) -> str:
    return subprocess.run(
        ["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def other_fs(tmp_path: Path) -> Iterator[Path]:
    """A directory on another filesystem than ``tmp_path``'s, between which the kernel cannot
    copy (so the buffer path is the one taken: checked, not assumed)."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem (/dev/shm)")
    where = Path(tempfile.mkdtemp(prefix="eva-copy-", dir=shm))
    probe = where / "probe"
    probe.write_bytes(b"x")
    src, dest = os.open(probe, os.O_RDONLY), os.open(tmp_path / "probe", os.O_WRONLY | os.O_CREAT)
    try:
        os.copy_file_range(src, dest, 1)
        kernel_copies = True
    except OSError as e:
        kernel_copies = False
        assert e.errno == errno.EXDEV
    finally:
        os.close(src)
        os.close(dest)
        probe.unlink()
        (tmp_path / "probe").unlink()
    try:
        if kernel_copies:
            pytest.skip("this kernel copies between these filesystems")
        yield where
    finally:
        for child in where.iterdir():
            child.chmod(0o644)
            child.unlink()
        where.rmdir()


def _copy_range(src: Path, dest: Path, offset: int, length: int, head: bytes = b"") -> int:
    src_fd = os.open(src, os.O_RDONLY)
    dest_fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        os.write(dest_fd, head)
        return share.copy_range(src_fd, dest_fd, offset, length)
    finally:
        os.close(src_fd)
        os.close(dest_fd)


def _copy_range_cases(src_dir: Path, dest_dir: Path) -> None:
    src = src_dir / "src"
    src.write_bytes(PAYLOAD)
    # a range, after what the destination already holds (a spliced MP4's head)
    assert _copy_range(src, dest_dir / "a", 1000, 700_000, b"head") == 700_000
    assert (dest_dir / "a").read_bytes() == b"head" + PAYLOAD[1000:701_000]
    # the whole file
    assert _copy_range(src, dest_dir / "b", 0, len(PAYLOAD)) == len(PAYLOAD)
    assert (dest_dir / "b").read_bytes() == PAYLOAD
    # a source that ends first: a short count, never an error
    assert _copy_range(src, dest_dir / "c", len(PAYLOAD) - 10, 100) == 10
    assert (dest_dir / "c").read_bytes() == PAYLOAD[-10:]


def test_copy_range_in_the_kernel(tmp_path: Path) -> None:
    _copy_range_cases(tmp_path, tmp_path)


def test_copy_range_through_a_buffer(
    tmp_path: Path, other_fs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(share, "_BUFFER", 64 * 1024)  # several reads per range
    _copy_range_cases(other_fs, tmp_path)


def test_reflink_is_false_where_the_filesystem_has_none(tmp_path: Path) -> None:
    if _fs_type(tmp_path) not in ("ext2/ext3", "ext4", "tmpfs"):
        pytest.skip(f"{_fs_type(tmp_path)} may have reflinks")
    (tmp_path / "src").write_bytes(PAYLOAD)
    src_fd = os.open(tmp_path / "src", os.O_RDONLY)
    dest_fd = os.open(tmp_path / "dest", os.O_WRONLY | os.O_CREAT)
    try:
        assert share.reflink(src_fd, dest_fd) is False
    finally:
        os.close(src_fd)
        os.close(dest_fd)
    assert (tmp_path / "dest").read_bytes() == b""


@pytest.mark.parametrize("where", ["same", "other"])
def test_copy_file_is_a_new_inode(
    tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    src_dir = tmp_path if where == "same" else request.getfixturevalue("other_fs")
    src = src_dir / "src"
    src.write_bytes(PAYLOAD)
    src.chmod(0o444)  # read-only: still never a hard link
    assert share.copy_file(src, tmp_path / "dest") == len(PAYLOAD)
    dest = tmp_path / "dest"
    assert dest.read_bytes() == PAYLOAD
    assert dest.stat().st_ino != src.stat().st_ino and src.stat().st_nlink == 1
    with open(dest, "r+b") as f:  # writing the copy never reaches the source
        f.write(b"patched")
    assert src.read_bytes() == PAYLOAD
    # the destination must be new, and the source is never reached through a link
    with pytest.raises(DatasetError, match="dest"):
        share.copy_file(src, dest)
    assert dest.read_bytes()[:7] == b"patched"
    (tmp_path / "link").symlink_to(src)
    with pytest.raises(DatasetError, match="symlink"):
        share.copy_file(tmp_path / "link", tmp_path / "from-link")
    assert not (tmp_path / "from-link").exists()


def test_share_file_across_filesystems_copies(tmp_path: Path, other_fs: Path) -> None:
    src = other_fs / "src"
    src.write_bytes(PAYLOAD)
    assert share.share_file(src, tmp_path / "writable") == "copy"
    src.chmod(0o444)  # a hard link is tried first, and refused across filesystems
    assert share.share_file(src, tmp_path / "read-only") == "copy"
    for name in ("writable", "read-only"):
        assert (tmp_path / name).read_bytes() == PAYLOAD


def test_a_published_file_copied_across_filesystems_keeps_its_mode(
    tmp_path: Path, other_fs: Path
) -> None:
    # The incremental re-export's reuse: a hard link where it can, else the one copy.
    published = other_fs / "episode.hdf5"
    published.write_bytes(PAYLOAD)
    published.chmod(0o440)
    staged = tmp_path / "staging" / "data" / "episode.hdf5"
    link_file(published, staged)
    assert staged.read_bytes() == PAYLOAD
    assert staged.stat().st_ino != published.stat().st_ino
    assert staged.stat().st_mode & 0o777 == 0o440


@pytest.mark.parametrize("where", ["same", "other"])
def test_a_full_disk_names_the_copy_and_leaves_nothing(
    tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    disk: Path = request.getfixturevalue("tiny_tmpfs")  # 2 MB (test_fs_safety's fixture)
    # "same": the kernel copies within the tmpfs; "other": from tmp_path's filesystem (through
    # the buffer where that is not a tmpfs, as test_copy_range_through_a_buffer checks)
    (disk / "filler").write_bytes(PAYLOAD)  # 1 MiB of the 2
    src = disk / "filler" if where == "same" else tmp_path / "src"
    src.write_bytes(PAYLOAD)
    dest = disk / "dest"
    with pytest.raises(WriteError, match=f"^{dest}: No space left on device$"):
        share.copy_file(src, dest)
    assert not dest.exists()
