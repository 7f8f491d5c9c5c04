"""First contact with an upload server, against the real OpenSSH server on 127.0.0.1: the host
key is shown with its SHA-256 fingerprint, an unknown one is trusted once (appended to
known_hosts hashed or plain as the file already is, and found there by OpenSSH's own
``ssh-keygen -F``), and a changed or revoked one is refused with no override."""

from __future__ import annotations

import subprocess
from pathlib import Path

import paramiko
import pytest
from sftp_server import SshdServer, sftp_config

from eva.upload.connect import probe_host_key, trust_host_key
from eva.upload.errors import HostKeyError

pytest_plugins = ["sftp_server"]

pytestmark = pytest.mark.kernel_independent

OTHER_HOST = "other.example ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHJpVbBbrSqCLhJeyEXiH9ILtW9e+Mcq1xZaiFHeeU3e\n"


def openssh_fingerprint(sshd: SshdServer) -> str:
    """The server key's fingerprint as OpenSSH prints it (``ssh-keygen -lf``)."""
    out = subprocess.run(
        ["ssh-keygen", "-lf", str(sshd.workdir / "ssh_host_ed25519_key.pub")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()[1]


def openssh_finds(sshd: SshdServer, known_hosts: Path) -> str:
    """``ssh-keygen -F [127.0.0.1]:port``: the entry OpenSSH finds for the server ("" if none)."""
    found = subprocess.run(
        ["ssh-keygen", "-F", f"[127.0.0.1]:{sshd.port}", "-f", str(known_hosts)],
        capture_output=True,
        text=True,
    )
    return found.stdout if found.returncode == 0 else ""


def test_an_unknown_key_is_shown_and_trusted_once_as_plain_text(
    sshd_server: SshdServer, remote_root: Path, tmp_path: Path
) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(OTHER_HOST)
    config = sftp_config(sshd_server, remote_root, known_hosts)
    report, _ = probe_host_key(config)
    assert report.server == f"[127.0.0.1]:{sshd_server.port}"
    assert report.state == "unknown" and report.key_type == "ssh-ed25519"
    assert report.fingerprint == openssh_fingerprint(sshd_server)
    assert known_hosts.read_text() == OTHER_HOST  # looking records nothing

    trusted = trust_host_key(config, report.fingerprint)
    assert trusted.state == "known"
    assert known_hosts.read_text() == OTHER_HOST + sshd_server.host_public_key_line
    assert openssh_finds(sshd_server, known_hosts)
    # Trusting again adds nothing; the key now reads as known.
    trust_host_key(config, report.fingerprint)
    assert known_hosts.read_text() == OTHER_HOST + sshd_server.host_public_key_line
    assert probe_host_key(config)[0].state == "known"


def test_a_hashed_known_hosts_gets_a_hashed_line(
    sshd_server: SshdServer, remote_root: Path, tmp_path: Path
) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(OTHER_HOST)
    # OpenSSH hashes the file (HashKnownHosts): the new entry must be hashed as well.
    subprocess.run(["ssh-keygen", "-H", "-f", str(known_hosts)], check=True, capture_output=True)
    before = known_hosts.read_text()
    assert before.startswith("|1|")
    config = sftp_config(sshd_server, remote_root, known_hosts)
    trust_host_key(config, openssh_fingerprint(sshd_server))
    added = known_hosts.read_text()[len(before) :]
    assert added.startswith("|1|") and "127.0.0.1" not in added, added
    assert added.split()[1:] == sshd_server.host_public_key_line.split()[1:]
    assert openssh_finds(sshd_server, known_hosts)  # OpenSSH matches the hashed name
    assert probe_host_key(config)[0].state == "known"


def test_a_changed_or_revoked_key_is_refused_and_never_recorded(
    sshd_server: SshdServer, remote_root: Path, tmp_path: Path
) -> None:
    other_key = paramiko.Ed25519Key.from_private_key_file(str(sshd_server.client_key))
    known_hosts = tmp_path / "known_hosts"
    changed = f"[127.0.0.1]:{sshd_server.port} ssh-ed25519 {other_key.get_base64()}\n"
    known_hosts.write_text(changed)
    config = sftp_config(sshd_server, remote_root, known_hosts)
    report, _ = probe_host_key(config)
    assert report.state == "changed"
    with pytest.raises(HostKeyError, match="does NOT match") as refused:
        trust_host_key(config, report.fingerprint)
    assert refused.value.state == "changed"
    assert known_hosts.read_text() == changed

    revoked = "@revoked " + sshd_server.host_public_key_line
    known_hosts.write_text(revoked)
    assert probe_host_key(config)[0].state == "revoked"
    with pytest.raises(HostKeyError, match="@revoked"):
        trust_host_key(config, report.fingerprint)
    assert known_hosts.read_text() == revoked


def test_only_the_fingerprint_shown_is_trusted(
    sshd_server: SshdServer, remote_root: Path, tmp_path: Path
) -> None:
    known_hosts = tmp_path / "known_hosts"
    config = sftp_config(sshd_server, remote_root, known_hosts)
    shown = "SHA256:" + "A" * 43  # the key the page showed is not the one offered now
    with pytest.raises(HostKeyError, match="not the SHA256:A+ shown") as refused:
        trust_host_key(config, shown)
    assert refused.value.state == "mismatch"
    assert not known_hosts.exists()
