"""Is a published export still what the current review gives?

An export records, in each subset's ``meta/quality_split.json``, the source episode indices it
holds (``source_episode_indices``). The review lives in the raw dataset's ``meta/episodes.jsonl``
and keeps changing after the export (``eva qc``, the console). An export is *stale* when applying
the split rule to the current review no longer gives the recorded indices: an episode moved
between accepted and rejected, an episode was recorded after the export, or one the export holds
is gone; or when the edits (``eva.dataset.edits``) differ from those the markers record it
applied (``edits``, ``dropped``): an exported episode's trim or task changed, or an episode was
dropped or undropped. A stale accepted directory must not be uploaded (the upload gate refuses it with
``stale_review``), and ``eva qc``, ``eva info`` and the console say which exports are stale.

This is the only place that decides staleness, so the gate, the CLI and the console agree.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eva.dataset import layout
from eva.dataset.atomic import read_json_object
from eva.dataset.errors import DatasetError
from eva.formats import catalog
from eva.formats.catalog import FormatEntry
from eva.jobs import EXPORT_JOB, read_job
from eva.quality.split import SplitPlan, plan_split
from eva.quality.verdicts import read_episode_rows

# Episodes named per list in a one-line message; the rest are counted.
_LISTED = 12


@dataclass(frozen=True)
class ExportStaleness:
    """How one format's published pair compares with the current review."""

    format: str  # the format's name
    export_root: Path
    export_id: str | None
    # Exported episodes whose subset the review changed: index -> (exported subset, subset now).
    changed: dict[int, tuple[str, str]] = field(default_factory=dict)
    added: tuple[int, ...] = ()  # in the review, in neither exported subset
    removed: tuple[int, ...] = ()  # exported, no longer in the review
    # Exported episodes whose edits (trim, task) differ from those the export applied, those
    # dropped since (edit_drop), and those dropped at the export and no longer.
    edited: tuple[int, ...] = ()
    dropped: tuple[int, ...] = ()
    undropped: tuple[int, ...] = ()
    problem: str | None = None  # a marker that is missing, unreadable or of another pair
    markers: dict[str, dict[str, Any] | None] = field(default_factory=dict)

    @property
    def stale(self) -> bool:
        return bool(
            self.changed
            or self.added
            or self.removed
            or self.edited
            or self.dropped
            or self.undropped
            or self.problem
        )

    def describe(self) -> str:
        """One line: what differs between the export and the current review."""
        if self.problem:
            return self.problem
        parts = []
        for now in layout.SUBSETS:
            moved = sorted(ep for ep, (_, new) in self.changed.items() if new == now)
            if moved:
                parts.append(f"{_episodes(moved)} now {now}")
        for indices, what in (
            (self.edited, "edited"),
            (self.dropped, "dropped"),
            (self.undropped, "undropped"),
            (self.added, "recorded"),
        ):
            if indices:
                parts.append(f"{_episodes(indices)} {what} since the export")
        if self.removed:
            parts.append(f"{_episodes(self.removed)} no longer in the source")
        return "; ".join(parts) or "up to date"


def _episodes(indices: Iterable[int]) -> str:
    items = list(indices)
    shown = ", ".join(str(i) for i in items[:_LISTED])
    more = f" (+{len(items) - _LISTED} more)" if len(items) > _LISTED else ""
    return f"episode{'s' if len(items) > 1 else ''} {shown}{more}"


def read_marker(directory: Path) -> dict[str, Any] | None:
    """A published subset's ``quality_split.json``, or None when it is missing, unreadable, not a
    JSON object, or the subset directory is not a real directory (a symlink is not followed)."""
    try:
        if not stat.S_ISDIR(os.lstat(directory).st_mode):
            return None
        return read_json_object(Path(directory) / layout.QUALITY_SPLIT)
    except (OSError, DatasetError):  # missing, a link or FIFO, not JSON (any reason)
        return None


def compare_markers(
    fmt: str,
    export_root: Path,
    markers: Mapping[str, dict[str, Any] | None],
    plan: SplitPlan,
) -> ExportStaleness:
    """Compare both subsets' markers with the split ``plan`` of the current review."""
    exported: dict[int, str] = {}
    recorded = _Recorded()
    problem = None
    export_ids = set()
    for subset in layout.SUBSETS:
        marker = markers.get(subset)
        path = Path(export_root) / subset / layout.QUALITY_SPLIT
        indices = marker.get("source_episode_indices") if marker is not None else None
        if marker is None:
            problem = problem or f"{path}: missing or unreadable"
            continue
        if not isinstance(indices, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in indices
        ):
            problem = problem or f"{path}: field 'source_episode_indices' is not a list of ints"
            continue
        problem = problem or recorded.read(marker, path)
        export_ids.add(marker.get("export_id"))
        for index in indices:
            exported[index] = subset
    if problem is None and len(export_ids) > 1:
        problem = f"{export_root}: accepted and rejected come from different export runs"
    now = {index: subset for subset in layout.SUBSETS for index in plan.indices(subset)}
    changed = {
        ep: (old, now[ep]) for ep, old in sorted(exported.items()) if ep in now and now[ep] != old
    }
    added = set(now) - set(exported)
    return ExportStaleness(
        format=fmt,
        export_root=Path(export_root),
        export_id=next(iter(export_ids)) if len(export_ids) == 1 else None,
        changed=changed,
        added=tuple(sorted(added - recorded.dropped)),
        removed=tuple(sorted(set(exported) - set(now) - set(plan.dropped))),
        edited=tuple(
            ep
            for ep in sorted(exported)
            if ep in now and plan.edits_of(ep).record() != recorded.edits.get(ep, {})
        ),
        dropped=tuple(sorted(set(exported) & set(plan.dropped))),
        undropped=tuple(sorted(added & recorded.dropped)),
        problem=problem,
        markers=dict(markers),
    )


@dataclass
class _Recorded:
    """The edits both subsets' markers say their export applied (``SplitPlan.provenance``)."""

    edits: dict[int, Any] = field(default_factory=dict)
    dropped: set[int] = field(default_factory=set)

    def read(self, marker: Mapping[str, Any], path: Path) -> str | None:
        """Add one marker's ``edits`` and ``dropped`` (absent: none); the problem, if any."""
        edits = marker.get("edits", {})
        dropped = marker.get("dropped", [])
        if not isinstance(edits, dict) or not all(
            isinstance(k, str) and k.isascii() and k.isdigit() for k in edits
        ):
            return f"{path}: field 'edits' is not an object keyed by source episode index"
        if not isinstance(dropped, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in dropped
        ):
            return f"{path}: field 'dropped' is not a list of ints"
        self.edits.update((int(k), v) for k, v in edits.items())
        self.dropped.update(dropped)
        return None


def export_staleness(
    source_dir: Path, fmt: FormatEntry | str, plan: SplitPlan | None = None
) -> ExportStaleness | None:
    """The published ``fmt`` export (its catalogue entry, or a name a Python caller gives) of
    ``source_dir`` against its current review, or None when there is no completed export of that
    format. ``plan``: the current split, if the caller has read the review already; else
    episodes.jsonl is read (``DatasetError`` if it cannot be)."""
    fmt = catalog.as_entry(fmt)
    source = Path(source_dir).resolve()
    root = fmt.export_root(source)
    job = read_job(root / EXPORT_JOB)
    if job is None or job.state != "completed":
        return None
    if plan is None:
        plan = current_plan(source)
    markers = {subset: read_marker(d) for subset, d in fmt.export_paths(source).items()}
    return compare_markers(fmt.name, root, markers, plan)


def current_plan(source_dir: Path) -> SplitPlan:
    """The split the review in ``source_dir``'s episodes.jsonl gives now (``DatasetError``)."""
    try:
        return plan_split(read_episode_rows(Path(source_dir)))
    except (KeyError, ValueError, TypeError) as e:
        if isinstance(e, DatasetError):
            raise
        raise DatasetError(f"{Path(source_dir) / layout.EPISODES}: {e}") from None


def stale_exports(source_dir: Path, plan: SplitPlan | None = None) -> list[ExportStaleness]:
    """Every format whose completed export no longer matches the current review."""
    source = Path(source_dir).resolve()
    found = []
    for fmt in catalog.entries():
        if read_job(fmt.export_root(source) / EXPORT_JOB) is None:
            continue
        if plan is None:
            plan = current_plan(source)
        state = export_staleness(source, fmt, plan)
        if state is not None and state.stale:
            found.append(state)
    return found
