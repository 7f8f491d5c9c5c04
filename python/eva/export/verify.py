"""``eva verify EXPORT_DIR``: check one published subset the way the description asks.

1. ``meta/quality_split.json``: ``source_dir`` is the current source, ``subset`` matches the
   directory, ``dataset_format`` matches the export, ``source_episode_indices`` equal what the
   current source's review gives for that subset, and the sibling subset belongs to the same pair.
2. Format checks through the registry (``eva.formats.<fmt>.verify``): info totals against the
   physical output, then a real read of one state, one action and one image frame per episode.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eva.dataset import layout
from eva.dataset.errors import DatasetError
from eva.dataset.validate import Problem
from eva.export.registry import load_format
from eva.quality.split import plan_split
from eva.quality.verdicts import read_episode_rows


def default_source_for(export_dir: Path) -> Path | None:
    """The source dir an export dir was derived from (contracts §4), or None if not derivable."""
    root = Path(export_dir).resolve().parent  # .../<export>/<fmt>
    container = root.parent
    if container.name == "export":
        return container.parent / "raw"
    if container.name.endswith("_export") and len(container.name) > len("_export"):
        return container.parent / container.name[: -len("_export")]
    return None


def _read_marker(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetError(f"{path}: unreadable ({e})") from None
    if not isinstance(data, dict):
        raise DatasetError(f"{path}: not a JSON object")
    return data


def verify_export(
    export_dir: Path | str, *, source_dir: Path | str | None = None, fmt: str | None = None
) -> list[Problem]:
    export_dir = Path(export_dir)
    problems: list[Problem] = []
    marker_path = export_dir / layout.QUALITY_SPLIT

    def problem(code: str, message: str, path: Path = marker_path) -> None:
        problems.append(Problem(code, f"{path}: {message}", str(path), None))

    if not export_dir.is_dir():
        problem("missing_export", "export directory does not exist", export_dir)
        return problems
    try:
        marker = _read_marker(marker_path)
    except DatasetError as e:
        problem("quality_split", str(e).split(": ", 1)[-1])
        return problems

    subset = export_dir.resolve().name
    if subset not in layout.SUBSETS:
        problem("subset", f"directory name {subset!r} is neither accepted nor rejected", export_dir)
    elif marker.get("subset") != subset:
        problem("subset", f"field 'subset' is {marker.get('subset')!r}, directory is {subset!r}")

    expected_fmt = fmt
    if expected_fmt is None:
        try:
            expected_fmt = layout.normalize_format(export_dir.resolve().parent.name)
        except ValueError:
            expected_fmt = None
    else:
        expected_fmt = layout.normalize_format(expected_fmt)
    marker_fmt = marker.get("dataset_format")
    if marker_fmt not in layout.FORMATS:
        problem("dataset_format", f"field 'dataset_format' {marker_fmt!r} is not a known format")
        return problems
    if expected_fmt is not None and marker_fmt != expected_fmt:
        problem(
            "dataset_format", f"field 'dataset_format' is {marker_fmt!r}, expected {expected_fmt!r}"
        )

    source = Path(source_dir) if source_dir is not None else default_source_for(export_dir)
    recorded = marker.get("source_dir")
    if not isinstance(recorded, str) or not Path(recorded).is_absolute():
        problem("source_dir", f"field 'source_dir' {recorded!r} is not an absolute path")
    elif source is None:
        problem("source_dir", "cannot derive the source directory from the export path; pass it")
    elif Path(recorded).resolve() != source.resolve():
        problem(
            "source_dir", f"field 'source_dir' is {recorded}, current source is {source.resolve()}"
        )
    elif not source.is_dir():
        problem("source_dir", f"source {source} no longer exists")
    else:
        indices = marker.get("source_episode_indices")
        try:
            expected = plan_split(read_episode_rows(source)).indices(subset)
        except (DatasetError, KeyError, ValueError) as e:
            problem("source_dir", f"cannot read the source review: {e}")
        else:
            if indices != expected:
                problem(
                    "source_episode_indices",
                    f"field 'source_episode_indices' {indices} but the current review of the "
                    f"source gives {expected} (re-export after review changes)",
                )

    if subset in layout.SUBSETS:
        sibling = export_dir.resolve().parent / next(s for s in layout.SUBSETS if s != subset)
        try:
            other = _read_marker(sibling / layout.QUALITY_SPLIT)
        except DatasetError as e:
            problem("pair", f"sibling subset: {e}", sibling)
        else:
            if other.get("export_id") != marker.get("export_id"):
                problem("pair", f"{sibling.name} belongs to another export run", sibling)

    try:
        module = load_format(marker_fmt)
    except DatasetError as e:
        problem("format", str(e), export_dir)
        return problems
    problems.extend(module.verify(export_dir))
    return problems
