"""May this accepted export be uploaded? (only the accepted directory of the latest completed export, whose marker
matches the current review and the requested format)

Upload is allowed only when ALL of these hold, checked in this order; the first that fails is
reported with its own reason code:

- ``no_backend``: ``collection.storage.sftp`` is configured;
- ``source_missing``: the source directory exists;
- ``never_exported`` / ``job_unreadable``: ``<export root>/job.json`` exists and is a readable
  export job record;
- ``job_mismatch``: that record is an export job for this source and this format;
- ``export_not_completed``: its state is ``completed`` (it is the latest job: the exporter
  replaces the record whenever a new job starts);
- ``accepted_dir_mismatch``: its ``accepted_dir`` is the path computed for the current source and
  format (``FormatEntry.export_paths``), and that directory exists (no symlink);
- ``marker_unreadable``: ``<accepted>/meta/quality_split.json`` is a readable JSON object;
- ``marker_not_accepted``: the marker says ``subset`` "accepted";
- ``format_mismatch``: its ``dataset_format`` equals the requested format;
- ``source_mismatch``: its ``source_dir`` resolves to the current source;
- ``review_unreadable``: the source's ``meta/episodes.jsonl`` (the current review) reads;
- ``stale_review``: the published pair holds what the current review gives
  (``eva.export.staleness``): no episode moved between accepted and rejected, none was recorded
  or removed since the export. A verdict changed after the export means exporting again.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eva.dataset import fsafe
from eva.dataset.atomic import UnreadableJSON, read_json_object
from eva.dataset.errors import DatasetError
from eva.dataset.layout import QUALITY_SPLIT, SUBSETS
from eva.export.staleness import compare_markers, current_plan, read_marker
from eva.formats import catalog
from eva.formats.catalog import FormatEntry
from eva.jobs import EXPORT_JOB

REASONS = (
    "no_backend",
    "source_missing",
    "never_exported",
    "job_unreadable",
    "job_mismatch",
    "export_not_completed",
    "accepted_dir_mismatch",
    "marker_unreadable",
    "marker_not_accepted",
    "format_mismatch",
    "source_mismatch",
    "review_unreadable",
    "stale_review",
)


class UploadRefused(Exception):
    """The gate said no; ``reason`` is one of ``REASONS``, the message says why in one line."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class UploadPermit:
    source_dir: Path  # resolved
    format: str  # the format's name
    export_root: Path
    accepted_dir: Path
    export_job: dict[str, Any]
    marker: dict[str, Any]

    @property
    def export_job_id(self) -> str | None:
        job_id = self.export_job.get("job_id")
        return job_id if isinstance(job_id, str) else None


def _same_path(recorded: object, expected: Path) -> bool:
    if not isinstance(recorded, str) or not recorded:
        return False
    try:
        return Path(recorded).resolve() == expected.resolve()
    except (OSError, RuntimeError):
        return False


def _unreadable(error: DatasetError) -> str:
    """Why a record could not be read, without the path the refusal names already."""
    return error.reason if isinstance(error, UnreadableJSON) else str(error)


def check_upload(
    source_dir: Path, fmt: FormatEntry | str, *, backend_configured: bool
) -> UploadPermit:
    """Return the permit for uploading the accepted export of ``source_dir`` in ``fmt`` (its
    catalogue entry, or a name a Python caller gives), or raise ``UploadRefused``."""
    fmt = catalog.as_entry(fmt)
    if not backend_configured:
        raise UploadRefused(
            "no_backend",
            "no upload backend configured: add a [collection.storage.sftp] table to the config",
        )
    source = Path(source_dir)
    if not source.is_dir():
        raise UploadRefused("source_missing", f"{source}: source dataset directory not found")
    source = source.resolve()
    root = fmt.export_root(source)
    expected_accepted = fmt.export_paths(source)["accepted"]
    try:
        fsafe.check_export_tree(root)  # export/ or export/<fmt> a symlink: never read through it
    except DatasetError as e:
        raise UploadRefused("accepted_dir_mismatch", str(e)) from None
    job = _completed_export_job(root / EXPORT_JOB, fmt, source)
    recorded_accepted = job.get("accepted_dir")
    if not _same_path(recorded_accepted, expected_accepted):
        raise UploadRefused(
            "accepted_dir_mismatch",
            f"{root / EXPORT_JOB}: accepted_dir {recorded_accepted!r} is not the current accepted "
            f"export {expected_accepted}",
        )
    marker = _accepted_marker(expected_accepted, fmt, source)
    check_review(source, fmt.name, root)
    return UploadPermit(
        source_dir=source,
        format=fmt.name,
        export_root=root,
        accepted_dir=expected_accepted,
        export_job=job,
        marker=marker,
    )


def _completed_export_job(job_file: Path, fmt: FormatEntry, source: Path) -> dict[str, Any]:
    """The export root's job record, if it is the completed export of ``source`` in ``fmt``."""
    try:
        job = read_json_object(job_file)  # no link, no FIFO, JSON (any failure a DatasetError)
    except FileNotFoundError:
        raise UploadRefused(
            "never_exported",
            f"{source}: never exported as {fmt} (no {job_file}); run the export first",
        ) from None
    except DatasetError as e:
        raise UploadRefused(
            "job_unreadable", f"{job_file}: unreadable export job record ({_unreadable(e)})"
        ) from None

    kind = job.get("kind", "export")
    if kind != "export":
        raise UploadRefused("job_mismatch", f"{job_file}: is a {kind!r} job, not an export job")
    job_format = job.get("format")
    if not isinstance(job_format, str) or catalog.find(job_format) != fmt:
        raise UploadRefused(
            "job_mismatch",
            f"{job_file}: the latest export job is for format {job_format!r}, not {fmt}",
        )
    if not _same_path(job.get("source_dir"), source):
        raise UploadRefused(
            "job_mismatch",
            f"{job_file}: the latest export job is for source {job.get('source_dir')!r}, not {source}",
        )
    state = job.get("state")
    if state != "completed":
        detail = f" ({job['error']})" if state == "failed" and job.get("error") else ""
        raise UploadRefused(
            "export_not_completed",
            f"{job_file}: the latest {fmt} export job is {state!r}, not completed{detail}; "
            "export again",
        )
    return job


def _accepted_marker(accepted: Path, fmt: FormatEntry, source: Path) -> dict[str, Any]:
    """The accepted directory's quality marker, if that is a real directory and the marker says
    it holds the accepted subset of ``source`` in ``fmt``."""
    try:
        accepted_stat = os.lstat(accepted)
    except OSError:
        raise UploadRefused(
            "accepted_dir_mismatch", f"{accepted}: accepted export directory is missing"
        ) from None
    if not stat.S_ISDIR(accepted_stat.st_mode):
        raise UploadRefused(
            "accepted_dir_mismatch", f"{accepted}: is not a real directory (symlink?)"
        )
    marker_path = accepted / QUALITY_SPLIT
    try:
        marker = read_json_object(marker_path)
    except FileNotFoundError:
        raise UploadRefused(
            "marker_unreadable", f"{marker_path}: unreadable quality marker (missing)"
        ) from None
    except DatasetError as e:
        raise UploadRefused(
            "marker_unreadable", f"{marker_path}: unreadable quality marker ({_unreadable(e)})"
        ) from None
    if marker.get("subset") != "accepted":
        raise UploadRefused(
            "marker_not_accepted",
            f"{marker_path}: subset is {marker.get('subset')!r}; only the accepted subset is uploaded",
        )
    marker_format = marker.get("dataset_format")
    if marker_format != fmt.name:
        raise UploadRefused(
            "format_mismatch",
            f"{marker_path}: dataset_format is {marker_format!r}, not the requested {fmt}; "
            f"export as {fmt} first",
        )
    if not _same_path(marker.get("source_dir"), source):
        raise UploadRefused(
            "source_mismatch",
            f"{marker_path}: source_dir {marker.get('source_dir')!r} is not the current source {source}",
        )
    return marker


def check_review(source: Path, fmt: str, root: Path) -> None:
    """Refuse (``stale_review``) a published pair that the current review no longer gives: an
    upload would send episodes the operator has rejected since, or miss ones accepted since.
    ``fmt``: the format's name; ``root``: its export root."""
    try:
        plan = current_plan(source)
        unknown = review_field_problems(source)
    except DatasetError as e:
        raise UploadRefused("review_unreadable", f"cannot read the current review: {e}") from None
    if unknown:  # a verdict the rule cannot read ("failed") would count as no verdict
        raise UploadRefused("review_unreadable", f"the current review: {unknown[0]}")
    markers = {subset: read_marker(root / subset) for subset in SUBSETS}
    state = compare_markers(fmt, root, markers, plan)
    if state.stale:
        raise UploadRefused(
            "stale_review",
            f"{root}: the {fmt} export is stale, the review changed since it was made "
            f"({state.describe()}); export again",
        )


def review_field_problems(source: Path) -> list[str]:
    """The review fields of ``source``'s episodes.jsonl rows that eva validate refuses (a
    verdict or quality flag the accept/reject rule does not know, and the like)."""
    from eva.dataset.validate import ProblemCollector
    from eva.dataset.validate.meta import check_review_fields
    from eva.quality.verdicts import read_episode_rows

    out = ProblemCollector()
    for row in read_episode_rows(source):
        check_review_fields(source, row, row["episode_index"], out)
    return [p.message for p in out.problems]


def dataset_name_for(source_dir: Path) -> str:
    """The dataset's name: ``<log_dir>/<name>/raw`` -> ``name``; any other source -> its name."""
    source = Path(source_dir).resolve()
    return source.parent.name if source.name == "raw" else source.name


def remote_name_for(source_dir: Path, fmt: str) -> str:
    """The remote directory's name: the dataset's and the format it holds
    (``pick_cube-lerobot_v3``), so that one dataset's formats never take each other's name."""
    return f"{dataset_name_for(source_dir)}-{fmt}"
