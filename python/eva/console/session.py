"""What the operator console does, without HTTP: one recorder, review, export and upload jobs.

:class:`ConsoleSession` is the whole console behind the web server (``console/server.py`` only
turns requests into these calls and results into JSON). It holds:

- the :class:`~eva.capture.recorder.Recorder` of the config's collection, fed by the source the
  console was started with (the simulated rig by default, shown in the status), with a preview
  tap for the COLLECT panel;
- the review of every dataset of ``collection.tasks`` (``console/review.py``: the same
  ``eva.quality.verdicts`` calls, locks and files as ``eva qc``);
- background export and upload jobs (``console/jobs.py``: the same ``eva.export.pipeline`` and
  ``eva.upload`` code as ``eva export`` / ``eva upload``; their ``job.json`` /
  ``upload_job.json`` are the same files);
- a change counter that the event stream watches, so a page never polls in a tight loop.

Clients never send paths: a dataset is a name of ``collection.tasks`` and every directory is
derived by ``console/datasets.py``. One background job (export or upload) runs at a time.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from eva.capture.recorder import Recorder, RecorderError
from eva.capture.save_worker import SaveJob
from eva.capture.sources import open_source
from eva.config import CollectionConfig, ConfigError, load_config, ring_memory_problem
from eva.console.datasets import DatasetDirs
from eva.console.errors import ConsoleError, bad_request, conflict, not_found
from eva.console.http_values import typed_text
from eva.console.jobs import BackgroundJobs
from eva.console.review import EpisodeReview
from eva.dataset.errors import error_line
from eva.timestamps import utc_now

log = logging.getLogger("eva.console")

STATUS_CACHE_S = 0.2


class _WarningLog(logging.Handler):
    """Keeps the latest capture warnings (backlog, recovered leftovers) for the status."""

    def __init__(self, on_change: Callable[[], None], size: int = 50) -> None:
        super().__init__(logging.WARNING)
        self.entries: deque[dict[str, str]] = deque(maxlen=size)
        self.on_change = on_change

    def emit(self, record: logging.LogRecord) -> None:
        self.entries.append(
            {"time": utc_now(), "level": record.levelname.lower(), "message": record.getMessage()}
        )
        self.on_change()

    def clear(self) -> None:
        """START: the warnings of earlier recordings are not this one's."""
        self.entries.clear()
        self.on_change()


class ConsoleSession:
    """The console's state and actions (see module doc). ``close()`` ends capture cleanly."""

    def __init__(
        self,
        config_path: Path,
        *,
        source: str | None = None,
        seed: int = 0,
        durable: bool = True,
        sftp_known_hosts: Path | None = None,
    ) -> None:
        from eva.upload.config import UploadConfigError, load_upload_config

        self.config_path = Path(config_path).resolve()
        try:
            config = load_config(self.config_path).collection
        except ConfigError as e:
            raise ConsoleError("bad_request", "bad_config", str(e)) from None
        problem = ring_memory_problem(config)
        if problem is not None:
            raise ConsoleError("bad_request", "bad_config", f"{self.config_path}: {problem}")
        # None: the config's sources (source processes); "sim" / "replay:PATH": an override
        self.source = open_source(config, source, seed=seed)
        self.config: CollectionConfig = self.source.config
        self.source_note = self.source.note
        try:
            _, self.sftp = load_upload_config(self.config_path)
        except UploadConfigError as e:
            raise ConsoleError("bad_request", "bad_config", str(e)) from None
        if self.sftp is not None and sftp_known_hosts is not None:
            import dataclasses

            self.sftp = dataclasses.replace(self.sftp, known_hosts=sftp_known_hosts.resolve())
        self.version = 0  # bumped on every change the event stream should report
        self._version_lock = threading.Lock()
        self._status_cache: tuple[float, dict[str, Any]] | None = None
        self._status_lock = threading.Lock()
        self._jpeg: dict[str, tuple[int, bytes]] = {}
        self._jpeg_lock = threading.Lock()
        self._jpeg_encoders: dict[str, Any] = {}
        self._seen_saves: set[int] = set()
        self.dirs = DatasetDirs(self.config)
        self.review = EpisodeReview(self.dirs, self.changed)
        self.background = BackgroundJobs(self.dirs, self.sftp, self.changed)
        self.warnings = _WarningLog(self.changed)
        logging.getLogger("eva.capture").addHandler(self.warnings)
        try:
            self.recorder = Recorder(self.config, durable=durable, rings=self.source.rings)
        except BaseException:
            self.source.close()
            raise
        try:  # episodes a crash cut short become episodes again (reported as warnings)
            self.recorder.recover_datasets()
        except RecorderError as e:
            log.warning("recovering interrupted recordings failed: %s", e)
        self.preview = self.recorder.enable_preview()
        self.source.start(self.recorder)

    # ---- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        with contextlib.suppress(RecorderError):
            if self.recorder.recording:
                self.recorder.cancel()
        self.source.close()
        self.recorder.close()
        self.review.histograms.close()
        logging.getLogger("eva.capture").removeHandler(self.warnings)
        active = self.background.active()
        if active is not None:
            log.warning("console closing while job %s is %s", active.job_id, active.state)

    def changed(self) -> None:
        with self._version_lock:
            self.version += 1

    # ---- datasets, review, exports and uploads (console/datasets.py, review.py, jobs.py) ----

    def dataset_root(self, name: str) -> Path:
        return self.dirs.root(name)

    def datasets(self) -> list[dict[str, Any]]:
        return self.dirs.listing()

    def episodes(self, name: str) -> dict[str, Any]:
        return self.review.episodes(name)

    def set_review(self, name: str, index: Any, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.review.set_review(name, index, body)

    def set_edits(self, name: str, index: Any, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.review.set_edits(name, index, body)

    def video_fd(self, name: str, index: Any, key: str) -> int:
        return self.review.video_fd(name, index, key)

    def series(self, name: str, index: Any, max_points: Any = None) -> dict[str, Any]:
        return self.review.series(name, index, max_points)

    def exports(self, name: str) -> dict[str, Any]:
        return self.background.exports(name)

    @staticmethod
    def format_options() -> dict[str, list[dict[str, Any]]]:
        return BackgroundJobs.format_options()

    def job(self, job_id: str) -> dict[str, Any]:
        return self.background.job(job_id)

    def jobs(self) -> list[dict[str, Any]]:
        return self.background.jobs()

    def start_export(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.background.start_export(name, body)

    def start_upload(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.background.start_upload(name, body)

    def host_key(self) -> dict[str, str]:
        return self.background.host_key()

    def trust_host_key(self, body: Mapping[str, Any]) -> dict[str, str]:
        return self.background.trust_host_key(body)

    # ---- status ------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Recorder state for ``GET /api/status`` (computed at most every 0.2 s: the recorder's
        fps figures are rates between two calls, so all clients share one reading)."""
        with self._status_lock:
            now = time.monotonic()
            if self._status_cache and now - self._status_cache[0] < STATUS_CACHE_S:
                return self._status_cache[1]
            status = self._compute_status()
            self._status_cache = (now, status)
            return status

    def invalidate_status(self) -> None:
        """Make the next ``status()`` compute afresh (after START / STOP / CANCEL)."""
        self._status_cache = None

    def _compute_status(self) -> dict[str, Any]:
        # Read first: a change racing this computation then shows as a newer version next time.
        version = self.version
        rec = self.recorder.status()
        jobs = list(self.recorder.jobs)
        for job in jobs:
            if job.finished and job.job_id not in self._seen_saves:
                self._seen_saves.add(job.job_id)
                self.changed()
        if rec["recording"]:
            state = "recording"
        elif rec["save_queue"]:
            state = "saving"
        else:
            state = "idle"
        dataset = self._name_for(rec["dataset"])
        active = self.background.active()
        return {
            "state": state,
            "source": self.source.description,
            "source_note": self.source_note,
            "source_error": error_line(self.source.error) if self.source.error else None,
            "streams": self.source.streams,
            "dataset": dataset,
            "dataset_dir": rec["dataset"],
            "task": rec["task"],
            "elapsed_s": round(rec["elapsed_s"], 3),
            "frames": rec["frames"],
            "samples": rec["samples"],
            "fps": self.config.fps,
            "camera_fps": {k: round(v, 2) for k, v in rec["camera_fps"].items()},
            "backlog": rec["backlog"],
            "backlog_mb": round(rec["backlog_mb"], 3),
            "dropped": rec["dropped"],
            "consumer_error": rec["consumer_error"],
            "warnings": list(self.warnings.entries)[-20:],
            "save_queue": rec["save_queue"],
            "saved": rec["saved"],
            "failed": rec["failed"],
            "save_jobs": [self._save_job(j) for j in jobs[-50:]],
            "cameras": [
                {"key": c.key, "width": c.width, "height": c.height} for c in self.config.cameras
            ],
            "vectors": [{"name": v.name, "dim": v.dim} for v in self.config.vectors],
            "datasets": self.datasets(),
            "upload_backend": self.sftp.describe() if self.sftp else None,
            "active_job": active.as_dict() if active else None,
            "version": version,
        }

    def _save_job(self, job: SaveJob) -> dict[str, Any]:
        data = job.as_dict()
        data["dataset"] = self._name_for(job.dataset_dir)
        return data

    def _name_for(self, directory: Path | str | None) -> str | None:
        """The ``collection.tasks`` name whose raw directory this is (the recorder speaks paths)."""
        if directory is None:
            return None
        for name in self.config.tasks:
            with contextlib.suppress(ConfigError):
                if str(self.config.dataset_dir(name)) == str(directory):
                    return name
        return None

    # ---- collect -----------------------------------------------------------------------

    def start(self, dataset: Any, task: Any) -> dict[str, Any]:
        if not isinstance(dataset, str):
            raise bad_request(
                "bad_field", "dataset: a dataset name of collection.tasks is required", "dataset"
            )
        self.dataset_root(dataset)
        if task is not None and (not isinstance(task, str) or not task.strip()):
            raise bad_request(
                "bad_field", "task: a non-empty prompt, or null for the first", "task"
            )
        if task is not None:
            task = typed_text(task, "task")
        self.warnings.clear()
        for line in self.source.before_start():  # source processes that stopped: restarted
            log.warning("console: %s", line)
        if self.source.finished.is_set():
            raise conflict(
                "source_ended", f"the source has ended: {self.source.error or 'no more samples'}"
            )
        try:
            root = self.recorder.start(dataset, task)
        except RecorderError as e:
            code = "already_recording" if self.recorder.recording else "recorder_error"
            raise conflict(code, str(e)) from None
        self.invalidate_status()
        self.changed()
        return {"state": "recording", "dataset": dataset, "dataset_dir": str(root)}

    def stop(self) -> dict[str, Any]:
        try:
            job = self.recorder.stop()
        except RecorderError as e:
            raise conflict("not_recording", str(e)) from None
        self.invalidate_status()
        self.changed()
        return self._save_job(job)

    def cancel(self) -> dict[str, Any]:
        try:
            self.recorder.cancel()
        except RecorderError as e:
            raise conflict("not_recording", str(e)) from None
        self.invalidate_status()
        self.changed()
        return {"state": "idle", "cancelled": True}

    def preview_jpeg(self, key: str) -> tuple[int, float, bytes] | None:
        """The newest preview of camera ``key`` as JPEG (encoded once per preview, shared)."""
        if key not in self.preview.keys:
            raise not_found("unknown_camera", f"camera {key!r} is not configured", "camera")
        self.preview.want()
        latest = self.preview.latest(key)
        if latest is None:
            return None
        seq, t, frame = latest
        with self._jpeg_lock:
            cached = self._jpeg.get(key)
            if cached is not None and cached[0] == seq:
                return seq, t, cached[1]
            encoder = self._jpeg_encoders.get(key)
            if encoder is None:
                from eva.console.jpeg import JpegEncoder

                encoder = JpegEncoder(frame.shape[1], frame.shape[0])
                self._jpeg_encoders[key] = encoder
        data = encoder.encode(frame)
        with self._jpeg_lock:
            self._jpeg[key] = (seq, data)
        return seq, t, data
