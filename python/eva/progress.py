"""Progress reporting shared by the writers, exporters and uploader (no terminal code here)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


class ProgressSink(Protocol):
    def __call__(
        self,
        *,
        episodes: int = 0,
        files: int = 0,
        bytes: int = 0,
        current: str | None = None,
        warning: str | None = None,
    ) -> None: ...


@dataclass
class Progress:
    """Running totals; call it with increments. ``on_change`` gets the object after each update.

    ``warning``: one line about something the work did differently from what was asked (e.g. an
    MCAP camera written decoded because its video could not be carried); the job keeps them.
    """

    episodes: int = 0
    files: int = 0
    bytes: int = 0
    current: str | None = None
    total_episodes: int | None = None
    total_files: int | None = None
    total_bytes: int | None = None
    # what the counts measure now: "writing", then "publishing" (the staged pair's flush and
    # swap, which no count measures)
    stage: str = "writing"
    warnings: list[str] = field(default_factory=list)
    listeners: list[Callable[[Progress], None]] = field(default_factory=list, repr=False)

    def __call__(
        self,
        *,
        warning: str | None = None,
        episodes: int = 0,
        files: int = 0,
        bytes: int = 0,
        current: str | None = None,
    ) -> None:
        if warning is not None:
            self.warnings.append(warning)
        self.episodes += episodes
        self.files += files
        self.bytes += bytes
        if current is not None:
            self.current = current
        for listener in self.listeners:
            listener(self)

    def set_stage(self, stage: str) -> None:
        self.stage = stage
        for listener in self.listeners:
            listener(self)

    def as_dict(self) -> dict[str, object]:
        return {
            "stage": self.stage,
            "episodes": self.episodes,
            "files": self.files,
            "bytes": self.bytes,
            "current": self.current,
            "total_episodes": self.total_episodes,
            "total_files": self.total_files,
            "total_bytes": self.total_bytes,
            "warnings": list(self.warnings),
        }


def null_progress(**_: object) -> None:
    return None
