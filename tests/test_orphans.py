"""Children die with their parent: ``kill -9`` of an eva process leaves no process it started
running and nothing of it in ``/dev/shm``.

Real subprocesses, killed at random moments: ``eva export --executor processes`` (its pool
workers and multiprocessing's resource tracker, which the kill cannot stop) and ``eva collect``
with source processes (each writing into a shared-memory ring in ``/dev/shm``). While the eva
process runs, its descendants are followed through ``/proc/<pid>/task/*/children`` and the
``/dev/shm`` files they map through ``/proc/<pid>/maps`` (the multiprocessing semaphores
``sem.mp-*`` and the rings); a few seconds after the kill, none of them may be left.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_capture_rig import write_config

from eva.capture.synthetic import write_synthetic_dataset

pytestmark = pytest.mark.slow

EVA = [sys.executable, str(Path(sys.executable).with_name("eva"))]
GONE_WITHIN_S = 5.0  # after the kill: every descendant gone, every /dev/shm file removed
SEED = int(os.environ.get("EVA_ORPHAN_SEED", "7"))


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                found.update(int(c) for c in (task / "children").read_text().split())
    return found


def _descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        for child in _children(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _started(pid: int) -> str | None:
    """The process's start time (stat field 22), to tell it from a later one of the same pid;
    None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def _shm_files(pid: int) -> set[str]:
    """The ``/dev/shm`` files ``pid`` maps (semaphores, rings), not removed yet."""
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:
        return set()
    return {
        line[line.index("/dev/shm/") :]
        for line in lines
        if "/dev/shm/" in line and not line.endswith("(deleted)")
    }


class Family:
    """An eva process, its descendants and their /dev/shm files as last seen."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.started: dict[int, str] = {}
        self.shm: set[str] = set()

    def look(self) -> None:
        for pid in {self.process.pid, *_descendants(self.process.pid)}:
            started = _started(pid)
            if started is not None:
                if pid != self.process.pid:
                    self.started.setdefault(pid, started)
                self.shm |= _shm_files(pid)

    def watch(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and self.process.poll() is None:
            self.look()
            time.sleep(0.01)

    def wait_for(self, children: int, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while len(_descendants(self.process.pid)) < children and time.monotonic() < end:
            assert self.process.poll() is None, "eva ended before its children started"
            time.sleep(0.005)
        self.look()

    def kill_and_check(self) -> None:
        self.look()
        self.process.kill()
        self.process.wait(10)
        end = time.monotonic() + GONE_WITHIN_S
        while time.monotonic() < end and (self.alive() or self.left()):
            time.sleep(0.05)
        alive, left = self.alive(), self.left()
        named = self.describe(alive)
        for pid in alive:  # leave nothing behind for the next test, then fail
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for path in left:
            with contextlib.suppress(OSError):
                os.unlink(path)
        assert not alive, f"{len(alive)} processes outlived eva: {named}"
        assert not left, f"left in /dev/shm: {sorted(left)}"

    def alive(self) -> list[int]:
        return [pid for pid, started in self.started.items() if _started(pid) == started]

    def left(self) -> set[str]:
        return {path for path in self.shm if os.path.exists(path)}

    @staticmethod
    def describe(pids: list[int]) -> str:
        lines = []
        for pid in pids:
            with contextlib.suppress(OSError):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                lines.append(f"{pid}: {cmd[:120]}")
        return "; ".join(lines)


@pytest.fixture(scope="module")
def long_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset whose export on two workers takes several seconds (the kills come within
    1.5 s of the workers' start; 8 episodes were exported before that in the native pass)."""
    return write_synthetic_dataset(
        tmp_path_factory.mktemp("orphans") / "raw",
        episodes=24,
        frames=90,
        cameras=2,
        seed=5,
    )


def _export(source: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*EVA, "export", str(source), "--format", "hdf5", "--executor", "processes"]
        + ["--workers", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("moment", ["workers-starting", "random-1", "random-2", "random-3"])
def test_kill_9_of_a_process_pool_export_leaves_no_children(long_source: Path, moment: str) -> None:
    family = Family(_export(long_source))
    try:
        family.wait_for(1)  # the first child: the resource tracker or a worker
        if moment != "workers-starting":
            family.wait_for(3)  # the tracker and both workers
            rng = random.Random(f"{SEED}-{moment}")
            family.watch(rng.uniform(0.0, 1.5))
            assert family.process.poll() is None, "the export ended before the kill"
        family.kill_and_check()
    finally:
        if family.process.poll() is None:
            family.process.kill()


def _collect(tmp_path: Path) -> subprocess.Popen[bytes]:
    config = write_config(
        tmp_path / "rig.toml",
        '[[collection.cameras]]\nkey = "observation.images.front"\nwidth = 64\nheight = 48\n'
        'source = { kind = "sim" }\n',
        '[[collection.vectors]]\nname = "action"\ndim = 3\nsource = { kind = "sim" }\n',
    )
    return subprocess.Popen(
        [*EVA, "collect", str(config), "--episodes", "3", "--seconds", "1.5"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("moment", ["sources-starting", "random-1", "random-2"])
def test_kill_9_of_a_recording_leaves_no_sources_and_no_rings(tmp_path: Path, moment: str) -> None:
    family = Family(_collect(tmp_path))
    try:
        family.wait_for(1)
        if moment != "sources-starting":
            rng = random.Random(f"{SEED}-{moment}")
            family.watch(rng.uniform(0.5, 4.0))
            assert family.process.poll() is None, "the recording ended before the kill"
            assert family.started, "no source process seen"
        family.kill_and_check()
    finally:
        if family.process.poll() is None:
            family.process.kill()
