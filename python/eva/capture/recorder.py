"""The live recorder: START / push samples / STOP or CANCEL, into a raw v2.1 dataset.

Threads and data flow::

    rig threads --push_image/push_vector--> one SnapshotRing per stream (native, lock-free SPSC)
        --> consumer thread (capture/consumer.py): pop, check, align onto the fps grid,
            EpisodeWriter.add_frames
        --> one encoder thread per camera (the EpisodeWriter's): encode the MP4, image stats
        --> at STOP: drain the episode's remaining samples, validate (capture/quality_checks.py),
            commit (save job)

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

Work in progress lives in ``<raw>/.eva-work/`` (episode dirs with their crash spools). After a
crash, ``recover_datasets`` or the next ``start`` recovers each spool (``eva.dataset.recover``),
removes other leftovers and reports both (log warnings, ``Recorder.recovered``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from eva import libc
from eva.capture.consumer import EpisodeConsumer
from eva.capture.preview import PreviewTap
from eva.capture.ring import Ring
from eva.capture.save_worker import (
    FAILED,
    QUEUED,
    SAVED,
    SAVING,
    SaveJob,
    open_dataset_writer,
)
from eva.capture.streams import EpisodeSession, Stream, build_streams, discard_before
from eva.config import CollectionConfig
from eva.dataset import layout
from eva.dataset.errors import DatasetError, error_line
from eva.dataset.recover import find_spools
from eva.dataset.writer import DatasetWriter
from eva.textsafe import text_problem
from eva.timestamps import utc_now

log = logging.getLogger("eva.capture")


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
    return libc.mallopt(libc.M_MMAP_THRESHOLD, nbytes)


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
        rings: Mapping[str, Ring] | None = None,
        spool: bool = True,
    ) -> None:
        self.config = config
        self.spool = spool
        self.external_rings = dict(rings or {})
        self.default_dataset = dataset if dataset is not None else next(iter(config.tasks))
        self.durable = durable
        self.consumer_throttle_s = consumer_throttle_s
        self.native = native
        self.fps = config.fps
        self.tolerance = config.skew_tolerance
        self.recovered: list[str] = []
        self.jobs: list[SaveJob] = []
        self.streams = build_streams(config, self.external_rings, native)
        self.cameras = {c.key: self.streams[c.key] for c in config.cameras}
        self.vectors = {v.name: self.streams[v.name] for v in config.vectors}
        self._unexpected: dict[str, int] = {}
        self._unexpected_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._current: EpisodeSession | None = None
        self._sessions: deque[EpisodeSession] = deque()
        self._writers: dict[Path, DatasetWriter] = {}
        self._wake = threading.Event()
        self._closing = False
        self._active: EpisodeConsumer | None = None  # the episode being aligned, if any
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
        st = self.streams.get(stream)
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
        stream = self.cameras.get(camera)
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
        stream = self.vectors.get(stream_name)
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

    def _note_bad_shape(self, stream: Stream, sample: Any, expected: str) -> None:
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
            if not task.strip() or (problem := text_problem(task)) is not None:
                raise RecorderError(f"task prompt: {problem or 'must not be empty'}")
            writer = self._writer_for(root)
            session = EpisodeSession(
                dataset_dir=root,
                task=task.strip(),
                writer=writer,
                started_at=utc_now(),
                started_mono=time.monotonic(),
                started_wall=time.time(),
                base={},
                overflow_base={},
            )
            with self._unexpected_lock:
                self._unexpected.clear()
            for stream in self.streams.values():
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

    def _end(self, cancelled: bool) -> EpisodeSession:
        with self._state_lock:
            session = self._current
            if session is None:
                raise RecorderError("no episode is recording")
            limit: dict[str, int] = {}
            for stream in self.streams.values():
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
            if cancelled and (active := self._active) is not None:
                active.disown(session)
            if not cancelled:
                session.job = SaveJob(session.dataset_dir, session.task)
                self.jobs.append(session.job)
                if self._consumer_error is not None:  # nobody will ever process this job
                    session.job.finish(FAILED, f"capture consumer failed: {self._consumer_error}")
            session.limit = limit  # last: the consumer treats a set limit as "episode ended"
            self._current = None
        self._wake.set()
        return session

    def _writer_for(self, root: Path) -> DatasetWriter:
        writer = self._writers.get(root)
        if writer is not None:
            return writer
        try:
            writer, found = open_dataset_writer(
                root, self.config, durable=self.durable, crash_spool=self.spool
            )
        except (DatasetError, ValueError) as e:
            raise RecorderError(str(e)) from None
        for what in found:
            log.warning("%s: %s", root, what)
            self.recovered.append(f"{root}: {what}")
        self._writers[root] = writer
        return writer

    def recover_datasets(self) -> list[str]:
        """Open each configured dataset holding crash spools, which recovers them (reported by
        ``_writer_for``); returns what was reported. Entry points call it as they start."""
        before = len(self.recovered)
        for name in self.config.tasks:
            root = self.config.dataset_dir(name)
            if find_spools(root / layout.WORK_DIR):
                with self._state_lock:
                    self._writer_for(root)
        return self.recovered[before:]

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
        for key, stream in self.cameras.items():
            pushed = stream.ring.pushed
            mark = self._fps_marks.get(key)
            if mark is not None and now > mark[0]:
                camera_fps[key] = (pushed - mark[1]) / (now - mark[0])
            else:
                camera_fps[key] = 0.0
            self._fps_marks[key] = (now, pushed)
        session = self._current
        active = self._active
        return {
            "recording": session is not None,
            "dataset": str(session.dataset_dir) if session else None,
            "task": session.task if session else None,
            "elapsed_s": (now - session.started_mono) if session else 0.0,
            "frames": (
                active.next_row
                if (session is not None and active is not None and active.session is session)
                else 0
            ),
            # samples received per stream since START (the live counts an operator watches)
            "samples": {
                name: (st.ring.pushed - session.base.get(name, st.ring.pushed)) if session else 0
                for name, st in self.streams.items()
            },
            "backlog": {name: len(s.ring) for name, s in self.streams.items()},
            "backlog_mb": sum(len(s.ring) * s.ring.item_bytes for s in self.streams.values()) / 1e6,
            "dropped": sum(s.ring.overflow_count for s in self.streams.values()),
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
            for stream in self.streams.values():
                if not stream.external:
                    continue
                end = stream.ring.pushed
                if stream.kind == "camera" and tap is not None and tap.due(stream.name):
                    # keep the newest frame for the preview: pop it instead of freeing it
                    discard_before(stream, end - 1)
                    buf, times = self._idle_frame(stream)
                    if stream.ring.pop_batch(buf, times, 1):
                        tap.offer(stream.name, float(times[0]), buf[0])
                discard_before(stream, end)

    def _idle_frame(self, stream: Stream) -> tuple[np.ndarray, np.ndarray]:
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
                consumer = EpisodeConsumer(self, session)
                self._active = consumer
                try:
                    consumer.run()
                finally:
                    self._active = None
                with self._state_lock:
                    self._sessions.popleft()
        except BaseException as e:  # keep the reason visible to status() and start()
            self._consumer_error = _crash_line(e)
            log.exception("capture consumer stopped")
            with self._state_lock:
                for s in self._sessions:
                    if s.job is not None and not s.job.finished:
                        s.job.finish(FAILED, self._consumer_error)


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
