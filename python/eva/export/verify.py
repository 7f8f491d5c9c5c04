"""``eva verify EXPORT_DIR``: check one published subset the way the description asks.

1. ``meta/quality_split.json`` on its own: ``subset`` is accepted or rejected (and matches the
   directory when that is named like a subset), ``dataset_format`` is known (and matches the
   format the path or ``--format`` names), its totals agree with ``source_episode_indices`` and
   with the subset's ``meta/info.json``; the edits it records (``edits``) against the subset's
   episodes (a trimmed one's length, a re-tasked one's task) and, with a source, against the
   source's current edits.
2. Against the source, when one is known: the ``--source`` given, else the dataset the export's
   place derives (``<parent>/export/<fmt>/<subset>`` -> ``<parent>/raw``, ``<name>_export`` ->
   ``<name>``) if it exists. ``source_dir`` must be that source and ``source_episode_indices``
   what its current review gives for the subset; at home the sibling subset must belong to the
   same run. A moved or renamed copy has no known source: it is checked on its own (1, 3, 4), and
   ``--source`` compares it with one.
3. Format checks by the format's module (its catalogue entry's ``verify``): info totals against the
   physical output, then a real read of one state, one action and one image frame per episode.
4. MP4 decode checks (v2.1 and v3.0 exports): a few keyframes of every file decode, and every
   frame of one randomly chosen file per camera (``full``: of every file) decodes, as many frames
   as the container says.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eva.dataset import fsafe, layout
from eva.dataset.atomic import read_json, read_json_object, read_jsonl
from eva.dataset.decode_check import verify_videos
from eva.dataset.errors import DatasetError
from eva.dataset.validate import Problem
from eva.formats import catalog
from eva.formats.catalog import FormatEntry
from eva.quality.split import plan_split
from eva.quality.verdicts import read_episode_rows


def default_source_for(export_dir: Path) -> Path | None:
    """The source dir an export dir was derived from (``<parent>/export/<fmt>/<subset>`` of a source named ``raw``, else
    ``<parent>/<name>_export/...``), or None if not derivable."""
    root = Path(export_dir).resolve().parent  # .../<export>/<fmt>
    container = root.parent
    if container.name == "export":
        return container.parent / "raw"
    if container.name.endswith("_export") and len(container.name) > len("_export"):
        return container.parent / container.name[: -len("_export")]
    return None


@dataclass
class VerifyReport:
    export_dir: Path  # the resolved directory that was checked
    problems: list[Problem] = field(default_factory=list)
    source: Path | None = None  # the source compared with; None: own consistency only


def _source_to_compare(export_dir: Path, given: Path | str | None) -> tuple[Path | None, bool]:
    """The source to compare the subset with, and whether the subset sits at its home place in
    that source's export tree. ``given`` (``--source``) always wins; else the source derived from
    the export's place, if such a dataset exists there. A moved or renamed copy has none: its
    marker's ``source_dir`` is a record of where it came from, not something it must match."""
    if given is not None:
        source = Path(os.path.realpath(given))
    else:
        derived = default_source_for(export_dir)
        if derived is None or not (derived / layout.EPISODES).is_file():
            return None, False
        source = Path(os.path.realpath(derived))
    entry = catalog.find(export_dir.parent.name)
    if entry is None:  # the parent does not name a format: not at home
        return source, False
    return source, entry.export_paths(source).get(export_dir.name) == export_dir


def _check_marker_totals(export_dir: Path, marker: dict[str, Any], problem: Any) -> None:
    """The marker agrees with itself and with the subset's own info.json (no source needed)."""
    indices = marker.get("source_episode_indices")
    if not isinstance(indices, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in indices
    ):
        problem(
            "quality_split", f"field 'source_episode_indices' {indices!r} is not a list of ints"
        )
        return
    if marker.get("total_episodes") != len(indices):
        problem(
            "quality_split",
            f"field 'total_episodes' {marker.get('total_episodes')!r} but "
            f"{len(indices)} source_episode_indices",
        )
    try:
        info = read_json_object(export_dir / layout.INFO)
    except (OSError, DatasetError):
        return  # the format's own verify names a missing or unreadable info.json
    for key in ("total_episodes", "total_frames"):
        if key in info and key in marker and info[key] != marker[key]:
            problem(
                "quality_split",
                f"field {key!r} is {marker[key]!r}, {export_dir / layout.INFO} says {info[key]!r}",
            )


def _read_marker(path: Path) -> dict[str, Any]:
    try:
        return read_json_object(path)  # any other failure: a DatasetError naming the file
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing") from None


def verify_export(
    export_dir: Path | str,
    *,
    source_dir: Path | str | None = None,
    fmt: FormatEntry | str | None = None,
    full: bool = False,
) -> list[Problem]:
    """Problems of one exported subset (empty: it verifies). MP4s are decode-checked by
    ``eva.dataset.decode_check.verify_videos``: sampled keyframes of every file and every frame
    of one random file per camera, or every frame of every file with ``full``."""
    return verify_export_report(export_dir, source_dir=source_dir, fmt=fmt, full=full).problems


def verify_export_report(
    export_dir: Path | str,
    *,
    source_dir: Path | str | None = None,
    fmt: FormatEntry | str | None = None,
    full: bool = False,
) -> VerifyReport:
    """``verify_export`` plus which source the subset was compared with (None: its own
    consistency only, for a moved copy whose source is not known)."""
    # The user's argument is resolved once (a symlink they name is their choice); nothing inside
    # the export is resolved after this.
    export_dir = Path(os.path.realpath(export_dir))
    report = VerifyReport(export_dir=export_dir)
    problems = report.problems
    marker_path = export_dir / layout.QUALITY_SPLIT

    def problem(code: str, message: str, path: Path = marker_path) -> None:
        problems.append(Problem(code, f"{path}: {message}", str(path), None))

    if not export_dir.is_dir():
        problem("missing_export", "export directory does not exist", export_dir)
        return report
    # An export someone hands over is hostile input like a dataset: pyarrow, PyAV, h5py and the
    # mcap reader open paths themselves, so a link (another episode's file, or one outside) or
    # a FIFO (an open that never returns) anywhere in it is refused before any file is read.
    try:
        fsafe.check_subtree(export_dir)
    except DatasetError as e:
        path = str(e).split(": ", 1)[0]
        problems.append(Problem("unsafe_path", str(e), path, None))
        return report
    try:
        marker = _read_marker(marker_path)
    except DatasetError as e:
        problem("quality_split", str(e).split(": ", 1)[-1])
        return report

    # Where the subset sits says nothing about what it is: a moved or renamed copy is checked
    # by what its own marker says, and compared with a source only when one is known.
    subset = marker.get("subset")
    if subset not in layout.SUBSETS:
        problem("subset", f"field 'subset' {subset!r} is neither accepted nor rejected")
        subset = None
    elif export_dir.name in layout.SUBSETS and export_dir.name != subset:
        problem("subset", f"field 'subset' is {subset!r}, directory is {export_dir.name!r}")
    entry = _marker_format(export_dir, marker, fmt, problem)
    if entry is None:
        return report

    _check_marker_totals(export_dir, marker, problem)
    _check_edits(export_dir, marker, problem)
    report.source = _compare_with_source(export_dir, marker, subset, source_dir, problem)
    try:
        module = entry.load()
    except DatasetError as e:
        problem("format", str(e), export_dir)
        return report
    shape = _meta_shape_problems(export_dir)
    if shape:  # the format verifiers read these fields as what eva writes
        problems.extend(shape)
        return report
    try:
        problems.extend(module.verify(export_dir))
    except (TypeError, AttributeError, KeyError, IndexError, ValueError) as e:
        # Metadata of a shape the checks above do not know yet: a named problem, not a
        # traceback (the verifier's job is to report what is wrong with a handed-over copy).
        problem("unreadable_meta", f"metadata of an unexpected shape ({e!r})", export_dir)
        return report
    problems.extend(verify_videos(export_dir, full=full))
    return report


def _marker_format(
    export_dir: Path,
    marker: dict[str, Any],
    fmt: FormatEntry | str | None,
    problem: Callable[[str, str], None],
) -> FormatEntry | None:
    """The format the marker names (None, a problem reported, when it names none), checked
    against the one expected: ``fmt`` (``--format``), else the one the directory's parent
    names at home (``<export root>/<fmt>/<subset>``)."""
    if fmt is not None:
        expected: FormatEntry | None = catalog.as_entry(fmt)
    else:
        expected = catalog.find(export_dir.parent.name)
    marker_fmt = marker.get("dataset_format")
    entry = catalog.named(marker_fmt)
    if entry is None:
        problem("dataset_format", f"field 'dataset_format' {marker_fmt!r} is not a known format")
        return None
    if expected is not None and entry != expected:
        problem(
            "dataset_format",
            f"field 'dataset_format' is {marker_fmt!r}, expected {expected.name!r}",
        )
    return entry


def _compare_with_source(
    export_dir: Path,
    marker: dict[str, Any],
    subset: str | None,
    source_dir: Path | str | None,
    problem: Callable[..., None],
) -> Path | None:
    """The marker against the source (``--source``, else the one the export's place derives):
    the same source and what its current review gives for the subset, the sibling subset of
    the same run. Returns the source compared with (None: none is known)."""
    recorded = marker.get("source_dir")
    if not isinstance(recorded, str) or not Path(recorded).is_absolute():
        problem("source_dir", f"field 'source_dir' {recorded!r} is not an absolute path")
        recorded = None
    source, at_home = _source_to_compare(export_dir, source_dir)
    if source is not None and recorded is not None and subset is not None:
        if Path(recorded).resolve() != source:
            problem("source_dir", f"field 'source_dir' is {recorded}, current source is {source}")
        else:
            indices = marker.get("source_episode_indices")
            try:
                plan = plan_split(read_episode_rows(source))
                expected = plan.indices(subset)
            except (DatasetError, KeyError, ValueError) as e:
                problem("source_dir", f"cannot read the source review: {e}")
            else:
                if indices != expected:
                    problem(
                        "source_episode_indices",
                        f"field 'source_episode_indices' {indices} but the current review of the "
                        f"source gives {expected} (re-export after review changes)",
                    )
                elif marker.get("edits", {}) != plan.provenance(expected).get("edits", {}):
                    problem(
                        "edits",
                        "field 'edits' is not what the source's current edits give "
                        "(re-export after edits)",
                    )
    if subset is not None:
        # The sibling belongs to the same run: required at home, checked when a copy kept it.
        sibling = export_dir.parent / next(s for s in layout.SUBSETS if s != subset)
        if at_home or (export_dir.name == subset and sibling.is_dir()):
            try:
                fsafe.contained(export_dir.parent, sibling.name, "dir")  # not through a link
                other = _read_marker(sibling / layout.QUALITY_SPLIT)
            except DatasetError as e:
                problem("pair", f"sibling subset: {e}", sibling)
            else:
                if other.get("export_id") != marker.get("export_id"):
                    problem("pair", f"{sibling.name} belongs to another export run", sibling)
    return source


def _check_edits(export_dir: Path, marker: dict[str, Any], problem: Callable[..., None]) -> None:
    """The edits the marker records (``edits``: source episode -> its trim and task) against
    the subset's episodes: a trimmed episode's ``length`` is its kept frames' (the format's
    verify checks its rows and frames against that length), a re-tasked one's ``tasks`` is the
    edited task alone, and that task is in the subset's task table."""
    edits = marker.get("edits", {})
    indices = marker.get("source_episode_indices")
    if not edits:
        return
    if not isinstance(edits, dict) or not isinstance(indices, list):
        problem("edits", f"field 'edits' {edits!r} is not an object of source episodes")
        return
    try:
        rows = list(read_jsonl(export_dir / layout.EPISODES))
        tasks = {row.get("task") for row in read_jsonl(export_dir / layout.TASKS)}
    except (OSError, ValueError, DatasetError):
        return  # the format's verify names unreadable metadata
    output = {source: new for new, source in enumerate(indices)}
    for key, edit in edits.items():
        new = output.get(int(key)) if str(key).isdigit() else None
        if new is None or new >= len(rows) or not isinstance(edit, dict):
            problem("edits", f"field 'edits': {key!r} is not an episode of this subset")
            continue
        row, where = rows[new], f"episode {new} (source episode {key})"
        trim = edit.get("trim")
        if isinstance(trim, list) and len(trim) == 2 and row.get("length") != trim[1] - trim[0]:
            problem(
                "edits",
                f"{where}: length {row.get('length')} but its trim {trim} keeps "
                f"{trim[1] - trim[0]} frames",
                export_dir / layout.EPISODES,
            )
        task = edit.get("task")
        if task is not None and (row.get("tasks") != [task] or task not in tasks):
            problem(
                "edits",
                f"{where}: tasks {row.get('tasks')!r} but its edited task is {task!r}",
                export_dir / layout.EPISODES,
            )


def _meta_shape_problems(export_dir: Path) -> list[Problem]:
    """An export's info.json fields as every reader relies on them (the raw dataset's rules:
    fps, chunks_size, totals, every feature an object with a dtype and a shape), and every row
    of its jsonl metadata a JSON object."""
    from eva.dataset.reader import info_field_problems

    out: list[Problem] = []
    info_path = export_dir / layout.INFO
    try:
        info = read_json(info_path)
    except FileNotFoundError:
        return out  # the format's verify names a missing info.json
    except DatasetError as e:  # names the file: a link, a FIFO, not JSON (any reason)
        return [Problem("unreadable_meta", str(e), str(info_path), None)]
    if not isinstance(info, dict):
        return [Problem("invalid_info", f"{info_path}: not a JSON object", str(info_path), None)]
    for message in info_field_problems(info):
        out.append(Problem("invalid_info", f"{info_path}: {message}", str(info_path), None))
    for rel in (layout.EPISODES, layout.TASKS, layout.EPISODES_STATS):
        path = export_dir / rel
        try:
            rows: list[object] = list(read_jsonl(path))  # typed dicts, but any JSON value
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            out.append(Problem("unreadable_meta", f"{path}: unreadable ({e})", str(path), None))
            continue
        for number, row in enumerate(rows, 1):
            if not isinstance(row, dict):
                message = f"{path}: row {number} is not a JSON object"
                out.append(Problem("unreadable_meta", message, str(path), None))
                break
    return out
