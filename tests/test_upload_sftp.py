"""Uploads against a real OpenSSH server on 127.0.0.1 (SFTP-only account, see sftp_server.py)."""

from __future__ import annotations

import json
import os
import stat
import threading
from datetime import UTC, datetime
from pathlib import Path

import paramiko
import pytest
from click.testing import CliRunner
from sftp_server import SshdServer, make_export, sftp_config, ssh_agent
from terminal_helpers import drain_terminal, plain_text

from eva.cli import main
from eva.formats import catalog
from eva.jobs import UPLOAD_JOB
from eva.progress import Progress
from eva.upload.config import SftpConfig
from eva.upload.errors import HostKeyError
from eva.upload.job import UploadJob, read_upload_record, start_upload
from eva.upload.sftp import (
    STAGING_MARK,
    UploadError,
    UploadOptions,
    publish_staging,
    scan_local_tree,
    upload_tree,
)

pytest_plugins = ["sftp_server"]

FIXED_NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
STAMP = "20260102T030405Z"


@pytest.fixture
def config(sshd_server: SshdServer, remote_root: Path, known_hosts: Path) -> SftpConfig:
    """The test server as the upload backend: remote_dir = remote_root, host key trusted."""
    return sftp_config(sshd_server, remote_root, known_hosts)


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file of a tree by relative path (directories as a marker), for exact comparison."""
    out: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root) + "/"] = b""
        for f in filenames:
            out[os.path.relpath(os.path.join(dirpath, f), root)] = Path(dirpath, f).read_bytes()
    return out


def staging_leftovers(remote_dir: Path) -> list[str]:
    return [p.name for p in remote_dir.iterdir() if STAGING_MARK in p.name]


def run(job: UploadJob) -> None:
    assert job.wait(120), "upload did not finish"


@pytest.mark.kernel_independent
def test_success_path_tree_is_identical(
    sshd_server: SshdServer, known_hosts: Path, remote_root: Path, tmp_path: Path
) -> None:
    source, accepted = make_export(tmp_path / "logs", file_sizes=(600_000, 300_001, 1, 0))
    (accepted / "videos" / "observation.images.front" / "empty_dir").mkdir(parents=True)
    remote_dir = remote_root / "datasets"  # created on demand
    config = sftp_config(sshd_server, remote_dir, known_hosts)
    seen: list[Progress] = []

    job = start_upload(source, "hdf5", config)
    job.add_listener(lambda p: seen.append(p))
    run(job)

    assert job.error is None and job.state == "completed"
    assert job.result is not None
    assert job.result.remote_path == str(remote_dir / "pick-hdf5") == job.result.target_path
    assert tree_bytes(remote_dir / "pick-hdf5") == tree_bytes(accepted)
    assert staging_leftovers(remote_dir) == []
    # The staging dir was created like any directory (server umask), not private to the uploader.
    assert (remote_dir / "pick-hdf5").stat().st_mode & 0o777 == remote_dir.stat().st_mode & 0o777
    record = json.loads((catalog.parse("hdf5").export_root(source) / UPLOAD_JOB).read_text())
    assert record["state"] == "completed"
    assert record["kind"] == "upload"
    assert record["remote_path"] == str(remote_dir / "pick-hdf5")
    tree = scan_local_tree(accepted)
    assert record["progress"]["files"] == len(tree.files)
    assert record["progress"]["bytes"] == tree.total_bytes
    assert record["progress"]["totals"] == {
        "episodes": None,
        "files": len(tree.files),
        "bytes": tree.total_bytes,
    }


@pytest.mark.kernel_independent
def test_existing_target_gets_copy_names(
    config: SftpConfig, remote_root: Path, tmp_path: Path
) -> None:
    source, accepted = make_export(tmp_path / "logs")
    old = remote_root / "pick-hdf5"
    old.mkdir()
    (old / "precious.txt").write_text("older upload")
    options = UploadOptions(clock=lambda: FIXED_NOW)

    paths = []
    for _ in range(3):
        job = start_upload(source, "hdf5", config, options=options)
        run(job)
        assert job.result is not None, job.error
        paths.append(job.result.remote_path)

    assert paths == [
        f"{old}.copy_{STAMP}",
        f"{old}.copy_{STAMP}_02",
        f"{old}.copy_{STAMP}_03",
    ]
    assert job.result.used_copy_name
    assert tree_bytes(old) == {"precious.txt": b"older upload"}  # never replaced or merged
    for path in paths:
        assert tree_bytes(Path(path)) == tree_bytes(accepted)
    assert staging_leftovers(remote_root) == []


@pytest.mark.kernel_independent
def test_openssh_rename_semantics_used_for_publishing(
    config: SftpConfig, sshd_server: SshdServer, remote_root: Path
) -> None:
    """Why publishing uses plain SSH_FXP_RENAME: OpenSSH refuses it onto an existing directory,
    even an empty one, while posix-rename@openssh.com silently replaces an empty directory."""
    with paramiko.Transport(("127.0.0.1", sshd_server.port)) as transport:
        transport.connect(username=config.user, pkey=paramiko.PKey.from_path(config.identity_file))
        sftp = paramiko.SFTPClient.from_transport(transport)
        assert sftp is not None
        base = str(remote_root)
        sftp.mkdir(f"{base}/staged")
        sftp.mkdir(f"{base}/empty_target")
        with pytest.raises(OSError):
            sftp.rename(f"{base}/staged", f"{base}/empty_target")
        assert sorted(os.listdir(remote_root)) == ["empty_target", "staged"]
        # publish_staging goes on to the copy name instead
        used = publish_staging(sftp, f"{base}/staged", f"{base}/empty_target", FIXED_NOW)
        assert used == f"{base}/empty_target.copy_{STAMP}"
        sftp.mkdir(f"{base}/other")
        sftp.posix_rename(f"{base}/other", f"{base}/empty_target")  # replaced: never used
        assert sorted(os.listdir(remote_root)) == ["empty_target", f"empty_target.copy_{STAMP}"]


@pytest.mark.kernel_independent
def test_failure_mid_transfer_removes_staging_and_keeps_old_target(
    config: SftpConfig, remote_root: Path, tmp_path: Path
) -> None:
    sizes = (900_000, 800_000, 700_000, 600_000, 500_000, 400_000, 300_000, 1_000)
    source, accepted = make_export(tmp_path / "logs", file_sizes=sizes)
    old = remote_root / "pick-hdf5"
    old.mkdir()
    (old / "keep.bin").write_bytes(b"old data")
    doomed = accepted / "data" / "chunk-000" / "episode_000007.bin"  # the smallest: sent last

    job = start_upload(source, "hdf5", config)

    def pull_file_away(progress: Progress) -> None:
        # After the first file has fully arrived, a file still waiting becomes unreadable.
        if progress.files >= 1 and doomed.exists():
            doomed.unlink()

    job.progress.listeners.insert(0, pull_file_away)
    run(job)

    assert job.state == "failed" and job.result is None
    assert job.error is not None and "episode_000007.bin" in job.error
    assert staging_leftovers(remote_root) == []
    assert sorted(os.listdir(remote_root)) == ["pick-hdf5"]  # nothing published
    assert tree_bytes(old) == {"keep.bin": b"old data"}
    record = read_upload_record(catalog.parse("hdf5").export_root(source))
    assert record is not None and record.state == "failed" and not record.resumable
    assert "episode_000007.bin" in (record.error or "")
    assert record.remote_path is None


@pytest.mark.kernel_independent
def test_remote_write_failure_removes_staging(
    config: SftpConfig,
    sshd_server: SshdServer,
    known_hosts: Path,
    remote_root: Path,
    tmp_path: Path,
) -> None:
    """A local file growing past its scanned size is sent, then caught; also a remote_dir that
    runs into a file is refused before anything is created."""
    source, accepted = make_export(tmp_path / "logs")
    (remote_root / "blocker").write_text("a file in the way")
    blocked = sftp_config(sshd_server, remote_root / "blocker" / "sub", known_hosts)
    job = start_upload(source, "hdf5", blocked)
    run(job)
    assert job.state == "failed"
    assert "blocker exists and is not a directory" in (job.error or "")
    assert sorted(os.listdir(remote_root)) == ["blocker"]

    tree = scan_local_tree(accepted)
    grown = max(tree.files, key=lambda f: f.size)
    grown.path.write_bytes(grown.path.read_bytes() + b"late frame")
    with pytest.raises(UploadError, match="changed during upload"):
        upload_tree(config, tree, "pick")
    assert sorted(os.listdir(remote_root)) == ["blocker"]


@pytest.mark.kernel_independent
def test_unknown_host_key_is_refused_unless_accepted(
    sshd_server: SshdServer, remote_root: Path, tmp_path: Path
) -> None:
    source, accepted = make_export(tmp_path / "logs")
    known_hosts = tmp_path / "ssh" / "known_hosts"  # does not exist yet
    config = sftp_config(sshd_server, remote_root / "up", known_hosts)

    job = start_upload(source, "hdf5", config)
    run(job)
    assert job.state == "failed"
    assert "unknown host key" in (job.error or "") and "--accept-new-host-key" in (job.error or "")
    assert not (remote_root / "up").exists()  # refused before anything was created
    assert not known_hosts.exists()

    job = start_upload(source, "hdf5", config, options=UploadOptions(accept_new_host_key=True))
    run(job)
    assert job.result is not None, job.error
    assert job.result.host_key_recorded
    assert known_hosts.read_text() == sshd_server.host_public_key_line
    # Now known: no flag needed.
    job = start_upload(source, "hdf5", config)
    run(job)
    assert job.result is not None and not job.result.host_key_recorded


@pytest.mark.kernel_independent
def test_a_new_host_key_is_appended_in_place_through_a_symlink(
    sshd_server: SshdServer, remote_root: Path, tmp_path: Path
) -> None:
    # OpenSSH appends to known_hosts where it is: a symlinked file (dotfiles in a repository)
    # stays a link, its target keeps its mode and its other lines.
    source, _ = make_export(tmp_path / "logs")
    target = tmp_path / "dotfiles" / "known_hosts"
    target.parent.mkdir()
    target.write_bytes(b"other.example ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample")  # no newline
    target.chmod(0o644)
    link = tmp_path / "ssh" / "known_hosts"
    link.parent.mkdir()
    link.symlink_to(target)
    config = sftp_config(sshd_server, remote_root / "linked", link)
    job = start_upload(source, "hdf5", config, options=UploadOptions(accept_new_host_key=True))
    run(job)
    assert job.result is not None and job.result.host_key_recorded, job.error
    assert link.is_symlink() and link.resolve() == target
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert target.read_text() == (
        "other.example ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample\n"
        + sshd_server.host_public_key_line
    )


@pytest.mark.kernel_independent
def test_changed_host_key_is_refused_even_with_accept_flag(
    sshd_server: SshdServer, remote_root: Path, tmp_path: Path
) -> None:
    source, _ = make_export(tmp_path / "logs")
    other_key = paramiko.Ed25519Key.from_private_key_file(str(sshd_server.client_key))
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(
        f"[127.0.0.1]:{sshd_server.port} {other_key.get_name()} {other_key.get_base64()}\n"
    )
    config = sftp_config(sshd_server, remote_root, known_hosts)
    options = UploadOptions(accept_new_host_key=True)
    tree = scan_local_tree(make_export(tmp_path / "logs2")[1])
    with pytest.raises(HostKeyError, match="does NOT match"):
        upload_tree(config, tree, "pick", options=options)
    assert os.listdir(remote_root) == []


@pytest.mark.kernel_independent
def test_agent_authentication(
    sshd_server: SshdServer,
    known_hosts: Path,
    remote_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source, accepted = make_export(tmp_path / "logs")
    config = sftp_config(sshd_server, remote_root, known_hosts, identity_file=None)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    with pytest.raises(UploadError, match="no keys in ssh-agent"):
        upload_tree(config, scan_local_tree(accepted), "pick")
    with ssh_agent(sshd_server.client_key, tmp_path) as sock:
        monkeypatch.setenv("SSH_AUTH_SOCK", sock)
        job = start_upload(source, "hdf5", config)
        run(job)
    assert job.result is not None, job.error
    assert tree_bytes(remote_root / "pick-hdf5") == tree_bytes(accepted)


@pytest.mark.kernel_independent
def test_wrong_key_is_refused(
    sshd_server: SshdServer, known_hosts: Path, remote_root: Path, tmp_path: Path
) -> None:
    _, accepted = make_export(tmp_path / "logs")
    config = sftp_config(sshd_server, remote_root, known_hosts, identity_file=sshd_server.host_key)
    with pytest.raises(UploadError, match="was not accepted"):
        upload_tree(config, scan_local_tree(accepted), "pick")


@pytest.mark.kernel_independent
def test_local_symlink_is_refused(config: SftpConfig, remote_root: Path, tmp_path: Path) -> None:
    source, accepted = make_export(tmp_path / "logs")
    secret = tmp_path / "secret.txt"
    secret.write_text("not part of the dataset")
    (accepted / "meta" / "extra.txt").symlink_to(secret)
    with pytest.raises(UploadError, match=r"extra.txt: is a symlink"):
        start_upload(source, "hdf5", config)
    assert os.listdir(remote_root) == []
    assert not (catalog.parse("hdf5").export_root(source) / UPLOAD_JOB).exists()

    (accepted / "meta" / "extra.txt").unlink()
    (accepted / "linked_dir").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(UploadError, match=r"linked_dir: is a symlink"):
        start_upload(source, "hdf5", config)


@pytest.mark.kernel_independent
def test_resume_after_interruption(config: SftpConfig, remote_root: Path, tmp_path: Path) -> None:
    sizes = (700_000, 600_000, 500_000, 400_000, 300_000, 200_000, 100_000, 50_000, 10)
    source, accepted = make_export(tmp_path / "logs", file_sizes=sizes)
    # One worker, so exactly the files that completed before the cancel are staged.
    options = UploadOptions(connections=1, sessions_per_connection=1)

    job = start_upload(source, "hdf5", config, options=options)
    job.progress.listeners.insert(0, lambda p: job.cancel() if p.files >= 3 else None)
    run(job)
    assert job.state == "failed" and job.result is None
    record = read_upload_record(catalog.parse("hdf5").export_root(source))
    assert record is not None and record.resumable and record.staging_path
    staging = Path(record.staging_path)
    assert staging.is_dir() and staging.parent == remote_root
    assert not (remote_root / "pick-hdf5").exists()
    staged = {p.name: p for p in staging.rglob("*.bin") if p.is_file()}
    # One worker, cancelled as the third file completed: exactly the three largest are staged.
    assert sorted(staged) == ["episode_000000.bin", "episode_000001.bin", "episode_000002.bin"]
    local = accepted / "data" / "chunk-000"
    # Damaged on the server with the same size: must be sent again, not trusted.
    staged["episode_000000.bin"].write_bytes(bytes(700_000))
    # Cut off mid-way with an intact prefix: continued from byte 250_000.
    staged["episode_000001.bin"].write_bytes((local / "episode_000001.bin").read_bytes()[:250_000])
    # A partial file whose prefix does not match: sent again from the start.
    (staging / "data" / "chunk-000" / "episode_000003.bin").write_bytes(b"x" * 100_000)
    # episode_000002.bin is intact: skipped. Entries the local tree lacks are never published.
    (staging / "stray.txt").write_text("not ours")
    (staging / "meta" / "junk").mkdir()
    (staging / "meta" / "junk" / "x").write_text("x")

    job = start_upload(source, "hdf5", config, options=UploadOptions(), resume=True)
    run(job)
    assert job.result is not None, job.error
    assert job.result.resumed
    assert job.result.staging_path == str(staging)
    assert job.result.remote_path == str(remote_root / "pick-hdf5")
    assert job.result.skipped_files == 1
    assert job.result.skipped_bytes == 500_000 + 250_000
    assert tree_bytes(remote_root / "pick-hdf5") == tree_bytes(accepted)
    assert staging_leftovers(remote_root) == []
    assert job.progress.bytes == scan_local_tree(accepted).total_bytes
    final = read_upload_record(catalog.parse("hdf5").export_root(source))
    assert final is not None and final.state == "completed" and final.resumed


@pytest.mark.kernel_independent
def test_resume_without_previous_upload_starts_fresh(
    config: SftpConfig, remote_root: Path, tmp_path: Path
) -> None:
    source, accepted = make_export(tmp_path / "logs")
    job = start_upload(source, "hdf5", config, resume=True)
    run(job)
    assert job.result is not None and not job.result.resumed
    assert tree_bytes(remote_root / "pick-hdf5") == tree_bytes(accepted)


@pytest.mark.kernel_independent
def test_concurrent_upload_of_same_export_is_refused(config: SftpConfig, tmp_path: Path) -> None:
    source, _ = make_export(tmp_path / "logs", file_sizes=(2_000_000,) * 4)
    release = threading.Event()
    job = start_upload(source, "hdf5", config)
    job.progress.listeners.insert(0, lambda p: release.wait(30))
    try:
        with pytest.raises(Exception, match="already running"):
            start_upload(source, "hdf5", config)
    finally:
        release.set()
        run(job)
    assert job.result is not None, job.error


def write_config(path: Path, server: SshdServer, remote_dir: Path, log_dir: Path) -> Path:
    path.write_text(
        "[collection]\n"
        f'log_dir = "{log_dir}"\n\n'
        "[collection.storage.sftp]\n"
        'host = "127.0.0.1"\n'
        f"port = {server.port}\n"
        f'user = "{server.user}"\n'
        f'identity_file = "{server.client_key}"\n'
        f'remote_dir = "{remote_dir}"\n'
    )
    return path


@pytest.mark.kernel_independent
def test_cli_json_lines_and_refusals(
    sshd_server: SshdServer, known_hosts: Path, remote_root: Path, tmp_path: Path
) -> None:
    log_dir = tmp_path / "logs"
    source, accepted = make_export(log_dir)
    config = write_config(tmp_path / "eva.toml", sshd_server, remote_root, log_dir)
    runner = CliRunner()
    base = [
        "upload",
        "--format",
        "hdf5",
        "--config",
        str(config),
        "--known-hosts",
        str(known_hosts),
    ]

    result = runner.invoke(main, [*base, "pick", "--json"])  # by name under log_dir
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines()]
    assert lines[-1]["event"] == "result"
    assert lines[-1]["remote_path"] == str(remote_root / "pick-hdf5")
    assert all(line["event"] in ("progress", "result") for line in lines)
    assert tree_bytes(remote_root / "pick-hdf5") == tree_bytes(accepted)

    result = runner.invoke(main, [*base, str(source)])  # by path, human output
    assert result.exit_code == 0, result.output
    assert ".copy_" in result.output and "copy name" in result.output

    result = runner.invoke(main, [*base[:2], "mcap", *base[3:], str(source)])
    assert result.exit_code == 1
    assert "upload refused (never_exported)" in result.output

    no_backend = tmp_path / "plain.toml"
    no_backend.write_text(f'[collection]\nlog_dir = "{log_dir}"\n')
    result = runner.invoke(
        main, ["upload", "--format", "hdf5", "--config", str(no_backend), "pick"]
    )
    assert result.exit_code == 1 and "no upload backend configured" in result.output

    bad = tmp_path / "bad.toml"
    bad.write_text('[collection.storage.sftp]\nhost = "h"\nremote_dir = "/a/../b"\n')
    result = runner.invoke(main, ["upload", "--format", "hdf5", "--config", str(bad), "pick"])
    assert result.exit_code == 1 and "collection.storage.sftp.remote_dir" in result.output


def test_real_export_pipeline_then_upload(
    config: SftpConfig, remote_root: Path, small_dataset: Path
) -> None:
    """The accepted directory written by eva.export.pipeline passes the gate and arrives intact;
    its rejected sibling and other formats are never sent."""
    from eva.export.pipeline import export_dataset
    from eva.upload.gate import UploadRefused, check_upload

    exported = export_dataset(small_dataset, "lerobot_v21")
    with pytest.raises(UploadRefused) as info:
        check_upload(small_dataset, "hdf5", backend_configured=True)
    assert info.value.reason == "never_exported"

    job = start_upload(small_dataset, "v21", config)
    run(job)
    assert job.result is not None, job.error
    name = f"{small_dataset.parent.name}-lerobot_v21"  # <parent>/raw -> <parent>-<format>
    assert job.result.remote_path == str(remote_root / name)
    assert tree_bytes(remote_root / name) == tree_bytes(exported.accepted_dir)
    marker = json.loads((remote_root / name / "meta" / "quality_split.json").read_text())
    assert marker["subset"] == "accepted" and marker["dataset_format"] == "lerobot_v21"
    assert marker["source_episode_indices"] == [0, 1]
    record = read_upload_record(exported.export_root)
    assert record is not None and record.export_job_id == exported.job.job_id


@pytest.mark.kernel_independent
def test_fresh_upload_discards_abandoned_staging(
    config: SftpConfig, remote_root: Path, tmp_path: Path
) -> None:
    source, accepted = make_export(tmp_path / "logs", file_sizes=(300_000,) * 5)
    options = UploadOptions(connections=1, sessions_per_connection=1)
    job = start_upload(source, "hdf5", config, options=options)
    job.progress.listeners.insert(0, lambda p: job.cancel() if p.files >= 1 else None)
    run(job)
    abandoned = job.record.staging_path
    assert job.state == "failed" and abandoned and Path(abandoned).is_dir()

    job = start_upload(source, "hdf5", config)  # no --resume: start over, clean up the old one
    run(job)
    assert job.result is not None and not job.result.resumed
    assert job.result.staging_path != abandoned
    assert not Path(abandoned).exists()
    assert staging_leftovers(remote_root) == []
    assert tree_bytes(remote_root / "pick-hdf5") == tree_bytes(accepted)


@pytest.mark.kernel_independent
def test_connection_lost_mid_transfer_cleans_up_over_a_new_connection(
    config: SftpConfig,
    sshd_server: SshdServer,
    known_hosts: Path,
    remote_root: Path,
    tmp_path: Path,
) -> None:
    import signal

    sizes = (900_000, 800_000, 700_000, 600_000, 500_000, 400_000, 300_000, 200_000)
    source, _ = make_export(tmp_path / "logs", file_sizes=sizes)
    assert sshd_server.process is not None
    listener_pid = sshd_server.process.pid
    killed: list[int] = []

    def drop_connections(progress: Progress) -> None:
        # The per-connection sshd processes die: the uploader sees the network go away.
        if progress.files >= 1 and not killed:
            children = Path(f"/proc/{listener_pid}/task/{listener_pid}/children").read_text()
            for pid in map(int, children.split()):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

    job = start_upload(source, "hdf5", config)
    job.progress.listeners.insert(0, drop_connections)
    run(job)
    assert killed
    assert job.state == "failed" and job.result is None
    assert staging_leftovers(remote_root) == []  # removed over a fresh connection
    assert os.listdir(remote_root) == []


KILLED_UPLOADER = """
import os, signal, sys
from pathlib import Path
from eva.upload.config import SftpConfig
from eva.upload.job import start_upload
from eva.upload.sftp import UploadOptions

source, remote_dir, port, user, key, known_hosts = sys.argv[1:7]
config = SftpConfig(host="127.0.0.1", port=int(port), user=user, identity_file=Path(key),
                    remote_dir=remote_dir, known_hosts=Path(known_hosts))
job = start_upload(Path(source), "hdf5", config,
                   options=UploadOptions(connections=1, sessions_per_connection=1))
def die(progress):
    if progress.files >= 2:
        os.kill(os.getpid(), signal.SIGKILL)  # a crash: no cleanup, no final record
job.progress.listeners.insert(0, die)
job.wait(120)
"""


def test_resume_after_the_uploader_was_killed(
    config: SftpConfig,
    sshd_server: SshdServer,
    known_hosts: Path,
    remote_root: Path,
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    sizes = (500_000, 400_000, 300_000, 200_000, 100_000)
    source, accepted = make_export(tmp_path / "logs", file_sizes=sizes)
    args = [str(source), str(remote_root), str(sshd_server.port), sshd_server.user]
    args += [str(sshd_server.client_key), str(known_hosts)]
    killed = subprocess.run([sys.executable, "-c", KILLED_UPLOADER, *args], timeout=120)
    assert killed.returncode == -9

    record = json.loads((catalog.parse("hdf5").export_root(source) / UPLOAD_JOB).read_text())
    assert record["state"] == "running"  # what a crash leaves behind
    staging = Path(record["staging_path"])
    assert staging.is_dir() and not (remote_root / "pick-hdf5").exists()

    job = start_upload(source, "hdf5", config, resume=True)
    run(job)
    assert job.result is not None, job.error
    assert job.result.resumed and job.result.staging_path == str(staging)
    assert job.result.skipped_files >= 2
    assert tree_bytes(remote_root / "pick-hdf5") == tree_bytes(accepted)
    assert staging_leftovers(remote_root) == []


def test_cli_progress_bar_on_a_terminal(
    sshd_server: SshdServer, known_hosts: Path, remote_root: Path, tmp_path: Path
) -> None:
    import pty
    import subprocess
    import sys

    log_dir = tmp_path / "logs"
    source, accepted = make_export(log_dir, file_sizes=(2_000_000, 1_000_000, 10))
    config = write_config(tmp_path / "eva.toml", sshd_server, remote_root, log_dir)
    controller, terminal = pty.openpty()
    command = [sys.executable, "-m", "eva.cli", "upload", str(source), "--format", "hdf5"]
    command += ["--config", str(config), "--known-hosts", str(known_hosts)]
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=terminal,
        env={**os.environ, "COLUMNS": "200"},  # a wide terminal: every column of the bar shows
    )
    os.close(terminal)
    reader, chunks = drain_terminal(controller)
    stdout, _ = process.communicate(timeout=120)
    reader.join(30)
    os.close(controller)
    shown = b"".join(chunks)
    assert process.returncode == 0, shown.decode(errors="replace")
    plain = plain_text(shown)
    last_frame = plain.replace("\r\n", "\n").split("\r")[-1]  # the tty adds \r
    assert "upload hdf5" in last_frame and "100%" in last_frame
    assert "3.0/3.0 MB" in last_frame and "elapsed" in last_frame and "eta" in last_frame
    assert "files 5/5" in last_frame  # 3 episodes + info.json + quality_split.json
    assert stdout.decode().startswith("uploaded 5 files (3.0 MB) to 127.0.0.1:")
    assert tree_bytes(remote_root / "pick-hdf5") == tree_bytes(accepted)


@pytest.mark.kernel_independent
def test_known_hosts_with_markers_comments_and_garbage(
    sshd_server: SshdServer, remote_root: Path, tmp_path: Path
) -> None:
    """Lines paramiko cannot parse are skipped like OpenSSH does; @revoked is honoured."""
    source, accepted = make_export(tmp_path / "logs")
    known_hosts = tmp_path / "known_hosts"
    host_line = sshd_server.host_public_key_line
    key_fields = host_line.split(" ", 1)[1]
    known_hosts.write_text(
        "# operator's file\n\n"
        f"@cert-authority *.example.org {key_fields}"
        "not a host key line\n"
        "other.example.org ssh-ed25519 AAAA-broken-base64\n" + host_line
    )
    config = sftp_config(sshd_server, remote_root, known_hosts)
    job = start_upload(source, "hdf5", config)
    run(job)
    assert job.result is not None, job.error
    assert tree_bytes(remote_root / "pick-hdf5") == tree_bytes(accepted)

    known_hosts.write_text(f"@revoked * {key_fields}" + host_line)
    job = start_upload(source, "hdf5", config, options=UploadOptions(accept_new_host_key=True))
    run(job)
    assert job.state == "failed" and "@revoked" in (job.error or "")
