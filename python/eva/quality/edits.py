"""Operator edits (``eva edit``, the console's QUALITY CHECK): trim, task and drop, written into
``meta/episodes.jsonl`` beside the verdicts with the same lock, atomic rewrite and all-or-none
rule (``eva.quality.verdicts.update_episode_rows``). The stored form and its rule are
``eva.dataset.edits``; the recorded frames and videos are never touched. A trim also records its
kept frames' pixel histograms in eva's cache (``eva.dataset.kept_histograms``), decoded here
once rather than by every export.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eva.dataset import fsafe, layout
from eva.dataset.atomic import read_json_object
from eva.dataset.edits import (
    EDIT_DROP,
    EDIT_TASK,
    EDIT_TRIM,
    EditError,
    parse_trim,
    task_problem,
    trim_problem,
    trim_syntax_problem,
)
from eva.dataset.errors import DatasetError
from eva.dataset.info_fields import info_field_problems
from eva.dataset.kept_histograms import record_kept_histograms
from eva.quality.verdicts import ReviewUpdate, update_episode_rows


@dataclass(frozen=True)
class EditRequest:
    """What one ``eva edit`` (or console request) changes; None/False: left as it is.

    ``trim`` is typed text (``A:B``, frames or seconds, ``eva.dataset.edits.parse_trim``) or
    frames ``(start, end)``; ``drop`` True drops, False undrops."""

    trim: str | tuple[int, int] | None = None
    clear_trim: bool = False
    task: str | None = None
    clear_task: bool = False
    drop: bool | None = None

    def problem(self) -> str | None:
        """Why the request itself is refused (a usage problem), before any dataset is read."""
        if self.trim is not None and self.clear_trim:
            return "a trim and clearing the trim exclude each other"
        if self.task is not None and self.clear_task:
            return "a task and clearing the task exclude each other"
        if not (self.trim is not None or self.clear_trim or self.task is not None) and not (
            self.clear_task or self.drop is not None
        ):
            return "give an edit: a trim, a task, drop or undrop (or clear one)"
        if isinstance(self.trim, str):
            problem = trim_syntax_problem(self.trim)
            if problem is not None:
                return problem
        if self.task is not None:
            problem = task_problem(self.task)
            if problem is not None:
                return f"task {self.task!r}: {problem}"
        return None


def edit_episodes(
    root: Path,
    episode_indices: Sequence[int],
    request: EditRequest,
    *,
    record: Callable[[Path, Sequence[int]], object] = record_kept_histograms,
) -> list[ReviewUpdate]:
    """Apply ``request`` to every episode of ``episode_indices`` or to none: each episode's trim
    is checked against its own length before anything is written, and the first refusal (an
    unknown episode, an empty or out-of-range trim) is a ``DatasetError`` naming the file,
    episode and field; the file is then left as it was. ``record``: how a trim's kept frames'
    histograms are recorded once the edit is written (the console queues them,
    ``BackgroundRecorder.submit``)."""
    root = Path(root)
    problem = request.problem()
    if problem is not None:
        raise EditError(f"edit: {problem}")
    if not episode_indices:
        raise EditError("edit: no episode given")
    fps = _fps(root) if isinstance(request.trim, str) else 1
    where = root / layout.EPISODES

    def change(row: dict[str, Any]) -> None:
        try:
            _apply(row, request, fps)
        except EditError as e:
            raise EditError(f"{where}: episode {row['episode_index']}: {e}") from None

    updates = update_episode_rows(root, episode_indices, change, "edit")
    if request.trim is not None or request.clear_trim:
        # the kept frames' pixel histograms, decoded now so that no export has to
        record(root, episode_indices)
    return updates


def _apply(row: dict[str, Any], request: EditRequest, fps: int) -> None:
    if request.trim is not None:
        length = row.get("length")
        if not isinstance(length, int) or isinstance(length, bool) or length < 0:
            raise EditError(f"field length {length!r} is not an int >= 0: cannot trim")
        if isinstance(request.trim, str):
            start, end = parse_trim(request.trim, length, fps)
        else:
            start, end = request.trim
            problem = trim_problem([start, end], length)
            if problem is not None:
                raise EditError(f"field {EDIT_TRIM} {problem}")
        row[EDIT_TRIM] = [start, end]
    elif request.clear_trim:
        row.pop(EDIT_TRIM, None)
    if request.task is not None:
        row[EDIT_TASK] = request.task
    elif request.clear_task:
        row.pop(EDIT_TASK, None)
    if request.drop is True:
        row[EDIT_DROP] = True
    elif request.drop is False:
        row.pop(EDIT_DROP, None)


def _fps(root: Path) -> int:
    """The dataset's fps, for a trim typed in seconds (``DatasetError`` naming info.json)."""
    path = root / layout.INFO
    fsafe.check_dataset_tree(root)
    try:
        info = read_json_object(path)
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing (not a v2.1 dataset?)") from None
    problems = [p for p in info_field_problems(info) if "'fps'" in p]
    if problems:
        raise DatasetError(f"{path}: {problems[0]}")
    return int(info["fps"])
