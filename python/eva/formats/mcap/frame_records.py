"""The message records of a batch of foxglove frames, straight into the chunk buffer: per frame
index its JSON columns' messages, then each carried camera's ``foxglove.CompressedVideo``.

``frame_fill`` gives the batch's ``RecordFill`` (``eva.formats.mcap.records``): the native
``mcap_chunk.frame_records`` kernel, which writes each record (header, protobuf fields, the JSON
row or the access unit, copied once from the read window) in one pass, unless
``EVA_PUREPYTHON=1``; else ``reference_fill``, the same bytes framed with numpy
(``foxglove.compressed_video_heads``, ``PayloadFill``). The tests compare the two.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from eva._native import load
from eva.formats.mcap import foxglove, wire
from eva.formats.mcap.h264 import UnitBatch
from eva.formats.mcap.records import Bytes, PayloadFill, RecordFill

_native = load("mcap_chunk")


class JsonColumn:
    """A JSON topic of an episode: the payload of frame *f* is row *f* of ``rows``."""

    def __init__(self, channel: int, rows: wire.Ragged) -> None:
        self.channel = channel
        self.rows = rows
        self.flat = rows.flat
        self.starts = np.zeros(len(rows) + 1, np.int64)  # row f: flat[starts[f]:starts[f + 1]]
        np.cumsum(rows.lengths, out=self.starts[1:])

    @functools.cached_property
    def payloads(self) -> list[bytes]:
        return self.rows.to_list()


@dataclass(frozen=True)
class CameraUnits:
    """A carried camera's access units of the batch's frames."""

    channel: int
    frame_id: str  # the video key
    batch: UnitBatch


def frame_fill(
    columns: Sequence[JsonColumn], cameras: Sequence[CameraUnits], times: np.ndarray, first: int
) -> RecordFill:
    """The records of frames ``first`` to ``first + len(times) - 1`` (log times ``times``,
    sequence the frame index): the native kernel's fill, or under ``EVA_PUREPYTHON=1``
    ``reference_fill``."""
    if _native is None:
        return reference_fill(columns, cameras, times, first)
    kernel = _native
    sources: list[tuple[object, ...]] = [(c.channel, c.flat, c.starts) for c in columns]
    sources += [
        (
            camera.channel,
            camera.batch.data,
            camera.batch.starts,
            camera.batch.sizes,
            np.ascontiguousarray(camera.batch.prefixed, bool).view(np.uint8),
            camera.batch.prefix,
            foxglove.frame_id_field(camera.frame_id),
            foxglove.COMPRESSED_VIDEO_TAIL,
        )
        for camera in cameras
    ]
    stamps = np.ascontiguousarray(times, np.int64)

    def fill(
        buffer: bytearray | memoryview,
        used: int,
        chunk_size: int,
        message: int,
        offsets: np.ndarray,
    ) -> tuple[int, int, int]:
        done, used, needed = kernel.frame_records(
            sources, stamps, first, message, buffer, used, chunk_size, offsets
        )
        return int(done), int(used), int(needed)

    return fill


def reference_fill(
    columns: Sequence[JsonColumn], cameras: Sequence[CameraUnits], times: np.ndarray, first: int
) -> PayloadFill:
    """``frame_fill``'s records framed with numpy: each camera's ``CompressedVideo`` heads for
    the whole batch, the JSON rows and access units as the messages' data."""
    count = len(times)
    heads = [wire.Ragged.empty(count)] * len(columns) + [
        foxglove.compressed_video_heads(
            times, camera.frame_id, camera.batch.sizes, camera.batch.prefix, camera.batch.prefixed
        )
        for camera in cameras
    ]
    datas: list[Bytes] = [
        data
        for frame in zip(
            *(column.payloads[first : first + count] for column in columns),
            *(camera.batch.units for camera in cameras),
            strict=True,
        )
        for data in frame
    ]
    # After the data: nothing for a column, the format for a camera (the same each frame).
    tail = foxglove.COMPRESSED_VIDEO_TAIL
    tail_lengths = np.array([0] * len(columns) + [len(tail)] * len(cameras), np.int64)
    tails = wire.Ragged(
        np.tile(np.frombuffer(tail * len(cameras), np.uint8), count), np.tile(tail_lengths, count)
    )
    slots = len(columns) + len(cameras)
    channels = np.array([c.channel for c in columns] + [c.channel for c in cameras], np.int64)
    return PayloadFill(
        np.tile(channels, count),
        np.repeat(np.arange(first, first + count), slots),
        np.repeat(np.asarray(times, np.int64), slots),
        wire.interleave(heads),
        datas,
        tails,
    )
