"""Both subsets of a task format (``eva.formats.tasks.TaskFormat``) written into the staging
directory: the tasks whose published files can be reused linked (``eva.export.incremental``), the
episodes only renumbered since copied and patched, the others run on the export's executor
(``eva.export.executors``); then the fingerprints and each subset's finish, in the driver."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eva.dataset.errors import naming_write_errors
from eva.dataset.layout import SUBSETS
from eva.dataset.reader import DatasetReader
from eva.dataset.subset import SubsetMeta
from eva.formats.base import ExportOptions
from eva.formats.catalog import FormatEntry
from eva.formats.tasks import EpisodeResult, TaskFormat, TaskT, report_result
from eva.progress import Progress


def write_task_subsets(
    fmt: FormatEntry,
    episodes: TaskFormat[TaskT],
    reader: DatasetReader,
    metas: dict[str, SubsetMeta],
    root: Path,
    staging: Path,
    progress: Progress,
    options: ExportOptions,
    run: ExportRun,
) -> TaskCounts:
    """Both subsets of a format cut into tasks (an episode file each, or a v3 shard each): the
    tasks whose published files can be reused (``run.incremental``) linked, the others run on
    ``run.executor``; then the fingerprints and each subset's finish (warnings, metadata) here,
    in the driver. Returns the episodes reused and renumbered (``EpisodePlan``)."""
    from eva.export import incremental as inc
    from eva.export.executors import run_episode_tasks  # a pool is only made if needed

    tasks = {s: episodes.subset_tasks(reader, metas[s], staging / s, options) for s in SUBSETS}
    every = [task for subset in SUBSETS for task in tasks[subset]]
    renumber = episodes.renumber
    plan = inc.EpisodePlan.of(
        fmt.name, reader, every, options, root, run.incremental, renumber is not None
    )
    results: dict[int, EpisodeResult] = {}
    for number, entry in plan.reused.items():
        inc.link_published(root, every[number])
        results[number] = episodes.reused_result(every[number], entry)
        report_result(progress, results[number])
    if plan.renumbered and renumber is not None:
        for number, result in plan.renumber(renumber, reader, root, every).items():
            results[number] = result
            report_result(progress, result)
    if plan.rewrite:
        written = run_episode_tasks(
            fmt,
            episodes,
            reader,
            [every[number] for number in plan.rewrite],
            progress,
            options=options,
            executor=run.executor,
            workers=run.workers,
            ray_address=run.ray_address,
        )
        results.update(zip(plan.rewrite, written, strict=True))
    ordered = [results[number] for number in range(len(every))]
    entries = {
        key: inc.fingerprint_entry(plan.fingerprints[key], task, result, plan.contents.get(key))
        for task, result in zip(every, ordered, strict=True)
        for key in [inc.record_key(task)]
    }
    with naming_write_errors(staging):
        inc.write_fingerprints(staging, entries, plan.sources)
    for subset in SUBSETS:
        subset_dir = staging / subset
        with naming_write_errors(subset_dir):
            episodes.finish_subset(
                metas[subset],
                subset_dir,
                [r for r in ordered if r.subset == subset],
                progress,
                options,
            )
    return TaskCounts(
        sum(results[number].episodes for number in plan.reused),
        sum(results[number].episodes for number in plan.renumbered),
    )


@dataclass(frozen=True)
class TaskCounts:
    """Episodes an incremental export linked from the published pair, and copied and patched."""

    reused: int = 0
    renumbered: int = 0


@dataclass(frozen=True)
class ExportRun:
    """How an export runs, beside what it writes: where its tasks go and whether it reuses the
    published pair's unchanged episode files (the output is the same bytes either way)."""

    executor: str = "serial"
    workers: int | None = None
    incremental: bool = False
    ray_address: str | None = None
