"""Pair publication: atomic swap, two-step fallback with rollback, crash recovery, export lock."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from eva.jobs import Job, read_job, write_job
from eva.publish import (
    ExportBusy,
    backup_dir,
    export_lock,
    make_staging,
    mark_complete,
    publish_pair,
    recover,
    staging_dir,
)


def _stage(root: Path, export_id: str, content: str) -> Path:
    staging = make_staging(root, export_id)
    for subset in ("accepted", "rejected"):
        (staging / subset).mkdir()
        (staging / subset / "marker.txt").write_text(content)
    mark_complete(staging, export_id)
    return staging


def _pair(root: Path) -> tuple[str | None, str | None]:
    def read(subset: str) -> str | None:
        path = root / subset / "marker.txt"
        return path.read_text() if path.exists() else None

    return read("accepted"), read("rejected")


def _hidden(root: Path) -> list[str]:
    return sorted(
        p.name for p in root.parent.iterdir() if p.name.startswith(".eva-") and p.is_dir()
    )


@pytest.mark.parametrize("exchange", [True, False])
def test_first_publish_and_replace(tmp_path: Path, exchange: bool) -> None:
    root = tmp_path / "export" / "lerobot_v21"
    publish_pair(root, _stage(root, "a", "old"), exchange=exchange)
    assert _pair(root) == ("old", "old")
    publish_pair(root, _stage(root, "b", "new"), exchange=exchange)
    assert _pair(root) == ("new", "new")
    assert _hidden(root) == []


def test_incomplete_staging_is_not_published(tmp_path: Path) -> None:
    root = tmp_path / "export" / "hdf5"
    staging = make_staging(root, "x")
    with pytest.raises(ValueError, match="incomplete"):
        publish_pair(root, staging)
    assert not root.exists()


def test_rollback_when_second_step_fails(tmp_path: Path) -> None:
    root = tmp_path / "export" / "mcap"
    publish_pair(root, _stage(root, "a", "old"))
    staging = _stage(root, "b", "new")
    elsewhere = tmp_path / "moved-away"

    def lose_staging() -> None:
        # The old pair is in the backup now; the staging dir vanishing makes the 2nd rename fail.
        assert not root.exists() and backup_dir(root, "b").is_dir()
        os.rename(staging, elsewhere)

    with pytest.raises(FileNotFoundError):
        publish_pair(root, staging, exchange=False, between_steps=lose_staging)
    assert _pair(root) == ("old", "old")
    assert not backup_dir(root, "b").exists()


def test_recover_rolls_forward_or_back(tmp_path: Path) -> None:
    root = tmp_path / "export" / "lerobot_v3"
    publish_pair(root, _stage(root, "a", "old"))
    # Crash between the two renames with a complete staging dir: roll forward.
    _stage(root, "b", "new")
    os.rename(root, backup_dir(root, "b"))
    actions = recover(root)
    assert _pair(root) == ("new", "new")
    assert any("rolled forward" in a for a in actions)
    assert _hidden(root) == []
    # Same crash but the staging dir is incomplete: roll back.
    staging = _stage(root, "c", "newer")
    (staging / ".eva-complete").unlink()
    os.rename(root, backup_dir(root, "c"))
    recover(root)
    assert _pair(root) == ("new", "new")
    assert _hidden(root) == []
    # Crash before publication: the visible pair stays, the staging dir goes.
    _stage(root, "d", "unpublished")
    recover(root)
    assert _pair(root) == ("new", "new")
    assert not staging_dir(root, "d").exists()


def test_recover_marks_dead_running_job_failed(tmp_path: Path) -> None:
    root = tmp_path / "export" / "hdf5"
    root.mkdir(parents=True)
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    job = Job(kind="export", source_dir=str(tmp_path / "raw"), format="hdf5")
    job.start()
    job.pid = int(child.stdout)  # that process has exited
    write_job(root / "job.json", job)
    recover(root)
    stored = read_job(root / "job.json")
    assert stored is not None and stored.state == "failed" and "interrupted" in (stored.error or "")


def test_lock_refuses_second_export(tmp_path: Path) -> None:
    root = tmp_path / "export" / "lerobot_v21"
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from eva.publish import export_lock\n"
        "with export_lock(Path(sys.argv[1]), 'x'):\n"
        "    print('locked', flush=True)\n"
        "    time.sleep(30)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(root)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        busy = pytest.raises(ExportBusy, match=rf"already running \(pid {holder.pid}\)")
        with busy, export_lock(root, "raw to lerobot_v21"):
            pass
    finally:
        holder.kill()
        holder.wait()
    with export_lock(root, "raw to lerobot_v21"):
        pass


def test_the_lock_is_taken_on_the_file_its_path_names(tmp_path: Path) -> None:
    # A refused export removes the lock file it created; one that opened it just before locks
    # the file now at the path instead, so that two exports never hold two different locks.
    from eva.publish import _still_linked, lock_path

    root = tmp_path / "export" / "lerobot_v3"
    with export_lock(root, "a dataset"):
        path = lock_path(root)
        fd = os.open(path, os.O_RDONLY)
    try:
        assert _still_linked(fd, path)
        path.unlink()
        assert not _still_linked(fd, path)
        path.write_text("")  # another file by that name
        assert not _still_linked(fd, path)
    finally:
        os.close(fd)
    with export_lock(root, "a dataset"):
        assert path.read_text().strip() == str(os.getpid())
