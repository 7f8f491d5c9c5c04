"""Operator review (QUALITY CHECK) and the accept/reject priority (docs/formats.md, "Accepted and rejected").

Priority, per episode, compared case-insensitively:
1. ``qc_verdict == "pass"`` -> accepted (overrides an automatic red flag);
2. ``qc_verdict == "fail"`` -> rejected;
3. otherwise ``quality == "red"`` -> rejected;
4. otherwise -> accepted.
A note never changes the outcome.

Verdicts are written into ``meta/episodes.jsonl`` by an atomic rewrite, under the dataset's meta
lock (``.eva-work/meta.lock``) shared with the capture writer, and refused while the episode is
still being saved (``.eva-work/saving-<N:06d>.lock`` held by the save worker; docs/design.md).

Before reading or writing, the dataset passes the shared containment check
(``eva.dataset.fsafe.check_dataset_tree``): a ``meta/``, ``episodes.jsonl``, ``.eva-work/`` or
lock that is a symlink is refused, never followed. A rewrite keeps the file's mode. A filesystem
error (unreadable file, read-only tree, full disk) is a one-line ``DatasetError`` naming the path.
Temporaries a killed qc left (``meta/.eva-tmp-episodes.jsonl.*``) are removed under the meta
lock, which every rewrite of episodes.jsonl holds, so no live rewrite loses its temp.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eva.dataset import fsafe, layout
from eva.dataset.atomic import atomic_write_jsonl, parse_jsonl, remove_stale_temporaries
from eva.dataset.edits import EDIT_DROP, EDIT_FIELDS
from eva.dataset.errors import DatasetError
from eva.dataset.layout import META_LOCK as META_LOCK  # re-exported: the lock qc shares
from eva.dataset.layout import WRITER_LOCK
from eva.dataset.locks import is_flocked, meta_lock

ACCEPTED, REJECTED = layout.SUBSETS  # the subsets' names are their directories' names
DROPPED = "dropped"  # an episode the operator dropped (edit_drop): in neither subset
VERDICTS = layout.QC_VERDICTS
RULE = (
    "qc_verdict pass -> accepted; qc_verdict fail -> rejected; otherwise quality red -> rejected; "
    "otherwise accepted (case-insensitive; a note never changes the outcome)"
)


def _lower(value: Any) -> str | None:
    return value.strip().lower() if isinstance(value, str) else None


def subset_of(row: Mapping[str, Any]) -> str:
    """``"accepted"`` or ``"rejected"`` for one episodes.jsonl row: verdict pass, verdict fail,
    then quality red, else accepted; ``"dropped"`` before all of them for an episode the
    operator dropped (``edit_drop`` true, ``eva.dataset.edits``)."""
    if row.get(EDIT_DROP) is True:
        return DROPPED
    verdict = _lower(row.get("qc_verdict"))
    if verdict == "pass":
        return ACCEPTED
    if verdict == "fail":
        return REJECTED
    if _lower(row.get("quality")) == "red":
        return REJECTED
    return ACCEPTED


def reason_of(row: Mapping[str, Any]) -> str:
    """Which rule decided the subset (for ``eva qc --list``)."""
    if row.get(EDIT_DROP) is True:
        return "edit drop"
    verdict = _lower(row.get("qc_verdict"))
    if verdict in VERDICTS:
        overrides = verdict == "pass" and _lower(row.get("quality")) == "red"
        return f"verdict {verdict}" + (" (overrides red)" if overrides else "")
    return "quality red" if _lower(row.get("quality")) == "red" else "no issue"


def saving_marker(root: Path, episode_index: int) -> Path:
    return Path(root) / layout.WORK_DIR / layout.saving_marker_name(episode_index)


def is_being_saved(root: Path, episode_index: int) -> bool:
    return is_flocked(saving_marker(root, episode_index))


def read_episode_rows(root: Path) -> list[dict[str, Any]]:
    """episodes.jsonl rows; DatasetError (file and line) unless each is an object whose
    ``episode_index`` is an int >= 0 (the review sorts and matches on it)."""
    path = Path(root) / layout.EPISODES
    fsafe.check_dataset_tree(root)
    try:  # opened beneath the root now, whatever was checked above (no link on its way)
        with fsafe.open_binary_beneath(root, layout.EPISODES, root_may_link=True) as f:
            data = f.read()
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing (not a v2.1 dataset?)") from None
    except OSError as e:  # EACCES, EIO: one line naming the file
        raise fsafe.os_error(e, path) from None
    try:
        rows = parse_jsonl(data, path)
    except ValueError as e:
        raise DatasetError(str(e)) from None
    for lineno, row in enumerate(rows, 1):
        ep = row.get("episode_index") if isinstance(row, dict) else None
        if not isinstance(ep, int) or isinstance(ep, bool) or ep < 0:
            raise DatasetError(f"{path}: row {lineno}: episode_index {ep!r} is not an int >= 0")
    return rows


@dataclass(frozen=True)
class ReviewUpdate:
    """The row after a review update, and whether the file actually changed."""

    row: dict[str, Any]
    changed: bool


def review_episode(
    root: Path,
    episode_index: int,
    *,
    verdict: str | None = None,
    note: str | None = None,
    clear_verdict: bool = False,
) -> ReviewUpdate:
    """Set ``qc_verdict`` (``"pass"``/``"fail"``, any case) and/or replace ``qc_note``.

    ``verdict=None`` with a note is a note-only update: the verdict (or its absence) is left alone.
    ``clear_verdict=True`` removes the verdict, so the automatic quality decides again.
    Refused while the episode is being saved. The file is rewritten atomically.
    """
    return review_episodes(
        root, [episode_index], verdict=verdict, note=note, clear_verdict=clear_verdict
    )[0]


def review_episodes(
    root: Path,
    episode_indices: Sequence[int],
    *,
    verdict: str | None = None,
    note: str | None = None,
    clear_verdict: bool = False,
) -> list[ReviewUpdate]:
    """``review_episode`` for several episodes at once: all of them or none (an unknown or
    still-saving episode refuses the whole update), in one atomic rewrite."""
    root = Path(root)
    if verdict is not None and clear_verdict:
        raise DatasetError("qc: a verdict and clearing the verdict exclude each other")
    if verdict is None and note is None and not clear_verdict:
        raise DatasetError("qc: give a verdict (--pass/--fail/--clear) or a note (--note)")
    if verdict is not None:
        verdict = verdict.strip().lower()
        if verdict not in VERDICTS:
            raise DatasetError(f"qc: verdict {verdict!r}: use pass or fail")
    if note is not None and any(ord(c) < 32 and c not in "\t" for c in note):
        raise DatasetError("qc: note: control characters (newlines) are not allowed")
    if not episode_indices:
        raise DatasetError("qc: no episode given")

    def change(row: dict[str, Any]) -> None:
        if verdict is not None:
            row["qc_verdict"] = verdict
        elif clear_verdict:
            row.pop("qc_verdict", None)
        if note is not None:
            row["qc_note"] = note

    return update_episode_rows(root, episode_indices, change, "review")


def update_episode_rows(
    root: Path,
    episode_indices: Sequence[int],
    change: Callable[[dict[str, Any]], None],
    what: str,
) -> list[ReviewUpdate]:
    """Apply ``change`` to the rows of ``episode_indices`` in one atomic rewrite of
    episodes.jsonl under the meta lock: all of them or none. An unknown or still-saving episode,
    or a ``DatasetError`` from ``change`` (which sees each row in turn, before anything is
    written), refuses the whole update and leaves the file as it was. ``what`` names the
    operation in the message of an episode being saved ("review", "edit")."""
    root = Path(root)
    fsafe.check_dataset_tree(root)
    if not (root / layout.EPISODES).is_file():
        raise DatasetError(f"{root / layout.EPISODES}: missing (not a v2.1 dataset?)")
    try:
        return _update_locked(root, episode_indices, change, what)
    except OSError as e:  # read-only tree, full disk, unreadable file: one line naming the path
        raise fsafe.os_error(e) from None


def _update_locked(
    root: Path,
    episode_indices: Sequence[int],
    change: Callable[[dict[str, Any]], None],
    what: str,
) -> list[ReviewUpdate]:
    for episode_index in episode_indices:
        if is_being_saved(root, episode_index):
            raise DatasetError(
                f"{root / layout.EPISODES}: episode {episode_index} is still being saved; "
                f"{what} it after the save worker finishes"
            )
    with meta_lock(root):
        # A killed qc's copies of episodes.jsonl; only rewrites under this lock make them.
        remove_stale_temporaries(root / layout.META_DIR, target=Path(layout.EPISODES).name)
        rows = read_episode_rows(root)
        positions: dict[Any, list[int]] = {}
        for i, r in enumerate(rows):
            positions.setdefault(r.get("episode_index"), []).append(i)
        updates: list[ReviewUpdate] = []
        for episode_index in episode_indices:
            matches = positions.get(episode_index, [])
            if not matches:
                if is_flocked(root / layout.WORK_DIR / WRITER_LOCK):
                    raise DatasetError(
                        f"{root / layout.EPISODES}: episode {episode_index} is not saved yet "
                        "(a capture writer is still working on this dataset)"
                    )
                raise DatasetError(
                    f"{root / layout.EPISODES}: episode {episode_index} does not exist"
                )
            if len(matches) > 1:
                raise DatasetError(
                    f"{root / layout.EPISODES}: episode_index {episode_index} appears more than once"
                )
            row = rows[matches[0]]
            before = dict(row)
            change(row)
            updates.append(ReviewUpdate(row=row, changed=row != before))
        if any(u.changed for u in updates):
            atomic_write_jsonl(root / layout.EPISODES, rows)
    return updates


def quality_issues(row: Mapping[str, Any]) -> list[Any]:
    """A row's ``quality_issues`` as a list for display: a hand-edited value that is not a list
    (``eva validate`` names it) is shown as the one item it is, never iterated."""
    issues = row.get("quality_issues")
    if issues is None:
        return []
    return issues if isinstance(issues, list) else [issues]


def episode_order(row: Mapping[str, Any]) -> tuple[int, int]:
    """A sort key by ``episode_index`` that never compares unlike types (unvalidated rows)."""
    index = row.get("episode_index")
    if isinstance(index, int) and not isinstance(index, bool):
        return (0, index)
    return (1, 0)


def anomaly_of(row: Mapping[str, Any]) -> tuple[float | None, list[str]]:
    """A row's ``anomaly_score`` and ``anomaly_reasons`` (eva.dataset.motion_metrics) as stored;
    a hand-edited value of the wrong type (``eva validate`` names it) reads as none."""
    value = row.get("anomaly_score")
    score = (
        float(value)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        else None
    )
    reasons = row.get("anomaly_reasons")
    if not isinstance(reasons, list):
        return score, []
    return score, [r for r in reasons if isinstance(r, str)]


def score_order(row: Mapping[str, Any]) -> tuple[int, float, tuple[int, int]]:
    """A sort key: worst anomaly score first, unscored episodes last, ties by episode_index."""
    score = anomaly_of(row)[0]
    return (1 if score is None else 0, -(score or 0.0), episode_order(row))


REVIEW_ORDERS = ("index", "score")


def review_table(rows: Sequence[Mapping[str, Any]], sort: str = "index") -> list[dict[str, Any]]:
    """One summary dict per episode for ``eva qc --list`` (the CLI formats it), by
    ``episode_index`` or (``sort="score"``) worst anomaly score first."""
    table = []
    for row in sorted(rows, key=score_order if sort == "score" else episode_order):
        score, reasons = anomaly_of(row)
        issues = quality_issues(row)
        table.append(
            {
                "episode_index": row.get("episode_index"),
                "length": row.get("length"),
                "quality": row.get("quality"),
                "issues": [
                    str(i.get("code", "?")) if isinstance(i, Mapping) else str(i) for i in issues
                ],
                "issue_details": [
                    f"{i.get('code', '?')}: {i.get('detail')}"
                    if isinstance(i, Mapping) and i.get("detail")
                    else str(i.get("code", "?") if isinstance(i, Mapping) else i)
                    for i in issues
                ],
                "qc_verdict": row.get("qc_verdict"),
                "qc_note": row.get("qc_note"),
                "subset": subset_of(row),
                "reason": reason_of(row),
                "edits": {k: row[k] for k in EDIT_FIELDS if k in row},  # as stored
                "anomaly_score": score,
                "anomaly_reasons": reasons,
            }
        )
    return table
