"""The configured rig: one source process per source, each feeding shared-memory rings.

``SourceRig(config)`` groups the streams by their ``source`` (streams with the same plugin
object, the same ZeroMQ endpoint or the simulator share one process; each FFmpeg input is its
own), creates one shared-memory snapshot ring per stream (``capture/shm_ring.py``, files in
``/dev/shm``), and starts ``python -m eva.capture.source_worker`` for each group. The recorder
pops those rings exactly as it pops its in-process ones (``Recorder(rings=rig.rings)``).

Supervision (a monitor thread):
- a worker that exits (an unplugged camera, a closed stream, ``kill -9``) or a stream that
  delivers nothing for its ``stall_timeout_s`` while an episode records is reported once per
  episode: a warning, and ``Recorder.note_stall`` (the episode is kept and saved red with
  ``source_stalled`` naming the stream); the recorder and the console keep running;
- ``restart_stopped()`` starts dead workers again (the recorder calls it before each START:
  reconnection happens between episodes);
- bad samples the worker reports (wrong length, wrong shape, malformed messages) reach
  ``Recorder.note_bad_sample`` and count as the quality issues of in-process pushes.

``check(timeout)`` is the pre-check of ``eva collect --check``: every stream must deliver a
sample within its ``open_timeout_s``; the result is one line per problem.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from eva.config import CollectionConfig, SourceConfig
from eva.source_kinds import source_kind

if TYPE_CHECKING:
    from eva.capture.shm_ring import ShmRing

log = logging.getLogger("eva.capture")

SHM_DIR = Path("/dev/shm")
MONITOR_S = 0.1
STOP_GRACE_S = 3.0


@dataclass
class _Group:
    source: SourceConfig
    streams: list[dict[str, Any]]  # name, kind, shape, ring (path), topic, endpoint
    process: subprocess.Popen[bytes] | None = None
    reader: threading.Thread | None = None
    exit_reported: bool = False
    last_error: str | None = None
    opened: bool = False
    restarts: int = 0
    stalled: bool = False  # a stream of it stalled during the last episode

    @property
    def names(self) -> list[str]:
        return [s["name"] for s in self.streams]

    def describe(self) -> str:
        endpoints = sorted({s["endpoint"] for s in self.streams if s.get("endpoint")})
        if len(endpoints) > 1:  # a subscriber process of several endpoints
            return f"{self.source.kind} {', '.join(endpoints)}"
        return self.source.describe()


def stream_sources(config: CollectionConfig) -> dict[str, SourceConfig]:
    """Every stream's source; a stream without one is recorded from the simulator."""
    sim = SourceConfig("sim")
    out: dict[str, SourceConfig] = {}
    for cam in config.cameras:
        out[cam.key] = cam.source or sim
    for vec in config.vectors:
        out[vec.name] = vec.source or sim
    return out


def has_sources(config: CollectionConfig) -> bool:
    """True when the config names at least one stream's source."""
    return any(c.source is not None for c in config.cameras) or any(
        v.source is not None for v in config.vectors
    )


def ring_slots(config: CollectionConfig, item_bytes: int, kind: str, n_cameras: int) -> int:
    """Slots of a stream's shared ring: ``backlog.ring_seconds`` (at least 4 s) of samples, within
    the camera share of ``backlog.max_memory_mb``; vectors get 60 s at 1 kHz at most."""
    seconds = max(config.backlog.ring_seconds, 4.0)
    if kind == "camera":
        share = config.backlog.max_memory_mb * 1e6 / max(n_cameras, 1)
        return max(8, min(int(config.fps * seconds), int(share // item_bytes)))
    return max(1024, int(1000 * seconds))


class SourceRig:
    """Source processes and their rings for ``config`` (see module doc)."""

    def __init__(
        self,
        config: CollectionConfig,
        *,
        shm_dir: Path = SHM_DIR,
        native: bool | None = None,
        python: str = sys.executable,
    ) -> None:
        from eva.capture.shm_ring import create_shm_ring

        self.config = config
        self.python = python
        self.prefix = f"eva-{os.getpid()}-{secrets.token_hex(4)}"
        self.rings: dict[str, ShmRing] = {}
        self._groups: dict[tuple[Any, ...], _Group] = {}
        self._recorder: Any = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._progress: dict[str, tuple[int, float]] = {}  # stream -> (pushed, monotonic when seen)
        self._stalled: set[str] = set()
        for path in remove_stale_rings(shm_dir):
            # housekeeping, not the operator's concern (and printed before any command output)
            log.info("removed the ring file of a recorder that is gone: %s", path)
        sources = stream_sources(config)
        self._sources = sources
        n_cameras = len(config.cameras)
        streams: list[tuple[str, str, tuple[int, ...], np.dtype]] = [
            (c.key, "camera", (c.height, c.width, 3), np.dtype(np.uint8)) for c in config.cameras
        ] + [(v.name, "vector", (v.dim,), np.dtype(np.float64)) for v in config.vectors]
        try:
            for i, (name, kind, shape, dtype) in enumerate(streams):
                source = sources[name]
                item = int(np.prod(shape)) * dtype.itemsize
                path = Path(shm_dir) / f"{self.prefix}-{i:02d}.ring"
                ring = create_shm_ring(
                    path, shape, dtype, ring_slots(config, item, kind, n_cameras), native=native
                )
                self.rings[name] = ring
                group = self._groups.setdefault(source.group_key(), _Group(source, []))
                group.streams.append(
                    {
                        "name": name,
                        "kind": kind,
                        "shape": list(shape),
                        "ring": str(path),
                        "topic": source.topic,  # a ZeroMQ stream's own (None for others)
                        "endpoint": source.endpoint,
                    }
                )
            for group in self._groups.values():
                check = source_kind(group.source.kind).group_problem
                problem = check(group.source, group.names) if check is not None else None
                if problem is not None:
                    raise ValueError(problem)
        except BaseException:
            self._release_rings()
            raise

    # ---- processes ---------------------------------------------------------------------

    @property
    def groups(self) -> list[_Group]:
        return list(self._groups.values())

    def describe(self) -> dict[str, str]:
        """stream name -> its source's one-line description (for screens)."""
        return {name: source.describe() for name, source in self._sources.items()}

    def start(self) -> SourceRig:
        for group in self._groups.values():
            self._spawn(group)
        threading.Thread(target=self._monitor, name="eva-rig-monitor", daemon=True).start()
        return self

    def _spawn(self, group: _Group) -> None:
        spec = {
            "source": asdict(group.source),
            "worker": source_kind(group.source.kind).worker,
            "fps": self.config.fps,
            "streams": group.streams,
            "parent": os.getpid(),  # the worker watches for its death
        }
        group.process = subprocess.Popen(
            [self.python, "-m", "eva.capture.source_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,  # Ctrl-C reaches the recorder, which stops the workers
        )
        assert group.process.stdin is not None
        group.process.stdin.write(json.dumps(spec).encode())
        group.process.stdin.close()
        group.exit_reported = False
        group.stalled = False
        group.opened = False
        group.last_error = None
        group.reader = threading.Thread(
            target=self._read_events, args=(group, group.process), daemon=True
        )
        group.reader.start()
        threading.Thread(target=self._read_stderr, args=(group, group.process), daemon=True).start()
        now = time.monotonic()
        for name in group.names:
            self._progress[name] = (self.rings[name].pushed, now)

    def _read_events(self, group: _Group, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        for raw in process.stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            kind = event.get("event")
            stream = event.get("stream")
            detail = str(event.get("detail", ""))
            if kind == "opened":
                group.opened = True
                log.info("source %s opened: %s", group.describe(), detail)
            elif kind == "error":
                group.last_error = detail
                log.warning("source %s failed: %s", group.describe(), detail)
            elif kind == "ended":
                group.last_error = detail
            elif kind == "warning":
                log.warning("source %s: %s", group.describe(), detail)
            elif kind == "bad_sample" and stream:
                count = int(event.get("count", 1))
                recorder = self._recorder
                if recorder is not None:
                    recorder.note_bad_sample(stream, detail, count)

    def _read_stderr(self, group: _Group, process: subprocess.Popen[bytes]) -> None:
        assert process.stderr is not None
        tail: list[str] = []
        for raw in process.stderr:
            tail = (tail + [raw.decode(errors="replace").rstrip()])[-20:]
        if tail and group.last_error is None and process.poll() not in (0, None):
            group.last_error = tail[-1]

    def alive(self, group: _Group) -> bool:
        return group.process is not None and group.process.poll() is None

    def restart_stopped(self) -> list[str]:
        """Start the workers that have exited again (between episodes); one line per restart."""
        lines = []
        with self._lock:
            for group in self._groups.values():
                if self._stop.is_set():
                    continue
                if self.alive(group) and not group.stalled:
                    continue
                if self.alive(group):  # hung: alive, but delivered nothing for its timeout
                    assert group.process is not None
                    group.process.kill()
                    group.process.wait()
                code = group.process.returncode if group.process is not None else None
                group.restarts += 1
                self._spawn(group)
                line = f"restarted source {group.describe()} (exit code {code})"
                log.warning(line)
                lines.append(line)
            self._stalled.clear()
        return lines

    # ---- supervision -------------------------------------------------------------------

    def attach(self, recorder: Any) -> None:
        """Report stalls and bad samples to ``recorder`` (its ``note_stall``/``note_bad_sample``)."""
        self._recorder = recorder

    def _monitor(self) -> None:
        while not self._stop.wait(MONITOR_S):
            recorder = self._recorder
            recording = bool(recorder is not None and recorder.recording)
            if not recording:
                self._stalled.clear()
            now = time.monotonic()
            for group in list(self._groups.values()):
                process = group.process
                dead = process is not None and process.poll() is not None
                if process is not None and dead and not group.exit_reported:
                    group.exit_reported = True
                    code = process.returncode
                    reason = group.last_error or (
                        f"killed by signal {-code}" if code < 0 else f"exit code {code}"
                    )
                    log.warning("source process of %s stopped: %s", group.describe(), reason)
                for name in group.names:
                    pushed = self.rings[name].pushed
                    last, since = self._progress.get(name, (pushed, now))
                    if pushed != last:
                        self._progress[name] = (pushed, now)
                        continue
                    silent = now - since
                    if not recording or name in self._stalled:
                        continue
                    if dead or silent >= group.source.stall_timeout_s:
                        self._stalled.add(name)
                        group.stalled = True
                        if dead:
                            code = process.returncode if process is not None else None
                            why = group.last_error or (
                                f"killed by signal {-code}"
                                if code and code < 0
                                else f"exit code {code}"
                            )
                            detail = f"source process ended ({why})"
                        else:
                            detail = f"no sample for {silent:.1f} s (stall timeout {group.source.stall_timeout_s:g} s)"
                        recorder.note_stall(name, f"{group.describe()}: {detail}")

    def check(self, timeout: float | None = None) -> list[str]:
        """Each stream must pass its kind's probe (``SourceKind.check``) and deliver a sample
        within its ``open_timeout_s`` (or ``timeout``); one line per stream that did not,
        naming it and its source."""
        start = time.monotonic()
        first = {name: ring.pushed for name, ring in self.rings.items()}
        pending = {
            name: (group, timeout if timeout is not None else group.source.open_timeout_s)
            for group in self._groups.values()
            for name in group.names
        }
        problems = []
        for group in self._groups.values():
            probe = source_kind(group.source.kind).check
            problem = probe(group.source) if probe is not None else None
            if problem is None:
                continue
            for name in group.names:
                problems.append(self._problem(name, problem))
                del pending[name]
        while pending:
            now = time.monotonic()
            for name, (group, limit) in list(pending.items()):
                ring = self.rings[name]
                if ring.pushed > first[name]:
                    del pending[name]
                    continue
                dead = not self.alive(group)
                if not dead and now - start < limit:
                    continue
                if dead:
                    why = group.last_error or "the source process ended"
                else:
                    why = f"no sample within {limit:g} s"
                problems.append(self._problem(name, why))
                del pending[name]
            time.sleep(0.02)
        return problems

    def _problem(self, name: str, why: str) -> str:
        """One line for stream ``name``, described by its own source (its topic: a process
        serving several topics is described by its first), never by a ring's internals (a
        worker that died writing to a ring closed under it: the process ended)."""
        if self.prefix in why:
            why = "the source process ended"
        return f"{self._what(name)} {name}: {self._sources[name].describe()}: {why}"

    def _what(self, name: str) -> str:
        return "camera" if self.rings[name].dtype == np.uint8 else "stream"

    # ---- shutdown ----------------------------------------------------------------------

    def close(self) -> None:
        self._stop.set()
        for ring in self.rings.values():
            with contextlib.suppress(Exception):
                ring.request_stop()
        for group in self._groups.values():
            process = group.process
            if process is None or process.poll() is not None:
                continue
            process.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for group in self._groups.values():
            process = group.process
            if process is None:
                continue
            try:
                process.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._release_rings()

    def _release_rings(self) -> None:
        for ring in self.rings.values():
            with contextlib.suppress(Exception):
                ring.unlink()
            with contextlib.suppress(Exception):
                ring.close()

    def __enter__(self) -> SourceRig:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def remove_stale_rings(shm_dir: Path = SHM_DIR) -> list[Path]:
    """Ring files of eva processes that are gone (a crashed recorder); removed, returned."""
    removed = []
    for path in Path(shm_dir).glob("eva-*-*.ring"):
        try:
            pid = int(path.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        try:
            os.kill(pid, 0)
            continue
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        with contextlib.suppress(OSError):
            path.unlink()
            removed.append(path)
    return removed
