"""The terminal side of ``eva collect``: the status line, job lines and capture log lines."""

from __future__ import annotations

import json
import logging
import queue
import sys
from pathlib import Path
from typing import Any

from eva.cli.output import first_line, human_bytes, say
from eva.textsafe import printable

# At most one backlog message per stream (and level) every this many seconds on the terminal;
# the others are counted, and the count rides on the next one shown.
BACKLOG_LOG_INTERVAL_S = 5.0


def fit_width(text: str, width: int) -> str:
    """``text`` cut to fewer than ``width`` terminal columns (the last column is left free, so
    the line never wraps, whatever the terminal does with a line that fills it)."""
    import unicodedata

    room = max(width - 1, 1)
    used = 0
    for i, ch in enumerate(text):
        w = 2 if unicodedata.east_asian_width(ch) in "WF" else 0 if unicodedata.combining(ch) else 1
        if used + w > room:
            return text[:i]
        used += w
    return text


def terminal_width() -> int:
    """Columns of the terminal, read afresh (a resize takes effect on the next redraw)."""
    import os
    import shutil

    for stream in (sys.stderr, sys.stdout, sys.stdin):
        try:
            columns = os.get_terminal_size(stream.fileno()).columns
        except (AttributeError, OSError, ValueError):
            continue
        if columns > 0:
            return columns
    return shutil.get_terminal_size().columns or 80


def collect_status_line(status: dict[str, Any], episode: int | None = None) -> str:
    """The interactive status, most important first (the terminal width cuts its end)."""
    state = "REC" if status["recording"] else "idle"
    head = state if episode is None else f"{state} ep {episode}"
    cameras = list(status["camera_fps"])
    short = {key: key.rsplit(".", 1)[-1] for key in cameras}
    fps = " ".join(f"{short[k]}:{status['camera_fps'][k]:.1f}" for k in cameras) or "-"
    # samples waiting per camera (all streams' when there is no camera); MB over every stream
    waiting = " ".join(f"{short[k]}:{status['backlog'].get(k, 0)}" for k in cameras)
    total = sum(status["backlog"].values())
    return " | ".join(
        [
            head,
            f"{status['elapsed_s']:.1f}s",
            f"fps {fps}",
            f"dropped {status['dropped']}",
            f"backlog {waiting or total} ({status['backlog_mb']:.1f} MB)",
            f"frames {status['frames']}",
            f"saves {status['save_queue']} queued, {status['saved']} saved, "
            f"{status['failed']} failed",
        ]
    )


def episode_bytes(job: Any) -> int | None:
    """Bytes on disk of a saved episode: its parquet file and its MP4s (0 for a zero-frame
    episode, None for a failed save or files that cannot be read)."""
    if job.state != "saved":
        return None
    if job.episode_index is None:
        return 0
    from eva.dataset.errors import DatasetError
    from eva.dataset.reader import DatasetReader

    try:
        reader = DatasetReader(job.dataset_dir)
        ep = job.episode_index
        paths = [reader.data_path(ep), *(reader.video_path(ep, k) for k in reader.video_keys)]
        return sum(p.stat().st_size for p in paths)
    except (DatasetError, OSError, ValueError):
        return None


def collect_job_line(job: Any, size: int | None = None) -> str:
    if job.state == "failed":
        return f"episode save failed: {job.error}"
    if job.episode_index is None:
        return "zero-frame episode: nothing written"
    quality = job.quality or "?"
    codes = [i["code"] for i in job.quality_issues]
    if codes:
        quality += f" ({codes[0]}" + (f" +{len(codes) - 1} more" if len(codes) > 1 else "") + ")"
    size = episode_bytes(job) if size is None else size
    return (
        f"saved episode {job.episode_index}: {job.frames} frames, {quality}"
        + (f", {human_bytes(size)}" if size is not None else "")
        + f" -> {job.dataset_dir}"
        + (f" ({job.warning})" if getattr(job, "warning", None) else "")
    )


class LogLimiter:
    """Turns ``eva.capture`` records into one-line messages; backlog messages (``capture
    backlog: stream NAME ...``) are shown at most once per stream and level every ``interval``
    seconds, the suppressed ones counted."""

    def __init__(self, interval: float = BACKLOG_LOG_INTERVAL_S, clock: Any = None) -> None:
        import re
        import time

        self.interval = interval
        self.clock = clock or time.monotonic
        self._pattern = re.compile(r"capture backlog: stream (\S+)")
        self._shown: dict[tuple[str, int], float] = {}
        self._suppressed: dict[tuple[str, int], int] = {}
        import threading

        self._lock = threading.Lock()

    def admit(self, record: Any) -> str | None:
        """The line to show for ``record``, or None when it is suppressed."""
        text = " ".join(part.strip() for part in record.getMessage().splitlines() if part.strip())
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            text += f": {first_line(str(exc)) or type(exc).__name__}"
        line = f"eva: {record.levelname.lower()}: {text}"
        match = self._pattern.match(text)
        if match is None:
            return line
        key = (match.group(1), record.levelno)
        with self._lock:
            now = self.clock()
            last = self._shown.get(key)
            if last is not None and now - last < self.interval:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return None
            self._shown[key] = now
            count = self._suppressed.pop(key, 0)
        return line + (f" ({count} similar suppressed)" if count else "")

    def leftovers(self) -> list[str]:
        """Counts of suppressed messages no later message reported (end of the session)."""
        import logging

        with self._lock:
            items = sorted(self._suppressed.items())
            self._suppressed.clear()
        return [
            f"eva: {logging.getLevelName(level).lower()}: capture backlog: stream {name}: "
            f"{count} more message(s) suppressed"
            for (name, level), count in items
        ]


class CaptureLogHandler(logging.Handler):
    """``eva.capture`` records on stderr, one line each (see :class:`LogLimiter`); while the
    interactive screen runs they wait in ``queue`` so the screen prints them above its status
    line."""

    def __init__(self, limiter: LogLimiter, level: int) -> None:
        super().__init__(level)
        self.limiter = limiter
        self.queue: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.held = False

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.limiter.admit(record)
            if line is None:
                return
            if self.held:
                self.queue.put(line)
            else:
                sys.stderr.write(printable(line) + "\n")
                sys.stderr.flush()
        except Exception:
            self.handleError(record)

    def pending(self) -> list[str]:
        lines = []
        while True:
            try:
                lines.append(self.queue.get_nowait())
            except queue.Empty:
                return lines

    def resume(self) -> None:
        """Back to writing straight to stderr, after what was held."""
        self.held = False
        for line in self.pending() + self.limiter.leftovers():
            sys.stderr.write(printable(line) + "\n")
        sys.stderr.flush()


class JobReporter:
    """Prints each save job's result once, in STOP order, as soon as it has finished."""

    def __init__(self, as_json: bool = False, interactive: bool = False) -> None:
        self.as_json = as_json
        self.interactive = interactive
        self.reported = 0

    def new(self, jobs: list[Any]) -> list[Any]:
        """Finished jobs not reported yet (stops at the first unfinished one: order is kept)."""
        out = []
        while self.reported < len(jobs) and jobs[self.reported].finished:
            out.append(jobs[self.reported])
            self.reported += 1
        return out

    def line(self, job: Any) -> str:
        size = episode_bytes(job)
        if self.as_json:
            return json.dumps({**job.as_dict(), "bytes": size}, ensure_ascii=False, default=str)
        return collect_job_line(job, size)

    def flush(self, jobs: list[Any]) -> None:
        for job in self.new(jobs):
            to_stderr = self.interactive or (job.state == "failed" and not self.as_json)
            say(self.line(job), err=to_stderr)


class EpisodeNumbers:
    """The index the next (or the recording) episode of a dataset gets: the dataset's next free
    index, plus the episodes still being saved (a zero-frame episode takes none: then it is one
    too high until that save ends)."""

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder
        self.on_disk: dict[Path, int] = {}

    def next_index(self, root: Path) -> int:
        base = self.on_disk.get(root)
        if base is None:
            base = self.on_disk[root] = self._read(root)
        jobs = [j for j in list(self.recorder.jobs) if Path(j.dataset_dir) == root]
        saved = [j.episode_index for j in jobs if j.episode_index is not None]
        if saved:
            base = max(base, max(saved) + 1)
        return base + sum(1 for j in jobs if not j.finished)

    @staticmethod
    def _read(root: Path) -> int:
        from eva.dataset import layout
        from eva.dataset.reader import DatasetReader

        if not (root / layout.EPISODES).is_file():
            return 0
        try:
            return max(DatasetReader(root).episode_indices, default=-1) + 1
        except Exception:  # a broken dataset: START says why
            return 0


class StatusScreen:
    """Message lines above one status line, redrawn in place and cut to the terminal width."""

    def __init__(self) -> None:
        self.drawn = False

    def say(self, text: str) -> None:
        sys.stderr.write(("\r\033[K" if self.drawn else "") + printable(text) + "\n")
        sys.stderr.flush()
        self.drawn = False

    def draw(self, line: str) -> None:
        sys.stderr.write("\r\033[K" + fit_width(printable(line), terminal_width()))
        sys.stderr.flush()
        self.drawn = True

    def end(self) -> None:
        """Leave the last status on screen and move below it."""
        if self.drawn:
            sys.stderr.write("\n")
            sys.stderr.flush()
        self.drawn = False
