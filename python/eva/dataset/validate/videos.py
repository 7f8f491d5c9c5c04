"""The MP4 checks of validation: every episode's videos inspected on worker threads while the
parquet checks run (``eva.dataset.decode_check.inspect_video``).

A caller may vouch for files inspected before (``known``: what ``inspected()`` returned then): a
file whose identity (size, mtime, ctime, inode, device) is the one recorded is not inspected
again. Any write to a file, or its replacement, changes that identity (ctime cannot be set
back), so only a file the earlier inspection saw, unchanged, is vouched for."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from eva.dataset import decode_check, mp4box, video
from eva.dataset.errors import DatasetError
from eva.dataset.fsafe import FileBeneath
from eva.dataset.identity import Identity, file_identity, matches
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
        known: Mapping[str, Any] | None = None,
    ) -> None:
        self._root = reader.root
        self._reader = reader
        self._futures: dict[Path, Future[_Inspection]] = {}
        self._known: dict[Path, tuple[int, Identity]] = {}
        self._pool: ThreadPoolExecutor | None = None
        if not enabled or not video_keys or not episodes:
            return
        paths: dict[Path, None] = {}  # in order, once each
        for row in episodes:
            ep = row.get("episode_index")
            if not isinstance(ep, int) or isinstance(ep, bool):
                continue
            for key in video_keys:
                try:
                    path = reader.video_path(ep, key)
                except DatasetError:
                    continue  # reported by _check_episode
                vouched = _vouched(known, self._name(path), path)
                if vouched is not None:
                    self._known[path] = vouched
                else:
                    paths[path] = None
        if not paths:
            return
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, min(VIDEO_CHECK_THREADS, os.cpu_count() or 1)),
            thread_name_prefix="eva-validate",
        )
        for path in paths:
            self._futures[path] = self._pool.submit(_inspect_video, reader.file_beneath(path))

    def _name(self, path: Path) -> str:
        return path.relative_to(self._root).as_posix()

    def inspected(self) -> dict[str, list[int]]:
        """Every MP4 found intact, by its path below the dataset root: [frames, *identity] as
        it was throughout its inspection (or as vouched for): the ``known`` of a later one.
        Waits for the inspections still running."""
        found = {
            self._name(p): [frames, *identity] for p, (frames, identity) in self._known.items()
        }
        for path, future in self._futures.items():
            with contextlib.suppress(Exception):  # cancelled or failed: not vouched for
                frames, unreadable, damaged, identity = future.result()
                if frames is not None and unreadable is None and damaged is None and identity:
                    found[self._name(path)] = [frames, *identity]
        return found

    def __enter__(self) -> VideoInspections:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def result(self, path: Path) -> tuple[int, str | None]:
        if path in self._known:
            return self._known[path][0], None
        future = self._futures.get(path)
        frames, unreadable, damaged, _ = (
            future.result()
            if future is not None
            else _inspect_video(self._reader.file_beneath(path))
        )
        if unreadable is not None or frames is None:
            raise DatasetError(unreadable or f"{path}: cannot be read")
        return frames, damaged


# (frames, unreadable message, damage message, identity throughout the inspection or None)
_Inspection = tuple[int | None, str | None, str | None, Identity | None]


def _vouched(known: Mapping[str, Any] | None, name: str, path: Path) -> tuple[int, Identity] | None:
    """(frames, identity) of a file ``known`` vouches for and that is still the one recorded."""
    entry = known.get(name) if known else None
    if not isinstance(entry, list) or len(entry) != 6:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in entry):
        return None
    identity = file_identity(path)
    return (entry[0], identity) if matches(entry[1:], identity) and identity is not None else None


def _inspect_video(source: FileBeneath) -> _Inspection:
    """The inspection of one MP4 (opened beneath the dataset root by each of its reads), with
    the file's identity when it was the same before and after: never raises a DatasetError, so
    that the result can wait in a future."""
    path = source.path
    before = file_identity(path)
    try:
        frames, unreadable, damaged = decode_check.inspect_video(source), None, None
    except decode_check.UndecodableVideo as e:
        try:
            frames, unreadable, damaged = video.count_frames(source), None, str(e)
        except DatasetError as count_error:
            frames, unreadable, damaged = None, str(count_error), None
    except DatasetError as e:
        frames, unreadable, damaged = None, str(e), None
    # A file changed within SETTLED_NS of the check could be changed again with the same
    # times (the file clock is coarse): not vouched for.
    settled = before is not None and time.time_ns() - before[2] >= mp4box.SETTLED_NS
    same = settled and file_identity(path) == before
    return frames, unreadable, damaged, before if same else None
