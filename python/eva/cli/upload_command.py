"""``eva upload``: send an accepted export over SFTP."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from eva.cli.output import (
    EXIT_INTERRUPTED,
    FormatChoice,
    emit_json,
    event_printer,
    fail,
    format_help,
    human_bytes,
    say,
    verbosity,
    verbosity_options,
)
from eva.cli.progress import ProgressBar
from eva.textsafe import printable

if TYPE_CHECKING:
    from eva.upload.job import UploadJob


def _upload_source_dir(dataset: str, collection: dict[str, Any], config_path: str) -> Any:
    """DATASET is the raw source directory, or a dataset name resolved like COLLECT does:
    ``<log_dir>/<sanitised name>/raw`` (empty log_dir -> eva.config's derived work directory).
    Only ``log_dir`` is read, so uploading does not depend on the capture settings."""
    from eva.config import ConfigError, dataset_dir, resolve_log_dir

    path = Path(dataset).expanduser()
    if path.is_dir() or "/" in dataset:
        return path
    log_dir_text = collection.get("log_dir", "")
    if not isinstance(log_dir_text, str):
        fail(f"{config_path}: collection.log_dir must be a string")
    log_dir, _ = resolve_log_dir(log_dir_text, Path(config_path).resolve().parent)
    try:
        return dataset_dir(log_dir, dataset)
    except ConfigError as e:
        fail(str(e))


def _show_upload(bar: ProgressBar, progress: dict[str, Any]) -> None:
    totals = progress.get("totals") or {}
    current = str(progress.get("current") or "")
    if len(current) > 40:
        current = "..." + current[-37:]
    files = f"files {progress.get('files') or 0}/{totals.get('files') or 0}"
    bar.update(
        progress.get("bytes") or 0,
        total=totals.get("bytes") or None,
        detail=printable(f"{files}  {current}"),
    )


@click.command("upload")
@verbosity_options()
@click.argument("dataset")
@click.option("--format", "fmt", required=True, type=FormatChoice(), help=format_help())
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="TOML config with a [collection.storage.sftp] table.",
)
@click.option(
    "--accept-new-host-key",
    is_flag=True,
    help="Trust and record the server's host key if known_hosts does not list it yet.",
)
@click.option("--resume", is_flag=True, help="Continue an interrupted upload of this export.")
@click.option(
    "--known-hosts",
    type=click.Path(dir_okay=False),
    default=None,
    help="known_hosts file (default: storage.sftp.known_hosts, else ~/.ssh/known_hosts).",
)
@click.option("--json", "as_json", is_flag=True, help="Progress and result as JSON lines.")
def upload_command(
    dataset: str,
    fmt: str,
    config_path: str,
    accept_new_host_key: bool,
    resume: bool,
    known_hosts: str | None,
    as_json: bool,
) -> None:
    """Upload the current accepted export of DATASET over SFTP.

    DATASET is the raw source directory (or a dataset name under collection.log_dir). Only the
    accepted directory of the latest completed export in FORMAT is sent; it is staged remotely and
    published by one rename under <remote_dir>/<dataset-name>, or <...>.copy_<UTC time> if taken.

    \b
    Example (the config's [collection.storage.sftp] names the server; docs/config.md):
      eva upload demo-data/logs/pick_cube/raw --format v3 --config demo-data/collect.toml
    """
    import dataclasses

    from eva.dataset.errors import DatasetError
    from eva.upload.config import UploadConfigError, load_upload_config
    from eva.upload.gate import UploadRefused
    from eva.upload.job import start_upload
    from eva.upload.sftp import UploadError, UploadOptions

    try:
        collection, sftp_config = load_upload_config(Path(config_path))
    except UploadConfigError as e:
        _refuse(str(e), as_json)
    if sftp_config is not None and known_hosts:
        sftp_config = dataclasses.replace(sftp_config, known_hosts=Path(known_hosts).resolve())
    source = _upload_source_dir(dataset, collection, config_path)
    try:
        job = start_upload(
            source,
            fmt,
            sftp_config,
            options=UploadOptions(accept_new_host_key=accept_new_host_key),
            resume=resume,
        )
    except UploadRefused as e:
        _refuse(f"upload refused ({e.reason}): {e}", as_json)
    except (UploadError, DatasetError, ValueError) as e:
        _refuse(str(e), as_json)

    quiet = as_json or verbosity() < 0
    bar = ProgressBar(f"upload {fmt}", unit="bytes", enabled=False if quiet else None)
    interrupted = _follow(job, bar, as_json)
    _show_upload(bar, job.record.progress)
    bar.close()
    _report(job, as_json, sftp_config.host if sftp_config else "", interrupted)


def _refuse(message: str, as_json: bool) -> NoReturn:
    """Exit 1 with ``message`` (also as a JSON error event with ``--json``)."""
    if as_json:
        emit_json({"event": "error", "error": message})
    fail(message)


def _follow(job: UploadJob, bar: ProgressBar, as_json: bool) -> bool:
    """Show the upload's progress until it ends; True when Ctrl-C cancelled it."""
    last_emit = 0.0
    emit_event = event_printer()
    try:
        while not job.wait(0.2):
            now = time.monotonic()
            if as_json and now - last_emit >= 0.5:
                emit_event({"event": "progress", "state": job.state, **job.record.progress})
                last_emit = now
            else:
                _show_upload(bar, job.record.progress)
    except KeyboardInterrupt:
        job.cancel()
        job.wait()
        return True
    return False


def _report(job: UploadJob, as_json: bool, host: str, interrupted: bool) -> None:
    """The ended upload's outcome: its result, or an exit without one (EXIT_INTERRUPTED after Ctrl-C)."""
    record = job.snapshot()
    if interrupted and job.result is None:
        kept = "; rerun with --resume to continue" if record.get("resumable") else ""
        say(f"eva: interrupted: nothing was published{kept}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    if job.result is None:
        message = f"upload failed: {job.error}"
        if record.get("resumable") and "--resume" not in message:
            message += " (rerun with --resume to continue)"
        _refuse(message, as_json)
    result = job.result.as_dict()
    if as_json:
        emit_json({"event": "result", "state": job.state, "job_id": record["job_id"], **result})
        return
    note = " (target existed: published under a copy name)" if job.result.used_copy_name else ""
    skipped = (
        f", {job.result.skipped_files} already staged files skipped" if job.result.resumed else ""
    )
    say(
        f"uploaded {job.result.files} files ({human_bytes(job.result.bytes)}) to "
        f"{host}:{job.result.remote_path}{note}{skipped}"
    )
