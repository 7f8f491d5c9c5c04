"""A real OpenSSH server on 127.0.0.1 for the upload tests and the upload benchmark.

``SshdServer`` generates a host key and a user key in a scratch directory, writes an unprivileged
sshd_config (own loopback port, no PAM, keys only, SFTP-only via ``ForceCommand internal-sftp`` so
the uploader provably needs no remote shell), starts ``sshd -D -e`` and waits until it answers.
The remote file system is this machine's, so a test's remote directory is just a temp path.

Use the pytest fixtures by listing this module in ``pytest_plugins`` of a test module. It holds
no test assertions, so pytest need not rewrite it (it is imported before it is registered):
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from eva.upload.config import SftpConfig

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ssh_keygen(path: Path, key_type: str = "ed25519") -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", key_type, "-N", "", "-C", "eva-test", "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return path


@dataclass
class SshdServer:
    """One sshd process; ``start()`` / ``stop()`` or use as a context manager."""

    workdir: Path
    port: int = 0
    process: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.user = getpass.getuser()
        self.host_key = ssh_keygen(self.workdir / "ssh_host_ed25519_key")
        self.client_key = ssh_keygen(self.workdir / "id_ed25519")
        self.authorized_keys = self.workdir / "authorized_keys"
        shutil.copyfile(self.workdir / "id_ed25519.pub", self.authorized_keys)
        self.log_path = self.workdir / "sshd.log"

    @property
    def host_public_key_line(self) -> str:
        """The host key as a known_hosts entry for ``[127.0.0.1]:port``."""
        key_type, key_b64 = (self.workdir / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        return f"[127.0.0.1]:{self.port} {key_type} {key_b64}\n"

    def write_known_hosts(self, path: Path) -> Path:
        path.write_text(self.host_public_key_line)
        return path

    def _write_config(self) -> Path:
        config = self.workdir / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"ListenAddress 127.0.0.1:{self.port}",
                    f"HostKey {self.host_key}",
                    f"PidFile {self.workdir / 'sshd.pid'}",
                    f"AuthorizedKeysFile {self.authorized_keys}",
                    "UsePAM no",
                    "StrictModes no",
                    "PermitRootLogin prohibit-password",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    f"AllowUsers {self.user}",
                    "MaxStartups 50",
                    "MaxSessions 20",
                    "LogLevel ERROR",
                    "Subsystem sftp internal-sftp",
                    # An SFTP-only account: no shell, no exec; the uploader must cope.
                    "ForceCommand internal-sftp",
                    "",
                ]
            )
        )
        return config

    def start(self, timeout: float = 15.0) -> SshdServer:
        if not os.path.exists(SSHD):
            raise RuntimeError(f"{SSHD} not found: install openssh-server (scripts/system_deps.sh)")
        if os.geteuid() == 0:
            # sshd refuses to start without its privilege-separation directory.
            PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        last_error = ""
        for _attempt in range(5):  # a free port can be taken between probe and bind
            self.port = free_loopback_port()
            config = self._write_config()
            log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
            self.process = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
            log.close()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    break
                if self._answers():
                    return self
                time.sleep(0.05)
            self.stop()
            last_error = self.log_path.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"sshd did not start on 127.0.0.1: {last_error}")

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
                s.settimeout(1.0)
                return s.recv(4).startswith(b"SSH-")
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self) -> SshdServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture(scope="session")
def sshd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdServer]:
    server = SshdServer(tmp_path_factory.mktemp("sshd"))
    with server:
        yield server


@pytest.fixture
def known_hosts(sshd_server: SshdServer, tmp_path: Path) -> Path:
    """A known_hosts file that already trusts the test server."""
    return sshd_server.write_known_hosts(tmp_path / "known_hosts")


@pytest.fixture
def remote_root(tmp_path: Path) -> Path:
    """The local path the test server exposes as the upload ``remote_dir``'s parent."""
    path = tmp_path / "remote"
    path.mkdir()
    return path


@contextlib.contextmanager
def ssh_agent(key: Path, workdir: Path) -> Iterator[str]:
    """A real ssh-agent holding ``key``; yields its socket path."""
    sock = workdir / "agent.sock"
    agent = subprocess.Popen(
        ["ssh-agent", "-D", "-a", str(sock)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        env = dict(os.environ, SSH_AUTH_SOCK=str(sock))
        subprocess.run(["ssh-add", "-q", str(key)], check=True, env=env, stdin=subprocess.DEVNULL)
        yield str(sock)
    finally:
        agent.terminate()
        agent.wait(timeout=10)


# ---- export trees for the upload tests ----------------------------------------------------------
# Until an export is produced by eva.export.pipeline in these tests, they build the published
# layout the gate reads (docs/formats.md, docs/design.md "Jobs") with the real job-record code.


def make_export(
    log_dir: Path,
    name: str = "pick",
    fmt: str = "hdf5",
    *,
    state: str = "completed",
    file_sizes: tuple[int, ...] = (150_000, 70_000, 3_000, 0),
    seed: int = 0,
) -> tuple[Path, Path]:
    """A raw source ``<log_dir>/<name>/raw`` and a completed export of it; returns (source,
    accepted_dir). Files are random bytes so a byte-for-byte comparison means something."""
    import json
    import random

    from eva.dataset.layout import QUALITY_SPLIT
    from eva.formats import catalog
    from eva.jobs import EXPORT_JOB, Job, write_job

    rng = random.Random(seed)
    source = Path(log_dir) / name / "raw"
    (source / "meta").mkdir(parents=True, exist_ok=True)
    (source / "meta" / "info.json").write_text(json.dumps({"codebase_version": "v2.1"}))
    # The current review: every episode accepted, as the markers below record (the gate refuses
    # an export that the review no longer gives).
    (source / "meta" / "episodes.jsonl").write_text(
        "".join(
            json.dumps({"episode_index": i, "length": 1}) + "\n" for i in range(len(file_sizes))
        )
    )
    paths = catalog.parse(fmt).export_paths(source)
    for subset, directory in paths.items():
        (directory / "meta").mkdir(parents=True, exist_ok=True)
        data = directory / "data" / "chunk-000"
        data.mkdir(parents=True, exist_ok=True)
        for i, size in enumerate(file_sizes):
            (data / f"episode_{i:06d}.bin").write_bytes(rng.randbytes(size))
        (directory / "meta" / "info.json").write_text(
            json.dumps({"total_episodes": len(file_sizes)})
        )
        marker = {
            "source_dir": str(source.resolve()),
            "subset": subset,
            "dataset_format": fmt,
            "source_episode_indices": list(range(len(file_sizes))) if subset == "accepted" else [],
            "rule": "qc_verdict pass > fail > red > green",
        }
        (directory / QUALITY_SPLIT).write_text(json.dumps(marker))
    job = Job(kind="export", source_dir=str(source.resolve()), format=fmt, state=state)
    job.accepted_dir = str(paths["accepted"])
    job.rejected_dir = str(paths["rejected"])
    write_job(catalog.parse(fmt).export_root(source) / EXPORT_JOB, job)
    return source, paths["accepted"]


def sftp_config(
    server: SshdServer, remote_dir: Path, known_hosts: Path, **kw: object
) -> SftpConfig:
    """An SftpConfig for the test server (``kw`` overrides fields)."""

    values: dict = dict(
        host="127.0.0.1",
        port=server.port,
        user=server.user,
        identity_file=server.client_key,
        remote_dir=str(remote_dir),
        known_hosts=known_hosts,
    )
    values.update(kw)
    return SftpConfig(**values)
