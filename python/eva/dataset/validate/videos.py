"""The MP4 checks of validation: every episode's videos inspected on worker threads while the
parquet checks run (``eva.dataset.decode_check.inspect_video``)."""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from eva.dataset import decode_check, video
from eva.dataset.errors import DatasetError
from eva.dataset.reader import DatasetReader

__all__ = ["VIDEO_CHECK_THREADS", "VideoInspections"]

# Threads that inspect MP4s (framing, keyframe decode) while the episode loop checks parquet.
VIDEO_CHECK_THREADS = 2


class VideoInspections:
    """``decode_check.inspect_video`` of every episode's MP4s on worker threads, started before
    the episode loop needs them (the keyframe decode releases the GIL; the parquet checks run
    meanwhile). ``result(path)`` is (frames, damage message or None); an unreadable or
    uncountable file raises its ``DatasetError``."""

    def __init__(
        self,
        reader: DatasetReader,
        episodes: list[dict[str, Any]],
        video_keys: list[str],
        enabled: bool,
    ) -> None:
        self._futures: dict[Path, Future[tuple[int | None, str | None, str | None]]] = {}
        self._pool: ThreadPoolExecutor | None = None
        if not enabled or not video_keys or not episodes:
            return
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, min(VIDEO_CHECK_THREADS, os.cpu_count() or 1)),
            thread_name_prefix="eva-validate",
        )
        for row in episodes:
            ep = row.get("episode_index")
            if not isinstance(ep, int) or isinstance(ep, bool):
                continue
            for key in video_keys:
                try:
                    path = reader.video_path(ep, key)
                except DatasetError:
                    continue  # reported by _check_episode
                if path not in self._futures:
                    self._futures[path] = self._pool.submit(_inspect_video, path)

    def __enter__(self) -> VideoInspections:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def result(self, path: Path) -> tuple[int, str | None]:
        future = self._futures.get(path)
        frames, unreadable, damaged = (
            future.result() if future is not None else _inspect_video(path)
        )
        if unreadable is not None or frames is None:
            raise DatasetError(unreadable or f"{path}: cannot be read")
        return frames, damaged


def _inspect_video(path: Path) -> tuple[int | None, str | None, str | None]:
    """(frames, unreadable message, damage message) of one MP4: never raises a DatasetError, so
    that the result can wait in a future."""
    try:
        return decode_check.inspect_video(path), None, None
    except decode_check.UndecodableVideo as e:
        try:
            return video.count_frames(path), None, str(e)
        except DatasetError as count_error:
            return None, str(count_error), None
    except DatasetError as e:
        return None, str(e), None
