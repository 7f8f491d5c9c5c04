"""What a directory holds: a raw v2.1 dataset or one subset of an export, of any format.

``describe_directory`` reads only metadata (info.json, episodes.jsonl, tasks.jsonl,
quality_split.json and the export root's marker) and the files' sizes, so ``eva info`` answers
in milliseconds for any format, including those (v3, HDF5, MCAP) whose data the v2.1 reader
does not read. Symlinks are neither followed nor counted.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from eva.dataset import fsafe, layout
from eva.dataset.atomic import parse_json, read_json
from eva.dataset.errors import DatasetError
from eva.formats import catalog
from eva.publish import COMPLETE_MARKER

VIDEO_DTYPES = ("video", "image")
# the bookkeeping columns every episode table has: not vector features
BOOKKEEPING = ("timestamp", "frame_index", "episode_index", "index", "task_index", "capture_time")


def _json(path: Path) -> Any:
    try:
        return read_json(path)  # a link, a FIFO, not JSON (any reason): a DatasetError naming it
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing") from None


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not os.path.lexists(path):
        return []
    rows = []
    for line in fsafe.read_bytes(path).split(b"\n"):
        try:
            row = parse_json(line, path)
        except DatasetError:
            continue  # a torn tail, a damaged line: eva validate reports it
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _tree_size(root: Path) -> tuple[int, int]:
    """(files, bytes) of the regular files under ``root``, symlinks not followed."""
    files = size = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(st.st_mode):
                files += 1
                size += st.st_size
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    return files, size


def _episode_rows(rows: list[dict[str, Any]], fps: float | None) -> list[dict[str, Any]]:
    from eva.dataset.edits import EDIT_FIELDS
    from eva.quality.verdicts import episode_order, quality_issues, subset_of

    out = []
    for row in sorted(rows, key=episode_order):
        length = row.get("length")
        out.append(
            {
                "episode_index": row.get("episode_index"),
                "length": length,
                "duration_s": round(length / fps, 3) if isinstance(length, int) and fps else None,
                "quality": row.get("quality"),
                "qc_verdict": row.get("qc_verdict"),
                "subset": subset_of(row),
                "issues": [
                    str(i.get("code", "?")) if isinstance(i, dict) else str(i)
                    for i in quality_issues(row)
                ],
                "tasks": row.get("tasks") or [],
                "started_at": row.get("started_at"),
                "edits": {k: row[k] for k in EDIT_FIELDS if k in row},  # as stored
            }
        )
    return out


def _edit_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How many episodes have each edit (``eva.dataset.edits``: edit_trim, edit_task, edit_drop)."""
    from eva.dataset.edits import EDIT_FIELDS

    return {key: sum(1 for r in rows if r.get(key) not in (None, False)) for key in EDIT_FIELDS}


def _marker_state(directory: Path, split: dict[str, Any]) -> dict[str, Any]:
    """Whether the export root's completion marker names this subset's export run."""
    marker = directory.parent / COMPLETE_MARKER
    try:
        published = fsafe.read_text(marker).strip()
    except (OSError, ValueError):
        published = None
    return {
        "path": str(marker),
        "export_id": published,
        "matches": published is not None and published == split.get("export_id"),
    }


def _staleness(split: dict[str, Any], fmt: str) -> dict[str, Any] | None:
    """The export against its source's current review (None when the source or the format is
    not found)."""
    from eva.export.staleness import export_staleness

    source = split.get("source_dir")
    entry = catalog.find(fmt)
    if not isinstance(source, str) or not Path(source).is_dir() or entry is None:
        return None
    try:
        state = export_staleness(Path(source), entry)
    except DatasetError as e:
        return {"stale": None, "detail": str(e)}
    if state is None:
        return None
    return {"stale": state.stale, "detail": state.describe() if state.stale else "current"}


def _duration(frames: object, fps: float | None) -> float | None:
    """Seconds of ``frames`` at ``fps``; None when either is unusable (a hand-edited total of
    thousands of digits does not fit a float)."""
    if not isinstance(frames, int) or isinstance(frames, bool) or not fps:
        return None
    try:
        return round(frames / fps, 3)
    except OverflowError:
        return None


def _check_totals(
    root: Path, info: dict[str, Any], rows: list[dict[str, Any]], summary: dict[str, Any]
) -> None:
    """A raw dataset's committed rows are the truth (episodes.jsonl is the commit point): when
    info.json's totals are behind them (a save interrupted after its commit point), the summary
    counts the rows and says which command repairs the metadata."""
    frames = sum(r["length"] for r in rows if isinstance(r.get("length"), int))
    recorded = (info.get("total_episodes"), info.get("total_frames"))
    if recorded == (len(rows), frames):
        return
    summary["episodes"], summary["frames"] = len(rows), frames
    fps = summary["fps"]
    summary["duration_s"] = _duration(frames, fps)
    summary["metadata_behind"] = (
        f"{root / layout.INFO}: totals {recorded[0]} episodes, {recorded[1]} frames, but "
        f"episodes.jsonl commits {len(rows)} episodes, {frames} frames (a save interrupted, or "
        f"one in progress): unless a capture is running, eva cleanup {root} repairs them"
    )


def _read_meta(
    root: Path, split: dict[str, Any] | None
) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """info.json, the episode rows and the task texts of ``root``: an export's (``split``, its
    marker: v3, HDF5 and MCAP are no v2.1 the reader reads) or a raw dataset's (the v2.1 reader
    checks its metadata and names what is wrong)."""
    if split is not None:
        info = _json(root / layout.INFO)
        if not isinstance(info, dict):
            raise DatasetError(f"{root / layout.INFO}: not a JSON object")
        tasks = [str(r.get("task")) for r in _jsonl(root / layout.TASKS)]
        return info, _jsonl(root / layout.EPISODES), tasks
    from eva.dataset.reader import DatasetReader

    reader = DatasetReader(root)
    return reader.info, reader.episodes, [reader.tasks[i] for i in sorted(reader.tasks)]


def _describe_raw(
    root: Path, info: dict[str, Any], rows: list[dict[str, Any]], summary: dict[str, Any]
) -> None:
    """A raw dataset's own parts of its summary: totals, recoveries pending, stale exports."""
    _check_totals(root, info, rows, summary)
    from eva.dataset.recover import find_spools

    # Recordings a crash cut short: their spools wait in the work dir for eva recover.
    summary["awaiting_recovery"] = len(find_spools(root / layout.WORK_DIR))
    from eva.export.staleness import stale_exports

    try:
        summary["stale_exports"] = [
            {"format": s.format, "export_root": str(s.export_root), "detail": s.describe()}
            for s in stale_exports(root)
        ]
    except DatasetError:
        summary["stale_exports"] = []


def _describe_export(root: Path, split: dict[str, Any], fmt: str, summary: dict[str, Any]) -> None:
    """An export subset's own parts of its summary: its marker and whether it is stale."""
    summary["subset"] = split.get("subset")
    summary["source_dir"] = split.get("source_dir")
    summary["export_id"] = split.get("export_id")
    summary["source_episode_indices"] = split.get("source_episode_indices")
    summary["marker"] = _marker_state(root, split)
    summary["staleness"] = _staleness(split, fmt)


def describe_directory(root: Path | str, *, episodes: bool = False) -> dict[str, Any]:
    """A summary of ``root``: a raw dataset or an export subset (see the module docstring).
    ``episodes``: also one row per episode. ``DatasetError`` when it is neither."""
    root = Path(root)
    split_path = root / layout.QUALITY_SPLIT
    # lexists, not is_file: a marker that is a link or a FIFO is refused (by fsafe), not taken
    # for "no marker, so a raw dataset".
    split = _json(split_path) if os.path.lexists(split_path) else None
    info, rows, tasks = _read_meta(root, split if isinstance(split, dict) else None)
    # An export's marker names its format (a v3 export's info.json no longer does).
    marker_entry = catalog.named(split.get("dataset_format")) if isinstance(split, dict) else None
    fmt = marker_entry.name if marker_entry is not None else catalog.format_of_info(info)
    raw_features = info.get("features")
    features: dict[str, Any] = raw_features if isinstance(raw_features, dict) else {}
    fps = info.get("fps") if isinstance(info.get("fps"), (int, float)) else None
    frames = info.get("total_frames")
    quality = [str(r.get("quality", "")).lower() for r in rows]
    verdicts = [str(r.get("qc_verdict") or "").lower() for r in rows]
    files, size = _tree_size(root)
    summary: dict[str, Any] = {
        "dataset": str(root),
        "kind": "export" if isinstance(split, dict) else "raw",
        "format": fmt,
        "codebase_version": info.get("codebase_version"),
        "robot_type": info.get("robot_type"),
        "fps": fps,
        "episodes": info.get("total_episodes", len(rows)),
        "frames": frames,
        "duration_s": _duration(frames, fps),
        "embedded_images": bool(info.get("embedded_images")),
        "cameras": {
            k: f.get("shape")
            for k, f in features.items()
            if isinstance(f, dict) and f.get("dtype") in VIDEO_DTYPES
        },
        "vectors": {
            k: f.get("shape")
            for k, f in features.items()
            if isinstance(f, dict) and f.get("dtype") not in VIDEO_DTYPES and k not in BOOKKEEPING
        },
        "tasks": tasks,
        "quality": {"green": quality.count("green"), "red": quality.count("red")},
        "qc_verdict": {"pass": verdicts.count("pass"), "fail": verdicts.count("fail")},
        "edits": _edit_counts(rows),
        "files": files,
        "size_bytes": size,
    }
    if isinstance(split, dict):
        _describe_export(root, split, fmt, summary)
    else:
        _describe_raw(root, info, rows, summary)
    if episodes:
        summary["episode_rows"] = _episode_rows(rows, fps)
    return summary
