"""HDF5 export: one file per episode with ``columns``, ``images`` and ``metadata`` groups.

Layout (contracts §6): ``data/chunk-XXX/episode_NNNNNN.hdf5``. Each top-level group is a mapping
stored as ``item_NNNNNN`` sub-groups, each holding a dataset ``value`` and the attributes ``key``
(the original key, which may contain "/" or ".") and ``kind``:

- ``array``: a numeric or bool ndarray or scalar (0-d). A Python ``int``/``float``/``bool`` also
  carries ``python_type`` so it reads back as the same Python type;
- ``string``: UTF-8 variable-length string;
- ``bytes``: 1-D uint8;
- ``none``: an empty uint8 array standing for ``None``;
- ``msgpack``: 1-D uint8 holding MessagePack (contracts §5) of a mapping, list, tuple, or an array
  numpy/HDF5 cannot store natively (strings, objects, complex). Tuples read back as lists.

``columns`` holds every Parquet column (float32 stays float32, fixed-size lists become (n, dim)),
``images`` one (T, H, W, 3) uint8 dataset per camera, chunked along the frame axis and appendable
(maxshape (None, H, W, 3)), ``metadata`` the episodes.jsonl row plus ``fps``.

Speed: the export should run at about the speed of decoding the source videos. Each camera is
decoded with PyAV codec threading, in a decode thread, into one of two reused batch buffers while
this thread writes the other one's chunk-sized slices with direct chunk writes (no per-frame resize
or write, never a whole episode in memory: two batches of at most 32 MiB each). When the
native core is built, yuv420p frames are converted to RGB by the ``h5chunk`` kernel straight into
that buffer through lookup tables calibrated from PyAV's own conversion, so pixels are identical
to ``frame.to_ndarray(format="rgb24")``; a self-check on each video's first frame falls back to
PyAV for that video if they ever differ.

Options: ``Hdf5Options`` (``eva.formats.options``). Frames per chunk (``hdf5_frames_per_chunk``): a chunk is the unit HDF5 reads, writes and
compresses. One frame per chunk gives the cheapest random access (reading frame i touches exactly
one frame) and the smallest write buffer; larger chunks (e.g. 8-32 frames) read sequential clips
with fewer I/O calls and compress better (gzip/lzf see more similar data at once), but reading a
single frame then reads and decompresses the whole chunk.

Compression (``hdf5_compression``: ``none`` | ``gzip[:level]`` | ``lzf``): raw
chunks are written directly and run at disk/page-cache speed; gzip and lzf shrink files but cost
roughly 50-60 MB/s per core, an order of magnitude slower than decoding. gzip chunks are
compressed here with zlib on every core (HDF5's deflate filter stores exactly a zlib stream) and
written as already-filtered direct chunks; lzf datasets are written one whole-chunk block at a time
through HDF5's own filter pipeline. Compression applies to image and column arrays (not to scalar
or metadata items). Frames come from lossy H.264, so compression only trades CPU for disk.
"""

from __future__ import annotations

import os
import queue
import re
import threading
import zlib
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import h5py
import numpy as np
import pyarrow as pa

from eva.dataset import embedded, layout
from eva.dataset.columns import column_values as column_value  # the `columns` group's values
from eva.dataset.errors import DatasetError, WriteError, naming_write_errors
from eva.dataset.msgpack_codec import packb, unpackb
from eva.dataset.reader import DatasetReader
from eva.dataset.rgb import (  # noqa: F401 - re-exported: hdf5.<name> is used by tests and benches
    FrameConverter,
    YuvTables,
    calibrate_yuv420p_luts,
    pack_frame,
    pack_frame_reference,
    yuv420p_to_rgb24_reference,
)
from eva.dataset.subset import SubsetMeta
from eva.dataset.validate import Problem
from eva.formats.base import ExportOptions
from eva.formats.options import (  # noqa: F401 - re-exported: this format's options
    MAX_BATCH_BYTES,
    Hdf5Options,
    parse_compression,
)
from eva.progress import ProgressSink

# HDF5's error text carries the errno of a failed write: "... errno = 28, error message ...".
_HDF5_ERRNO = re.compile(r"\berrno = (\d+)")

FORMAT_NAME = "hdf5"
OPTIONS = Hdf5Options  # this format's options (eva.formats.base.FormatModule)
EPISODE_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.hdf5"
GROUPS = ("columns", "images", "metadata")
KINDS = ("array", "string", "bytes", "none", "msgpack")
ITEM_NAME = "item_{:06d}"
# dtype kinds HDF5 stores natively as an ``array`` item (bool, signed, unsigned, float).
_ARRAY_DTYPE_KINDS = "biuf"

# ---- items: value <-> (kind, dataset) -----------------------------------------------------------


def _python_type(value: Any) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return None


def encode_value(value: Any) -> tuple[str, Any, dict[str, str]]:
    """(kind, data for the ``value`` dataset, extra attributes) of one mapping value."""
    if value is None:
        return "none", np.empty(0, dtype=np.uint8), {}
    if isinstance(value, str):  # also np.str_
        return "string", str(value), {}
    if isinstance(value, bytes | bytearray | memoryview):
        return "bytes", np.frombuffer(bytes(value), dtype=np.uint8), {}
    python_type = _python_type(value)
    if python_type is not None and not isinstance(value, np.generic):
        as_array = np.asarray(value)
        if as_array.dtype.kind in _ARRAY_DTYPE_KINDS:
            return "array", as_array, {"python_type": python_type}
        return "msgpack", np.frombuffer(packb(value), dtype=np.uint8), {}  # int beyond int64
    if isinstance(value, np.ndarray | np.generic):
        as_array = np.asarray(value)
        if as_array.dtype.kind in _ARRAY_DTYPE_KINDS:
            return "array", as_array, {}
        if as_array.dtype.hasobject:
            value = as_array.tolist()
        return "msgpack", np.frombuffer(packb(value), dtype=np.uint8), {}
    if isinstance(value, Mapping | list | tuple):
        return "msgpack", np.frombuffer(packb(value), dtype=np.uint8), {}
    raise TypeError(f"cannot store a {type(value).__name__} in HDF5")


def write_item(
    group: h5py.Group,
    index: int,
    key: str,
    value: Any,
    *,
    compression: str | None = None,
    compression_level: int | None = None,
) -> h5py.Group:
    """Store ``value`` as ``group/item_<index>`` with its ``key`` and ``kind`` attributes."""
    try:
        kind, data, extra_attrs = encode_value(value)
    except (TypeError, ValueError) as e:
        raise DatasetError(f"{group.name}: key {key!r}: {e}") from None
    item = group.create_group(ITEM_NAME.format(index))
    item.attrs["key"] = key
    item.attrs["kind"] = kind
    for name, attr in extra_attrs.items():
        item.attrs[name] = attr
    if kind == "string":
        item.create_dataset("value", data=data, dtype=h5py.string_dtype("utf-8"))
    elif kind == "array" and data.ndim >= 1 and data.size and compression is not None:
        item.create_dataset(
            "value", data=data, compression=compression, compression_opts=compression_level
        )
    else:
        item.create_dataset("value", data=data)
    return item


def write_mapping(group: h5py.Group, mapping: Mapping[str, Any], **compression: Any) -> None:
    for index, (key, value) in enumerate(mapping.items()):
        write_item(group, index, str(key), value, **compression)


def _attr_text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def decode_item(item: h5py.Group) -> Any:
    """The Python value of one ``item_NNNNNN`` group (images stay lazy only via read_episode)."""
    kind = _attr_text(item.attrs["kind"])
    dataset = item["value"]
    if kind == "none":
        return None
    if kind == "string":
        return dataset.asstr()[()]
    if kind == "bytes":
        return dataset[()].tobytes()
    if kind == "msgpack":
        return unpackb(dataset[()].tobytes())
    if kind == "array":
        value = dataset[()]
        python_type = item.attrs.get("python_type")
        if python_type is not None:
            return {"bool": bool, "int": int, "float": float}[_attr_text(python_type)](value)
        return value
    raise DatasetError(f"{item.name}: unknown kind {kind!r}")


def iter_items(group: h5py.Group) -> Iterator[tuple[str, h5py.Group]]:
    """(original key, item group) in item order."""
    for name in sorted(group):
        item = group[name]
        yield _attr_text(item.attrs["key"]), item


def read_mapping(group: h5py.Group) -> dict[str, Any]:
    return {key: decode_item(item) for key, item in iter_items(group)}


# ---- images: decode in batches, pack into chunk blocks ------------------------------------------


class BatchBuffers:
    """Reused (n, H, W, 3) batch buffers keyed by frame shape: no per-episode allocation.

    Two buffers per shape: the decode thread fills one while the writer writes the other.
    """

    COUNT = 2

    def __init__(self) -> None:
        self._buffers: dict[tuple[int, int, int], list[np.ndarray]] = {}

    def get(self, frames: int, height: int, width: int) -> list[np.ndarray]:
        key = (frames, height, width)
        buffers = self._buffers.get(key)
        if buffers is None:
            self._buffers.clear()  # keep one shape alive: bounded memory
            buffers = [
                np.empty((frames, height, width, 3), dtype=np.uint8) for _ in range(self.COUNT)
            ]
            self._buffers[key] = buffers
        return buffers


@dataclass
class ImageWriteStats:
    frames: int = 0
    bytes: int = 0
    native_frames: int = 0
    pyav_frames: int = 0


@dataclass
class EpisodeWriter:
    """Writes episode files; holds the reused buffers and converter across episodes."""

    options: Hdf5Options = field(default_factory=Hdf5Options)
    buffers: BatchBuffers = field(default_factory=BatchBuffers)
    converter: FrameConverter | None = None
    stats: ImageWriteStats = field(default_factory=ImageWriteStats)
    _compress_pool: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.converter is None:
            self.converter = FrameConverter(self.options.native_convert)

    def write_episode(
        self,
        path: Path,
        *,
        columns: Mapping[str, Any] | pa.Table,
        videos: Mapping[str, Path],
        metadata: Mapping[str, Any],
        label: str,
    ) -> int:
        """Write one episode file at ``path`` (via a temporary sibling); return its size in bytes.

        ``columns``: a Parquet table (one row per frame) or a mapping of ready values; every video
        in ``videos`` must decode to exactly as many frames as there are rows.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(columns, pa.Table):
            rows = columns.num_rows
            column_values: Mapping[str, Any] = {
                name: column_value(columns.column(name)) for name in columns.column_names
            }
        else:
            column_values = columns
            lengths = {len(v) for v in column_values.values() if isinstance(v, np.ndarray | list)}
            rows = lengths.pop() if len(lengths) == 1 else 0
        if rows == 0:
            raise DatasetError(
                f"{label}: the episode has no rows (empty episodes are not exported)"
            )
        tmp = path.with_name(f".eva-tmp-{path.name}")
        opts = self.options
        compression = {
            "compression": opts.h5py_compression,
            "compression_level": opts.compression_level,
        }
        try:
            # h5py reports a full disk as "Can't close file (file write failed ...)": name it.
            with naming_write_errors(path), h5py.File(tmp, "w") as h5:
                write_mapping(h5.create_group("columns"), column_values, **compression)
                images = h5.create_group("images")
                for index, (key, video) in enumerate(videos.items()):
                    item = images.create_group(ITEM_NAME.format(index))
                    item.attrs["key"] = key
                    item.attrs["kind"] = "array"
                    self._write_camera(item, key, Path(video), rows, label)
                write_mapping(h5.create_group("metadata"), metadata)
            os.replace(tmp, path)
        except RuntimeError as e:
            tmp.unlink(missing_ok=True)
            # Some HDF5 write failures surface as RuntimeError("... errno = 28, ..."): name them.
            found = _HDF5_ERRNO.search(str(e))
            if found is None:
                raise
            raise WriteError(f"{path}: {os.strerror(int(found.group(1)))}") from e
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return path.stat().st_size

    def _write_camera(self, item: h5py.Group, key: str, video: Path, rows: int, label: str) -> None:
        """Decode ``video`` into ``item/value`` (rows, H, W, 3).

        A decode thread (PyAV and the native conversion release the GIL) fills one batch buffer
        while this thread writes the other with direct chunk writes, so decoding, conversion and
        HDF5 I/O overlap. Memory: two batches, whatever the episode length.
        """
        opts = self.options
        fpc = opts.frames_per_chunk
        converter = self.converter
        assert converter is not None
        where = f"{label}: camera {key}"
        try:
            container = av.open(str(video))
        except (OSError, av.FFmpegError) as e:
            raise DatasetError(f"{where}: cannot open {video}: {e}") from None
        stop = threading.Event()
        free: queue.Queue[int | None] = queue.Queue()
        full: queue.Queue[tuple[int, int] | BaseException | None] = queue.Queue()
        decoder: threading.Thread | None = None
        written = 0
        try:
            if not container.streams.video:
                raise DatasetError(f"{where}: {video} has no video stream")
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            frames = container.decode(stream)
            try:
                first = next(frames, None)
            except av.FFmpegError as e:
                raise DatasetError(f"{where}: cannot decode {video}: {e}") from None
            if first is None:
                raise DatasetError(
                    f"{where}: {video.name} has no frames, the table has {rows} rows"
                )
            shape = (first.height, first.width)
            dataset = item.create_dataset(
                "value",
                shape=(rows, *shape, 3),
                maxshape=(None, *shape, 3),
                chunks=(fpc, *shape, 3),
                dtype=np.uint8,
                compression=opts.h5py_compression,
                compression_opts=opts.compression_level,
            )
            buffers = self.buffers.get(opts.batch_length(shape[0] * shape[1] * 3), *shape)
            converter.start_video(first, buffers[0], 0)
            for index in range(1, len(buffers)):
                free.put(index)

            def decode() -> None:
                try:
                    self._decode_frames(
                        frames, converter, buffers, shape, rows, where, video, stop, free, full
                    )
                except BaseException as e:  # handed to the writer thread, which raises it
                    full.put(e)

            decoder = threading.Thread(target=decode, name=f"eva-hdf5-decode-{key}", daemon=True)
            decoder.start()
            while True:
                message = full.get()
                if message is None:
                    break
                if isinstance(message, BaseException):
                    raise message
                index, count = message
                self._flush(dataset, buffers[index], written, count)
                written += count
                free.put(index)
        finally:
            stop.set()
            free.put(None)  # wake the decoder if it waits for a buffer
            if decoder is not None:
                decoder.join()
            container.close()
        if written != rows:
            raise DatasetError(
                f"{where}: {video.name} decodes to {written} frames but the table has {rows} rows"
            )
        self.stats.frames += written
        self.stats.bytes += written * shape[0] * shape[1] * 3
        self.stats.native_frames = converter.native_frames
        self.stats.pyav_frames = converter.pyav_frames

    @staticmethod
    def _decode_frames(
        frames: Iterator[av.VideoFrame],
        converter: FrameConverter,
        buffers: list[np.ndarray],
        shape: tuple[int, int],
        rows: int,
        where: str,
        video: Path,
        stop: threading.Event,
        free: queue.Queue[int | None],
        full: queue.Queue[tuple[int, int] | BaseException | None],
    ) -> None:
        """Decode thread: convert frames 1.. into the free buffer (frame 0 is in buffers[0])."""
        current, filled, index = 0, 1, 1
        batch = buffers[current]
        try:
            for frame in frames:
                if stop.is_set():
                    return
                if (frame.height, frame.width) != shape:
                    raise DatasetError(
                        f"{where}: frame {index} is {frame.width}x{frame.height}, "
                        f"but the first frame was {shape[1]}x{shape[0]}"
                    )
                if index >= rows:
                    raise DatasetError(
                        f"{where}: {video.name} has more frames than the {rows} table rows"
                    )
                if filled == len(batch):
                    full.put((current, filled))
                    next_buffer = free.get()
                    if next_buffer is None:
                        return
                    current, filled = next_buffer, 0
                    batch = buffers[current]
                converter.convert(frame, batch, filled)
                filled += 1
                index += 1
        except av.FFmpegError as e:
            raise DatasetError(f"{where}: cannot decode {video}: {e}") from None
        full.put((current, filled))
        full.put(None)

    def _flush(self, dataset: h5py.Dataset, batch: np.ndarray, start: int, count: int) -> None:
        """Write batch[:count] at frame ``start``: whole chunks only (``start`` is chunk-aligned)."""
        fpc = self.options.frames_per_chunk
        compression = self.options.h5py_compression
        if compression not in (None, "gzip"):
            # lzf has no Python-side compressor: HDF5's filter pipeline, one whole-chunk block.
            dataset[start : start + count] = batch[:count]
            return
        padded = -(-count // fpc) * fpc
        if padded > count:
            # The last chunk of the episode: HDF5 stores edge chunks whole, so pad it.
            batch[count:padded] = 0
        blocks = [batch[offset : offset + fpc] for offset in range(0, padded, fpc)]
        if compression == "gzip":
            # HDF5's deflate filter stores a zlib stream: compress the chunks ourselves on every
            # core (zlib releases the GIL) and write the results as already-filtered chunks.
            level = self.options.compression_level
            level = 4 if level is None else level
            blocks = list(self._pool().map(lambda block: zlib.compress(block, level), blocks))
        dataset_id = dataset.id
        for offset, block in zip(range(0, padded, fpc), blocks, strict=True):
            dataset_id.write_direct_chunk((start + offset, 0, 0, 0), block)

    def _pool(self) -> ThreadPoolExecutor:
        if self._compress_pool is None:
            self._compress_pool = ThreadPoolExecutor(
                max_workers=max(1, os.cpu_count() or 1), thread_name_prefix="eva-hdf5-gzip"
            )
        return self._compress_pool

    def close(self) -> None:
        """Stop the compression threads (if any were started)."""
        if self._compress_pool is not None:
            self._compress_pool.shutdown()
            self._compress_pool = None

    def __enter__(self) -> EpisodeWriter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


# ---- subset export ------------------------------------------------------------------------------


def episode_path(episode_index: int, chunks_size: int = layout.DEFAULT_CHUNKS_SIZE) -> str:
    chunk = layout.episode_chunk(episode_index, chunks_size)
    return EPISODE_PATH.format(episode_chunk=chunk, episode_index=episode_index)


def export_info(source_info: Mapping[str, Any]) -> dict[str, Any]:
    """The subset's v2.1 info adapted to embedded images (``eva.dataset.embedded``)."""
    return embedded.embedded_images_info(
        source_info, dataset_format=FORMAT_NAME, data_path=EPISODE_PATH
    )


def write_subset(
    reader: DatasetReader,
    meta: SubsetMeta,
    staging_dir: Path,
    progress: ProgressSink,
    options: ExportOptions,
) -> None:
    """Write one quality subset (``SubsetMeta``) of the source ``reader`` as HDF5 episode files
    plus the common metadata into ``staging_dir``."""
    from eva.dataset.subset import write_common_meta

    staging_dir = Path(staging_dir)
    opts = options.format_options(Hdf5Options)
    info = export_info(meta.info)
    chunks_size = int(info.get("chunks_size", layout.DEFAULT_CHUNKS_SIZE))
    fps = meta.info.get("fps", getattr(reader, "fps", None))
    with EpisodeWriter(opts) as writer:
        _write_episodes(writer, reader, meta, staging_dir, progress, chunks_size, fps)
    write_common_meta(staging_dir, meta, info)


def _write_episodes(
    writer: EpisodeWriter,
    reader: DatasetReader,
    meta: SubsetMeta,
    staging_dir: Path,
    progress: ProgressSink,
    chunks_size: int,
    fps: object,
) -> None:
    from eva.dataset.subset import rewrite_index_columns

    for new, src in enumerate(meta.source_episode_indices):
        label = f"{meta.subset} episode {new} (source episode {src})"
        table = reader.read_table(src)
        if table.num_rows != meta.lengths[new]:
            raise DatasetError(
                f"{reader.data_path(src)}: episode {src}: {table.num_rows} rows but "
                f"episodes.jsonl length {meta.lengths[new]}"
            )
        table = rewrite_index_columns(table, new, meta.index_offsets[new], meta.task_remap)
        videos = {key: Path(reader.video_path(src, key)) for key in meta.video_keys}
        rel = episode_path(new, chunks_size)
        size = writer.write_episode(
            staging_dir / rel,
            columns=table,
            videos=videos,
            metadata={**meta.episodes[new], "fps": fps},
            label=label,
        )
        progress(episodes=1, files=1, bytes=size, current=f"{meta.subset}/{rel}")


# ---- reading ------------------------------------------------------------------------------------


@dataclass
class Hdf5Episode:
    """One episode file: decoded ``columns`` and ``metadata``; ``images`` are h5py datasets
    (lazy, valid while the episode is open) or arrays when read with ``load_images=True``."""

    path: Path
    columns: dict[str, Any]
    images: dict[str, Any]
    metadata: dict[str, Any]
    file: h5py.File | None = None

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    def __enter__(self) -> Hdf5Episode:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def read_episode(path: Path | str, *, load_images: bool = False) -> Hdf5Episode:
    """Open an episode file and decode its groups by kind.

    Images stay lazy (h5py datasets: slice the frames you need) unless ``load_images``; use the
    result as a context manager (or call ``close()``) to close the file.
    """
    path = Path(path)
    h5 = h5py.File(path, "r")
    try:
        missing = [g for g in GROUPS if g not in h5]
        if missing:
            raise DatasetError(f"{path}: missing group(s) {', '.join(missing)}")
        columns = read_mapping(h5["columns"])
        metadata = read_mapping(h5["metadata"])
        images: dict[str, Any] = {}
        for key, item in iter_items(h5["images"]):
            images[key] = item["value"][()] if load_images else item["value"]
    except BaseException:
        h5.close()
        raise
    if load_images:
        h5.close()
        return Hdf5Episode(path, columns, images, metadata, None)
    return Hdf5Episode(path, columns, images, metadata, h5)


# ---- verification -------------------------------------------------------------------------------

STATE = layout.STATE
ACTION = layout.ACTION


def _check_items(group: h5py.Group, problem: Callable[[str, str], None]) -> dict[str, h5py.Group]:
    items: dict[str, h5py.Group] = {}
    for name in sorted(group):
        item = group[name]
        if not isinstance(item, h5py.Group) or "value" not in item:
            problem("bad_item", f"{item.name} is not an item group with a value dataset")
            continue
        key, kind = item.attrs.get("key"), item.attrs.get("kind")
        if key is None or kind is None:
            problem("missing_attrs", f"{item.name} lacks the key or kind attribute")
            continue
        if _attr_text(kind) not in KINDS:
            problem("bad_kind", f"{item.name} has unknown kind {_attr_text(kind)!r}")
            continue
        items[_attr_text(key)] = item
    return items


def verify(export_dir: Path) -> list[Problem]:
    """Totals against the episode files, the three groups with key/kind attributes, every image
    value's frame axis against the row count, and a real h5py read of one state, one action and
    one image frame per episode."""
    problems: list[Problem] = []

    def add(code: str, message: str, path: Path, episode: int | None = None) -> None:
        where = f"{path}: episode {episode}" if episode is not None else str(path)
        problems.append(Problem(code, f"{where}: {message}", str(path), episode))

    def verify_file(path: Path, ep: int, row: Mapping[str, Any], info: Mapping[str, Any]) -> int:
        try:
            with h5py.File(path, "r") as h5:
                features = info.get("features", {})
                return _verify_episode(h5, ep, row, embedded.image_keys(info), features, path, add)
        except (OSError, ValueError, KeyError, TypeError) as e:
            add("unreadable_episode", f"cannot read: {e}", path, ep)
            return 0

    embedded.verify_export_files(
        Path(export_dir),
        episode_file=episode_path,
        verify_file=verify_file,
        problem=add,
        missing_code="missing_episode_file",
        file_glob="data/chunk-*/episode_*.hdf5",
    )
    return problems


def _verify_episode(
    h5: h5py.File,
    ep: int,
    row: Mapping[str, Any],
    image_keys: list[str],
    features: Mapping[str, Any],
    path: Path,
    add: Callable[..., None],
) -> int:
    def problem(code: str, message: str) -> None:
        add(code, message, path, ep)

    missing = [g for g in GROUPS if g not in h5]
    if missing:
        problem("missing_group", f"missing group(s) {', '.join(missing)}")
        return 0
    columns = _check_items(h5["columns"], problem)
    images = _check_items(h5["images"], problem)
    _check_items(h5["metadata"], problem)
    rows = row.get("length")
    index_item = columns.get("index")
    if index_item is not None:
        rows_in_file = int(index_item["value"].shape[0])
        if rows_in_file != rows:
            problem("length_mismatch", f"{rows_in_file} rows but episodes.jsonl length {rows}")
            rows = rows_in_file
    else:
        problem("missing_column", "column 'index' missing")
    if not isinstance(rows, int) or rows <= 0:
        problem("empty_episode", "no rows")
        return 0
    for name in (STATE, ACTION):
        if name not in features:
            continue
        item = columns.get(name)
        if item is None:
            problem("missing_column", f"column {name!r} missing")
            continue
        value = np.asarray(item["value"][0])  # real read of one value
        expected = tuple(features[name].get("shape", value.shape))
        if value.shape != expected:
            problem("bad_value", f"{name} has shape {value.shape}, info declares {expected}")
    for key in image_keys:
        if key not in images:
            problem("missing_image", f"images item {key!r} missing")
    for key, item in images.items():
        dataset = item["value"]
        if dataset.ndim != 4 or dataset.shape[3] != 3 or dataset.dtype != np.uint8:
            problem("bad_image", f"images {key!r} is {dataset.shape} {dataset.dtype}")
            continue
        if dataset.shape[0] != rows:
            problem("frame_count", f"images {key!r} has {dataset.shape[0]} frames, {rows} rows")
        expected = features.get(key, {}).get("shape")
        if expected is not None and tuple(expected) != dataset.shape[1:]:
            problem(
                "image_shape", f"images {key!r} frames are {dataset.shape[1:]}, info {expected}"
            )
        frame = dataset[0]  # real read of one frame
        if frame.shape != dataset.shape[1:]:
            problem("bad_image", f"images {key!r} frame 0 reads as {frame.shape}")
    return rows
