"""Check a raw LeRobot v2.1 dataset before anything is exported from it (description: "Shared
validation and verification"; contracts §1).

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
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from eva.dataset import atomic, decode_check, fsafe, layout, video
from eva.dataset.columns import (
    distinct_scalars,
    list_lengths,
    list_parent_indices,
    list_values,
)
from eva.dataset.errors import DatasetError, one_line
from eva.dataset.reader import DatasetReader

__all__ = ["Problem", "validate_dataset", "REQUIRED_COLUMNS"]

REQUIRED_COLUMNS = ("episode_index", "index")
# Bookkeeping columns LeRobot stores as int64 whatever info.json says.
INT64_COLUMNS = ("index", "episode_index", "frame_index", "task_index")
# info.json dtype -> the arrow type of the column's values.
_ARROW_DTYPES: dict[str, pa.DataType] = {
    "float16": pa.float16(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "bool": pa.bool_(),
    "string": pa.string(),
}
_NUMBERING_COLUMNS = (*INT64_COLUMNS, "timestamp")
# Tells an interrupted save (committed rows ahead of info.json) how to repair it.
REPAIR_HINT = "run eva cleanup {root} to repair the metadata after an interrupted save"
# LeRobot's default tolerance for timestamp vs frame_index / fps.
TIMESTAMP_TOLERANCE_S = 1e-4
# Threads that inspect MP4s (framing, keyframe decode) while the episode loop checks parquet.
VIDEO_CHECK_THREADS = 2


@dataclass(frozen=True)
class Problem:
    code: str
    message: str
    path: str | None = None
    episode: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


class _Collector:
    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def add(
        self, code: str, message: str, path: Path | str | None = None, episode: int | None = None
    ) -> None:
        # one line: messages can carry a library's multi-line text (pyarrow, FFmpeg)
        self.problems.append(
            Problem(code, one_line(message), str(path) if path is not None else None, episode)
        )


def validate_dataset(
    root: Path | str,
    decode: bool = False,
    *,
    on_episode: Callable[[int, int], None] | None = None,
    on_table: Callable[[int, pa.Table], None] | None = None,
    reader: DatasetReader | None = None,
) -> list[Problem]:
    """All problems of the v2.1 dataset at ``root`` (empty list: valid).

    ``reader``: validate what that reader has read (or reads) of ``root``, so that a caller that
    goes on using the reader (the export) sees the same snapshot of the metadata files as the
    validation did, even while a capture appends episodes.

    ``decode=True`` also decodes every video to count its frames (slow, exact); otherwise the
    container's frame count is used. ``on_episode(done, total)`` reports progress.
    ``on_table(episode, table)`` receives the index columns each check read (those of
    episode_index, task_index, index, frame_index, timestamp the file has), so a caller that needs
    them (the export's task remap) does not read every parquet a second time.
    """
    root = Path(root)
    out = _Collector()
    if not root.is_dir():
        out.add("missing_info", f"{root}: not a directory", root)
        return out.problems
    try:  # the shared containment check: a link or FIFO in meta/, .eva-work/, data/, videos/
        fsafe.check_dataset_tree(root, episode_files=True)
    except DatasetError as e:
        out.add("unsafe_path", str(e), root)
        return out.problems
    if reader is None:
        reader = DatasetReader(root)
    info_path = root / layout.INFO
    info = _read_meta(out, info_path, "info", lambda: reader.info)
    if info is not None:
        _check_info(info, info_path, out)
    elif _has(out, "invalid_info"):
        _more_info_problems(reader, info_path, out)
    episodes_path = root / layout.EPISODES
    episodes: list[dict[str, Any]] | None = _read_meta(
        out, episodes_path, "episodes", lambda: reader.episodes
    )
    if out.problems and (episodes is None or not info_path.exists() or _has(out, "invalid_info")):
        return out.problems

    for rel in (layout.EPISODES, layout.EPISODES_STATS, layout.TASKS, layout.IMAGE_HISTOGRAMS):
        path = root / rel
        if atomic.has_torn_tail(path):
            out.add(
                "torn_jsonl_tail",
                f"{path}: ends in a torn fragment of an interrupted append (eva ignores it; other "
                "readers may not); opening the dataset with the eva writer repairs it",
                path,
            )
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
    _check_episodes_stats(reader, episodes_stats, out)

    assert episodes is not None
    video_keys = _safe_video_keys(reader, out)
    with _VideoInspections(reader, episodes, video_keys, enabled=not decode) as videos:
        return _check_episodes(
            reader, root, info_path, episodes_path, episodes, tasks, episodes_stats, video_keys,
            decode, out, on_episode, on_table, videos,
        )  # fmt: skip


def _check_episodes(
    reader: DatasetReader,
    root: Path,
    info_path: Path,
    episodes_path: Path,
    episodes: list[dict[str, Any]],
    tasks: dict[int, str] | None,
    episodes_stats: dict[int, Any],
    video_keys: list[str],
    decode: bool,
    out: _Collector,
    on_episode: Callable[[int, int], None] | None,
    on_table: Callable[[int, pa.Table], None] | None,
    videos: _VideoInspections,
) -> list[Problem]:
    seen: set[int] = set()
    total_frames = 0
    numbering: list[tuple[int, int | None, int | None]] = []
    _check_text(reader, episodes, tasks, out)
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
        length = row.get("length")
        if not isinstance(length, int) or isinstance(length, bool) or length < 0:
            out.add(
                "invalid_episode_row",
                f"{episodes_path}: episode {ep}: field length {length!r} is not an int >= 0",
                episodes_path,
                ep,
            )
            length = None
        else:
            total_frames += length
            if length == 0:
                out.add(
                    "empty_episode",
                    f"{episodes_path}: episode {ep} has length 0",
                    episodes_path,
                    ep,
                )
        rows, first_index = _check_episode(
            reader,
            ep,
            length,
            tasks,
            episodes_stats.get(ep),
            video_keys,
            decode,
            out,
            on_table,
            videos,
        )
        numbering.append((ep, rows, first_index))
        if on_episode is not None:
            on_episode(done, len(episodes))

    _check_global_index(reader, numbering, out)
    _check_image_histograms(reader, out)
    info = reader.info
    expected = {"total_episodes": len(seen), "total_frames": total_frames}
    if any(isinstance(info.get(k), int) and info[k] < v for k, v in expected.items()):
        info = _settled_info(info_path, expected, info)
    for key, value in expected.items():
        if key in info and info[key] != value:
            # Committed rows ahead of info.json: a save died after its commit point.
            hint = (
                f" ({REPAIR_HINT.format(root=root)})"
                if isinstance(info[key], int) and info[key] < value
                else ""
            )
            out.add(
                "totals_mismatch",
                f"{info_path}: field {key} is {info[key]!r}, episodes.jsonl gives {value}{hint}",
                info_path,
            )
    return out.problems


# How long a running save may take to rewrite info.json after its commit point.
SETTLE_TIMEOUT_S = 0.5


def _settled_info(path: Path, expected: dict[str, int], info: dict[str, Any]) -> dict[str, Any]:
    """info.json read again when the snapshot's committed rows are ahead of it: a running save
    rewrites it right after its commit point, so a read shortly after catches up (or runs ahead
    with the next episode). Still behind after SETTLE_TIMEOUT_S: an interrupted save."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        try:
            fresh = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            return info
        if not isinstance(fresh, dict):
            return info
        behind = [
            k for k, v in expected.items() if not (isinstance(fresh.get(k), int) and fresh[k] >= v)
        ]
        if not behind:
            # Caught up: the totals of the snapshot's rows are what it would say.
            return {**fresh, **expected}
        if time.monotonic() >= deadline:
            return info
        time.sleep(0.05)


def _not_unicode(value: Any, where: str) -> str | None:
    """The dotted field of the first string in ``value`` that is not valid Unicode (a lone
    surrogate, as a JSON ``\\ud800`` escape gives), None when every string is."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return None
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, item in items:
        found = _not_unicode(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def _check_text(
    reader: DatasetReader,
    episodes: list[dict[str, Any]],
    tasks: dict[int, str] | None,
    out: _Collector,
) -> None:
    """Text every format must store as UTF-8 (HDF5 and MCAP strings, JSON files): a lone
    surrogate in a note or task cannot be, so it is named here rather than failing a writer."""
    path = reader.root / layout.EPISODES
    for row in episodes:
        field = _not_unicode(row, "")
        if field is not None:
            ep = row.get("episode_index")
            fix = (
                f" (replace it: eva qc {reader.root} {ep} --note TEXT)"
                if field == "qc_note"
                else ""
            )
            out.add(
                "invalid_text",
                f"{path}: episode {ep}: field {field} holds a lone surrogate, not valid "
                f"Unicode{fix}",
                path,
                ep if isinstance(ep, int) else None,
            )
    for index, text in (tasks or {}).items():
        if _not_unicode(text, "task") is not None:
            where = reader.root / layout.TASKS
            out.add(
                "invalid_text",
                f"{where}: task_index {index}: task holds a lone surrogate, not valid Unicode",
                where,
            )


def _more_info_problems(reader: DatasetReader, path: Path, out: _Collector) -> None:
    """The reader stops at the first unusable info.json field; report the others too."""
    from eva.dataset.reader import info_field_problems

    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return
    if isinstance(info, dict):
        for message in info_field_problems(info)[1:]:
            out.add("invalid_info", f"{path}: {message}", path)


# Keys every per-episode stat of a feature has (LeRobot v2.1 episodes_stats.jsonl).
_STAT_KEYS = ("min", "max", "mean", "std", "count")


def _stat_shape(feature: dict[str, Any]) -> tuple[int, ...] | None:
    """The shape of a feature's min/max/mean/std arrays, None when not checkable."""
    if feature.get("dtype") in ("video", "image"):
        return (3, 1, 1)
    shape = feature.get("shape")
    if isinstance(shape, list) and len(shape) == 1:
        return (int(shape[0]),)
    return None


def _check_episodes_stats(
    reader: DatasetReader, episodes_stats: dict[int, dict[str, Any]], out: _Collector
) -> None:
    """Each row's stats of a known feature: min/max/mean/std numeric arrays of the feature's
    shape and count one integer >= 1 (what the export merges), naming file, episode and field."""
    path = reader.root / layout.EPISODES_STATS
    features = reader.features
    for ep, stats in episodes_stats.items():
        for name, stat in stats.items():
            feature = features.get(name)
            if not isinstance(feature, dict):
                continue  # not a feature of this dataset: never read
            problem = _stat_problem(stat, _stat_shape(feature))
            if problem is not None:
                out.add(
                    "invalid_episodes_stats",
                    f"{path}: episode {ep}: field {name!r}: {problem}",
                    path,
                    ep,
                )


def _stat_problem(stat: Any, shape: tuple[int, ...] | None) -> str | None:
    if not isinstance(stat, dict):
        return "not an object"
    missing = [k for k in _STAT_KEYS if k not in stat]
    if missing:
        return f"{missing[0]} missing"
    for key in _STAT_KEYS:
        try:
            array = np.asarray(stat[key], dtype=np.float64)
        except (TypeError, ValueError):
            return f"{key} is not an array of numbers"
        if key == "count":
            if array.shape != (1,) or not float(array[0]).is_integer() or array[0] < 1:
                return f"count {stat[key]!r} is not [an integer >= 1]"
            continue
        if shape is not None and array.shape != shape:
            return f"{key} has shape {list(array.shape)}, expected {list(shape)}"
    return None


def _read_meta(out: _Collector, path: Path, what: str, read: Callable[[], Any]) -> Any:
    """``read()`` of a required metadata file, or None after reporting ``missing_<what>`` /
    ``invalid_<what>``."""
    if not path.exists():
        out.add(f"missing_{what}", f"{path}: missing", path)
        return None
    try:
        return read()
    except DatasetError as e:
        out.add(f"invalid_{what}", str(e), path)
        return None


def _safe_video_keys(reader: DatasetReader, out: _Collector) -> list[str]:
    """Video feature keys usable as path components; the others are reported, not followed."""
    keys = []
    info_path = reader.root / layout.INFO
    for key, feature in reader.features.items():
        if not isinstance(feature, dict):
            out.add("invalid_info", f"{info_path}: feature {key!r} is not an object", info_path)
            continue
        if feature.get("dtype") != "video":
            continue
        try:
            keys.append(layout.check_video_key(key))
        except layout.UnsafeNameError as e:
            out.add("unsafe_path", f"{info_path}: video feature: {e}", info_path)
    return keys


def _check_global_index(
    reader: DatasetReader, numbering: list[tuple[int, int | None, int | None]], out: _Collector
) -> None:
    """``index`` is global and contiguous: episode k starts where episodes < k end."""
    expected = 0
    for ep, rows, first_index in sorted(numbering):
        if rows is None:
            return  # a missing table makes every later start unknowable; reported already
        if first_index is not None and first_index != expected:
            path = reader.data_path(ep)
            out.add(
                "index_not_contiguous",
                f"{path}: episode {ep}: column index starts at {first_index}, expected {expected} "
                "(global index over the episodes before it)",
                path,
                ep,
            )
        expected += rows


def _check_image_histograms(reader: DatasetReader, out: _Collector) -> None:
    """eva's optional ``eva_image_histograms.jsonl`` (absent in LeRobot-written datasets): each
    row must parse, and each histogram must count every pixel of the episode's frames once."""
    path = reader.root / layout.IMAGE_HISTOGRAMS
    try:
        histograms = reader.all_image_histograms
    except DatasetError as e:
        out.add("invalid_image_histograms", str(e), path)
        return
    features = reader.features
    flawed = {p.episode for p in out.problems}  # their length or frames are in doubt already
    for ep, per_camera in sorted(histograms.items()):
        if ep in flawed:
            continue
        try:
            length = reader.length(ep)
        except DatasetError:
            continue  # the episode row's own problem is reported already
        for key, hist in per_camera.items():
            shape = features.get(key, {}).get("shape")
            if not (isinstance(shape, list) and len(shape) == 3):
                continue
            try:
                pixels = length * int(shape[0]) * int(shape[1])
            except (TypeError, ValueError):
                continue
            counted = int(hist[0].sum())
            if counted != pixels:
                out.add(
                    "invalid_image_histograms",
                    f"{path}: episode {ep}: {key} histogram counts {counted} pixels, "
                    f"{length} frames of {shape[1]}x{shape[0]} have {pixels}",
                    path,
                    ep,
                )


def _has(out: _Collector, code: str) -> bool:
    return any(p.code == code for p in out.problems)


def _check_info(info: dict[str, Any], path: Path, out: _Collector) -> None:
    version = info.get("codebase_version")
    if version != layout.CODEBASE_VERSION:
        out.add(
            "bad_codebase_version",
            f"{path}: codebase_version {version!r} is not {layout.CODEBASE_VERSION!r}",
            path,
        )
    if "dataset_format" in info and info["dataset_format"] != layout.DATASET_FORMAT:
        out.add(
            "bad_dataset_format",
            f"{path}: dataset_format {info['dataset_format']!r} is not {layout.DATASET_FORMAT!r}",
            path,
        )


class _VideoInspections:
    """``decode_check.inspect_video`` of every episode's MP4s on worker threads, started before
    the episode loop needs them (the keyframe decode releases the GIL; the parquet checks run
    meanwhile). ``result(path)`` is (frames, damage message or None); an unreadable or
    uncountable file raises its ``DatasetError``."""

    def __init__(
        self,
        reader: DatasetReader,
        episodes: list[dict[str, Any]],
        video_keys: list[str],
        enabled: bool,
    ) -> None:
        self._futures: dict[Path, Future[tuple[int | None, str | None, str | None]]] = {}
        self._pool: ThreadPoolExecutor | None = None
        if not enabled or not video_keys or not episodes:
            return
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, min(VIDEO_CHECK_THREADS, os.cpu_count() or 1)),
            thread_name_prefix="eva-validate",
        )
        for row in episodes:
            ep = row.get("episode_index")
            if not isinstance(ep, int) or isinstance(ep, bool):
                continue
            for key in video_keys:
                try:
                    path = reader.video_path(ep, key)
                except DatasetError:
                    continue  # reported by _check_episode
                if path not in self._futures:
                    self._futures[path] = self._pool.submit(_inspect_video, path)

    def __enter__(self) -> _VideoInspections:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def result(self, path: Path) -> tuple[int, str | None]:
        future = self._futures.get(path)
        frames, unreadable, damaged = (
            future.result() if future is not None else _inspect_video(path)
        )
        if unreadable is not None or frames is None:
            raise DatasetError(unreadable or f"{path}: cannot be read")
        return frames, damaged


def _inspect_video(path: Path) -> tuple[int | None, str | None, str | None]:
    """(frames, unreadable message, damage message) of one MP4: never raises a DatasetError, so
    that the result can wait in a future."""
    try:
        return decode_check.inspect_video(path), None, None
    except decode_check.UndecodableVideo as e:
        try:
            return video.count_frames(path), None, str(e)
        except DatasetError as count_error:
            return None, str(count_error), None
    except DatasetError as e:
        return None, str(e), None


def _check_episode(
    reader: DatasetReader,
    ep: int,
    length: int | None,
    tasks: dict[int, str] | None,
    stats: dict[str, Any] | None,
    video_keys: list[str],
    decode: bool,
    out: _Collector,
    on_table: Callable[[int, pa.Table], None] | None = None,
    videos: _VideoInspections | None = None,
) -> tuple[int | None, int | None]:
    """Checks of one episode; returns (parquet rows, first global index) where known."""
    try:
        data_path = reader.data_path(ep)
    except DatasetError as e:
        out.add("unsafe_path", str(e), None, ep)
        return None, None
    rows: int | None = None
    first_index: int | None = None
    columns: set[str] = set()
    parquet: pq.ParquetFile | None = None
    if not data_path.exists():
        out.add("missing_parquet", f"{data_path}: episode {ep} parquet missing", data_path, ep)
    else:
        # Row count and schema come from the footer; only the index columns are read below.
        try:
            parquet = pq.ParquetFile(data_path)
            rows = parquet.metadata.num_rows
            columns = set(parquet.schema_arrow.names)
        except (pa.ArrowInvalid, OSError) as e:
            out.add("unreadable_parquet", f"{data_path}: episode {ep}: {e}", data_path, ep)
    if rows is not None:
        assert parquet is not None
        try:
            first_index = _check_table(
                reader, parquet, data_path, ep, rows, columns, tasks, out, on_table
            )
        finally:
            parquet.close()
        if length is not None and rows != length:
            out.add(
                "length_mismatch",
                f"{data_path}: episode {ep} has {rows} rows, episodes.jsonl length is {length}",
                data_path,
                ep,
            )
        if rows == 0 and length != 0:
            out.add("empty_episode", f"{data_path}: episode {ep} has no rows", data_path, ep)

    for key in video_keys:
        try:
            video_path = reader.video_path(ep, key)
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
        damaged: str | None = None
        try:
            if decode or videos is None:
                frames = (
                    video.count_decoded_frames(video_path)
                    if decode
                    else video.count_frames(video_path)
                )
            else:
                frames, damaged = videos.result(video_path)
        except DatasetError as e:
            out.add("unreadable_video", f"{e} (episode {ep} camera {key})", video_path, ep)
            continue
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

    # Every feature needs stats: from the per-episode stats, or computable from the table.
    stats = stats or {}
    for feature, spec in reader.features.items():
        if feature in stats or not isinstance(spec, dict):
            continue
        if spec.get("dtype") not in ("video",) and feature in columns:
            continue
        if rows is None and spec.get("dtype") != "video":
            continue  # the table problem is already reported
        where = reader.root / layout.EPISODES_STATS
        out.add(
            "missing_stats",
            f"{where}: episode {ep}: no stats for feature {feature} and no such column in the table",
            where,
            ep,
        )
    return rows, first_index


def _read_columns(parquet: pq.ParquetFile, path: Path, wanted: list[str]) -> pa.Table:
    """``wanted`` (top-level column names of the file) from the already open file. Its
    ``read(columns=)`` resolves names as column paths (a name may select a nested field's
    children), so the result is checked to be exactly ``wanted``, else read by exact name."""
    table = parquet.read(columns=wanted, use_threads=False)
    if table.column_names != wanted:
        table = pq.read_table(path, columns=wanted)
    return table


def _check_table(
    reader: DatasetReader,
    parquet: pq.ParquetFile,
    data_path: Path,
    ep: int,
    rows: int,
    columns: set[str],
    tasks: dict[int, str] | None,
    out: _Collector,
    on_table: Callable[[int, pa.Table], None] | None = None,
) -> int | None:
    """Column checks of one episode table; returns its first global ``index`` (if readable)."""
    for column in REQUIRED_COLUMNS:
        if column not in columns:
            out.add(
                "missing_column",
                f"{data_path}: episode {ep}: column {column} missing",
                data_path,
                ep,
            )
    wanted = []
    schema = parquet.schema_arrow  # built anew on every access: ~0.2 ms
    for c in ("episode_index", "task_index", "index", "frame_index", "timestamp"):
        if c not in columns:
            continue
        type_ = schema.field(schema.get_all_field_indices(c)[0]).type  # duplicates: reported
        if pa.types.is_integer(type_) or pa.types.is_floating(type_):
            wanted.append(c)
        elif c not in reader.features:  # a feature's wrong type is reported already
            out.add(
                "wrong_column_type",
                f"{data_path}: episode {ep}: column {c} is {type_}, must be a number",
                data_path,
                ep,
            )
    # One read for the feature value checks and the numbering checks.
    read = _check_feature_columns(
        reader, parquet, schema, data_path, ep, rows, out, wanted if rows else []
    )
    if not wanted or rows == 0 or read is None:
        return None
    table = read.select(wanted)
    if on_table is not None:
        on_table(ep, table)
    first_index = _check_row_numbering(reader, data_path, ep, table, out)
    if "episode_index" in wanted:
        column = table.column("episode_index")
        values = distinct_scalars(column) + ([None] if column.null_count else [])
        if values != [ep]:
            out.add(
                "wrong_episode_index",
                f"{data_path}: episode {ep}: column episode_index holds {sorted(map(str, values))[:5]}",
                data_path,
                ep,
            )
    if "task_index" in wanted and tasks is not None:
        column = table.column("task_index")
        values = distinct_scalars(column)
        unknown = sorted(v for v in values if v not in tasks)
        nulls = column.null_count
        if unknown or nulls:
            detail = f"values {unknown[:5]}" if unknown else f"{nulls} nulls"
            out.add(
                "unknown_task_index",
                f"{data_path}: episode {ep}: task_index {detail} not in tasks.jsonl",
                data_path,
                ep,
            )
    return first_index


def _type_problem(name: str, feature: dict[str, Any], type_: pa.DataType) -> str | None:
    """Why a column of arrow type ``type_`` cannot hold ``feature`` (None: it can).

    ``shape`` [1] is a plain column (LeRobot's ``Value``) or a one-element list; a longer shape
    is (nested) lists, fixed-size ones of exactly that size. A dtype eva does not know (or an
    image, stored as a struct) is not checked beyond its presence.
    """
    if name in INT64_COLUMNS:
        return None if type_ == pa.int64() else f"is {type_}, must be int64"
    if name == "timestamp":
        return None if pa.types.is_floating(type_) else f"is {type_}, must be a float"
    dtype, shape = feature.get("dtype"), feature.get("shape")
    leaf = _ARROW_DTYPES.get(dtype) if isinstance(dtype, str) else None
    if leaf is None or not isinstance(shape, list):
        return None
    want = f"{dtype}{shape}"
    dims = [] if shape == [1] and not _is_list(type_) else list(shape)
    for dim in dims:
        if pa.types.is_fixed_size_list(type_):
            if type_.list_size != dim:
                return f"is {type_}, expected {want} (lists of {dim})"
        elif not _is_list(type_):
            return f"is {type_}, expected {want}"
        type_ = type_.value_type
    if type_ == leaf or (dtype == "string" and pa.types.is_large_string(type_)):
        return None
    return f"holds {type_} values, expected {want}"


def _is_list(type_: pa.DataType) -> bool:
    return (
        pa.types.is_list(type_)
        or pa.types.is_large_list(type_)
        or pa.types.is_fixed_size_list(type_)
    )


def _check_feature_columns(
    reader: DatasetReader,
    parquet: pq.ParquetFile,
    schema: pa.Schema,
    data_path: Path,
    ep: int,
    rows: int,
    out: _Collector,
    also_read: list[str],
) -> pa.Table | None:
    """Every non-video feature of info.json is a column of the right type and shape, without
    nulls and (floats) without NaN/inf. Types from the footer; values are read only for the
    columns whose footer type cannot vouch for them (variable-length lists, nulls, floats).
    Returns the columns read, ``also_read`` among them (the caller's numbering checks); None
    when the file could not be read (reported)."""
    names = schema.names
    to_read: list[tuple[str, dict[str, Any]]] = []
    for name, feature in reader.features.items():
        if feature.get("dtype") == "video":
            continue
        if name not in names:
            if name not in REQUIRED_COLUMNS:  # reported by the caller already
                out.add(
                    "missing_column",
                    f"{data_path}: episode {ep}: column {name} missing (a feature in info.json)",
                    data_path,
                    ep,
                )
            continue
        if names.count(name) > 1:
            out.add(
                "wrong_column_type",
                f"{data_path}: episode {ep}: column {name} appears more than once",
                data_path,
                ep,
            )
            continue
        type_ = schema.field(name).type
        problem = _type_problem(name, feature, type_)
        if problem is not None:
            out.add(
                "wrong_column_type",
                f"{data_path}: episode {ep}: column {name} {problem}",
                data_path,
                ep,
            )
            continue
        # The index columns are read (and their values checked) by the numbering checks.
        if rows and feature.get("dtype") in _ARROW_DTYPES and name not in _NUMBERING_COLUMNS:
            to_read.append((name, feature))
    names_to_read = [name for name, _ in to_read]
    names_to_read += [name for name in also_read if name not in names_to_read]
    if not names_to_read:
        return pa.table({})
    try:
        table = _read_columns(parquet, data_path, names_to_read)
    except (pa.ArrowInvalid, OSError) as e:
        out.add("unreadable_parquet", f"{data_path}: episode {ep}: {e}", data_path, ep)
        return None
    for name, feature in to_read:
        problem = _value_problem(table.column(name).combine_chunks(), feature, name)
        if problem is not None:
            code, message = problem
            out.add(code, f"{data_path}: episode {ep}: column {name}: {message}", data_path, ep)
    return table


def _value_problem(array: pa.Array, feature: dict[str, Any], name: str) -> tuple[str, str] | None:
    """(code, message) of the first problem in a column's values: a null, a list of the wrong
    length, a NaN/inf (with the first row holding one); None when the values are sound."""
    shape = feature.get("shape")
    parents: np.ndarray | None = None  # row of each value once the lists are flattened
    depth = 0
    while _is_list(array.type):
        if array.null_count:
            first = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
            return "null_values", f"row {_row(parents, first)} is null"
        if not pa.types.is_fixed_size_list(array.type) and isinstance(shape, list):
            dim = shape[depth] if depth < len(shape) else None
            lengths = list_lengths(array)
            wrong = np.flatnonzero(lengths != dim) if dim is not None else np.zeros(0, int)
            if len(wrong):
                first = int(wrong[0])
                return (
                    "wrong_column_type",
                    f"row {_row(parents, first)} holds {int(lengths[first])} values, "
                    f"shape is {shape}",
                )
        child = list_parent_indices(array)
        parents = child if parents is None else parents[child]
        array = list_values(array)
        depth += 1
    if array.null_count:
        first = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
        return "null_values", f"row {_row(parents, first)} holds a null"
    if pa.types.is_floating(array.type) and name != "timestamp":
        values = array.to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(~np.isfinite(values))
        if len(bad):
            first = int(bad[0])
            return (
                "non_finite_values",
                f"{len(bad)} NaN/inf values, the first in row {_row(parents, first)} "
                f"({values[first]})",
            )
    return None


def _row(parents: np.ndarray | None, position: int) -> int:
    return int(parents[position]) if parents is not None else position


def _numeric(table: pa.Table, name: str) -> np.ndarray | None:
    column = table.column(name)
    if column.null_count or not (
        pa.types.is_integer(column.type) or pa.types.is_floating(column.type)
    ):
        return None
    return column.to_numpy()


def _check_row_numbering(
    reader: DatasetReader, data_path: Path, ep: int, table: pa.Table, out: _Collector
) -> int | None:
    """frame_index 0..n-1, index contiguous, timestamp on the fps grid (what LeRobot checks)."""
    n = table.num_rows
    grid = np.arange(n)
    first_index = None
    names = table.column_names
    if "frame_index" in names:
        frame_index = _numeric(table, "frame_index")
        if frame_index is None or not np.array_equal(frame_index, grid):
            out.add(
                "bad_frame_index",
                f"{data_path}: episode {ep}: column frame_index is not 0..{n - 1}",
                data_path,
                ep,
            )
    if "index" in names:
        index = _numeric(table, "index")
        if index is None or not np.array_equal(index, index[0] + grid):
            out.add(
                "index_not_contiguous",
                f"{data_path}: episode {ep}: column index does not count up by 1",
                data_path,
                ep,
            )
        else:
            first_index = int(index[0])
    if "timestamp" in names:
        timestamp = _numeric(table, "timestamp")
        expected = grid / reader.fps
        worst = (
            float(np.max(np.abs(timestamp.astype(np.float64) - expected)))
            if timestamp is not None
            else float("inf")
        )
        if not worst <= TIMESTAMP_TOLERANCE_S:
            out.add(
                "timestamp_off_grid",
                f"{data_path}: episode {ep}: column timestamp is off frame_index/fps by up to "
                f"{worst:.4g} s (tolerance {TIMESTAMP_TOLERANCE_S} s)",
                data_path,
                ep,
            )
    return first_index
