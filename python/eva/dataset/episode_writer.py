"""One episode being recorded into a ``DatasetWriter`` (``DatasetWriter.begin_episode``).

``add_frames`` checks each batch against the dataset's cameras and vectors, hands the images to
the cameras' encoders (``eva.dataset.encoder_pool``) and buffers the vectors (they are small);
``commit`` waits for the encoders and gives the writer a ``RecordedEpisode`` to publish. An
encoder failure while recording aborts the episode: its work dir is removed and nothing is
published.

With the writer's ``spool`` on (the default), the work dir also holds the episode's crash spool
(``eva.dataset.spool``): a kill at any instant leaves what ``eva recover`` turns into an episode.
A commit that fails on a shortage (too many open files, no memory) is retried from what is on
disk; one that still fails keeps the work dir, spool included, for ``eva recover``.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from eva.dataset import spool
from eva.dataset.encoder_pool import EpisodeEncoders
from eva.dataset.errors import DatasetError, error_line
from eva.dataset.repair import MetadataNotUpdated
from eva.timestamps import utc_now

if TYPE_CHECKING:
    from eva.dataset.writer import DatasetWriter

__all__ = ["RESERVED_ROW_KEYS", "EpisodeWriter", "RecordedEpisode"]

# Episode-row keys the writer owns; extra_row_fields may not override them.
RESERVED_ROW_KEYS = frozenset({"episode_index", "tasks", "length", "video_keys"})

# A commit that fails for want of file descriptors or memory (exhausted by something else in
# the process, say a flood of connections to the console) is tried again for this long.
COMMIT_RETRY_S = 30.0
_SHORTAGES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})


def is_shortage(error: BaseException) -> bool:
    """A failure that waiting may cure: no memory, no file descriptors (the error or its cause)."""
    seen: BaseException | None = error
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, MemoryError):
            return True
        if isinstance(seen, OSError) and seen.errno in _SHORTAGES:
            return True
        if "Too many open files" in str(seen) or "Cannot allocate memory" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@dataclass(frozen=True, eq=False)
class RecordedEpisode:
    """A recorded episode ready to publish: its frames' vectors (name -> (n, dim) float32) and
    capture times ((n,) float64), each camera's image stats and (3, 256) pixel histogram as JSON
    lists, and the finished MP4 of each camera in the episode's work dir."""

    task: str
    length: int
    vectors: dict[str, np.ndarray]
    capture_time: np.ndarray
    image_stats: dict[str, Any]
    histograms: dict[str, list[list[int]]]
    video_files: dict[str, Path]
    # The episode's crash spool: the writer marks in it which index the commit claims.
    spool_dir: Path | None = None


def _jsonable(value: Any, where: str) -> Any:
    """numpy scalars/arrays -> Python values; refuse NaN/inf and non-JSON objects early."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v, where) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist(), where)
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        raise DatasetError(f"episode field {where}: non-finite value {value}")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise DatasetError(f"episode field {where}: {type(value).__name__} is not JSON data")


class EpisodeWriter:
    """One episode being recorded: ``add_frames`` batches, then ``commit`` or ``abort``."""

    def __init__(self, writer: DatasetWriter, task: str, started_at: str | None = None) -> None:
        self.writer = writer
        self.task = task
        self.length = 0
        self.work_dir = Path(tempfile.mkdtemp(prefix="ep-", dir=writer.work_root))
        self._video_files = {
            c.key: self.work_dir / f"{i:02d}.mp4" for i, c in enumerate(writer.cameras)
        }
        self._rows: spool.RowSpool | None = None
        spool_files: dict[str, Path] = {}
        if writer.spool:
            spool_files = {
                c.key: self.work_dir / spool.video_spool_name(i)
                for i, c in enumerate(writer.cameras)
            }
            self._rows = self._start_spool(started_at or utc_now(), spool_files)
        self._encoders = EpisodeEncoders(  # started on the first frames
            writer.cameras,
            self._video_files,
            writer.fps,
            writer.video,
            writer.buffer_pool if writer.parallel_encode else None,
            spool_files,
        )
        self._vector_parts: dict[str, list[np.ndarray]] = {v.name: [] for v in writer.vectors}
        self._capture_parts: list[np.ndarray] = []
        self._done = False
        self._failure: str | None = None  # why the episode was aborted by an encoder failure
        self.kept_for_recovery = False  # a failed commit left the work dir for eva recover

    def _start_spool(self, started_at: str, video_files: dict[str, Path]) -> spool.RowSpool:
        w = self.writer
        spool.write_manifest(
            self.work_dir,
            task=self.task,
            fps=w.fps,
            started_at=started_at,
            cameras=[
                {
                    "key": c.key,
                    "height": c.height,
                    "width": c.width,
                    "spool": video_files[c.key].name,
                }
                for c in w.cameras
            ],
            vectors=[{"name": v.name, "dim": v.dim} for v in w.vectors],
        )
        return spool.RowSpool(self.work_dir / spool.ROWS, [(v.name, v.dim) for v in w.vectors])

    def _check_open(self) -> None:
        if self._failure is not None:
            raise DatasetError(f"episode in {self.work_dir} was aborted: {self._failure}")
        if self._done:
            raise DatasetError(f"episode in {self.work_dir}: already committed or aborted")

    def _raise_on_failure(self) -> None:
        """An encoder failed: abort the whole episode and raise its reason."""
        failed = self._encoders.failure()
        if failed is not None:
            self._failure, error = failed
            self.abort()
            raise DatasetError(self._failure) from error

    def add_frames(
        self,
        images: Mapping[str, np.ndarray] | None = None,
        vectors: Mapping[str, np.ndarray] | None = None,
        capture_time: np.ndarray | Sequence[float] | None = None,
    ) -> None:
        """Append n aligned frames: every camera (n,H,W,3) uint8, every vector (n,dim).

        ``capture_time`` (n,) float64 seconds; omitted, it defaults to the fps grid instants.
        Images are handed to the cameras' encoders right away (never held past a few batches;
        the arrays may be reused once this returns); vectors are buffered until commit. An
        encoder failure (this batch's or an earlier one's) aborts the episode and raises.
        """
        self._check_open()
        self._raise_on_failure()
        images = dict(images or {})
        vectors = dict(vectors or {})
        w = self.writer
        where = f"{w.root}: add_frames"  # errors name the dataset and the field
        want_cams = {c.key for c in w.cameras}
        want_vecs = {v.name for v in w.vectors}
        if set(images) != want_cams:
            raise DatasetError(
                f"{where}: images for {sorted(images)}, dataset cameras are {sorted(want_cams)}"
            )
        if set(vectors) != want_vecs:
            raise DatasetError(
                f"{where}: vectors {sorted(vectors)}, dataset vectors are {sorted(want_vecs)}"
            )
        counts = {k: len(a) for k, a in {**images, **vectors}.items()}
        if capture_time is not None:
            capture_time = np.asarray(capture_time, dtype=np.float64).reshape(-1)
            counts["capture_time"] = len(capture_time)
        if not counts:
            raise DatasetError(f"{where}: a dataset without cameras or vectors needs capture_time")
        n = next(iter(counts.values()))
        if any(c != n for c in counts.values()):
            raise DatasetError(f"{where}: frame counts differ between fields {counts}")
        if n == 0:
            return
        batches: dict[str, np.ndarray] = {}
        for cam in w.cameras:
            batch = np.asarray(images[cam.key])
            if batch.dtype != np.uint8 or batch.shape != (n, cam.height, cam.width, 3):
                raise DatasetError(
                    f"{where}: camera {cam.key} batch is {batch.dtype}{tuple(batch.shape)}, "
                    f"expected uint8({n}, {cam.height}, {cam.width}, 3)"
                )
            batches[cam.key] = batch
        checked: dict[str, np.ndarray] = {}
        for vec in w.vectors:
            arr = np.asarray(vectors[vec.name])
            if arr.shape != (n, vec.dim):
                raise DatasetError(
                    f"{where}: vector {vec.name} shape {tuple(arr.shape)} != ({n}, {vec.dim})"
                )
            checked[vec.name] = arr.astype(np.float32, copy=True)
        if capture_time is None:
            capture_time = (np.arange(self.length, self.length + n) / w.fps).astype(np.float64)
        if w.cameras and not self._encoders.started:
            self._encoders.start()
        self._encoders.submit(batches)
        self._raise_on_failure()
        for name, arr in checked.items():
            self._vector_parts[name].append(arr)
        times = np.array(capture_time, dtype=np.float64)
        self._capture_parts.append(times)
        if self._rows is not None:
            self._rows.add(times, checked)
        self.length += n

    def commit(self, extra_row_fields: Mapping[str, Any] | None = None) -> int | None:
        """Publish the episode; returns its index, or None (nothing written) for zero frames.

        ``extra_row_fields`` go into the episodes.jsonl row (quality, quality_issues, timing...).
        Waits for the cameras' encoders; if one failed, the episode is aborted and this raises.
        """
        self._check_open()
        extra = _jsonable(dict(extra_row_fields or {}), "extra_row_fields")
        clash = RESERVED_ROW_KEYS & set(extra)
        if clash:
            raise DatasetError(f"extra_row_fields may not set {sorted(clash)}")
        if self.length == 0:
            self.abort()
            return None
        try:
            self._encoders.stop(close=True)
            self._raise_on_failure()
            for key, frames in self._encoders.frames_written().items():
                if frames != self.length:
                    raise DatasetError(
                        f"camera {key}: encoded {frames} frames, episode has {self.length}"
                    )
            if self._rows is not None:
                self._rows.close()
                spool.write_marker(self.work_dir, spool.STOPPED, {"row_fields": extra})
        except BaseException:
            self.abort()
            raise
        try:
            episode_index = self._commit_retrying(self._recorded(), extra)
        except MetadataNotUpdated:  # committed: only info.json / stats.json are behind
            self._done = True
            shutil.rmtree(self.work_dir, ignore_errors=True)
            raise
        except BaseException as e:
            if self._rows is None:
                self.abort()
                raise
            # Everything recorded is on disk: keep it for `eva recover` rather than lose it.
            self._done = True
            self.kept_for_recovery = True
            raise DatasetError(
                f"{error_line(e)}; the recording is kept in {self.work_dir} for recovery (by "
                f"the next eva collect or console start, or eva recover {self.writer.root})"
            ) from e
        self._done = True
        shutil.rmtree(self.work_dir, ignore_errors=True)
        return episode_index

    def _commit_retrying(self, episode: RecordedEpisode, extra: dict[str, Any]) -> int:
        """The writer's commit, tried again while it fails on a shortage (see ``is_shortage``)."""
        deadline = time.monotonic() + COMMIT_RETRY_S
        delay = 0.05
        while True:
            try:
                return self.writer.commit_episode(episode, extra)
            except MetadataNotUpdated:
                raise
            except Exception as e:
                if not is_shortage(e) or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def recorded_columns(self) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        """The vectors and capture times added so far (for the save-time metrics)."""
        vectors = {
            name: np.concatenate(parts, axis=0)
            for name, parts in self._vector_parts.items()
            if parts
        }
        times = np.concatenate(self._capture_parts) if self._capture_parts else None
        return vectors, times

    def _recorded(self) -> RecordedEpisode:
        """What the writer publishes, once the encoders have stopped."""
        vectors = {
            v.name: np.concatenate(self._vector_parts[v.name], axis=0)
            if self._vector_parts[v.name]
            else np.zeros((0, v.dim), np.float32)
            for v in self.writer.vectors
        }
        return RecordedEpisode(
            task=self.task,
            length=self.length,
            vectors=vectors,
            capture_time=np.concatenate(self._capture_parts),
            image_stats=self._encoders.image_stats(),
            histograms=self._encoders.histograms(),
            video_files=dict(self._video_files),
            spool_dir=self.work_dir if self._rows is not None else None,
        )

    def disown(self) -> None:
        """No recovery for this episode (CANCEL): a kill from now on leaves a leftover that the
        next writer removes, not a spool it recovers. Safe from any thread; idempotent."""
        if self._rows is not None and not self.kept_for_recovery:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.work_dir / spool.MANIFEST)

    def abort(self) -> None:
        """Drop the episode: stop the encoders, remove the work dir (unless a failed commit kept
        it for ``eva recover``). Idempotent."""
        self.disown()
        self._done = True
        self._encoders.stop(close=False)
        if self._rows is not None:
            self._rows.abandon()
        if not self.kept_for_recovery:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> EpisodeWriter:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is not None or not self._done:
            self.abort()
