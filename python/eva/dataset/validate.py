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
torn_jsonl_tail, unsafe_path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from eva.dataset import atomic, layout, video
from eva.dataset.errors import DatasetError
from eva.dataset.reader import DatasetReader

__all__ = ["Problem", "validate_dataset", "REQUIRED_COLUMNS"]

REQUIRED_COLUMNS = ("episode_index", "index")
# LeRobot's default tolerance for timestamp vs frame_index / fps.
TIMESTAMP_TOLERANCE_S = 1e-4


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
        self.problems.append(
            Problem(code, message, str(path) if path is not None else None, episode)
        )


def validate_dataset(
    root: Path | str,
    decode: bool = False,
    *,
    on_episode: Callable[[int, int], None] | None = None,
    on_table: Callable[[int, pa.Table], None] | None = None,
) -> list[Problem]:
    """All problems of the v2.1 dataset at ``root`` (empty list: valid).

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
    reader = DatasetReader(root)
    info_path = root / layout.INFO
    info = _read_meta(out, info_path, "info", lambda: reader.info)
    if info is not None:
        _check_info(info, info_path, out)
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

    assert episodes is not None
    video_keys = _safe_video_keys(reader, out)
    seen: set[int] = set()
    total_frames = 0
    numbering: list[tuple[int, int | None, int | None]] = []
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
            reader, ep, length, tasks, episodes_stats.get(ep), video_keys, decode, out, on_table
        )
        numbering.append((ep, rows, first_index))
        if on_episode is not None:
            on_episode(done, len(episodes))

    _check_global_index(reader, numbering, out)
    _check_image_histograms(reader, out)
    info = reader.info
    expected = {"total_episodes": len(seen), "total_frames": total_frames}
    for key, value in expected.items():
        if key in info and info[key] != value:
            out.add(
                "totals_mismatch",
                f"{info_path}: field {key} is {info[key]!r}, episodes.jsonl gives {value}",
                info_path,
            )
    return out.problems


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
        try:
            frames = (
                video.count_decoded_frames(video_path) if decode else video.count_frames(video_path)
            )
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
    wanted = [
        c
        for c in ("episode_index", "task_index", "index", "frame_index", "timestamp")
        if c in columns
    ]
    if not wanted or rows == 0:
        return None
    try:
        table = _read_columns(parquet, data_path, wanted)
    except (pa.ArrowInvalid, OSError) as e:
        out.add("unreadable_parquet", f"{data_path}: episode {ep}: {e}", data_path, ep)
        return None
    if on_table is not None:
        on_table(ep, table)
    first_index = _check_row_numbering(reader, data_path, ep, table, out)
    if "episode_index" in wanted:
        values = pc.unique(table.column("episode_index")).to_pylist()
        if values != [ep]:
            out.add(
                "wrong_episode_index",
                f"{data_path}: episode {ep}: column episode_index holds {sorted(map(str, values))[:5]}",
                data_path,
                ep,
            )
    if "task_index" in wanted and tasks is not None:
        column = table.column("task_index")
        values = pc.unique(column.drop_null()).to_pylist()
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
