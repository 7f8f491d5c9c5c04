"""How a format's subsets are cut into tasks that any executor runs, and how the results come
back.

A task format (:class:`TaskFormat`, generic in its task type) cuts each subset into tasks in
output order (``subset_tasks``, in the driver); a process opens one session
(``open_episode_writer``) and writes task after task through it; the driver finishes each
subset from the results in task order (``finish_subset``). :class:`EpisodeFormat` is the one
most formats use (one file per episode, :class:`EpisodeTask`); :class:`TaskFunctions` is one
made of functions (the v3 format's shards). ``eva.export.executors`` runs the tasks serially, on
a process pool or on Ray; :func:`write_serially` is a format's own ``write_subset`` (every task
in this process). A task is small and picklable, and its file is a pure function of its fields
and the source's files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from eva.formats.base import ExportOptions

if TYPE_CHECKING:
    from eva.dataset.reader import DatasetReader
    from eva.dataset.subset import SubsetMeta
    from eva.progress import ProgressSink


@dataclass(frozen=True)
class EpisodeTask:
    """One output episode file to write: everything a worker process needs besides the source
    dataset itself, small and picklable. The file is a pure function of these fields and the
    source's files (``eva.export.executors`` runs tasks serially or on a process pool)."""

    source: Path  # the source dataset root
    subset: str
    index: int  # output episode index
    source_index: int
    label: str  # names the episode in errors and warnings
    path: str  # the file, relative to ``subset_dir``
    subset_dir: Path  # the subset's staging directory
    length: int  # rows, from episodes.jsonl
    index_offset: int  # the output ``index`` of its first row
    task_remap: Mapping[int, int]
    row: Mapping[str, object]  # its episodes.jsonl row in the subset
    video_keys: tuple[str, ...]
    fps: int | float | None  # the subset info's fps, as stored (None: the source reader's)
    options: ExportOptions
    other_files: tuple[str, ...] = ()  # the task's other output files (v2.1: its MP4s)
    # the raw frames [start, end) the episode keeps (its edit_trim; None: every frame):
    # ``length`` counts the kept ones (eva.dataset.subset_edits)
    trim: tuple[int, int] | None = None
    source_length: int | None = None  # a trimmed episode's recorded frames (else ``length``)


class ExportTask(Protocol):
    """What the executors and the incremental re-export need of a task: an ``EpisodeTask``, or
    a format's task over several episodes (a v3 shard)."""

    @property
    def subset(self) -> str: ...

    @property
    def label(self) -> str: ...  # names the task in errors

    @property
    def subset_dir(self) -> Path: ...

    @property
    def path(self) -> str: ...  # its (first) output file, relative to ``subset_dir``

    @property
    def other_files(self) -> tuple[str, ...]: ...


# A format's own task type (EpisodeTask, a v3 ShardTask): the driver hands a format's tasks
# back to that format only.
TaskT = TypeVar("TaskT", bound=ExportTask)
TaskT_contra = TypeVar("TaskT_contra", bound=ExportTask, contravariant=True)


def task_files(task: ExportTask) -> tuple[str, ...]:
    """Every output file of ``task``, relative to its subset directory."""
    return (task.path, *task.other_files)


def _int(value: object) -> int:
    """A count of an incremental record (JSON eva wrote)."""
    if isinstance(value, int | float | str):
        return int(value)
    raise TypeError(f"{value!r} is not a number")


def _items(value: object) -> Iterable[object]:
    """A list of an incremental record (JSON eva wrote)."""
    if isinstance(value, list | tuple):
        return value
    raise TypeError(f"{value!r} is not a list")


def _pair(value: object) -> tuple[str, str]:
    first, second = _items(value)
    return str(first), str(second)


@dataclass(frozen=True)
class EpisodeResult:
    """What a task hands back to the driver (picklable): the file it wrote and what the
    subset's finish and the progress need."""

    subset: str
    index: int
    path: str
    bytes: int
    current: str  # the progress line's "current"
    warnings: tuple[str, ...] = ()  # episode warnings, reported in episode order
    # (name, reason) pairs the format's finish counts over the subset's episodes (mcap
    # foxglove: the cameras written decoded, and why)
    counted: tuple[tuple[str, str], ...] = ()
    episodes: int = 1  # episodes the task completed (a v3 video shard's are counted by its data)
    files: int = 1

    def record(self) -> dict[str, object]:
        """What the incremental record keeps of the result (JSON), to report a reused task's
        file as this one (``from_record``)."""
        return {
            "bytes": self.bytes,
            "current": self.current,
            "warnings": list(self.warnings),
            "counted": [list(pair) for pair in self.counted],
            "episodes": self.episodes,
            "files": self.files,
        }

    @classmethod
    def from_record(cls, task: ExportTask, entry: Mapping[str, object]) -> EpisodeResult:
        """The result ``record`` kept, for ``task``'s reused file."""
        return cls(
            task.subset,
            task.index if isinstance(task, EpisodeTask) else 0,
            task.path,
            _int(entry["bytes"]),
            str(entry["current"]),
            tuple(str(w) for w in _items(entry.get("warnings", ()))),
            tuple(_pair(pair) for pair in _items(entry.get("counted", ()))),
            _int(entry.get("episodes", 1)),
            _int(entry.get("files", 1)),
        )


class EpisodeWriterSession(Protocol[TaskT_contra]):
    """Writes tasks in one process, reusing its buffers from one task to the next (memory stays
    bounded per process, whatever the episode count)."""

    def write(self, task: TaskT_contra) -> EpisodeResult: ...

    def close(self) -> None: ...


def subset_episode_tasks(
    reader: DatasetReader,
    meta: SubsetMeta,
    subset_dir: Path,
    options: ExportOptions,
    path: Callable[[int, int], str],
    label: str,
) -> list[EpisodeTask]:
    """The subset's episodes as tasks in output order (``path`` and ``label``: as
    ``EpisodeFormat`` takes them)."""
    from eva.dataset.layout import DEFAULT_CHUNKS_SIZE

    chunks_size = int(meta.info.get("chunks_size", DEFAULT_CHUNKS_SIZE))
    fps = meta.info.get("fps")
    return [
        EpisodeTask(
            source=Path(reader.root),
            subset=meta.subset,
            index=new,
            source_index=src,
            label=label.format(subset=meta.subset, index=new, source_index=src),
            path=path(new, chunks_size),
            subset_dir=Path(subset_dir),
            length=meta.lengths[new],
            index_offset=meta.index_offsets[new],
            task_remap=dict(meta.task_remap_of(new)),
            row=dict(meta.episodes[new]),
            video_keys=tuple(meta.video_keys),
            fps=fps if isinstance(fps, int | float) and not isinstance(fps, bool) else None,
            options=options,
            trim=meta.trim_of(new),
            source_length=meta.source_lengths.get(new),
        )
        for new, src in enumerate(meta.source_episode_indices)
    ]


# A task format's parts, as functions.
SubsetTasks = Callable[["DatasetReader", "SubsetMeta", Path, ExportOptions], Sequence[TaskT]]
OpenSession = Callable[["DatasetReader", ExportOptions], EpisodeWriterSession[TaskT]]
FinishSubset = Callable[
    ["SubsetMeta", Path, Sequence[EpisodeResult], "ProgressSink", ExportOptions], None
]
ReusedResult = Callable[[TaskT, Mapping[str, object]], EpisodeResult]
# ``renumber(reader, task, previous, published)``: ``task``'s file from ``published``, the file
# of ``previous`` (the same episode numbered otherwise), copied and patched; None when it
# cannot be (``eva.formats._renumber``).
Renumber = Callable[["DatasetReader", EpisodeTask, EpisodeTask, Path], "EpisodeResult | None"]


class TaskFormat(Protocol[TaskT]):
    """A format whose subsets are cut into tasks the executors run (``EpisodeFormat``: one
    file per episode; the v3 format's shards, a ``TaskFunctions``): a format's ``TASKS``.
    ``subset_tasks``: in the driver, the subset's tasks in output order;
    ``open_episode_writer``: a process's session; ``finish_subset``: in the driver, after every
    task of the subset (results in task order); ``reused_result``: a reused task's result from
    what its ``EpisodeResult.record`` kept; ``renumber``: see ``Renumber`` (None: the format
    cannot patch a published file)."""

    @property
    def pool_from_cores(self) -> int: ...

    @property
    def serial_threads(self) -> int: ...

    @property
    def subset_tasks(self) -> SubsetTasks[TaskT]: ...

    @property
    def open_episode_writer(self) -> OpenSession[TaskT]: ...

    @property
    def finish_subset(self) -> FinishSubset: ...

    @property
    def reused_result(self) -> ReusedResult[TaskT]: ...

    @property
    def renumber(self) -> Renumber | None: ...


def write_serially(
    tasks: TaskFormat[TaskT],
    reader: DatasetReader,
    meta: SubsetMeta,
    staging_dir: Path,
    progress: ProgressSink,
    options: ExportOptions,
) -> None:
    """A task format's ``write_subset``: every task of the subset in this process, then the
    subset's finish."""
    every = tasks.subset_tasks(reader, meta, staging_dir, options)
    session = tasks.open_episode_writer(reader, options)
    results = run_serially(every, session, progress, tasks.serial_threads)
    tasks.finish_subset(meta, staging_dir, results, progress, options)


class SerialWrite:
    """A task format's ``eva.formats.catalog.Format.write_subset``: :func:`write_serially`."""

    def write_subset(
        self: TaskFormat[TaskT],
        reader: DatasetReader,
        meta: SubsetMeta,
        staging_dir: Path,
        progress: ProgressSink,
        options: ExportOptions,
    ) -> None:
        write_serially(self, reader, meta, staging_dir, progress, options)


@dataclass(frozen=True)
class TaskFunctions(SerialWrite, Generic[TaskT]):
    """A ``TaskFormat`` made of functions (the v3 format's shards)."""

    subset_tasks: SubsetTasks[TaskT]
    open_episode_writer: OpenSession[TaskT]
    finish_subset: FinishSubset
    reused_result: ReusedResult[TaskT]
    pool_from_cores: int = 2
    serial_threads: int = 1
    renumber: Renumber | None = None


def no_subset_warnings(meta: SubsetMeta, results: Sequence[EpisodeResult]) -> list[str]:
    return []


@dataclass(frozen=True)
class EpisodeFormat(SerialWrite):
    """How a per-episode format (one file per episode plus metadata: hdf5, mcap) cuts a subset
    into tasks and finishes it; the format's ``TASKS``. Its ``write_subset`` runs the tasks
    serially; ``eva.export.executors`` runs the same tasks, sessions and finish on a pool.

    ``path(index, chunks_size)``: an episode's file; ``label``: a template with ``{subset}``,
    ``{index}`` and ``{source_index}`` naming it in errors; ``check_options``: in the driver,
    before any task (refuses options it cannot use); ``subset_info``: the subset's info.json;
    ``subset_warnings``: the warnings about the whole subset, after the episodes' own;
    ``pool_from_cores``: the free cores from which a process pool is the default executor (a
    format whose one process already keeps several cores busy gains from a pool only beyond);
    ``serial_threads``: tasks at a time in the serial executor (``run_serially``);
    ``other_files(index, chunks_size, video_keys)``: an episode's files beside ``path``;
    ``renumber``: see ``Renumber``.
    """

    path: Callable[[int, int], str]
    label: str
    open_episode_writer: OpenSession[EpisodeTask]
    check_options: Callable[[ExportOptions], object]
    subset_info: Callable[[SubsetMeta, ExportOptions], Mapping[str, object]]
    subset_warnings: Callable[[SubsetMeta, Sequence[EpisodeResult]], list[str]] = no_subset_warnings
    pool_from_cores: int = 2
    serial_threads: int = 1
    other_files: Callable[[int, int, tuple[str, ...]], tuple[str, ...]] | None = None
    renumber: Renumber | None = None

    def subset_tasks(
        self, reader: DatasetReader, meta: SubsetMeta, subset_dir: Path, options: ExportOptions
    ) -> list[EpisodeTask]:
        """The subset's tasks in output order."""
        self.check_options(options)
        tasks = subset_episode_tasks(reader, meta, subset_dir, options, self.path, self.label)
        if self.other_files is None:
            return tasks
        from eva.dataset.layout import DEFAULT_CHUNKS_SIZE

        chunks_size = int(meta.info.get("chunks_size", DEFAULT_CHUNKS_SIZE))
        keys = tuple(meta.video_keys)
        return [
            dataclasses.replace(t, other_files=self.other_files(t.index, chunks_size, keys))
            for t in tasks
        ]

    def reused_result(self, task: EpisodeTask, entry: Mapping[str, object]) -> EpisodeResult:
        return EpisodeResult.from_record(task, entry)

    def finish_subset(
        self,
        meta: SubsetMeta,
        subset_dir: Path,
        results: Sequence[EpisodeResult],
        progress: ProgressSink,
        options: ExportOptions,
    ) -> None:
        """After every task of the subset (``results`` in output order): the warnings, then the
        common metadata."""
        from eva.dataset.subset import write_common_meta

        report_warnings(progress, results)
        for line in self.subset_warnings(meta, results):
            progress(warning=line)
        info = dict(self.subset_info(meta, options))
        progress(files=write_common_meta(Path(subset_dir), meta, info))


def report_result(progress: ProgressSink, result: EpisodeResult) -> None:
    """One finished task's episodes and files in the progress counts."""
    progress(
        episodes=result.episodes, files=result.files, bytes=result.bytes, current=result.current
    )


def report_warnings(progress: ProgressSink, results: Sequence[EpisodeResult]) -> None:
    """The episodes' warnings in output order (whatever order the tasks finished in)."""
    for result in results:
        for line in result.warnings:
            progress(warning=line)


def run_serially(
    tasks: Sequence[TaskT],
    session: EpisodeWriterSession[TaskT],
    progress: ProgressSink,
    threads: int = 1,
) -> list[EpisodeResult]:
    """Every task in this process through one session (closed at the end): what a format's
    ``write_subset`` does, and what the serial executor does. ``threads`` > 1: that many tasks
    at a time on threads (a format whose tasks wait on file I/O and release the GIL, with a
    session safe to share); results and progress in task order either way."""
    try:
        return run_ordered(session.write, tasks, progress, threads)
    finally:
        session.close()


def run_ordered(
    write: Callable[[TaskT], EpisodeResult],
    tasks: Sequence[TaskT],
    progress: ProgressSink,
    threads: int = 1,
) -> list[EpisodeResult]:
    """``write`` of every task, ``threads`` at a time, reported in task order."""
    results: list[EpisodeResult] = []
    count = max(1, min(threads, len(tasks)))
    if count == 1:
        for task in tasks:
            results.append(write(task))
            report_result(progress, results[-1])
        return results
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=count, thread_name_prefix="eva-tasks") as pool:
        futures = [pool.submit(write, task) for task in tasks]
        try:
            for future in futures:
                results.append(future.result())
                report_result(progress, results[-1])
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    return results
