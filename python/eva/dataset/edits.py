"""An episode's edits: the operator's trim, task and drop, stored beside its verdict.

Edits are decisions like ``qc_verdict``: fields of the episode's row in ``meta/episodes.jsonl``
that the export applies; the recorded frames and videos are never rewritten. The stored form
(docs/formats.md, "Edits"):

- ``edit_trim``: ``[start, end]``, the frames kept, ``start`` included and ``end`` excluded, as
  frame indices of the raw episode: ``0 <= start < end <= length``. Absent: every frame kept.
- ``edit_task``: the task string the exported episode gets instead of its recorded ``tasks``;
  one line of text (``eva.textsafe.text_problem``), not only whitespace. Absent: the recorded
  task.
- ``edit_drop``: ``true`` leaves the episode out of both subsets. Absent (or ``false``): kept.

This module holds the rule, once: the writer (``eva.quality.edits``), the validator and the
exporters read rows through :func:`episode_edits`, and what the writer stores passes it.
A trim typed by a user may name seconds (``1.5s:9s``): a time names the frame nearest to it,
``round(seconds * fps)`` with halves rounding up, for the start and the end alike, so ``9s`` at
30 fps ends before frame 270.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

from eva.dataset.errors import DatasetError
from eva.textsafe import text_problem

EDIT_TRIM = "edit_trim"
EDIT_TASK = "edit_task"
EDIT_DROP = "edit_drop"
EDIT_FIELDS = (EDIT_TRIM, EDIT_TASK, EDIT_DROP)

# The longest frame or time number a trim bound may be written with (no 5,000-digit parse).
_MAX_BOUND_CHARS = 32
# A time: decimal digits with an optional fraction (no sign, exponent, inf or nan).
_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")


class EditError(DatasetError):
    """An edit that is refused; the message names the field (and the episode when known)."""


@dataclass(frozen=True)
class EpisodeEdits:
    """One episode's edits as the export applies them (all None/False: no edit)."""

    trim: tuple[int, int] | None = None  # frames [start, end) of the raw episode
    task: str | None = None
    drop: bool = False

    def __bool__(self) -> bool:
        return self.trim is not None or self.task is not None or self.drop

    def kept(self, length: int) -> range:
        """The raw frame indices an export keeps of an episode of ``length`` frames."""
        return range(*self.trim) if self.trim is not None else range(length)

    def kept_length(self, length: int) -> int:
        return len(self.kept(length))

    def cuts(self, length: int) -> bool:
        """Whether the trim leaves out any frame of an episode of ``length`` frames."""
        return self.trim is not None and self.trim != (0, length)

    def tasks(self, recorded: list[str]) -> list[str]:
        """The exported episode's tasks: the edited task alone, or the recorded ones."""
        return [self.task] if self.task is not None else list(recorded)

    def record(self) -> dict[str, Any]:
        """What an export records of the edits it applied (its ``quality_split.json``): trim
        and task only, since a dropped episode is in no subset. Empty: nothing to apply."""
        out: dict[str, Any] = {}
        if self.trim is not None:
            out["trim"] = list(self.trim)
        if self.task is not None:
            out["task"] = self.task
        return out

    def fields(self) -> dict[str, Any]:
        """The episodes.jsonl fields that store these edits (absent fields: no edit)."""
        out: dict[str, Any] = {}
        if self.trim is not None:
            out[EDIT_TRIM] = list(self.trim)
        if self.task is not None:
            out[EDIT_TASK] = self.task
        if self.drop:
            out[EDIT_DROP] = True
        return out


def trim_problem(trim: object, length: int) -> str | None:
    """Why a stored ``edit_trim`` value is refused for an episode of ``length`` frames."""
    if (
        not isinstance(trim, list)
        or len(trim) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) for b in trim)
    ):
        return f"{trim!r} is not [start, end] (two frame indices)"
    start, end = trim
    if not 0 <= start < end <= length:
        return (
            f"{trim!r} is not a non-empty range of frames inside the episode's {length} frames "
            f"(0 <= start < end <= {length})"
        )
    return None


def task_problem(task: object) -> str | None:
    """Why an ``edit_task`` value is refused: eva's rule for typed text, and not blank."""
    problem = text_problem(task)
    if problem is not None:
        return problem
    assert isinstance(task, str)
    if not task.strip():
        return "is empty or only whitespace"
    return None


def edit_problems(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Each malformed edit field of an episodes.jsonl row, as ``(field, "field NAME VALUE:
    why")`` (the caller names the file and episode). A row whose length is unknown has its
    trim's form checked only (the length's own problem is reported apart)."""
    found: list[tuple[str, str]] = []
    length = row.get("length")
    if not isinstance(length, int) or isinstance(length, bool) or length < 0:
        length = 1 << 62
    if EDIT_TRIM in row:
        problem = trim_problem(row[EDIT_TRIM], length)
        if problem is not None:
            found.append((EDIT_TRIM, f"field {EDIT_TRIM} {problem}"))
    if EDIT_TASK in row:
        problem = task_problem(row[EDIT_TASK])
        if problem is not None:
            found.append((EDIT_TASK, f"field {EDIT_TASK} {_shown(row[EDIT_TASK])} {problem}"))
    if EDIT_DROP in row and not isinstance(row[EDIT_DROP], bool):
        found.append((EDIT_DROP, f"field {EDIT_DROP} {row[EDIT_DROP]!r} is not true or false"))
    return found


def episode_edits(row: Mapping[str, Any]) -> EpisodeEdits:
    """The edits of one episodes.jsonl row; ``EditError`` naming the episode and the first
    malformed field (``edit_problems``). The validator refuses such rows, so a validated
    dataset's rows always parse."""
    problems = edit_problems(row)
    if problems:
        raise EditError(f"episode {row.get('episode_index')}: {problems[0][1]}")
    trim = row.get(EDIT_TRIM)
    return EpisodeEdits(
        trim=(trim[0], trim[1]) if trim is not None else None,
        task=row.get(EDIT_TASK),
        drop=row.get(EDIT_DROP) is True,
    )


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_trim(text: str, length: int, fps: int) -> tuple[int, int]:
    """A typed trim ``A:B`` as frames ``[start, end)`` of an episode of ``length`` frames.

    Each bound is a frame index (``30``) or a time (``1.5s``, converted to the nearest frame at
    ``fps``, halves up); an empty bound is the episode's first or last (``:9s``, ``30:``).
    ``EditError`` (naming the episode's length) for anything else, an empty range or one that
    does not lie inside the episode."""
    first, last = _trim_bounds(text)
    start = _bound(first, fps, text) if first else 0
    end = _bound(last, fps, text) if last else length
    if not 0 <= start < end <= length:
        raise EditError(
            f"trim {_shown(text)} is frames [{start}, {end}): not a non-empty range inside the "
            f"episode's {length} frames (0 <= start < end <= {length})"
        )
    return start, end


def trim_syntax_problem(text: str) -> str | None:
    """Why a typed trim is not ``START:END`` of frame indices or times, before any episode's
    length is known (a usage problem; ``parse_trim`` checks the range per episode)."""
    try:
        for part in _trim_bounds(text):
            if part:
                _bound(part, 1, text)
    except EditError as e:
        return str(e)
    return None


def _trim_bounds(text: str) -> tuple[str, str]:
    if not isinstance(text, str) or text.count(":") != 1:
        raise EditError(f"trim {_shown(text)}: use START:END (frames, or seconds like 1.5s:9s)")
    first, last = (part.strip() for part in text.split(":"))
    return first, last


def _bound(part: str, fps: int, text: str) -> int:
    """One trim bound: a frame index, or seconds (``s`` suffix) to the nearest frame."""
    seconds = part.endswith("s")
    number = part[:-1].strip() if seconds else part
    if len(number) > _MAX_BOUND_CHARS or not number.isascii():
        raise EditError(f"trim {_shown(text)}: bound {_shown(part)} is not a number")
    if not seconds:
        if not number.isdigit():
            raise EditError(
                f"trim {_shown(text)}: bound {_shown(part)} is not a frame index >= 0 "
                "(or seconds, like 1.5s)"
            )
        return int(number)
    if not _SECONDS.fullmatch(number):
        raise EditError(f"trim {_shown(text)}: bound {_shown(part)} is not a time >= 0 in seconds")
    return seconds_to_frame(Fraction(Decimal(number)), fps)


def seconds_to_frame(seconds: Fraction, fps: int) -> int:
    """The frame nearest to ``seconds`` at ``fps`` frames per second, halves rounding up."""
    exact = seconds * fps
    return math.floor(exact + Fraction(1, 2))
