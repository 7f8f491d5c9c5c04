"""Writing one episode in the ``foxglove`` MCAP profile (layout: ``eva.formats.mcap.foxglove``).

A camera whose MP4 can be carried (H.264 without B-frames, ``eva.formats.mcap.h264``) goes in as
its own access units, read in large windows and copied once into the chunk: no decode. When
every camera is carried, the records of all the frames a read window holds are written into the
chunk at once (``frame_records``: a native kernel, or numpy under ``EVA_PUREPYTHON=1``; the
JSON rows by ``json_rows``): no Python per message (bench/README.md, ``bench_foxglove.py``). Any other camera
is decoded by the export's per-camera decode feeds (``CameraFeed``) and written as
``foxglove.RawImage`` rgb8, frame by frame. Either way the bytes are the same for the same
messages. Messages are in log-time order: the metadata and quality log at the episode's start,
then per frame index its columns and every camera's frame.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from foxglove_schemas_protobuf.CompressedVideo_pb2 import CompressedVideo
from foxglove_schemas_protobuf.Log_pb2 import Log
from foxglove_schemas_protobuf.RawImage_pb2 import RawImage

from eva.dataset import layout
from eva.dataset.columns import column_values
from eva.dataset.errors import DatasetError
from eva.dataset.fsafe import Readable
from eva.dataset.mp4box import Mp4Error, VideoSamples, read_video_samples
from eva.formats.mcap import foxglove, wire
from eva.formats.mcap.export import (
    CameraFeed,
    McapEpisodeSession,
    camera_batches,
    episode_table,
    result_current,
)
from eva.formats.mcap.frame_records import CameraUnits, JsonColumn, frame_fill
from eva.formats.mcap.h264 import AccessUnitReader, access_units, carry_problem
from eva.formats.mcap.json_rows import json_rows
from eva.formats.mcap.records import Bytes
from eva.formats.mcap.writer import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_COMPRESSION,
    McapEpisodeWriter,
    episode_file,
)
from eva.formats.tasks import EpisodeResult, EpisodeTask

# The subset an episode the split rejects goes to (eva.quality's split names it).
_, REJECTED_SUBSET = layout.SUBSETS


@dataclass(frozen=True)
class CarriedVideo:
    """A camera written from its MP4's samples (``carry_problem`` found nothing against it);
    ``path`` is opened again (beneath the dataset root, for a reader's file) when written."""

    path: Readable
    samples: VideoSamples


# A camera's input: its carried MP4, or an iterator of (n, H, W, 3) uint8 decoded batches.
CameraInput = CarriedVideo | Iterator[np.ndarray]


@dataclass(frozen=True)
class EpisodeContent:
    """What one episode file holds besides its cameras."""

    table: pa.Table  # the episode's rows
    metadata: Mapping[str, Any]  # its episodes.jsonl row
    fps: float
    features: Mapping[str, Any]  # info.json's features (the series names)
    image_features: Sequence[str] = ()  # inline image columns (not carried)
    label: str = ""  # names the episode in errors and warnings
    # The episode's subset is "rejected": the export's split (eva.quality) decided it, and the
    # quality log only reports it (WARNING), so the file and the split never disagree.
    rejected: bool = False


class _Channels:
    """Schema and channel ids handed out in registration order (schemas shared by name)."""

    def __init__(self, writer: McapEpisodeWriter) -> None:
        self.writer = writer
        self.schemas: dict[str, int] = {}
        self.count = 0

    def add(self, topic: str, schema: str, schema_encoding: str, data: bytes, encoding: str) -> int:
        schema_id = self.schemas.get(schema)
        if schema_id is None:
            schema_id = self.schemas[schema] = len(self.schemas) + 1
            self.writer.register_schema(schema_id, schema, schema_encoding, data)
        self.count += 1
        self.writer.register_channel(self.count, topic, encoding, schema_id=schema_id)
        return self.count

    def add_json(self, topic: str, title: str, example: Mapping[str, object]) -> int:
        schema = foxglove.object_schema(title, example)
        return self.add(topic, title, foxglove.JSON_SCHEMA_ENCODING, schema, foxglove.JSON_ENCODING)

    def add_protobuf(self, topic: str, message_class: Any) -> int:
        name, data = foxglove.protobuf_schema(message_class)
        return self.add(
            topic, name, foxglove.PROTOBUF_SCHEMA_ENCODING, data, foxglove.PROTOBUF_ENCODING
        )


@dataclass(frozen=True)
class JsonSeries:
    """One JSON topic's per-frame messages: the schema title, row 0 (which types the schema)
    and one payload per row."""

    title: str
    first: dict[str, object]
    payloads: wire.Ragged  # one JSON object per row


def json_columns(
    table: pa.Table, features: Mapping[str, Any], image_features: Sequence[str]
) -> tuple[dict[str, JsonSeries], list[str]]:
    """Per-frame JSON messages by topic, and the columns that are not numbers or fixed-size
    lists of numbers (not carried by this profile)."""
    rows = table.num_rows
    topics: dict[str, JsonSeries] = {}
    scalars: dict[str, np.ndarray] = {}
    skipped: list[str] = []
    for name in table.column_names:
        if name in image_features:
            skipped.append(name)
            continue
        values = column_values(table.column(name))
        if not isinstance(values, np.ndarray):
            skipped.append(name)
        elif values.ndim == 1:
            scalars[name] = values
        else:
            flat = values.reshape(rows, -1)
            names = foxglove.dimension_names(features.get(name), name, flat.shape[1])
            topics[foxglove.column_topic(name)] = _series(name, names, list(flat.T))
    if scalars:
        topics[foxglove.FRAME_TOPIC] = _series("eva.frame", list(scalars), list(scalars.values()))
    return topics, skipped


def _series(title: str, names: list[str], columns: list[np.ndarray]) -> JsonSeries:
    first = dict(zip(names, [column[0].item() for column in columns], strict=True))
    return JsonSeries(title, first, json_rows(names, columns))


def frame_times(table: pa.Table, start_ns: int, fps: float) -> np.ndarray:
    rows = table.num_rows
    if "timestamp" in table.column_names:
        values = column_values(table.column("timestamp"))
        if isinstance(values, np.ndarray) and values.size == rows:
            return foxglove.frame_times_ns(start_ns, values.reshape(rows))
    return foxglove.frame_times_ns(start_ns, np.arange(rows) / fps)


def write_foxglove_episode(
    path: Path,
    content: EpisodeContent,
    cameras: Mapping[str, CameraInput],
    *,
    compression: str = DEFAULT_COMPRESSION,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    warn: Callable[[str], None] | None = None,
) -> int:
    """Write one episode's MCAP in the foxglove profile at ``path``; return its size in bytes.

    ``cameras`` maps each video key (in channel order) to its input (``CameraInput``). A camera
    with fewer or more frames than the table has rows raises ``DatasetError`` and the partial
    file is removed. ``warn`` gets a line for what could not be written as asked (no
    ``started_at``: times from 0; columns this profile does not carry).
    """
    path = Path(path)
    table, metadata, fps = content.table, content.metadata, content.fps
    label = content.label or path.name
    rows = table.num_rows
    if rows == 0:
        raise DatasetError(f"{label}: empty episode (0 rows)")
    start_ns = foxglove.started_at_ns(metadata)
    if start_ns is None:
        start_ns = 0
        if warn is not None:
            warn(f"{label}: no started_at in episodes.jsonl: times start at 0")
    times = frame_times(table, start_ns, fps)
    columns, skipped = json_columns(table, content.features, content.image_features)
    if skipped and warn is not None:
        warn(f"{label}: columns not carried by the foxglove profile: {', '.join(skipped)}")
    info = {**metadata, "fps": fps}
    with episode_file(
        path,
        compression=compression,
        chunk_size=chunk_size,
        profile=foxglove.PROFILE,
        library=foxglove.LIBRARY,
        # Chunks written in this thread: with no decode to overlap, a flush thread only waits
        # for the GIL this thread holds (bench/README.md, bench_foxglove.py).
        background=False,
    ) as writer:
        channels = _Channels(writer)
        metadata_id = channels.add_json(foxglove.METADATA_TOPIC, "eva.episode", info)
        quality_id = channels.add_protobuf(foxglove.QUALITY_TOPIC, Log)
        camera_ids = {
            key: channels.add_protobuf(
                foxglove.image_topic(key),
                CompressedVideo if isinstance(source, CarriedVideo) else RawImage,
            )
            for key, source in cameras.items()
        }
        column_payloads = {
            channels.add_json(topic, series.title, series.first): series.payloads
            for topic, series in columns.items()
        }
        writer.add_message(metadata_id, 0, start_ns, start_ns, foxglove.json_payload(info))
        for i, log in enumerate(
            foxglove.quality_logs(metadata, start_ns, rejected=content.rejected)
        ):
            writer.add_message(quality_id, i, start_ns, start_ns, log)
        _FrameWriter(writer, times, label).write(cameras, camera_ids, column_payloads)
    return os.stat(path).st_size


class _FrameWriter:
    """Frame index by frame index: the columns' messages, then each camera's frame; decoded
    cameras advance one batch at a time, all of them requested before any is awaited."""

    def __init__(self, writer: McapEpisodeWriter, times: np.ndarray, label: str) -> None:
        self.writer = writer
        self.time_array = times
        self.times = times.tolist()
        self.rows = len(times)
        self.label = label

    def write(
        self,
        cameras: Mapping[str, CameraInput],
        camera_ids: Mapping[str, int],
        columns: Mapping[int, wire.Ragged],
    ) -> None:
        carried = {k: v for k, v in cameras.items() if isinstance(v, CarriedVideo)}
        for key, video in carried.items():
            count = len(video.samples.sizes)
            if count != self.rows:
                raise DatasetError(
                    f"{self.label}: camera {key}: {count} video frames but the table "
                    f"has {self.rows} rows"
                )
        if len(carried) == len(cameras):
            self._write_carried(carried, camera_ids, columns)
            return
        units: dict[str, Iterator[list[Bytes]]] = {}
        feeds: dict[str, CameraFeed] = {}
        try:
            for key, source in cameras.items():
                if isinstance(source, CarriedVideo):
                    units[key] = access_units(source.path, source.samples, self.label)
                else:
                    feeds[key] = CameraFeed(iter(source), f"eva-mcap-decode-{key}")
            self._write_from(list(cameras), camera_ids, columns, units, feeds)
        finally:
            for feed in feeds.values():
                feed.close()
            for iterator in units.values():
                close = getattr(iterator, "close", None)
                if close is not None:
                    close()

    def _write_carried(
        self,
        cameras: Mapping[str, CarriedVideo],
        camera_ids: Mapping[str, int],
        columns: Mapping[int, wire.Ragged],
    ) -> None:
        """Every camera carried: the messages of as many frame indices as every camera's read
        window holds at once, written into the chunk by one record fill (``frame_records``)."""
        readers: dict[str, AccessUnitReader] = {}
        try:
            for key, video in cameras.items():
                readers[key] = AccessUnitReader(video.path, video.samples, self.label)
            json_columns = [JsonColumn(channel, rows) for channel, rows in columns.items()]
            slots = np.array([*columns, *(camera_ids[key] for key in cameras)], np.int64)
            if not len(slots):
                return
            first = 0
            while first < self.rows:
                last = min([r.batch_end(first) for r in readers.values()] + [self.rows])
                units = [
                    CameraUnits(camera_ids[key], key, reader.read(first, last))
                    for key, reader in readers.items()
                ]
                times = self.time_array[first:last]
                self.writer.add_records(
                    np.tile(slots, last - first),
                    np.repeat(times, len(slots)),
                    frame_fill(json_columns, units, times, first),
                )
                first = last
        finally:
            for reader in readers.values():
                reader.close()

    def _write_from(
        self,
        keys: list[str],
        camera_ids: Mapping[str, int],
        columns: Mapping[int, wire.Ragged],
        units: Mapping[str, Iterator[list[Bytes]]],
        feeds: Mapping[str, CameraFeed],
    ) -> None:
        writer, times, rows = self.writer, self.times, self.rows
        column_lists = {channel_id: series.to_list() for channel_id, series in columns.items()}
        batches: dict[str, np.ndarray] = {}
        positions: dict[str, int] = {key: 0 for key in feeds}
        frame_index = 0
        while frame_index < rows:
            needed = [k for k in feeds if k not in batches or positions[k] >= len(batches[k])]
            for key in needed:
                feeds[key].request()
            for key in needed:
                batch = self._next_batch(feeds[key])
                if batch is None:
                    raise DatasetError(
                        f"{self.label}: camera {key} ended early after {frame_index} frames "
                        f"(table has {rows} rows)"
                    )
                batches[key], positions[key] = batch, 0
            count = min([len(batches[k]) - positions[k] for k in feeds] + [rows - frame_index])
            for _ in range(count):
                t = times[frame_index]
                for channel_id, payloads in column_lists.items():
                    writer.add_message(channel_id, frame_index, t, t, payloads[frame_index])
                for key in keys:
                    if key in units:
                        unit = next(units[key])
                        parts = foxglove.compressed_video_parts(t, key, unit)
                    else:
                        parts = foxglove.raw_image_parts(t, key, batches[key][positions[key]])
                        positions[key] += 1
                    writer.add_message_parts(camera_ids[key], frame_index, t, t, parts)
                frame_index += 1
        for key, feed in feeds.items():
            if positions[key] < len(batches[key]):
                trailing = True
            else:
                feed.request()
                trailing = self._next_batch(feed) is not None
            if trailing:
                raise DatasetError(
                    f"{self.label}: camera {key} has trailing frames beyond the {rows} table rows"
                )

    @staticmethod
    def _next_batch(feed: CameraFeed) -> np.ndarray | None:
        batch = feed.result()
        while batch is not None and len(batch) == 0:
            feed.request()
            batch = feed.result()
        return batch


class FoxgloveEpisodeSession(McapEpisodeSession):
    """Writes MCAP episode tasks in the foxglove profile: each camera carried from its MP4
    where it can be, else decoded (into the session's reused buffers). The result counts each
    decoded camera with its reason, and carries the episode's other warnings."""

    def write(self, task: EpisodeTask) -> EpisodeResult:
        reader, opts = self.reader, self.opts
        cameras: dict[str, CameraInput] = {}
        decoded: list[tuple[str, str]] = []
        for key in task.video_keys:
            path = reader.video_file(task.source_index, key)
            try:
                samples = read_video_samples(path)
                why = carry_problem(samples)
            except Mp4Error:
                why = "its MP4 sample table needs FFmpeg to read"
            if task.trim is not None:
                # the carried stream would start at a frame that needs the cut-off ones
                why = "the episode is trimmed"
            if why is None:
                cameras[key] = CarriedVideo(path, samples)
                continue
            decoded.append((key, why))
            cameras[key] = camera_batches(
                reader,
                task.source_index,
                key,
                opts.batch_size,
                self.camera_buffers(task),
                task.label,
                trim=task.trim,
            )
        content = EpisodeContent(
            episode_table(reader, task),
            task.row,
            reader.fps,
            reader.features,
            self.image_features,
            task.label,
            rejected=task.subset == REJECTED_SUBSET,
        )
        warnings: list[str] = []
        size = write_foxglove_episode(
            task.subset_dir / task.path,
            content,
            cameras,
            compression=opts.compression,
            chunk_size=opts.chunk_size,
            warn=lambda line: warnings.append(f"{task.subset}: {line}"),
        )
        return EpisodeResult(
            task.subset,
            task.index,
            task.path,
            size,
            result_current(task),
            warnings=tuple(warnings),
            counted=tuple(decoded),
        )
