"""The encoders of an episode's cameras: one MP4 encoder and its image stats per camera.

Encoding runs on one worker thread per camera (the writer's ``parallel_encode=True``, the
default): ``EpisodeEncoders.submit`` copies each camera's frames into one of a few reused batch
buffers and returns; the worker encodes them and feeds that camera's image stats (PyAV and the
native stats release the GIL, so cameras encode in parallel). Memory is bounded
(``ENCODE_BUFFERS`` buffers of ``ENCODE_BATCH_FRAMES`` frames per camera, kept across episodes
in the writer's ``BufferPool``; ``submit`` waits for a free one). A worker's failure is kept and
reported by ``failure`` (the writer then aborts the episode); ``stop`` joins the workers before it
returns. Without threads (``parallel_encode=False``) every camera encodes in the calling thread,
one after the other.
"""

from __future__ import annotations

import os
import queue
import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from eva.dataset.errors import error_line
from eva.dataset.features import CameraSpec
from eva.dataset.stats import ImageStats
from eva.dataset.video import VideoEncoder, VideoOptions

__all__ = [
    "ENCODE_BATCH_FRAMES",
    "ENCODE_BUFFERS",
    "BufferPool",
    "CameraEncoder",
    "EpisodeEncoders",
]

# Per camera: batch buffers of ENCODE_BATCH_FRAMES frames cycling between add_frames and the
# encoder thread (one being encoded, one queued, one being filled): 11 MB per 640x480 camera.
# Reused across episodes, so their pages are touched once per writer, not once per batch. In the
# 3x640x480 capture bench, 4x3 ran as fast as 8x3 with 30 MB less peak RSS.
ENCODE_BATCH_FRAMES = 4
ENCODE_BUFFERS = 3


class BufferPool:
    """The batch buffers of a writer's cameras, kept between episodes (one set per camera)."""

    def __init__(self) -> None:
        self._free: dict[str, list[np.ndarray]] = {}
        self._lock = threading.Lock()

    def take(self, cam: CameraSpec) -> list[np.ndarray]:
        """Batch buffers for one camera's encoder thread: the pooled set, or a new one."""
        with self._lock:
            pooled = self._free.pop(cam.key, None)
        if pooled is not None:
            return pooled
        buffers = []
        for _ in range(ENCODE_BUFFERS):
            buf = np.empty((ENCODE_BATCH_FRAMES, cam.height, cam.width, 3), np.uint8)
            buf.fill(0)  # touch the pages once, here, not in the middle of an episode
            buffers.append(buf)
        return buffers

    def give_back(self, key: str, buffers: list[np.ndarray]) -> None:
        """Keep one set per camera for the next episode (more exist only with parallel episodes)."""
        with self._lock:
            self._free.setdefault(key, buffers)

    def clear(self) -> None:
        with self._lock:
            self._free = {}


class _StopWork:
    """Queue message that ends an encoder thread: flush and close the MP4, or discard it."""

    def __init__(self, close: bool) -> None:
        self.close = close


class CameraEncoder:
    """One camera of an episode: its MP4 encoder and its image stats, fed from ONE thread.

    Threaded (``buffers`` given): ``submit`` copies frames into a free batch buffer and queues
    it; the worker encodes it, updates the stats and hands the buffer back. At most
    ``len(buffers)`` batches are in flight, so ``submit`` blocks while the encoder is behind.
    Inline (``buffers`` None): ``submit`` encodes in the calling thread.
    """

    def __init__(
        self,
        cam: CameraSpec,
        path: Path,
        fps: int,
        options: VideoOptions,
        buffers: list[np.ndarray] | None,
        codec_threads: int | None = None,
        spool_path: Path | None = None,
    ) -> None:
        self.cam = cam
        self.path = path
        self.spool_path = spool_path
        self.fps = fps
        self.options = options
        self.codec_threads = codec_threads
        self.encoder: VideoEncoder | None = None
        self.stats = ImageStats()
        self.error: BaseException | None = None  # first failure of the encoder / stats
        self.buffers = buffers
        self._thread: threading.Thread | None = None
        if buffers is not None:
            self._free: queue.SimpleQueue[np.ndarray] = queue.SimpleQueue()
            for buf in buffers:
                self._free.put(buf)
            self._todo: queue.SimpleQueue[tuple[np.ndarray, int] | _StopWork] = queue.SimpleQueue()
            # Daemon: an episode its owner never commits or aborts must not hang interpreter exit.
            self._thread = threading.Thread(
                target=self._run, name=f"eva-encode-{path.stem}", daemon=True
            )
            self._thread.start()

    @property
    def frames_written(self) -> int:
        return self.encoder.frames_written if self.encoder is not None else 0

    def _encode(self, frames: np.ndarray) -> None:
        if self.encoder is None:
            self.encoder = VideoEncoder(
                self.path,
                self.cam.width,
                self.cam.height,
                self.fps,
                self.options,
                thread_count=self.codec_threads,
                spool_path=self.spool_path,
            )
        self.encoder.write(frames)
        self.stats.update(frames)

    def _run(self) -> None:
        while True:
            item = self._todo.get()
            if isinstance(item, _StopWork):
                self._finish_inline(item.close)
                return
            buf, n = item
            try:
                if self.error is None:
                    self._encode(buf[:n])
            except BaseException as e:  # reported to the producer by the next submit/finish
                self.error = e
            finally:
                self._free.put(buf)

    def _finish_inline(self, close: bool) -> None:
        if self.encoder is None:
            return
        if close and self.error is None:
            try:
                self.encoder.close()
            except BaseException as e:
                self.error = e
        else:
            self.encoder.abort()

    def _worker_failed(self) -> bool:
        # A call, not an inline test: the worker thread sets ``error`` while ``submit`` waits,
        # which a type checker cannot see (it would keep the earlier test's answer).
        return self.error is not None

    def submit(self, frames: np.ndarray) -> None:
        """Encode ``frames`` (n, H, W, 3) uint8; the caller may reuse them once this returns."""
        if self.error is not None:
            return
        if self._thread is None:
            try:
                self._encode(frames)
            except BaseException as e:
                self.error = e
            return
        for start in range(0, len(frames), ENCODE_BATCH_FRAMES):
            part = frames[start : start + ENCODE_BATCH_FRAMES]
            buf = self._free.get()  # waits while ENCODE_BUFFERS batches are in flight
            if self._worker_failed():
                self._free.put(buf)
                return
            np.copyto(buf[: len(part)], part)
            self._todo.put((buf, len(part)))

    def request_stop(self, close: bool) -> None:
        """Ask the worker to finish after the queued batches (close) or to discard (abort)."""
        if self._thread is not None:
            self._todo.put(_StopWork(close))

    def join(self, close: bool) -> None:
        """Wait for the worker (after ``request_stop``); inline: close or abort here."""
        if self._thread is None:
            self._finish_inline(close)
            return
        self._thread.join()

    def failure(self) -> str | None:
        if self.error is None:
            return None
        text = error_line(self.error)
        return f"camera {self.cam.key}: encoding {self.path.name} failed ({text})"


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _abandon_cameras(cameras: list[CameraEncoder]) -> None:
    for camera in cameras:
        camera.request_stop(close=False)  # a no-op for threads already ended


class EpisodeEncoders:
    """The camera encoders of one episode, writing ``video_files[key]`` for each camera:
    threaded with buffers from ``pool``, or inline when ``pool`` is None. Started on the first
    frames (``start``); ``stop`` finishes them all and gives the buffers back to the pool."""

    def __init__(
        self,
        cameras: Sequence[CameraSpec],
        video_files: Mapping[str, Path],
        fps: int,
        options: VideoOptions,
        pool: BufferPool | None,
        spool_files: Mapping[str, Path] | None = None,
    ) -> None:
        self._specs = list(cameras)
        self._video_files = dict(video_files)
        self._spool_files = dict(spool_files or {})
        self._fps = fps
        self._options = options
        self._pool = pool
        self.cameras: dict[str, CameraEncoder] = {}

    @property
    def started(self) -> bool:
        return bool(self.cameras)

    def start(self) -> None:
        # With at least one camera thread per CPU the cores are busy already: x264's slice
        # threads would only add synchronisation (measured: ~8% less CPU and ~8% more speed in
        # the 3-camera capture bench). Fewer cameras keep the codec's default threading.
        threaded = self._pool is not None
        codec_threads = 1 if threaded and len(self._specs) >= _usable_cpus() else None
        for cam in self._specs:
            buffers = self._pool.take(cam) if self._pool is not None else None
            self.cameras[cam.key] = CameraEncoder(
                cam,
                self._video_files[cam.key],
                self._fps,
                self._options,
                buffers,
                codec_threads,
                self._spool_files.get(cam.key),
            )
        # An episode dropped without commit/abort must not leave its encoder threads waiting
        # forever: when it is collected they discard their files and end (the work dir is
        # removed by the next writer that opens the dataset).
        weakref.finalize(self, _abandon_cameras, list(self.cameras.values()))

    def submit(self, batches: Mapping[str, np.ndarray]) -> None:
        """Hand each camera its (n, H, W, 3) uint8 batch; reusable once this returns."""
        for key, batch in batches.items():
            self.cameras[key].submit(batch)

    def failure(self) -> tuple[str, BaseException | None] | None:
        """(message naming the camera and file, the error) of the first failed camera, or None."""
        for camera in self.cameras.values():
            failure = camera.failure()
            if failure is not None:
                return failure, camera.error
        return None

    def frames_written(self) -> dict[str, int]:
        return {key: camera.frames_written for key, camera in self.cameras.items()}

    def stop(self, close: bool) -> None:
        """Finish every camera's encoder (in parallel when threaded) and pool the buffers."""
        for camera in self.cameras.values():
            camera.request_stop(close)
        for camera in self.cameras.values():
            camera.join(close)
            if camera.buffers is not None and self._pool is not None:
                self._pool.give_back(camera.cam.key, camera.buffers)
                camera.buffers = None

    def image_stats(self) -> dict[str, Any]:
        """Per camera stats (only valid once ``stop`` has joined the threads)."""
        return {key: camera.stats.result() for key, camera in self.cameras.items()}

    def histograms(self) -> dict[str, list[list[int]]]:
        """Per camera (3, 256) pixel counts as JSON lists (valid once ``stop`` has returned)."""
        return {key: camera.stats.histogram().tolist() for key, camera in self.cameras.items()}
