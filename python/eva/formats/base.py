"""What every export format provides, and the typed options it is given.

A format is a module ``eva.formats.<name>`` that satisfies :class:`FormatModule`: its options
dataclass (``OPTIONS``, a subclass of :class:`Options`), ``write_subset`` and ``verify``
(docs/design.md, "Export interfaces"). ``eva.export.registry.load_format`` checks a module
against it. This module imports nothing heavy: the CLI builds its per-format options from the
dataclasses without importing a single format.

An option is a dataclass field made with :func:`option`: its default is stated there once, with
its help text, its allowed values and its request name (the console's key, and the CLI flag
``--<name with dashes>`` unless ``flag`` says otherwise). A field made with a plain ``field`` is
a knob for Python callers only (tests, benches), never shown to a user. Every value is checked
once, in ``__post_init__``; a bad one is an :class:`OptionError` naming the option.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, cast

from eva.dataset.errors import DatasetError
from eva.formats._option_values import OptionError as OptionError
from eva.formats._option_values import check_range as check_range
from eva.formats._option_values import check_value, coerce

if TYPE_CHECKING:
    from eva.dataset.reader import DatasetReader
    from eva.dataset.subset import SubsetMeta
    from eva.dataset.validate import Problem
    from eva.progress import ProgressSink

OptionType = Literal["bool", "int", "float", "choice", "text"]
OptionValue = bool | int | float | str
METADATA_KEY = "eva.option"

T = TypeVar("T")
OptionsT = TypeVar("OptionsT", bound="Options")


@dataclass(frozen=True)
class OptionInfo:
    """How one option is named and described to users (CLI and console)."""

    help: str
    name: str = ""  # request name; "" = the field's name
    flag: str | None = None  # CLI flag; None = --<name with dashes>
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    minimum_open: bool = False  # the minimum itself is not allowed
    maximum: float | None = None  # required of a number: no option is unbounded
    text: bool = False  # a free-text value checked by the dataclass (not a choice)
    metavar: str | None = None


def option(
    default: T,
    *,
    help: str,
    name: str = "",
    flag: str | None = None,
    choices: tuple[str, ...] = (),
    minimum: float | None = None,
    minimum_open: bool = False,
    maximum: float | None = None,
    text: bool = False,
    metavar: str | None = None,
) -> T:
    """A dataclass field that is a user-facing option (see the module doc); a number needs its
    ``minimum`` and ``maximum`` (the limits the format's writer works within)."""
    info = OptionInfo(help, name, flag, choices, minimum, minimum_open, maximum, text, metavar)
    return field(default=default, metadata={METADATA_KEY: info})


@dataclass(frozen=True)
class OptionField:
    """One option of an options dataclass, resolved: its field, names, type and default."""

    field_name: str
    name: str
    flag: str
    type: OptionType
    default: OptionValue
    info: OptionInfo

    def as_dict(self) -> dict[str, object]:
        """The option as the console's format panel takes it."""
        return {
            "name": self.name,
            "type": self.type,
            "default": self.default,
            "help": self.info.help,
            "choices": list(self.info.choices),
            "minimum": self.info.minimum,
            "minimum_open": self.info.minimum_open,
            "maximum": self.info.maximum,
        }


# A default's Python type -> the option's type (bool before int: a bool is an int).
_DEFAULT_TYPES: tuple[tuple[type, OptionType], ...] = (
    (bool, "bool"),
    (int, "int"),
    (float, "float"),
)


def _option_type(default: object, info: OptionInfo) -> OptionType:
    if info.choices:
        return "choice"
    return next((name for kind, name in _DEFAULT_TYPES if isinstance(default, kind)), "text")


@dataclass(frozen=True)
class Options:
    """Base of every options dataclass: finds its options, checks and builds them."""

    @classmethod
    def option_fields(cls) -> tuple[OptionField, ...]:
        found = []
        for f in dataclasses.fields(cls):
            info = f.metadata.get(METADATA_KEY)
            if not isinstance(info, OptionInfo):
                continue
            default = f.default
            if not isinstance(default, bool | int | float | str):
                raise TypeError(f"{cls.__name__}.{f.name}: an option's default is a plain value")
            name = info.name or f.name
            flag = info.flag or "--" + name.replace("_", "-")
            kind = _option_type(default, info)
            if kind in ("int", "float") and (info.minimum is None or info.maximum is None):
                raise TypeError(f"{cls.__name__}.{f.name}: a number option needs both bounds")
            found.append(OptionField(f.name, name, flag, kind, default, info))
        return tuple(found)

    @classmethod
    def from_values(cls: type[OptionsT], values: Mapping[str, object]) -> OptionsT:
        """The options from request names -> plain values (JSON); a missing name keeps its
        default, an unknown one is refused. Errors name the option."""
        fields = {f.name: f for f in cls.option_fields()}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise OptionError(unknown[0], f"not an option (options: {', '.join(fields) or 'none'})")
        kwargs = {fields[n].field_name: coerce(fields[n], v) for n, v in values.items()}
        return cls(**kwargs)

    def __post_init__(self) -> None:
        for f in self.option_fields():
            check_value(f, getattr(self, f.field_name))


@dataclass(frozen=True)
class ExportOptions(Options):
    """What one export is given: the options every format takes, and the format's own.

    ``format``: the format's options dataclass (``eva.formats.options``), None for its defaults.
    ``durable``: flush the staged pair to disk (one ``syncfs``) before it is published, so a power
    loss cannot publish unwritten files; a process crash is safe either way.
    """

    allow_non_finite: bool = option(
        False,
        help="Export NaN/inf values in vector columns as they are (every format; by default a "
        "source holding any is refused, naming file, episode, column and first row).",
    )
    durable: bool = True
    format: Options | None = None

    def format_options(self, cls: type[OptionsT]) -> OptionsT:
        """The format's options (its defaults when none were given); options made for another
        format are a caller's mistake."""
        if self.format is None:
            return cls()
        if not isinstance(self.format, cls):
            raise DatasetError(
                f"options: {type(self.format).__name__} given to an export that takes "
                f"{cls.__name__}"
            )
        return self.format


class FormatModule(Protocol):
    """An export format module (``eva.formats.<name>``)."""

    OPTIONS: type[Options]

    def write_subset(
        self,
        reader: DatasetReader,
        meta: SubsetMeta,
        staging_dir: Path,
        progress: ProgressSink,
        options: ExportOptions,
    ) -> None:
        """Write one complete subset (data, meta, images) of the v2.1 source ``reader``
        described by ``meta`` into the empty directory ``staging_dir``: everything except
        ``meta/quality_split.json`` (the pipeline writes that). Call ``progress`` with
        increments. Bad input raises ``DatasetError`` (one line naming file/episode/field)."""

    def verify(self, export_dir: Path) -> list[Problem]:
        """Totals against the physical files plus a real read of one state, one action and one
        image frame per episode with the format's own reader (shared checks:
        ``eva.formats._verify``)."""


# ---- per-episode formats: one output file per episode, written as independent tasks -----------


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


def task_files(task: ExportTask) -> tuple[str, ...]:
    """Every output file of ``task``, relative to its subset directory."""
    return (task.path, *task.other_files)


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

    def record(self) -> dict[str, Any]:
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
    def from_record(cls, task: ExportTask, entry: Mapping[str, Any]) -> EpisodeResult:
        """The result ``record`` kept, for ``task``'s reused file."""
        return cls(
            task.subset,
            int(getattr(task, "index", 0)),
            task.path,
            int(entry["bytes"]),
            str(entry["current"]),
            tuple(str(w) for w in entry.get("warnings", ())),
            tuple((str(a), str(b)) for a, b in entry.get("counted", ())),
            int(entry.get("episodes", 1)),
            int(entry.get("files", 1)),
        )


class EpisodeWriterSession(Protocol):
    """Writes tasks in one process, reusing its buffers from one task to the next (memory stays
    bounded per process, whatever the episode count). ``task``: the format's own kind."""

    def write(self, task: Any) -> EpisodeResult: ...

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
            task_remap=dict(meta.task_remap),
            row=dict(meta.episodes[new]),
            video_keys=tuple(meta.video_keys),
            fps=fps if isinstance(fps, int | float) and not isinstance(fps, bool) else None,
            options=options,
        )
        for new, src in enumerate(meta.source_episode_indices)
    ]


# A task format's parts (``TaskFormat``), as functions.
SubsetTasks = Callable[["DatasetReader", "SubsetMeta", Path, ExportOptions], Sequence[ExportTask]]
OpenSession = Callable[["DatasetReader", ExportOptions], EpisodeWriterSession]
FinishSubset = Callable[
    ["SubsetMeta", Path, Sequence[EpisodeResult], "ProgressSink", ExportOptions], None
]
ReusedResult = Callable[[ExportTask, Mapping[str, Any]], EpisodeResult]


class TaskFormat(Protocol):
    """A format whose subsets are cut into tasks the executors run (``EpisodeFormat``: one
    file per episode; the v3 format's shards, a ``TaskFunctions``): the module's ``EPISODES``
    or ``SHARDS``. ``subset_tasks``: in the driver, the subset's tasks in output order;
    ``open_episode_writer``: a process's session; ``finish_subset``: in the driver, after every
    task of the subset (results in task order); ``reused_result``: a reused task's result from
    what its ``EpisodeResult.record`` kept."""

    @property
    def pool_from_cores(self) -> int: ...

    @property
    def serial_threads(self) -> int: ...

    @property
    def subset_tasks(self) -> SubsetTasks: ...

    @property
    def open_episode_writer(self) -> OpenSession: ...

    @property
    def finish_subset(self) -> FinishSubset: ...

    @property
    def reused_result(self) -> ReusedResult: ...


class SerialWrite:
    """``FormatModule.write_subset`` of a ``TaskFormat``: every task in this process."""

    def write_subset(
        self,
        reader: DatasetReader,
        meta: SubsetMeta,
        staging_dir: Path,
        progress: ProgressSink,
        options: ExportOptions,
    ) -> None:
        """``FormatModule.write_subset``, serially in this process."""
        tasks = cast("TaskFormat", self)
        every = tasks.subset_tasks(reader, meta, staging_dir, options)
        session = tasks.open_episode_writer(reader, options)
        results = run_serially(every, session, progress, tasks.serial_threads)
        tasks.finish_subset(meta, staging_dir, results, progress, options)


@dataclass(frozen=True)
class TaskFunctions(SerialWrite):
    """A ``TaskFormat`` made of functions (the v3 format's ``SHARDS``)."""

    subset_tasks: SubsetTasks
    open_episode_writer: OpenSession
    finish_subset: FinishSubset
    reused_result: ReusedResult
    pool_from_cores: int = 2
    serial_threads: int = 1


def task_format(module: object) -> TaskFormat | None:
    """The module's ``EPISODES`` or ``SHARDS``: how its subsets are cut into tasks (None: the
    format writes each subset in one ``write_subset`` call)."""
    found = getattr(module, "EPISODES", None) or getattr(module, "SHARDS", None)
    return cast("TaskFormat", found) if found is not None else None


def no_subset_warnings(meta: SubsetMeta, results: Sequence[EpisodeResult]) -> list[str]:
    return []


@dataclass(frozen=True)
class EpisodeFormat(SerialWrite):
    """How a per-episode format (one file per episode plus metadata: hdf5, mcap) cuts a subset
    into tasks and finishes it; the module's ``EPISODES``. Its ``write_subset`` runs the tasks
    serially; ``eva.export.executors`` runs the same tasks, sessions and finish on a pool.

    ``path(index, chunks_size)``: an episode's file; ``label``: a template with ``{subset}``,
    ``{index}`` and ``{source_index}`` naming it in errors; ``check_options``: in the driver,
    before any task (refuses options it cannot use); ``subset_info``: the subset's info.json;
    ``subset_warnings``: the warnings about the whole subset, after the episodes' own;
    ``pool_from_cores``: the free cores from which a process pool is the default executor (a
    format whose one process already keeps several cores busy gains from a pool only beyond);
    ``serial_threads``: tasks at a time in the serial executor (``run_serially``);
    ``other_files(index, chunks_size, video_keys)``: an episode's files beside ``path``;
    ``renumber(reader, task, previous, published) -> EpisodeResult | None``: ``task``'s file
    from ``published``, ``previous``'s file, copied and patched (``eva.formats._renumber``).
    """

    path: Callable[[int, int], str]
    label: str
    open_episode_writer: Callable[[DatasetReader, ExportOptions], EpisodeWriterSession]
    check_options: Callable[[ExportOptions], object]
    subset_info: Callable[[SubsetMeta, ExportOptions], dict[str, Any]]
    subset_warnings: Callable[[SubsetMeta, Sequence[EpisodeResult]], list[str]] = no_subset_warnings
    pool_from_cores: int = 2
    serial_threads: int = 1
    other_files: Callable[[int, int, tuple[str, ...]], tuple[str, ...]] | None = None
    renumber: Callable[..., EpisodeResult | None] | None = None

    def episode_tasks(
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

    subset_tasks = episode_tasks  # eva.formats.base.TaskFormat

    def reused_result(self, task: ExportTask, entry: Mapping[str, Any]) -> EpisodeResult:
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
        progress(files=write_common_meta(Path(subset_dir), meta, self.subset_info(meta, options)))


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
    tasks: Sequence[ExportTask],
    session: EpisodeWriterSession,
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
    write: Callable[[Any], EpisodeResult],
    tasks: Sequence[ExportTask],
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
