"""The live recorder: START / push samples / STOP or CANCEL, into a raw v2.1 dataset.

Threads and data flow::

    rig threads --push_image/push_vector--> one SnapshotRing per stream (native, lock-free SPSC)
        --> consumer thread: pop, check, align onto the fps grid, EpisodeWriter.add_frames
        --> one encoder thread per camera (the EpisodeWriter's): encode the MP4, image stats
        --> at STOP: drain the episode's remaining samples, validate, commit (save job)

- ``push_*`` only checks the shape and copies the sample into the stream's ring (the native copy
  of a frame runs with the GIL released) and returns; it never waits for the disk or the encoder.
  A per-stream lock serialises producers of the same stream (the ring is single-producer) and
  makes START/STOP cut every stream at an exact sample; it is held only for the copy.
- One consumer thread handles episodes in START order. While an episode records it aligns rows
  as soon as every live stream has samples past the grid instant and hands them to the
  episode's writer in small batches; each camera's encoder thread encodes them while the
  consumer goes on (``add_frames`` waits only when a camera has its few batch buffers in
  flight), so memory stays bounded by the rings and a few frames per camera, whatever the length.
- STOP cuts every stream (the sample counts at STOP belong to the episode) and returns a
  :class:`SaveJob` at once; the consumer finishes the episode (drain, validate, commit) and then
  goes on with the next one, whose samples wait in the rings meanwhile.
- CANCEL cuts the streams the same way; the consumer discards those samples and the episode's
  temporary files. Neither STOP nor CANCEL creates accepted/rejected directories.
- Backlog: each stream's lag (newest pushed time - oldest unread time) is checked by the consumer;
  a warning is logged each time it rises past a ``backlog.warn_seconds`` threshold. Rings grow up
  to the hard memory limit; samples refused past it are counted and make the episode red
  (``capture_backlog_overflow``). Nothing is dropped silently.

Work in progress lives in ``<raw>/.eva-work/`` (the dataset writer's episode directories). A
crash leaves it behind; the next ``start`` into that dataset reports (``logging`` warning and
``Recorder.recovered``) and removes it, and the raw dataset stays valid.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eva.capture import align
from eva.capture.preview import PreviewTap
from eva.capture.quality_checks import (
    CAPTURE_BACKLOG_OVERFLOW,
    EPISODE_TOO_SHORT,
    FRAME_COUNT_MISMATCH,
    IMAGE_SKEW_EXCEEDED,
    INVALID_IMAGE_SHAPE,
    INVALID_VECTOR_DIM,
    MISSING_CAMERA,
    MISSING_CAMERA_STREAM,
    MISSING_CONFIGURED_COLUMN,
    SOURCE_CLOCK_DISCONTINUITY,
    SOURCE_STALLED,
    UNEXPECTED_IMAGE_STREAM,
    UNEXPECTED_VECTOR_STREAM,
    IssueLog,
    StreamCheck,
)
from eva.capture.ring import Ring, make_ring
from eva.capture.save_worker import (
    FAILED,
    QUEUED,
    SAVED,
    SAVING,
    SaveJob,
    commit_episode,
    leftover_work,
    remove_stale_markers,
    utc_now,
)
from eva.config import CollectionConfig
from eva.dataset.errors import DatasetError, error_line
from eva.dataset.video import VideoOptions
from eva.dataset.writer import CameraSpec, DatasetWriter, EpisodeWriter, VectorSpec

log = logging.getLogger("eva.capture")

EMIT_BATCH = 8  # grid rows per add_frames call (frames per camera encoded together)
IDLE_SLEEP_S = 0.002
# After STOP every sample of the episode is already in its ring, so draining only waits for the
# consumer itself; this long without popping or emitting anything means it cannot progress.
DRAIN_STALL_S = 3.0
VECTOR_PENDING = 4096


def pin_mmap_threshold(nbytes: int = 128 * 1024) -> bool:
    """Make glibc serve blocks of ``nbytes`` and more with mmap (returned to the OS on free).

    Why: during capture, frame-sized buffers (PyAV frames, packets, numpy temporaries) are freed
    and re-allocated by several threads; with glibc's dynamic threshold (or the
    ``MALLOC_MMAP_THRESHOLD_=32 MiB`` the Makefile exports for batch tools) they come from the
    heap arenas, which fragment, and RSS crept up about 1 MB per recorded second (while the
    encoder still allocated an rgb frame per frame; the creep is small since). Pinned, RSS stays
    flat for any episode length at some CPU cost for page faults (``bench/bench_capture.py``
    measures both). Process-wide, so only entry points call it (``eva collect``). Returns False
    where ``mallopt`` is unavailable (non-glibc).
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_mmap_threshold = -3
    return bool(mallopt(ctypes.c_int(m_mmap_threshold), ctypes.c_int(nbytes)))


def shorten_switch_interval(seconds: float | None = None) -> float:
    """Let the recorder's consumer and encoder threads take the GIL sooner (entry points call it).

    Why: with busy Python threads beside capture (the console's HTTP server, a driver loop),
    CPython hands the GIL over every 5 ms, and the consumer waiting for it fell behind:
    ``bench/bench_rig.py`` measured a real-time factor of 0.51 and overflowing rings with two busy
    threads at 5 ms, 0.98 and no drops at 0.5 ms. ``EVA_SWITCH_INTERVAL`` (seconds; ``0`` keeps
    CPython's default) overrides the default of 0.5 ms. Returns the interval in force.
    """
    import os
    import sys

    if seconds is None:
        seconds = float(os.environ.get("EVA_SWITCH_INTERVAL", "0.0005"))
    if seconds > 0:
        sys.setswitchinterval(seconds)
    return sys.getswitchinterval()


class RecorderError(RuntimeError):
    """A lifecycle call that does not fit the recorder's state (e.g. STOP while idle)."""


@dataclass
class _Stream:
    """A configured stream: its ring and the producer-side gate."""

    name: str
    kind: str  # "camera" | "vector"
    shape: tuple[int, ...]
    ring: Ring
    discrete: tuple[int, ...] = ()
    lock: threading.Lock = field(default_factory=threading.Lock)
    open: bool = False  # accepting samples (an episode is recording)
    last_pushed_t: float = math.nan
    bad_shape: int = 0
    bad_shape_detail: str = ""
    external: bool = False  # fed by a source process through a shared-memory ring


@dataclass
class _Session:
    """One START..STOP/CANCEL episode as the consumer sees it."""

    dataset_dir: Path
    task: str
    writer: DatasetWriter
    started_at: str
    started_mono: float
    base: dict[str, int]  # ring.pushed at START, per stream
    overflow_base: dict[str, int]
    overflow_end: dict[str, int] = field(default_factory=dict)  # overflow_count at STOP/CANCEL
    limit: dict[str, int] | None = None  # ring.pushed at STOP/CANCEL
    cancelled: bool = False
    job: SaveJob | None = None
    ended_at: str | None = None
    ended_mono: float | None = None
    unexpected: dict[str, int] = field(default_factory=dict)
    bad_shapes: dict[str, tuple[int, str]] = field(default_factory=dict)
    stalls: dict[str, str] = field(default_factory=dict)  # stream -> what the supervisor saw


class _Pending:
    """Samples of one stream popped from its ring and still needed for alignment."""

    def __init__(self, stream: _Stream, capacity: int) -> None:
        dtype = np.uint8 if stream.kind == "camera" else np.float64
        self.stream = stream
        # Filled, not np.zeros: calloc'd pages would be touched (and counted in RSS) only as the
        # buffer is first used deeper, page faults in the middle of an episode.
        self.values = np.empty((capacity, *stream.shape), dtype=dtype)
        self.values.fill(0)
        self.times = np.zeros(capacity, dtype=np.float64)
        self.n = 0
        self.capacity = capacity

    def drop_front(self, k: int) -> None:
        if k <= 0:
            return
        keep = max(self.n - k, 0)
        # Move the kept samples to the front in steps of k: a step's source and destination never
        # overlap, so numpy copies directly and allocates nothing (an overlapping assignment goes
        # through a temporary, frame-sized for cameras), and a vector backlog of thousands of
        # samples moves in a few slices rather than one Python step per sample.
        for start in range(0, keep, k):
            stop = min(start + k, keep)
            self.values[start:stop] = self.values[start + k : stop + k]
            self.times[start:stop] = self.times[start + k : stop + k]
        self.n = keep


class Recorder:
    """Record episodes from a live rig into ``<log_dir>/<dataset>/raw`` (see module doc).

    ``dataset`` is the default dataset name for ``start`` (default: the first of
    ``config.tasks``). ``durable=False`` skips fsyncs (tests, benchmarks).
    ``consumer_throttle_s`` makes the consumer sleep that long per loop: it exists to exercise the
    backlog path (tests, benchmarks of a slow host), leave it at 0 otherwise.
    """

    def __init__(
        self,
        config: CollectionConfig,
        dataset: str | None = None,
        *,
        durable: bool = True,
        consumer_throttle_s: float = 0.0,
        native: bool | None = None,
        rings: dict[str, Ring] | None = None,
    ) -> None:
        self.config = config
        self.external_rings = dict(rings or {})
        self.default_dataset = dataset if dataset is not None else next(iter(config.tasks))
        self.durable = durable
        self.consumer_throttle_s = consumer_throttle_s
        self.native = native
        self.fps = config.fps
        self.tolerance = config.skew_tolerance
        self.recovered: list[str] = []
        self.jobs: list[SaveJob] = []
        self._streams: dict[str, _Stream] = {}
        self._build_rings()
        self._cameras = {c.key: self._streams[c.key] for c in config.cameras}
        self._vectors = {v.name: self._streams[v.name] for v in config.vectors}
        self._unexpected: dict[str, int] = {}
        self._unexpected_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._current: _Session | None = None
        self._sessions: deque[_Session] = deque()
        self._writers: dict[Path, DatasetWriter] = {}
        self._wake = threading.Event()
        self._closing = False
        self._active: _Session | None = None
        self._active_rows = 0
        self._fps_marks: dict[str, tuple[float, int]] = {}
        self._consumer_error: str | None = None
        self.preview: PreviewTap | None = None
        self._idle_buffers: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._consumer = threading.Thread(target=self._consume, name="eva-capture", daemon=True)
        self._consumer.start()

    def enable_preview(self, *, max_fps: float = 5.0, max_width: int = 320) -> PreviewTap:
        """Keep downscaled latest frames for an operator screen (``capture/preview.py``); they
        are taken only while a viewer calls ``preview.want()``, recording or not."""
        if self.preview is None:
            self.preview = PreviewTap(
                {c.key: (c.height, c.width) for c in self.config.cameras},
                max_fps=max_fps,
                max_width=max_width,
                native=self.native,
            )
        return self.preview

    # ---- setup ---------------------------------------------------------------------------

    def _build_rings(self) -> None:
        cfg = self.config
        n_cam = max(len(cfg.cameras), 1)
        cam_limit = int(cfg.backlog.max_memory_mb * 1e6 / n_cam)
        ring_s = cfg.backlog.ring_seconds
        for cam in cfg.cameras:
            shape = (cam.height, cam.width, 3)
            if cam.key in self.external_rings:
                ring = self._external(cam.key, shape, np.uint8)
                self._streams[cam.key] = _Stream(cam.key, "camera", shape, ring, external=True)
                continue
            item = cam.height * cam.width * 3
            block = max(2, min(16, int(cfg.fps * ring_s / 2) or 2))
            blocks = max(1, math.ceil(cfg.fps * ring_s / block))
            ring = make_ring(
                shape, np.uint8, block_slots=block, initial_blocks=blocks,
                max_bytes=max(cam_limit, item * block * blocks), native=self.native,
            )  # fmt: skip
            self._streams[cam.key] = _Stream(cam.key, "camera", shape, ring)
        for vec in cfg.vectors:
            if vec.name in self.external_rings:
                ring = self._external(vec.name, (vec.dim,), np.float64)
                self._streams[vec.name] = _Stream(
                    vec.name, "vector", (vec.dim,), ring, vec.discrete, external=True
                )
                continue
            # Vectors are tiny: 60 s at 1 kHz of storage as their hard limit.
            ring = make_ring(
                (vec.dim,), np.float64, block_slots=1024, initial_blocks=1,
                max_bytes=60_000 * vec.dim * 8, native=self.native,
            )  # fmt: skip
            self._streams[vec.name] = _Stream(vec.name, "vector", (vec.dim,), ring, vec.discrete)

    def _external(self, name: str, shape: tuple[int, ...], dtype: type) -> Ring:
        ring = self.external_rings[name]
        if tuple(ring.shape) != shape or np.dtype(ring.dtype) != np.dtype(dtype):
            raise ValueError(
                f"stream {name}: its ring holds {ring.shape} {np.dtype(ring.dtype)}, the config "
                f"says {shape} {np.dtype(dtype)}"
            )
        return ring

    # ---- reports from source processes (capture/rig.py) -------------------------------------

    def note_stall(self, stream: str, detail: str) -> None:
        """A source stopped delivering ``stream`` (died, hung): the recording episode is kept and
        flagged ``source_stalled`` with ``detail``; a warning is logged."""
        with self._state_lock:
            session = self._current
            if session is not None and stream not in session.stalls:
                session.stalls[stream] = detail
        log.warning("capture: stream %s stalled: %s", stream, detail)

    def note_bad_sample(self, stream: str, detail: str, count: int = 1) -> None:
        """A source process refused ``count`` samples of ``stream`` (wrong length or shape,
        malformed): counted like a refused push while an episode records."""
        st = self._streams.get(stream)
        if st is None:
            return
        with st.lock:
            if not self._current or not st.open:
                return
            st.bad_shape += count
            if not st.bad_shape_detail:
                st.bad_shape_detail = detail

    # ---- push (any thread, hot path) -----------------------------------------------------

    def push_image(self, camera: str, t: float, frame: np.ndarray) -> bool:
        """Copy one camera image (H, W, 3) uint8 with its capture time; True when stored.

        False while no episode records (the sample is not wanted), for a refused sample (wrong
        shape, unknown camera: both counted as quality issues) and past the backlog hard limit
        (counted as ``capture_backlog_overflow``).
        """
        stream = self._cameras.get(camera)
        if stream is None:
            if self._current is not None:
                with self._unexpected_lock:
                    self._unexpected[camera] = self._unexpected.get(camera, 0) + 1
            return False
        if stream.external:  # its source process feeds the ring
            return False
        tap = self.preview
        with stream.lock:
            if (
                getattr(frame, "shape", None) != stream.shape
                or getattr(frame, "dtype", None) != np.uint8
            ):
                if stream.open:
                    self._note_bad_shape(stream, frame, "(H, W, 3) uint8")
                return False
            if not stream.open:
                if tap is not None:
                    tap.offer(camera, t, frame)
                return False
            ok = stream.ring.push(t, frame)
            stream.last_pushed_t = t
        if tap is not None:  # outside the lock: the caller's frame stays valid until we return
            tap.offer(camera, t, frame)
        return ok

    def push_vector(self, stream_name: str, t: float, values: Any) -> bool:
        """Copy one vector sample (dim,) with its capture time; True when stored (see push_image)."""
        stream = self._vectors.get(stream_name)
        if stream is None:
            if self._current is not None:
                with self._unexpected_lock:
                    key = "vector:" + stream_name
                    self._unexpected[key] = self._unexpected.get(key, 0) + 1
            return False
        if stream.external:
            return False
        with stream.lock:
            if not stream.open:
                return False
            arr = values if type(values) is np.ndarray else np.asarray(values, dtype=np.float64)
            if arr.shape != stream.shape:
                self._note_bad_shape(stream, arr, f"({stream.shape[0]},)")
                return False
            ok = stream.ring.push(t, arr)
            stream.last_pushed_t = t
        return ok

    def _note_bad_shape(self, stream: _Stream, sample: Any, expected: str) -> None:
        stream.bad_shape += 1
        if stream.bad_shape == 1:
            shape = getattr(sample, "shape", None)
            dtype = getattr(sample, "dtype", type(sample).__name__)
            stream.bad_shape_detail = f"got {dtype}{shape}, expected {expected} {stream.shape}"

    # ---- lifecycle -----------------------------------------------------------------------

    @property
    def recording(self) -> bool:
        return self._current is not None

    def dataset_dir(self, dataset: str | None = None) -> Path:
        return self.config.dataset_dir(dataset if dataset is not None else self.default_dataset)

    def start(self, dataset: str | None = None, task: str | None = None) -> Path:
        """Begin an episode of ``task`` in ``dataset``; returns the raw dataset directory."""
        with self._state_lock:
            if self._current is not None:
                raise RecorderError("an episode is already recording: STOP or CANCEL it first")
            if self._consumer_error:
                raise RecorderError(f"capture consumer failed: {self._consumer_error}")
            name = dataset if dataset is not None else self.default_dataset
            root = self.config.dataset_dir(name)
            if task is None:
                prompts = self.config.tasks.get(name)
                if not prompts:
                    raise RecorderError(f"dataset {name!r} has no task in the config: pass a task")
                task = prompts[0]
            if not task.strip():
                raise RecorderError("task prompt must not be empty")
            writer = self._writer_for(root)
            session = _Session(
                dataset_dir=root,
                task=task.strip(),
                writer=writer,
                started_at=utc_now(),
                started_mono=time.monotonic(),
                base={},
                overflow_base={},
            )
            with self._unexpected_lock:
                self._unexpected.clear()
            for stream in self._streams.values():
                with stream.lock:
                    session.base[stream.name] = stream.ring.pushed
                    session.overflow_base[stream.name] = stream.ring.overflow_count
                    stream.bad_shape = 0
                    stream.bad_shape_detail = ""
                    stream.open = True
            self._current = session
            self._sessions.append(session)
        self._wake.set()
        return root

    def stop(self) -> SaveJob:
        """End the episode; returns its save job (validation and commit run in the background)."""
        session = self._end(cancelled=False)
        assert session.job is not None
        return session.job

    def cancel(self) -> None:
        """Drop the episode: its samples and temporary files are discarded; no index is used."""
        self._end(cancelled=True)

    def _end(self, cancelled: bool) -> _Session:
        with self._state_lock:
            session = self._current
            if session is None:
                raise RecorderError("no episode is recording")
            limit: dict[str, int] = {}
            for stream in self._streams.values():
                with stream.lock:
                    stream.open = False
                    limit[stream.name] = stream.ring.pushed
                    # refusals after STOP belong to no episode (source processes push on)
                    session.overflow_end[stream.name] = stream.ring.overflow_count
                    if stream.bad_shape:
                        session.bad_shapes[stream.name] = (
                            stream.bad_shape,
                            stream.bad_shape_detail,
                        )
            with self._unexpected_lock:
                session.unexpected = dict(self._unexpected)
                self._unexpected.clear()
            session.ended_at = utc_now()
            session.ended_mono = time.monotonic()
            session.cancelled = cancelled
            if not cancelled:
                session.job = SaveJob(session.dataset_dir, session.task)
                self.jobs.append(session.job)
                if self._consumer_error is not None:  # nobody will ever process this job
                    session.job._finish(FAILED, f"capture consumer failed: {self._consumer_error}")
            session.limit = limit  # last: the consumer treats a set limit as "episode ended"
            self._current = None
        self._wake.set()
        return session

    def _writer_for(self, root: Path) -> DatasetWriter:
        writer = self._writers.get(root)
        if writer is not None:
            return writer
        # Listed before the writer opens (it removes them), reported only once it holds the
        # dataset: the work dirs of another live writer are not leftovers.
        leftovers = leftover_work(root)
        cfg = self.config
        try:
            writer = DatasetWriter.create_or_open(
                root,
                fps=cfg.fps,
                cameras=[CameraSpec(c.key, c.height, c.width) for c in cfg.cameras],
                vectors=[VectorSpec(v.name, v.dim, v.names) for v in cfg.vectors],
                robot_type=cfg.robot_type,
                video=VideoOptions(
                    codec=cfg.encoder.codec,
                    crf=cfg.encoder.crf,
                    preset=cfg.encoder.preset,
                    gop=cfg.encoder.gop,
                ),
                durable=self.durable,
            )
        except (DatasetError, ValueError) as e:
            raise RecorderError(str(e)) from None
        for path in leftovers:
            msg = f"{root}: removed leftovers of an interrupted capture session: {path.name}"
            log.warning(msg)
            self.recovered.append(msg)
        for path in remove_stale_markers(root):
            msg = f"{root}: removed stale saving marker {path.name}"
            log.warning(msg)
            self.recovered.append(msg)
        self._writers[root] = writer
        return writer

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every STOPped/CANCELled episode has been processed; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._state_lock:
                busy = any(s is not self._current for s in self._sessions)
            if not busy:
                return True
            if self._consumer_error or not self._consumer.is_alive():
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

    def close(self, timeout: float | None = None) -> None:
        """CANCEL a recording episode, finish queued saves, stop the consumer, close writers."""
        if self._current is not None:
            with contextlib.suppress(RecorderError):  # another thread STOPped it meanwhile
                self.cancel()
        self.wait_idle(timeout)
        self._closing = True
        self._wake.set()
        self._consumer.join(timeout)
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    # ---- status --------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """A snapshot for status lines: frames, backlog, dropped (refused) samples, saves, fps."""
        now = time.monotonic()
        camera_fps: dict[str, float] = {}
        for key, stream in self._cameras.items():
            pushed = stream.ring.pushed
            mark = self._fps_marks.get(key)
            if mark is not None and now > mark[0]:
                camera_fps[key] = (pushed - mark[1]) / (now - mark[0])
            else:
                camera_fps[key] = 0.0
            self._fps_marks[key] = (now, pushed)
        session = self._current
        return {
            "recording": session is not None,
            "dataset": str(session.dataset_dir) if session else None,
            "task": session.task if session else None,
            "elapsed_s": (now - session.started_mono) if session else 0.0,
            "frames": self._active_rows if (session is not None and self._active is session) else 0,
            # samples received per stream since START (the live counts an operator watches)
            "samples": {
                name: (st.ring.pushed - session.base.get(name, st.ring.pushed)) if session else 0
                for name, st in self._streams.items()
            },
            "backlog": {name: len(s.ring) for name, s in self._streams.items()},
            "backlog_mb": sum(len(s.ring) * s.ring.item_bytes for s in self._streams.values())
            / 1e6,
            "dropped": sum(s.ring.overflow_count for s in self._streams.values()),
            "save_queue": sum(1 for j in self.jobs if j.state in (QUEUED, SAVING)),
            "saved": sum(1 for j in self.jobs if j.state == SAVED),
            "failed": sum(1 for j in self.jobs if j.state == FAILED),
            "camera_fps": camera_fps,
            "consumer_error": self._consumer_error,
        }

    # ---- consumer ------------------------------------------------------------------------

    def _discard_idle(self) -> None:
        """Source processes push all the time; while no episode is queued their samples are
        freed. Under the state lock, so that a START (which reads ``pushed`` as the episode's
        first sample under the same lock) never loses a sample of its episode."""
        tap = self.preview
        with self._state_lock:
            if self._sessions:
                return
            for stream in self._streams.values():
                if not stream.external:
                    continue
                end = stream.ring.pushed
                if stream.kind == "camera" and tap is not None and tap.due(stream.name):
                    # keep the newest frame for the preview: pop it instead of freeing it
                    _discard_before(stream, end - 1)
                    buf, times = self._idle_frame(stream)
                    if stream.ring.pop_batch(buf, times, 1):
                        tap.offer(stream.name, float(times[0]), buf[0])
                _discard_before(stream, end)

    def _idle_frame(self, stream: _Stream) -> tuple[np.ndarray, np.ndarray]:
        """One frame buffer per external camera, for the idle preview (allocated once)."""
        buffers = self._idle_buffers.get(stream.name)
        if buffers is None:
            buffers = (np.zeros((1, *stream.shape), np.uint8), np.zeros(1))
            self._idle_buffers[stream.name] = buffers
        return buffers

    def _consume(self) -> None:
        try:
            while True:
                with self._state_lock:
                    session = self._sessions[0] if self._sessions else None
                if session is None:
                    if self._closing:
                        return
                    self._discard_idle()
                    self._wake.wait(0.02 if self.external_rings else 0.1)
                    self._wake.clear()
                    continue
                _EpisodeConsumer(self, session).run()
                with self._state_lock:
                    self._sessions.popleft()
        except BaseException as e:  # keep the reason visible to status() and start()
            self._consumer_error = _crash_line(e)
            log.exception("capture consumer stopped")
            with self._state_lock:
                for s in self._sessions:
                    if s.job is not None and not s.job.finished:
                        s.job._finish(FAILED, self._consumer_error)


def _crash_line(error: BaseException) -> str:
    """``Type: message (at file:line in function)``: a bug's one line must say where it was
    raised (an ``AssertionError`` alone says nothing)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return error_line(error)
    code = tb.tb_frame.f_code
    return (
        f"{error_line(error)} (at {Path(code.co_filename).name}:{tb.tb_lineno} in {code.co_name})"
    )


def _discard_before(stream: _Stream, base: int) -> int:
    """Free the samples of an external ring pushed before ``base`` (they belong to no episode)."""
    excess = base - stream.ring.popped
    return stream.ring.discard(excess) if excess > 0 else 0


class _EpisodeConsumer:
    """Pops, checks, aligns and encodes one episode's samples, then saves or discards it."""

    def __init__(self, recorder: Recorder, session: _Session) -> None:
        self.rec = recorder
        self.s = session
        self.fps = recorder.fps
        self.tol = recorder.tolerance
        cfg = recorder.config
        self.streams = recorder._streams
        self.cameras = [recorder._cameras[c.key] for c in cfg.cameras]
        self.vectors = [recorder._vectors[v.name] for v in cfg.vectors]
        cam_cap = max(4, int(math.ceil(self.fps * 0.5)))
        self.pending: dict[str, _Pending] = {}
        for st in self.cameras:
            self.pending[st.name] = _Pending(st, cam_cap)
        for st in self.vectors:
            self.pending[st.name] = _Pending(st, VECTOR_PENDING)
        self.popped = {name: 0 for name in self.streams}  # samples popped in this episode
        self.issues = IssueLog()
        self.checks = {
            st.name: StreamCheck(
                st.name,
                st.kind,
                cfg.clock_jump_s,
                cfg.frozen_camera_s if st.kind == "camera" else 0.0,
            )
            for st in self.streams.values()
        }
        self.first_t: dict[str, float] = {}
        self.last_t: dict[str, float] = {}
        self.grid_start: float | None = None
        self.next_row = 0
        self.late_rows: dict[str, int] = {}  # rows emitted before a late stream appeared
        self.skew_count = {st.name: 0 for st in self.cameras}
        self.skew_first: dict[str, int] = {}
        self.skew_max = {st.name: 0.0 for st in self.cameras}
        self.skew_sum = {st.name: 0.0 for st in self.cameras}
        self.warn_level = {name: 0 for name in self.streams}
        self.high_water = {name: 0 for name in self.streams}
        self.episode: EpisodeWriter | None = None
        self.frame_buf = {
            st.name: np.empty((EMIT_BATCH, *st.shape), np.uint8) for st in self.cameras
        }
        for buf in self.frame_buf.values():
            buf.fill(0)  # touch the pages now (see _Pending)

    # -- helpers --

    def frame_at(self, t: float) -> str:
        if self.grid_start is None or not math.isfinite(t):
            return ""
        return f" (near frame {max(0, round((t - self.grid_start) * self.fps))})"

    def ended(self) -> bool:
        return self.s.limit is not None

    def remaining(self, name: str) -> int | None:
        """Samples of this episode still in the ring (None while the episode records)."""
        limit = self.s.limit
        if limit is None:
            return None
        return limit[name] - self.s.base[name] - self.popped[name]

    # -- main loop --

    def run(self) -> None:
        s = self.s
        self.rec._active = s
        self.rec._active_rows = 0
        for st in self.streams.values():
            if st.external:  # samples between the previous episode's end and this START
                _discard_before(st, s.base[st.name])
            st.ring.reset_high_water()
        try:
            self.episode = s.writer.begin_episode(s.task)  # START refuses an empty task
            progressed = time.monotonic()
            while True:
                if self.rec.consumer_throttle_s:
                    time.sleep(self.rec.consumer_throttle_s)
                # Read once per pass: STOP/CANCEL sets the limit last, so a pass that saw no
                # limit must not act on one that appears half-way (a CANCEL would then look
                # like a STOP without its save job).
                ended = s.limit is not None
                if ended and s.cancelled:
                    self.discard()
                    return
                moved = self.pop_all()
                self.watch_backlog()
                self.settle_grid_start()
                emitted = self.emit_ready(final=False)
                if ended and all(self.remaining(n) <= 0 for n in self.streams):
                    self.finish()
                    return
                if moved or emitted:
                    progressed = time.monotonic()
                elif ended and time.monotonic() - progressed > DRAIN_STALL_S:
                    # a safety net: an episode after STOP must end, never hang close()
                    log.warning(
                        "capture: the episode's drain made no progress for %.0f s after STOP; "
                        "saving what was aligned",
                        DRAIN_STALL_S,
                    )
                    for name in self.streams:
                        left = self.remaining(name)
                        if left is not None and left > 0:
                            self.popped[name] += left
                    self.finish()
                    return
                if not moved and not emitted:
                    if ended and self.past_the_end():
                        # No further row can be aligned: the rest lies beyond the episode's end.
                        if self.drain_discard():
                            continue
                        # Nothing left to free, yet a stream still owes samples: every sample
                        # up to the STOP snapshot was pushed before it, so one that is not in
                        # the ring now never will be. Account for it rather than spin forever.
                        self.settle_missing()
                    time.sleep(IDLE_SLEEP_S)
        except BaseException as e:
            message = error_line(e)
            if self.episode is not None:
                self.episode.abort()
            if s.job is not None and not s.job.finished:
                s.job._finish(FAILED, message)
            if isinstance(e, DatasetError | OSError | ValueError):
                log.error("capture: episode failed: %s", message)
                # Drop what is left of this episode so the next one starts clean; the job that
                # STOP creates meanwhile reports the failure.
                self.wait_end_and_discard()
                if s.job is not None and not s.job.finished:
                    s.job._finish(FAILED, message)
                return
            raise
        finally:
            self.rec._active = None

    def past_the_end(self) -> bool:
        """After STOP: a fully drained stream ends before the next grid row (grid end reached)."""
        if self.grid_start is None:
            return False
        drained = [n for n in self.last_t if (self.remaining(n) or 0) <= 0]
        if not drained:
            return False
        g_next = self.grid_start + self.next_row / self.fps
        return min(self.last_t[n] for n in drained) < g_next

    def wait_end_and_discard(self) -> None:
        while self.s.limit is None:
            self.drain_discard()
            time.sleep(0.01)
        self.drain_discard()

    def drain_discard(self) -> int:
        """Free what is left of the episode in every ring; the number of samples freed."""
        freed = 0
        for name, st in self.streams.items():
            left = self.remaining(name)
            if left is not None and left <= 0:
                continue
            n = st.ring.discard(-1 if left is None else left)
            self.popped[name] += n
            freed += n
        return freed

    def settle_missing(self) -> None:
        """After STOP: samples the STOP snapshot counts that no ring holds any more are gone
        (logged, then treated as consumed), so the episode can end."""
        for name, st in self.streams.items():
            left = self.remaining(name)
            if left is not None and left > 0 and len(st.ring) == 0:
                log.warning(
                    "capture: stream %s: %d sample(s) of the episode were not in its ring at the "
                    "end; the episode ends without them",
                    name,
                    left,
                )
                self.popped[name] += left

    def discard(self) -> None:
        """CANCEL: free the episode's samples and its temporary files."""
        self.drain_discard()
        if self.episode is not None:
            self.episode.abort()

    # -- popping and checks --

    def pop_all(self) -> bool:
        moved = False
        for name, st in self.streams.items():
            p = self.pending[name]
            left = self.remaining(name)
            room = p.capacity - p.n
            want = room if left is None else min(room, left)
            if want <= 0:
                continue
            n0 = p.n
            k = st.ring.pop_batch(p.values[n0:], p.times[n0:], want)
            if k == 0:
                continue
            tap = self.rec.preview
            if st.external and st.kind == "camera" and tap is not None:
                # a source process's frames reach the preview here, from the ring (no push_image)
                tap.offer(name, float(p.times[n0 + k - 1]), p.values[n0 + k - 1])
            moved = True
            self.popped[name] += k
            times = p.times[n0 : n0 + k]
            values = p.values[n0 : n0 + k]
            ok = self.checks[name].filter(times, values, self.issues, self.frame_at)
            if not ok.all():
                keep = np.flatnonzero(ok)
                p.times[n0 : n0 + keep.size] = times[keep]
                p.values[n0 : n0 + keep.size] = values[keep]
                k = int(keep.size)
            p.n = n0 + k
            if k:
                if name not in self.first_t:
                    self.first_t[name] = float(p.times[n0])
                    if self.grid_start is not None and self.next_row > 0:
                        self.late_rows[name] = self.next_row
                self.last_t[name] = float(p.times[p.n - 1])
            if self.grid_start is None:
                self.prune_before_start()
        return moved

    def prune_before_start(self) -> None:
        """Before the grid is fixed, drop samples no grid instant can use (start only rises)."""
        if not self.first_t:
            return
        lower = max(self.first_t.values())
        for p in self.pending.values():
            if p.n > 1:
                j = int(np.searchsorted(p.times[: p.n], lower, side="right")) - 1
                p.drop_front(j)

    def watch_backlog(self) -> None:
        thresholds = self.rec.config.backlog.warn_seconds
        for name, st in self.streams.items():
            backlog = len(st.ring)
            self.high_water[name] = max(self.high_water[name], backlog)
            if not thresholds:
                continue
            oldest = st.ring.peek_time() if backlog else None
            # a source process stamps its samples on the rig's wall clock, and nothing here sees
            # its pushes: its lag is the age of the oldest unread sample
            newest = time.time() if st.external else st.last_pushed_t
            lag = (newest - oldest) if oldest is not None else 0.0
            if not math.isfinite(lag):
                lag = 0.0
            level = self.warn_level[name]
            if level < len(thresholds) and lag >= thresholds[level]:
                while level < len(thresholds) and lag >= thresholds[level]:
                    level += 1
                log.warning(
                    "capture backlog: stream %s has %d samples waiting (%.1f MB), %.2f s behind%s",
                    name,
                    backlog,
                    backlog * st.ring.item_bytes / 1e6,
                    lag,
                    self.waiting_for(name),
                )
                self.warn_level[name] = level
            elif level and lag < thresholds[0] / 2:
                log.info("capture backlog: stream %s caught up", name)
                self.warn_level[name] = 0

    def waiting_for(self, name: str) -> str:
        """Names the stream that holds alignment back, when it is not ``name`` itself."""
        if self.grid_start is None:
            missing = sorted(set(self.streams) - set(self.first_t))
            return f" (grid start waits for {', '.join(missing)})" if missing else ""
        # A stream with nothing waiting in its ring and the oldest last sample is the one behind.
        idle = {n: t for n, t in self.last_t.items() if len(self.streams[n].ring) == 0}
        if not idle:
            return ""
        slowest = min(idle, key=idle.__getitem__)
        if slowest == name:
            return ""
        return f" (alignment waits for {slowest}: last sample t={self.last_t[slowest]:.3f} s)"

    # -- grid --

    def settle_grid_start(self) -> None:
        if self.grid_start is not None or not self.first_t:
            return
        present = set(self.first_t)
        everything = set(self.streams)
        if present >= everything:
            self.grid_start = max(self.first_t.values())
            return
        latest = max(self.last_t.values())
        drained = self.ended() and all((self.remaining(n) or 0) <= 0 for n in self.streams)
        # A full pending buffer cannot wait for the missing streams any longer either.
        stuck = any(p.n >= p.capacity for p in self.pending.values())
        timed_out = latest - min(self.first_t.values()) >= self.rec.config.stream_start_timeout_s
        if drained or stuck or timed_out:
            self.grid_start = max(self.first_t.values())

    def ready_rows(self, final: bool) -> int:
        """How many grid rows from next_row can be aligned now."""
        assert self.grid_start is not None
        if final:
            end = min(self.last_t.values())
            return max(align.grid_length(self.grid_start, end, self.fps) - self.next_row, 0)
        counts = []
        for name, p in self.pending.items():
            if name not in self.first_t:
                continue
            if p.n == 0:
                return 0
            last = p.times[p.n - 1]
            # A camera row is settled once a sample lies after it; a vector row once one lies at
            # or after it (then interpolation and hold are final).
            span = (last - self.grid_start) * self.fps
            strict = p.stream.kind == "camera"
            k = math.ceil(span) if strict else math.floor(span) + 1
            counts.append(k - self.next_row)
        return max(min(counts), 0) if counts else 0

    def emit_ready(self, final: bool) -> bool:
        if self.grid_start is None:
            return False
        n = self.ready_rows(final)
        emitted = False
        while n > 0:
            m = min(n, EMIT_BATCH)
            self.emit(m)
            n -= m
            emitted = True
        return emitted

    def emit(self, m: int) -> None:
        assert self.grid_start is not None and self.episode is not None
        k0 = self.next_row
        grid = align.grid_times(self.grid_start, self.fps, k0, m)
        images: dict[str, np.ndarray] = {}
        capture_time: np.ndarray | None = None
        for st in self.cameras:
            p = self.pending[st.name]
            buf = self.frame_buf[st.name][:m]
            if st.name not in self.first_t or p.n == 0:
                buf[:] = 0
                images[st.name] = buf
                continue
            idx, skew = align.nearest_indices(p.times[: p.n], grid, self.tol, native=None)
            first = int(idx[0])
            if m == 1 or bool((np.diff(idx) == 1).all()):
                # One sample per row (the usual case): hand the pending samples themselves,
                # add_frames copies them into its encoder buffers before it returns.
                images[st.name] = p.values[first : first + m]
            else:
                # mode="clip": with the default mode numpy buffers ``out`` (a frame-sized
                # temporary); the indices come from the aligner and are always in range.
                np.take(p.values[: p.n], idx, axis=0, out=buf, mode="clip")
                images[st.name] = buf
            chosen = p.times[idx]
            dist = np.abs(chosen - grid)
            violations = int(skew.sum())
            if violations:
                if st.name not in self.skew_first:
                    self.skew_first[st.name] = k0 + int(np.flatnonzero(skew)[0])
                self.skew_count[st.name] += violations
            self.skew_max[st.name] = max(self.skew_max[st.name], float(dist.max()))
            self.skew_sum[st.name] += float(dist.sum())
            if capture_time is None and st is self.cameras[0]:
                capture_time = chosen
        vectors: dict[str, np.ndarray] = {}
        for st in self.vectors:
            p = self.pending[st.name]
            if st.name not in self.first_t or p.n == 0:
                vectors[st.name] = np.zeros((m, st.shape[0]), np.float32)
                continue
            # float64 as aligned: add_frames makes its own float32 copy (a second one here is waste)
            vectors[st.name] = align.align_vector(
                p.times[: p.n], p.values[: p.n], grid, st.discrete
            )
        if capture_time is None:
            capture_time = grid
        self.episode.add_frames(images=images, vectors=vectors, capture_time=capture_time)
        self.next_row = k0 + m
        self.rec._active_rows = self.next_row
        # Keep, per stream, the latest sample at or before the next grid instant and later ones.
        g_next = self.grid_start + self.next_row / self.fps
        for p in self.pending.values():
            if p.n > 1:
                j = int(np.searchsorted(p.times[: p.n], g_next, side="right")) - 1
                p.drop_front(j)

    # -- STOP --

    def finish(self) -> None:
        s = self.s
        assert s.job is not None and self.episode is not None
        self.settle_grid_start()
        if self.grid_start is not None:
            # Rows still waiting for later samples are final now.
            self.emit_ready(final=False)
            self.emit_ready(final=True)
        row = self.validate()
        s.job.frames = self.next_row
        s.job.quality = row["quality"]
        s.job.quality_issues = row["quality_issues"]
        if self.next_row == 0 and self.first_t:
            log.warning(
                "capture: episode aligned no frame although samples arrived (%s); nothing saved",
                "; ".join(i["detail"] for i in row["quality_issues"]) or "streams do not overlap",
            )
        commit_episode(s.job, s.writer, self.episode, row)
        if s.job.state == FAILED:
            log.error("capture: saving episode failed: %s", s.job.error)

    def validate(self) -> dict[str, Any]:
        s = self.s
        cfg = self.rec.config
        issues = self.issues
        rows = self.next_row
        for st in self.cameras:
            if st.name not in self.first_t:
                issues.add(
                    MISSING_CAMERA_STREAM,
                    st.name,
                    f"camera {st.name}: no image arrived during the episode"
                    + (f"; its {rows} frames are black" if rows else ""),
                )
            elif st.name in self.late_rows:
                k = self.late_rows[st.name]
                issues.add(
                    MISSING_CAMERA,
                    st.name,
                    f"camera {st.name}: no image for frames 0-{k - 1} (the stream started "
                    f"{self.first_t[st.name] - (self.grid_start or 0.0):.3f} s late); they are black",
                )
            if self.skew_count.get(st.name):
                issues.add(
                    IMAGE_SKEW_EXCEEDED,
                    st.name,
                    f"camera {st.name}: {self.skew_count[st.name]} frames (first: frame "
                    f"{self.skew_first[st.name]}) whose nearest image is farther than "
                    f"{self.tol * 1e3:.1f} ms from the grid (max {self.skew_max[st.name] * 1e3:.1f} ms)",
                )
        for st in self.vectors:
            if st.name not in self.first_t:
                issues.add(
                    MISSING_CONFIGURED_COLUMN,
                    st.name,
                    f"vector {st.name}: no sample arrived during the episode; column is zeros",
                )
            elif st.name in self.late_rows:
                k = self.late_rows[st.name]
                issues.add(
                    MISSING_CONFIGURED_COLUMN,
                    st.name,
                    f"vector {st.name}: no sample for frames 0-{k - 1} (stream started late); "
                    "they are zeros",
                )
        for name, (count, detail) in s.bad_shapes.items():
            st = self.streams[name]
            code = INVALID_IMAGE_SHAPE if st.kind == "camera" else INVALID_VECTOR_DIM
            what = "camera" if st.kind == "camera" else "vector"
            issues.add(code, name, f"{what} {name}: {count} samples refused: {detail}")
        for name, detail in s.stalls.items():
            what = "camera" if self.streams[name].kind == "camera" else "stream"
            issues.add(
                SOURCE_STALLED,
                name,
                f"{what} {name} stalled{self.frame_at(self.last_t.get(name, math.nan))}: {detail}",
            )
        for key, count in s.unexpected.items():
            if key.startswith("vector:"):
                issues.add(
                    UNEXPECTED_VECTOR_STREAM,
                    key,
                    f"vector stream {key[7:]!r} is not in the config: {count} samples ignored",
                )
            else:
                issues.add(
                    UNEXPECTED_IMAGE_STREAM,
                    key,
                    f"camera {key!r} is not in the config: {count} images ignored",
                )
        overflow = {
            name: s.overflow_end.get(name, st.ring.overflow_count) - s.overflow_base[name]
            for name, st in self.streams.items()
        }
        for name, count in overflow.items():
            if count:
                issues.add(
                    CAPTURE_BACKLOG_OVERFLOW,
                    name,
                    f"stream {name}: {count} samples refused: the capture backlog reached its "
                    f"hard memory limit ({cfg.backlog.max_memory_mb:g} MB over all cameras)",
                )
        if self.grid_start is not None:
            # A stream whose samples all end before the grid starts runs on another clock.
            for name, last in self.last_t.items():
                if last < self.grid_start - cfg.clock_jump_s:
                    starter = max(self.first_t, key=self.first_t.__getitem__)
                    issues.add(
                        SOURCE_CLOCK_DISCONTINUITY,
                        name,
                        f"stream {name}: its samples end at t={last:.3f} s, before stream "
                        f"{starter} starts at t={self.grid_start:.3f} s: are they on one clock?",
                    )
        expected = None
        if self.grid_start is not None and self.last_t:
            expected = align.grid_length(self.grid_start, min(self.last_t.values()), self.fps)
            if expected != rows:
                issues.add(
                    FRAME_COUNT_MISMATCH,
                    "episode",
                    f"aligned {rows} frames but the streams' common span holds {expected} grid "
                    "instants",
                )
        if 0 < rows < cfg.min_episode_frames:
            issues.add(
                EPISODE_TOO_SHORT,
                "episode",
                f"episode has {rows} frames, fewer than min_episode_frames={cfg.min_episode_frames}",
            )
        records = issues.records()
        duration = (s.ended_mono or time.monotonic()) - s.started_mono
        alignment: dict[str, Any] = {
            "fps": self.fps,
            "grid_start": self.grid_start,
            "grid_end": min(self.last_t.values()) if self.last_t else None,
            "skew_tolerance_s": self.tol,
            "cameras": {
                st.name: {
                    "samples": self.checks[st.name].samples_seen,
                    "max_skew_s": self.skew_max[st.name],
                    "mean_skew_s": self.skew_sum[st.name] / rows if rows else 0.0,
                    "skew_violations": self.skew_count[st.name],
                }
                for st in self.cameras
            },
            "vectors": {
                st.name: {"samples": self.checks[st.name].samples_seen} for st in self.vectors
            },
        }
        return {
            "quality": "red" if records else "green",
            "quality_issues": records,
            "started_at": s.started_at,
            "ended_at": s.ended_at,
            "duration_seconds": round(duration, 6),
            "alignment": alignment,
            "capture_backlog": {
                "high_water": self.high_water,
                "refused": overflow,
            },
        }
