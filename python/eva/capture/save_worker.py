"""Save jobs: the observable record of each STOPped episode, and the commit step itself.

A job moves ``queued`` (STOP pressed; the consumer still drains, aligns and encodes the episode's
remaining samples) -> ``saving`` (validation done; parquet, stats and metadata being written) ->
``saved`` (``episode_index`` set, or None for a zero-frame episode, which writes nothing) or
``failed`` (``error`` holds one line). Jobs are processed in STOP order by the recorder's
consumer thread, so episode indices follow the order of the STOPs.

While episode N is committed the dataset writer holds an exclusive ``flock`` on
``<raw>/.eva-work/saving-<N:06d>.lock`` (docs/design.md, "Saving marker"): ``eva qc`` refuses a
verdict for N meanwhile. A stale marker left by a crash is removed by the next recorder start.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eva.config import CollectionConfig
from eva.dataset import layout, spool
from eva.dataset.errors import error_line
from eva.dataset.locks import try_flock
from eva.dataset.repair import MetadataNotUpdated
from eva.dataset.video import VideoOptions
from eva.dataset.writer import CameraSpec, DatasetWriter, EpisodeWriter, VectorSpec
from eva.timestamps import utc_now

QUEUED = "queued"
SAVING = "saving"
SAVED = "saved"
FAILED = "failed"

_job_ids = itertools.count(1)


@dataclass
class SaveJob:
    """One STOPped episode on its way to disk. Read it from any thread; the recorder updates it."""

    dataset_dir: Path
    task: str
    job_id: int = field(default_factory=lambda: next(_job_ids))
    state: str = QUEUED
    episode_index: int | None = None
    frames: int = 0
    quality: str | None = None
    quality_issues: list[dict[str, str]] = field(default_factory=list)
    error: str | None = None
    # Saved, but info.json / stats.json were not rewritten after the commit: what to run.
    warning: str | None = None
    created_at: str = field(default_factory=utc_now)
    finished_at: str | None = None
    _done: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def finished(self) -> bool:
        return self.state in (SAVED, FAILED)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until saved or failed; False on timeout."""
        return self._done.wait(timeout)

    def finish(self, state: str, error: str | None = None) -> None:
        self.state = state
        self.error = error
        self.finished_at = utc_now()
        self._done.set()

    def as_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "dataset_dir": str(self.dataset_dir),
            "task": self.task,
            "state": self.state,
            "episode_index": self.episode_index,
            "frames": self.frames,
            "quality": self.quality,
            "quality_issues": list(self.quality_issues),
            "error": self.error,
            "warning": self.warning,
            "created_at": self.created_at,
            "finished_at": self.finished_at,
        }


def remove_stale_markers(dataset_dir: Path) -> list[Path]:
    """Saving markers nobody holds (left by a crash): remove them, return what was removed."""
    work = Path(dataset_dir) / layout.WORK_DIR
    removed: list[Path] = []
    if not work.is_dir():
        return removed
    for path in sorted(work.glob("saving-*.lock")):
        try:
            fd = try_flock(path, create=False)
        except FileNotFoundError:
            continue
        if fd is None:  # a writer is committing that episode right now
            continue
        try:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path)
        finally:
            os.close(fd)
    return removed


def leftover_work(dataset_dir: Path) -> list[Path]:
    """Episode work directories under ``.eva-work`` without a crash spool (only crashes leave
    them while no writer runs; spooled episodes are recovered, not removed)."""
    work = Path(dataset_dir) / layout.WORK_DIR
    if not work.is_dir():
        return []
    return sorted(
        p for p in work.iterdir() if p.is_dir() and not p.is_symlink() and not spool.is_spool(p)
    )


def open_dataset_writer(
    root: Path, config: CollectionConfig, *, durable: bool, crash_spool: bool
) -> tuple[DatasetWriter, list[str]]:
    """The writer of the dataset at ``root`` (created when new) for ``config``'s streams, and one
    line for each trace of a crash it met: episodes recovered from their spools, leftover work
    dirs and stale saving markers removed. DatasetError / ValueError: a dataset that does not
    fit the config."""
    # Listed before the writer opens (it removes them), reported only once it holds the
    # dataset: the work dirs of another live writer are not leftovers.
    leftovers = leftover_work(root)
    writer = DatasetWriter.create_or_open(
        root,
        fps=config.fps,
        cameras=[CameraSpec(c.key, c.height, c.width) for c in config.cameras],
        vectors=[VectorSpec(v.name, v.dim, v.names) for v in config.vectors],
        robot_type=config.robot_type,
        video=VideoOptions(
            codec=config.encoder.codec,
            crf=config.encoder.crf,
            preset=config.encoder.preset,
            gop=config.encoder.gop,
        ),
        durable=durable,
        spool=crash_spool,
    )
    found = [recovery.line() for recovery in writer.recovered]
    found += [f"removed leftovers of an interrupted capture session: {p.name}" for p in leftovers]
    found += [f"removed stale saving marker {p.name}" for p in remove_stale_markers(root)]
    return writer, found


def commit_episode(
    job: SaveJob,
    writer: DatasetWriter,
    episode: EpisodeWriter,
    row_fields: Mapping[str, Any],
) -> None:
    """Publish ``episode`` (validation already in ``row_fields``) and finish ``job``."""
    job.state = SAVING
    try:
        if episode.length == 0:
            episode.abort()
            job.episode_index = None
            job.frames = 0
            job.finish(SAVED)
            return
        # The writer holds the saving marker and meta.lock of the eva qc protocol during commit.
        index = episode.commit(row_fields)
        job.episode_index = index
        job.frames = episode.length
        job.finish(SAVED)
    except MetadataNotUpdated as e:
        # The episode is committed (its row is in episodes.jsonl): saved, with the warning.
        job.episode_index = e.episode_index
        job.frames = episode.length
        job.warning = str(e)
        job.finish(SAVED)
    except Exception as e:  # the job records the failure; the recorder keeps running
        episode.abort()
        job.finish(FAILED, error_line(e))
