"""Checks of a raw dataset's metadata files: info.json, episodes.jsonl text, tasks,
episodes_stats.jsonl, eva's image histogram sidecar, torn jsonl tails and the totals."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from eva.dataset import atomic, fsafe, layout
from eva.dataset.edits import EDIT_DROP, EDIT_TASK, EDIT_TRIM, edit_problems
from eva.dataset.errors import DatasetError
from eva.dataset.reader import DatasetReader
from eva.dataset.validate.problems import ProblemCollector
from eva.textsafe import storable_problem

__all__ = [
    "REPAIR_HINT",
    "SETTLE_TIMEOUT_S",
    "check_episodes_stats",
    "check_global_index",
    "check_image_histograms",
    "check_info",
    "check_text",
    "check_torn_tails",
    "check_totals",
    "more_info_problems",
    "read_meta",
    "safe_video_keys",
    "settled_info",
]

# Tells an interrupted save (committed rows ahead of info.json) how to repair it.
REPAIR_HINT = "run eva cleanup {root} to repair the metadata after an interrupted save"


def read_meta(out: ProblemCollector, path: Path, what: str, read: Callable[[], Any]) -> Any:
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


def check_info(
    info: dict[str, Any], path: Path, out: ProblemCollector, dataset_format: str | None = None
) -> None:
    """The layout fields of ``info``; ``dataset_format``: the value the field must have where
    present (the caller knows which format's name the v2.1 layout carries; None: not checked)."""
    version = info.get("codebase_version")
    if version != layout.CODEBASE_VERSION:
        out.add(
            "bad_codebase_version",
            f"{path}: codebase_version {version!r} is not {layout.CODEBASE_VERSION!r}",
            path,
        )
    found_format = info.get("dataset_format", dataset_format)
    if dataset_format is not None and found_format != dataset_format:
        out.add(
            "bad_dataset_format",
            f"{path}: dataset_format {found_format!r} is not {dataset_format!r}",
            path,
        )
    found = atomic.non_json_value(info)
    if found is not None:  # a rewrite (the writer resuming, eva cleanup) would refuse it
        out.add("invalid_info", f"{path}: field {found[0]}: {found[1]}", path)


def more_info_problems(reader: DatasetReader, path: Path, out: ProblemCollector) -> None:
    """The reader stops at the first unusable info.json field; report the others too."""
    from eva.dataset.reader import info_field_problems

    try:
        info = json.loads(fsafe.read_text(path))
    except (OSError, ValueError, RecursionError):  # the reader named it (invalid_info)
        return
    if isinstance(info, dict):
        for message in info_field_problems(info)[1:]:
            out.add("invalid_info", f"{path}: {message}", path)


def _unstorable(value: Any, where: str) -> tuple[str, str] | None:
    """``(dotted field, why)`` of the first string in ``value`` that no format can store
    (``eva.textsafe.storable_problem``: a lone surrogate, a NUL), None when every one can."""
    return atomic.first_problem(value, _storable_problem, where)


def _storable_problem(value: Any) -> str | None:
    return storable_problem(value) if isinstance(value, str) else None


def check_text(
    reader: DatasetReader,
    episodes: list[dict[str, Any]],
    tasks: dict[int, str] | None,
    out: ProblemCollector,
) -> None:
    """Text every format must store (HDF5 and MCAP strings, JSON files): a lone surrogate or a
    NUL in a note or task cannot be, so it is named here rather than failing a writer. The same
    rule refuses such text where a user types it (eva.textsafe.text_problem)."""
    path = reader.root / layout.EPISODES
    for row in episodes:
        found = _unstorable(row, "")
        if found is not None:
            field, why = found
            ep = row.get("episode_index")
            fix = (
                f" (replace it: eva qc {reader.root} {ep} --note TEXT)"
                if field == "qc_note"
                else ""
            )
            out.add(
                "invalid_text",
                f"{path}: episode {ep}: field {field} {why}{fix}",
                path,
                ep if isinstance(ep, int) else None,
            )
    for index, text in (tasks or {}).items():
        found = _unstorable(text, "task")
        if found is not None:
            where = reader.root / layout.TASKS
            out.add("invalid_text", f"{where}: task_index {index}: task {found[1]}", where)


# How ``eva edit`` replaces or removes each edit field.
_EDIT_FIXES = {
    EDIT_TRIM: "--trim START:END or --clear-trim",
    EDIT_TASK: "--task TEXT or --clear-task",
    EDIT_DROP: "--drop or --undrop",
}


def check_review_fields(root: Path, row: Mapping[str, Any], ep: int, out: ProblemCollector) -> None:
    """The fields of one episodes.jsonl row that decide and describe its subset. A verdict the
    accept/reject rule does not know ("failed", "reject", 0) would read as no verdict and send an
    operator-rejected episode to accepted, so it is a problem, not a silent default."""
    path = root / layout.EPISODES
    found: list[str] = []
    for key, allowed in (("qc_verdict", layout.QC_VERDICTS), ("quality", layout.QUALITY_FLAGS)):
        value = row.get(key)
        if value is not None and (
            not isinstance(value, str) or value.strip().lower() not in allowed
        ):
            fix = f" (set it: eva qc {root} {ep} --pass, --fail or --clear)"
            fix = fix if key == "qc_verdict" else ""
            found.append(f"field {key} {value!r} is not one of {', '.join(allowed)}{fix}")
    note = row.get("qc_note")
    if note is not None and not isinstance(note, str):
        found.append(f"field qc_note {note!r} is not a string")
    tasks = row.get("tasks")
    if tasks is not None and (
        not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks)
    ):
        found.append(f"field tasks {tasks!r} is not a list of strings")
    issues = row.get("quality_issues")
    if issues is not None and (
        not isinstance(issues, list) or not all(isinstance(i, dict) for i in issues)
    ):
        found.append(f"field quality_issues {issues!r} is not a list of objects")
    found += _metric_field_problems(row)
    # An edit the writer would refuse (eva.dataset.edits), with the command that replaces it.
    for field, message in edit_problems(row):
        found.append(f"{message} (replace it: eva edit {root} {ep} {_EDIT_FIXES[field]})")
    not_json = atomic.non_json_value(row)
    if not_json is not None:  # eva qc / the console would refuse to rewrite the file
        found.append(f"field {not_json[0]} {not_json[1]} (write a number or null)")
    for message in found:
        out.add("invalid_episode_row", f"{path}: episode {ep}: {message}", path, ep)


def _metric_field_problems(row: Mapping[str, Any]) -> list[str]:
    """The review metrics (eva.dataset.motion_metrics): an object, a number, a list of text."""
    found = []
    metrics = row.get("quality_metrics")
    if metrics is not None and not isinstance(metrics, dict):
        found.append(f"field quality_metrics {metrics!r} is not an object")
    score = row.get("anomaly_score")
    if score is not None and (isinstance(score, bool) or not isinstance(score, int | float)):
        found.append(f"field anomaly_score {score!r} is not a number")
    reasons = row.get("anomaly_reasons")
    if reasons is not None and (
        not isinstance(reasons, list) or not all(isinstance(r, str) for r in reasons)
    ):
        found.append(f"field anomaly_reasons {reasons!r} is not a list of strings")
    return found


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


def check_episodes_stats(
    reader: DatasetReader, episodes_stats: dict[int, dict[str, Any]], out: ProblemCollector
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
        if not np.isfinite(array).all():
            # JSON proper has no NaN (eva writes none); Python's json reads NaN/Infinity, and
            # one would poison every merged stat and fail the export's own JSON writer.
            return f"{key} holds NaN/inf (not JSON numbers)"
    return None


def safe_video_keys(reader: DatasetReader, out: ProblemCollector) -> list[str]:
    """Video feature keys usable as path components; the others are reported, not followed."""
    keys = []
    info_path = reader.root / layout.INFO
    # Not validated yet: info.json may hold any JSON value where a feature object belongs.
    features: Mapping[str, object] = reader.features
    for key, feature in features.items():
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


def check_torn_tails(root: Path, out: ProblemCollector) -> None:
    """A jsonl file ending in the torn fragment of an interrupted append."""
    for rel in (layout.EPISODES, layout.EPISODES_STATS, layout.TASKS, layout.IMAGE_HISTOGRAMS):
        path = root / rel
        if atomic.has_torn_tail(path):
            out.add(
                "torn_jsonl_tail",
                f"{path}: ends in a torn fragment of an interrupted append (eva ignores it; other "
                "readers may not); opening the dataset with the eva writer repairs it",
                path,
            )


def check_global_index(
    reader: DatasetReader,
    numbering: list[tuple[int, int | None, int | None]],
    out: ProblemCollector,
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


def check_image_histograms(reader: DatasetReader, out: ProblemCollector) -> None:
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


# How long a running save may take to rewrite info.json after its commit point.
SETTLE_TIMEOUT_S = 0.5


def settled_info(path: Path, expected: dict[str, int], info: dict[str, Any]) -> dict[str, Any]:
    """info.json read again when the snapshot's committed rows are ahead of it: a running save
    rewrites it right after its commit point, so a read shortly after catches up (or runs ahead
    with the next episode). Still behind after SETTLE_TIMEOUT_S: an interrupted save."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        try:
            fresh = json.loads(fsafe.read_text(path))
        except (OSError, ValueError, RecursionError):
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


def check_totals(
    reader: DatasetReader,
    root: Path,
    info_path: Path,
    episodes: int,
    total_frames: int,
    out: ProblemCollector,
) -> None:
    """info.json's totals against the ``episodes`` rows holding ``total_frames`` frames."""
    info = reader.info
    expected = {"total_episodes": episodes, "total_frames": total_frames}
    if any(isinstance(info.get(k), int) and info[k] < v for k, v in expected.items()):
        info = settled_info(info_path, expected, info)
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
