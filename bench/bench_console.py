"""Operator console under load: live capture while a browser-like client pulls previews, replay
video and the event stream, against the same session with no client; and the first byte of a
replay video request against a plain file read.

Set-up (the console's real deployment, one process; ``run_driver`` in a fresh interpreter so the
malloc pin and the threads stay out of ``run_all``'s process):

* a :class:`~eva.console.session.ConsoleSession` built from a TOML config written to a temp dir:
  3 cameras 640x480 at 30 fps, 14-dim ``observation.state`` / ``action`` at 200 Hz (the simulated
  rig, real time, through the session's own ``SourcePump``), libx264 veryfast, ``durable=False``,
  with ``pin_mmap_threshold()`` as ``eva console`` calls it;
* the real Starlette app (``create_app``, token auth) served by uvicorn on 127.0.0.1 port 0 in a
  thread of the same process, configured as ``server.serve`` does (h11 unless httptools is
  installed);
* push latency: the session's pump looks ``sink.push_image`` / ``sink.push_vector`` up on every
  sample, so instance attributes set on ``session.recorder`` right after construction wrap the
  real calls (``Recorder.push_*``, the preview tap included) with ``perf_counter_ns`` from the
  pump thread itself. The wrapper also notes how late each sample reaches the recorder
  (monotonic arrival - the rig's capture time, less the run's smallest such difference: the rig
  paces its clock on the monotonic one from its first sample), whether the push took a preview
  copy (the tap's sequence number moved), and counts refused pushes (False while the episode
  records). Its own cost (~1 us) is in both conditions.
* the browser-like client is another process (``client_main``; a browser does not share the
  server's GIL) with one ``httpx.AsyncClient`` of at most 6 connections (a browser's per-host
  limit): each camera's ``GET /api/preview/{camera}?after=N`` at 4 Hz, ``GET /api/events``
  streamed, and the QUALITY CHECK panel's traffic: every 3 s an episode "opened" (episode list,
  ``series``, the 3 cameras' videos fetched whole with ``Range: bytes=0-``), then a seek every
  0.5 s (a 256 KiB bounded Range request per camera). It replays every episode saved before the
  run (a warm-up episode and the previous runs'). It is warmed (first event, previews, a video)
  before START.
* START / STOP call ``session.start`` / ``session.stop`` directly (what the POST handlers run in
  the thread pool), the same in both conditions; the server runs in both, idle without client.

``report(quick)`` rows (value: with client, baseline: without, in the same run; two episodes of
each in ABBA order, pooled; 6 s episodes in quick mode, 30 s in full):

* ``real-time factor``: recorded seconds (saved frames / fps) / wall seconds from START to the
  saved episode (bench_capture's definition; the rig is real time, so the best is just under 1
  and the save tail after STOP is what moves it). Ratio value / baseline.
* ``dropped samples``: pushes refused while recording (ring overflow past the backlog limit, bad
  shapes); must stay 0. The note adds saved frames minus (STOP - START) x fps, the episodes'
  quality and the session status' ``dropped``.
* ``push p99`` / ``p50`` (image, 640x480), the image push p99 of the pushes that took no
  preview copy (the cost of serving alone), and ``push p99`` (vector): ratio baseline / value
  (< 1: the client slows the push path). The note says how many pushes took a preview copy
  (the tap copies at most 5 frames/s per camera while a viewer pulls previews) and their cost.
* ``sample lateness p99``: how far behind the rig's schedule samples reach the recorder (GIL
  waits of the pump thread show here first).
* ``camera backlog peak``: the longest camera ring during recording (sampled every 50 ms).
* ``STOP -> saved`` and ``server CPU per recorded s``.
* ``replay video first byte``: an idle console (not recording, no other client), keep-alive
  connection: time from sending ``GET .../video/{key}`` with ``Range: bytes=0-65535`` to the
  first body byte, against ``open()`` + ``read(65536)`` of the same (page-cached) file, both
  timed in the client process; median of interleaved repeats. And the first body byte of the
  load client's video opens during capture against that idle figure.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
CAMERAS = ("cam_high", "cam_left_wrist", "cam_right_wrist")
DATASET = "bench"
FPS = 30
PREVIEW_HZ = 4.0
REVIEW_VISIT_S = 3.0
SEEK_PERIOD_S = 0.5
SEEK_BYTES = 256 * 1024
FIRST_BYTES = 64 * 1024
MAX_CONNECTIONS = 6


def write_config(path: Path, log_dir: Path, width: int = 640, height: int = 480) -> Path:
    """The ALOHA-style rig of examples/collect.toml, into ``log_dir``."""
    lines = [
        "[collection]",
        f'log_dir = "{log_dir}"',
        f"fps = {FPS}",
        'robot_type = "aloha"',
        "min_episode_frames = 30",
        "[collection.tasks]",
        f'{DATASET} = ["console bench session"]',
    ]
    for name in CAMERAS:
        lines += [
            "[[collection.cameras]]",
            f'key = "observation.images.{name}"',
            f"width = {width}",
            f"height = {height}",
        ]
    for name in ("observation.state", "action"):
        lines += ["[[collection.vectors]]", f'name = "{name}"', "dim = 14", "discrete = [6, 13]"]
    lines += [
        "[collection.encoder]",
        'codec = "libx264"',
        "crf = 23",
        'preset = "veryfast"',
        "gop = 30",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else float("nan")


# ---- server side (the console process) ---------------------------------------------------------


class PushTimer:
    """Times the pump's pushes into the session's recorder (see module doc)."""

    def __init__(self, recorder: Any) -> None:
        self.active = False
        self.reset()
        push_image = recorder.push_image
        push_vector = recorder.push_vector
        previews = recorder.preview._cameras if recorder.preview is not None else {}
        perf = time.perf_counter_ns
        clock = time.monotonic

        def timed_image(camera: str, t: float, frame: np.ndarray) -> bool:
            tap = previews.get(camera)
            seq = tap.ring.pushed if tap is not None else 0
            arrived = clock()
            t0 = perf()
            ok = push_image(camera, t, frame)
            dt = perf() - t0
            if self.active:
                self.image_ns.append(dt)
                self.copied.append(tap is not None and tap.ring.pushed != seq)
                self.late_s.append(arrived - t)
                if not ok:
                    self.refused += 1
            return ok

        def timed_vector(stream: str, t: float, values: np.ndarray) -> bool:
            arrived = clock()
            t0 = perf()
            ok = push_vector(stream, t, values)
            dt = perf() - t0
            if self.active:
                self.vector_ns.append(dt)
                self.late_s.append(arrived - t)
                if not ok:
                    self.refused += 1
            return ok

        # SourcePump calls self.sink.push_image(...) per sample: the instance attribute wins.
        recorder.push_image = timed_image
        recorder.push_vector = timed_vector

    def reset(self) -> None:
        self.image_ns: list[int] = []
        self.copied: list[bool] = []  # this push also took a preview copy
        self.vector_ns: list[int] = []
        self.late_s: list[float] = []  # arrival (monotonic) - capture time: offset + lateness
        self.refused = 0


class Client:
    """The browser-like client process (``client_main``), driven over stdin/stdout."""

    def __init__(self, spec: dict[str, Any]) -> None:
        code = (
            "import sys; sys.path.insert(0, sys.argv[1]); import bench_console as b; "
            "b.client_main(sys.argv[2])"
        )
        self.process = subprocess.Popen(
            [sys.executable, "-c", code, str(BENCH_DIR), json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def _line(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(10)
            err = (self.process.stderr.read() if self.process.stderr else "").strip()
            raise RuntimeError(f"bench client died: {err.splitlines()[-3:]}")
        return line.strip()

    def wait_ready(self) -> None:
        line = self._line()
        if line != "ready":
            raise RuntimeError(f"bench client: {line}")

    def finish(self) -> dict[str, Any]:
        assert self.process.stdin is not None
        if self.process.poll() is None:
            self.process.stdin.write("stop\n")
            self.process.stdin.flush()
        result = json.loads(self._line())
        self.process.wait(30)
        return result

    def close(self) -> None:
        """End the process if it still runs (after an error); a finished one is left alone."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def _camera_rings(session: Any) -> list[Any]:
    return [s.ring for s in session.recorder.cameras.values()]


def record(session: Any, timer: PushTimer, seconds: float) -> dict[str, Any]:
    """One episode of ``seconds`` through the session, timed from START to saved."""
    import resource

    rec = session.recorder
    rings = _camera_rings(session)
    overflow0 = sum(s.ring.overflow_count for s in rec.streams.values())
    warnings0 = len(session.warnings.entries)
    timer.reset()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    session.start(DATASET, None)
    timer.active = True
    t_started = time.perf_counter()
    peak = 0
    while time.perf_counter() - t0 < seconds:
        peak = max(peak, max(len(r) for r in rings))
        time.sleep(0.05)
    timer.active = False
    t_stop = time.perf_counter()
    saved = session.stop()
    job = next(j for j in rec.jobs if j.job_id == saved["job_id"])
    if not job.wait(300):
        raise RuntimeError("save job did not finish in 300 s")
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    if job.state != "saved":
        raise RuntimeError(f"save failed: {job.error}")
    if not timer.image_ns or not timer.vector_ns:
        raise RuntimeError("no push was timed: does SourcePump still call sink.push_* per sample?")
    overflow = sum(s.ring.overflow_count for s in rec.streams.values()) - overflow0
    return {
        "recorded_s": job.frames / FPS,
        "frames": job.frames,
        "expected_frames": round((t_stop - t_started) * FPS),
        "wall_s": wall,
        "tail_s": wall - (t_stop - t0),
        "cpu_s": (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime),
        "refused": timer.refused,
        "overflow": overflow,
        "quality": job.quality,
        "issues": sorted({i.get("code", "?") for i in job.quality_issues}),
        "backlog_peak_frames": peak,
        "warnings": max(0, len(session.warnings.entries) - warnings0),
        "image_ns": list(timer.image_ns),
        "copied": list(timer.copied),
        "vector_ns": list(timer.vector_ns),
        # The rig's clock and the monotonic one differ by a constant (set when the pump's thread
        # first ran): lateness is measured from the run's earliest sample.
        "late_s": (np.asarray(timer.late_s) - min(timer.late_s, default=0.0)).tolist(),
    }


def _saved_videos(session: Any) -> dict[str, Any]:
    """What the client may replay: every saved episode of the dataset, and one file path."""
    listing = session.episodes(DATASET)
    episodes = [e["episode_index"] for e in listing["episodes"]]
    keys = [f"observation.images.{name}" for name in CAMERAS]
    path = session.video_file(DATASET, episodes[0], keys[0]) if episodes else None
    return {"episodes": episodes, "keys": keys, "path": str(path) if path else None}


def _wait_preview_idle(session: Any) -> None:
    """Until the preview tap stops copying (no viewer for ``linger_s``): a clean baseline."""
    while time.monotonic() < session.preview.wanted_until + 0.2:
        time.sleep(0.1)


def run_driver(quick: bool) -> dict[str, Any]:
    """The whole measurement in this process (the console's): see the module doc."""
    import uvicorn

    from eva.capture.recorder import pin_mmap_threshold
    from eva.console.server import allowed_origins, bind, create_app, new_token
    from eva.console.session import ConsoleSession

    seconds = 6.0 if quick else 30.0
    warm_s = 4.0 if quick else 10.0
    order = ["base", "client", "client", "base"]  # ABBA: a drifting host load cancels out
    fb_reps = 40 if quick else 150
    if os.environ.get("EVA_CAPTURE_MALLOC", "pin") != "keep":
        pin_mmap_threshold()
    with tempfile.TemporaryDirectory(prefix="eva-bench-console-") as tmp:
        config = write_config(Path(tmp) / "console.toml", Path(tmp) / "logs")
        session = ConsoleSession(config, source="sim", seed=0, durable=False)
        timer = PushTimer(session.recorder)
        sock = bind("127.0.0.1", 0)
        port = sock.getsockname()[1]
        token = new_token()
        app = create_app(session, token, allowed_origins("127.0.0.1", port))
        server = uvicorn.Server(
            uvicorn.Config(
                app, log_level="warning", access_log=False, lifespan="off",
                timeout_graceful_shutdown=2,
            )
        )  # fmt: skip
        thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="bench-uvicorn", daemon=True
        )
        thread.start()
        base_url = f"http://127.0.0.1:{port}"
        runs: dict[str, list[dict[str, Any]]] = {"base": [], "client": []}
        clients: list[dict[str, Any]] = []
        try:
            deadline = time.monotonic() + 30
            while not server.started:
                if time.monotonic() > deadline or not thread.is_alive():
                    raise RuntimeError("uvicorn did not start")
                time.sleep(0.02)
            record(session, timer, warm_s)  # warm-up: encoders, writer, a video to replay
            for kind in order:
                if kind == "base":
                    _wait_preview_idle(session)
                    runs["base"].append(record(session, timer, seconds))
                    continue
                videos = _saved_videos(session)
                spec = {
                    "mode": "load",
                    "base": base_url,
                    "token": token,
                    "dataset": DATASET,
                    "cameras": videos["keys"],
                    "episodes": videos["episodes"],
                }
                client = Client(spec)
                try:
                    client.wait_ready()
                    runs["client"].append(record(session, timer, seconds))
                    clients.append(client.finish())
                finally:
                    client.close()
            _wait_preview_idle(session)
            videos = _saved_videos(session)
            fb = Client(
                {
                    "mode": "firstbyte",
                    "base": base_url,
                    "token": token,
                    "url": f"/api/datasets/{DATASET}/episodes/{videos['episodes'][0]}"
                    f"/video/{videos['keys'][0]}",
                    "path": videos["path"],
                    "reps": fb_reps,
                }
            )
            try:
                fb.wait_ready()
                firstbyte = fb.finish()
            finally:
                fb.close()
            status = session.status()
        finally:
            server.should_exit = True
            thread.join(10)
            session.close()
    return {
        "seconds": seconds,
        "runs": runs,
        "clients": clients,
        "firstbyte": firstbyte,
        "dropped_status": status["dropped"],
        "http": server.config.http_protocol_class.__name__,
    }


def run_driver_isolated(quick: bool) -> dict[str, Any]:
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import bench_console as b; "
        "r = b.run_driver(sys.argv[2] == '1'); sys.stdout.write('\\n' + json.dumps(r) + '\\n')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(BENCH_DIR), "1" if quick else "0"],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-3:]
        raise RuntimeError(f"console bench driver failed: {tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---- client side (the browser, another process) ------------------------------------------------


class _Stats:
    def __init__(self) -> None:
        self.preview_s: list[float] = []
        self.previews = 0
        self.preview_empty = 0
        self.preview_bytes = 0
        self.events = 0
        self.opens = 0
        self.open_first_s: list[float] = []
        self.open_s: list[float] = []
        self.seeks = 0
        self.seek_s: list[float] = []
        self.video_bytes = 0
        self.series = 0
        self.series_s: list[float] = []
        self.errors = 0
        self.first_error: str | None = None

    def error(self, text: str) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = text


async def _previews(client: Any, camera: str, stats: _Stats, ready: asyncio.Event) -> None:
    seq = 0
    period = 1.0 / PREVIEW_HZ
    while True:
        t0 = time.perf_counter()
        r = await client.get(f"/api/preview/{camera}", params={"after": seq})
        dt = time.perf_counter() - t0
        if r.status_code == 200:
            seq = int(r.headers["x-preview-seq"])
            stats.previews += 1
            stats.preview_bytes += len(r.content)
            stats.preview_s.append(dt)
            ready.set()
        elif r.status_code == 204:
            stats.preview_empty += 1
        else:
            stats.error(f"preview {r.status_code}: {r.text[:200]}")
        await asyncio.sleep(max(0.0, period - dt))


async def _events(client: Any, stats: _Stats, ready: asyncio.Event) -> None:
    async with client.stream("GET", "/api/events", timeout=None) as r:
        if r.status_code != 200:
            stats.error(f"events {r.status_code}")
            return
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                stats.events += 1
                ready.set()


async def _fetch(
    client: Any, url: str, headers: dict[str, str], stats: _Stats
) -> tuple[float, int]:
    """(seconds to the first body byte, bytes) of one request; the body is read to the end."""
    t0 = time.perf_counter()
    first = float("nan")
    got = 0
    async with client.stream("GET", url, headers=headers) as r:
        if r.status_code not in (200, 206):
            await r.aread()
            stats.error(f"{url} {r.status_code}: {r.text[:200]}")
            return first, 0
        async for chunk in r.aiter_raw():
            if got == 0 and chunk:
                first = time.perf_counter() - t0
            got += len(chunk)
    stats.video_bytes += got
    return first, got


async def _review(client: Any, spec: dict[str, Any], stats: _Stats, ready: asyncio.Event) -> None:
    """The QUALITY CHECK panel: open an episode (list, series, 3 videos), then scrub it."""
    rng = np.random.default_rng(1)
    dataset = spec["dataset"]
    episodes = list(spec["episodes"])
    visit = 0
    while True:
        r = await client.get(f"/api/datasets/{dataset}/episodes")
        if r.status_code == 200:
            episodes = [e["episode_index"] for e in r.json()["episodes"]] or episodes
        else:
            stats.error(f"episodes {r.status_code}")
        if not episodes:
            await asyncio.sleep(REVIEW_VISIT_S)
            continue
        episode = episodes[visit % len(episodes)]
        visit += 1
        started = time.perf_counter()
        t0 = time.perf_counter()
        r = await client.get(f"/api/datasets/{dataset}/episodes/{episode}/series")
        if r.status_code == 200:
            stats.series += 1
            stats.series_s.append(time.perf_counter() - t0)
        else:
            stats.error(f"series {r.status_code}: {r.text[:200]}")
        urls = [f"/api/datasets/{dataset}/episodes/{episode}/video/{k}" for k in spec["cameras"]]
        sizes = []
        t0 = time.perf_counter()
        for first, size in await asyncio.gather(
            *(_fetch(client, u, {"Range": "bytes=0-"}, stats) for u in urls)
        ):
            stats.opens += 1
            stats.open_first_s.append(first)
            sizes.append(size)
        stats.open_s.append(time.perf_counter() - t0)
        ready.set()
        while time.perf_counter() - started < REVIEW_VISIT_S:
            await asyncio.sleep(SEEK_PERIOD_S)
            fraction = float(rng.random())
            t0 = time.perf_counter()
            ranges = []
            for size in sizes:
                start = int(fraction * max(0, size - SEEK_BYTES))
                ranges.append({"Range": f"bytes={start}-{start + SEEK_BYTES - 1}"})
            await asyncio.gather(
                *(_fetch(client, u, h, stats) for u, h in zip(urls, ranges, strict=True))
            )
            stats.seeks += 1
            stats.seek_s.append(time.perf_counter() - t0)


async def _load(spec: dict[str, Any]) -> dict[str, Any]:
    import httpx

    stats = _Stats()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def wait_stdin() -> None:
        sys.stdin.readline()
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=wait_stdin, daemon=True).start()
    limits = httpx.Limits(
        max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS
    )
    headers = {"Authorization": f"Bearer {spec['token']}"}
    async with httpx.AsyncClient(
        base_url=spec["base"], headers=headers, limits=limits, timeout=60.0
    ) as client:
        flags = {name: asyncio.Event() for name in (*spec["cameras"], "events", "review")}
        tasks = [
            asyncio.create_task(_previews(client, cam, stats, flags[cam]))
            for cam in spec["cameras"]
        ]
        tasks.append(asyncio.create_task(_events(client, stats, flags["events"])))
        tasks.append(asyncio.create_task(_review(client, spec, stats, flags["review"])))
        waiting = asyncio.gather(*(f.wait() for f in flags.values()))
        try:
            await asyncio.wait_for(waiting, 30)
        except TimeoutError:
            missing = [name for name, f in flags.items() if not f.is_set()]
            failed = [t.exception() for t in tasks if t.done() and not t.cancelled()]
            print(f"not ready: {missing} {failed} {stats.first_error}", flush=True)
            raise SystemExit(1) from None
        # Counted from START on: the warm-up requests are not the run's.
        stats.__init__()
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        print("ready", flush=True)
        await stop.wait()
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
                stats.error(f"task failed: {r!r}")
    out = dict(vars(stats))
    out.update(wall_s=wall, cpu_s=cpu)
    return out


def _firstbyte(spec: dict[str, Any]) -> dict[str, Any]:
    import httpx

    path = spec["path"]
    rng_header = {"Range": f"bytes=0-{FIRST_BYTES - 1}"}
    headers = {"Authorization": f"Bearer {spec['token']}"}
    http_first: list[float] = []
    http_all: list[float] = []
    plain: list[float] = []
    with httpx.Client(base_url=spec["base"], headers=headers, timeout=60.0) as client:
        for _ in range(3):  # connection up, file in the page cache, code paths warm
            client.get(spec["url"], headers=rng_header).raise_for_status()
            with open(path, "rb") as f:
                f.read()
        print("ready", flush=True)
        sys.stdin.readline()
        for i in range(spec["reps"]):
            for which in ("http", "plain") if i % 2 == 0 else ("plain", "http"):
                if which == "plain":
                    t0 = time.perf_counter()
                    with open(path, "rb") as f:
                        data = f.read(FIRST_BYTES)
                    plain.append(time.perf_counter() - t0)
                    assert len(data) == FIRST_BYTES
                    continue
                t0 = time.perf_counter()
                got = 0
                with client.stream("GET", spec["url"], headers=rng_header) as r:
                    for chunk in r.iter_raw():
                        if got == 0 and chunk:
                            http_first.append(time.perf_counter() - t0)
                        got += len(chunk)
                http_all.append(time.perf_counter() - t0)
                if r.status_code != 206 or got != FIRST_BYTES:
                    raise RuntimeError(f"range request: {r.status_code}, {got} bytes")
    return {"http_first_s": http_first, "http_all_s": http_all, "plain_s": plain}


def client_main(spec_json: str) -> None:
    spec = json.loads(spec_json)
    result = asyncio.run(_load(spec)) if spec["mode"] == "load" else _firstbyte(spec)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


# ---- report ------------------------------------------------------------------------------------


def _pooled(runs: list[dict[str, Any]], key: str) -> list[float]:
    return [v for r in runs for v in r[key]]


def _mean(runs: list[dict[str, Any]], key: str) -> float:
    return float(np.mean([r[key] for r in runs]))


def _time_row(name: str, value: float, baseline: float, unit: str, note: str) -> dict[str, Any]:
    digits = 3 if unit == "ms" and max(value, baseline) < 1 else 2
    return {
        "name": name,
        "value": round(value, digits),
        "baseline": round(baseline, digits),
        "ratio": round(baseline / value, 3) if value else None,
        "unit": unit,
        "note": note,
    }


def rows_from(result: dict[str, Any]) -> list[dict[str, Any]]:
    runs = result["runs"]
    base, load = runs["base"], runs["client"]
    seconds = result["seconds"]
    n = len(load)
    tag = f"{seconds:g} s episodes x {n}, 3x640x480@30 + 2x14@200Hz, client vs no client"
    clients = result["clients"]

    def client_sum(key: str) -> float:
        return float(sum(c[key] for c in clients))

    client_wall = client_sum("wall_s")
    traffic = (
        f"client: {client_sum('previews') / client_wall / len(CAMERAS):.1f} previews/s per camera, "
        f"{client_sum('events'):.0f} events, {client_sum('opens'):.0f} video opens + "
        f"{client_sum('seeks'):.0f} seeks ({client_sum('video_bytes') / 1e6:.0f} MB), "
        f"{client_sum('series'):.0f} series, {client_sum('errors'):.0f} errors, "
        f"client CPU {client_sum('cpu_s') / client_wall:.2f} s/s"
    )
    errors = [c["first_error"] for c in clients if c["first_error"]]
    if errors:
        traffic += f"; first error: {errors[0]}"
    rtf_load = float(np.mean([r["recorded_s"] / r["wall_s"] for r in load]))
    rtf_base = float(np.mean([r["recorded_s"] / r["wall_s"] for r in base]))
    rows = [
        {
            "name": "console capture real-time factor, browser-like client",
            "value": round(rtf_load, 3),
            "baseline": round(rtf_base, 3),
            "ratio": round(rtf_load / rtf_base, 3),
            "unit": "x real time",
            "note": f"recorded s / wall START->saved (real-time rig: best just under 1); {tag}; "
            + traffic,
        }
    ]
    dropped_load = sum(max(r["refused"], r["overflow"]) for r in load)
    dropped_base = sum(max(r["refused"], r["overflow"]) for r in base)
    missing = [r["expected_frames"] - r["frames"] for r in (*base, *load)]
    quality = sorted({r["quality"] for r in (*base, *load)})
    issues = sorted({i for r in (*base, *load) for i in r["issues"]})
    rows.append(
        {
            "name": "console capture dropped samples, browser-like client",
            "value": dropped_load,
            "baseline": dropped_base,
            "ratio": 1.0 if dropped_load == dropped_base else None,
            "unit": "samples",
            "note": "pushes refused while recording (ring overflow), must stay 0; frames saved "
            f"minus START-STOP x fps: {min(missing):+d}..{max(missing):+d}; quality "
            f"{'/'.join(str(q) for q in quality)}{' ' + ','.join(issues) if issues else ''}; "
            f"status dropped {result['dropped_status']}",
        }
    )
    load_ns, base_ns = _pooled(load, "image_ns"), _pooled(base, "image_ns")
    copied = np.asarray(_pooled(load, "copied"), dtype=bool)
    copies = np.asarray(load_ns, dtype=np.float64)[copied] / 1e3
    plain_load = np.asarray(load_ns, dtype=np.float64)[~copied].tolist()
    plain_base = [v for v, c in zip(base_ns, _pooled(base, "copied"), strict=True) if not c]
    copy_note = (
        f"{copied.sum()} of {len(load_ns)} pushes also took a preview copy "
        f"(p50/p99 {_pct(copies.tolist(), 50):.0f}/{_pct(copies.tolist(), 99):.0f} us)"
    )
    for stat, q in (("p99", 99), ("p50", 50)):
        rows.append(
            _time_row(
                f"console push 640x480 frame {stat}, browser-like client",
                _pct(load_ns, q) / 1e3,
                _pct(base_ns, q) / 1e3,
                "us",
                "Recorder.push_image timed in the session's pump thread, preview tap included; "
                f"{len(load_ns)} vs {len(base_ns)} pushes; {copy_note}",
            )
        )
    rows.append(
        _time_row(
            "console push 640x480 frame p99 without a preview copy, browser-like client",
            _pct(plain_load, 99) / 1e3,
            _pct(plain_base, 99) / 1e3,
            "us",
            "the pushes that took no preview copy: what serving the client costs them (GIL)",
        )
    )
    rows.append(
        _time_row(
            "console push 14-dim vector p99, browser-like client",
            _pct(_pooled(load, "vector_ns"), 99) / 1e3,
            _pct(_pooled(base, "vector_ns"), 99) / 1e3,
            "us",
            "Recorder.push_vector in the pump thread",
        )
    )
    for stat, q in (("p99", 99), ("max", 100)):
        rows.append(
            _time_row(
                f"console sample lateness {stat}, browser-like client",
                _pct(_pooled(load, "late_s"), q) * 1e3,
                _pct(_pooled(base, "late_s"), q) * 1e3,
                "ms",
                "arrival at the recorder behind the rig's schedule, from the run's earliest "
                "sample (includes up to ~4 ms of the rig's timestamp jitter)",
            )
        )
    peak_load = max(r["backlog_peak_frames"] for r in load)
    peak_base = max(r["backlog_peak_frames"] for r in base)
    rows.append(
        _time_row(
            "console camera backlog peak, browser-like client",
            peak_load / FPS * 1e3,
            peak_base / FPS * 1e3,
            "ms",
            f"longest camera ring while recording ({peak_load} vs {peak_base} frames); "
            f"backlog warnings {sum(r['warnings'] for r in load)} vs "
            f"{sum(r['warnings'] for r in base)}",
        )
    )
    rows.append(
        _time_row(
            "console STOP -> saved, browser-like client",
            _mean(load, "tail_s"),
            _mean(base, "tail_s"),
            "s",
            "drain, last encodes, validate, commit (durable=False)",
        )
    )
    cpu_load = float(np.mean([r["cpu_s"] / r["recorded_s"] for r in load]))
    cpu_base = float(np.mean([r["cpu_s"] / r["recorded_s"] for r in base]))
    rows.append(
        _time_row(
            "console server CPU s per recorded s, browser-like client",
            cpu_load,
            cpu_base,
            "cpu-s/s",
            "the console process (rig, recorder, encoders, HTTP server), START->saved; "
            f"HTTP protocol {result['http']}",
        )
    )
    fb = result["firstbyte"]
    http_first = _pct(fb["http_first_s"], 50) * 1e3
    rows.append(
        _time_row(
            "replay video first byte vs open()+read(64 KiB)",
            http_first,
            _pct(fb["plain_s"], 50) * 1e3,
            "ms",
            f"idle console, keep-alive, Range 0-65535, median of {len(fb['plain_s'])}; "
            f"whole 64 KiB {_pct(fb['http_all_s'], 50) * 1e3:.2f} ms, "
            f"p90 first byte {_pct(fb['http_first_s'], 90) * 1e3:.2f} ms",
        )
    )
    opens = [s for c in clients for s in c["open_first_s"] if s == s]
    rows.append(
        _time_row(
            "replay video first byte during capture + load vs idle",
            _pct(opens, 50) * 1e3,
            http_first,
            "ms",
            f"the load client's video opens (Range bytes=0-, 3 at once), median of {len(opens)}; "
            f"p90 {_pct(opens, 90) * 1e3:.1f} ms; preview GET p50/p99 "
            f"{_pct([s for c in clients for s in c['preview_s']], 50) * 1e3:.1f}/"
            f"{_pct([s for c in clients for s in c['preview_s']], 99) * 1e3:.1f} ms, "
            f"series p50 {_pct([s for c in clients for s in c['series_s']], 50) * 1e3:.0f} ms",
        )
    )
    return rows


def report(quick: bool = False) -> list[dict[str, Any]]:
    return rows_from(run_driver_isolated(quick))


# ---- pytest-benchmark (small: 3 cameras 160x120, in-process) -----------------------------------


def test_encode_preview_jpeg(benchmark: Any) -> None:
    from eva.capture.synthetic import SyntheticScene
    from eva.console.jpeg import JpegEncoder

    frame = SyntheticScene(240, 320, seed=0).frames(0, 1)[0]
    benchmark(JpegEncoder(frame.shape[1], frame.shape[0]).encode, frame)


def test_status_uncached(benchmark: Any, tmp_path: Path) -> None:
    from eva.console.session import ConsoleSession

    config = write_config(tmp_path / "c.toml", tmp_path / "logs", 160, 120)
    session = ConsoleSession(config, durable=False)
    try:

        def status() -> None:
            session.invalidate_status()  # what every event-stream tick pays once per 0.2 s
            session.status()

        benchmark(status)
    finally:
        session.close()


def test_video_file_lookup(benchmark: Any, tmp_path: Path) -> None:
    """The per-request work of every replay video / seek request before the file is sent."""
    from eva.console.session import ConsoleSession

    config = write_config(tmp_path / "c.toml", tmp_path / "logs", 160, 120)
    session = ConsoleSession(config, durable=False)
    try:
        session.start(DATASET, None)
        time.sleep(1.5)
        saved = session.stop()
        job = next(j for j in session.recorder.jobs if j.job_id == saved["job_id"])
        assert job.wait(60) and job.state == "saved", job.error
        benchmark(
            session.video_file, DATASET, job.episode_index, f"observation.images.{CAMERAS[0]}"
        )
    finally:
        session.close()


if __name__ == "__main__":
    from run_all import format_table

    print(format_table(report(quick="--full" not in sys.argv)))
