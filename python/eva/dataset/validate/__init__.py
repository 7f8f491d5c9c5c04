"""Check a raw LeRobot v2.1 dataset before anything is exported from it.

``validate_dataset`` reports EVERY problem it finds (not just the first) as ``Problem`` records
with a stable ``code``, a one-line ``message`` naming the file / episode / field, the ``path`` at
fault and the ``episode`` (or None). Only a missing/unreadable info.json or episodes.jsonl stops
the walk early, since nothing else can be interpreted without them.

Codes: missing_info, invalid_info, missing_episodes, invalid_episodes, bad_codebase_version,
bad_dataset_format, invalid_tasks, duplicate_episode_index, invalid_episode_row, empty_episode,
missing_parquet, unreadable_parquet, missing_column, wrong_episode_index, unknown_task_index,
bad_frame_index, index_not_contiguous, timestamp_off_grid, length_mismatch, missing_video,
unreadable_video, frame_count_mismatch, missing_stats, invalid_episodes_stats, totals_mismatch,
torn_jsonl_tail, unsafe_path, wrong_column_type, null_values, non_finite_values,
undecodable_video, invalid_text.

Every feature column of every episode table is checked against info.json before anything is
exported: present, of the arrow type its ``dtype`` names (the bookkeeping columns index,
episode_index, frame_index and task_index int64, timestamp a float), lists of exactly ``shape``
values, no nulls, and no NaN/inf in float columns (``non_finite_values``, which an export refuses
unless asked to carry them). The types come from the parquet footer; values are read only for
what the footer cannot tell (variable-length lists, nulls, NaN/inf). Every MP4 is inspected
(``eva.dataset.decode_check.inspect_video``: every sample's framing, the first keyframe decoded)
on worker threads while the parquet checks run: an overwritten ``mdat`` with an intact ``moov``
fails here, not in the exported pair.

The checks live beside this module by concern: ``meta`` (info.json, jsonl files, stats, totals),
``table`` (one episode's parquet table), ``videos`` (the MP4 inspections), and ``problems`` (the
``Problem`` record and its collector, shared with the export verifiers).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from eva.dataset import fsafe, layout, video
from eva.dataset.errors import DatasetError, UnsafePathError
from eva.dataset.reader import DatasetReader, parquet_file
from eva.dataset.validate.meta import (
    check_episodes_stats,
    check_global_index,
    check_image_histograms,
    check_info,
    check_review_fields,
    check_text,
    check_torn_tails,
    check_totals,
    more_info_problems,
    read_meta,
    safe_video_keys,
)
from eva.dataset.validate.problems import Problem, ProblemCollector
from eva.dataset.validate.table import REQUIRED_COLUMNS, check_table
from eva.dataset.validate.videos import VideoInspections

__all__ = [
    "Problem",
    "ProblemCollector",
    "REQUIRED_COLUMNS",
    "Validation",
    "start_validation",
    "validate_dataset",
]


class Validation:
    """A validation whose walk is done and whose MP4 checks may still be running on the
    inspection threads (``start_validation``). ``found``: the problems of the checks that have
    run; ``complete()`` waits for the others and returns every problem in walk order, exactly
    what ``validate_dataset`` returns. ``close()`` (or leaving the ``with`` block) stops the
    inspections not yet started."""

    def __init__(self, out: ProblemCollector, videos: VideoInspections | None = None) -> None:
        self._out = out
        self._videos = videos
        self._closed = False  # the inspections stay readable (``inspected``) once closed

    def inspected(self) -> dict[str, list[int]]:
        """The MP4s found intact (``VideoInspections.inspected``; waits for them)."""
        return self._videos.inspected() if self._videos is not None else {}

    @property
    def found(self) -> list[Problem]:
        return list(self._out.problems)

    @property
    def waiting(self) -> bool:
        """Whether some checks wait on inspections (``complete`` may block)."""
        return self._out.unsettled

    def complete(self) -> list[Problem]:
        try:
            return self._out.settle()
        finally:
            self.close()

    def close(self) -> None:
        if self._videos is not None and not self._closed:
            self._closed = True
            self._videos.__exit__(None, None, None)

    def __enter__(self) -> Validation:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def validate_dataset(
    root: Path | str,
    decode: bool = False,
    *,
    on_episode: Callable[[int, int], None] | None = None,
    on_table: Callable[[int, pa.Table], None] | None = None,
    reader: DatasetReader | None = None,
    dataset_format: str | None = None,
) -> list[Problem]:
    """All problems of the v2.1 dataset at ``root`` (empty list: valid).

    ``reader``: validate what that reader has read (or reads) of ``root``, so that a caller that
    goes on using the reader (the export) sees the same snapshot of the metadata files as the
    validation did, even while a capture appends episodes.

    ``decode=True`` also decodes every video to count its frames (slow, exact); otherwise the
    container's frame count is used. ``on_episode(done, total)`` reports progress.
    ``dataset_format``: the name info.json's ``dataset_format`` must have where present (the
    catalogue's raw layout; None: the field is not checked).
    ``on_table(episode, table)`` receives the index columns each check read (those of
    episode_index, task_index, index, frame_index, timestamp the file has), so a caller that needs
    them (the export's task remap) does not read every parquet a second time.
    """
    with start_validation(
        root,
        decode,
        on_episode=on_episode,
        on_table=on_table,
        reader=reader,
        dataset_format=dataset_format,
    ) as validation:
        return validation.complete()


def start_validation(
    root: Path | str,
    decode: bool = False,
    *,
    on_episode: Callable[[int, int], None] | None = None,
    on_table: Callable[[int, pa.Table], None] | None = None,
    reader: DatasetReader | None = None,
    known_videos: Mapping[str, Any] | None = None,
    dataset_format: str | None = None,
) -> Validation:
    """``validate_dataset``'s walk, returned as soon as only the MP4 inspections may still be
    running: a caller with other work (the export writing its staged pair) does it meanwhile,
    then ``complete()`` gives the same problems ``validate_dataset`` would have. Arguments as
    there; ``known_videos``: MP4s an earlier validation found intact (its ``inspected()``),
    not inspected again while their identity is the recorded one."""
    root = Path(root)
    out = ProblemCollector()
    if not root.is_dir():
        out.add("missing_info", f"{root}: not a directory", root)
        return Validation(out)
    try:  # the shared containment check: a link or FIFO in meta/, .eva-work/, data/, videos/
        fsafe.check_dataset_tree(root, episode_files=True)
    except DatasetError as e:
        out.add("unsafe_path", str(e), root)
        return Validation(out)
    if reader is None:
        reader = DatasetReader(root)
    info_path = root / layout.INFO
    info = read_meta(out, info_path, "info", lambda: reader.info)
    if info is not None:
        check_info(info, info_path, out, dataset_format)
    elif out.has("invalid_info"):
        more_info_problems(reader, info_path, out)
    episodes_path = root / layout.EPISODES
    episodes: list[dict[str, Any]] | None = read_meta(
        out, episodes_path, "episodes", lambda: reader.episodes
    )
    if out.problems and (episodes is None or not info_path.exists() or out.has("invalid_info")):
        return Validation(out)

    check_torn_tails(root, out)
    try:
        tasks = reader.tasks
    except DatasetError as e:
        out.add("invalid_tasks", str(e), root / layout.TASKS)
        tasks = None
    try:
        episodes_stats = reader.episodes_stats
    except DatasetError as e:
        out.add("invalid_episodes_stats", str(e), root / layout.EPISODES_STATS)
        episodes_stats = {}
    check_episodes_stats(reader, episodes_stats, out)

    assert episodes is not None
    video_keys = safe_video_keys(reader, out)
    videos = VideoInspections(reader, episodes, video_keys, not decode, known_videos)
    checks = _EpisodeChecks(
        reader, tasks, episodes_stats, video_keys, decode, out, on_table, videos
    )
    try:
        _check_episodes(checks, root, info_path, episodes_path, episodes, on_episode)
    except BaseException:
        videos.__exit__(None, None, None)
        raise
    return Validation(out, videos)


@dataclass(frozen=True)
class _EpisodeChecks:
    """What the checks of every episode share: the dataset's reader and metadata, how videos are
    checked, and where problems (and the index columns read) go."""

    reader: DatasetReader
    tasks: dict[int, str] | None
    episodes_stats: dict[int, Any]
    video_keys: list[str]
    decode: bool
    out: ProblemCollector
    on_table: Callable[[int, pa.Table], None] | None
    videos: VideoInspections


def _check_episodes(
    checks: _EpisodeChecks,
    root: Path,
    info_path: Path,
    episodes_path: Path,
    episodes: list[dict[str, Any]],
    on_episode: Callable[[int, int], None] | None,
) -> None:
    out = checks.out
    seen: set[int] = set()
    total_frames = 0
    numbering: list[tuple[int, int | None, int | None]] = []
    check_text(checks.reader, episodes, checks.tasks, out)
    for done, row in enumerate(episodes, 1):
        ep = row["episode_index"]
        if ep in seen:
            out.add(
                "duplicate_episode_index",
                f"{episodes_path}: episode_index {ep} appears more than once",
                episodes_path,
                ep,
            )
            continue
        seen.add(ep)
        check_review_fields(root, row, ep, out)
        length = _row_length(row.get("length"), episodes_path, ep, out)
        total_frames += length or 0
        rows, first_index = _check_episode(checks, ep, length)
        numbering.append((ep, rows, first_index))
        if on_episode is not None:
            on_episode(done, len(episodes))

    check_global_index(checks.reader, numbering, out)
    check_image_histograms(checks.reader, out)
    check_totals(checks.reader, root, info_path, len(seen), total_frames, out)


def _row_length(length: Any, episodes_path: Path, ep: int, out: ProblemCollector) -> int | None:
    """An episodes row's length, or None (reported) when it is not an int >= 0."""
    if not isinstance(length, int) or isinstance(length, bool) or length < 0:
        out.add(
            "invalid_episode_row",
            f"{episodes_path}: episode {ep}: field length {length!r} is not an int >= 0",
            episodes_path,
            ep,
        )
        return None
    if length == 0:
        out.add(
            "empty_episode",
            f"{episodes_path}: episode {ep} has length 0",
            episodes_path,
            ep,
        )
    return length


def _check_episode(
    checks: _EpisodeChecks, ep: int, length: int | None
) -> tuple[int | None, int | None]:
    """Checks of one episode; returns (parquet rows, first global index) where known."""
    try:
        data_path = checks.reader.data_path(ep)
    except DatasetError as e:
        checks.out.add("unsafe_path", str(e), None, ep)
        return None, None
    rows, first_index, columns = _check_parquet(checks, ep, length, data_path)
    _check_videos(checks, ep, rows)
    _check_stats_present(checks, ep, rows, columns)
    return rows, first_index


def _check_parquet(
    checks: _EpisodeChecks, ep: int, length: int | None, data_path: Path
) -> tuple[int | None, int | None, set[str]]:
    """One episode's table: (rows, first global index, column names), each where known."""
    out = checks.out
    rows: int | None = None
    first_index: int | None = None
    columns: set[str] = set()
    parquet: pq.ParquetFile | None = None
    source: BinaryIO | None = None
    try:  # opened now beneath the root (no link on its way), read from that open file
        source = checks.reader.open_file(data_path)
    except FileNotFoundError:
        out.add("missing_parquet", f"{data_path}: episode {ep} parquet missing", data_path, ep)
    except UnsafePathError as e:
        out.add("unsafe_path", str(e), data_path, ep)
    except DatasetError as e:  # not a regular file, EACCES: names the file
        out.add("unreadable_parquet", str(e), data_path, ep)
    if source is not None:
        # Row count and schema come from the footer; only the index columns are read below.
        try:
            parquet = parquet_file(source)
            rows = parquet.metadata.num_rows
            columns = set(parquet.schema_arrow.names)
        except (pa.ArrowInvalid, OSError) as e:
            out.add("unreadable_parquet", f"{data_path}: episode {ep}: {e}", data_path, ep)
    try:
        if rows is not None:
            assert parquet is not None
            first_index = check_table(
                checks.reader,
                parquet,
                data_path,
                ep,
                rows,
                columns,
                checks.tasks,
                out,
                checks.on_table,
            )
    finally:
        if source is not None:
            source.close()
    if rows is not None:
        if length is not None and rows != length:
            out.add(
                "length_mismatch",
                f"{data_path}: episode {ep} has {rows} rows, episodes.jsonl length is {length}",
                data_path,
                ep,
            )
        if rows == 0 and length != 0:
            out.add("empty_episode", f"{data_path}: episode {ep} has no rows", data_path, ep)
    return rows, first_index, columns


def _check_videos(checks: _EpisodeChecks, ep: int, rows: int | None) -> None:
    """Each camera's MP4 of episode ``ep``: present, and (with the rows known) as many frames."""
    out = checks.out
    for key in checks.video_keys:
        try:
            video_path = checks.reader.video_path(ep, key)
        except DatasetError as e:
            out.add("unsafe_path", str(e), None, ep)
            continue
        if not video_path.exists():
            out.add(
                "missing_video",
                f"{video_path}: episode {ep} camera {key} video missing",
                video_path,
                ep,
            )
            continue
        if rows is None:
            continue
        mp4 = checks.reader.file_beneath(video_path)
        check = functools.partial(_check_frames, mp4, ep, key, rows, checks.decode, checks.videos)
        if checks.decode:
            check(out)
        else:  # the inspection may still be running: its problems keep their place
            out.later(check)


def _check_stats_present(
    checks: _EpisodeChecks, ep: int, rows: int | None, columns: set[str]
) -> None:
    """Every feature needs stats: from the per-episode stats, or computable from the table."""
    reader = checks.reader
    stats = checks.episodes_stats.get(ep) or {}
    for feature, spec in reader.features.items():
        if feature in stats or not isinstance(spec, dict):
            continue
        if spec.get("dtype") not in ("video",) and feature in columns:
            continue
        if rows is None and spec.get("dtype") != "video":
            continue  # the table problem is already reported
        where = reader.root / layout.EPISODES_STATS
        checks.out.add(
            "missing_stats",
            f"{where}: episode {ep}: no stats for feature {feature} and no such column in the table",
            where,
            ep,
        )


def _check_frames(
    source: fsafe.FileBeneath,
    ep: int,
    key: str,
    rows: int,
    decode: bool,
    videos: VideoInspections | None,
    out: ProblemCollector,
) -> None:
    """One MP4 against its episode's rows: readable, as many frames, and (inspected) intact."""
    damaged: str | None = None
    video_path = source.path
    try:
        if decode or videos is None:
            count = video.count_decoded_frames if decode else video.count_frames
            frames = count(source)
        else:
            frames, damaged = videos.result(video_path)
    except DatasetError as e:
        out.add("unreadable_video", f"{e} (episode {ep} camera {key})", video_path, ep)
        return
    if frames != rows:
        how = "decoded" if decode else "container"
        out.add(
            "frame_count_mismatch",
            f"{video_path}: episode {ep} camera {key} has {frames} frames ({how}), "
            f"parquet has {rows} rows",
            video_path,
            ep,
        )
    elif damaged is not None:  # decode=True has decoded every frame already
        out.add("undecodable_video", f"{damaged} (episode {ep} camera {key})", video_path, ep)
