"""Each trimmed episode's pixel histograms over its kept frames: decoded once, when the trim is
set (``eva edit``, the console), and kept in eva's cache ``meta/eva_kept_histograms.jsonl`` so
that no export decodes them again.

Why a cache: a trimmed episode's image stats are those of its kept frames ``[start, end)`` as
decoded from the recorded MP4. The recorder's histograms (``eva_image_histograms.jsonl``) are of
the whole take before encoding, so they cannot be cut down to the kept frames, and decoding the
kept frames costs about three times a v3 export that only copies packets (``bench_edits.py``).

One row per trimmed episode: ``{"episode_index": N, "trim": [start, end], "videos": {key:
{"size": bytes, "mtime_ns": ns, "frames": n, "histogram": [[256 counts] x 3]}}}``. A camera's
entry is used only while it still describes the same frames: the trim equals the episode's
``edit_trim``, the MP4's size and mtime are the recorded ones (an index re-recorded after a
rolled-back crash, or a copied file, is decoded again), and each channel counts ``frames x H x W``
pixels. Anything else (no file, a malformed row, another camera) is decoded by the export as
without the cache: the cache can make an export faster, never different.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eva.dataset import atomic, layout
from eva.dataset.edits import EditError, episode_edits
from eva.dataset.errors import DatasetError
from eva.dataset.locks import meta_lock
from eva.dataset.reader import DatasetReader

__all__ = [
    "BackgroundRecorder",
    "KeptHistogram",
    "kept_histograms",
    "record_kept_histograms",
]

_CHANNELS, _BINS = 3, 256


@dataclass(frozen=True)
class KeptHistogram:
    """One camera's (3, 256) uint64 pixel counts over ``frames`` decoded kept frames."""

    histogram: np.ndarray
    frames: int


def _identity(reader: DatasetReader, episode: int, key: str) -> tuple[int, int]:
    """(size, mtime_ns) of the camera's MP4, read from the file opened beneath the root."""
    fd = reader.video_file(episode, key).open()
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return st.st_size, st.st_mtime_ns


def _decode(reader: DatasetReader, episode: int, key: str, trim: tuple[int, int]) -> KeptHistogram:
    from eva.dataset.stats import ImageStats
    from eva.dataset.subset_edits import kept_frames

    image = ImageStats()
    for batch in kept_frames(reader.iter_frames(episode, key), trim):
        image.update(batch)
    return KeptHistogram(image.histogram(), image.frame_count)


def _pixels(reader: DatasetReader, key: str) -> int | None:
    """H x W of a camera from info.json's shape, None when it does not say."""
    shape = reader.features.get(key, {}).get("shape")
    names = reader.features.get(key, {}).get("names")
    if not isinstance(shape, list) or len(shape) != 3 or not all(type(v) is int for v in shape):
        return None
    if names == ["channels", "height", "width"]:
        return int(shape[1] * shape[2])
    return int(shape[0] * shape[1])


def _parsed(entry: object, pixels: int | None) -> KeptHistogram | None:
    """A cache entry's histogram when it is well formed and whole, else None."""
    if not isinstance(entry, dict):
        return None
    frames, counts = entry.get("frames"), entry.get("histogram")
    if type(frames) is not int or frames < 1 or pixels is None:
        return None
    if not (isinstance(counts, list) and len(counts) == _CHANNELS):
        return None
    rows = []
    for row in counts:
        if not (isinstance(row, list) and len(row) == _BINS):
            return None
        if not all(type(v) is int and 0 <= v < 2**63 for v in row):
            return None
        if sum(row) != frames * pixels:
            return None
        rows.append(row)
    return KeptHistogram(np.array(rows, dtype=np.uint64), frames)


def _cached(reader: DatasetReader, episode: int, trim: tuple[int, int]) -> dict[str, KeptHistogram]:
    """The cameras of ``episode`` whose cache entry still describes frames ``trim`` of its MP4."""
    row = _rows(reader).get(episode)
    if row is None or row.get("trim") != list(trim) or not isinstance(row.get("videos"), dict):
        return {}
    found: dict[str, KeptHistogram] = {}
    for key, entry in row["videos"].items():
        if key not in reader.video_keys or not isinstance(entry, dict):
            continue
        kept = _parsed(entry, _pixels(reader, key))
        try:
            same_file = [entry.get("size"), entry.get("mtime_ns")] == list(
                _identity(reader, episode, key)
            )
        except (OSError, DatasetError):
            same_file = False
        if kept is not None and same_file:
            found[key] = kept
    return found


def _rows(reader: DatasetReader) -> dict[int, dict[str, Any]]:
    """The cache's rows by episode (the last row of an index wins); empty when it is absent or
    unreadable (then everything is decoded)."""
    try:
        rows = reader.kept_histogram_rows
    except DatasetError:
        return {}
    out: dict[int, dict[str, Any]] = {}
    for row in rows:
        ep = row.get("episode_index")
        if type(ep) is int:
            out[ep] = row
    return out


def kept_histograms(
    reader: DatasetReader, episode: int, trim: tuple[int, int]
) -> dict[str, KeptHistogram]:
    """Every camera's pixel histogram over the kept frames ``trim`` of ``episode``: from the
    cache where it is valid, else decoded from the recorded MP4 (frames past ``end`` are not)."""
    found = _cached(reader, episode, trim)
    return {
        key: found[key] if key in found else _decode(reader, episode, key, trim)
        for key in reader.video_keys
    }


def _entry(reader: DatasetReader, episode: int, key: str, kept: KeptHistogram) -> dict[str, Any]:
    size, mtime_ns = _identity(reader, episode, key)
    return {
        "size": size,
        "mtime_ns": mtime_ns,
        "frames": kept.frames,
        "histogram": [[int(v) for v in row] for row in kept.histogram],
    }


def _current_trims(reader: DatasetReader) -> dict[int, tuple[int, int]]:
    """The trims that leave out frames, by episode, as episodes.jsonl holds them now."""
    trims: dict[int, tuple[int, int]] = {}
    for row in reader.episodes:
        with contextlib.suppress(EditError):
            edits = episode_edits(row)
            length = row.get("length")
            if edits.trim is not None and type(length) is int and edits.cuts(length):
                trims[int(row["episode_index"])] = edits.trim
    return trims


def record_kept_histograms(root: Path, episodes: Sequence[int]) -> int:
    """Decode the kept frames of each trimmed episode of ``episodes`` that the cache does not
    hold yet, and rewrite the cache (under the meta lock) with the rows that still match their
    episode's trim: a cleared or changed trim's row goes. Returns the episodes decoded.

    The decodes run before the lock is taken; a row whose trim changed meanwhile is not
    written. Nothing here refuses an edit already written: a camera that does not decode is
    left out, and a dataset this cannot read or write leaves the cache as it was (the export
    then decodes, and reports any problem itself)."""
    root = Path(root)
    try:
        computed = _decode_missing(DatasetReader(root), set(episodes))
        with meta_lock(root):
            _rewrite(root, computed)
    except (DatasetError, OSError):
        return 0
    return len(computed)


def _decode_missing(reader: DatasetReader, wanted: set[int]) -> dict[int, dict[str, Any]]:
    computed: dict[int, dict[str, Any]] = {}
    for ep, trim in sorted(_current_trims(reader).items()):
        if ep not in wanted or set(_cached(reader, ep, trim)) >= set(reader.video_keys):
            continue
        videos: dict[str, Any] = {}
        for key in reader.video_keys:
            try:
                videos[key] = _entry(reader, ep, key, _decode(reader, ep, key, trim))
            except (DatasetError, OSError, ValueError):
                continue
        computed[ep] = {"episode_index": ep, "trim": list(trim), "videos": videos}
    return computed


def _rewrite(root: Path, computed: Mapping[int, dict[str, Any]]) -> None:
    path = root / layout.KEPT_HISTOGRAMS
    # a killed edit's copies of the cache; only rewrites under this lock make them
    atomic.remove_stale_temporaries(path.parent, target=path.name)
    reader = DatasetReader(root)  # the rows as they are now, under the lock
    trims = _current_trims(reader)
    old = _rows(reader)
    rows: list[dict[str, Any]] = []
    for ep in sorted(trims):
        row = computed.get(ep) or old.get(ep)
        if row is not None and row.get("trim") == list(trims[ep]):
            rows.append(row)
    if rows == [old[ep] for ep in sorted(old)]:
        return
    if rows:
        atomic.atomic_write_jsonl(path, rows)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class BackgroundRecorder:
    """``record_kept_histograms`` off a request's path (the console: an in or out mark answers
    at once, and the console may be recording meanwhile): one daemon thread at the lowest CPU
    priority, requests in order. A request that finds its rows recorded already costs a read of
    the cache; an export that starts before a row is written decodes those frames itself."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Path, list[int]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, root: Path, episodes: Sequence[int]) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="eva-kept-histograms", daemon=True
                )
                self._thread.start()
        self._queue.put((Path(root), list(episodes)))

    def _run(self) -> None:
        with contextlib.suppress(OSError):  # this thread only (Linux: a thread's own nice)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while (item := self._queue.get()) is not None:
            record_kept_histograms(*item)

    def close(self) -> None:
        """Finish the requests queued so far (nothing is left half-written), then stop."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()
