"""The problem records validation and verification report, and the collector that gathers
them (one line each, with a stable code)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eva.dataset.errors import one_line

__all__ = ["Problem", "ProblemCollector"]


@dataclass(frozen=True)
class Problem:
    code: str
    message: str
    path: str | None = None
    episode: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


class ProblemCollector:
    """The problems found so far, in the order found."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def add(
        self, code: str, message: str, path: Path | str | None = None, episode: int | None = None
    ) -> None:
        # one line: messages can carry a library's multi-line text (pyarrow, FFmpeg)
        self.problems.append(
            Problem(code, one_line(message), str(path) if path is not None else None, episode)
        )

    def has(self, code: str) -> bool:
        return any(p.code == code for p in self.problems)
