"""Checking a v3.0 export: the episode locators followed to the Parquet and MP4 shards."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from eva.dataset import layout
from eva.dataset.atomic import read_json_object
from eva.dataset.errors import DatasetError, error_line
from eva.dataset.validate import Problem
from eva.formats._decode import frame_at
from eva.formats._verify import (
    VECTOR_FEATURES,
    ProblemCollector,
    check_frame,
    check_total,
    check_unreadable_meta,
    check_vectors,
    check_version,
)
from eva.formats.lerobot_v3.tables import (
    CODEBASE_VERSION,
    DATA_PATH,
    DATASET_FORMAT,
    TASKS_PARQUET,
    VIDEO_PATH,
)
from eva.formats.lerobot_v3.video import VideoConcatError, probe

# Slack for comparing timestamps computed in the stream's time base with row timestamps; LeRobot
# looks frames up with tolerance_s = 1e-4.
TIMESTAMP_TOLERANCE_S = 1e-4


def read_episode_locators(root: Path) -> pa.Table:
    """All ``meta/episodes`` files in path order, concatenated (how LeRobot loads them)."""
    paths = sorted((Path(root) / "meta" / "episodes").glob("*/*.parquet"))
    if not paths:
        raise DatasetError(f"{Path(root) / 'meta' / 'episodes'}: no episode metadata files")
    tables = []
    for path in paths:
        try:
            tables.append(pq.read_table(path))
        except (OSError, ValueError, pa.ArrowException) as e:  # a damaged footer, say
            raise DatasetError(f"{path}: not a readable parquet file ({error_line(e)})") from None
    try:
        return pa.concat_tables(tables, promote_options="default")
    except (ValueError, pa.ArrowException) as e:
        raise DatasetError(
            f"{paths[0].parent.parent}: the episode metadata files disagree ({error_line(e)})"
        ) from None


def verify(export_dir: Path) -> list[Problem]:
    """Follow the episode locators to the Parquet and MP4 shards and check them (see module doc):
    row ranges, index/frame_index/timestamp columns, per-shard frame counts against the episodes'
    lengths, timestamp ranges; then read one state, one action and one frame per camera per
    episode (pyarrow and PyAV)."""
    root = Path(export_dir)
    problem = ProblemCollector()
    info_path = root / layout.INFO
    try:
        info = read_json_object(info_path)  # any failure a DatasetError naming it
        locators = read_episode_locators(root).to_pylist()
        tasks = pq.read_table(root / TASKS_PARQUET)
    except (OSError, ValueError, pa.ArrowException, DatasetError) as e:
        check_unreadable_meta(problem, root, e)
        return problem.problems
    check_version(problem, info, CODEBASE_VERSION, info_path)
    # Older exports named their format in info.json too (now only quality_split.json does).
    if info.get("dataset_format", DATASET_FORMAT) != DATASET_FORMAT:
        problem("wrong_format", f"dataset_format {info.get('dataset_format')!r}", info_path)
    fps = float(info.get("fps") or 0)
    features = info.get("features", {})
    video_keys, refused = layout.safe_video_keys(features)
    for refusal in refused:
        problem("video_key", str(refusal), info_path)
    data_tpl = info.get("data_path") or DATA_PATH
    video_tpl = info.get("video_path") or VIDEO_PATH
    # The templates are input: only plain {field} / {field:03d} replacements that format, and
    # no literal text leading out of the export (``../``).
    try:
        for tpl, sample in (
            (data_tpl, {"chunk_index": 0, "file_index": 0}),
            (video_tpl, {"video_key": "key", "chunk_index": 0, "file_index": 0}),
        ):
            rel = os.path.normpath(layout.format_path_template(tpl, **sample))
            if os.path.isabs(rel) or rel.split(os.sep, 1)[0] == os.pardir:
                raise layout.UnsafeNameError(f"path template {tpl!r} leads outside {root}")
    except layout.UnsafeNameError as e:
        problem("unsafe_path_template", str(e), info_path)
        return problem.problems
    n_eps = len(locators)
    if [r.get("episode_index") for r in locators] != list(range(n_eps)):
        problem("episode_numbering", "meta/episodes rows are not episodes 0..n-1 in order", root)
    check_total(problem, info, "total_episodes", n_eps, f"{n_eps} episodes", info_path)
    total_len = sum(int(r.get("length") or 0) for r in locators)
    check_total(problem, info, "total_frames", total_len, f"{total_len} rows", info_path)
    check_total(problem, info, "total_tasks", tasks.num_rows, f"{tasks.num_rows} tasks", info_path)
    if b"pandas" not in (tasks.schema.metadata or {}):
        problem(
            "tasks_index", "tasks.parquet lacks the pandas index metadata", root / TASKS_PARQUET
        )
    check_data_files(problem, root, data_tpl, locators, features, fps)
    trimmed = trimmed_episodes(root)
    for cam in video_keys:
        check_video_shards(problem, root, video_tpl, locators, cam, features[cam], fps, trimmed)
    return problem.problems


def trimmed_episodes(root: Path) -> set[int]:
    """The subset's episodes its export trimmed (``quality_split.json``'s ``edits``): their
    shards hold every recorded frame, and their from/to timestamps select the kept ones."""
    from eva.dataset.atomic import read_json_object

    try:
        marker = read_json_object(root / layout.QUALITY_SPLIT)
    except (OSError, ValueError):
        return set()
    edits, indices = marker.get("edits"), marker.get("source_episode_indices")
    if not isinstance(edits, dict) or not isinstance(indices, list):
        return set()
    output = {str(source): new for new, source in enumerate(indices)}
    return {
        output[key]
        for key, edit in edits.items()
        if key in output and isinstance(edit, dict) and edit.get("trim") is not None
    }


def check_data_files(
    problem: ProblemCollector,
    root: Path,
    data_tpl: str,
    locators: list[dict[str, Any]],
    features: Mapping[str, Mapping[str, Any]],
    fps: float,
) -> None:
    """Every data file the locators name: rows of its episodes in order, their index columns,
    one state and one action read back, and no row no episode accounts for."""
    data_cache: dict[tuple[int, int], pa.Table | None] = {}
    file_start: dict[tuple[int, int], int] = {}
    expected_index = 0
    for ep, row in enumerate(locators):
        key = (int(row["data/chunk_index"]), int(row["data/file_index"]))
        path = root / data_tpl.format(chunk_index=key[0], file_index=key[1])
        if key not in data_cache and not layout.is_within(path, root):
            data_cache[key] = None  # a symlink out of the export: not followed
            problem("unsafe_path", "leads outside the export", path, ep)
            file_start[key] = int(row["dataset_from_index"])
        if key not in data_cache:
            try:
                # Only the columns checked here: a data shard can be ~100 MB of other features.
                wanted = ("episode_index", "index", "frame_index", "timestamp", *VECTOR_FEATURES)
                names = set(pq.read_schema(path).names)
                data_cache[key] = pq.read_table(path, columns=[c for c in wanted if c in names])
            except (OSError, pa.ArrowException) as e:
                data_cache[key] = None
                problem("unreadable_parquet", f"cannot read: {e}", path, ep)
            file_start[key] = int(row["dataset_from_index"])
        table = data_cache[key]
        start, stop = int(row["dataset_from_index"]), int(row["dataset_to_index"])
        n = int(row["length"])
        if start != expected_index or stop - start != n or n <= 0:
            problem(
                "row_range",
                f"range [{start}, {stop}) does not follow {expected_index} with length {n}",
                path,
                ep,
            )
        expected_index = stop
        if table is None:
            continue
        offset = start - file_start[key]
        part = table.slice(offset, n)
        if part.num_rows != n:
            problem(
                "row_range", f"file has {table.num_rows} rows, range needs {offset + n}", path, ep
            )
            continue
        _check_episode_rows(problem, part, path, ep, (start, stop), features, fps)
    _check_rows_accounted(problem, root, data_tpl, locators, data_cache)


def _check_episode_rows(
    problem: ProblemCollector,
    part: pa.Table,
    path: Path,
    ep: int,
    row_range: tuple[int, int],
    features: Mapping[str, Mapping[str, Any]],
    fps: float,
) -> None:
    """Episode ``ep``'s rows (``part``, the global index range its locator gives): its index
    columns, and one state and one action read back."""
    start, stop = row_range
    n = part.num_rows
    cols = {
        c: part.column(c).to_numpy()
        for c in ("episode_index", "index", "frame_index", "timestamp")
        if c in part.column_names
    }
    if len(cols) < 4:
        problem(
            "missing_column",
            "episode_index/index/frame_index/timestamp column missing",
            path,
            ep,
        )
        return
    if not (cols["episode_index"] == ep).all():
        problem(
            "episode_index_column", f"rows [{start}, {stop}) are not all episode {ep}", path, ep
        )
    if not np.array_equal(cols["index"], np.arange(start, stop)):
        problem("index_column", f"index is not {start}..{stop - 1}", path, ep)
    if not np.array_equal(cols["frame_index"], np.arange(n)):
        problem("frame_index_column", f"frame_index is not 0..{n - 1}", path, ep)
    ts = cols["timestamp"].astype(np.float64)
    if fps and np.abs(ts - np.arange(n) / fps).max() > TIMESTAMP_TOLERANCE_S:
        problem("timestamp_column", "timestamps are not frame_index / fps", path, ep)
    first_values = {
        name: np.asarray(part.column(name)[0].as_py(), dtype=np.float64)
        for name in VECTOR_FEATURES
        if name in part.column_names
    }
    check_vectors(problem, features, first_values, path, ep)


def _check_rows_accounted(
    problem: ProblemCollector,
    root: Path,
    data_tpl: str,
    locators: list[dict[str, Any]],
    data_cache: dict[tuple[int, int], pa.Table | None],
) -> None:
    """Every data file read has as many rows as its episodes' lengths add up to."""
    rows_used: dict[tuple[int, int], int] = {}
    for r in locators:
        key = (int(r["data/chunk_index"]), int(r["data/file_index"]))
        rows_used[key] = rows_used.get(key, 0) + int(r["length"])
    for key, table in data_cache.items():
        if table is None:
            continue
        used = rows_used[key]
        if table.num_rows != used:
            path = root / data_tpl.format(chunk_index=key[0], file_index=key[1])
            problem("row_count", f"{table.num_rows} rows, its episodes account for {used}", path)


def check_video_shards(
    problem: ProblemCollector,
    root: Path,
    video_tpl: str,
    locators: list[dict[str, Any]],
    cam: str,
    feature: Mapping[str, Any],
    fps: float,
    trimmed: Collection[int] = (),
) -> None:
    """One camera's shards: episodes abut from 0 (but for ``trimmed`` ones' cut frames), the
    sample count equals their rows (or exceeds them by the cut), one frame decodes per episode."""
    shards: dict[tuple[int, int], list[int]] = {}
    for ep, row in enumerate(locators):
        try:
            key = (int(row[f"videos/{cam}/chunk_index"]), int(row[f"videos/{cam}/file_index"]))
        except (KeyError, TypeError):
            problem("missing_locator", f"camera {cam!r}: no video locator", root, ep)
            continue
        shards.setdefault(key, []).append(ep)
    shape = tuple(feature.get("shape", ()))
    for key, eps in shards.items():
        path = root / video_tpl.format(video_key=cam, chunk_index=key[0], file_index=key[1])
        if not layout.is_within(path, root):
            problem("unsafe_path", "leads outside the export", path, eps[0])
            continue
        try:
            shard = probe(path)
        except VideoConcatError as e:
            problem("unreadable_video", f"camera {cam!r}: {e}", path, eps[0])
            continue
        want = sum(int(locators[ep]["length"]) for ep in eps)
        cut = not set(trimmed).isdisjoint(eps)
        if shard.frames != want and not (cut and shard.frames > want):
            problem(
                "frame_count",
                f"camera {cam!r}: {shard.frames} frames, its episodes have {want} rows",
                path,
            )
        expected_from = 0.0
        for ep in eps:
            row = locators[ep]
            t0, t1 = (
                float(row[f"videos/{cam}/from_timestamp"]),
                float(row[f"videos/{cam}/to_timestamp"]),
            )
            n = int(row["length"])
            # Episodes follow each other; a B-frame stream's reorder delay (at most 16
            # frames in H.264) leaves a gap, and a trim's cut frames any.
            max_gap = float("inf") if cut else 16 / fps if fps else 1.0
            if not expected_from - TIMESTAMP_TOLERANCE_S <= t0 <= expected_from + max_gap:
                problem(
                    "timestamp_range",
                    f"camera {cam!r}: starts at {t0:.6f} s, previous episode ends at {expected_from:.6f} s",
                    path,
                    ep,
                )
            if fps and abs((t1 - t0) - n / fps) > TIMESTAMP_TOLERANCE_S:
                problem(
                    "timestamp_range",
                    f"camera {cam!r}: [{t0:.6f}, {t1:.6f}) s holds {(t1 - t0) * fps:.3f} frames, not {n}",
                    path,
                    ep,
                )
            expected_from = t1
            try:
                found = frame_at(path, t0, TIMESTAMP_TOLERANCE_S)
            except Exception as e:  # noqa: BLE001 - any decoder failure is a verification problem
                problem(
                    "unreadable_video",
                    f"camera {cam!r}: cannot decode at {t0:.6f} s: {e}",
                    path,
                    ep,
                )
                continue
            if found is None or abs(found[0] - t0) > TIMESTAMP_TOLERANCE_S:
                problem("frame_lookup", f"camera {cam!r}: no frame at {t0:.6f} s", path, ep)
            elif len(shape) == 3:
                check_frame(problem, cam, found[1], shape, path, ep)
