"""The problem records validation and verification report, and the collector that gathers
them (one line each, with a stable code)."""

from __future__ import annotations

from collections.abc import Callable
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
    """The problems found so far, in the order found.

    A check that waits on work still running elsewhere (a video inspection on a thread) is
    registered with ``later``: its problems take the place the check had in the walk once
    ``settle`` runs it, so the order is the same as if it had run there."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self._later: list[tuple[int, Callable[[ProblemCollector], None]]] = []

    def later(self, check: Callable[[ProblemCollector], None]) -> None:
        """Run ``check(collector)`` at ``settle``; its problems go where it was registered."""
        self._later.append((len(self.problems), check))

    @property
    def unsettled(self) -> bool:
        return bool(self._later)

    def settle(self) -> list[Problem]:
        """Run the checks registered with ``later``, in order; every problem, in walk order."""
        merged: list[Problem] = []
        start = 0
        for position, check in self._later:
            merged.extend(self.problems[start:position])
            start = position
            found = ProblemCollector()
            check(found)
            merged.extend(found.settle())
        merged.extend(self.problems[start:])
        self.problems = merged
        self._later = []
        return merged

    def add(
        self, code: str, message: str, path: Path | str | None = None, episode: int | None = None
    ) -> None:
        # one line: messages can carry a library's multi-line text (pyarrow, FFmpeg)
        self.problems.append(
            Problem(code, one_line(message), str(path) if path is not None else None, episode)
        )

    def __call__(
        self, code: str, message: str, path: Path | str, episode: int | None = None
    ) -> None:
        """``add`` a problem about ``path`` (and ``episode``) whose message does not say where:
        it becomes ``<path>: [episode <N>: ]<message>`` (the formats' verifiers add theirs so)."""
        where = f"{path}: episode {episode}" if episode is not None else str(path)
        self.add(code, f"{where}: {message}", path, episode)

    def has(self, code: str) -> bool:
        return any(p.code == code for p in self.problems)
