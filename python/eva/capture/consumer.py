"""The recorder's consumer thread: one episode's samples from the rings to its saved files.

:class:`EpisodeConsumer` handles one START..STOP/CANCEL episode (an :class:`EpisodeSession`):
it pops every stream's ring, runs the incremental checks of ``capture/quality_checks.py``, aligns
the samples onto the fps grid as soon as every live stream has samples past a grid instant, and
hands the rows to the episode's writer in batches of ``EMIT_BATCH``. After STOP it drains what is
left of the episode, validates it and commits it (the save job); after CANCEL it discards the
samples and the temporary files. See ``capture/recorder.py`` for the threads around it.

It reads the recorder only through :class:`RecorderView` (the streams and the config), so this
module does not import the recorder.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Protocol

import numpy as np

from eva.capture import align
from eva.capture.backlog import BacklogWatch
from eva.capture.preview import PreviewTap
from eva.capture.quality_checks import (
    EpisodeTally,
    IssueLog,
    StreamCheck,
    add_metrics,
    validate_episode,
)
from eva.capture.save_worker import FAILED, commit_episode
from eva.capture.streams import EpisodeSession, PendingSamples, Stream, discard_before
from eva.config import CollectionConfig
from eva.dataset.errors import DatasetError, error_line
from eva.dataset.writer import EpisodeWriter

log = logging.getLogger("eva.capture")

EMIT_BATCH = 8  # grid rows per add_frames call (frames per camera encoded together)
IDLE_SLEEP_S = 0.002
# After STOP every sample of the episode is already in its ring, so draining only waits for the
# consumer itself; this long without popping or emitting anything means it cannot progress.
DRAIN_STALL_S = 3.0
# A source process's sample stamped this little before START was captured just before it; one
# stamped earlier still is on another clock (kept: the quality checks report such streams).
PRE_START_WINDOW_S = 10.0
VECTOR_PENDING = 4096


class RecorderView(Protocol):
    """What the consumer reads of its recorder (``capture/recorder.py``'s ``Recorder``)."""

    config: CollectionConfig
    fps: int
    tolerance: float
    consumer_throttle_s: float
    preview: PreviewTap | None
    streams: dict[str, Stream]
    cameras: dict[str, Stream]
    vectors: dict[str, Stream]


class EpisodeConsumer:
    """Pops, checks, aligns and encodes one episode's samples, then saves or discards it."""

    def __init__(self, recorder: RecorderView, session: EpisodeSession) -> None:
        self.rec = recorder
        self.session = session
        self.fps = recorder.fps
        self.tol = recorder.tolerance
        cfg = recorder.config
        self.streams = recorder.streams
        self.cameras = [recorder.cameras[c.key] for c in cfg.cameras]
        self.vectors = [recorder.vectors[v.name] for v in cfg.vectors]
        cam_cap = max(4, int(math.ceil(self.fps * 0.5)))
        self.pending: dict[str, PendingSamples] = {}
        for st in self.cameras:
            self.pending[st.name] = PendingSamples(st, cam_cap)
        for st in self.vectors:
            self.pending[st.name] = PendingSamples(st, VECTOR_PENDING)
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
        self.backlog = BacklogWatch(self.streams, recorder.config.backlog.warn_seconds)
        self.episode: EpisodeWriter | None = None
        self.frame_buf = {
            st.name: np.empty((EMIT_BATCH, *st.shape), np.uint8) for st in self.cameras
        }
        for buf in self.frame_buf.values():
            buf.fill(0)  # touch the pages now (see PendingSamples)

    # -- helpers --

    def frame_at(self, t: float) -> str:
        if self.grid_start is None or not math.isfinite(t):
            return ""
        return f" (near frame {max(0, round((t - self.grid_start) * self.fps))})"

    def ended(self) -> bool:
        return self.session.limit is not None

    def remaining(self, name: str) -> int | None:
        """Samples of this episode still in the ring (None while the episode records)."""
        limit = self.session.limit
        if limit is None:
            return None
        return limit[name] - self.session.base[name] - self.popped[name]

    # -- main loop --

    def run(self) -> None:
        s = self.session
        for st in self.streams.values():
            if st.external:  # samples between the previous episode's end and this START
                discard_before(st, s.base[st.name])
            st.ring.reset_high_water()
        try:
            # START refuses an empty task; the start time goes into the crash spool
            self.episode = s.writer.begin_episode(s.task, s.started_at)
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
                self.backlog.check(self.waiting_for)
                self.settle_grid_start()
                emitted = self.emit_ready(final=False)
                if ended and all((self.remaining(n) or 0) <= 0 for n in self.streams):
                    self.finish()
                    return
                if moved or emitted:
                    progressed = time.monotonic()
                elif ended and time.monotonic() - progressed > DRAIN_STALL_S:
                    # a safety net: an episode after STOP must end, never hang close()
                    log.warning(
                        "capture: the episode's drain made no progress for %.0f s after STOP; "
                        "saving what was aligned (%s)",
                        DRAIN_STALL_S,
                        self.describe_state(),
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
                s.job.finish(FAILED, message)
            if isinstance(e, DatasetError | OSError | ValueError):
                log.error("capture: episode failed: %s", message)
                # Drop what is left of this episode so the next one starts clean; the job that
                # STOP creates meanwhile reports the failure.
                self.wait_end_and_discard()
                if s.job is not None and not s.job.finished:
                    s.job.finish(FAILED, message)
                return
            raise

    def describe_state(self) -> str:
        """The alignment state in one line, for a warning that says why an episode stalled."""
        # Times relative to the grid's start (sample times are wall-clock epoch seconds).
        origin = self.grid_start
        parts = [f"grid start {'set' if origin is not None else 'not yet'}, row {self.next_row}"]
        for name, p in self.pending.items():
            if not p.n:
                span = "empty"
            elif origin is None:
                span = f"{p.n} samples"
            else:
                span = f"{p.times[0] - origin:.3f}..{p.times[p.n - 1] - origin:.3f} s"
            parts.append(
                f"{name}: {p.n}/{p.capacity} pending ({span}), {len(self.streams[name].ring)} in ring, "
                f"{self.remaining(name)} owed"
            )
        return "; ".join(parts)

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
        while self.session.limit is None:
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

    def disown(self, session: EpisodeSession) -> None:
        """CANCEL pressed: a kill before ``discard`` must not recover ``session``'s episode."""
        if session is self.session and self.episode is not None:
            self.episode.disown()

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
            if st.external and name not in self.first_t:
                k = self.drop_before_start(p, n0, k)
                if k == 0:
                    continue
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
        if moved and self.grid_start is not None:
            # A stream that lags the others (a camera whose decoder still works through frames
            # received before START) delivers samples older than the grid: freed here, or a
            # pending buffer full of them would block alignment for good.
            self.drop_used()
        return moved

    def drop_before_start(self, p: PendingSamples, n0: int, k: int) -> int:
        """Leading samples of a source process captured before START (pushed after it: a camera
        demuxes a frame only once the next one arrives) are not the episode's: freed here. Only
        times within PRE_START_WINDOW_S before START count, so a source on another clock (which
        the quality checks report) keeps its samples. The number of samples left."""
        times = p.times[n0 : n0 + k]
        start = self.session.started_wall
        before = (times < start) & (times > start - PRE_START_WINDOW_S)
        skip = k if before.all() else int(np.argmin(before))
        if skip:
            p.times[n0 : n0 + k - skip] = p.times[n0 + skip : n0 + k]
            p.values[n0 : n0 + k - skip] = p.values[n0 + skip : n0 + k]
        return k - skip

    def prune_before_start(self) -> None:
        """Before the grid is fixed, drop samples no grid instant can use (start only rises)."""
        if not self.first_t:
            return
        lower = max(self.first_t.values())
        for p in self.pending.values():
            if p.n > 1:
                j = int(np.searchsorted(p.times[: p.n], lower, side="right")) - 1
                p.drop_front(j)

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
        into = self.last_t[slowest] - self.grid_start  # never the raw epoch seconds
        return f" (alignment waits for {slowest}: its last sample {into:.2f} s into the episode)"

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
        self.drop_used()

    def drop_used(self) -> None:
        """Keep, per stream, the latest sample at or before the next grid instant and later ones
        (no row to come can use an earlier one)."""
        assert self.grid_start is not None
        g_next = self.grid_start + self.next_row / self.fps
        for p in self.pending.values():
            if p.n > 1:
                j = int(np.searchsorted(p.times[: p.n], g_next, side="right")) - 1
                p.drop_front(j)

    # -- STOP --

    def finish(self) -> None:
        s = self.session
        assert s.job is not None and self.episode is not None
        self.settle_grid_start()
        if self.grid_start is not None:
            # Rows still waiting for later samples are final now.
            self.emit_ready(final=False)
            self.emit_ready(final=True)
        row = validate_episode(self.tally(), self.issues, self.rec.config, self.frame_at)
        add_metrics(row, self.rec.config, self.episode, self.checks)
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

    def tally(self) -> EpisodeTally:
        """What this episode counted, for :func:`validate_episode` (at STOP, after the last row)."""
        s = self.session
        return EpisodeTally(
            fps=self.fps,
            skew_tolerance_s=self.tol,
            rows=self.next_row,
            cameras=[st.name for st in self.cameras],
            vectors=[st.name for st in self.vectors],
            kinds={name: st.kind for name, st in self.streams.items()},
            samples_seen={name: check.samples_seen for name, check in self.checks.items()},
            first_t=self.first_t,
            last_t=self.last_t,
            grid_start=self.grid_start,
            late_rows=self.late_rows,
            skew_count=self.skew_count,
            skew_first=self.skew_first,
            skew_max=self.skew_max,
            skew_sum=self.skew_sum,
            bad_shapes=s.bad_shapes,
            stalls=s.stalls,
            unexpected=s.unexpected,
            refused={
                name: s.overflow_end.get(name, st.ring.overflow_count) - s.overflow_base[name]
                for name, st in self.streams.items()
            },
            high_water=self.backlog.high_water,
            started_at=s.started_at,
            ended_at=s.ended_at,
            duration_seconds=(s.ended_mono or time.monotonic()) - s.started_mono,
        )
