"""Send a local directory tree over SFTP (paramiko) and publish it with one remote rename.

How an upload goes:
1. Open ``connections`` SSH connections (``upload/connect.py``: host key checked against
   known_hosts on every one; an unknown key is refused unless the caller opts in, which then
   records it after the first successful login). Authentication is by key only: the configured
   identity file, else the keys of the running ssh-agent.
2. Create ``<remote_dir>`` if missing, then a hidden staging directory beside the target:
   ``<remote_dir>/.<name>.eva-staging-<random>``. Its path is reported through ``on_staging``
   before any file is written, so the caller can record it for ``--resume``.
3. Send every file into staging (``upload/transfer.py``). Each worker owns one SFTP channel
   (``sessions_per_connection`` per connection) and keeps up to ``max_inflight`` WRITE requests
   of ``request_size`` bytes in flight, checking the server's status reply of every one
   (paramiko's own pipelined mode drops the replies of failed writes;
   ``upload/paramiko_compat.py`` holds the paramiko internals this needs). Largest files go
   first so the workers finish together.
4. Publish with ONE plain SFTP rename (SSH_FXP_RENAME). OpenSSH's server refuses it when the new
   name exists (a file or a directory, even an empty one); ``posix-rename@openssh.com`` would
   replace an empty directory, so it is never used here. If the target exists the upload is
   published as ``<target>.copy_<UTC timestamp>``, then ``..._02``, ``..._03``...
   Only SFTP requests are used: SFTP-only accounts (``ForceCommand internal-sftp``) work.
5. On any error the staging directory is removed (over a fresh connection if the old ones died),
   nothing is published and an existing target is untouched. A cancel (``UploadInterrupted``)
   keeps the staging directory so that ``resume_staging`` can continue it later: every staged
   file is read back and its SHA-256 compared with the same bytes of the local file. A complete
   match is skipped, a matching prefix (a file cut off mid-way) is continued from its end,
   anything else is sent again from the start.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import secrets
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import paramiko

from eva.dataset.layout import check_component
from eva.progress import ProgressSink, null_progress
from eva.upload.config import SftpConfig
from eva.upload.connect import Connector
from eva.upload.errors import UploadError as UploadError  # re-exported: eva.cli catches it here
from eva.upload.errors import UploadInterrupted
from eva.upload.transfer import LocalFile as LocalFile  # re-exported: part of a LocalTree
from eva.upload.transfer import Pipeline, describe_failure, remote_lstat, send_files

STAGING_MARK = ".eva-staging-"
# OpenSSH's sftp-server accepts messages up to 256 KiB; 255 KiB of data leaves room for headers.
DEFAULT_REQUEST_SIZE = 255 * 1024
MAX_COPY_ATTEMPTS = 99


@dataclass(frozen=True)
class LocalTree:
    root: Path
    dirs: tuple[str, ...]  # relative, parents before children
    files: tuple[LocalFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def scan_local_tree(root: Path) -> LocalTree:
    """List a tree for upload, refusing symlinks, special files and names SFTP cannot carry."""
    root = Path(root)
    try:
        root_stat = os.lstat(root)
    except OSError as e:
        raise UploadError(f"{root}: cannot read the directory to upload ({e.strerror})") from None
    if stat.S_ISLNK(root_stat.st_mode):
        raise UploadError(f"{root}: is a symlink; refusing to upload through it")
    if not stat.S_ISDIR(root_stat.st_mode):
        raise UploadError(f"{root}: is not a directory")
    dirs: list[str] = []
    files: list[LocalFile] = []

    def walk(directory: Path, rel: str) -> None:
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as e:
            raise UploadError(f"{directory}: cannot list ({e.strerror})") from None
        for entry in entries:
            child_rel = f"{rel}/{entry.name}" if rel else entry.name
            child = Path(entry.path)
            try:
                entry.name.encode("utf-8")
            except UnicodeEncodeError:
                raise UploadError(f"{child}: file name is not valid UTF-8") from None
            if any(ord(c) < 0x20 for c in entry.name):
                raise UploadError(f"{child}: file name contains control characters")
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise UploadError(f"{child}: is a symlink; refusing to upload (copy the data in)")
            if stat.S_ISDIR(st.st_mode):
                dirs.append(child_rel)
                walk(child, child_rel)
            elif stat.S_ISREG(st.st_mode):
                files.append(LocalFile(child_rel, child, st.st_size))
            else:
                raise UploadError(f"{child}: is not a regular file or directory")

    walk(root, "")
    return LocalTree(root=root, dirs=tuple(dirs), files=tuple(files))


@dataclass
class UploadOptions:
    accept_new_host_key: bool = False
    connections: int = 2
    sessions_per_connection: int = 2
    request_size: int = DEFAULT_REQUEST_SIZE
    # Per channel. Measured on loopback (bench_upload): 2-4 outstanding 255 KiB writes per
    # channel beat 16 by ~1.5x; deeper queues only wait on OpenSSH's 2 MB channel window.
    max_inflight: int = 4
    connect_timeout: float = 20.0
    # The UTC clock used for the ``.copy_<timestamp>`` name (injectable for tests).
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))


@dataclass
class UploadResult:
    remote_path: str  # where the tree was actually published
    target_path: str  # the preferred name (remote_path differs on a conflict)
    staging_path: str
    files: int
    bytes: int
    skipped_files: int = 0
    skipped_bytes: int = 0
    resumed: bool = False
    host_key_recorded: bool = False

    @property
    def used_copy_name(self) -> bool:
        return self.remote_path != self.target_path

    def as_dict(self) -> dict[str, object]:
        return {
            "remote_path": self.remote_path,
            "target_path": self.target_path,
            "staging_path": self.staging_path,
            "files": self.files,
            "bytes": self.bytes,
            "skipped_files": self.skipped_files,
            "skipped_bytes": self.skipped_bytes,
            "resumed": self.resumed,
            "host_key_recorded": self.host_key_recorded,
        }


# ---- remote helpers ---------------------------------------------------------------------------


def ensure_remote_dir(sftp: paramiko.SFTPClient, remote_dir: str) -> None:
    """``mkdir -p`` over SFTP; every existing component must be a directory."""
    current = ""
    for part in remote_dir.strip("/").split("/"):
        current = f"{current}/{part}"
        try:
            attrs = sftp.stat(
                current
            )  # follows symlinks: a linked remote_dir is the admin's choice
        except FileNotFoundError:
            try:
                sftp.mkdir(current)
            except OSError as e:
                if remote_lstat(sftp, current) is None:
                    raise UploadError(
                        f"remote_dir {remote_dir}: cannot create {current} ({e})"
                    ) from None
            continue
        except OSError as e:
            raise UploadError(f"remote_dir {remote_dir}: cannot access {current} ({e})") from None
        if not stat.S_ISDIR(attrs.st_mode or 0):
            raise UploadError(f"remote_dir {remote_dir}: {current} exists and is not a directory")


def remove_remote_tree(sftp: paramiko.SFTPClient, path: str) -> None:
    """Delete a remote directory tree without following symlinks (readdir attrs are lstat)."""
    for attrs in sftp.listdir_attr(path):
        child = posixpath.join(path, attrs.filename)
        if stat.S_ISDIR(attrs.st_mode or 0):
            remove_remote_tree(sftp, child)
        else:
            sftp.remove(child)
    sftp.rmdir(path)


def _prune_staging(
    sftp: paramiko.SFTPClient, staging: str, rel: str, dirs: set[str], files: set[str]
) -> None:
    """Remove staged entries that are not in the local tree (or have the wrong type)."""
    for attrs in sftp.listdir_attr(posixpath.join(staging, rel) if rel else staging):
        child_rel = f"{rel}/{attrs.filename}" if rel else attrs.filename
        path = posixpath.join(staging, child_rel)
        is_dir = stat.S_ISDIR(attrs.st_mode or 0)
        if is_dir and child_rel in dirs:
            _prune_staging(sftp, staging, child_rel, dirs, files)
        elif is_dir:
            remove_remote_tree(sftp, path)
        elif child_rel not in files or not stat.S_ISREG(attrs.st_mode or 0):
            sftp.remove(path)


def staging_path_for(remote_dir: str, dataset_name: str, token: str) -> str:
    return posixpath.join(remote_dir, f".{dataset_name}{STAGING_MARK}{token}")


def copy_candidates(target: str, now: datetime) -> Iterator[str]:
    """``target``, then ``target.copy_<UTC ts>``, ``..._02``, ``..._03``, ..."""
    yield target
    stamp = now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    yield f"{target}.copy_{stamp}"
    for n in range(2, MAX_COPY_ATTEMPTS + 1):
        yield f"{target}.copy_{stamp}_{n:02d}"


def publish_staging(sftp: paramiko.SFTPClient, staging: str, target: str, now: datetime) -> str:
    """Rename ``staging`` to the first free name; returns the name used. Never replaces anything."""
    for candidate in copy_candidates(target, now):
        try:
            sftp.rename(staging, candidate)  # SSH_FXP_RENAME: fails if ``candidate`` exists
            return candidate
        except OSError as e:
            if remote_lstat(sftp, candidate) is not None:
                continue  # taken: try the next copy name
            raise UploadError(f"publishing {staging} as {candidate} failed: {e}") from None
    raise UploadError(f"{target}: all {MAX_COPY_ATTEMPTS} copy names are taken")


def upload_tree(
    config: SftpConfig,
    tree: LocalTree,
    dataset_name: str,
    *,
    options: UploadOptions | None = None,
    progress: ProgressSink = null_progress,
    cancel: threading.Event | None = None,
    resume_staging: str | None = None,
    discard_staging: str | None = None,
    on_staging: Callable[[str], None] | None = None,
    before_publish: Callable[[], None] | None = None,
) -> UploadResult:
    """Upload ``tree`` to ``<remote_dir>/<dataset_name>`` (or a copy name) and publish it.

    ``resume_staging``: continue in that staging dir if it still exists. ``discard_staging``: an
    abandoned staging dir of an earlier upload of this dataset, deleted (best effort) first.
    ``before_publish``: called once every file is staged; an exception from it stops the upload
    (the staging dir is removed) instead of publishing."""
    options = options or UploadOptions()
    cancel = cancel or threading.Event()
    check_component(dataset_name, "dataset name")
    target = config.target_path(dataset_name)
    connector = Connector(
        config,
        accept_new_host_key=options.accept_new_host_key,
        connect_timeout=options.connect_timeout,
    )
    transports: list[paramiko.Transport] = []
    clients: list[paramiko.SFTPClient] = []
    staging: str | None = None
    published = False
    try:
        transports.append(connector.open_transport())
        control = paramiko.SFTPClient.from_transport(transports[0])
        if control is None:
            raise UploadError(f"{config.describe()}: the server refused the SFTP subsystem")
        clients.append(control)
        ensure_remote_dir(control, config.remote_dir)
        staging, resumed = _open_staging(
            control, config, dataset_name, resume_staging, discard_staging
        )
        if on_staging is not None:
            on_staging(staging)
        _make_staged_dirs(control, staging, tree, resumed)
        _open_channels(connector, transports, clients, options, len(tree.files))
        skipped_files, skipped_bytes = _stage_files(
            clients, tree, staging, resumed, options, progress, cancel
        )
        if before_publish is not None:
            before_publish()
        remote_path = publish_staging(control, staging, target, options.clock())
        published = True
        return UploadResult(
            remote_path=remote_path,
            target_path=target,
            staging_path=staging,
            files=len(tree.files),
            bytes=tree.total_bytes,
            skipped_files=skipped_files,
            skipped_bytes=skipped_bytes,
            resumed=resumed,
            host_key_recorded=connector.host_key_recorded,
        )
    except UploadInterrupted:
        raise
    except BaseException as e:
        if staging is not None and not published:
            cleanup_error = _remove_staging(connector, transports, staging)
            if cleanup_error and isinstance(e, UploadError):
                raise UploadError(f"{e}; also failed to remove staging: {cleanup_error}") from None
        if isinstance(e, (OSError, paramiko.SSHException, EOFError)):
            raise UploadError(
                f"upload to {config.describe()} failed: {describe_failure(e)}"
            ) from None
        raise
    finally:
        _close_all(clients, transports)


def _close_all(clients: list[paramiko.SFTPClient], transports: list[paramiko.Transport]) -> None:
    for client in clients:
        with contextlib.suppress(Exception):
            client.close()
    for transport in transports:
        with contextlib.suppress(Exception):
            transport.close()


def _open_staging(
    control: paramiko.SFTPClient,
    config: SftpConfig,
    dataset_name: str,
    resume_staging: str | None,
    discard_staging: str | None,
) -> tuple[str, bool]:
    """The staging dir to send into, and whether it is ``resume_staging`` resumed (else a new
    one); ``discard_staging`` is removed first (best effort). Only staging dirs of this dataset
    beside its target are touched."""
    prefix = f".{dataset_name}{STAGING_MARK}"

    def ours(path: str) -> bool:
        return posixpath.dirname(path) == config.remote_dir and posixpath.basename(path).startswith(
            prefix
        )

    if discard_staging and discard_staging != resume_staging and ours(discard_staging):
        with contextlib.suppress(OSError):
            if remote_lstat(control, discard_staging) is not None:
                remove_remote_tree(control, discard_staging)
    if resume_staging is not None:
        if not ours(resume_staging):
            target = config.target_path(dataset_name)
            raise UploadError(f"resume: {resume_staging} is not a staging dir of {target}")
        attrs = remote_lstat(control, resume_staging)
        if attrs is not None and stat.S_ISDIR(attrs.st_mode or 0):
            return resume_staging, True
    staging = staging_path_for(config.remote_dir, dataset_name, secrets.token_hex(8))
    try:
        control.mkdir(staging)  # server umask: the published dir keeps it
    except OSError as e:
        raise UploadError(f"cannot create staging directory {staging}: {e}") from None
    return staging, False


def _make_staged_dirs(
    control: paramiko.SFTPClient, staging: str, tree: LocalTree, resumed: bool
) -> None:
    """The tree's directories in ``staging``; a resumed staging dir first loses whatever the
    local tree does not hold (only that may be published)."""
    if resumed:
        _prune_staging(control, staging, "", set(tree.dirs), {f.rel for f in tree.files})
    for rel in tree.dirs:
        path = posixpath.join(staging, rel)
        if resumed and remote_lstat(control, path) is not None:
            continue  # pruning left only directories at directory paths
        control.mkdir(path)


def _stage_files(
    clients: list[paramiko.SFTPClient],
    tree: LocalTree,
    staging: str,
    resumed: bool,
    options: UploadOptions,
    progress: ProgressSink,
    cancel: threading.Event,
) -> tuple[int, int]:
    """Send the tree's files into ``staging``, one worker per client; returns the (files, bytes)
    a resume found staged already. A cancel keeps what is staged (``UploadInterrupted``)."""
    pipeline = Pipeline(options.request_size, options.max_inflight)
    skipped = send_files(
        clients, tree.files, staging, pipeline, resume=resumed, progress=progress, cancel=cancel
    )
    if cancel.is_set():
        raise UploadInterrupted(f"upload cancelled; staged files kept in {staging} for --resume")
    return skipped


def _open_channels(
    connector: Connector,
    transports: list[paramiko.Transport],
    clients: list[paramiko.SFTPClient],
    options: UploadOptions,
    files: int,
) -> None:
    """Add connections and SFTP channels (one per worker) up to what ``options`` ask for, and
    no more channels than files."""
    workers_wanted = max(1, options.connections) * max(1, options.sessions_per_connection)
    workers_wanted = min(workers_wanted, max(1, files))
    connections_wanted = min(max(1, options.connections), workers_wanted)
    while len(transports) < connections_wanted:
        transports.append(connector.open_transport())
    while len(clients) < workers_wanted:
        client = paramiko.SFTPClient.from_transport(transports[len(clients) % len(transports)])
        if client is None:
            raise UploadError(f"{connector.config.describe()}: the server refused an SFTP session")
        clients.append(client)


def _remove_staging(
    connector: Connector, transports: list[paramiko.Transport], staging: str
) -> str | None:
    """Remove the staging tree; reconnect once if the old connections are gone. Returns an error."""
    # Each live connection, then (None) one fresh connection.
    attempts: list[paramiko.Transport | None] = [t for t in transports if t.is_active()]
    attempts.append(None)
    error: str | None = None
    for reused in attempts:
        try:
            transport = reused if reused is not None else connector.open_transport()
            if transport not in transports:
                transports.append(transport)
            sftp = paramiko.SFTPClient.from_transport(transport)
            if sftp is None:
                continue
            try:
                if remote_lstat(sftp, staging) is not None:
                    remove_remote_tree(sftp, staging)
                return None
            finally:
                sftp.close()
        except Exception as e:
            error = describe_failure(e)
    return error
