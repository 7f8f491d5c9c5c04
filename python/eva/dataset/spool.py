"""The crash spool of an episode being recorded: what a ``kill -9`` leaves for ``eva recover``.

While an episode records, its work dir (``<raw>/.eva-work/ep-*/``) holds, beside the MP4s being
encoded (complete only once closed), a spool that is readable at any instant:

- ``spool.json``: the manifest, written before the first frame (task, fps, the cameras and
  vectors, the spool's file names, when recording started);
- ``rows.arrows``: the episode's rows (``capture_time`` and every vector) as an Arrow IPC
  stream, a record batch appended at least every ``SPOOL_INTERVAL_S`` while frames arrive;
- ``NN.spool.mp4`` per camera: the same H.264/AV1 packets as the MP4, muxed into a fragmented
  MP4 whose fragments hold at most ``SPOOL_INTERVAL_S`` of frames (``VideoSpool``);
- ``stopped.json``: the episode row's fields (quality, alignment...) once STOP's checks ran;
- ``committing.json``: the index the episode's commit claimed, written before any file of the
  commit, so a recovery can tell a committed episode from one whose commit was cut short.

A kill loses at most the rows and frames of the last interval plus what the encoder still held
(a few frames of lookahead): ``eva.dataset.recover`` turns the complete prefix into an episode.
Every file is written by plain ``write`` calls: the page cache keeps them across a process
kill (a power loss needs ``fsync``, which the writer's ``durable`` mode applies at commit).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa

from eva.dataset import atomic

__all__ = [
    "COMMITTING",
    "MANIFEST",
    "ROWS",
    "SPOOL_FORMAT",
    "SPOOL_INTERVAL_S",
    "STOPPED",
    "RowSpool",
    "VideoSpool",
    "is_spool",
    "rows_schema",
    "video_spool_name",
    "write_manifest",
]

SPOOL_FORMAT = "eva-episode-spool"
SPOOL_VERSION = 1
MANIFEST = "spool.json"
ROWS = "rows.arrows"
STOPPED = "stopped.json"
COMMITTING = "committing.json"
# Rows are flushed and video fragments cut this often. What a kill loses is this plus how far
# the aligned rows trail the capture, the frames waiting in the encode buffers (up to 12) and the
# encoder's lookahead (10 frames with x264's veryfast preset): under the 2 s that eva promises
# (docs/safety.md; bench/bench_spool.py measures it). 0.5 s lost 1.5-2.5 s on a loaded host.
SPOOL_INTERVAL_S = 0.25


def video_spool_name(camera_number: int) -> str:
    return f"{camera_number:02d}.spool.mp4"


def is_spool(work_dir: Path) -> bool:
    """Whether an episode work dir holds a crash spool (its manifest is written first)."""
    return (work_dir / MANIFEST).is_file() and not (work_dir / MANIFEST).is_symlink()


def write_manifest(
    work_dir: Path,
    *,
    task: str,
    fps: int,
    cameras: Sequence[Mapping[str, Any]],
    vectors: Sequence[Mapping[str, Any]],
    started_at: str,
) -> None:
    """The spool's manifest, written atomically before the first frame."""
    manifest = {
        "format": SPOOL_FORMAT,
        "version": SPOOL_VERSION,
        "task": task,
        "fps": fps,
        "cameras": [dict(c) for c in cameras],
        "vectors": [dict(v) for v in vectors],
        "rows": ROWS,
        "started_at": started_at,
    }
    atomic.atomic_write_json(work_dir / MANIFEST, manifest, durable=False)


def write_marker(work_dir: Path, name: str, content: Mapping[str, Any]) -> None:
    """``stopped.json`` / ``committing.json``: small JSON files, replaced atomically."""
    atomic.atomic_write_json(work_dir / name, dict(content), durable=False)


def read_marker(work_dir: Path, name: str) -> dict[str, Any] | None:
    path = work_dir / name
    try:
        # never through a link; not JSON for any reason (or a NaN eva would write into the
        # recovered episode's row) is a DatasetError naming the file
        return atomic.read_json_object(path, strict=True)
    except FileNotFoundError:
        return None


def rows_schema(vectors: Sequence[tuple[str, int]]) -> pa.Schema:
    """``capture_time`` float64, then each vector as fixed_size_list<float32>[dim]."""
    fields = [pa.field("capture_time", pa.float64())]
    fields += [pa.field(name, pa.list_(pa.float32(), dim)) for name, dim in vectors]
    return pa.schema(fields)


class RowSpool:
    """The episode's rows appended to an Arrow IPC stream, one record batch per interval.

    ``add`` keeps the rows of the current interval (references to the caller's arrays, which
    the episode writer keeps anyway) and writes them as one batch once ``SPOOL_INTERVAL_S`` has
    passed since the last write; ``close`` writes the rest. A stream cut short by a kill reads
    back up to its last complete batch.
    """

    def __init__(self, path: Path, vectors: Sequence[tuple[str, int]]) -> None:
        self.path = path
        self.schema = rows_schema(vectors)
        self._vectors = list(vectors)
        self._sink = pa.OSFile(str(path), "wb")
        self._writer = pa.ipc.new_stream(self._sink, self.schema)
        self._pending: list[tuple[np.ndarray, Mapping[str, np.ndarray]]] = []
        self._written_at = time.monotonic()

    def add(self, capture_time: np.ndarray, vectors: Mapping[str, np.ndarray]) -> None:
        self._pending.append((capture_time, vectors))
        if time.monotonic() - self._written_at >= SPOOL_INTERVAL_S:
            self.flush()

    def flush(self) -> None:
        self._written_at = time.monotonic()
        if not self._pending:
            return
        times = np.concatenate([t for t, _ in self._pending])
        columns: list[pa.Array] = [pa.array(times, pa.float64())]
        for name, dim in self._vectors:
            values = np.concatenate([v[name] for _, v in self._pending]).astype(np.float32)
            columns.append(pa.FixedSizeListArray.from_arrays(values.reshape(-1), dim))
        self._writer.write_batch(pa.record_batch(columns, schema=self.schema))
        self._pending = []

    def close(self) -> None:
        """Write the remaining rows and end the stream (idempotent)."""
        if self._sink.closed:
            return
        try:
            self.flush()
            self._writer.close()
        finally:
            self._sink.close()

    def abandon(self) -> None:
        if not self._sink.closed:
            self._sink.close()


class VideoSpool:
    """A camera's packets, as the encoder makes them, in a fragmented MP4 (``moof`` + ``mdat``
    every ``SPOOL_INTERVAL_S`` at most): each fragment reaches the file as soon as the next
    one starts, and a file cut short reads back up to its last complete fragment."""

    def __init__(self, path: Path, template: av.video.stream.VideoStream) -> None:
        self.path = path
        self._container = av.open(
            str(path),
            mode="w",
            format="mp4",
            options={
                "movflags": "frag_keyframe+empty_moov+default_base_moof",
                "frag_duration": str(int(SPOOL_INTERVAL_S * 1_000_000)),
                "flush_packets": "1",
            },
        )
        try:
            self._stream = self._container.add_stream_from_template(template)
            # The template's parameters leave out the codec's global header (SPS/PPS): without
            # it the fragments' length-prefixed NAL units cannot be read back.
            self._stream.codec_context.extradata = template.codec_context.extradata
        except BaseException:
            self._container.close()
            raise
        self._time_base = template.codec_context.time_base or Fraction(1, 1)

    def write(self, packet: av.Packet[Any]) -> None:
        """Mux a copy of ``packet`` (the MP4's muxer takes the original)."""
        copy = av.Packet(bytes(packet))
        copy.pts = packet.pts
        copy.dts = packet.dts
        copy.time_base = packet.time_base or self._time_base
        copy.is_keyframe = packet.is_keyframe
        copy.stream = self._stream
        self._container.mux(copy)

    def close(self) -> None:
        self._container.close()

    def abandon(self) -> None:
        try:
            self._container.close()
        except Exception:  # the spool is being discarded with its work dir
            return
