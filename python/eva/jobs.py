"""Job records (export and upload), persisted atomically as JSON beside the export.

``<export root>/job.json`` holds the latest export job for one (source, format) pair;
``<export root>/upload_job.json`` the latest upload job. The upload gate reads ``job.json``, so
the field names below are an interface (docs/design.md, "Jobs"):

``job_id``, ``kind`` ("export" | "upload"), ``state`` (queued | running | completed | failed),
``source_dir`` (resolved), ``format``, ``accepted_dir``, ``rejected_dir``, ``progress``
{episodes, files, bytes, current, totals {episodes, files, bytes}}, ``error``, ``created_at``,
``started_at``, ``finished_at`` (UTC ISO-8601), ``pid``, ``warnings`` (lines about what the work
did differently from what was asked, e.g. an MCAP camera written decoded), ``episodes_reused``,
``episodes_renumbered`` and ``episodes_rewritten`` (export: episode files linked by
``--incremental``, copied with their numbering patched, and written);
upload jobs add ``remote_path``.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

from eva.dataset.atomic import atomic_write_json, read_json_object
from eva.progress import Progress
from eva.timestamps import utc_now

STATES = ("queued", "running", "completed", "failed")
EXPORT_JOB = "job.json"
UPLOAD_JOB = "upload_job.json"


def new_job_id() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]


def progress_record(progress: Progress) -> dict[str, Any]:
    """A job file's ``progress`` field: the counters plus their ``totals``."""
    return {
        "episodes": progress.episodes,
        "files": progress.files,
        "bytes": progress.bytes,
        "current": progress.current,
        "totals": {
            "episodes": progress.total_episodes,
            "files": progress.total_files,
            "bytes": progress.total_bytes,
        },
    }


@dataclass
class Job:
    kind: str
    source_dir: str
    format: str
    job_id: str = field(default_factory=new_job_id)
    state: str = "queued"
    accepted_dir: str | None = None
    rejected_dir: str | None = None
    progress: dict[str, Any] = field(default_factory=lambda: progress_record(Progress()))
    error: str | None = None
    created_at: str = field(default_factory=utc_now)
    started_at: str | None = None
    finished_at: str | None = None
    pid: int = field(default_factory=os.getpid)
    remote_path: str | None = None
    warnings: list[str] = field(default_factory=list)
    # export jobs: the episodes linked from the previous pair (--incremental), copied from it
    # with their numbering patched, and written anew
    episodes_reused: int = 0
    episodes_renumbered: int = 0
    episodes_rewritten: int = 0

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.kind != "upload":
            data.pop("remote_path")
        else:
            data.pop("episodes_reused")
            data.pop("episodes_renumbered")
            data.pop("episodes_rewritten")
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def set_progress(self, progress: Progress) -> None:
        self.progress = progress_record(progress)
        self.warnings = list(progress.warnings)

    def start(self) -> None:
        self.state = "running"
        self.started_at = utc_now()
        self.pid = os.getpid()

    def complete(self) -> None:
        self.state = "completed"
        self.error = None
        self.finished_at = utc_now()

    def fail(self, error: str) -> None:
        self.state = "failed"
        self.error = error
        self.finished_at = utc_now()


def job_path(export_root: Path, kind: str = "export") -> Path:
    return Path(export_root) / (UPLOAD_JOB if kind == "upload" else EXPORT_JOB)


def write_job(path: Path, job: Job, *, durable: bool = True) -> None:
    """Atomically replace the job file (readers never see a torn record)."""
    atomic_write_json(Path(path), job.as_dict(), durable=durable)


def read_job(path: Path) -> Job | None:
    """The job stored at ``path``, or None when there is none (or it is unreadable)."""
    try:
        # Not through a link, and a FIFO there must not block (eva.dataset.fsafe); strict: the
        # record is written back, and a NaN there would refuse that write.
        data = read_json_object(path, strict=True)
    except (OSError, ValueError):  # a directory, link or FIFO there; not JSON (any reason)
        return None
    if data.get("state") not in STATES:
        return None
    try:
        return Job.from_dict(data)
    except TypeError:  # a required field missing
        return None


def pid_alive(pid: object) -> bool:
    """Whether process ``pid`` runs; False for what no process id is (a hand-edited record's)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: past the kernel's pid_t
        return False
    except PermissionError:
        return True
    return True


def mark_interrupted(path: Path) -> Job | None:
    """A queued/running job whose process is gone becomes failed ("interrupted"); returns it."""
    job = read_job(path)
    if job is None or job.state not in ("queued", "running") or pid_alive(job.pid):
        return None
    job.fail(f"interrupted: process {job.pid} ended before the job finished")
    write_job(path, job)
    return job


class JobRecorder:
    """Keeps a job file in step with a ``Progress``: state changes are written durably at once,
    progress at most every ``interval`` seconds (it is a hint for the UI, not a commit point)."""

    def __init__(self, job: Job, path: Path, interval: float = 0.25) -> None:
        self.job = job
        self.path = Path(path)
        self.interval = interval
        self._last = 0.0

    def save(self) -> None:
        write_job(self.path, self.job)
        self._last = time.monotonic()

    def on_progress(self, progress: Progress) -> None:
        self.job.set_progress(progress)
        now = time.monotonic()
        if now - self._last >= self.interval:
            write_job(self.path, self.job, durable=False)
            self._last = now
