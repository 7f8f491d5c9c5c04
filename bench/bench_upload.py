"""SFTP upload throughput over loopback: eva's uploader vs the OpenSSH ``sftp -b`` client.

A real ``sshd`` (the test helper ``tests/sftp_server.py``) serves 127.0.0.1; the same dataset-like
tree (a few large episode files plus small metadata files, random bytes) is sent by:

* eva: ``eva.upload.sftp.upload_tree`` with its defaults (2 connections x 2 SFTP channels,
  255 KiB pipelined WRITEs, AES-GCM preferred), including connecting, staging and the publishing
  rename;
* OpenSSH ``sftp -b`` (``put -r``, default request size and queue), the client operators use;
* plain paramiko ``SFTPClient.put`` file by file on one connection (the naive way).

``ratio`` = eva MB/s / baseline MB/s (> 1: eva is faster). Best of ``repeats`` runs each.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paramiko
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from sftp_server import SshdServer  # noqa: E402

from eva.upload.config import SftpConfig  # noqa: E402
from eva.upload.sftp import UploadOptions, scan_local_tree, upload_tree  # noqa: E402

MB = 1_000_000


def make_tree(root: Path, total_bytes: int, seed: int = 0) -> Path:
    """Episode-sized files (8 MB, 3 MB) plus small meta files, like an exported dataset."""
    rng = random.Random(seed)
    (root / "meta").mkdir(parents=True, exist_ok=True)
    for name in ("info.json", "episodes.jsonl", "tasks.jsonl", "stats.json", "quality_split.json"):
        (root / "meta" / name).write_bytes(rng.randbytes(4_000))
    written, index = 0, 0
    while written < total_bytes:
        size = 8 * MB if index % 3 else 3 * MB
        chunk = root / "data" / f"chunk-{index // 50:03d}"
        chunk.mkdir(parents=True, exist_ok=True)
        (chunk / f"episode_{index:06d}.bin").write_bytes(os.urandom(size))
        written += size
        index += 1
    return root


class Loopback:
    """One sshd + a client key + known_hosts, in a scratch directory."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.server = SshdServer(workdir / "sshd").start()
        self.known_hosts = self.server.write_known_hosts(workdir / "known_hosts")
        self.remote = workdir / "remote"
        self.remote.mkdir()

    def config(self) -> SftpConfig:
        return SftpConfig(
            host="127.0.0.1",
            port=self.server.port,
            user=self.server.user,
            identity_file=self.server.client_key,
            remote_dir=str(self.remote),
            known_hosts=self.known_hosts,
        )

    def check_and_clear_remote(self, tree_root: Path) -> None:
        """Every run must have delivered the whole tree (paths and sizes) before it counts."""
        sent = self.remote / "bench"
        local = {f.rel: f.size for f in scan_local_tree(tree_root).files}
        remote = {f.rel: f.size for f in scan_local_tree(sent).files}
        if remote != local:
            raise RuntimeError(f"{sent}: uploaded tree differs from {tree_root}")
        self.clear_remote()

    def clear_remote(self) -> None:
        for child in self.remote.iterdir():
            shutil.rmtree(child)

    def eva_upload(self, tree_root: Path, options: UploadOptions | None = None) -> None:
        upload_tree(self.config(), scan_local_tree(tree_root), "bench", options=options)

    def openssh_upload(self, tree_root: Path) -> None:
        batch = self.workdir / "batch.txt"
        batch.write_text(f'put -r "{tree_root}" "{self.remote}/bench"\n')
        subprocess.run(
            [
                "sftp",
                "-q",
                "-b",
                str(batch),
                "-i",
                str(self.server.client_key),
                "-P",
                str(self.server.port),
                "-o",
                "BatchMode=yes",
                "-o",
                f"UserKnownHostsFile={self.known_hosts}",
                "-o",
                "StrictHostKeyChecking=yes",
                f"{self.server.user}@127.0.0.1",
            ],
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )

    def paramiko_put(self, tree_root: Path) -> None:
        with paramiko.Transport(("127.0.0.1", self.server.port)) as transport:
            transport.connect(
                username=self.server.user, pkey=paramiko.PKey.from_path(self.server.client_key)
            )
            sftp = paramiko.SFTPClient.from_transport(transport)
            assert sftp is not None
            tree = scan_local_tree(tree_root)
            base = f"{self.remote}/bench"
            sftp.mkdir(base)
            for rel in tree.dirs:
                sftp.mkdir(f"{base}/{rel}")
            for local in tree.files:
                sftp.put(str(local.path), f"{base}/{local.rel}")
            sftp.close()

    def close(self) -> None:
        self.server.stop()


def best_rate(run: Callable[[], Any], nbytes: int, repeats: int, after: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
        after()
    return nbytes / best / MB


def report(quick: bool = False) -> list[dict[str, Any]]:
    total = 96 * MB if quick else 320 * MB
    repeats = 2 if quick else 3
    with tempfile.TemporaryDirectory(prefix="eva-bench-upload-") as tmp:
        workdir = Path(tmp)
        tree_root = make_tree(workdir / "tree", total)
        nbytes = scan_local_tree(tree_root).total_bytes
        nfiles = len(scan_local_tree(tree_root).files)
        loop = Loopback(workdir)
        try:
            eva = best_rate(
                lambda: loop.eva_upload(tree_root),
                nbytes,
                repeats,
                lambda: loop.check_and_clear_remote(tree_root),
            )
            single = best_rate(
                lambda: loop.eva_upload(
                    tree_root, UploadOptions(connections=1, sessions_per_connection=1)
                ),
                nbytes,
                repeats,
                lambda: loop.check_and_clear_remote(tree_root),
            )
            openssh = best_rate(
                lambda: loop.openssh_upload(tree_root),
                nbytes,
                repeats,
                lambda: loop.check_and_clear_remote(tree_root),
            )
            put = best_rate(
                lambda: loop.paramiko_put(tree_root),
                nbytes,
                repeats,
                lambda: loop.check_and_clear_remote(tree_root),
            )
        finally:
            loop.close()
    tree_note = f"{nbytes / MB:.0f} MB in {nfiles} files over loopback, best of {repeats}"
    return [
        {
            "name": "upload eva (2 conn x 2 ch, pipelined) vs OpenSSH sftp -b",
            "value": round(eva, 1),
            "baseline": round(openssh, 1),
            "ratio": round(eva / openssh, 3),
            "unit": "MB/s",
            "note": tree_note,
        },
        {
            "name": "upload eva (2 conn x 2 ch) vs paramiko put",
            "value": round(eva, 1),
            "baseline": round(put, 1),
            "ratio": round(eva / put, 3),
            "unit": "MB/s",
            "note": tree_note + "; put = SFTPClient.put file by file, one connection",
        },
        {
            "name": "upload eva 1 channel (pipelined) vs paramiko put",
            "value": round(single, 1),
            "baseline": round(put, 1),
            "ratio": round(single / put, 3),
            "unit": "MB/s",
            "note": tree_note + "; eva with connections=1, sessions_per_connection=1",
        },
    ]


@pytest.fixture(scope="module")
def loopback(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    workdir = tmp_path_factory.mktemp("bench-upload")
    loop = Loopback(workdir)
    yield loop
    loop.close()


def test_bench_eva_upload(benchmark, loopback: Loopback, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    tree_root = make_tree(tmp_path / "tree", 24 * MB)
    benchmark.pedantic(
        lambda: loopback.eva_upload(tree_root), setup=loopback.clear_remote, rounds=3
    )


def test_bench_openssh_sftp(benchmark, loopback: Loopback, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    tree_root = make_tree(tmp_path / "tree", 24 * MB)
    benchmark.pedantic(
        lambda: loopback.openssh_upload(tree_root), setup=loopback.clear_remote, rounds=3
    )


if __name__ == "__main__":
    for row in report(quick="--quick" in sys.argv):
        print(row)
