"""The upload gate: only the current accepted export of the requested format may be sent."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from sftp_server import make_export

from eva.dataset.layout import QUALITY_SPLIT
from eva.formats import catalog
from eva.jobs import EXPORT_JOB, UPLOAD_JOB, read_job, write_job
from eva.upload.config import SftpConfig
from eva.upload.gate import REASONS, UploadRefused, check_upload, dataset_name_for
from eva.upload.job import start_upload

pytestmark = pytest.mark.kernel_independent

# A backend that is never contacted: every test here is refused before any connection.
UNUSED_BACKEND = SftpConfig(host="127.0.0.1", port=9, remote_dir="/nonexistent/eva")


def refusal(source: Path, fmt: str, configured: bool = True) -> UploadRefused:
    with pytest.raises(UploadRefused) as info:
        check_upload(source, fmt, backend_configured=configured)
    assert info.value.reason in REASONS
    return info.value


def edit_json(path: Path, **changes: object) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_current_accepted_export_is_permitted(tmp_path: Path) -> None:
    source, accepted = make_export(tmp_path, fmt="hdf5")
    permit = check_upload(source, "h5", backend_configured=True)  # aliases are normalised
    assert permit.accepted_dir == accepted
    assert permit.format == "hdf5"
    assert permit.source_dir == source.resolve()
    assert permit.marker["subset"] == "accepted"
    assert permit.export_job_id


def test_no_backend_configured_starts_nothing(tmp_path: Path) -> None:
    source, _ = make_export(tmp_path)
    assert refusal(source, "hdf5", configured=False).reason == "no_backend"
    with pytest.raises(UploadRefused, match="no upload backend configured"):
        start_upload(source, "hdf5", None)
    assert not (catalog.parse("hdf5").export_root(source) / UPLOAD_JOB).exists()


def test_never_exported_source_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "fresh" / "raw"
    source.mkdir(parents=True)
    error = refusal(source, "mcap")
    assert error.reason == "never_exported"
    assert "never exported as mcap" in str(error)
    assert not (source.parent / "export").exists()  # refusing leaves no trace


def test_old_format_is_refused(tmp_path: Path) -> None:
    # Exported as HDF5, then the operator switched the selector to MCAP.
    source, _ = make_export(tmp_path, fmt="hdf5")
    assert refusal(source, "mcap").reason == "never_exported"
    # An HDF5 accepted dir moved into the MCAP place does not pass as MCAP either.
    mcap_root = catalog.parse("mcap").export_root(source)
    shutil.copytree(catalog.parse("hdf5").export_root(source), mcap_root)
    job = read_job(mcap_root / EXPORT_JOB)
    assert job is not None
    job.format = "mcap"
    job.accepted_dir = str(mcap_root / "accepted")
    write_job(mcap_root / EXPORT_JOB, job)
    error = refusal(source, "mcap")
    assert error.reason == "format_mismatch"
    assert "dataset_format is 'hdf5'" in str(error)


def test_job_for_another_format_is_refused(tmp_path: Path) -> None:
    source, _ = make_export(tmp_path, fmt="mcap")
    edit_json(catalog.parse("mcap").export_root(source) / EXPORT_JOB, format="hdf5")
    assert refusal(source, "mcap").reason == "job_mismatch"


@pytest.mark.parametrize("state", ["queued", "running", "failed"])
def test_export_job_must_be_completed(tmp_path: Path, state: str) -> None:
    source, _ = make_export(tmp_path, state=state)
    error = refusal(source, "hdf5")
    assert error.reason == "export_not_completed"
    assert repr(state) in str(error)


def test_rejected_dir_is_refused(tmp_path: Path) -> None:
    source, _ = make_export(tmp_path)
    root = catalog.parse("hdf5").export_root(source)
    # The job pointing at the rejected directory ...
    edit_json(root / EXPORT_JOB, accepted_dir=str(root / "rejected"))
    assert refusal(source, "hdf5").reason == "accepted_dir_mismatch"
    # ... or the rejected subset sitting in the accepted place.
    edit_json(root / EXPORT_JOB, accepted_dir=str(root / "accepted"))
    shutil.rmtree(root / "accepted")
    shutil.copytree(root / "rejected", root / "accepted")
    error = refusal(source, "hdf5")
    assert error.reason == "marker_not_accepted"
    assert "subset is 'rejected'" in str(error)


def test_accepted_dir_elsewhere_is_refused(tmp_path: Path) -> None:
    source, accepted = make_export(tmp_path)
    elsewhere = tmp_path / "copy_of_accepted"
    shutil.copytree(accepted, elsewhere)
    edit_json(catalog.parse("hdf5").export_root(source) / EXPORT_JOB, accepted_dir=str(elsewhere))
    assert refusal(source, "hdf5").reason == "accepted_dir_mismatch"


def test_missing_or_symlinked_accepted_dir_is_refused(tmp_path: Path) -> None:
    source, accepted = make_export(tmp_path)
    real = tmp_path / "real_accepted"
    accepted.rename(real)
    assert refusal(source, "hdf5").reason == "accepted_dir_mismatch"
    accepted.symlink_to(real, target_is_directory=True)
    assert refusal(source, "hdf5").reason == "accepted_dir_mismatch"


def test_mismatched_source_is_refused(tmp_path: Path) -> None:
    source, accepted = make_export(tmp_path)
    other, _ = make_export(tmp_path, name="other")
    edit_json(accepted / QUALITY_SPLIT, source_dir=str(other.resolve()))
    error = refusal(source, "hdf5")
    assert error.reason == "source_mismatch"
    assert str(other.resolve()) in str(error)


def test_job_for_another_source_is_refused(tmp_path: Path) -> None:
    source, _ = make_export(tmp_path)
    edit_json(
        catalog.parse("hdf5").export_root(source) / EXPORT_JOB, source_dir="/somewhere/else/raw"
    )
    assert refusal(source, "hdf5").reason == "job_mismatch"


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", ""])
def test_unreadable_marker_is_refused(tmp_path: Path, content: str) -> None:
    source, accepted = make_export(tmp_path)
    (accepted / QUALITY_SPLIT).write_text(content)
    assert refusal(source, "hdf5").reason == "marker_unreadable"


def test_missing_marker_is_refused(tmp_path: Path) -> None:
    source, accepted = make_export(tmp_path)
    (accepted / QUALITY_SPLIT).unlink()
    assert refusal(source, "hdf5").reason == "marker_unreadable"


def test_unreadable_job_record_is_refused(tmp_path: Path) -> None:
    source, _ = make_export(tmp_path)
    (catalog.parse("hdf5").export_root(source) / EXPORT_JOB).write_text("{torn")
    assert refusal(source, "hdf5").reason == "job_unreadable"


def test_missing_source_is_refused(tmp_path: Path) -> None:
    assert refusal(tmp_path / "nope" / "raw", "hdf5").reason == "source_missing"


def test_refusal_starts_no_upload_job(tmp_path: Path) -> None:
    source, accepted = make_export(tmp_path)
    edit_json(accepted / QUALITY_SPLIT, subset="rejected")
    with pytest.raises(UploadRefused):
        start_upload(source, "hdf5", UNUSED_BACKEND)
    assert not (catalog.parse("hdf5").export_root(source) / UPLOAD_JOB).exists()


def test_non_raw_source_uses_its_own_export_root_and_name(tmp_path: Path) -> None:
    source = tmp_path / "session_a"
    (source / "meta").mkdir(parents=True)
    paths = catalog.parse("lerobot_v3").export_paths(source)
    assert paths["accepted"] == tmp_path / "session_a_export" / "lerobot_v3" / "accepted"
    assert dataset_name_for(source) == "session_a"
    assert dataset_name_for(tmp_path / "pick" / "raw") == "pick"
