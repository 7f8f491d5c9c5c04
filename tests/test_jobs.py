"""Job records: schema field names (the upload gate reads them), atomic persistence, progress."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eva.jobs import Job, JobRecorder, job_path, mark_interrupted, read_job, write_job
from eva.progress import Progress

pytestmark = pytest.mark.kernel_independent

FIELDS = {
    "job_id",
    "kind",
    "state",
    "source_dir",
    "format",
    "accepted_dir",
    "rejected_dir",
    "progress",
    "warnings",
    "error",
    "created_at",
    "started_at",
    "finished_at",
    "pid",
}
# export jobs also count the episode files reused by --incremental and written
EXPORT_FIELDS = FIELDS | {"episodes_reused", "episodes_renumbered", "episodes_rewritten"}


def test_export_job_schema_and_round_trip(tmp_path: Path) -> None:
    job = Job(
        kind="export", source_dir="/data/raw", format="hdf5", accepted_dir="/a", rejected_dir="/r"
    )
    path = job_path(tmp_path)
    write_job(path, job)
    data = json.loads(path.read_text())
    assert set(data) == EXPORT_FIELDS
    assert data["state"] == "queued"
    assert set(data["progress"]) == {"episodes", "files", "bytes", "current", "totals"}
    job.start()
    job.complete()
    write_job(path, job)
    stored = read_job(path)
    assert stored is not None and stored.state == "completed" and stored.finished_at
    assert stored.as_dict() == job.as_dict()


def test_upload_job_has_remote_path(tmp_path: Path) -> None:
    job = Job(kind="upload", source_dir="/d/raw", format="mcap", remote_path="/srv/x")
    write_job(job_path(tmp_path, "upload"), job)
    data = json.loads((tmp_path / "upload_job.json").read_text())
    assert set(data) == FIELDS | {"remote_path"}


def test_recorder_follows_progress(tmp_path: Path) -> None:
    job = Job(kind="export", source_dir="/d/raw", format="lerobot_v21")
    recorder = JobRecorder(job, job_path(tmp_path), interval=0.0)
    progress = Progress(total_episodes=4)
    progress.listeners.append(recorder.on_progress)
    progress(episodes=1, files=3, bytes=1000, current="accepted episode 0")
    stored = read_job(job_path(tmp_path))
    assert stored is not None
    assert stored.progress["episodes"] == 1 and stored.progress["bytes"] == 1000
    assert stored.progress["totals"]["episodes"] == 4


def test_unreadable_or_live_jobs(tmp_path: Path) -> None:
    path = job_path(tmp_path)
    assert read_job(path) is None
    path.write_text("{not json")
    assert read_job(path) is None
    assert read_job(tmp_path) is None  # a directory: unreadable too
    job = Job(kind="export", source_dir="/d/raw", format="v3")
    job.start()  # pid = this live process
    write_job(path, job)
    assert mark_interrupted(path) is None
    assert read_job(path).state == "running"  # type: ignore[union-attr]
