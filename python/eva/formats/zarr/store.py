"""Writing one subset's Zarr store (layout: ``eva.formats.zarr``).

The arrays are made by the zarr library (their ``.zarray`` metadata, the groups, the
attributes) and the vector chunks written through it. The camera chunks, one frame each, are
written by eva into the files zarr would write (``<frame>.0.0.0`` in the array's directory: the
raw frame bytes, or numcodecs' Blosc encoding of them, exactly what zarr stores), past the page
cache where the filesystem allows (``eva.formats._direct_io``): a decoded export writes every
pixel, and through the page cache that write costs about as much CPU as the decode.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pyarrow as pa
import zarr

from eva.dataset import layout
from eva.dataset.columns import column_values
from eva.dataset.errors import DatasetError
from eva.dataset.reader import DatasetReader
from eva.dataset.subset import SubsetMeta, rewrite_index_columns
from eva.dataset.subset_edits import kept_frames, trim_table
from eva.dataset.video import FrameSizeError
from eva.formats._direct_io import PositionedWriter, aligned_empty
from eva.formats.options import ZarrOptions

STORE = "replay_buffer.zarr"
# Columns that are no vector feature: the index columns, stored as their own arrays or not at
# all (``index`` and ``frame_index`` follow from the row's position and episode_ends).
INDEX_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
# The per-row arrays besides the features, and their dtypes.
ROW_ARRAYS = {"timestamp": np.float32, "episode_index": np.int64, "task_index": np.int64}
# Rows per chunk of a vector array (at most; fewer in a smaller store): a 14-dim float32 chunk
# is 560 kB, about the size diffusion_policy's own chunking aims at.
VECTOR_CHUNK_ROWS = 10_000
_NUMERIC = ("float", "int", "uint", "bool")


def image_compressor(options: ZarrOptions) -> numcodecs.abc.Codec | None:
    """The camera arrays' codec (None: raw chunks)."""
    if options.image_compressor == "none":
        return None
    return numcodecs.Blosc(
        cname="zstd", clevel=options.compression_level, shuffle=numcodecs.Blosc.SHUFFLE
    )


@dataclass(frozen=True)
class Vector:
    """A numeric feature's array: ``(N, *shape)`` float32, or float64 for a float64 feature
    (an absolute time in float32 would lose its seconds)."""

    shape: tuple[int, ...]
    dtype: type[np.floating[Any]]


def vector_features(features: Mapping[str, Mapping[str, Any]]) -> dict[str, Vector]:
    """The numeric features stored as arrays of their own, with their shapes and dtypes."""
    found: dict[str, Vector] = {}
    for name, feature in features.items():
        dtype = str(feature.get("dtype", ""))
        if name in INDEX_COLUMNS or not dtype.startswith(_NUMERIC):
            continue
        shape = tuple(int(n) for n in feature.get("shape") or [1])
        found[name] = Vector(shape, np.float64 if dtype == "float64" else np.float32)
    return found


def camera_shapes(meta: SubsetMeta) -> dict[str, tuple[int, int, int]]:
    """Each camera's (H, W, 3) frame shape as info.json declares it."""
    shapes: dict[str, tuple[int, int, int]] = {}
    for key in meta.video_keys:
        shape = meta.info.get("features", {}).get(key, {}).get("shape") or []
        if len(shape) != 3 or int(shape[2]) != 3:
            raise DatasetError(f"{layout.INFO}: camera {key}: shape {shape} is not (H, W, 3)")
        shapes[key] = (int(shape[0]), int(shape[1]), 3)
    return shapes


def skipped_features(
    features: Mapping[str, Mapping[str, Any]], cameras: Sequence[str]
) -> list[str]:
    """Features the store has no array for (text, inline images)."""
    kept = {*vector_features(features), *cameras, *INDEX_COLUMNS}
    return [name for name in features if name not in kept]


class RowArray:
    """A ``(N, ...)`` array filled episode by episode through one chunk-sized buffer: each chunk
    is written once, whole (memory: one chunk, whatever N)."""

    def __init__(self, array: zarr.Array) -> None:
        self.array = array
        self.buffer = np.zeros(array.chunks, array.dtype)
        self.filled = 0
        self.start = 0

    def append(self, values: np.ndarray) -> None:
        done = 0
        while done < len(values):
            take = min(len(values) - done, len(self.buffer) - self.filled)
            self.buffer[self.filled : self.filled + take] = values[done : done + take]
            self.filled += take
            done += take
            if self.filled == len(self.buffer):
                self.flush()

    def flush(self) -> None:
        if self.filled:
            self.array[self.start : self.start + self.filled] = self.buffer[: self.filled]
            self.start += self.filled
            self.filled = 0


class CameraChunks:
    """One camera array's chunk files: frame ``i`` is ``<array dir>/<i>.0.0.0``."""

    def __init__(self, directory: Path, codec: numcodecs.abc.Codec | None) -> None:
        self.directory = directory
        self.codec = codec
        self.bytes = 0

    def write(self, batch: np.ndarray, first: int) -> None:
        for offset, frame in enumerate(batch):
            path = self.directory / f"{first + offset}.0.0.0"
            with PositionedWriter(path, create=True) as out:
                if self.codec is None:
                    out.write_at(0, frame)
                    self.bytes += frame.nbytes
                else:
                    data = np.frombuffer(self.codec.encode(frame), np.uint8)
                    out.write_at(0, data)
                    self.bytes += data.nbytes


@dataclass
class EpisodeRows:
    """One exported episode's rows as the store takes them."""

    rows: int
    values: dict[str, np.ndarray]


class StoreWriter:
    """Writes one subset's store: ``create``, then ``write_episode`` in output order, then
    ``finish``."""

    def __init__(self, reader: DatasetReader, meta: SubsetMeta, store: Path, options: ZarrOptions):
        self.reader, self.meta, self.options = reader, meta, options
        self.store = store
        features = meta.info.get("features", {})
        self.vectors = vector_features(features)
        self.cameras = camera_shapes(meta)
        self.root = zarr.open_group(zarr.DirectoryStore(str(store)), mode="w-")
        data = self.root.create_group("data")
        total = meta.total_frames
        rows = max(1, min(total, VECTOR_CHUNK_ROWS))
        self.rows: dict[str, RowArray] = {}
        for name, vector in self.vectors.items():
            shape = vector.shape
            array = data.create_dataset(
                name,
                shape=(total, *shape),
                chunks=(rows, *shape),
                dtype=vector.dtype,
                compressor=None,
            )
            self.rows[name] = RowArray(array)
        for name, dtype in ROW_ARRAYS.items():
            array = data.create_dataset(
                name, shape=(total,), chunks=(rows,), dtype=dtype, compressor=None
            )
            self.rows[name] = RowArray(array)
        codec = image_compressor(options)
        self.chunks: dict[str, CameraChunks] = {}
        for key, shape in self.cameras.items():
            data.create_dataset(
                key, shape=(total, *shape), chunks=(1, *shape), dtype=np.uint8, compressor=codec
            )
            self.chunks[key] = CameraChunks(store / "data" / key, codec)
        # one decode buffer for every episode and camera of a shape
        self.buffers: dict[tuple[int, int, int], np.ndarray] = {}
        self.position = 0

    def episode_rows(self, output: int) -> EpisodeRows:
        """Output episode ``output``'s table, cut to its kept rows and renumbered."""
        meta, reader = self.meta, self.reader
        src = meta.source_index(output)
        label = episode_label(meta, output)
        fps = meta.info.get("fps")
        table = trim_table(reader.read_table(src), meta.trim_of(output), _number(fps), label)
        if table.num_rows != meta.lengths[output]:
            raise DatasetError(
                f"{reader.data_path(src)}: episode {src}: {table.num_rows} rows but "
                f"episodes.jsonl length {meta.lengths[output]}"
            )
        table = rewrite_index_columns(
            table, output, meta.index_offsets[output], meta.task_remap_of(output)
        )
        values = {
            name: _column(table, name, vector.shape, label).astype(vector.dtype)
            for name, vector in self.vectors.items()
        }
        for name, dtype in ROW_ARRAYS.items():
            values[name] = _column(table, name, (), label).astype(dtype)
        return EpisodeRows(table.num_rows, values)

    def write_episode(self, output: int) -> int:
        """Output episode ``output``: its rows, then each camera's frames. Returns its bytes."""
        episode = self.episode_rows(output)
        for name, values in episode.values.items():
            self.rows[name].append(values)
        written = sum(int(v.nbytes) for v in episode.values.values())
        for key in self.cameras:
            written += self._write_camera(output, key, episode.rows)
        self.position += episode.rows
        return written

    def _write_camera(self, output: int, key: str, rows: int) -> int:
        meta, chunks = self.meta, self.chunks[key]
        src, label = meta.source_index(output), episode_label(meta, output)
        shape = self.cameras[key]
        buffer = self.buffers.get(shape)
        if buffer is None:
            buffer = aligned_empty((self.options.batch_frames, *shape))
            self.buffers[shape] = buffer
        before, count = chunks.bytes, 0
        try:
            for batch in self._batches(src, key, buffer, meta.trim_of(output)):
                if count + len(batch) > rows:
                    raise DatasetError(
                        f"{label}: camera {key}: the video has more frames than the {rows} rows"
                    )
                chunks.write(batch, self.position + count)
                count += len(batch)
        except FrameSizeError as e:
            raise DatasetError(
                f"{label}: camera {key}: frames are not {shape[1]}x{shape[0]} as info.json "
                f"declares ({e})"
            ) from None
        if count != rows:
            raise DatasetError(f"{label}: camera {key}: {count} frames but {rows} rows")
        return chunks.bytes - before

    def _batches(
        self, src: int, key: str, buffer: np.ndarray, trim: tuple[int, int] | None
    ) -> Iterator[np.ndarray]:
        batches = self.reader.iter_frames(src, key, len(buffer), out=buffer)
        try:
            yield from kept_frames(batches, trim)
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()  # the video container now, not at garbage collection

    def finish(self, attributes: Mapping[str, Any]) -> None:
        """The vectors' last chunks, ``meta/episode_ends`` and the store's attributes."""
        for rows in self.rows.values():
            rows.flush()
        ends = np.cumsum(np.asarray(self.meta.lengths, np.int64), dtype=np.int64)
        group = self.root.create_group("meta")
        group.create_dataset(
            "episode_ends", data=ends, chunks=(max(1, len(ends)),), dtype=np.int64, compressor=None
        )
        self.root.attrs.put(dict(attributes))


def episode_label(meta: SubsetMeta, output: int) -> str:
    return f"{meta.subset} episode {output} (source episode {meta.source_index(output)})"


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _column(table: pa.Table, name: str, shape: tuple[int, ...], label: str) -> np.ndarray:
    """Column ``name`` as an ``(rows, *shape)`` array (``DatasetError`` naming the episode
    when it is missing or holds another shape)."""
    if name not in table.column_names:
        raise DatasetError(f"{label}: column {name!r} missing")
    values = np.asarray(column_values(table.column(name)))
    try:
        return values.reshape(len(values), *shape)
    except (TypeError, ValueError) as e:
        raise DatasetError(
            f"{label}: column {name!r}: {e} (info.json shape {list(shape)})"
        ) from None
