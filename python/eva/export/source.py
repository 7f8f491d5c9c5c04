"""The source side of an export: its validation, the MP4 checks that may finish while the
pair is written (``LateVideoChecks``), and its description (split plan, both subsets' metadata).

``prepare`` reads the source only: nothing of the export root is touched. A source it refuses
raises ``SourceRefused`` (a ``DatasetError`` naming the file, episode or field of the first
problem in ``eva validate``'s order, with a count of the others)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from eva.dataset import layout
from eva.dataset.columns import fixed_size_values
from eva.dataset.errors import DatasetError
from eva.dataset.reader import DatasetReader
from eva.dataset.subset import KeptStats, SubsetMeta, build_subset_meta
from eva.formats import catalog
from eva.quality.split import SplitPlan, plan_split

__all__ = [
    "CARRIABLE_PROBLEMS",
    "LateVideoChecks",
    "SourceRefused",
    "complete_episode_stats",
    "prepare",
    "problem_line",
    "validate_source",
]

SUBSETS = layout.SUBSETS


def problem_line(problem: Any) -> str:
    """One line for a ``eva.dataset.validate.Problem`` (its message names file/episode/field)."""
    return str(getattr(problem, "message", problem))


# Validation problems an export can be asked to carry (ExportOptions field -> codes).
CARRIABLE_PROBLEMS = {"allow_non_finite": ("non_finite_values",)}


class SourceRefused(DatasetError):
    """The source failed validation: nothing of this export may remain (``export_dataset``)."""


def _refusal(source: Path, problems: list[Any], allow_non_finite: bool) -> SourceRefused | None:
    """The error of a source with ``problems`` (its first one, with a count of the others), or
    None when every problem is one the export was asked to carry."""
    if allow_non_finite:
        problems = [p for p in problems if p.code not in CARRIABLE_PROBLEMS["allow_non_finite"]]
    if not problems:
        return None
    more = (
        f" (and {len(problems) - 1} more problems: eva validate {source} lists them)"
        if len(problems) > 1
        else ""
    )
    hint = (
        " (eva export --allow-non-finite exports them as they are)"
        if problems[0].code in CARRIABLE_PROBLEMS["allow_non_finite"]
        else ""
    )
    return SourceRefused(problem_line(problems[0]) + hint + more)


class LateVideoChecks:
    """The MP4 inspections of a source validation that passed every other check, still running
    while the export writes its staging dir (a v3 export copies sample bytes, an hdf5 export
    decodes: the inspections' keyframe decodes take the other core meanwhile). ``refusal()``
    waits for them: the source's refusal, the one an up-front validation would have raised
    (problems in the same order), or None. Nothing is published before it returned None.
    ``inspected()``: the MP4s found intact, for the next ``--incremental`` export's
    ``known_videos`` (``eva.dataset.validate.videos``)."""

    def __init__(self, source: Path, validation: Any, allow_non_finite: bool) -> None:
        self._source = source
        self._validation = validation
        self._allow_non_finite = allow_non_finite
        self._refusal: SourceRefused | None = None
        self._done = False

    def refusal(self) -> SourceRefused | None:
        if not self._done:
            self._done = True
            problems = self._validation.complete()
            self._refusal = _refusal(self._source, problems, self._allow_non_finite)
        return self._refusal

    def inspected(self) -> dict[str, list[int]]:
        return dict(self._validation.inspected())

    def close(self) -> None:
        """Stop the inspections (an interrupted export does not wait for their verdict)."""
        self._validation.close()


def validate_source(
    source: Path,
    *,
    reader: DatasetReader | None = None,
    allow_non_finite: bool = False,
    late_videos: bool = False,
    known_videos: Mapping[str, Any] | None = None,
) -> tuple[dict[int, np.ndarray], LateVideoChecks | None]:
    """Stop with the first problem of the shared v2.1 validation (file/episode/field named).

    Returns each episode's ``task_index`` column as read by the validation's checks (so the
    export does not read every parquet again for the task remap); an episode without rows or
    without that column is absent. ``reader``: validate the snapshot that reader holds.
    ``allow_non_finite``: NaN/inf in vector columns are exported as they are, not refused.
    ``late_videos``: when every check but the MP4 inspections has passed, return without
    waiting for those, as ``LateVideoChecks`` (settled already when nothing was left; without
    ``late_videos``, None: the whole validation has passed). ``known_videos``: MP4s inspected
    before that need not be again while unchanged (``LateVideoChecks.inspected()``).
    """
    from eva.dataset.validate import start_validation

    task_values: dict[int, np.ndarray] = {}

    def keep_task_index(episode: int, table: pa.Table) -> None:
        if "task_index" in table.column_names:
            task_values[episode] = table.column("task_index").to_numpy()

    validation = start_validation(
        source, decode=False, on_table=keep_task_index, reader=reader, known_videos=known_videos
    )
    checks = LateVideoChecks(source, validation, allow_non_finite)
    try:
        if late_videos and not _refusal(source, validation.found, allow_non_finite):
            return task_values, checks
        # a problem found already: the inspections decide which one comes first
        refusal = checks.refusal()
    except BaseException:
        validation.close()
        raise
    if refusal is not None:
        raise refusal
    return task_values, None


def _check_version(reader: DatasetReader) -> None:
    info = reader.info
    path = reader.root / layout.INFO
    if info.get("codebase_version") != layout.CODEBASE_VERSION:
        raise DatasetError(
            f"{path}: codebase_version {info.get('codebase_version')!r}: the source must be v2.1"
        )
    fmt = info.get("dataset_format")
    own = catalog.source_entry().name
    if fmt is not None and fmt != own:
        raise DatasetError(f"{path}: dataset_format {fmt!r}: the source must be {own}")


def _column_stats(column: pa.ChunkedArray, where: str) -> dict[str, list[Any]]:
    from eva.dataset.stats import VectorStats, finite_rows

    values = fixed_size_values(column.combine_chunks())
    if values is None:
        raise DatasetError(f"{where}: no per-episode stats and the column is not numeric")
    # NaN/inf rows (carried only with allow_non_finite) are left out, as the writer's stats do.
    values = finite_rows(values.reshape(len(values), -1))
    if len(values) == 0:
        raise DatasetError(f"{where}: no per-episode stats and no row without NaN/inf")
    stats = VectorStats(values.shape[1])
    stats.update(values)
    return stats.result()


def complete_episode_stats(reader: DatasetReader, episode: int) -> dict[str, Any]:
    """The episode's stats for every feature: from episodes_stats.jsonl, else from its table.

    Video features cannot be recomputed from the table; a missing one is an error.
    """
    stats = dict(reader.episodes_stats.get(episode, {}))
    missing = [f for f in reader.features if f not in stats]
    if not missing:
        return stats
    table_columns: list[str] = []
    for feature in missing:
        if reader.features[feature].get("dtype") in ("video", "image"):
            raise DatasetError(
                f"{reader.root / layout.EPISODES_STATS}: episode {episode}: field {feature!r}: "
                "no per-episode stats and it cannot be computed from the table"
            )
        table_columns.append(feature)
    # The footer's schema: ``read_table(columns=[])`` would give an empty one.
    schema_names = set(reader.read_schema(episode)[1].names)
    absent = [c for c in table_columns if c not in schema_names]
    if absent:
        raise DatasetError(
            f"{reader.data_path(episode)}: episode {episode}: field {absent[0]!r}: no per-episode "
            "stats and no such column"
        )
    table = reader.read_table(episode, columns=table_columns)
    for name in table_columns:
        where = f"{reader.data_path(episode)}: episode {episode}: field {name!r}"
        stats[name] = _column_stats(table.column(name), where)
    return stats


def kept_frame_stats(reader: DatasetReader, episode: int, trim: tuple[int, int]) -> KeptStats:
    """A trimmed episode's stats over its kept frames ``[start, end)`` only, and its cameras'
    pixel histograms: every numeric column from the kept rows as the exported table holds them
    (``frame_index`` and ``timestamp`` from 0), each camera's from its kept frames as decoded
    from the recorded MP4 (``eva.dataset.kept_histograms``: decoded when the trim was set, else
    now; the recorder's histograms cover the whole take before encoding). A feature neither is
    possible for (a string, an inline image) keeps its recorded stats."""
    from eva.dataset.kept_histograms import kept_histograms
    from eva.dataset.stats import image_stats_from_histogram
    from eva.dataset.subset_edits import trim_table

    recorded = complete_episode_stats(reader, episode)
    where = f"{reader.data_path(episode)}: episode {episode}"
    table = trim_table(reader.read_table(episode), trim, reader.fps, where)
    kept = kept_histograms(reader, episode, trim)
    stats: dict[str, Any] = {}
    histograms: dict[str, np.ndarray] = {}
    for name, value in recorded.items():
        dtype = reader.features.get(name, {}).get("dtype")
        if dtype == "video":
            histograms[name] = kept[name].histogram
            stats[name] = image_stats_from_histogram(kept[name].histogram, kept[name].frames)
        elif dtype != "image" and name in table.column_names:
            try:
                stats[name] = _column_stats(table.column(name), f"{where}: field {name!r}")
            except DatasetError:
                stats[name] = value  # not numeric: nothing to recompute
        else:
            stats[name] = value
    return stats, histograms


def prepare(
    source: Path,
    *,
    reader: DatasetReader | None = None,
    allow_non_finite: bool = False,
    late_videos: bool = False,
    known_videos: Mapping[str, Any] | None = None,
) -> tuple[DatasetReader, SplitPlan, dict[str, SubsetMeta], LateVideoChecks | None]:
    """Validate ``source`` and describe both subsets. Reads metadata and index columns only.

    Validation and description use ONE reader, hence one snapshot of the metadata files: an
    episode a running capture commits meanwhile is not half-seen (validated by neither, but
    described), it is simply not part of this export. ``late_videos``, ``known_videos``: as
    ``validate_source`` (the caller must settle the returned checks, or close them).
    """
    reader = reader if reader is not None else DatasetReader(source)
    task_values, late = validate_source(
        source,
        reader=reader,
        allow_non_finite=allow_non_finite,
        late_videos=late_videos,
        known_videos=known_videos,
    )
    try:
        described = _describe(reader, task_values)
    except BaseException as e:
        if late is not None:
            # a validation problem comes before the export's own checks, as when none is late
            refusal = late.refusal() if isinstance(e, DatasetError) else None
            late.close()
            if refusal is not None:
                raise refusal from None
        raise
    return (*described, late)


def _describe(
    reader: DatasetReader, task_values: dict[int, np.ndarray]
) -> tuple[DatasetReader, SplitPlan, dict[str, SubsetMeta]]:
    """The split plan and both subsets' metadata of a validated source."""
    _check_version(reader)
    plan = plan_split(reader.episodes)
    rows = {row["episode_index"]: row for row in reader.episodes}
    complete_stats: dict[int, dict[str, Any]] = {}
    for ep in sorted(rows):
        if ep not in task_values:
            # validated: the file exists and reads; zero rows need no column
            if reader.count_rows(ep):
                raise DatasetError(
                    f"{reader.data_path(ep)}: episode {ep}: column task_index missing"
                )
            task_values[ep] = np.zeros(0, np.int64)
        # Unknown task_index values were refused by the validation (unknown_task_index).
        complete_stats[ep] = complete_episode_stats(reader, ep)
    kept_stats = {
        ep: kept_frame_stats(reader, ep, edit.trim)
        for ep, edit in sorted(plan.edits.items())
        if edit.trim is not None and edit.cuts(int(rows[ep].get("length", -1)))
    }
    metas = {
        subset: build_subset_meta(
            subset,
            source_info=reader.info,
            source_episodes=rows,
            source_tasks=reader.tasks,
            source_episodes_stats=complete_stats,
            source_indices=plan.indices(subset),
            task_index_values=task_values,
            source_image_histograms=reader.all_image_histograms,
            edits=plan.edits,
            kept_stats=kept_stats,
        )
        for subset in SUBSETS
    }
    return reader, plan, metas
