"""The configured rig: source processes on 127.0.0.1 feeding the recorder through shared memory.

Real components only: an H.264 MPEG-TS publisher over UDP (PyAV) recorded by an ``ffmpeg``
source, a pyzmq PUB process recorded by a ``zmq`` source, a ``python`` plugin defined here, the
``sim`` kind in a process; failures with real kills (SIGKILL of a publisher and of a source
process) and malformed messages.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from rig_publishers import udp_frame, zmq_value

from eva.capture.recorder import Recorder
from eva.capture.rig import SHM_DIR, SourceRig, remove_stale_rings
from eva.capture.sources import Sample
from eva.config import load_config
from eva.dataset.reader import DatasetReader

pytestmark = pytest.mark.realtime

HERE = Path(__file__).parent
PUBLISHERS = HERE / "rig_publishers.py"
UDP_OPTIONS = (
    '{ probesize = "65536", analyzeduration = "200000", fifo_size = "1000000", '
    'overrun_nonfatal = "1" }'
)


def free_port(kind: int = socket.SOCK_DGRAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def publisher(*args: object, send_log: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "RIG_SEND_LOG": str(send_log)} if send_log is not None else None
    return subprocess.Popen(
        [sys.executable, str(PUBLISHERS), *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )


def publisher_stall(send_log: Path) -> float:
    """How much later than usual (its median lateness) the UDP publisher sent its most late
    frame, in seconds."""
    lateness = np.array([float(line.split()[1]) for line in send_log.read_text().splitlines()])
    return float(lateness.max() - np.median(lateness)) if len(lateness) else 0.0


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(10)


class PluginRig:
    """A user source (the ``samples()`` protocol) loaded by a ``python`` source in its process."""

    def __init__(self, dim: int = 3, rate: float = 100.0) -> None:
        self.dim = dim
        self.rate = rate

    def samples(self) -> Iterator[Sample]:
        start = time.time()
        i = 0
        while True:
            t = start + i / self.rate
            delay = t - time.time()
            if delay > 0:
                time.sleep(delay)
            yield Sample("vector", "action", t, np.full(self.dim, float(i)))
            i += 1


def write_config(path: Path, cameras: str = "", vectors: str = "", **extra: object) -> Path:
    lines = [
        "[collection]",
        f'log_dir = "{path.parent / "logs"}"',
        "fps = 30",
        "min_episode_frames = 10",
        *(f"{k} = {v}" for k, v in extra.items()),
        "[collection.tasks]",
        'pick = ["pick"]',
        "[collection.encoder]",
        'preset = "ultrafast"',
        cameras,
        vectors,
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def camera(
    port: int,
    *,
    key: str = "observation.images.front",
    stall: float = 1.0,
    priority: str = "high",
    kernel_timestamps: bool = True,
) -> str:
    return (
        f'[[collection.cameras]]\nkey = "{key}"\nwidth = 160\nheight = 120\n'
        f'source = {{ kind = "ffmpeg", url = "udp://127.0.0.1:{port}", format = "mpegts", '
        f"options = {UDP_OPTIONS}, stall_timeout_s = {stall}, open_timeout_s = 8, "
        f'priority = "{priority}", kernel_timestamps = {str(kernel_timestamps).lower()} }}\n'
    )


def thread_policies(pid: int) -> dict[int, tuple[int, int]]:
    """Each thread of a process: (scheduling policy, nice value)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        tid = int(task.name)
        with contextlib.suppress(ProcessLookupError, FileNotFoundError):
            out[tid] = (os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid))
    return out


def zmq_state(port: int, dim: int = 6) -> str:
    return (
        f'[[collection.vectors]]\nname = "observation.state"\ndim = {dim}\n'
        f'source = {{ kind = "zmq", endpoint = "tcp://127.0.0.1:{port}", open_timeout_s = 8 }}\n'
    )


@pytest.fixture(autouse=True)
def plugin_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Source processes import the plugin from this directory."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))


def record(recorder: Recorder, seconds: float) -> dict:
    recorder.start("pick")
    time.sleep(seconds)
    job = recorder.stop()
    assert job.wait(60)
    assert job.state == "saved", job.error
    return job.as_dict()


def test_ffmpeg_udp_camera_and_zmq_state(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "eva.capture")
    udp, zport = free_port(), free_port(socket.SOCK_STREAM)
    config = load_config(
        write_config(tmp_path / "rig.toml", camera(udp, priority="realtime"), zmq_state(zport))
    ).collection
    sends = tmp_path / "sends.txt"
    cam_pub = publisher("udp", udp, 30, send_log=sends)
    state_pub = publisher("zmq", zport, 30)
    rig = SourceRig(config)
    try:
        assert rig.describe()["observation.images.front"].startswith("ffmpeg udp://")
        with Recorder(config, durable=False, rings=rig.rings) as recorder:
            rig.attach(recorder)
            rig.start()
            assert rig.check() == []
            # eva reads the UDP socket itself: frames carry the kernel's arrival times
            assert "h264 160x120, kernel receive timestamps" in caplog.text
            if os.geteuid() == 0:  # permitted: the kernel stamps, so decoding need not be real-time
                (cam,) = [g for g in rig.groups if "observation.images.front" in g.names]
                policies = thread_policies(cam.process.pid)
                assert policies[cam.process.pid] == (os.SCHED_OTHER, -10)  # receives and decodes
            job = record(recorder, 3.0)
        if job["quality"] != "green":
            # Frames stamped off the grid are a red flag by design. The kernel stamps each
            # datagram on arrival, so only a frame sent late can be one: the publisher (a
            # process on this loaded host, not a camera's own hardware) must have stalled.
            codes = {issue["code"] for issue in job["quality_issues"]}
            stall = publisher_stall(sends)
            assert codes == {"image_skew_exceeded"} and stall > 0.005, (
                job["quality_issues"],
                f"publisher stall {stall * 1000:.1f} ms",
            )
        frames = job["frames"]
        assert 75 <= frames <= 100  # about 30 a second
    finally:
        rig.close()
        stop(cam_pub)
        stop(state_pub)
    reader = DatasetReader(Path(job["dataset_dir"]))
    # pixels close to what the publisher painted (lossy H.264): each frame is one of its frames
    levels = 40 + (np.arange(2000) * 7) % 180
    for batch in reader.iter_frames(0, "observation.images.front", batch_size=32):
        for rgb in batch[::8]:
            level = float(rgb[10:50, 10:150, 0].mean())
            i = int(np.argmin(np.abs(levels - level)))
            sent = udp_frame(i).astype(int)
            # band interiors (chroma bleeds across the band edge twice: publisher and recorder)
            for rows in (slice(4, 56), slice(64, 116)):
                assert np.abs(rgb[rows].astype(int) - sent[rows]).max() <= 24
            assert np.abs(rgb.astype(int) - sent).mean() < 8  # two lossy yuv420 round trips
    # the state column is the sent signal interpolated onto the grid
    table = reader.read_table(0, ["capture_time", "timestamp"])
    stamps = table.column("timestamp").to_numpy().astype(np.float64)
    # the grid instants: capture_time is the camera sample nearest to each (within its skew)
    grid_start = float(np.median(table.column("capture_time").to_numpy() - stamps))
    grid = grid_start + stamps
    state = reader.read_vector(0, "observation.state")
    expected = np.array([zmq_value(t, 6) for t in grid])
    assert np.abs(state - expected).max() < 0.02
    assert not list(Path("/dev/shm").glob(f"{rig.prefix}-*"))  # rings removed


def test_killed_publisher_and_killed_source_process(tmp_path: Path) -> None:
    udp = free_port()
    config = load_config(
        write_config(
            tmp_path / "rig.toml",
            camera(udp, stall=0.8),
            '[[collection.vectors]]\nname = "action"\ndim = 3\n'
            'source = { kind = "python", object = "test_capture_rig:PluginRig", args = { dim = 3 } }\n',
        )
    ).collection
    cam_pub = publisher("udp", udp, 60)
    rig = SourceRig(config)
    try:
        with Recorder(config, durable=False, rings=rig.rings) as recorder:
            rig.attach(recorder)
            rig.start()
            assert rig.check() == []
            # 1. the camera's publisher dies mid-episode: red, naming the camera; episode kept
            recorder.start("pick")
            time.sleep(1.5)
            cam_pub.kill()
            time.sleep(2.0)
            job = recorder.stop()
            assert job.wait(60) and job.state == "saved", job.error
            codes = {i["code"]: i["detail"] for i in job.quality_issues}
            assert job.quality == "red" and "source_stalled" in codes, job.quality_issues
            assert "observation.images.front" in codes["source_stalled"]
            assert job.episode_index == 0 and job.frames >= 30
            # 2. kill -9 of the plugin's source process mid-episode: kept and red
            cam_pub = publisher("udp", udp, 60)
            rig.restart_stopped()
            assert rig.check() == []
            plugin = next(g for g in rig.groups if g.source.kind == "python")
            recorder.start("pick")
            time.sleep(1.5)
            os.kill(plugin.process.pid, signal.SIGKILL)
            time.sleep(1.5)
            job = recorder.stop()
            assert job.wait(60) and job.state == "saved", job.error
            codes = {i["code"]: i["detail"] for i in job.quality_issues}
            assert "source_stalled" in codes and "action" in codes["source_stalled"]
            assert "signal 9" in codes["source_stalled"]
            # 3. the next episode records again: the source process is restarted before START
            assert any("restarted" in line for line in rig.restart_stopped())
            assert rig.check() == []
            job = record(recorder, 1.5)
            # recording again means every stream delivers: no stall, no missing stream (a camera
            # that just reconnected may still place a frame off the grid: the skew check's job,
            # and test_ffmpeg_udp_camera_and_zmq_state holds a steady camera to green)
            codes = {i["code"] for i in job["quality_issues"]}
            assert not codes & {"source_stalled", "missing_camera_stream"}, job["quality_issues"]
            assert job["frames"] >= 30
            actions = DatasetReader(Path(job["dataset_dir"])).read_vector(2, "action")
            assert np.all(np.diff(actions[:, 0]) > 0)  # the plugin's counter, interpolated
    finally:
        rig.close()
        stop(cam_pub)


def test_zmq_streams_of_two_endpoints_share_one_source_process(tmp_path: Path) -> None:
    """Two endpoints, the same topic on both: one subscriber process, and each stream records
    its own endpoint's values."""
    state_port, action_port = free_port(socket.SOCK_STREAM), free_port(socket.SOCK_STREAM)
    action = (
        '[[collection.vectors]]\nname = "action"\ndim = 3\n'
        f'source = {{ kind = "zmq", endpoint = "tcp://127.0.0.1:{action_port}", '
        'topic = "observation.state", open_timeout_s = 8 }\n'
    )
    config = load_config(
        write_config(tmp_path / "rig.toml", "", zmq_state(state_port) + action)
    ).collection
    publishers = [publisher("zmq", state_port, 30, 6), publisher("zmq", action_port, 30, 3)]
    rig = SourceRig(config)
    try:
        (subscriber,) = [g for g in rig.groups if g.source.kind == "zmq"]
        assert subscriber.names == ["observation.state", "action"]
        described = rig.describe()
        assert described["observation.state"] == (
            f"zmq tcp://127.0.0.1:{state_port} topic 'observation.state'"
        )
        assert described["action"] == (
            f"zmq tcp://127.0.0.1:{action_port} topic 'observation.state'"
        )
        with Recorder(config, durable=False, rings=rig.rings) as recorder:
            rig.attach(recorder)
            rig.start()
            assert rig.check() == []
            job = record(recorder, 2.0)
    finally:
        rig.close()
        for p in publishers:
            stop(p)
    assert job["quality"] == "green", job["quality_issues"]
    reader = DatasetReader(Path(job["dataset_dir"]))
    grid = reader.read_table(0, ["capture_time"]).column("capture_time").to_numpy()
    for name, dim in (("observation.state", 6), ("action", 3)):
        expected = np.array([zmq_value(t, dim) for t in grid])
        assert np.abs(reader.read_vector(0, name) - expected).max() < 0.02, name


def test_malformed_zmq_messages_are_reported(tmp_path: Path) -> None:
    zport = free_port(socket.SOCK_STREAM)
    config = load_config(write_config(tmp_path / "rig.toml", "", zmq_state(zport))).collection
    state_pub = publisher("zmq", zport, 30, 6, "bad")
    rig = SourceRig(config)
    try:
        with Recorder(config, durable=False, rings=rig.rings) as recorder:
            rig.attach(recorder)
            rig.start()
            assert rig.check() == []
            job = record(recorder, 2.0)
            assert all(g.process.poll() is None for g in rig.groups)  # never crashed
    finally:
        rig.close()
        stop(state_pub)
    codes = {i["code"]: i["detail"] for i in job["quality_issues"]}
    assert job["quality"] == "red"
    assert "invalid_vector_dim" in codes and "observation.state" in codes["invalid_vector_dim"]
    assert "non_finite_value" in codes


def test_a_camera_that_never_opens_fails_the_check(tmp_path: Path) -> None:
    udp = free_port()  # nobody sends there
    config = load_config(
        write_config(
            tmp_path / "rig.toml", camera(udp).replace("open_timeout_s = 8", "open_timeout_s = 1.5")
        )
    ).collection
    rig = SourceRig(config).start()
    try:
        problems = rig.check()
    finally:
        rig.close()
    assert len(problems) == 1 and "\n" not in problems[0]
    assert problems[0].startswith("camera observation.images.front: ffmpeg udp://127.0.0.1:")


def test_sim_kind_runs_in_a_source_process(tmp_path: Path) -> None:
    config = load_config(
        write_config(
            tmp_path / "rig.toml",
            '[[collection.cameras]]\nkey = "observation.images.front"\nwidth = 64\nheight = 48\n'
            'source = { kind = "sim" }\n',
            '[[collection.vectors]]\nname = "observation.state"\ndim = 4\nsource = { kind = "sim" }\n',
        )
    ).collection
    with SourceRig(config) as rig:
        assert len(rig.groups) == 1  # one process for the simulated streams
        with Recorder(config, durable=False, rings=rig.rings) as recorder:
            rig.attach(recorder)
            assert rig.check() == []
            job = record(recorder, 1.0)
    assert job["quality"] == "green", job["quality_issues"]
    assert 20 <= job["frames"] <= 40


@pytest.mark.parametrize("priority", ["high", "realtime"])
def test_source_process_priority(
    tmp_path: Path, priority: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = load_config(
        write_config(
            tmp_path / "rig.toml",
            '[[collection.cameras]]\nkey = "observation.images.front"\nwidth = 64\nheight = 48\n'
            f'source = {{ kind = "sim", priority = "{priority}" }}\n',
        )
    ).collection
    permitted = os.geteuid() == 0  # root has CAP_SYS_NICE (CI and make test run as root)
    with (
        caplog.at_level(logging.WARNING, logger="eva"),
        SourceRig(config) as rig,
        Recorder(config, durable=False, rings=rig.rings) as recorder,
    ):
        rig.attach(recorder)
        assert rig.check() == []
        (group,) = rig.groups
        pid = group.process.pid
        if priority == "realtime" and permitted:
            assert os.sched_getscheduler(pid) == os.SCHED_FIFO
            assert os.sched_getparam(pid).sched_priority == 10
        elif permitted:
            assert os.sched_getscheduler(pid) == os.SCHED_OTHER
            assert os.getpriority(os.PRIO_PROCESS, pid) == -10
        job = record(recorder, 0.5)
    assert job["quality"] == "green", job["quality_issues"]
    refused = [r for r in caplog.records if "realtime priority refused" in r.getMessage()]
    assert bool(refused) == (priority == "realtime" and not permitted)


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a real-time process needs root")
def test_high_priority_leaves_an_inherited_realtime_policy() -> None:
    # A source process launched from a real-time thread inherits SCHED_FIFO; "high" means the
    # ordinary scheduler at nice -10 whatever the parent was.
    code = (
        "import os; from eva.capture.source_worker import apply_priority; apply_priority('high');"
        "print(os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=lambda: os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(5)),
    ).stdout.split()
    assert [int(x) for x in out] == [os.SCHED_OTHER, -10]


def test_stale_ring_files_are_removed(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = tmp_path / f"eva-{int(dead.stdout)}-abcd1234-00.ring"
    stale.write_bytes(b"x")
    mine = tmp_path / f"eva-{os.getpid()}-abcd1234-00.ring"
    mine.write_bytes(b"x")
    assert remove_stale_rings(tmp_path) == [stale]
    assert mine.exists() and not stale.exists()


def test_ffmpeg_frames_are_scaled_to_the_configured_size(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Also FFmpeg's own UDP reader (``kernel_timestamps = false``): frames stamped at demux."""
    caplog.set_level(logging.INFO, "eva.capture")
    udp = free_port()
    # This test is about the scaling. Loopback UDP receipt on the shared 2-core VM jitters by
    # up to ~22 ms (measured: 1-3 frames of a run at 18.5-22.2 ms, against the default 17.2 ms
    # tolerance, in about one run of five), so the tolerance here is 30 ms: still under one
    # frame period, so a lost or doubled frame is still red. The default tolerance is exercised
    # by test_ffmpeg_udp_camera_and_zmq_state.
    config = load_config(
        write_config(
            tmp_path / "rig.toml", camera(udp, kernel_timestamps=False), skew_tolerance_s=0.030
        )
    ).collection
    cam_pub = publisher("udp", udp, 30, 320, 240)  # twice the configured 160x120
    rig = SourceRig(config)
    try:
        with Recorder(config, durable=False, rings=rig.rings) as recorder:
            rig.attach(recorder)
            rig.start()
            assert rig.check() == []
            assert "h264 320x240" in caplog.text and "kernel receive" not in caplog.text
            job = record(recorder, 1.5)
    finally:
        rig.close()
        stop(cam_pub)
    assert job["quality"] == "green", job["quality_issues"]
    reader = DatasetReader(Path(job["dataset_dir"]))
    batch = next(reader.iter_frames(0, "observation.images.front", batch_size=8))
    assert batch.shape[1:] == (120, 160, 3)
    top, bottom = batch[0, 10:50].reshape(-1, 3).mean(0), batch[0, 70:110].reshape(-1, 3).mean(0)
    assert abs(bottom[0] - 200) < 12 and abs(top[2] - 80) < 12  # the publisher's two bands


def test_source_processes_end_when_the_recorder_is_killed(tmp_path: Path) -> None:
    """A recorder killed with SIGKILL cannot stop its sources: they notice and exit."""
    path = write_config(
        tmp_path / "rig.toml",
        '[[collection.cameras]]\nkey = "observation.images.front"\nwidth = 64\nheight = 48\n'
        'source = { kind = "sim" }\n',
        '[[collection.vectors]]\nname = "action"\ndim = 3\n'
        'source = { kind = "python", object = "test_capture_rig:PluginRig", args = { dim = 3 } }\n',
    )
    script = (
        "import sys, time\n"
        "from eva.capture.rig import SourceRig\n"
        "from eva.config import load_config\n"
        "rig = SourceRig(load_config(sys.argv[1]).collection).start()\n"
        "assert rig.check() == []\n"
        "print(' '.join(str(g.process.pid) for g in rig.groups), flush=True)\n"
        "time.sleep(60)\n"
    )
    recorder = subprocess.Popen(
        [sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert recorder.stdout is not None
    pids = [int(p) for p in recorder.stdout.readline().split()]
    try:
        assert len(pids) == 2
        recorder.kill()
        recorder.wait(10)

        def running(pid: int) -> bool:
            try:
                return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
            except FileNotFoundError:
                return False

        deadline = time.monotonic() + 10
        while any(map(running, pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(running, pids)), "source processes outlived their recorder"
    finally:
        if recorder.poll() is None:
            recorder.kill()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    # the sources removed the dead recorder's ring files as they noticed its death
    assert not list(SHM_DIR.glob(f"eva-{recorder.pid}-*.ring"))
