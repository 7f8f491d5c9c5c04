"""The crash spool's cost: a real-time recording session with and without it.

``report(quick)`` rows, every baseline measured in the same run:

* ``spool CPU``: process CPU seconds (all threads) of a recording session paced in real time by
  the simulated rig: 3 cameras 640x480 at 30 fps and a robot schema of 12 vector streams (84
  dims: joint positions, velocities, efforts, end-effector poses, grippers, commands) at 200 Hz,
  with the crash spool (the rows' IPC stream and each camera's fragmented MP4) against the same
  session without it (``Recorder(spool=False)``). Each session runs in a fresh interpreter; the
  two kinds alternate (A B B A ...) and the medians are compared. Goal: ratio <= 1.05.
* ``spool dropped samples``: samples refused by the rings (``Recorder.status()["dropped"]``)
  with the spool, against without it: the spool must not make the recorder fall behind.
* ``spool lag``: how far the spool trails the capture, what a kill would lose: seconds of the
  episode captured before a kill that its recovery does not hold (the kill comes at the end of
  the session, before STOP), against the 2 s eva promises.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

VECTORS = [
    ("observation.state", 14), ("observation.velocity", 14), ("observation.effort", 14),
    ("action", 14), ("observation.ee_pose.left", 7), ("observation.ee_pose.right", 7),
    ("action.ee_pose.left", 3), ("action.ee_pose.right", 3), ("observation.gripper.left", 1),
    ("observation.gripper.right", 1), ("observation.base_velocity", 3), ("observation.imu", 3),
]  # fmt: skip


def _config(log_dir: Path) -> Any:
    from eva.config import config_from_dict

    return config_from_dict(
        {
            "collection": {
                "log_dir": str(log_dir),
                "fps": 30,
                "tasks": {"bench": ["simulated session"]},
                "cameras": [
                    {"key": f"observation.images.cam{i}", "width": 640, "height": 480}
                    for i in range(3)
                ],
                "vectors": [{"name": name, "dim": dim} for name, dim in VECTORS],
            }
        }
    ).collection


def run_session(seconds: float, log_dir: Path, spool: bool) -> dict[str, float]:
    """One real-time session of ``seconds``; CPU seconds, frames, dropped samples."""
    from eva.capture.recorder import Recorder, pin_mmap_threshold, shorten_switch_interval
    from eva.capture.sources import SimulatedRig

    pin_mmap_threshold()  # as eva collect runs
    shorten_switch_interval()
    cfg = _config(log_dir)
    rig = SimulatedRig.from_config(cfg, vector_hz=200, duration_s=seconds, realtime=True, seed=1)
    rec = Recorder(cfg, durable=False, spool=spool)
    rec.start()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    for s in rig.samples():
        if s.kind == "image":
            rec.push_image(s.stream, s.t, s.data)
        else:
            rec.push_vector(s.stream, s.t, s.data)
    job = rec.stop()
    job.wait()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    dropped = rec.status()["dropped"]
    rec.close()
    if job.state != "saved":
        raise RuntimeError(f"session save failed: {job.error}")
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return {"cpu_s": cpu, "frames": float(job.frames), "dropped": float(dropped)}


def _isolated(seconds: float, spool: bool) -> dict[str, float]:
    code = (
        "import json, sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
        "import bench_spool as b; "
        "print(json.dumps(b.run_session(float(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] == '1')))"
    )
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [sys.executable, "-c", code, str(Path(__file__).parent), str(seconds), tmp,
             "1" if spool else "0"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"session failed: {done.stderr.strip().splitlines()[-1:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


KILLED_SESSION = """
import sys, time
sys.path.insert(0, sys.argv[1])
import bench_spool as b
from pathlib import Path
from eva.capture.recorder import Recorder
from eva.capture.sources import SimulatedRig
cfg = b._config(Path(sys.argv[2]))
rig = SimulatedRig.from_config(cfg, vector_hz=200, realtime=True, seed=1)
rec = Recorder(cfg, durable=False)
rec.start()
print("started", time.monotonic(), flush=True)
for s in rig.samples():
    if s.kind == "image":
        rec.push_image(s.stream, s.t, s.data)
    else:
        rec.push_vector(s.stream, s.t, s.data)
"""


def spool_lag(seconds: float) -> float:
    """Seconds of a recording that a kill after ``seconds`` of capture loses."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            [sys.executable, "-c", KILLED_SESSION, str(Path(__file__).parent), tmp],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        started = float(proc.stdout.readline().split()[1])
        time.sleep(max(started + seconds - time.monotonic(), 0))
        proc.send_signal(signal.SIGKILL)
        captured = time.monotonic() - started
        proc.wait()
        out = subprocess.run(
            [sys.executable, "-m", "eva.cli", "recover", "--json",
             str(Path(tmp) / "bench" / "raw")],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        frames = max(r["frames"] for r in json.loads(out.stdout)["recovered"])
    return captured - frames / 30.0


def report(quick: bool = True) -> list[dict[str, Any]]:
    seconds = 8.0 if quick else 30.0
    pairs = 2 if quick else 3
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for i in range(pairs):
        for spool in (True, False) if i % 2 == 0 else (False, True):
            runs[spool].append(_isolated(seconds, spool))
    cpu = {k: statistics.median(r["cpu_s"] for r in v) for k, v in runs.items()}
    dropped = {k: sum(r["dropped"] for r in v) for k, v in runs.items()}
    lags = [spool_lag(seconds / 2) for _ in range(2 if quick else 4)]
    session = f"{seconds:g} s real-time sessions, 3x640x480 + 12 vector streams, {pairs} each"
    return [
        {
            "name": "spool CPU per session (with / without the crash spool)",
            "value": round(cpu[True], 3),
            "baseline": round(cpu[False], 3),
            "ratio": round(cpu[True] / cpu[False], 3),
            "unit": "CPU-s",
            "note": f"goal <= 1.05; medians of {session}",
        },
        {
            "name": "spool dropped samples (with / without)",
            "value": dropped[True],
            "baseline": dropped[False],
            "ratio": None,
            "unit": "samples",
            "note": "goal: none dropped because of the spool",
        },
        {
            "name": "spool: seconds a kill loses (worst of the kills)",
            "value": round(max(lags), 2),
            "baseline": 2.0,
            "ratio": round(max(lags) / 2.0, 2),
            "unit": "s",
            "note": f"kill -9 after {seconds / 2:g} s of capture; goal <= 2 s; all: "
            + ", ".join(f"{lag:.2f}" for lag in lags),
        },
    ]


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    for row in report(quick="--quick" in sys.argv):
        print(json.dumps(row))
