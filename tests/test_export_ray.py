"""The ray executor on a real local Ray cluster (a head and a second node, on the loopback): the same
bytes as a serial export in every per-episode format, and a killed actor fails the job naming
the episode (lerobot_v3: the episodes of its file), with nothing published."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_export_executors import (
    CONFIGS,
    V3_FILE_PER_EPISODE,
    _synthetic_source,
    killed_worker_export,
)
from test_golden_exports import export_manifest

from eva.export.pipeline import export_dataset
from eva.formats import catalog

pytestmark = pytest.mark.ray

RAY = str(Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        return int(s.getsockname()[1])


def _ray_node(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """``ray start --block``: the node's processes live as long as it does, in its own session
    (stopped by its process group, never by ``ray stop``, which stops every Ray on the host)."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [RAY, "start", "--block", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _cluster_cpus(address: str) -> int:
    code = (
        f"import ray, logging; ray.init(address={address!r}, logging_level=logging.ERROR, "
        "log_to_driver=False); print(int(ray.cluster_resources().get('CPU', 0)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    ).stdout
    return int(out.split()[-1]) if out.split() else 0


def _stop(node: subprocess.Popen[bytes]) -> None:
    """SIGTERM to ``ray start`` (it stops its node's processes, in 1-2 s), then SIGKILL to the
    process group for whatever is left after 10 s. Not SIGTERM to the whole group: every process
    then stops on its own, and the head's GCS server outlived the 10 s every time."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(node.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _group_alive(node.pid):
        node.poll()
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(node.pid, signal.SIGKILL)
    node.wait(timeout=30)


def _group_alive(pgid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    return True
    return False


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """A head node with 2 CPUs on 127.0.0.2 and a second node with 1 on 127.0.0.3; its address.

    Loopback addresses other than 127.0.0.1: Ray replaces a node address of 127.0.0.1 (or
    localhost) by the host's routable one, and every node and driver then talks to that."""
    with pytest.MonkeyPatch.context() as env:
        # Ray's token authentication, with a token of this cluster's own (drivers read it too)
        env.setenv("RAY_AUTH_MODE", "token")
        env.setenv("RAY_AUTH_TOKEN", secrets.token_hex(16))
        env.delenv("RAY_ADDRESS", raising=False)
        yield from _cluster()


def _cluster() -> Iterator[str]:
    temp = Path(tempfile.mkdtemp(prefix="eva-ray-", dir="/tmp"))  # short: Ray's socket paths
    port = _free_port()
    address = f"127.0.0.2:{port}"
    head = _ray_node(
        [
            "--head",
            "--node-ip-address=127.0.0.2",
            f"--port={port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={temp}",
        ],
        temp / "head.log",
    )
    nodes = [head]
    try:
        deadline = time.monotonic() + 180
        while _cluster_cpus(address) < 2:
            assert head.poll() is None, (temp / "head.log").read_text(errors="replace")
            assert time.monotonic() < deadline, "the Ray head did not start"
            time.sleep(1)
        second = [f"--address={address}", "--node-ip-address=127.0.0.3", "--num-cpus=1"]
        nodes.append(_ray_node(second, temp / "worker.log"))
        while _cluster_cpus(address) < 3:
            assert nodes[1].poll() is None, (temp / "worker.log").read_text(errors="replace")
            assert time.monotonic() < deadline, "the second Ray node did not join"
            time.sleep(1)
        yield address
    finally:
        for node in reversed(nodes):
            _stop(node)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_ray_writes_the_same_bytes_as_serial(tmp_path: Path, ray_cluster: str, config: str) -> None:
    fmt, options = CONFIGS[config]
    source = _synthetic_source(tmp_path)
    root = catalog.parse(fmt).export_root(source)
    serial = export_dataset(source, fmt, options=options, executor="serial")
    serial_tree = export_manifest(root)
    remote = export_dataset(source, fmt, options=options, executor="ray", ray_address=ray_cluster)
    assert export_manifest(root) == serial_tree
    assert remote.job.warnings == serial.job.warnings
    counts = {k: v for k, v in serial.job.progress.items() if k != "current"}
    assert {k: v for k, v in remote.job.progress.items() if k != "current"} == counts


def _actor_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                line = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if line.startswith(b"ray::EpisodeActor"):
                pids.append(int(entry.name))
    return pids


def _kill_an_actor() -> int:
    actors = _actor_pids()
    assert actors
    os.kill(actors[0], signal.SIGKILL)
    return actors[0]


def _actors_gone() -> bool:
    """The other actors, killed by the driver, are gone within 30 s."""
    deadline = time.monotonic() + 30
    while _actor_pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    return not _actor_pids()


def test_a_killed_ray_actor_fails_the_job_naming_the_episode(
    tmp_path: Path, ray_cluster: str
) -> None:
    message, _ = killed_worker_export(
        tmp_path, _kill_an_actor, executor="ray", ray_address=ray_cluster
    )
    assert re.search(
        r"export worker \(Ray actor\) died while writing accepted episode \d+ "
        r"\(source episode \d+\) \(\w+\); nothing was published",
        message,
    ), message
    assert _actors_gone()


def test_a_killed_ray_actor_fails_a_v3_export_naming_the_episodes_of_its_file(
    tmp_path: Path, ray_cluster: str
) -> None:
    # the actor is killed while the driver still has tasks in flight on it
    message, _ = killed_worker_export(
        tmp_path,
        _kill_an_actor,
        "lerobot_v3",
        V3_FILE_PER_EPISODE,
        executor="ray",
        ray_address=ray_cluster,
    )
    assert re.search(
        r"export worker \(Ray actor\) died while writing (accepted|rejected) episodes \d+-\d+ "
        r"\((data|videos)/[^)]+\) \(\w+\); nothing was published",
        message,
    ), message
    assert _actors_gone()


def test_without_ray_the_executor_is_a_one_line_error_naming_the_extra(tmp_path: Path) -> None:
    source = _synthetic_source(tmp_path)
    code = (
        "import sys; sys.modules['ray'] = None\n"  # as if the extra were not installed
        "from eva.cli import main; main()"
    )
    argv = ["export", str(source), "--format", "hdf5", "--executor", "ray", "--json"]
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1, done.stderr
    failed = json.loads(done.stdout.splitlines()[-1])
    assert failed == {"event": "failed", "error": "executor ray needs Ray: pip install 'eva[ray]'"}
    assert not catalog.parse("hdf5").export_root(source).exists()
