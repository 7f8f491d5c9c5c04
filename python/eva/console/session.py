"""What the operator console does, without HTTP: one recorder, review, export and upload jobs.

:class:`ConsoleSession` is the whole console behind the web server (``console/server.py`` only
turns requests into these calls and results into JSON). It holds:

- the :class:`~eva.capture.recorder.Recorder` of the config's collection, fed by the source the
  console was started with (the simulated rig by default, shown in the status), with a preview
  tap for the COLLECT panel;
- the review of every dataset of ``collection.tasks`` (the same ``eva.quality.verdicts`` calls,
  locks and files as ``eva qc``);
- background export and upload jobs (the same ``eva.export.pipeline`` and ``eva.upload`` code as
  ``eva export`` / ``eva upload``; their ``job.json`` / ``upload_job.json`` are the same files);
- a change counter that the event stream watches, so a page never polls in a tight loop.

Clients never send paths: a dataset is a name of ``collection.tasks`` and every directory is
derived here. One background job (export or upload) runs at a time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eva.capture.recorder import Recorder, RecorderError
from eva.capture.sources import open_source
from eva.config import CollectionConfig, ConfigError, load_config
from eva.dataset import fsafe, layout
from eva.dataset.errors import DatasetError, error_line
from eva.jobs import new_job_id, read_job
from eva.timestamps import utc_now

log = logging.getLogger("eva.console")

MAX_SERIES_POINTS = 2000
STATUS_CACHE_S = 0.2


class ConsoleError(Exception):
    """A refused request: ``kind`` is bad_request | not_found | conflict; ``code`` a stable
    identifier; ``field`` the request field it concerns (if any). The message is one line."""

    def __init__(self, kind: str, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.code = code
        self.field = field


def _bad(code: str, message: str, field: str | None = None) -> ConsoleError:
    return ConsoleError("bad_request", code, message, field)


def _not_found(code: str, message: str, field: str | None = None) -> ConsoleError:
    return ConsoleError("not_found", code, message, field)


def _conflict(code: str, message: str, field: str | None = None) -> ConsoleError:
    return ConsoleError("conflict", code, message, field)


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
    created_at: str = field(default_factory=utc_now)
    finished_at: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_FRAME_REF = re.compile(r"\bframes? (\d+)")


def issue_frames(detail: object) -> list[int]:
    """Frame numbers an issue's detail names ("frame 12", "near frame 40", "frames 0-9"), so the
    replay can jump there."""
    if not isinstance(detail, str):
        return []
    return sorted({int(m) for m in _FRAME_REF.findall(detail)})


def _console_reason(gate_reason: str) -> str:
    """The console's code for an upload gate refusal: its API has always called a stale export
    ``export_stale`` (the gate's ``stale_review``, decided by the same eva.export.staleness)."""
    return "export_stale" if gate_reason == "stale_review" else gate_reason


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
        # None: the config's sources (source processes); "sim" / "replay:PATH": an override
        self.source = open_source(config, source, seed=seed)
        self.config: CollectionConfig = self.source.config
        self.source_note = self.source.note
        self.source_spec = source
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
        self._jobs: dict[str, ConsoleJob] = {}
        self._jobs_lock = threading.Lock()
        self._active_job: str | None = None
        self._jpeg: dict[str, tuple[int, bytes]] = {}
        self._jpeg_lock = threading.Lock()
        self._jpeg_encoders: dict[str, Any] = {}
        self._seen_saves: set[int] = set()
        self._counts: dict[Path, tuple[tuple[int, int, int], int]] = {}
        self._videos: dict[tuple[str, str, str], tuple[Any, Path]] = {}
        self.warnings = _WarningLog(self.changed)
        logging.getLogger("eva.capture").addHandler(self.warnings)
        try:
            self.recorder = Recorder(self.config, durable=durable, rings=self.source.rings)
        except BaseException:
            self.source.close()
            raise
        self.preview = self.recorder.enable_preview()
        self.source.start(self.recorder)

    # ---- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        with contextlib.suppress(RecorderError):
            if self.recorder.recording:
                self.recorder.cancel()
        self.source.close()
        self.recorder.close()
        logging.getLogger("eva.capture").removeHandler(self.warnings)
        with self._jobs_lock:
            active = self._jobs.get(self._active_job) if self._active_job else None
        if active is not None:
            log.warning("console closing while job %s is %s", active.job_id, active.state)

    def changed(self) -> None:
        with self._version_lock:
            self.version += 1

    # ---- datasets ----------------------------------------------------------------------

    def dataset_root(self, name: str) -> Path:
        """The raw directory of a dataset of ``collection.tasks``; anything else is refused."""
        if not isinstance(name, str) or name not in self.config.tasks:
            raise _not_found(
                "unknown_dataset", f"dataset {name!r} is not in collection.tasks", "dataset"
            )
        try:
            return self.config.dataset_dir(name)
        except ConfigError as e:  # e.g. a symlinked directory that leads out of log_dir
            raise _conflict("unsafe_path", str(e), "dataset") from None

    def _checked_root(self, name: str) -> Path:
        """``dataset_root`` that must exist and be a real directory inside the log directory."""
        root = self.dataset_root(name)
        log_dir = Path(self.config.log_dir).resolve()
        if root.is_symlink() or root.parent.is_symlink():
            raise _conflict("unsafe_path", f"{root}: a symlink; the console does not follow it")
        if not root.is_dir():
            raise _conflict("no_episodes", f"dataset {name!r} has no recorded episodes yet")
        if not layout.is_within(root.resolve(), log_dir):
            raise _conflict("unsafe_path", f"{root}: resolves outside the log directory")
        try:  # the containment check qc, cleanup, the writer and export share
            fsafe.check_dataset_tree(root)
        except DatasetError as e:
            raise _conflict("unsafe_path", str(e)) from None
        return root

    def _episode_count(self, root: Path) -> int | None:
        """Rows of episodes.jsonl, re-counted only when the file's size or mtime changed (the
        status is built several times a second)."""
        path = root / layout.EPISODES
        try:
            st = path.stat()
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            cached = self._counts.get(path)
            if cached is not None and cached[0] == key:
                return cached[1]
            with path.open("rb") as f:
                count = sum(1 for line in f if line.strip())
        except OSError:
            return None
        self._counts[path] = (key, count)
        return count

    def datasets(self) -> list[dict[str, Any]]:
        out = []
        for name, prompts in self.config.tasks.items():
            try:
                root = self.config.dataset_dir(name)
            except ConfigError as e:
                out.append({"name": name, "tasks": list(prompts), "dir": None, "error": str(e)})
                continue
            out.append(
                {
                    "name": name,
                    "tasks": list(prompts),
                    "dir": str(root),
                    "episodes": self._episode_count(root) or 0,
                }
            )
        return out

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
        with self._jobs_lock:
            active = self._jobs.get(self._active_job) if self._active_job else None
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

    def _save_job(self, job: Any) -> dict[str, Any]:
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
            raise _bad(
                "bad_field", "dataset: a dataset name of collection.tasks is required", "dataset"
            )
        self.dataset_root(dataset)
        if task is not None and (not isinstance(task, str) or not task.strip()):
            raise _bad("bad_field", "task: a non-empty prompt, or null for the first", "task")
        if isinstance(task, str) and any(ord(c) < 32 for c in task):
            raise _bad("bad_field", "task: control characters are not allowed", "task")
        for line in self.source.before_start():  # source processes that stopped: restarted
            log.warning("console: %s", line)
        if self.source.finished.is_set():
            raise _conflict(
                "source_ended", f"the source has ended: {self.source.error or 'no more samples'}"
            )
        try:
            root = self.recorder.start(dataset, task)
        except RecorderError as e:
            code = "already_recording" if self.recorder.recording else "recorder_error"
            raise _conflict(code, str(e)) from None
        self._status_cache = None
        self.changed()
        return {"state": "recording", "dataset": dataset, "dataset_dir": str(root)}

    def stop(self) -> dict[str, Any]:
        try:
            job = self.recorder.stop()
        except RecorderError as e:
            raise _conflict("not_recording", str(e)) from None
        self._status_cache = None
        self.changed()
        return self._save_job(job)

    def cancel(self) -> dict[str, Any]:
        try:
            self.recorder.cancel()
        except RecorderError as e:
            raise _conflict("not_recording", str(e)) from None
        self._status_cache = None
        self.changed()
        return {"state": "idle", "cancelled": True}

    def preview_jpeg(self, key: str) -> tuple[int, float, bytes] | None:
        """The newest preview of camera ``key`` as JPEG (encoded once per preview, shared)."""
        if key not in self.preview.keys:
            raise _not_found("unknown_camera", f"camera {key!r} is not configured", "camera")
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

    # ---- review ------------------------------------------------------------------------

    def episodes(self, name: str) -> dict[str, Any]:
        from eva.quality.split import plan_split
        from eva.quality.verdicts import read_episode_rows, reason_of, subset_of

        root = self.dataset_root(name)
        if not (root / layout.EPISODES).exists():
            return {"dataset": name, "dir": str(root), "episodes": [], "split": {}, "stale": []}
        root = self._checked_root(name)
        try:
            rows = read_episode_rows(root)
        except DatasetError as e:
            raise _conflict("bad_dataset", str(e)) from None
        episodes = []
        for row in sorted(rows, key=lambda r: r["episode_index"]):
            issues = []
            for item in row.get("quality_issues") or []:
                if isinstance(item, Mapping):
                    issues.append({**item, "frames": issue_frames(item.get("detail"))})
            episodes.append(
                {
                    "episode_index": row["episode_index"],
                    "length": row.get("length"),
                    "tasks": row.get("tasks"),
                    "quality": row.get("quality"),
                    "quality_issues": issues,
                    "qc_verdict": row.get("qc_verdict"),
                    "qc_note": row.get("qc_note"),
                    "subset": subset_of(row),
                    "reason": reason_of(row),
                    "video_keys": row.get("video_keys") or [],
                    "started_at": row.get("started_at"),
                    "duration_seconds": row.get("duration_seconds"),
                }
            )
        plan = plan_split(rows)
        return {
            "dataset": name,
            "dir": str(root),
            "episodes": episodes,
            "split": {"accepted": plan.accepted, "rejected": plan.rejected},
            "stale": [f for f, e in self._export_states(root, plan).items() if e.get("stale")],
        }

    def set_review(self, name: str, index: Any, body: Mapping[str, Any]) -> dict[str, Any]:
        from eva.quality.verdicts import review_episode, subset_of

        if not isinstance(body, Mapping):
            raise _bad("bad_body", "the body must be a JSON object")
        unknown = sorted(set(body) - {"verdict", "note"})
        if unknown:
            raise _bad("bad_field", f"{unknown[0]}: not a field (use verdict, note)", unknown[0])
        if "verdict" not in body and "note" not in body:
            raise _bad(
                "bad_field", "verdict: give a verdict (pass, fail, null) or a note", "verdict"
            )
        verdict = body.get("verdict")
        if (
            "verdict" in body
            and verdict is not None
            and (not isinstance(verdict, str) or verdict.strip().lower() not in ("pass", "fail"))
        ):
            raise _bad("bad_field", f'verdict: {verdict!r}: use "pass", "fail" or null', "verdict")
        note = body.get("note")
        if note is not None and not isinstance(note, str):
            raise _bad("bad_field", "note: must be a string", "note")
        if isinstance(note, str) and any(ord(c) < 32 and c != "\t" for c in note):
            raise _bad("bad_field", "note: control characters (newlines) are not allowed", "note")
        root = self._checked_root(name)
        episode = self._episode_index(root, index)
        try:
            update = review_episode(
                root,
                episode,
                verdict=verdict,
                note=note,
                clear_verdict="verdict" in body and verdict is None,
            )
        except DatasetError as e:
            text = str(e)
            if "being saved" in text or "not saved yet" in text:
                raise _conflict("episode_saving", text) from None
            raise _conflict("review_failed", text) from None
        if update.changed:
            self.changed()
        row = update.row
        return {
            "episode_index": episode,
            "qc_verdict": row.get("qc_verdict"),
            "qc_note": row.get("qc_note"),
            "subset": subset_of(row),
            "changed": update.changed,
        }

    def _episode_index(self, root: Path, index: Any) -> int:
        from eva.quality.verdicts import read_episode_rows

        if isinstance(index, str) and index.isdigit():
            index = int(index)
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise _bad("bad_field", f"episode index {index!r} is not an int >= 0", "index")
        try:
            indices = {row["episode_index"] for row in read_episode_rows(root)}
        except DatasetError as e:
            raise _conflict("bad_dataset", str(e)) from None
        if index not in indices:
            raise _not_found(
                "unknown_episode", f"{root.name}: episode {index} does not exist", "index"
            )
        return index

    def _reader(self, name: str) -> tuple[Any, Path]:
        from eva.dataset.reader import DatasetReader

        root = self._checked_root(name)
        try:
            return DatasetReader(root), root
        except DatasetError as e:
            raise _conflict("bad_dataset", str(e)) from None

    def video_file(self, name: str, index: Any, key: str) -> Path:
        """The episode's raw MP4 of camera ``key``, checked to lie inside the dataset.

        A replay seeks with many Range requests: the checked path is remembered while the
        dataset's info.json and episodes.jsonl are unchanged (one stat each instead of a reader,
        the rows and a dozen ``resolve`` calls per request)."""
        root = self.dataset_root(name)
        signature = self._meta_signature(root)
        cached = self._videos.get((name, str(index), key))
        if signature is not None and cached is not None and cached[0] == signature:
            path = cached[1]
            if path.is_file() and not path.is_symlink():
                return path
        path = self._video_file(name, index, key)
        if signature is not None:
            self._videos[(name, str(index), key)] = (signature, path)
        return path

    @staticmethod
    def _meta_signature(root: Path) -> tuple[tuple[int, int, int], ...] | None:
        try:
            stats = [
                os.stat(root / rel, follow_symlinks=False) for rel in (layout.INFO, layout.EPISODES)
            ]
        except OSError:
            return None
        if root.is_symlink():
            return None
        return tuple((st.st_ino, st.st_size, st.st_mtime_ns) for st in stats)

    def _video_file(self, name: str, index: Any, key: str) -> Path:
        reader, root = self._reader(name)
        episode = self._episode_index(root, index)
        if key not in reader.video_keys:
            raise _not_found(
                "unknown_camera", f"{root.name}: no video feature {key!r}", "video_key"
            )
        try:
            path = reader.video_path(episode, key)
        except DatasetError as e:
            raise _conflict("bad_dataset", str(e)) from None
        resolved = path.resolve()
        if not layout.is_within(resolved, root.resolve()):
            raise _conflict("unsafe_path", f"{path}: resolves outside the dataset")
        if not resolved.is_file():
            raise _not_found("missing_video", f"{path}: episode {episode} video missing")
        return resolved

    def series(self, name: str, index: Any, max_points: Any = None) -> dict[str, Any]:
        """Vector features of one episode for the plots, at most ``max_points`` rows (evenly
        picked, first and last kept), with the frame index of each kept row."""
        reader, root = self._reader(name)
        episode = self._episode_index(root, index)
        if max_points is None:
            limit = MAX_SERIES_POINTS
        else:
            try:
                limit = int(max_points)
            except (TypeError, ValueError):
                raise _bad(
                    "bad_field", f"max_points {max_points!r} is not an integer", "max_points"
                ) from None
            if not 2 <= limit <= 100_000:
                raise _bad("bad_field", "max_points must be between 2 and 100000", "max_points")
        try:
            rows = reader.count_rows(episode)
            picked = (
                np.arange(rows)
                if rows <= limit
                else np.unique(np.linspace(0, rows - 1, limit).round().astype(np.int64))
            )
            series = {}
            for key in reader.vector_keys:
                values = reader.read_vector(episode, key)
                if values.ndim == 1:
                    values = values[:, None]
                values = values[picked].astype(np.float64)
                names = reader.features.get(key, {}).get("names")
                if not isinstance(names, list) or len(names) != values.shape[1]:
                    names = [f"{key}[{i}]" for i in range(values.shape[1])]
                series[key] = {
                    "names": [str(n) for n in names],
                    # one list per dimension; null where a value is not finite (JSON has no NaN)
                    "values": [
                        [float(v) if np.isfinite(v) else None for v in values[:, d]]
                        for d in range(values.shape[1])
                    ],
                }
        except DatasetError as e:
            raise _conflict("bad_dataset", str(e)) from None
        return {
            "dataset": name,
            "episode_index": episode,
            "fps": reader.fps,
            "length": rows,
            "frame_index": picked.tolist(),
            "series": series,
        }

    # ---- exports -----------------------------------------------------------------------

    def _export_states(self, root: Path, plan: Any) -> dict[str, dict[str, Any]]:
        from eva.export.staleness import export_staleness

        states: dict[str, dict[str, Any]] = {}
        for fmt in layout.FORMATS:
            export_root = layout.export_root(root, fmt)
            job = read_job(export_root / "job.json")
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
            states[fmt] = entry
        return states

    def exports(self, name: str) -> dict[str, Any]:
        """Every format's latest export of the dataset, whether the review changed since (stale),
        and what the upload gate says of it."""
        from eva.quality.split import plan_split
        from eva.quality.verdicts import read_episode_rows
        from eva.upload.gate import UploadRefused, check_upload
        from eva.upload.job import read_upload_record

        root = self.dataset_root(name)
        if not (root / layout.EPISODES).exists():
            return {"dataset": name, "formats": {}, "options": self.format_options()}
        root = self._checked_root(name)
        try:
            plan = plan_split(read_episode_rows(root))
        except DatasetError as e:
            raise _conflict("bad_dataset", str(e)) from None
        states = self._export_states(root, plan)
        for fmt in layout.FORMATS:
            entry = states.setdefault(fmt, {"state": None, "stale": False})
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
            record = read_upload_record(layout.export_root(root, fmt))
            entry["last_upload"] = (
                {
                    "state": record.state,
                    "remote_path": record.remote_path,
                    "error": record.error,
                    "finished_at": record.finished_at,
                }
                if record is not None
                else None
            )
        return {"dataset": name, "formats": states, "options": self.format_options()}

    @staticmethod
    def format_options() -> dict[str, list[dict[str, Any]]]:
        from eva.export.options import FORMAT_OPTIONS

        return {fmt: [s.as_dict() for s in specs] for fmt, specs in FORMAT_OPTIONS.items()}

    def _format(self, fmt: Any) -> str:
        if not isinstance(fmt, str):
            raise _bad("bad_field", "format: one of " + ", ".join(layout.FORMATS), "format")
        try:
            return layout.normalize_format(fmt)
        except ValueError as e:
            raise _bad("bad_field", f"format: {e}", "format") from None

    def _claim(self, job: ConsoleJob) -> None:
        with self._jobs_lock:
            active = self._jobs.get(self._active_job) if self._active_job else None
            if active is not None and active.state in ("queued", "running"):
                raise _conflict(
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
                raise _not_found("unknown_job", f"job {job_id!r} does not exist", "id")
            return job.as_dict()

    def jobs(self) -> list[dict[str, Any]]:
        with self._jobs_lock:
            return [j.as_dict() for j in self._jobs.values()]

    def start_export(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        from eva.export.options import parse_options

        if not isinstance(body, Mapping):
            raise _bad("bad_body", "the body must be a JSON object")
        unknown = sorted(set(body) - {"format", "options"})
        if unknown:
            raise _bad("bad_field", f"{unknown[0]}: not a field (use format, options)", unknown[0])
        fmt = self._format(body.get("format"))
        options_in = body.get("options") or {}
        if not isinstance(options_in, Mapping):
            raise _bad("bad_field", "options: must be an object", "options")
        try:
            options = parse_options(fmt, options_in)
        except DatasetError as e:
            text = str(e)
            raise _bad("bad_option", text, text.split(":", 1)[0]) from None
        root = self._checked_root(name)
        if not self._episode_count(root):
            raise _conflict("no_episodes", f"dataset {name!r} has no recorded episodes yet")
        paths = layout.export_paths(root, fmt)
        job = ConsoleJob(
            job_id=new_job_id(),
            kind="export",
            dataset=name,
            format=fmt,
            accepted_dir=str(paths["accepted"]),
            rejected_dir=str(paths["rejected"]),
        )
        self._claim(job)
        threading.Thread(
            target=self._run_export,
            args=(job, root, options),
            name="eva-console-export",
            daemon=True,
        ).start()
        return job.as_dict()

    def _run_export(self, job: ConsoleJob, root: Path, options: Any) -> None:
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
                root, job.format, options=options, on_progress=on_progress, job_id=job.job_id
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
                progress={**job.progress, "current": "eva verify"},
            )
            verify: dict[str, Any] = {}
            for subset, directory in (
                ("accepted", result.accepted_dir),
                ("rejected", result.rejected_dir),
            ):
                problems = verify_export(directory, source_dir=root, fmt=job.format)
                verify[subset] = {
                    "ok": not problems,
                    "problems": [f"{p.code}: {p.message}" for p in problems[:20]],
                }
            self._update(job, verify=verify, state="completed", finished_at=utc_now())
        except Exception as e:  # noqa: BLE001 - the job record carries the one-line reason
            text = (
                str(e).strip().splitlines()[0]
                if isinstance(e, DatasetError) and str(e)
                else error_line(e)
            )
            self._update(job, state="failed", error=text, finished_at=utc_now())

    def start_upload(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        from eva.publish import ExportBusy
        from eva.quality.split import plan_split
        from eva.quality.verdicts import read_episode_rows
        from eva.upload.gate import UploadRefused, check_upload
        from eva.upload.job import start_upload
        from eva.upload.sftp import UploadError

        if not isinstance(body, Mapping):
            raise _bad("bad_body", "the body must be a JSON object")
        unknown = sorted(set(body) - {"format"})
        if unknown:
            raise _bad("bad_field", f"{unknown[0]}: not a field (use format)", unknown[0])
        fmt = self._format(body.get("format"))
        root = self.dataset_root(name)
        try:
            # The gate first: without a backend nothing else matters and no thread starts.
            check_upload(root, fmt, backend_configured=self.sftp is not None)
        except UploadRefused as e:
            raise _conflict(_console_reason(e.reason), str(e)) from None
        root = self._checked_root(name)
        plan = plan_split(read_episode_rows(root))
        state = self._export_states(root, plan).get(fmt, {})
        if state.get("stale"):
            raise _conflict(
                "export_stale",
                f"{layout.export_paths(root, fmt)['accepted']}: the review changed since this "
                f"export ({state.get('stale_detail')}); export again before uploading",
            )
        job = ConsoleJob(job_id=new_job_id(), kind="upload", dataset=name, format=fmt)
        self._claim(job)
        try:
            upload = start_upload(root, fmt, self.sftp)
        except UploadRefused as e:
            self._update(job, state="failed", error=str(e), finished_at=utc_now())
            raise _conflict(_console_reason(e.reason), str(e)) from None
        except (UploadError, ExportBusy, DatasetError, ValueError) as e:
            self._update(job, state="failed", error=str(e), finished_at=utc_now())
            raise _conflict("upload_refused", str(e)) from None
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

    def _watch_upload(self, job: ConsoleJob, upload: Any) -> None:
        upload.wait()
        progress = upload.progress.as_dict()
        if upload.result is None:
            self._update(
                job, state="failed", error=upload.error, progress=progress, finished_at=utc_now()
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
