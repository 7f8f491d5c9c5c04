"""A progress bar for long commands on a terminal (rich): rate, ETA and elapsed time.

Used by the CLI only (only the CLI knows terminals), and only when stderr is a terminal: a pipe,
cron or ssh without a tty gets nothing from here (``--json`` is the scripting interface). rich
is imported when a bar is first shown, so commands that draw none never pay for it.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import IO, Any, Literal

Unit = Literal["episodes", "bytes"]


def progress_wanted(stream: IO[str] | None = None) -> bool:
    """True when ``stream`` (stderr by default) is an interactive terminal."""
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class ProgressBar:
    """One task's bar: ``update(completed, ...)`` as work advances, ``stage(text)`` for steps
    that are not counted (publishing), then ``close()`` (or use it as a context manager).

    ``unit="episodes"`` counts items (rate in items/s); ``unit="bytes"`` shows sizes and a
    transfer rate. ``total`` may be unknown (None) at first and given later. With
    ``enabled=False`` every call does nothing, so callers need no branches.
    """

    def __init__(
        self,
        description: str,
        *,
        total: float | None = None,
        unit: Unit = "episodes",
        enabled: bool | None = None,
        stream: IO[str] | None = None,
    ) -> None:
        self.description = description
        self.unit = unit
        self.enabled = progress_wanted(stream) if enabled is None else enabled
        self._progress: Any = None
        self._task: Any = None
        if not self.enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        counted = (
            [DownloadColumn(binary_units=False), TransferSpeedColumn()]
            if unit == "bytes"
            else [MofNCompleteColumn(), TextColumn("{task.fields[rate]}")]
        )
        self._progress = Progress(
            # file and dataset names are shown as they are: "[red]" in a name is not markup
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            TaskProgressColumn(),
            *counted,
            TextColumn("elapsed"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[detail]}", markup=False),
            console=Console(file=stream if stream is not None else sys.stderr),
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task(description, total=total, detail="", rate="")

    def update(
        self, completed: float, *, total: float | None = None, detail: str | None = None
    ) -> None:
        if not self.enabled:
            return
        fields: dict[str, Any] = {"completed": completed}
        if total is not None:
            fields["total"] = total
        if detail is not None:
            fields["detail"] = detail
        self._progress.update(self._task, **fields)
        if self.unit == "episodes":
            speed = self._progress.tasks[0].speed
            rate = f"{speed:.1f} {self.unit}/s" if speed else ""
            self._progress.update(self._task, rate=rate)

    def stage(self, text: str) -> None:
        """Name a step the counts do not measure (e.g. publishing the pair)."""
        if self.enabled:
            self._progress.update(self._task, description=f"{self.description}: {text}")

    def close(self) -> None:
        if self.enabled and self._progress is not None:
            self._progress.stop()
            self._progress = None
            self.enabled = False

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
