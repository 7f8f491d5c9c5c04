"""Quality export: validate the v2.1 source, split it, write both subsets, publish them as a pair.

Order of work (nothing is written before the source has passed validation):

1. the format's module (``FormatEntry.load``: an unavailable format stops here);
2. source validation (``eva.dataset.validate``) plus the export's own checks (v2.1 only, task
   indices resolvable, stats available) -> one-line ``DatasetError`` naming file/episode/field,
   the split plan and one ``SubsetMeta`` per subset, all from one snapshot of the source's
   metadata, before anything is written (not even the lock or job.json). Only the MP4
   inspections of a source that passed every other check may still run after this step
   (``LateVideoChecks``); their verdict is awaited before step 5, and a refusal from them
   removes whatever this run made, so that it leaves what a refusal here leaves;
3. the export lock (a second export of the same source+format is refused), then ``recover`` of
   whatever an interrupted earlier run left;
4. both subsets written by the format module into one hidden staging dir, each with its
   ``meta/quality_split.json``; the completed job record and the completion marker last;
5. ``publish.publish_pair``: one atomic swap makes the new pair (and its completed job) visible.

The job record (``<export root>/job.json``) follows every state change from step 3 on; a failure
leaves the old pair untouched, records the error and removes the staging dir. A source refused in
step 2 writes nothing at all: the error is the caller's to report.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eva import __version__
from eva.dataset import layout
from eva.dataset.errors import DatasetError, error_line, naming_write_errors
from eva.dataset.reader import DatasetReader
from eva.dataset.subset import SubsetMeta, write_staged_json
from eva.export.executors import EXECUTORS
from eva.export.incremental import read_video_checks, settle_records, write_video_checks
from eva.export.source import LateVideoChecks, prepare
from eva.export.task_subsets import ExportRun, TaskCounts, write_task_subsets
from eva.formats import catalog
from eva.formats.base import ExportOptions
from eva.formats.catalog import Format, FormatEntry
from eva.jobs import (
    EXPORT_JOB,
    Job,
    JobRecorder,
    job_path,
    pid_alive,
    read_job,
    write_job,
)
from eva.progress import Progress
from eva.publish import (
    export_lock,
    lock_path,
    make_staging,
    mark_complete,
    publish_pair,
    recover,
)
from eva.quality.split import SplitPlan
from eva.quality.verdicts import RULE
from eva.timestamps import utc_now

SUBSETS = layout.SUBSETS


@dataclass
class ExportResult:
    job: Job
    export_root: Path
    accepted_dir: Path
    rejected_dir: Path
    plan: SplitPlan
    metas: dict[str, SubsetMeta]
    recovered: list[str]


def quality_split_record(
    meta: SubsetMeta, *, source: Path, fmt: str, export_id: str, plan: SplitPlan
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "source_dir": str(source),
        "subset": meta.subset,
        "dataset_format": fmt,
        "source_episode_indices": list(meta.source_episode_indices),
        **plan.provenance(meta.source_episode_indices),  # dropped, edits: only when any
        "rule": RULE,
        "export_id": export_id,
        "total_episodes": meta.total_episodes,
        "total_frames": meta.total_frames,
        "source_total_episodes": plan.source_total,
        "created_at": utc_now(),
        "tool": "eva",
        "tool_version": __version__,
    }
    # A merged source (eva merge) names each episode's recording: the export passes it on.
    sessions = [row.get("source_session") for row in meta.episodes]
    if any(session is not None for session in sessions):
        record["source_sessions"] = sessions
    return record


def _one_line(error: BaseException) -> str:
    """The job record's error: a ``DatasetError`` names file/episode/field on its own; anything
    else is ``Type: message`` (``eva.dataset.errors.error_line``)."""
    if isinstance(error, DatasetError):
        return (str(error).strip().splitlines() or [type(error).__name__])[0]
    return error_line(error)


def _carry_unfinished_upload(root: Path, staging: Path) -> None:
    """An interrupted upload's record names the remote staging directory it left behind, which
    only the next upload removes; the swap would delete the record with the old pair, so an
    unfinished one moves into the new pair. A record eva cannot read (a link, not JSON for any
    reason, a NaN) is not carried: ``read_upload_record`` would not read it either."""
    from eva.dataset.atomic import atomic_write_json, read_json_object
    from eva.jobs import UPLOAD_JOB

    try:
        record = read_json_object(root / UPLOAD_JOB, strict=True)
    except (OSError, DatasetError):
        return
    if record.get("state") != "completed" and record.get("staging_path"):
        atomic_write_json(staging / UPLOAD_JOB, record, durable=False)


def _record_refusal(
    root: Path, source: Path, fmt: FormatEntry, job_id: str | None, error: DatasetError
) -> None:
    """A refused source of an export root that exists already (an earlier export): its job
    record says this run failed and why, as for any later failure. Without an export root
    nothing is created: the caller reports the error. A busy root keeps its running job."""
    if not (root / EXPORT_JOB).is_file():
        return
    job = _refused_job(root, source, fmt, job_id, error)
    with contextlib.suppress(DatasetError, OSError), export_lock(root, f"{source} to {fmt}"):
        write_job(root / EXPORT_JOB, job)


def _refused_job(
    root: Path, source: Path, fmt: FormatEntry, job_id: str | None, error: DatasetError
) -> Job:
    job = _new_job(root, source, fmt, job_id)
    job.start()
    job.fail(_one_line(error))
    return job


def _new_job(root: Path, source: Path, fmt: FormatEntry, job_id: str | None) -> Job:
    job = Job(
        kind="export",
        source_dir=str(source),
        format=fmt.name,
        accepted_dir=str(root / "accepted"),
        rejected_dir=str(root / "rejected"),
    )
    if job_id is not None:
        job.job_id = job_id
    return job


def export_dataset(
    source_dir: Path | str,
    fmt: FormatEntry | str,
    *,
    options: ExportOptions | None = None,
    on_progress: Callable[[Progress, Job], None] | None = None,
    exchange: bool = True,
    job_id: str | None = None,
    executor: str = "serial",
    workers: int | None = None,
    incremental: bool = False,
    ray_address: str | None = None,
) -> ExportResult:
    """Run one quality export of ``source_dir`` to ``fmt`` (its catalogue entry, or a name a
    Python caller gives); returns where the pair went.

    ``job_id`` names the job (and the pair's ``export_id``) when the caller has announced it
    already, as the console does; by default a new one is made.

    ``executor``: where the format's tasks (an episode file each; v3: a data or video file
    each) are written: ``serial`` (this process), ``processes`` (a pool of ``workers``, default
    the free cores; ``eva.export.executors``) or ``ray`` (actors on the Ray cluster at
    ``ray_address``, else ``RAY_ADDRESS``, else a local one; ``eva.export.ray_run``). The
    output is the same either way. ``incremental``: the tasks whose fingerprint matches the
    published pair's are linked from it instead of written again, and the hdf5/mcap episodes
    only renumbered since are copied from it and patched (``eva.export.incremental``); the job
    counts them (``episodes_reused``, ``episodes_renumbered``).

    Raises ``DatasetError`` (bad source, busy lock, unavailable format) or the writer's error;
    in every failure case the previously published pair is left as it was.
    """
    fmt = catalog.as_entry(fmt)
    module = fmt.load()
    options = options or ExportOptions()
    source, root = _checked_arguments(source_dir, fmt, executor, job_id)
    # The source is validated and described before anything is written (the lock and job.json
    # included): a directory that is not a dataset leaves no export root behind. Only the
    # source is read, so no lock is needed for it. The MP4 inspections of a source that passed
    # every other check go on while the staging dir is written (LateVideoChecks); a refusal
    # from them removes all this run made, as if it had come first.
    before = _ExportTrace.of(root)
    # --incremental: the source MP4s the published pair's validation found intact are not
    # inspected again while unchanged (eva.export.incremental.VIDEO_CHECKS)
    known = read_video_checks(root) if incremental else None
    try:
        prepared = prepare(
            source,
            allow_non_finite=options.allow_non_finite,
            late_videos=True,
            known_videos=known,
        )
    except DatasetError as e:
        _record_refusal(root, source, fmt, job_id, e)
        raise
    late = prepared[3]
    try:
        _check_source(module, prepared[0], prepared[2], options)
        run = ExportRun(executor, workers, incremental, ray_address)
        call = _ExportCall(module, source, root, fmt, options, on_progress, exchange, job_id, run)
        return _export_prepared(call, prepared[:3], late, before)
    except BaseException as e:
        # not holding the lock (busy): nothing of this run to remove; the source's refusal
        # still comes first, as when it is found before the lock
        refusal = late.refusal() if late is not None and isinstance(e, Exception) else None
        if refusal is None or refusal is e:
            raise
        raise refusal from None
    finally:
        if late is not None:
            late.close()


def _check_source(
    module: Format, reader: DatasetReader, metas: dict[str, SubsetMeta], options: ExportOptions
) -> None:
    """A format's own refusals of this source with these options (an ``OptionError``: an
    ``--hdf5-map`` naming no feature), before anything is written: its optional
    ``check_source(reader, metas, options)``."""
    check = getattr(module, "check_source", None)
    if callable(check):
        check(reader, metas, options)


def _checked_arguments(
    source_dir: Path | str, fmt: FormatEntry, executor: str, job_id: str | None
) -> tuple[Path, Path]:
    """``export_dataset``'s arguments refused before anything is read; the resolved source and
    its export root."""
    if executor not in EXECUTORS:
        raise DatasetError(f"executor {executor!r}: use one of {', '.join(EXECUTORS)}")
    if executor == "ray":
        from eva.export.ray_run import import_ray

        import_ray()  # without the extra: its one line, before anything is written
    source = Path(source_dir).resolve()
    if not source.is_dir():
        raise DatasetError(f"{source}: source dataset directory does not exist")
    root = fmt.export_root(source)
    if layout.is_within(root, source):
        raise DatasetError(f"{root}: export root would lie inside the source {source}")
    # It names the staging directory: letters, digits and dashes only.
    if job_id is not None and not re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z-]{0,63}", job_id):
        raise DatasetError(f"export job id {job_id!r}: letters, digits and '-' only")
    return source, root


@dataclass(frozen=True)
class _ExportTrace:
    """What of an export root existed before a run: a refused source leaves just that."""

    parent: bool
    root: bool
    job: bool

    @classmethod
    def of(cls, root: Path) -> _ExportTrace:
        return cls(root.parent.is_dir(), root.is_dir(), (root / EXPORT_JOB).is_file())

    def restore(self, root: Path, refused: Job) -> None:
        """Under the export lock: remove what a refused run created (its staging dir is gone
        already), or record ``refused`` in a root that had a job record, as a refusal before
        the lock does (``_record_refusal``)."""
        with contextlib.suppress(OSError):
            if self.job:
                write_job(root / EXPORT_JOB, refused)
                return
            (root / EXPORT_JOB).unlink(missing_ok=True)
            if not self.root:
                root.rmdir()
            if not self.parent:  # export_lock notices a lock file unlinked under it
                lock_path(root).unlink(missing_ok=True)
                root.parent.rmdir()


@dataclass(frozen=True)
class _ExportCall:
    """An ``export_dataset`` call, its arguments checked."""

    module: Format
    source: Path
    root: Path
    fmt: FormatEntry
    options: ExportOptions
    on_progress: Callable[[Progress, Job], None] | None
    exchange: bool
    job_id: str | None
    run: ExportRun


def _export_prepared(
    call: _ExportCall,
    prepared: tuple[DatasetReader, SplitPlan, dict[str, SubsetMeta]],
    late: LateVideoChecks | None,
    before: _ExportTrace,
) -> ExportResult:
    """``export_dataset`` from the lock on, for a source validated (but for ``late``): a
    refusal from ``late``, whatever failed first, leaves the root as ``before`` had it."""
    with export_lock(call.root, f"{call.source} to {call.fmt}"):
        try:
            return _export_locked(call, prepared, late)
        except BaseException as e:
            refusal = late.refusal() if late is not None and isinstance(e, Exception) else None
            if refusal is None:
                raise
            refused = _refused_job(call.root, call.source, call.fmt, call.job_id, refusal)
            before.restore(call.root, refused)
            if refusal is e:
                raise
            raise refusal from None


def _start_job(call: _ExportCall) -> tuple[Job, JobRecorder, list[str]]:
    """Under the lock: an upload of the pair still running refuses the export; then what an
    interrupted run left is recovered and the new job is recorded as running."""
    root = call.root
    upload = read_job(job_path(root, "upload"))
    if upload is not None and upload.state in ("queued", "running") and pid_alive(upload.pid):
        raise DatasetError(
            f"{job_path(root, 'upload')}: an upload of this export is {upload.state} "
            f"(pid {upload.pid}); replacing the pair now would change files under it"
        )
    recovered = recover(root)
    root.mkdir(parents=True, exist_ok=True)
    job = _new_job(root, call.source, call.fmt, call.job_id)
    recorder = JobRecorder(job, root / EXPORT_JOB)
    # The queued -> running records need no fsync: after a power loss a "running" job whose
    # pid is gone is marked failed by recover(); the final record is made durable below.
    with naming_write_errors(recorder.path):
        write_job(recorder.path, job, durable=False)
        job.start()
        write_job(recorder.path, job, durable=False)
    return job, recorder, recovered


def _write_staged(
    call: _ExportCall,
    prepared: tuple[DatasetReader, SplitPlan, dict[str, SubsetMeta]],
    late: LateVideoChecks | None,
    staging: Path,
    progress: Progress,
    export_id: str,
) -> TaskCounts:
    """Both subsets into ``staging``, each with its quality split record, then the late MP4
    checks' verdict (a refusal raises) and record. Returns the episodes reused and renumbered."""
    reader, plan, metas = prepared
    module, options = call.module, call.options
    for subset in SUBSETS:
        (staging / subset).mkdir()
    episodes = module.TASKS
    counts = TaskCounts()
    if episodes is not None:
        counts = write_task_subsets(
            call.fmt, episodes, reader, metas, call.root, staging, progress, options, call.run
        )
    for subset in SUBSETS:
        subset_dir = staging / subset
        if episodes is None:
            # a write that fails (a full disk) names its file, whatever the format
            with naming_write_errors(subset_dir):
                module.write_subset(reader, metas[subset], subset_dir, progress, options)
        record = quality_split_record(
            metas[subset], source=call.source, fmt=call.fmt.name, export_id=export_id, plan=plan
        )
        write_staged_json(subset_dir / layout.QUALITY_SPLIT, record)
        progress(files=1)
    refusal = late.refusal() if late is not None else None
    if refusal is not None:
        raise refusal
    if late is not None:
        with naming_write_errors(staging):
            write_video_checks(staging, late.inspected())
    return counts


def _export_locked(
    call: _ExportCall,
    prepared: tuple[DatasetReader, SplitPlan, dict[str, SubsetMeta]],
    late: LateVideoChecks | None,
) -> ExportResult:
    """The export under its lock: job record, staging dir, the format's files, publication."""
    root, on_progress = call.root, call.on_progress
    job, recorder, recovered = _start_job(call)
    progress = Progress()

    def listener(p: Progress) -> None:
        with naming_write_errors(recorder.path):
            recorder.on_progress(p)
        if on_progress is not None:
            on_progress(p, job)

    progress.listeners.append(listener)
    staging: Path | None = None
    _, plan, metas = prepared
    try:
        progress.total_episodes = sum(m.total_episodes for m in metas.values())
        listener(progress)
        staging = make_staging(root, job.job_id)
        counts = _write_staged(call, prepared, late, staging, progress, job.job_id)
        job.set_progress(progress)
        job.episodes_reused = counts.reused
        job.episodes_renumbered = counts.renumbered
        job.episodes_rewritten = (
            sum(m.total_episodes for m in metas.values()) - counts.reused - counts.renumbered
        )
        job.complete()
        with naming_write_errors(staging / EXPORT_JOB):
            write_job(staging / EXPORT_JOB, job, durable=False)
            _carry_unfinished_upload(root, staging)
        progress.set_stage("publishing")
        with naming_write_errors(staging):
            mark_complete(staging, job.job_id, durable=call.options.durable)
        publish_pair(root, staging, exchange=call.exchange)
        staging = None
        settle_records(root, call.source)
    except BaseException as e:
        job.fail(_one_line(e))
        job.set_progress(progress)
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        # Recording the failure must not mask the error itself.
        with contextlib.suppress(OSError):
            root.mkdir(parents=True, exist_ok=True)
            write_job(root / EXPORT_JOB, job)
        raise
    if on_progress is not None:
        on_progress(progress, job)
    return ExportResult(
        job=job,
        export_root=root,
        accepted_dir=root / "accepted",
        rejected_dir=root / "rejected",
        plan=plan,
        metas=metas,
        recovered=recovered,
    )


def _merge_leftovers(dataset: Path) -> list[str]:
    """Remove what killed ``eva merge`` runs into ``dataset`` left beside it (their staging
    dirs, none a live merge holds); ``dataset`` itself need not exist."""
    from eva.dataset.merge import remove_leftovers

    parent = dataset.parent.resolve()
    if not parent.is_dir():
        return []
    return [
        f"removed {p} (left by a killed eva merge)" for p in remove_leftovers(parent / dataset.name)
    ]


def cleanup(source_dir: Path | str, fmt: FormatEntry | str | None = None) -> dict[str, list[str]]:
    """Recover interrupted publications and remove hidden leftovers, per format (all by default),
    then the raw dataset's stale temporaries (under "raw") and its metadata left behind the
    committed episodes by an interrupted save (under "metadata", ``eva.dataset.repair``), and
    what a killed ``eva merge`` into it left beside it (under "merge": the dataset need not exist
    then). What it could not do is listed under "failed" (the caller's exit status says so)."""
    source = Path(source_dir).resolve()
    formats = [catalog.as_entry(fmt)] if fmt else list(catalog.entries())
    actions: dict[str, list[str]] = {}
    merged = _merge_leftovers(Path(source_dir))
    if merged:
        actions["merge"] = merged
    if not Path(source_dir).exists() and not Path(source_dir).is_symlink():
        return actions  # a merge target a killed merge never published: nothing else to do
    for entry in formats:
        root = entry.export_root(source)
        if not root.parent.is_dir():
            continue
        with export_lock(root, f"{source} to {entry}"):
            actions[entry.name] = recover(root)
    if source.is_dir():
        from eva.dataset.writer import remove_stale_temporaries

        # Temp files killed writers or a killed `eva qc` left in the raw dataset.
        removed = remove_stale_temporaries(source)
        if removed:
            actions["raw"] = [f"removed {path}" for path in removed]
        from eva.dataset.repair import repair_metadata

        # info.json / stats.json behind the committed rows: a save interrupted after its commit.
        try:
            repaired = repair_metadata(source)
        except DatasetError as e:
            actions["failed"] = [f"metadata not repaired: {e}"]
        else:
            if repaired:
                actions["metadata"] = repaired
    return actions
