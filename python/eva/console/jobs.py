"""The console's background jobs: one export or upload at a time, and the exports' states.

The same ``eva.export.pipeline`` and ``eva.upload`` code as ``eva export`` / ``eva upload``; their
``job.json`` / ``upload_job.json`` are the same files. :class:`BackgroundJobs` keeps the jobs
started from this console (``GET /api/jobs/{id}``) and refuses a second one while one runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eva.console.datasets import DatasetDirs
from eva.console.errors import bad_request, check_body, conflict, not_found
from eva.dataset import layout
from eva.dataset.errors import DatasetError, error_line
from eva.formats import catalog
from eva.formats.base import ExportOptions
from eva.formats.catalog import FormatEntry
from eva.jobs import new_job_id, read_job
from eva.timestamps import utc_now
from eva.upload.config import SftpConfig

HOST_KEY_TIMEOUT_S = 10.0


@dataclass
class ConsoleJob:
    """An export or upload started from the console (``GET /api/jobs/{id}``)."""

    job_id: str
    kind: str  # "export" | "upload"
    dataset: str
    format: str
    state: str = "queued"  # queued | running | completed | failed
    progress: dict[str, Any] = field(default_factory=dict)
    accepted_dir: str | None = None
    rejected_dir: str | None = None
    totals: dict[str, Any] = field(default_factory=dict)
    verify: dict[str, Any] | None = None
    remote_path: str | None = None
    error: str | None = None
    # A refused host key (upload): state, server and SHA-256 fingerprint, for the trust step.
    host_key: dict[str, str] | None = None
    created_at: str = field(default_factory=utc_now)
    finished_at: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _console_reason(gate_reason: str) -> str:
    """The console's code for an upload gate refusal: its API has always called a stale export
    ``export_stale`` (the gate's ``stale_review``, decided by the same eva.export.staleness)."""
    return "export_stale" if gate_reason == "stale_review" else gate_reason


def export_states(root: Path, plan: Any) -> dict[str, dict[str, Any]]:
    """Every format's latest export job of the raw dataset ``root``, with its totals and
    whether the review changed since (``plan``: the current split plan)."""
    from eva.export.staleness import export_staleness

    states: dict[str, dict[str, Any]] = {}
    for fmt in catalog.entries():
        job = read_job(fmt.export_root(root) / "job.json")
        if job is None:
            continue
        entry: dict[str, Any] = {
            "job_id": job.job_id,
            "state": job.state,
            "accepted_dir": job.accepted_dir,
            "rejected_dir": job.rejected_dir,
            "error": job.error,
            "finished_at": job.finished_at,
            "stale": False,
        }
        # The one staleness rule the upload gate and `eva qc` / `eva info` use too.
        staleness = export_staleness(root, fmt, plan) if job.state == "completed" else None
        if staleness is not None:
            entry["totals"] = {
                subset: {
                    "episodes": (m or {}).get("total_episodes"),
                    "frames": (m or {}).get("total_frames"),
                }
                for subset, m in staleness.markers.items()
            }
            entry["stale"] = staleness.stale
            entry["stale_detail"] = staleness.describe() if staleness.stale else None
        states[fmt.name] = entry
    return states


class BackgroundJobs:
    """Export and upload jobs of the console; ``changed`` is called on every job update."""

    def __init__(
        self, dirs: DatasetDirs, sftp: SftpConfig | None, changed: Callable[[], None]
    ) -> None:
        self.dirs = dirs
        self.sftp = sftp
        self.changed = changed
        self._jobs: dict[str, ConsoleJob] = {}
        self._jobs_lock = threading.Lock()
        self._active_job: str | None = None

    def active(self) -> ConsoleJob | None:
        """The job started last (running or finished), if any."""
        with self._jobs_lock:
            return self._jobs.get(self._active_job) if self._active_job else None

    def exports(self, name: str) -> dict[str, Any]:
        """Every format's latest export of the dataset, whether the review changed since (stale),
        and what the upload gate says of it."""
        from eva.quality.split import plan_split
        from eva.quality.verdicts import read_episode_rows
        from eva.upload.gate import UploadRefused, check_upload
        from eva.upload.job import read_upload_record

        root = self.dirs.root(name)
        if not (root / layout.EPISODES).exists():
            return {"dataset": name, "formats": {}, "options": self.format_options()}
        root = self.dirs.checked_root(name)
        try:
            plan = plan_split(read_episode_rows(root))
        except DatasetError as e:
            raise conflict("bad_dataset", str(e)) from None
        states = export_states(root, plan)
        for fmt in catalog.entries():
            entry = states.setdefault(fmt.name, {"state": None, "stale": False})
            try:
                check_upload(root, fmt, backend_configured=self.sftp is not None)
                entry["upload"] = {"allowed": True, "reason": None, "message": None}
            except UploadRefused as e:
                reason = _console_reason(e.reason)
                entry["upload"] = {"allowed": False, "reason": reason, "message": str(e)}
            if entry["upload"]["allowed"] and entry.get("stale"):
                entry["upload"] = {
                    "allowed": False,
                    "reason": "export_stale",
                    "message": "the review changed since this export: export again",
                }
            record = read_upload_record(fmt.export_root(root))
            entry["last_upload"] = (
                {
                    "state": record.state,
                    "remote_path": record.remote_path,
                    "error": record.error,
                    "finished_at": record.finished_at,
                    "export_job_id": record.export_job_id,
                    "remote": record.remote,
                }
                if record is not None
                else None
            )
        return {"dataset": name, "formats": states, "options": self.format_options()}

    @staticmethod
    def format_options() -> dict[str, list[dict[str, object]]]:
        from eva.export.options import describe_options

        return describe_options()

    def _format(self, fmt: object) -> FormatEntry:
        """The request's format, parsed into its catalogue entry (the console's one reading of
        a format's name)."""
        if not isinstance(fmt, str):
            raise bad_request("bad_field", "format: one of " + ", ".join(catalog.names()), "format")
        try:
            return catalog.parse(fmt)
        except (ValueError, DatasetError) as e:  # unknown; a plugin that cannot be loaded
            raise bad_request("bad_field", f"format: {e}", "format") from None

    def _claim(self, job: ConsoleJob) -> None:
        with self._jobs_lock:
            active = self._jobs.get(self._active_job) if self._active_job else None
            if active is not None and active.state in ("queued", "running"):
                raise conflict(
                    "job_running",
                    f"{active.kind} job {active.job_id} ({active.dataset}, {active.format}) is "
                    f"{active.state}; wait for it to finish",
                )
            self._jobs[job.job_id] = job
            self._active_job = job.job_id
        self.changed()

    def _update(self, job: ConsoleJob, **fields: Any) -> None:
        with self._jobs_lock:
            for key, value in fields.items():
                setattr(job, key, value)
        self.changed()

    def job(self, job_id: str) -> dict[str, Any]:
        with self._jobs_lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise not_found("unknown_job", f"job {job_id!r} does not exist", "id")
            return job.as_dict()

    def jobs(self) -> list[dict[str, Any]]:
        with self._jobs_lock:
            return [j.as_dict() for j in self._jobs.values()]

    def start_export(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        check_body(body, ("format", "options"))
        fmt = self._format(body.get("format"))
        options_in = body.get("options") or {}
        if not isinstance(options_in, Mapping):
            raise bad_request("bad_field", "options: must be an object", "options")
        try:
            options = fmt.parse_options(options_in)
        except DatasetError as e:
            text = str(e)
            raise bad_request("bad_option", text, text.split(":", 1)[0]) from None
        root = self.dirs.checked_root(name)
        if not self.dirs.episode_count(root):
            raise conflict("no_episodes", f"dataset {name!r} has no recorded episodes yet")
        paths = fmt.export_paths(root)
        job = ConsoleJob(
            job_id=new_job_id(),
            kind="export",
            dataset=name,
            format=fmt.name,
            accepted_dir=str(paths["accepted"]),
            rejected_dir=str(paths["rejected"]),
        )
        self._claim(job)
        threading.Thread(
            target=self._run_export,
            args=(job, root, fmt, options),
            name="eva-console-export",
            daemon=True,
        ).start()
        return job.as_dict()

    def _run_export(
        self, job: ConsoleJob, root: Path, fmt: FormatEntry, options: ExportOptions
    ) -> None:
        from eva.export.pipeline import export_dataset
        from eva.export.verify import verify_export

        last = [0.0]

        def on_progress(progress: Any, export_job: Any) -> None:
            now = time.monotonic()
            if now - last[0] < 0.1 and export_job.state == "running":
                return
            last[0] = now
            self._update(job, state="running", progress=progress.as_dict())

        self._update(job, state="running")
        try:
            result = export_dataset(
                root, fmt, options=options, on_progress=on_progress, job_id=job.job_id
            )
            totals = {
                subset: {"episodes": meta.total_episodes, "frames": meta.total_frames}
                for subset, meta in result.metas.items()
            }
            self._update(
                job,
                totals=totals,
                accepted_dir=str(result.accepted_dir),
                rejected_dir=str(result.rejected_dir),
            )
            verify: dict[str, Any] = {}
            subsets = (("accepted", result.accepted_dir), ("rejected", result.rejected_dir))
            for step, (subset, directory) in enumerate(subsets):
                # The page shows the step and its elapsed time from verify_started_at.
                self._update(
                    job,
                    progress={
                        **job.progress,
                        "current": f"eva verify {subset} ({step + 1} of {len(subsets)})",
                        "verify_done": step,
                        "verify_total": len(subsets),
                        "verify_started_at": utc_now(),
                    },
                )
                began = time.monotonic()
                problems = verify_export(directory, source_dir=root, fmt=fmt)
                verify[subset] = {
                    "ok": not problems,
                    "problems": [f"{p.code}: {p.message}" for p in problems[:20]],
                    "elapsed_s": round(time.monotonic() - began, 2),
                }
            progress = {**job.progress, "current": None, "verify_done": len(subsets)}
            self._update(
                job, verify=verify, progress=progress, state="completed", finished_at=utc_now()
            )
        except Exception as e:  # noqa: BLE001 - the job record carries the one-line reason
            text = (
                str(e).strip().splitlines()[0]
                if isinstance(e, DatasetError) and str(e)
                else error_line(e)
            )
            # Directories this export did not publish (no totals yet) are not listed as its output.
            unwritten = {} if job.totals else {"accepted_dir": None, "rejected_dir": None}
            self._update(job, state="failed", error=text, finished_at=utc_now(), **unwritten)

    def start_upload(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        from eva.publish import ExportBusy
        from eva.quality.split import plan_split
        from eva.quality.verdicts import read_episode_rows
        from eva.upload.errors import UploadError
        from eva.upload.gate import UploadRefused, check_upload
        from eva.upload.job import start_upload

        check_body(body, ("format", "again"))
        fmt = self._format(body.get("format"))
        again = body.get("again", False)
        if not isinstance(again, bool):
            raise bad_request("bad_field", "again: true or false", "again")
        root = self.dirs.root(name)
        try:
            # The gate first: without a backend nothing else matters and no thread starts.
            permit = check_upload(root, fmt, backend_configured=self.sftp is not None)
        except UploadRefused as e:
            raise conflict(_console_reason(e.reason), str(e)) from None
        if not again:
            self._refuse_second_copy(permit)
        root = self.dirs.checked_root(name)
        plan = plan_split(read_episode_rows(root))
        state = export_states(root, plan).get(fmt.name, {})
        if state.get("stale"):
            raise conflict(
                "export_stale",
                f"{fmt.export_paths(root)['accepted']}: the review changed since this "
                f"export ({state.get('stale_detail')}); export again before uploading",
            )
        job = ConsoleJob(job_id=new_job_id(), kind="upload", dataset=name, format=fmt.name)
        self._claim(job)
        try:
            upload = start_upload(root, fmt, self.sftp)
        except UploadRefused as e:
            self._update(job, state="failed", error=str(e), finished_at=utc_now())
            raise conflict(_console_reason(e.reason), str(e)) from None
        except (UploadError, ExportBusy, DatasetError, ValueError) as e:
            self._update(job, state="failed", error=str(e), finished_at=utc_now())
            raise conflict("upload_refused", str(e)) from None
        self._update(job, state="running", accepted_dir=str(upload.permit.accepted_dir))
        last = [0.0]

        def on_progress(progress: Any) -> None:
            now = time.monotonic()
            if now - last[0] >= 0.1:
                last[0] = now
                self._update(job, progress=progress.as_dict())

        upload.add_listener(on_progress)
        threading.Thread(
            target=self._watch_upload, args=(job, upload), name="eva-console-upload", daemon=True
        ).start()
        return job.as_dict()

    def _refuse_second_copy(self, permit: Any) -> None:
        """A second upload of the export already on this server is asked for explicitly
        (``"again": true``): it would be published under a copy name beside the first."""
        from eva.upload.job import read_upload_record

        previous = read_upload_record(permit.export_root)
        if (
            previous is not None
            and previous.state == "completed"
            and previous.export_job_id == permit.export_job_id
            and self.sftp is not None
            and previous.remote == self.sftp.describe()
        ):
            raise conflict(
                "already_uploaded",
                f"this {permit.format} export is already on {previous.remote} at "
                f"{previous.remote_path} (uploaded {previous.finished_at}); upload again "
                '("again": true) for a second copy beside it',
            )

    def host_key(self) -> dict[str, str]:
        """The upload server's host key and what known_hosts says of it (a key exchange, no
        login)."""
        from eva.upload.connect import probe_host_key
        from eva.upload.errors import UploadError

        sftp = self._backend()
        try:
            return probe_host_key(sftp, connect_timeout=HOST_KEY_TIMEOUT_S)[0].as_dict()
        except UploadError as e:
            raise conflict("connect_failed", str(e)) from None

    def trust_host_key(self, body: Mapping[str, Any]) -> dict[str, str]:
        """Record the upload server's unknown host key, the one whose fingerprint the page
        showed; a changed or revoked key is refused (fixed in known_hosts by hand only)."""
        from eva.upload.connect import trust_host_key
        from eva.upload.errors import HostKeyError, UploadError

        check_body(body, ("fingerprint",))
        fingerprint = body.get("fingerprint")
        if not isinstance(fingerprint, str) or not fingerprint.startswith("SHA256:"):
            raise bad_request("bad_field", "fingerprint: the SHA256:... shown", "fingerprint")
        sftp = self._backend()
        try:
            report = trust_host_key(sftp, fingerprint, connect_timeout=HOST_KEY_TIMEOUT_S)
        except HostKeyError as e:
            raise conflict(f"host_key_{e.state or 'refused'}", str(e)) from None
        except UploadError as e:
            raise conflict("connect_failed", str(e)) from None
        self.changed()
        return report.as_dict()

    def _backend(self) -> SftpConfig:
        if self.sftp is None:
            raise conflict(
                "no_backend",
                "no upload backend configured: add a [collection.storage.sftp] table to the config",
            )
        return self.sftp

    def _watch_upload(self, job: ConsoleJob, upload: Any) -> None:
        upload.wait()
        progress = upload.progress.as_dict()
        if upload.result is None:
            refused = upload.host_key_error
            host_key = None
            error = upload.error
            if refused is not None and refused.state:
                host_key = {
                    "state": refused.state,
                    "server": refused.server,
                    "fingerprint": refused.fingerprint,
                }
                if refused.state == "unknown":  # the page's trust step, not the CLI's flag
                    error = (
                        f"{refused.server}: unknown host key {refused.fingerprint}: compare it "
                        "with the server's own, then trust it here"
                    )
            self._update(
                job,
                state="failed",
                error=error,
                host_key=host_key,
                progress=progress,
                finished_at=utc_now(),
            )
            return
        self._update(
            job,
            state="completed",
            remote_path=upload.result.remote_path,
            progress=progress,
            totals={"files": upload.result.files, "bytes": upload.result.bytes},
            finished_at=utc_now(),
        )
