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


class _Droppable:
    """Columns shown as one (``elapsed 0:00:12``), or as nothing when left out."""

    def __init__(self, columns: list[Any]) -> None:
        self.columns = columns
        self.shown = True

    def __call__(self, task: Any) -> Any:
        from rich.text import Text

        if not self.shown:
            return Text("")
        return Text(" ").join(_as_text(column(task)) for column in self.columns)

    def get_table_column(self) -> Any:
        from rich.table import Column

        return Column(no_wrap=True)


def _as_text(renderable: Any) -> Any:
    from rich.text import Text

    return renderable if isinstance(renderable, Text) else Text(str(renderable))


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
        from rich.table import Column

        def shrinking() -> Column:  # cut with an ellipsis to the width _fit gives it
            return Column(no_wrap=True, overflow="ellipsis", min_width=0)

        count, rate = (
            (DownloadColumn(binary_units=False), TransferSpeedColumn())
            if unit == "bytes"
            else (MofNCompleteColumn(), TextColumn("{task.fields[rate]}"))
        )
        # file and dataset names are shown as they are: "[red]" in a name is not markup
        self._name = TextColumn("{task.description}", markup=False, table_column=shrinking())
        self._detail = TextColumn("{task.fields[detail]}", markup=False, table_column=shrinking())
        self._bar = BarColumn()
        self._kept = [TaskProgressColumn(), count, TextColumn("eta"), TimeRemainingColumn()]
        # left out, in this order, when the terminal is too narrow for them and the ETA
        self._droppable: list[Any] = [
            _Droppable([TextColumn("elapsed"), TimeElapsedColumn()]),
            _Droppable([rate]),
        ]
        self._progress = Progress(
            self._name,
            self._bar,
            *self._kept[:2],
            self._droppable[1],
            self._droppable[0],
            *self._kept[2:],
            self._detail,
            console=Console(file=stream if stream is not None else sys.stderr),
            transient=False,
        )
        self._task = self._progress.add_task(description, total=total, detail="", rate="")
        self._fit()
        self._progress.start()

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
        self._fit()

    def stage(self, text: str) -> None:
        """Name a step the counts do not measure (e.g. publishing the pair)."""
        if self.enabled:
            self._progress.update(self._task, description=f"{self.description}: {text}")
            self._fit()

    def _fit(self) -> None:
        """Size the line to the terminal: a shortened line keeps the percentage, the counts
        and the ETA whole; the detail, the name and the bar give way first, then the elapsed
        time and the rate (rich alone would cut every column alike, the ETA's value too)."""
        console, task = self._progress.console, self._progress.tasks[0]

        def width_of(column: Any) -> int:
            return int(console.measure(column(task)).maximum)

        spare = console.width - sum(map(width_of, self._kept)) - 9  # one space between columns
        for droppable in self._droppable:
            droppable.shown = True
            spare -= width_of(droppable)
        for droppable in self._droppable:
            if spare >= 10:
                break
            spare += width_of(droppable)
            droppable.shown = False
        spare = max(spare, 0)
        name, detail = len(task.description), len(str(task.fields.get("detail", "")))
        bar = min(40, max(spare - name - detail, min(10, spare // 3)))
        self._bar.bar_width = max(bar, 1)
        name_width = max(min(name, spare - bar), 0)
        # a width of 0 would be no width (fit to content): 1 shows the ellipsis alone
        self._name.get_table_column().width = max(name_width, 1)
        self._detail.get_table_column().width = max(spare - bar - name_width, 1)

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
