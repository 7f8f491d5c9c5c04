"""HDF5 episode files: columns, batched image decode into chunk blocks, and the subset export."""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import re
import threading
import zlib
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import h5py
import numpy as np
import pyarrow as pa
from h5py import h5f, h5p

from eva import libc
from eva.dataset import embedded, layout
from eva.dataset.columns import column_values as column_value  # the `columns` group's values
from eva.dataset.errors import DatasetError, WriteError, naming_write_errors
from eva.dataset.fsafe import Readable, name_of
from eva.dataset.reader import DatasetReader
from eva.dataset.rgb import FrameConverter
from eva.dataset.subset import SubsetMeta
from eva.dataset.video import use_decode_threads
from eva.formats._decode import VideoOpenError, open_video
from eva.formats._direct_io import ALIGN, PositionedWriter, aligned_empty
from eva.formats.base import ExportOptions
from eva.formats.hdf5.items import EPISODE_PATH, FORMAT_NAME, ITEM_NAME, write_mapping
from eva.formats.hdf5.renumber import renumber_episode
from eva.formats.options import HDF5_MAX_CHUNK_BYTES, Hdf5Options
from eva.formats.tasks import EpisodeFormat, EpisodeResult, EpisodeTask

# HDF5's error text carries the errno of a failed write: "... errno = 28, error message ...".
_HDF5_ERRNO = re.compile(r"\berrno = (\d+)")
# Uncompressed files place every allocation of at least this size (the image chunks) at a
# multiple of ALIGN, so that eva can write the chunks past the page cache (formats/_direct_io).
ALIGNMENT_THRESHOLD = 64 * 1024


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
            # aligned: a batch is written to the file straight from this memory (O_DIRECT)
            buffers = [aligned_empty((frames, height, width, 3)) for _ in range(self.COUNT)]
            self._buffers[key] = buffers
        return buffers


def create_file(path: Path, *, aligned: bool) -> h5py.File:
    """A new HDF5 file at ``path`` (h5py's defaults otherwise) that keeps no raw data back: no
    sieve buffer, no chunk cache. Every dataset write reaches the file in its own call, where a
    full disk raises; HDF5 would otherwise write the kept bytes as the dataset closes, and a
    dataset closed by Python's collector fails there unseen ("Exception ignored" on stderr) and
    stays half closed, which later crashes the process (a segfault as its file closes).
    ``aligned``: image chunks at multiples of ALIGN (``ChunkFile``)."""
    fapl = h5p.create(h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5f.LIBVER_EARLIEST, h5f.LIBVER_LATEST)
    if aligned:
        fapl.set_alignment(ALIGNMENT_THRESHOLD, ALIGN)
    fapl.set_sieve_buf_size(0)
    metadata_entries, slots, _, w0 = fapl.get_cache()
    fapl.set_cache(metadata_entries, slots, 0, w0)
    fcpl = h5p.create(h5p.FILE_CREATE)
    fcpl.set_obj_track_times(False)
    return h5py.File(h5f.create(os.fsencode(path), h5f.ACC_TRUNC, fapl=fapl, fcpl=fcpl))


def reserve_space(h5: h5py.File) -> None:
    """Allocate the blocks of all the file's bytes before HDF5 closes it: its close writes the
    metadata it kept back, and a close that fails half way leaves objects HDF5 can neither
    close nor forget. A full disk fails here instead, while the file is still whole (``abandon``
    then closes it). Nothing is reserved where the filesystem cannot allocate ahead."""
    libc.fallocate(h5.id.get_vfd_handle(), 0, h5.id.get_filesize(), keep_size=True)


def abandon(h5: h5py.File) -> None:
    """Close a file a failed write leaves (it is deleted next) without writing to it: its
    descriptor is pointed at an empty file in memory first, so the metadata HDF5 flushes as it
    closes cannot fail on a full disk (a close that fails leaves objects that fail again, as
    "Exception ignored" lines, when Python collects them). The file's bytes are garbage by
    now; reads past what was flushed see zeros, as past the end of a truncated file."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None:
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            scratch = memfd_create("eva-abandoned-hdf5", os.MFD_CLOEXEC)
            try:
                os.dup2(scratch, h5.id.get_vfd_handle(), inheritable=False)
            finally:
                os.close(scratch)
    with contextlib.suppress(Exception):
        h5.close()


def pad_edge_chunk(batch: np.ndarray, count: int, frames_per_chunk: int) -> int:
    """Frames ``batch[:count]`` rounded up to whole chunks, the rest of the last one zeroed
    (HDF5 stores an episode's edge chunk whole); returns that frame count."""
    padded = -(-count // frames_per_chunk) * frames_per_chunk
    if padded > count:
        batch[count:padded] = 0
    return padded


class ChunkFile:
    """The image chunks of an uncompressed dataset, written by eva at the file offsets HDF5
    allocated them (at creation: ``ALLOC_TIME_EARLY``), a run of adjacent chunks per write.

    HDF5 writes nothing into those chunks (``FILL_TIME_NEVER``), so eva's writes through its own
    descriptors never meet HDF5's; the file is complete when HDF5 closes it."""

    def __init__(self, file: Path, dataset: h5py.Dataset) -> None:
        fpc = int(dataset.chunks[0])
        self.frames_per_chunk = fpc
        self.chunk_bytes = fpc * int(np.prod(dataset.shape[1:])) * dataset.dtype.itemsize
        offsets = np.full(-(-int(dataset.shape[0]) // fpc), -1, np.int64)

        def note(info: Any) -> None:
            offsets[info.chunk_offset[0] // fpc] = info.byte_offset

        dataset_id = dataset.id
        try:
            dataset_id.chunk_iter(note)
        except (AttributeError, NotImplementedError):  # HDF5 before 1.14: one call per chunk
            for index in range(dataset_id.get_num_chunks()):
                note(dataset_id.get_chunk_info(index))
        if (offsets < 0).any():
            raise WriteError(f"{file}: HDF5 did not allocate every image chunk of {dataset.name}")
        self.offsets = offsets
        self.writer = PositionedWriter(file)

    def write(self, batch: np.ndarray, start: int, count: int) -> None:
        """batch[:count] at frame ``start`` (chunk-aligned); the episode's last chunk is padded."""
        fpc = self.frames_per_chunk
        padded = pad_edge_chunk(batch, count, fpc)
        first, chunks = start // fpc, padded // fpc
        offsets = self.offsets[first : first + chunks]
        breaks = np.flatnonzero(np.diff(offsets) != self.chunk_bytes) + 1
        bounds = [0, *breaks.tolist(), chunks]
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            self.writer.write_at(int(offsets[a]), batch[a * fpc : b * fpc])

    def close(self) -> None:
        self.writer.close()


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
        videos: Mapping[str, Readable],
        metadata: Mapping[str, Any],
        label: str,
        trim: tuple[int, int] | None = None,
    ) -> int:
        """Write one episode file at ``path`` (via a temporary sibling); return its size in bytes.

        ``columns``: a Parquet table (one row per frame) or a mapping of ready values; every video
        in ``videos`` must decode to exactly as many frames as there are rows (``trim``: its
        frames ``[start, end)``, as many as the rows).
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
        opts = self.options
        compression = {
            "compression": opts.h5py_compression,
            "compression_level": opts.compression_level,
        }
        with self.staged_file(path) as (h5, tmp):
            write_mapping(h5.create_group("columns"), column_values, **compression)
            images = h5.create_group("images")
            for index, (key, video) in enumerate(videos.items()):
                item = images.create_group(ITEM_NAME.format(index))
                item.attrs["key"] = key
                item.attrs["kind"] = "array"
                self.write_camera(item, key, video, rows, label, tmp, trim)
            write_mapping(h5.create_group("metadata"), metadata)
        return path.stat().st_size

    @contextlib.contextmanager
    def staged_file(self, path: Path) -> Iterator[tuple[h5py.File, Path]]:
        """A new HDF5 file written as a temporary sibling of ``path`` (yielded with it), renamed
        to ``path`` once whole; a failure removes it and names ``path``. Uncompressed, its
        chunks are aligned and allocated up front, then written by eva (``ChunkFile``)."""
        tmp = path.with_name(f".eva-tmp-{path.name}")
        try:
            # h5py reports a full disk as "Can't close file (file write failed ...)": name it.
            with naming_write_errors(path):
                h5 = create_file(tmp, aligned=self.options.h5py_compression is None)
                try:
                    yield h5, tmp
                    reserve_space(h5)
                except BaseException:
                    abandon(h5)
                    raise
                h5.close()  # HDF5's last metadata flush, into the blocks reserved for it
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

    # Not cut: the decode thread's hand-off (queues, buffers, stop event) is one try/finally
    def write_camera(
        self,
        item: h5py.Group,
        key: str,
        source: Readable,
        rows: int,
        label: str,
        file: Path,
        trim: tuple[int, int] | None = None,
        name: str = "value",
    ) -> tuple[int, int]:
        """Decode ``source`` (a dataset's MP4: opened beneath its root) into the dataset
        ``item/<name>`` (rows, H, W, 3); returns the frames' (height, width).

        A decode thread (PyAV and the native conversion release the GIL) fills one batch buffer
        while this thread writes the other, so decoding, conversion and I/O overlap. Memory: two
        batches, whatever the episode length. Compressed chunks are HDF5 direct chunk writes.
        Uncompressed ones are allocated by HDF5 when the dataset is made (never filled) and
        written by eva at their file offsets (``file``), past the page cache where it can.
        """
        opts = self.options
        converter = self.converter
        assert converter is not None
        where = f"{label}: camera {key}"
        video = name_of(source)
        try:
            container, stream = open_video(source)
        except VideoOpenError as e:
            raise DatasetError(f"{where}: {e}") from None
        stop = threading.Event()
        free: queue.Queue[int | None] = queue.Queue()
        full: queue.Queue[tuple[int, int] | BaseException | None] = queue.Queue()
        decoder: threading.Thread | None = None
        chunk_file: ChunkFile | None = None
        written = 0
        try:
            use_decode_threads(stream)
            frames: Iterator[av.VideoFrame] = container.decode(stream)
            if trim is not None:  # the kept frames only (decoded up to the last kept one)
                frames = itertools.islice(frames, trim[0], trim[1])
            first = _first_frame(frames, where, video, rows)
            shape = (first.height, first.width)
            dataset = self._create_value(item, shape, rows, where, name)
            if opts.h5py_compression is None:
                chunk_file = ChunkFile(file, dataset)
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
                if chunk_file is not None:
                    chunk_file.write(buffers[index], written, count)
                else:
                    self._flush_compressed(dataset, buffers[index], written, count)
                written += count
                free.put(index)
        finally:
            stop.set()
            free.put(None)  # wake the decoder if it waits for a buffer
            if decoder is not None:
                decoder.join()
            container.close()
            if chunk_file is not None:
                chunk_file.close()
        if written != rows:
            raise DatasetError(
                f"{where}: {video.name} decodes to {written} frames but the table has {rows} rows"
            )
        self.stats.frames += written
        self.stats.bytes += written * shape[0] * shape[1] * 3
        self.stats.native_frames = converter.native_frames
        self.stats.pyav_frames = converter.pyav_frames
        return shape

    def _create_value(
        self, item: h5py.Group, shape: tuple[int, int], rows: int, where: str, name: str
    ) -> h5py.Dataset:
        """The camera's ``value`` dataset, (rows, H, W, 3) uint8 in chunks of
        ``frames_per_chunk`` frames; uncompressed, its chunks are allocated now and never
        filled (eva writes every byte)."""
        opts = self.options
        fpc = opts.frames_per_chunk
        height, width = shape
        chunk_bytes = fpc * height * width * 3
        if chunk_bytes > HDF5_MAX_CHUNK_BYTES:
            raise DatasetError(
                f"{where}: options.hdf5_frames_per_chunk: {fpc} frames of "
                f"{width}x{height} make a {chunk_bytes}-byte chunk, over HDF5's "
                f"{HDF5_MAX_CHUNK_BYTES} (use at most "
                f"{HDF5_MAX_CHUNK_BYTES // (height * width * 3)})"
            )
        dcpl = None
        if opts.h5py_compression is None:
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
            dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)  # every byte is written below
        return item.create_dataset(
            name,
            shape=(rows, *shape, 3),
            maxshape=(None, *shape, 3),
            chunks=(fpc, *shape, 3),
            dtype=np.uint8,
            compression=opts.h5py_compression,
            compression_opts=opts.compression_level,
            dcpl=dcpl,
        )

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

    def _flush_compressed(
        self, dataset: h5py.Dataset, batch: np.ndarray, start: int, count: int
    ) -> None:
        """Write batch[:count] at frame ``start`` (chunk-aligned) into a compressed dataset
        (uncompressed ones are ``ChunkFile``'s)."""
        fpc = self.options.frames_per_chunk
        if self.options.h5py_compression != "gzip":
            # lzf has no Python-side compressor: HDF5's filter pipeline, one whole-chunk block.
            dataset[start : start + count] = batch[:count]
            return
        padded = pad_edge_chunk(batch, count, fpc)
        # HDF5's deflate filter stores a zlib stream: compress the chunks ourselves on every
        # core (zlib releases the GIL) and write the results as already-filtered chunks.
        level = self.options.compression_level
        level = 4 if level is None else level
        blocks = self._pool().map(
            lambda offset: zlib.compress(batch[offset : offset + fpc].data, level),
            range(0, padded, fpc),
        )
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


class Hdf5EpisodeSession:
    """Writes HDF5 episode tasks from one reader; one ``EpisodeWriter`` (its batch buffers,
    converter and compression threads) serves every episode."""

    def __init__(self, reader: DatasetReader, options: ExportOptions) -> None:
        self.reader = reader
        self.writer = EpisodeWriter(options.format_options(Hdf5Options))

    def write(self, task: EpisodeTask) -> EpisodeResult:
        from eva.dataset.subset import rewrite_index_columns
        from eva.dataset.subset_edits import trim_table

        reader, src, new = self.reader, task.source_index, task.index
        table = trim_table(reader.read_table(src), task.trim, task.fps, task.label)
        if table.num_rows != task.length:
            raise DatasetError(
                f"{reader.data_path(src)}: episode {src}: {table.num_rows} rows but "
                f"episodes.jsonl length {task.length}"
            )
        table = rewrite_index_columns(table, new, task.index_offset, dict(task.task_remap))
        videos = {key: reader.video_file(src, key) for key in task.video_keys}
        size = self.writer.write_episode(
            task.subset_dir / task.path,
            columns=table,
            videos=videos,
            metadata=episode_metadata(reader, task),
            label=task.label,
            trim=task.trim,
        )
        return EpisodeResult(task.subset, new, task.path, size, f"{task.subset}/{task.path}")

    def close(self) -> None:
        self.writer.close()


def episode_metadata(reader: DatasetReader, task: EpisodeTask) -> dict[str, Any]:
    """The file's ``metadata`` group: the episode's row and the fps."""
    fps = task.fps if task.fps is not None else getattr(reader, "fps", None)
    return {**task.row, "fps": fps}


def _first_frame(
    frames: Iterator[av.VideoFrame], where: str, video: Path, rows: int
) -> av.VideoFrame:
    """The first decoded frame of a camera's video (one that has none is refused)."""
    try:
        first = next(frames, None)
    except av.FFmpegError as e:
        raise DatasetError(f"{where}: cannot decode {video}: {e}") from None
    if first is None:
        raise DatasetError(f"{where}: {video.name} has no frames, the table has {rows} rows")
    return first


def subset_info(meta: SubsetMeta, options: ExportOptions) -> dict[str, Any]:
    return export_info(meta.info)


# The subset as one task per episode file (eva.formats.tasks.EpisodeFormat).
TASKS = EpisodeFormat(
    path=episode_path,
    label="{subset} episode {index} (source episode {source_index})",
    open_episode_writer=Hdf5EpisodeSession,
    check_options=lambda options: options.format_options(Hdf5Options),
    subset_info=subset_info,
    renumber=renumber_episode,
)
write_subset = TASKS.write_subset
