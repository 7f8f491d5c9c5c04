"""Sending files into an SFTP staging directory: one worker thread per SFTP channel, each
keeping ``max_inflight`` WRITE requests of ``request_size`` bytes in flight and checking the
server's status reply of every one (paramiko's own pipelined mode drops the replies of failed
writes; ``upload/paramiko_compat.py`` holds the paramiko internals this needs). Largest files
go first so the workers finish together. With ``resume``, a staged file is read back and its
SHA-256 compared with the same bytes of the local file: a complete match is skipped, a matching
prefix continued from its end, anything else sent again from the start.
"""

from __future__ import annotations

import hashlib
import posixpath
import queue
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import paramiko

from eva.progress import ProgressSink
from eva.upload import paramiko_compat
from eva.upload.errors import UploadError

__all__ = ["LocalFile", "describe_failure", "remote_lstat", "send_files", "staged_prefix"]


@dataclass(frozen=True)
class LocalFile:
    rel: str  # POSIX relative path inside the tree
    path: Path
    size: int


def remote_lstat(sftp: paramiko.SFTPClient, path: str) -> paramiko.SFTPAttributes | None:
    try:
        return sftp.lstat(path)
    except FileNotFoundError:
        return None


def sha256_remote(sftp: paramiko.SFTPClient, path: str, size: int) -> str:
    digest = hashlib.sha256()
    with sftp.open(path, "rb") as f:
        f.prefetch(size)
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class Pipeline:
    """How each channel sends: WRITE requests of ``request_size`` bytes, at most
    ``max_inflight`` of them awaiting the server's reply."""

    request_size: int
    max_inflight: int


class _Shared:
    """State shared by the worker threads (all mutation under ``lock``)."""

    def __init__(self, progress: ProgressSink, cancel: threading.Event) -> None:
        self.lock = threading.Lock()
        self.progress = progress
        self.cancel = cancel
        self.failed = threading.Event()
        self.error: BaseException | None = None
        self.skipped_files = 0
        self.skipped_bytes = 0

    def report(self, *, files: int = 0, nbytes: int = 0, current: str | None = None) -> None:
        with self.lock:
            self.progress(files=files, bytes=nbytes, current=current)

    def fail(self, error: BaseException) -> None:
        with self.lock:
            if self.error is None:
                self.error = error
        self.failed.set()

    def stopping(self) -> bool:
        return self.failed.is_set() or self.cancel.is_set()


def _send_file(
    sftp: paramiko.SFTPClient,
    local: LocalFile,
    remote: str,
    shared: _Shared,
    pipeline: Pipeline,
    start: int = 0,
) -> None:
    """Send ``local`` to ``remote`` from byte ``start`` on (0: create/truncate; >0: continue a
    verified prefix already on the server)."""
    buffer = bytearray(pipeline.request_size)
    view = memoryview(buffer)
    acks = paramiko_compat.WriteAcks()
    sent = start
    try:
        local_file = open(local.path, "rb")  # noqa: SIM115 - closed below
        local_file.seek(start)
    except OSError as e:
        raise UploadError(f"{local.path}: cannot read ({e.strerror})") from None
    # "r+b" keeps the verified prefix (no O_TRUNC); "wb" creates or truncates.
    with local_file, sftp.open(remote, "r+b" if start else "wb") as remote_file:
        # SFTPFile.handle is the server's handle string; paramiko's stubs type it as SFTPHandle
        # (the server-side class).
        handle = cast(bytes, remote_file.handle)
        while True:
            if shared.stopping():
                return
            try:
                n = local_file.readinto(buffer)
            except OSError as e:
                raise UploadError(f"{local.path}: read failed ({e.strerror})") from None
            if not n:
                break
            # send_write copies the view into the packet, so the buffer is reusable at once.
            paramiko_compat.send_write(sftp, acks, handle, sent, view[:n])
            sent += n
            shared.report(nbytes=n)
            while acks.pending >= pipeline.max_inflight:
                paramiko_compat.read_response(sftp)
            if acks.error:
                break
        while acks.pending > 0:
            paramiko_compat.read_response(sftp)
    if acks.error:
        raise UploadError(f"{remote}: remote write failed ({acks.error})")
    if sent != local.size:
        raise UploadError(f"{local.path}: changed during upload ({local.size} -> {sent} bytes)")
    remote_size = sftp.stat(remote).st_size
    if remote_size != local.size:
        raise UploadError(f"{remote}: remote size {remote_size} != local size {local.size}")
    shared.report(files=1)


def sha256_local_prefix(path: Path, length: int, buffer_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        remaining = length
        while remaining > 0 and (chunk := f.read(min(buffer_size, remaining))):
            digest.update(chunk)
            remaining -= len(chunk)
    return digest.hexdigest()


def staged_prefix(sftp: paramiko.SFTPClient, local: LocalFile, remote: str) -> int:
    """How many leading bytes of ``local`` the staged ``remote`` file already holds, verified by
    reading them back and comparing SHA-256: ``local.size`` (complete), a partial length, or 0."""
    attrs = remote_lstat(sftp, remote)
    if attrs is None or not stat.S_ISREG(attrs.st_mode or 0):
        return 0
    size = attrs.st_size or 0
    if size <= 0 or size > local.size:
        return 0
    if sha256_remote(sftp, remote, size) != sha256_local_prefix(local.path, size):
        return 0
    return size


def _worker(
    sftp: paramiko.SFTPClient,
    jobs: queue.SimpleQueue[LocalFile | None],
    staging: str,
    shared: _Shared,
    pipeline: Pipeline,
    resume: bool,
) -> None:
    remote = staging
    try:
        while not shared.stopping():
            local = jobs.get()
            if local is None:
                return
            remote = posixpath.join(staging, local.rel)
            shared.report(current=local.rel)
            start = staged_prefix(sftp, local, remote) if resume else 0
            if start:
                with shared.lock:
                    shared.skipped_bytes += start
                    if start == local.size:
                        shared.skipped_files += 1
                shared.report(nbytes=start)
            if start == local.size and local.size > 0:
                shared.report(files=1)
                continue
            _send_file(sftp, local, remote, shared, pipeline, start)
    except UploadError as e:
        shared.fail(e)
    except (OSError, paramiko.SSHException, EOFError) as e:
        shared.fail(UploadError(f"{remote}: transfer failed ({describe_failure(e)})"))
    except BaseException as e:  # surface anything else in the calling thread
        shared.fail(e)


def describe_failure(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def send_files(
    clients: list[paramiko.SFTPClient],
    files: tuple[LocalFile, ...],
    staging: str,
    pipeline: Pipeline,
    *,
    resume: bool,
    progress: ProgressSink,
    cancel: threading.Event,
) -> tuple[int, int]:
    """Send ``files`` into ``staging``, one worker per client; raises the first worker's error.
    Returns the (files, bytes) that resuming found staged already. A cancel stops the workers
    (the caller sees ``cancel`` set)."""
    shared = _Shared(progress, cancel)
    jobs: queue.SimpleQueue[LocalFile | None] = queue.SimpleQueue()
    for local in sorted(files, key=lambda f: (-f.size, f.rel)):
        jobs.put(local)
    for _ in clients:
        jobs.put(None)
    threads = [
        threading.Thread(
            target=_worker,
            args=(client, jobs, staging, shared, pipeline, resume),
            name=f"eva-upload-{i}",
            daemon=True,
        )
        for i, client in enumerate(clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if shared.error is not None:
        raise shared.error
    return shared.skipped_files, shared.skipped_bytes
