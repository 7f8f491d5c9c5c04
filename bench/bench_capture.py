"""Live capture: push latency of the snapshot ring, and a whole simulated recording session.

``report(quick)`` rows, every baseline measured in the same run:

* ``push 640x480 frame p50/p99``: ``SnapshotRing.push`` of a 640x480x3 frame while a consumer
  thread drains the ring, against ``queue.Queue.put(frame.copy())`` (the usual handoff of a frame
  the producer will reuse) drained the same way; the ring copies with the GIL released or kept
  (the default below 32 MiB). Also with one busy pure-Python thread in the process, the case
  where a released GIL must be waited for.
* ``push frames/s``: producer-side throughput of the same two.
* ``shm ring push 640x480 frame p50/p99``: ``push`` of a 640x480x3 frame into the cross-process
  shared-memory ring (``create_shm_ring`` in ``/dev/shm``, 16 slots, freed by a ``discard``
  between pushes, outside the timing) against a plain ``np.copyto`` of the frame into 16 reused
  buffers in turn (the memcpy limit over the same amount of memory).
* ``push vector p50/p99``: a 14-dim float64 sample through ``Recorder.push_vector`` (lock, shape
  check, ring copy) against ``queue.Queue.put``.
* ``session real-time factor``: 3 cameras 640x480 at 30 fps + 14-dim state/action at 200 Hz from
  the simulated rig, fed as fast as the pipeline absorbs it (the feeder waits while a camera's
  backlog exceeds ~0.3 s); value = recorded seconds / wall seconds from START to the saved
  episode, baseline 1.0 (real time). > 1 means the host keeps up with the rig.
* ``session CPU s per recorded s``: process CPU time per recorded second, baseline the 2 cores.
* ``encode 3x640x480``: encoding throughput (frames/s over the 3 cameras) of 3 cameras through
  ``EpisodeWriter`` (encode + image stats, batches of 8 frames) with one encoder thread per
  camera, against the same with every camera encoded in the calling thread one after the other.
  Then x264's own threading as the other lever, on bare ``VideoEncoder``s: frame threads
  (``thread_type="FRAME"``) vs PyAV's default (sliced threads, one per CPU), cameras one after
  the other and one thread per camera; and one x264 thread per camera thread vs the default.
  Best of 2 interleaved runs (the host is shared).
* ``peak RSS``: peak resident memory over the last vs the first quarter of the longest episode,
  and the peak of episodes of increasing length, each recorded in a fresh interpreter with the
  128 KiB mmap threshold ``eva collect`` pins; flat memory: ratios ~1. The same longest session
  with the Makefile's 32 MiB threshold shows the speed gained and the RSS creep it costs.
"""

from __future__ import annotations

import json
import os
import queue
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eva.capture.recorder import Recorder
from eva.capture.ring import make_ring
from eva.capture.shm_ring import create_shm_ring
from eva.capture.sources import SimulatedRig
from eva.capture.synthetic import SyntheticScene
from eva.config import config_from_dict
from eva.dataset.video import VideoEncoder, VideoOptions
from eva.dataset.writer import CameraSpec, DatasetWriter

H, W = 480, 640


def _percentiles(ns: list[int]) -> tuple[float, float]:
    arr = np.asarray(ns, dtype=np.float64) / 1e3
    return float(np.percentile(arr, 50)), float(np.percentile(arr, 99))


class _Busy:
    """A pure-Python busy loop on another thread (contends for the GIL)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        x = 0
        while not self.stop.is_set():
            x += 1

    def __enter__(self) -> _Busy:
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop.set()
        self.thread.join()


def measure_ring_push(n: int, busy: bool, release_gil: bool = True) -> dict[str, float]:
    ring = make_ring(
        (H, W, 3), np.uint8, block_slots=16, initial_blocks=4, max_bytes=1 << 30,
        release_gil_min_bytes=0 if release_gil else 1 << 40,
    )  # fmt: skip
    frame = np.random.default_rng(0).integers(0, 255, (H, W, 3), dtype=np.uint8)
    done = threading.Event()
    out = np.empty((8, H, W, 3), np.uint8)
    times = np.empty(8)

    def consume() -> None:
        while not done.is_set() or len(ring):
            if ring.pop_batch(out, times) == 0:
                time.sleep(0.0005)

    consumer = threading.Thread(target=consume)
    consumer.start()
    lat: list[int] = []
    busy_ctx = _Busy() if busy else None
    if busy_ctx:
        busy_ctx.__enter__()
    t_start = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter_ns()
        ring.push(float(i), frame)
        lat.append(time.perf_counter_ns() - t0)
        if len(ring) > 48:  # stay within the preallocated slots: measure steady state
            while len(ring) > 8:
                time.sleep(0.0002)
    wall = time.perf_counter() - t_start
    if busy_ctx:
        busy_ctx.__exit__()
    done.set()
    consumer.join()
    p50, p99 = _percentiles(lat)
    return {"p50": p50, "p99": p99, "rate": n / wall}


def measure_queue_put(n: int, busy: bool) -> dict[str, float]:
    q: queue.Queue[tuple[float, np.ndarray]] = queue.Queue()
    frame = np.random.default_rng(0).integers(0, 255, (H, W, 3), dtype=np.uint8)
    done = threading.Event()

    def consume() -> None:
        while not done.is_set() or not q.empty():
            try:
                q.get(timeout=0.001)
            except queue.Empty:
                continue

    consumer = threading.Thread(target=consume)
    consumer.start()
    lat: list[int] = []
    busy_ctx = _Busy() if busy else None
    if busy_ctx:
        busy_ctx.__enter__()
    t_start = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter_ns()
        q.put((float(i), frame.copy()))
        lat.append(time.perf_counter_ns() - t0)
        if q.qsize() > 48:
            while q.qsize() > 8:
                time.sleep(0.0002)
    wall = time.perf_counter() - t_start
    if busy_ctx:
        busy_ctx.__exit__()
    done.set()
    consumer.join()
    p50, p99 = _percentiles(lat)
    return {"p50": p50, "p99": p99, "rate": n / wall}


def measure_shm_push(n: int, slots: int = 16) -> dict[str, Any]:
    """Push latency into a shm ring (one process; the slot is freed between pushes) vs np.copyto."""
    frame = np.random.default_rng(0).integers(0, 255, (H, W, 3), dtype=np.uint8)
    shm_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None
    lat: list[int] = []
    with tempfile.TemporaryDirectory(dir=shm_dir) as tmp:
        ring = create_shm_ring(Path(tmp) / "bench.ring", (H, W, 3), np.uint8, slots)
        backend = "native" if type(ring).__module__.startswith("eva_fast") else "reference"
        try:
            for _ in range(slots):  # first touch of every slot page, outside the timing
                ring.push(0.0, frame)
            ring.discard()
            for i in range(n):
                t0 = time.perf_counter_ns()
                ring.push(float(i), frame)
                lat.append(time.perf_counter_ns() - t0)
                ring.discard(1)
        finally:
            ring.close()
            ring.unlink()
    bufs = list(np.zeros((slots, H, W, 3), np.uint8))
    base: list[int] = []
    for i in range(n):
        dst = bufs[i % slots]
        t0 = time.perf_counter_ns()
        np.copyto(dst, frame)
        base.append(time.perf_counter_ns() - t0)
    p50, p99 = _percentiles(lat)
    b50, b99 = _percentiles(base)
    return {"p50": p50, "p99": p99, "base_p50": b50, "base_p99": b99, "backend": backend}


def _config(log_dir: Path, cameras: int = 3) -> Any:
    return config_from_dict(
        {
            "collection": {
                "log_dir": str(log_dir),
                "fps": 30,
                "tasks": {"bench": ["simulated session"]},
                "cameras": [
                    {"key": f"observation.images.cam{i}", "width": W, "height": H}
                    for i in range(cameras)
                ],
                "vectors": [
                    {"name": "observation.state", "dim": 14, "discrete": [6, 13]},
                    {"name": "action", "dim": 14, "discrete": [6, 13]},
                ],
            }
        }
    ).collection


def measure_vector_push(n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _config(Path(tmp), cameras=0)
        rec = Recorder(cfg, durable=False)
        rec.start()
        values = np.zeros(14)
        lat: list[int] = []
        for i in range(n):
            t0 = time.perf_counter_ns()
            rec.push_vector("observation.state", i * 0.005, values)
            lat.append(time.perf_counter_ns() - t0)
        rec.cancel()
        rec.close()
    q: queue.Queue[tuple[float, np.ndarray]] = queue.Queue()
    base: list[int] = []
    for i in range(n):
        t0 = time.perf_counter_ns()
        q.put((i * 0.005, values.copy()))
        base.append(time.perf_counter_ns() - t0)
    p50, p99 = _percentiles(lat)
    b50, b99 = _percentiles(base)
    return {"p50": p50, "p99": p99, "base_p50": b50, "base_p99": b99}


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def run_session(seconds: float, log_dir: Path) -> dict[str, float]:
    """Record one simulated episode of ``seconds`` as fast as the pipeline absorbs it."""
    cfg = _config(log_dir)
    rig = SimulatedRig.from_config(cfg, vector_hz=200, duration_s=seconds, seed=1)
    rec = Recorder(cfg, durable=False)
    trace: list[tuple[float, float]] = []  # (seconds since START, RSS MB)
    stop = threading.Event()
    t_origin = time.perf_counter()

    def sample_rss() -> None:
        while not stop.is_set():
            trace.append((time.perf_counter() - t_origin, _rss_mb()))
            time.sleep(0.05)

    monitor = threading.Thread(target=sample_rss, daemon=True)
    monitor.start()
    rings = [s.ring for s in rec.cameras.values()]
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    rec.start()
    for s in rig.samples():
        if s.kind == "image":
            # Flow control of this benchmark only: a live rig would not wait.
            while max(len(r) for r in rings) > 8:
                time.sleep(0.001)
            rec.push_image(s.stream, s.t, s.data)
        else:
            rec.push_vector(s.stream, s.t, s.data)
    job = rec.stop()
    job.wait()
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    stop.set()
    monitor.join()
    rec.close()
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    if job.state != "saved":
        raise RuntimeError(f"session save failed: {job.error}")
    recorded = job.frames / 30.0
    return {
        "recorded_s": recorded,
        "wall_s": wall,
        "cpu_s": cpu,
        "rss_peak_mb": max(r for _, r in trace),
        "ring_mb": sum(r.allocated_bytes for r in rings) / 1e6,
        # Peak RSS over the first and the last quarter of the run: flat memory means equal.
        "rss_first_quarter_mb": max(r for t, r in trace if t <= wall / 4),
        "rss_last_quarter_mb": max(r for t, r in trace if t >= wall * 3 / 4),
        "dropped": float(rec.status()["dropped"]),
        "quality_red": float(job.quality == "red"),
    }


def _camera_banks(cameras: int = 3, bank: int = 16) -> list[np.ndarray]:
    """Distinct synthetic 640x480 frames per camera (what the simulated rig cycles through)."""
    return [SyntheticScene(H, W, seed=10 + k).frames(0, bank) for k in range(cameras)]


def measure_writer_encode(
    frames: int, parallel: bool, banks: list[np.ndarray], log_dir: Path
) -> dict[str, float]:
    """``frames`` per camera through EpisodeWriter.add_frames in batches of 8, then commit."""
    keys = [f"observation.images.cam{k}" for k in range(len(banks))]
    writer = DatasetWriter.create_or_open(
        log_dir, fps=30, cameras=[CameraSpec(k, H, W) for k in keys], durable=False,
        parallel_encode=parallel,
    )  # fmt: skip
    bank = len(banks[0])
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    with writer:
        episode = writer.begin_episode("bench")
        for start in range(0, frames, 8):
            i = start % bank
            n = min(8, frames - start, bank - i)
            episode.add_frames(images={k: b[i : i + n] for k, b in zip(keys, banks, strict=True)})
        episode.commit()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    total = frames * len(banks)
    return {"fps": total / wall, "cpu_ms": cpu / total * 1e3}


def measure_bare_encode(
    frames: int,
    parallel: bool,
    thread_type: str | None,
    banks: list[np.ndarray],
    log_dir: Path,
    thread_count: int | None = None,
) -> dict[str, float]:
    """``frames`` per camera through bare VideoEncoders (no stats, no copies)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    options = VideoOptions()

    def encode(k: int) -> None:
        bank = banks[k]
        with VideoEncoder(
            log_dir / f"{k}.mp4", W, H, 30, options, thread_type=thread_type,
            thread_count=thread_count,
        ) as enc:  # fmt: skip
            for start in range(0, frames, 8):
                i = start % len(bank)
                enc.write(bank[i : i + min(8, frames - start, len(bank) - i)])

    cpu0 = time.process_time()
    t0 = time.perf_counter()
    if parallel:
        threads = [threading.Thread(target=encode, args=(k,)) for k in range(len(banks))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for k in range(len(banks)):
            encode(k)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    total = frames * len(banks)
    return {"fps": total / wall, "cpu_ms": cpu / total * 1e3}


def encode_rows(frames: int) -> list[dict[str, Any]]:
    banks = _camera_banks()
    runs: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for rep in range(2):  # interleaved, best of 2: the machine is shared
            for name, run in (
                ("writer sequential", lambda d: measure_writer_encode(frames, False, banks, d)),
                ("writer parallel", lambda d: measure_writer_encode(frames, True, banks, d)),
                ("bare sequential", lambda d: measure_bare_encode(frames, False, None, banks, d)),
                ("bare sequential frame", lambda d: measure_bare_encode(frames, False, "FRAME", banks, d)),
                ("bare parallel", lambda d: measure_bare_encode(frames, True, None, banks, d)),
                ("bare parallel frame", lambda d: measure_bare_encode(frames, True, "FRAME", banks, d)),
                ("bare parallel single", lambda d: measure_bare_encode(frames, True, None, banks, d, 1)),
            ):  # fmt: skip
                runs.setdefault(name, []).append(run(root / f"{name.replace(' ', '-')}-{rep}"))
    best = {name: max(r, key=lambda x: x["fps"]) for name, r in runs.items()}

    def row(name: str, value: str, baseline: str, note: str) -> dict[str, Any]:
        v, b = best[value], best[baseline]
        return {
            "name": name,
            "value": round(v["fps"]),
            "baseline": round(b["fps"]),
            "ratio": round(v["fps"] / b["fps"], 2),
            "unit": "frames/s",
            "note": f"{note}; CPU {v['cpu_ms']:.2f} vs {b['cpu_ms']:.2f} ms/frame, "
            f"{frames} frames per camera, libx264 veryfast",
        }

    return [
        row(
            "encode 3x640x480, one encoder thread per camera (EpisodeWriter)",
            "writer parallel", "writer sequential",
            "vs the 3 cameras encoded one after the other in the caller (parallel_encode=False)",
        ),
        row(
            "encode 3x640x480, x264 frame threads, cameras one after the other",
            "bare sequential frame", "bare sequential",
            "bare VideoEncoder thread_type=FRAME vs PyAV's default (sliced threads)",
        ),
        row(
            "encode 3x640x480, thread per camera + x264 frame threads",
            "bare parallel frame", "bare parallel",
            "bare VideoEncoders on 3 threads, thread_type=FRAME vs default",
        ),
        row(
            "encode 3x640x480, thread per camera, one x264 thread each",
            "bare parallel single", "bare parallel",
            "bare VideoEncoders on 3 threads, thread_count=1 (what EpisodeWriter uses with at "
            "least one camera per CPU) vs PyAV's default sliced threads",
        ),
        row(
            "encode 3x640x480, thread per camera vs x264 frame threads alone",
            "bare parallel", "bare sequential frame",
            "the two levers compared: 3 threads (default x264 threading) vs FRAME threads, one camera at a time",
        ),
    ]  # fmt: skip


PINNED = {"MALLOC_MMAP_THRESHOLD_": "131072"}  # what `eva collect` sets (pin_mmap_threshold)
HEAP_32M = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "1073741824"}


def run_session_isolated(
    seconds: float, log_dir: Path, malloc_env: dict[str, str] | None = None
) -> dict[str, float]:
    """``run_session`` in a fresh interpreter, so each episode length gets its own clean RSS."""
    code = (
        "import json, sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
        "import bench_capture as b; "
        "print(json.dumps(b.run_session(float(sys.argv[2]), Path(sys.argv[3]))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parent), str(seconds), str(log_dir)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(PINNED if malloc_env is None else malloc_env)},
    )
    if done.returncode != 0:
        raise RuntimeError(f"session subprocess failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(quick: bool = True) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    n = 600 if quick else 3000
    for busy in (False, True):
        base = measure_queue_put(n, busy)
        tag = ", busy Python thread" if busy else ""
        for release in (True, False):
            ring = measure_ring_push(n, busy, release_gil=release)
            how = "GIL released" if release else "GIL kept"
            for stat in ("p50", "p99"):
                rows.append(
                    {
                        "name": f"push 640x480 frame {stat} ({how}{tag})",
                        "value": round(ring[stat], 1),
                        "baseline": round(base[stat], 1),
                        "ratio": round(base[stat] / ring[stat], 2) if ring[stat] else None,
                        "unit": "us",
                        "note": f"ring.push, {how} for the copy, vs queue.Queue.put(frame.copy())",
                    }
                )
            rows.append(
                {
                    "name": f"push 640x480 frames/s ({how}{tag})",
                    "value": round(ring["rate"]),
                    "baseline": round(base["rate"]),
                    "ratio": round(ring["rate"] / base["rate"], 2),
                    "unit": "frames/s",
                    "note": "producer side, consumer thread draining",
                }
            )
    shm = measure_shm_push(n)
    for stat in ("p50", "p99"):
        rows.append(
            {
                "name": f"shm ring push 640x480 frame {stat} ({shm['backend']})",
                "value": round(shm[stat], 1),
                "baseline": round(shm[f"base_{stat}"], 1),
                "ratio": round(shm[f"base_{stat}"] / shm[stat], 2) if shm[stat] else None,
                "unit": "us",
                "note": "shared-memory ring push (/dev/shm, 16 slots) vs np.copyto of the frame "
                "into 16 reused buffers in turn (the memcpy limit)",
            }
        )
    vec = measure_vector_push(2000 if quick else 20000)
    for stat in ("p50", "p99"):
        rows.append(
            {
                "name": f"push 14-dim vector {stat}",
                "value": round(vec[stat], 2),
                "baseline": round(vec[f"base_{stat}"], 2),
                "ratio": round(vec[f"base_{stat}"] / vec[stat], 2),
                "unit": "us",
                "note": "Recorder.push_vector vs queue.Queue.put(values.copy())",
            }
        )
    rows += encode_rows(90 if quick else 300)
    lengths = (3.0, 6.0, 12.0) if quick else (15.0, 30.0, 60.0)
    sessions = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, seconds in enumerate(lengths):
            sessions.append(run_session_isolated(seconds, Path(tmp) / f"s{k}"))
        heap = run_session_isolated(lengths[-1], Path(tmp) / "heap", HEAP_32M)
    longest = sessions[-1]
    rows.append(
        {
            "name": f"session real-time factor ({lengths[-1]:g} s, 3x640x480@30 + 2x14@200Hz)",
            "value": round(longest["recorded_s"] / longest["wall_s"], 2),
            "baseline": 1.0,
            "ratio": round(longest["recorded_s"] / longest["wall_s"], 2),
            "unit": "x real time",
            "note": f"dropped {longest['dropped']:g}, libx264 veryfast, {longest['wall_s']:.1f} s wall",
        }
    )
    cores = 2.0
    cpu_per_s = longest["cpu_s"] / longest["recorded_s"]
    rows.append(
        {
            "name": "session CPU s per recorded s",
            "value": round(cpu_per_s, 2),
            "baseline": cores,
            "ratio": round(cores / cpu_per_s, 2),
            "unit": "cpu-s/s",
            "note": "whole process (rig, pushes, alignment, 3 encoders, save)",
        }
    )
    rows.append(
        {
            "name": f"session real-time factor, 32 MiB mmap threshold ({lengths[-1]:g} s)",
            "value": round(heap["recorded_s"] / heap["wall_s"], 2),
            "baseline": round(longest["recorded_s"] / longest["wall_s"], 2),
            "ratio": round(
                (heap["recorded_s"] / heap["wall_s"]) / (longest["recorded_s"] / longest["wall_s"]),
                2,
            ),
            "unit": "x real time",
            "note": f"the Makefile's malloc settings vs eva collect's pinned 128 KiB threshold; "
            f"CPU {heap['cpu_s'] / heap['recorded_s']:.2f} vs "
            f"{longest['cpu_s'] / longest['recorded_s']:.2f} s/s",
        }
    )
    rows.append(
        {
            "name": f"peak RSS growth, 32 MiB mmap threshold ({lengths[-1]:g} s)",
            "value": round(heap["rss_last_quarter_mb"], 1),
            "baseline": round(heap["rss_first_quarter_mb"], 1),
            "ratio": round(heap["rss_last_quarter_mb"] / heap["rss_first_quarter_mb"], 3),
            "unit": "MB",
            "note": "last vs first quarter: heap fragmentation creeps up without the pin",
        }
    )
    rows.append(
        {
            "name": f"peak RSS, last vs first quarter of the {lengths[-1]:g} s episode",
            "value": round(longest["rss_last_quarter_mb"], 1),
            "baseline": round(longest["rss_first_quarter_mb"], 1),
            "ratio": round(longest["rss_last_quarter_mb"] / longest["rss_first_quarter_mb"], 3),
            "unit": "MB",
            "note": f"flat memory: ratio ~1 (camera rings hold {longest['ring_mb']:.0f} MB)",
        }
    )
    for length, s in zip(lengths, sessions, strict=True):
        rows.append(
            {
                "name": f"peak RSS, {length:g} s episode",
                "value": round(s["rss_peak_mb"], 1),
                "baseline": round(sessions[0]["rss_peak_mb"], 1),
                "ratio": round(s["rss_peak_mb"] / sessions[0]["rss_peak_mb"], 2),
                "unit": "MB",
                "note": f"vs the {lengths[0]:g} s episode (each in a fresh process)",
            }
        )
    return rows


# ---- pytest-benchmark ----


def test_ring_push_frame(benchmark: Any) -> None:
    ring = make_ring((H, W, 3), np.uint8, block_slots=16, initial_blocks=4, max_bytes=1 << 30)
    frame = np.zeros((H, W, 3), np.uint8)

    def push() -> None:
        ring.push(0.0, frame)
        ring.discard(1)

    benchmark(push)


def test_shm_ring_push_frame(benchmark: Any) -> None:
    shm_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None
    frame = np.zeros((H, W, 3), np.uint8)
    with tempfile.TemporaryDirectory(dir=shm_dir) as tmp:
        ring = create_shm_ring(Path(tmp) / "bench.ring", (H, W, 3), np.uint8, 16)

        def push() -> None:
            ring.push(0.0, frame)
            ring.discard(1)

        try:
            benchmark(push)
        finally:
            ring.close()
            ring.unlink()


def test_queue_put_frame_copy(benchmark: Any) -> None:
    q: queue.Queue[np.ndarray] = queue.Queue()
    frame = np.zeros((H, W, 3), np.uint8)

    def put() -> None:
        q.put(frame.copy())
        q.get()

    benchmark(put)


@pytest.mark.parametrize("parallel", [True, False], ids=["thread-per-camera", "sequential"])
def test_writer_encode_3_cameras(benchmark: Any, tmp_path: Path, parallel: bool) -> None:
    banks = _camera_banks(bank=8)
    runs = iter(range(1000))
    benchmark.pedantic(
        lambda: measure_writer_encode(16, parallel, banks, tmp_path / str(next(runs))),
        rounds=3,
        iterations=1,
    )


if __name__ == "__main__":
    for row in report(quick=True):
        print(row)
