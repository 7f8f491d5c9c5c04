"""Incremental re-export of the task formats (hdf5, mcap, lerobot_v21, lerobot_v3): reuse what
has not changed.

Every export of a task format (``eva.formats.tasks.TaskFormat``) records, beside ``job.json`` in
the published pair, ``fingerprints.json``: per task (an output episode's files; a v3 data or
video file), the fingerprint of everything its files are made of (``task_fingerprint``), the
files' own identity when they were written, and what the task handed back to the driver
(``EpisodeResult.record``: bytes, warnings, counted pairs; a v3 file's rows, timestamps and
histograms), so that a reused task reports exactly what a rewritten one would.

Beside it, ``video_checks.json``: the source MP4s the validation found intact, with their
identity (size, mtime, ctime, inode, device); an incremental export's validation does not inspect
them again while each is the same file (``eva.dataset.validate.videos``).

``eva export --incremental`` (``export_dataset(incremental=True)``) reads the published record
under the export lock. An episode whose fingerprint matches, at the same output path, and whose
published file still has the identity recorded, is hard-linked from the published pair into the
new staging directory (a reflink, then a copy, where a hard link cannot be made). An episode
whose *content* fingerprint matches a published one but whose numbering moved (a verdict change
earlier renumbers every later episode of both subsets) is copied from the published file and
patched by its format's ``EpisodeFormat.renumber`` (``EpisodePlan.renumber``; what is patched,
and checked first: ``eva.formats._renumber``), when the format can; every other episode is a
task for the executor. The subsets' common metadata is always rewritten. The staged pair is
then published exactly as a full export's, so the result is byte-identical to one.

The fingerprint (SHA-256 over canonical JSON; an episode's is its content's, ``episode_content``,
with its path and ``episode_numbering``: output index, index offset, task remap) covers:

- eva's version and this record's version (an upgrade rewrites everything);
- the format and its options (``ExportOptions`` without ``durable``);
- the task: subset, output and source index, path, length, index offset, task remap, the
  episode's ``episodes.jsonl`` row (verdict included), video keys, fps;
- the source's ``info.json`` without its totals and splits (features, fps, path templates), and
  its tasks;
- a v3 file: its episodes' fingerprints, its path, the episodes it holds, their stats, and
  whether it samples keyframes (``ShardTask.layout``); since the plan follows the source sizes
  in episode order, the files before the first changed episode keep all of it;
- each source file of the episode (its parquet, its videos) by its path below the source.

A fingerprint names the source files; the record keeps their identity apart (``sources``: path
-> size, mtime, ctime, inode, device; ``eva.dataset.identity``), and a task is reused only when
each of its source files, and each published file, still has the identity recorded. The ctime
is what sees a rewrite in place whose size, mtime and inode were put back. It also moves when a
link to the file is made or removed, which eva itself does: a v2.1 export hard-links the raw
MP4s, and an incremental one links the published files, then removes the old pair. So once the
new pair is published, ``settle_records`` brings the ctime of the files the pair holds (and of
the source files that are the same inode as one of them) up to date, when nothing else of their
identity changed; every other source file keeps the identity it had when the export planned.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from eva import __version__
from eva.dataset.atomic import atomic_write_json, read_json_object
from eva.dataset.errors import DatasetError
from eva.dataset.identity import Identity, file_identity, matches, same_but_ctime
from eva.dataset.reader import DatasetReader
from eva.dataset.share import copy_file
from eva.formats.base import ExportOptions
from eva.formats.tasks import EpisodeResult, EpisodeTask, ExportTask, Renumber, task_files

FINGERPRINTS = "fingerprints.json"  # in the export root, beside job.json
# 2: content and numbering apart; 3: source identities apart, with the ctime (older: rewritten)
FINGERPRINT_VERSION = 3
VIDEO_CHECKS = "video_checks.json"  # beside it: the source MP4s validation found intact
VIDEO_CHECKS_VERSION = 1  # [frames, size, mtime_ns, ctime_ns, inode, device] by path
# info.json fields that change when episodes are added: no episode file depends on them.
INFO_TOTALS = ("total_episodes", "total_frames", "total_videos", "total_chunks", "splits")
RENUMBER_THREADS = 2  # renumbered files copied and patched at a time


def output_identity(path: Path) -> list[int]:
    """A written episode file's identity, as the record keeps it (``OSError`` when gone)."""
    identity = file_identity(path)
    if identity is None:
        raise FileNotFoundError(errno.ENOENT, "cannot be stat'ed", str(path))
    return list(identity)


def source_files(reader: DatasetReader, task: ExportTask) -> list[str]:
    """The source files ``task``'s output is made of, by path below the source root: an
    episode's parquet and videos; a task over several episodes (a v3 shard), theirs."""
    episodes: Sequence[EpisodeTask] = (
        [task] if isinstance(task, EpisodeTask) else getattr(task, "episodes", ())
    )
    files: dict[str, None] = {}
    for episode in episodes:
        src = episode.source_index
        for path in (
            reader.data_path(src),
            *(reader.video_path(src, k) for k in episode.video_keys),
        ):
            files[Path(path).relative_to(reader.root).as_posix()] = None
    return list(files)


@dataclass(frozen=True)
class SourceContext:
    """What every episode's fingerprint shares: eva, the format and options, the source's
    metadata (one digest, computed once per export)."""

    digest: str

    @classmethod
    def of(cls, fmt: str, reader: DatasetReader, options: ExportOptions) -> SourceContext:
        opts = {k: v for k, v in dataclasses.asdict(options).items() if k != "durable"}
        info = {k: v for k, v in reader.info.items() if k not in INFO_TOTALS}
        shared = {
            "eva": __version__,
            "version": FINGERPRINT_VERSION,
            "format": fmt,
            "format_options": type(options.format).__name__ if options.format else None,
            "options": opts,
            "info": info,
            "tasks": {str(k): v for k, v in sorted(reader.tasks.items())},
        }
        return cls(_digest(shared))


def episode_numbering(task: EpisodeTask) -> dict[str, Any]:
    """What of an episode's fingerprint is its numbering: its output index (and the path and
    row field that follow it), its global index offset and the subset's task remap."""
    return {
        "index": task.index,
        "row_episode_index": task.row.get("episode_index"),
        "index_offset": task.index_offset,
        "task_remap": sorted(task.task_remap.items()),
    }


def episode_content(context: SourceContext, reader: DatasetReader, task: EpisodeTask) -> str:
    """The fingerprint of what ``task``'s file holds apart from its numbering: two tasks with
    the same content make files that differ only where ``episode_numbering`` shows."""
    src = task.source_index
    return _digest(
        {
            "context": context.digest,
            "subset": task.subset,
            "source_index": src,
            "length": task.length,
            "row": {k: v for k, v in task.row.items() if k != "episode_index"},
            "video_keys": task.video_keys,
            "fps": task.fps,
            "files": source_files(reader, task),
            # the kept frames of a trimmed episode (an untrimmed one's fingerprint is as before)
            **({"trim": list(task.trim)} if task.trim is not None else {}),
        }
    )


def episode_fingerprint(
    context: SourceContext, reader: DatasetReader, task: EpisodeTask, content: str | None = None
) -> str:
    """The fingerprint of ``task``'s output file (module docstring: what it covers): its
    content's (``content``, when computed already) with its path and numbering."""
    if content is None:
        content = episode_content(context, reader, task)
    return _digest({"content": content, "path": task.path, **episode_numbering(task)})


def task_fingerprint(
    context: SourceContext,
    reader: DatasetReader,
    task: ExportTask,
    known: dict[int, str] | None = None,
) -> str:
    """The fingerprint of ``task``'s output files: an episode's (``episode_fingerprint``), or,
    for a task over several episodes (a v3 shard), their fingerprints with the task's file and
    its ``layout`` (what the file depends on beyond its episodes). ``known``: episode
    fingerprints by ``id`` of their task, kept across calls (a v3 subset's data file and video
    files hold the same episode tasks: each is fingerprinted, and its files stat'ed, once)."""
    if isinstance(task, EpisodeTask):
        return episode_fingerprint(context, reader, task)
    known = {} if known is None else known
    episodes: Sequence[EpisodeTask] = getattr(task, "episodes", ())
    fingerprints = []
    for episode in episodes:
        if id(episode) not in known:
            known[id(episode)] = episode_fingerprint(context, reader, episode)
        fingerprints.append(known[id(episode)])
    return _digest(
        {
            "subset": task.subset,
            "path": task.path,
            "episodes": fingerprints,
            "layout": getattr(task, "layout", None),
        }
    )


def _digest(value: object) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ---- the record ---------------------------------------------------------------------------------


def record_key(task: ExportTask) -> str:
    return f"{task.subset}/{task.path}"


def read_fingerprints(root: Path) -> dict[str, dict[str, Any]]:
    """The published pair's record (empty when there is none, or it does not parse: then
    nothing is reused)."""
    return _read_record(Path(root) / FINGERPRINTS, FINGERPRINT_VERSION, "episodes")


def read_sources(root: Path) -> dict[str, Any]:
    """The identities of the source files the published pair was made of, by path below the
    source (empty when unrecorded: then nothing is reused)."""
    return _read_record(Path(root) / FINGERPRINTS, FINGERPRINT_VERSION, "sources")


def _read_record(path: Path, version: int, key: str) -> dict[str, Any]:
    """``path``'s ``key`` object when the file parses and has ``version``, else empty."""
    data = _read_json(path)
    if data.get("version") != version:
        return {}
    found = data.get(key)
    return found if isinstance(found, dict) else {}


def fingerprint_entry(
    fingerprint: str, task: ExportTask, result: EpisodeResult, content: str | None = None
) -> dict[str, Any]:
    """The record of ``task``'s written files: the fingerprint, each file's identity (its first
    under ``file``, the others under ``other_files``) and what its result reports; an episode
    task's also its ``content`` fingerprint and its ``numbering`` (what a renumbered reuse
    needs to know of the published file)."""
    first, *others = task_files(task)
    entry: dict[str, Any] = {
        "fingerprint": fingerprint,
        "file": output_identity(task.subset_dir / first),
        **result.record(),
    }
    if others:
        entry["other_files"] = {rel: output_identity(task.subset_dir / rel) for rel in others}
    if content is not None and isinstance(task, EpisodeTask):
        entry["content"] = content
        entry["numbering"] = episode_numbering(task)
    return entry


def write_fingerprints(
    staging: Path, entries: Mapping[str, dict[str, Any]], sources: Mapping[str, Identity]
) -> None:
    """The record: ``entries`` by record key, ``sources``: the identity of each source file
    when the export planned (``EpisodePlan.sources``)."""
    atomic_write_json(
        Path(staging) / FINGERPRINTS,
        {
            "version": FINGERPRINT_VERSION,
            "episodes": dict(entries),
            "sources": {rel: list(identity) for rel, identity in sorted(sources.items())},
        },
        durable=False,
    )


def read_video_checks(root: Path) -> dict[str, Any]:
    """The published pair's record of the source MP4s its validation found intact (empty when
    there is none or it does not parse: then every MP4 is inspected)."""
    return _read_record(Path(root) / VIDEO_CHECKS, VIDEO_CHECKS_VERSION, "videos")


def write_video_checks(staging: Path, videos: Mapping[str, list[int]]) -> None:
    """``videos``: path below the source -> [size, mtime_ns, ctime_ns, inode, device]
    (``eva.dataset.validate.videos.VideoInspections.inspected``)."""
    atomic_write_json(
        Path(staging) / VIDEO_CHECKS,
        {"version": VIDEO_CHECKS_VERSION, "videos": dict(sorted(videos.items()))},
        durable=False,
    )


# ---- reuse --------------------------------------------------------------------------------------


def published_intact(root: Path, key: str, entry: Mapping[str, Any], files: Sequence[str]) -> bool:
    """Whether the published files ``files`` of the record ``key`` (``<subset>/<path>``) are
    the ones recorded: same set, each with its recorded identity (not replaced or touched)."""
    subset, _, first = key.partition("/")
    recorded = {first: entry.get("file"), **(entry.get("other_files") or {})}
    if set(recorded) != set(files):
        return False
    return all(
        matches(identity, file_identity(Path(root) / subset / rel))
        for rel, identity in recorded.items()
    )


def sources_intact(
    recorded: Mapping[str, Any], current: Mapping[str, Identity | None], files: Sequence[str]
) -> bool:
    """Whether each source file of ``files`` has the identity ``recorded`` (the published
    pair's ``sources``) now (``current``)."""
    return all(matches(recorded.get(rel), current.get(rel)) for rel in files)


def reusable(
    root: Path, published: Mapping[str, dict[str, Any]], task: ExportTask, fingerprint: str
) -> dict[str, Any] | None:
    """The published entry of ``task`` when its files can be reused as they are (the caller
    checks the source files: ``sources_intact``), else None."""
    key = record_key(task)
    entry = published.get(key)
    if not isinstance(entry, dict) or entry.get("fingerprint") != fingerprint:
        return None
    return entry if published_intact(root, key, entry, task_files(task)) else None


def previous_task(task: EpisodeTask, key: str, entry: Mapping[str, Any]) -> EpisodeTask:
    """``task`` as the published record ``key`` numbered it (the same content): its index,
    row index, index offset, task remap and path. ``ValueError`` for a record that does not
    say so."""
    subset, _, path = key.partition("/")
    numbering = entry.get("numbering")
    parts = PurePosixPath(path).parts
    if (
        subset != task.subset
        or not isinstance(numbering, dict)
        or not parts
        or path.startswith("/")
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise ValueError(f"{key}: no numbering, or not a file of the subset")
    index, offset = numbering.get("index"), numbering.get("index_offset")
    remap = numbering.get("task_remap")
    if not isinstance(index, int) or not isinstance(offset, int) or not isinstance(remap, list):
        raise ValueError(f"{key}: numbering")
    row = dict(task.row)
    if "episode_index" in row or numbering.get("row_episode_index") is not None:
        row["episode_index"] = numbering.get("row_episode_index")
    return dataclasses.replace(
        task,
        index=index,
        index_offset=offset,
        task_remap={int(old): int(new) for old, new in remap},
        row=row,
        path=path,
    )


def link_published(root: Path, task: ExportTask) -> None:
    """The published files of ``task`` into the staging directory: a hard link, else a
    reflink, else a copy (the bytes are the same whichever)."""
    for rel in task_files(task):
        link_file(Path(root) / task.subset / rel, task.subset_dir / rel)


def link_file(published: Path, staged: Path) -> None:
    staged.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(published, staged)
        return
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise DatasetError(f"{staged}: cannot link {published} ({e.strerror})") from None
    copy_file(published, staged)  # a reflink where the filesystem has them, else a copy
    with contextlib.suppress(OSError):
        shutil.copystat(published, staged)


@dataclass
class EpisodePlan:
    """Which tasks an export writes, which it links (``reused``) and which it may copy and
    patch (``renumbered``: the published file of the same content, numbered otherwise), with
    every task's fingerprint (and an episode task's content fingerprint) and the identity of
    every source file as the plan found it (``sources``, for the record)."""

    fingerprints: dict[str, str]  # record key -> fingerprint
    contents: dict[str, str]  # record key -> content fingerprint (episode tasks)
    reused: dict[int, dict[str, Any]]  # task number -> published entry
    renumbered: dict[int, tuple[str, dict[str, Any]]]  # task number -> published key, entry
    rewrite: list[int]  # task numbers to run
    sources: dict[str, Identity] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(
        cls,
        fmt: str,
        reader: DatasetReader,
        tasks: Sequence[ExportTask],
        options: ExportOptions,
        root: Path,
        incremental: bool,
        renumbers: bool = False,
    ) -> EpisodePlan:
        """``fmt``: the format's name; ``renumbers``: the format can patch a published episode
        file's numbering."""
        context = SourceContext.of(fmt, reader, options)
        published = read_fingerprints(root) if incremental else {}
        recorded = read_sources(root) if published else {}
        by_content = {
            entry["content"]: key
            for key, entry in published.items()
            if isinstance(entry, dict) and isinstance(entry.get("content"), str)
        }
        plan = cls({}, {}, {}, {}, [])
        known: dict[int, str] = {}  # the tasks (and so their episodes) live through the loop
        for number, task in enumerate(tasks):
            key = record_key(task)
            files = source_files(reader, task)
            for rel in files:
                if rel not in plan.sources:
                    identity = file_identity(reader.root / rel)
                    if identity is not None:
                        plan.sources[rel] = identity
            same_sources = sources_intact(recorded, plan.sources, files)
            content = None
            if isinstance(task, EpisodeTask):
                content = plan.contents[key] = episode_content(context, reader, task)
                fingerprint = episode_fingerprint(context, reader, task, content)
            else:
                fingerprint = task_fingerprint(context, reader, task, known)
            plan.fingerprints[key] = fingerprint
            entry = reusable(root, published, task, fingerprint) if same_sources else None
            if entry is not None:
                plan.reused[number] = entry
                continue
            old_key = by_content.get(content) if renumbers and content is not None else None
            if (
                old_key is not None
                and same_sources
                and not task.other_files
                and published_intact(root, old_key, published[old_key], [old_key.partition("/")[2]])
            ):
                plan.renumbered[number] = (old_key, published[old_key])
            else:
                plan.rewrite.append(number)
        return plan

    def renumber(
        self,
        renumber: Renumber,
        reader: DatasetReader,
        root: Path,
        tasks: Sequence[ExportTask],
    ) -> dict[int, EpisodeResult]:
        """The ``renumbered`` tasks' files copied from the published pair and patched by the
        format's ``renumber``; a task it cannot patch (or whose record does not say how it
        was numbered) moves to ``rewrite``. Returns the results by task number."""

        def copy_and_patch(number: int) -> EpisodeResult | None:
            task = tasks[number]
            if not isinstance(task, EpisodeTask):
                return None
            key, entry = self.renumbered[number]
            try:
                previous = previous_task(task, key, entry)
            except (ValueError, TypeError):
                return None  # a record that does not say how the file was numbered
            return renumber(reader, task, previous, Path(root) / key)

        numbers = sorted(self.renumbered)
        results: dict[int, EpisodeResult] = {}
        # The copies run in the kernel, the GIL released: two at a time measured 1.6x one.
        with ThreadPoolExecutor(RENUMBER_THREADS, thread_name_prefix="eva-renumber") as pool:
            for number, result in zip(numbers, pool.map(copy_and_patch, numbers), strict=True):
                if result is None:
                    self.rewrite.append(number)
                else:
                    results[number] = result
        for number in self.rewrite:
            self.renumbered.pop(number, None)
        self.rewrite.sort()
        return results


# ---- after publication --------------------------------------------------------------------------


def settle_records(root: Path, source: Path) -> None:
    """The published pair's records brought up to date after the links eva made and removed
    while publishing it (module docstring): the recorded ctime of each file of the pair, and of
    each source file that is the same inode as one of them, replaced by its ctime now, where
    the rest of its identity is the one recorded. Any other change keeps the record as it was
    (the file is read again next time). Never raises: the pair is published already, and a
    record left as it was only costs that re-read."""
    with contextlib.suppress(Exception):
        _settle_records(Path(root), Path(source))


def _settle_records(root: Path, source: Path) -> None:
    data = _read_json(root / FINGERPRINTS)
    entries = data.get("episodes") if data.get("version") == FINGERPRINT_VERSION else None
    pair: set[tuple[int, int]] = set()  # (device, inode) of every file of the pair
    changed = False
    for key, entry in (entries if isinstance(entries, dict) else {}).items():
        subset = key.partition("/")[0]
        if not isinstance(entry, dict) or subset not in ("accepted", "rejected"):
            continue
        files = {key.partition("/")[2]: entry.get("file"), **(entry.get("other_files") or {})}
        for rel, recorded in files.items():
            current = file_identity(root / subset / rel)
            if current is None or not same_but_ctime(recorded, current):
                continue
            pair.add((current[4], current[3]))
            if not matches(recorded, current):
                if rel == key.partition("/")[2]:
                    entry["file"] = list(current)
                else:
                    entry["other_files"][rel] = list(current)
                changed = True
    sources = data.get("sources") if isinstance(entries, dict) else None
    if isinstance(sources, dict):
        changed |= _settle_paths(source, sources, pair, lambda recorded: recorded)
    if changed:
        atomic_write_json(root / FINGERPRINTS, data, durable=False)
    checks = _read_json(root / VIDEO_CHECKS)
    videos = checks.get("videos") if checks.get("version") == VIDEO_CHECKS_VERSION else None
    if isinstance(videos, dict) and _settle_paths(source, videos, pair, lambda r: r[1:]):
        atomic_write_json(root / VIDEO_CHECKS, checks, durable=False)


def _settle_paths(
    source: Path,
    records: dict[str, Any],
    pair: set[tuple[int, int]],
    identity_of: Callable[[list[Any]], list[Any]],
) -> bool:
    """``records`` (path below ``source`` -> a list ending in an identity) settled in place
    for the source files that are files of the pair; whether any was."""
    changed = False
    for rel, recorded in records.items():
        if not isinstance(recorded, list) or len(recorded) < 5:
            continue
        parts = PurePosixPath(rel).parts
        if rel.startswith("/") or any(part in ("", ".", "..") for part in parts):
            continue
        current = file_identity(source / rel)
        old = identity_of(recorded)
        if current is None or (current[4], current[3]) not in pair:
            continue
        if same_but_ctime(old, current) and not matches(old, current):
            recorded[len(recorded) - 5 :] = list(current)
            changed = True
    return changed


def _read_json(path: Path) -> dict[str, Any]:
    """The record at ``path``, empty when there is none or it is not one eva wrote: a link or a
    FIFO there, not JSON for any reason, a NaN (strict: ``_settle_records`` writes it back)."""
    try:
        return read_json_object(path, strict=True)
    except (OSError, DatasetError):
        return {}
