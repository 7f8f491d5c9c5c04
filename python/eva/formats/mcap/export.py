"""The MCAP export of a subset: one episode file per episode, frames decoded camera by camera.

The cameras of an episode are decoded in lockstep by one helper thread each (PyAV releases the
GIL while decoding and converting to RGB), one batch at a time, through the dataset reader's batch
iterator, and written by ``McapEpisodeWriter`` (``eva.formats.mcap.writer``).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from eva.dataset.columns import column_values
from eva.dataset.errors import DatasetError
from eva.dataset.msgpack_codec import encoded_ndarray_size, packb
from eva.dataset.subset_edits import kept_frames
from eva.dataset.video import FrameSizeError
from eva.formats.mcap.layout import (
    EPISODE_SCHEMA_DATA,
    EPISODE_SCHEMA_ENCODING,
    EPISODE_SCHEMA_NAME,
    EPISODE_TOPIC,
    FOXGLOVE_PROFILE,
    MESSAGE_ENCODING,
    episode_path,
    export_info,
    frame_period_ns,
    image_topic,
)
from eva.formats.mcap.renumber import renumber_episode
from eva.formats.mcap.writer import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_COMPRESSION,
    McapEpisodeWriter,
    episode_file,
)
from eva.formats.options import FOXGLOVE_EXTRA_MISSING, McapOptions
from eva.formats.options import FOXGLOVE_MODULES as FOXGLOVE_IMPORTS
from eva.formats.tasks import EpisodeFormat, EpisodeResult, EpisodeTask

if TYPE_CHECKING:
    from eva.dataset.reader import DatasetReader
    from eva.dataset.subset import SubsetMeta
    from eva.formats.base import ExportOptions

# --- episode payload ---------------------------------------------------------------------------


def _inline_image_values(column: pa.ChunkedArray) -> list[object]:
    # LeRobot stores inline images as struct {bytes, path}: keep the encoded bytes as bin values.
    values = column.to_pylist()
    return [v.get("bytes") if isinstance(v, dict) and "bytes" in v else v for v in values]


def episode_payload(
    table: pa.Table, metadata: Mapping[str, object], fps: float, image_features: Sequence[str]
) -> bytes:
    """MessagePack of {"columns", "images", "metadata"} for the ``episode`` message."""
    columns = {
        name: column_values(table.column(name))
        for name in table.column_names
        if name not in image_features
    }
    images = {
        name: _inline_image_values(table.column(name))
        for name in table.column_names
        if name in image_features
    }
    return packb({"columns": columns, "images": images, "metadata": {**metadata, "fps": fps}})


# --- one episode -------------------------------------------------------------------------------


def write_episode_file(
    path: Path,
    *,
    table: pa.Table,
    metadata: Mapping[str, object],
    fps: float,
    frame_batches: Mapping[str, Iterator[np.ndarray]],
    image_features: Sequence[str] = (),
    episode_label: str = "",
    compression: str = DEFAULT_COMPRESSION,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    double_buffered: bool = False,
) -> int:
    """Write one episode's MCAP at ``path``; return its size in bytes.

    ``frame_batches`` maps each video key (in channel order) to an iterator of (n, H, W, 3) uint8
    batches of that camera's decoded frames (batches may be views of a reused buffer). Cameras are
    consumed in lockstep; a camera with fewer or more frames than ``table`` has rows raises
    ``DatasetError`` and the partial file is removed. ``double_buffered``: each iterator fills
    two buffers in turn (``alternate=True``), so each camera decodes its next batch while this
    one is written (``CameraFeed``'s ``ahead``).
    """
    path = Path(path)
    label = episode_label or path.name
    rows = table.num_rows
    if rows == 0:
        raise DatasetError(f"{label}: empty episode (0 rows)")
    keys = list(frame_batches)
    with episode_file(path, compression=compression, chunk_size=chunk_size) as writer:
        writer.register_schema(1, EPISODE_SCHEMA_NAME, EPISODE_SCHEMA_ENCODING, EPISODE_SCHEMA_DATA)
        writer.register_channel(1, EPISODE_TOPIC, MESSAGE_ENCODING, schema_id=1)
        channel_ids = {key: 2 + i for i, key in enumerate(keys)}
        for key in keys:
            writer.register_channel(channel_ids[key], image_topic(key), MESSAGE_ENCODING)
        payload = episode_payload(table, metadata, fps, image_features)
        writer.add_message(1, 0, 0, 0, payload)
        _write_frames(writer, frame_batches, channel_ids, rows, fps, label, double_buffered)
    return os.stat(path).st_size


class CameraFeed:
    """One camera's batch iterator, advanced by a helper thread on request.

    ``request()`` lets the thread decode the next batch, ``result()`` waits for it (None at the
    end; the iterator's exception is re-raised here). All cameras are requested before any result
    is awaited, so their decodes (PyAV releases the GIL for decoding and the RGB conversion) run
    in parallel. The thread touches the iterator only between request and result, and a yielded
    batch (a view of the iterator's reused buffer) stays valid until the next request.

    ``ahead``: for an iterator that fills two buffers in turn (``alternate=True``), the next
    batch is requested as soon as a result is handed out, so the camera decodes batch k+1 while
    the consumer writes batch k; ``request()`` then only asks when nothing is under way, and a
    batch stays valid until the result after it is taken.
    """

    def __init__(self, iterator: Iterator[np.ndarray], name: str, *, ahead: bool = False) -> None:
        self._iterator = iterator
        self._ready: queue.Queue[np.ndarray | BaseException | None] = queue.Queue(maxsize=1)
        self._go = threading.Semaphore(0)
        self._stop = False
        self._ahead = ahead
        self._asked = False  # a request the thread has not answered yet
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._go.acquire()
            if self._stop:
                return
            try:
                batch = next(self._iterator, None)
            except BaseException as error:  # handed to the consumer, raised there
                self._ready.put(error)
                return
            self._ready.put(batch)
            if batch is None:
                return

    def request(self) -> None:
        if not self._asked:
            self._asked = True
            self._go.release()

    def result(self) -> np.ndarray | None:
        item = self._ready.get()
        self._asked = False
        if isinstance(item, BaseException):
            raise item
        if self._ahead and item is not None:
            self.request()
        return item

    def close(self) -> None:
        self._stop = True
        self._go.release()
        self._thread.join()
        close = getattr(self._iterator, "close", None)
        if close is not None:
            close()  # generators: closes the video container now, not at garbage collection


def _write_frames(
    writer: McapEpisodeWriter,
    frame_batches: Mapping[str, Iterator[np.ndarray]],
    channel_ids: Mapping[str, int],
    rows: int,
    fps: float,
    label: str,
    double_buffered: bool = False,
) -> None:
    keys = list(frame_batches)
    if not keys:
        return
    feeds = {
        key: CameraFeed(iter(frame_batches[key]), f"eva-mcap-decode-{key}", ahead=double_buffered)
        for key in keys
    }
    try:
        _write_frames_from(writer, feeds, channel_ids, rows, fps, label)
    finally:
        for feed in feeds.values():
            feed.close()


def _write_frames_from(
    writer: McapEpisodeWriter,
    feeds: Mapping[str, CameraFeed],
    channel_ids: Mapping[str, int],
    rows: int,
    fps: float,
    label: str,
) -> None:
    keys = list(feeds)
    batches: dict[str, np.ndarray] = {}
    positions: dict[str, int] = {}
    sizes: dict[str, int] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    period = frame_period_ns(fps)
    frame_index = 0
    while True:
        needed = [key for key in keys if key not in batches or positions[key] >= len(batches[key])]
        for key in needed:
            feeds[key].request()
        ended = []
        for key in needed:
            batch = feeds[key].result()
            while batch is not None and len(batch) == 0:
                feeds[key].request()
                batch = feeds[key].result()
            if batch is None:
                ended.append(key)
                batches.pop(key, None)
                continue
            batches[key] = batch
            positions[key] = 0
            if key not in shapes:
                shapes[key] = tuple(batch.shape[1:])
                sizes[key] = encoded_ndarray_size(batch[0])
            elif tuple(batch.shape[1:]) != shapes[key]:
                raise DatasetError(
                    f"{label}: camera {key}: frame {frame_index} is {batch.shape[1:]}, "
                    f"earlier frames are {shapes[key]}"
                )
        if ended:
            if len(ended) == len(keys) and frame_index == rows:
                return
            if frame_index < rows:
                raise DatasetError(
                    f"{label}: camera {ended[0]} ended early after {frame_index} frames "
                    f"(table has {rows} rows)"
                )
            extra = next(key for key in keys if key not in ended)
            raise DatasetError(
                f"{label}: camera {extra} has trailing frames beyond the {rows} table rows"
            )
        if frame_index >= rows:
            raise DatasetError(
                f"{label}: camera {keys[0]} has trailing frames beyond the {rows} table rows"
            )
        # All cameras hold frames: write as many frame indices as every current batch covers.
        count = min(len(batches[key]) - positions[key] for key in keys)
        count = min(count, rows - frame_index)
        for _ in range(count):
            log_time = (frame_index + 1) * period
            for key in keys:
                writer.add_ndarray_message(
                    channel_ids[key],
                    frame_index,
                    log_time,
                    log_time,
                    batches[key][positions[key]],
                    sizes[key],
                )
                positions[key] += 1
            frame_index += 1


def check_options(options: ExportOptions) -> None:
    """Options of another format, or the foxglove profile without its extra: refused in the
    driver, before any task runs."""
    if options.format_options(McapOptions).profile == FOXGLOVE_PROFILE:
        foxglove_session_class()


def foxglove_session_class() -> type[McapEpisodeSession]:
    """The foxglove profile's session (``eva.formats.mcap.foxglove_export``), or the one-line
    error naming the extra it needs."""
    try:
        from eva.formats.mcap.foxglove_export import FoxgloveEpisodeSession
    except ImportError as e:
        if e.name is not None and e.name.split(".")[0] in (*FOXGLOVE_IMPORTS, "google"):
            raise DatasetError(f"mcap profile {FOXGLOVE_EXTRA_MISSING}") from None
        raise
    return FoxgloveEpisodeSession


def episode_table(reader: DatasetReader, task: EpisodeTask) -> pa.Table:
    """The task's source table with its index columns renumbered for the subset."""
    return renumbered_table(reader.read_table(task.source_index), task)


def renumbered_table(table: pa.Table, task: EpisodeTask) -> pa.Table:
    """``table`` (the task's source rows) cut to its kept rows and with its index columns
    numbered as ``task`` says."""
    from eva.dataset.subset import rewrite_index_columns
    from eva.dataset.subset_edits import trim_table

    table = trim_table(table, task.trim, task.fps, task.label)
    return rewrite_index_columns(table, task.index, task.index_offset, dict(task.task_remap))


def decode_buffers(
    reader: DatasetReader, video_keys: Sequence[str], batch_size: int, halves: int = 1
) -> dict[str, np.ndarray]:
    """One decode buffer per (h, w, 3) camera, reused for every episode (no per-episode page
    faults); ``camera_batches`` decodes into it (``halves`` = 2: two batches filled in turn)."""
    buffers: dict[str, np.ndarray] = {}
    for key in video_keys:
        shape = reader.features[key].get("shape") or []
        if len(shape) == 3 and int(shape[2]) == 3:
            frames = halves * batch_size
            buffers[key] = np.empty((frames, int(shape[0]), int(shape[1]), 3), np.uint8)
    return buffers


class McapEpisodeSession:
    """Writes MCAP episode tasks (eva-client profile) from one reader; the cameras' decode
    buffers are made once, for the first episode, and reused by every later one."""

    def __init__(self, reader: DatasetReader, options: ExportOptions) -> None:
        self.reader = reader
        self.opts = options.format_options(McapOptions)
        self.image_features = [k for k, f in reader.features.items() if f.get("dtype") == "image"]
        self.buffers: dict[str, np.ndarray] | None = None

    def camera_buffers(self, task: EpisodeTask) -> dict[str, np.ndarray]:
        if self.buffers is None:
            self.buffers = decode_buffers(self.reader, task.video_keys, self.opts.batch_size, 2)
        return self.buffers

    def write(self, task: EpisodeTask) -> EpisodeResult:
        reader, opts = self.reader, self.opts
        buffers = self.camera_buffers(task)
        batches = {
            key: camera_batches(
                reader,
                task.source_index,
                key,
                opts.batch_size,
                buffers,
                task.label,
                alternate=True,
                trim=task.trim,
            )
            for key in task.video_keys
        }
        size = write_episode_file(
            task.subset_dir / task.path,
            table=episode_table(reader, task),
            metadata=task.row,
            fps=reader.fps,
            frame_batches=batches,
            image_features=self.image_features,
            episode_label=task.label,
            compression=opts.compression,
            chunk_size=opts.chunk_size,
            double_buffered=True,
        )
        return EpisodeResult(task.subset, task.index, task.path, size, result_current(task))

    def close(self) -> None:
        self.buffers = None


def result_current(task: EpisodeTask) -> str:
    return f"{task.subset}: {task.path}"


def open_episode_writer(reader: DatasetReader, options: ExportOptions) -> McapEpisodeSession:
    """The session of the options' profile."""
    if options.format_options(McapOptions).profile == FOXGLOVE_PROFILE:
        return foxglove_session_class()(reader, options)
    return McapEpisodeSession(reader, options)


def subset_info(meta: SubsetMeta, options: ExportOptions) -> dict[str, object]:
    return export_info(meta.info, options.format_options(McapOptions).profile)


def decoded_camera_warnings(meta: SubsetMeta, results: Sequence[EpisodeResult]) -> list[str]:
    """Foxglove: one warning per (camera, reason) of the cameras written decoded."""
    decoded: dict[tuple[str, str], int] = {}  # (camera, why) -> episodes written decoded
    for result in results:
        for pair in result.counted:
            decoded[pair] = decoded.get(pair, 0) + 1
    total = len(meta.source_episode_indices)
    return [
        f"{meta.subset}: camera {key}: {why}: written decoded as foxglove.RawImage rgb8 in "
        f"{count} of {total} episodes"
        for (key, why), count in decoded.items()
    ]


# The subset as one task per episode file (eva.formats.tasks.EpisodeFormat); write_subset writes
# it serially with the profile, chunk compression, chunk size and decode batch size of
# McapOptions (the foxglove profile: eva.formats.mcap.foxglove_export). One MCAP export already
# decodes its cameras on a thread each and compresses chunks on another (two cores busy): a pool
# is the default from 4 free cores (on 2 it measured slower than serial, bench/README.md).
TASKS = EpisodeFormat(
    path=episode_path,
    label="episode {index} (source episode {source_index})",
    open_episode_writer=open_episode_writer,
    check_options=check_options,
    subset_info=subset_info,
    subset_warnings=decoded_camera_warnings,
    pool_from_cores=4,
    renumber=renumber_episode,
)
write_subset = TASKS.write_subset


def camera_batches(
    reader: DatasetReader,
    episode_index: int,
    key: str,
    batch_size: int,
    buffers: dict[str, np.ndarray],
    label: str,
    *,
    alternate: bool = False,
    trim: tuple[int, int] | None = None,
) -> Iterator[np.ndarray]:
    """reader.iter_frames into this camera's decode buffer, which every episode reuses
    (``alternate``: a buffer of two batches, filled in turn); ``trim``: the kept frames only."""
    out = buffers.get(key)
    try:
        batches = reader.iter_frames(episode_index, key, batch_size, out=out, alternate=alternate)
        yield from kept_frames(batches, trim)
    except FrameSizeError as e:
        # The reused buffer has the info.json shape; this video has another frame size.
        raise DatasetError(
            f"{label}: camera {key}: video frames are not {out.shape[1:] if out is not None else '?'}"
            f" as declared in info.json ({e})"
        ) from None
