"""Upload jobs: gate, lock, run the SFTP upload in a background thread, persist the record.

``start_upload`` does everything that can refuse synchronously (no thread starts when the gate
refuses, when no backend is configured, or when the tree holds a symlink), then runs the transfer
in a thread. The record ``<export root>/upload_job.json`` (``UploadJobRecord``, the shared job shape
of ``eva.jobs`` plus upload fields) is written when the job is queued, on every state change, and
at most every 0.25 s while bytes move.

For the whole upload the job holds the export lock of that (source, format) pair
(``eva.publish.export_lock``): a re-export cannot swap the accepted directory while it is being
sent, and two uploads of the same export cannot run at once. The gate runs again under the lock.

Resume: the staging directory name is random, and it is recorded in the job record before the
first file is written. ``--resume`` reuses it when the previous upload job of this export did not
complete, was for the same export job, server and target, and its staging directory still exists;
staged files whose size and SHA-256 (read back from the server) match are skipped, and a file
that was cut off mid-way continues from its end when the staged prefix hashes equal.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eva.dataset.atomic import read_json_object
from eva.dataset.layout import UnsafeNameError, check_component
from eva.formats.catalog import FormatEntry
from eva.jobs import STATES, UPLOAD_JOB, Job, JobRecorder, write_job
from eva.progress import Progress
from eva.publish import export_lock
from eva.upload.config import SftpConfig
from eva.upload.errors import HostKeyError, UploadError, UploadInterrupted
from eva.upload.gate import (
    UploadPermit,
    UploadRefused,
    check_review,
    check_upload,
    remote_name_for,
)
from eva.upload.sftp import (
    UploadOptions,
    UploadResult,
    scan_local_tree,
    upload_tree,
)


@dataclass
class UploadJobRecord(Job):
    """The persisted upload job: ``eva.jobs.Job`` fields plus where the data went."""

    remote: str | None = None  # sftp://user@host:port/remote_dir
    target_path: str | None = None  # preferred remote path
    staging_path: str | None = None  # remote staging dir (kept after an interruption)
    export_job_id: str | None = None  # the export job whose accepted dir is sent
    resumed: bool = False
    skipped_files: int = 0
    skipped_bytes: int = 0
    resumable: bool = False  # failed, but the staging dir was kept for --resume


def read_upload_record(export_root: Path) -> UploadJobRecord | None:
    """The previous upload job of this export, or None when there is none or it is unreadable."""
    try:
        # strict: a record with a NaN could not be written back when this upload updates it
        data = read_json_object(Path(export_root) / UPLOAD_JOB, strict=True)
    except (OSError, ValueError):  # a link or FIFO there, not JSON for any reason
        return None
    if data.get("kind") != "upload" or data.get("state") not in STATES:
        return None
    try:
        return UploadJobRecord.from_dict(data)
    except TypeError:  # required fields missing
        return None


class UploadJob:
    """A running (or finished) upload; ``wait()``, ``cancel()``, ``record``, ``result``."""

    def __init__(
        self,
        permit: UploadPermit,
        config: SftpConfig,
        record: UploadJobRecord,
        options: UploadOptions,
        resume_staging: str | None,
        discard_staging: str | None,
        lock: contextlib.ExitStack,
    ) -> None:
        self.permit = permit
        self.config = config
        self.record = record
        self.options = options
        self.resume_staging = resume_staging
        self.discard_staging = discard_staging
        self.record_path = permit.export_root / UPLOAD_JOB
        self.recorder = JobRecorder(record, self.record_path)
        self.progress = Progress()
        self.progress.listeners.append(self.recorder.on_progress)
        self.result: UploadResult | None = None
        self.error: str | None = None
        # Set when the host key was refused: the console shows it and offers its trust step.
        self.host_key_error: HostKeyError | None = None
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._lock = lock
        self._thread = threading.Thread(target=self._run, name="eva-upload-job", daemon=True)

    @property
    def state(self) -> str:
        return self.record.state

    def add_listener(self, listener: Callable[[Progress], None]) -> None:
        self.progress.listeners.append(listener)

    def start(self) -> UploadJob:
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """True once the job has finished (completed or failed) and its record is written.

        An Event rather than ``Thread.join``: a KeyboardInterrupt inside ``join`` can leave the
        thread's state lock so that a later ``join`` returns before the thread has ended."""
        return self._done.wait(timeout)

    def cancel(self) -> None:
        """Stop sending; the staged files stay on the server for ``--resume``."""
        self._cancel.set()

    def snapshot(self) -> dict[str, Any]:
        return self.record.as_dict()

    def _on_staging(self, staging: str) -> None:
        self.record.staging_path = staging
        self.recorder.save()

    def _check_review(self) -> None:
        """The review may have changed while the files were sent (qc does not take the export
        lock): a stale export is not published."""
        try:
            check_review(self.permit.source_dir, self.permit.format, self.permit.export_root)
        except UploadRefused as e:
            raise UploadError(f"upload refused ({e.reason}): {e}") from None

    def _run(self) -> None:
        try:
            tree = scan_local_tree(self.permit.accepted_dir)
            self.progress.total_files = len(tree.files)
            self.progress.total_bytes = tree.total_bytes
            self.progress.total_episodes = None
            self.record.start()
            self.record.set_progress(self.progress)
            self.recorder.save()
            result = upload_tree(
                self.config,
                tree,
                remote_name_for(self.permit.source_dir, self.permit.format),
                options=self.options,
                progress=self.progress,
                cancel=self._cancel,
                resume_staging=self.resume_staging,
                discard_staging=self.discard_staging,
                on_staging=self._on_staging,
                before_publish=self._check_review,
            )
            self.result = result
            self.record.remote_path = result.remote_path
            self.record.resumed = result.resumed
            self.record.skipped_files = result.skipped_files
            self.record.skipped_bytes = result.skipped_bytes
            self.record.resumable = False
            self.record.set_progress(self.progress)
            self.record.complete()
        except UploadInterrupted as e:
            self.error = str(e)
            self.record.resumable = True
            self.record.set_progress(self.progress)
            self.record.fail(f"interrupted: {e}")
        except UploadError as e:
            self.error = str(e)
            self.host_key_error = e if isinstance(e, HostKeyError) else None
            self.record.resumable = False
            self.record.set_progress(self.progress)
            self.record.fail(str(e))
        except Exception as e:  # a bug must still end the job as failed, with its text
            self.error = f"{type(e).__name__}: {e}"
            self.record.set_progress(self.progress)
            self.record.fail(self.error)
        finally:
            try:
                write_job(self.record_path, self.record)
            finally:
                self._lock.close()
                self._done.set()


def _unfinished_staging(
    export_root: Path, permit: UploadPermit, config: SftpConfig, target: str
) -> tuple[str | None, bool]:
    """The staging dir the previous, unfinished upload to this server and target left behind, and
    whether it holds files of this very export job (so that ``--resume`` may reuse them)."""
    previous = read_upload_record(export_root)
    if previous is not None and previous.state in ("queued", "running"):
        # We hold the export lock, so no uploader of this export is alive: a killed one left
        # "running" behind. (eva.jobs.mark_interrupted would rewrite the record through the base
        # Job class and drop the upload fields, staging_path included.)
        previous.fail(f"interrupted: process {previous.pid} ended before the upload finished")
        previous.resumable = True
        write_job(export_root / UPLOAD_JOB, previous)
    if previous is None or previous.state == "completed" or not previous.staging_path:
        return None, False
    if previous.remote != config.describe() or previous.target_path != target:
        return None, False
    return previous.staging_path, previous.export_job_id == permit.export_job_id


def start_upload(
    source_dir: Path,
    fmt: FormatEntry | str,
    config: SftpConfig | None,
    *,
    options: UploadOptions | None = None,
    resume: bool = False,
) -> UploadJob:
    """Gate, lock and start the upload of the accepted export; raises ``UploadRefused`` (gate),
    ``UploadError`` (local tree) or ``eva.publish.ExportBusy`` before any thread starts."""
    permit = check_upload(source_dir, fmt, backend_configured=config is not None)
    assert config is not None  # the gate refuses without a backend
    options = options or UploadOptions()
    lock = contextlib.ExitStack()
    try:
        lock.enter_context(
            export_lock(permit.export_root, f"{permit.source_dir} as {permit.format} (upload)")
        )
        # The export may have changed between the first check and the lock.
        permit = check_upload(source_dir, fmt, backend_configured=True)
        scan_local_tree(permit.accepted_dir)  # symlinks etc. are refused before a job exists
        dataset_name = remote_name_for(permit.source_dir, permit.format)
        try:
            check_component(dataset_name, "remote dataset name")
        except UnsafeNameError as e:
            raise UploadError(f"{permit.source_dir}: {e}") from None
        target = config.target_path(dataset_name)
        leftover, same_export = _unfinished_staging(permit.export_root, permit, config, target)
        # Without --resume (or after a re-export) an abandoned staging dir is deleted, not reused.
        resume_staging = leftover if resume and same_export else None
        discard_staging = None if resume_staging else leftover
        record = UploadJobRecord(
            kind="upload",
            source_dir=str(permit.source_dir),
            format=permit.format,
            accepted_dir=str(permit.accepted_dir),
            remote=config.describe(),
            target_path=target,
            staging_path=resume_staging,
            export_job_id=permit.export_job_id,
        )
        write_job(permit.export_root / UPLOAD_JOB, record)
        job = UploadJob(permit, config, record, options, resume_staging, discard_staging, lock)
    except BaseException:
        lock.close()
        raise
    return job.start()
