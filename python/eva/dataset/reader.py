"""Read a LeRobot v2.1 dataset (eva-written or LeRobot-written, chunked or all in chunk-000).

Metadata (info.json, the jsonl files, stats.json) is read once, lazily, on first use; episode
tables are read per episode on request; video frames are decoded in bounded batches. Every path
the reader hands out is checked to follow no symlink below the dataset root and, if it exists,
to be a regular file (``eva.dataset.fsafe``). Every file the reader reads itself (metadata,
parquet tables and footers) is opened when it is read, beneath the root with no link followed
at any component (``fsafe.open_binary_beneath``), and read from that open file; episode files
read by others (decoders, the box parser, exports) are handed out as ``fsafe.FileBeneath``
(``data_file``, ``video_file``), opened the same way by each reader. What the reader remembers
(checked directories, resolved paths, tables by file identity) is metadata, never a reason to
skip that open.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from eva.dataset import atomic, fsafe, layout, video
from eva.dataset.columns import uniform_float_rows
from eva.dataset.errors import DatasetError
from eva.dataset.identity import Identity, fd_identity
from eva.dataset.info_fields import info_field_problems as info_field_problems  # re-exported

__all__ = ["DatasetReader"]

# Columns that are not data features (they index rows, or they are the video/time bookkeeping).
_BOOKKEEPING = frozenset(
    {"timestamp", "capture_time", "frame_index", "episode_index", "index", "task_index"}
)


def read_columns(parquet: pq.ParquetFile, wanted: list[str]) -> pa.Table:
    """``wanted`` (distinct top-level column names of the file) from the already open file.
    Its ``read(columns=)`` resolves names as column paths (a name may select a nested field's
    children), so the result is checked to be exactly ``wanted``, else the whole table is read
    from the same open file and the columns picked by exact name (a rare name: ``a.b`` beside a
    struct ``a``)."""
    table = parquet.read(columns=wanted, use_threads=False)
    if table.column_names != wanted:
        table = parquet.read(use_threads=False).select(wanted)
    return table


# A parquet file up to this size is read whole and parsed from memory: pyarrow reading a Python
# file object calls back into Python for every read (the footer alone takes several), ~0.1 ms
# of a ~0.4 ms read of a 300-row episode; a larger file is read through the file object.
BUFFERED_PARQUET_BYTES = 1 << 20


def parquet_file(source: BinaryIO) -> pq.ParquetFile:
    """pyarrow's reader of the open file ``source`` (never of a path: see ``open_file``)."""
    if os.fstat(source.fileno()).st_size <= BUFFERED_PARQUET_BYTES:
        return pq.ParquetFile(pa.BufferReader(source.read()))
    return pq.ParquetFile(source)


TABLE_CACHE_BYTES = 64 << 20  # episode tables a reader keeps (see DatasetReader.read_table)


class DatasetReader:
    """Read-only view of one raw v2.1 dataset directory."""

    def __init__(self, root: Path | str, *, root_may_link: bool = True) -> None:
        """``root_may_link``: the root itself may be a symlink (a path the user named is taken
        as given); a server that checked the root is not one passes False."""
        self.root = Path(root)
        self.root_may_link = root_may_link
        if not self.root.is_dir():
            raise DatasetError(f"{self.root}: not a directory")
        # directories below the root already checked to be real directories (not links)
        self._checked_dirs: set[str] = set()
        # episode file paths found (checked, existing) by _resolve_template: a validation and
        # the export after it ask for each one several times
        self._resolved: dict[tuple[str, int, str], Path] = {}
        # whole episode tables read, by episode: a validation reads each one and the export
        # after it reads it again. Served only while the file is the one read (size, times,
        # inode), within TABLE_CACHE_BYTES (oldest dropped first)
        self._tables: OrderedDict[int, tuple[Identity, pa.Table]] = OrderedDict()
        self._table_bytes = 0
        self._tables_lock = threading.Lock()  # exports' episode tasks share a reader on threads

    # ---- metadata ------------------------------------------------------------------------

    def _path(self, rel: str) -> Path:
        """``root / rel``, refusing a symlink or ``..`` in any component below the root, and an
        existing file that is not a regular file (a FIFO would block every later open):
        ``eva.dataset.fsafe.contained``. Checked directories are remembered (each component
        is lstat()ed once per reader)."""
        parent, _, name = rel.rpartition("/")
        if parent and parent not in self._checked_dirs:
            fsafe.contained(self.root, parent, "dir")
            if (self.root / parent).is_dir():
                self._checked_dirs.add(parent)
        return fsafe.contained(self.root / parent if parent else self.root, name, "file")

    def open_file(self, path: Path) -> BinaryIO:
        """``path`` (below the root, as this reader names it) opened now beneath the root with
        no link followed at any component (``fsafe.open_binary_beneath``), whatever was checked
        or remembered before: read the bytes from it, never from the path again. Raises
        ``FileNotFoundError`` when it is missing, ``UnsafePathError`` for a link on its way."""
        rel = path.relative_to(self.root)
        return fsafe.open_binary_beneath(self.root, rel, root_may_link=self.root_may_link)

    def _read(self, rel: str) -> bytes | None:
        """The bytes of ``root / rel``, None when it is missing."""
        path = self.root / rel
        try:
            with self.open_file(path) as f:
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as e:  # EACCES, EIO, EISDIR: one line naming the file
            raise fsafe.os_error(e, path) from None

    def _json(self, rel: str, *, required: bool = True) -> Any:
        path = self.root / rel
        data = self._read(rel)
        if data is None:
            if required:
                raise DatasetError(f"{path}: missing")
            return None
        return atomic.parse_json(data, path)  # any failure: "<path>: unreadable JSON (why)"

    def _jsonl(self, rel: str, *, required: bool) -> list[dict[str, Any]]:
        path = self.root / rel
        data = self._read(rel)
        if data is None:
            if required:
                raise DatasetError(f"{path}: missing")
            return []
        try:
            rows = atomic.parse_jsonl(data, path)
        except ValueError as e:
            raise DatasetError(str(e)) from None
        for lineno, row in enumerate(rows, 1):
            if not isinstance(row, dict):
                raise DatasetError(f"{path}: row {lineno} is not a JSON object")
        return rows

    @cached_property
    def info(self) -> dict[str, Any]:
        info = self._json(layout.INFO)
        path = self.root / layout.INFO
        if not isinstance(info, dict):
            raise DatasetError(f"{path}: not a JSON object")
        problems = info_field_problems(info)
        if problems:
            raise DatasetError(f"{path}: {problems[0]}")
        return info

    @property
    def codebase_version(self) -> str | None:
        return self.info.get("codebase_version")

    @property
    def fps(self) -> int:
        return int(self.info["fps"])

    @property
    def features(self) -> dict[str, dict[str, Any]]:
        return cast(dict[str, dict[str, Any]], self.info["features"])

    @property
    def chunks_size(self) -> int:
        return int(self.info.get("chunks_size") or layout.DEFAULT_CHUNKS_SIZE)

    @cached_property
    def video_keys(self) -> list[str]:
        return [
            self._checked_video_key(k)
            for k, f in self.features.items()
            if f.get("dtype") == "video"
        ]

    def _checked_video_key(self, key: str) -> str:
        """Video keys become directory names: one safe component, or the dataset is refused."""
        try:
            return layout.check_video_key(key)
        except layout.UnsafeNameError as e:
            raise DatasetError(f"{self.root / layout.INFO}: feature {e}") from None

    @cached_property
    def image_keys(self) -> list[str]:
        """Features stored inline as images (dtype "image"), not as MP4s."""
        return [k for k, f in self.features.items() if f.get("dtype") == "image"]

    @cached_property
    def vector_keys(self) -> list[str]:
        """Numeric per-frame features other than the bookkeeping columns (state, action...)."""
        return [
            k
            for k, f in self.features.items()
            if f.get("dtype") not in ("video", "image", "string") and k not in _BOOKKEEPING
        ]

    @cached_property
    def episodes(self) -> list[dict[str, Any]]:
        """episodes.jsonl rows in file order (unknown keys kept as they are)."""
        rows = self._jsonl(layout.EPISODES, required=True)
        path = self.root / layout.EPISODES
        for lineno, row in enumerate(rows, 1):
            ep = row.get("episode_index")
            if not isinstance(ep, int) or isinstance(ep, bool) or ep < 0:
                raise DatasetError(f"{path}: row {lineno}: episode_index {ep!r} is not an int >= 0")
        return rows

    @cached_property
    def _episode_rows(self) -> dict[int, dict[str, Any]]:
        return {row["episode_index"]: row for row in self.episodes}

    @property
    def episode_indices(self) -> list[int]:
        return [row["episode_index"] for row in self.episodes]

    def episode(self, episode_index: int) -> dict[str, Any]:
        try:
            return self._episode_rows[episode_index]
        except KeyError:
            raise DatasetError(
                f"{self.root / layout.EPISODES}: no episode {episode_index}"
            ) from None

    def length(self, episode_index: int) -> int:
        row = self.episode(episode_index)
        value = row.get("length")
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise DatasetError(
                f"{self.root / layout.EPISODES}: episode {episode_index}: length {value!r} invalid"
            )
        return value

    @property
    def total_frames(self) -> int:
        return sum(self.length(e) for e in self.episode_indices)

    @cached_property
    def tasks(self) -> dict[int, str]:
        """task_index -> task text."""
        path = self.root / layout.TASKS
        out: dict[int, str] = {}
        for lineno, row in enumerate(self._jsonl(layout.TASKS, required=False), 1):
            index, text = row.get("task_index"), row.get("task")
            if not isinstance(index, int) or not isinstance(text, str):
                raise DatasetError(f"{path}: row {lineno}: needs int task_index and str task")
            if index in out:
                raise DatasetError(f"{path}: row {lineno}: duplicate task_index {index}")
            out[index] = text
        return out

    @cached_property
    def episodes_stats(self) -> dict[int, dict[str, Any]]:
        """episode_index -> {feature: {min, max, mean, std, count}} (empty if the file is absent)."""
        path = self.root / layout.EPISODES_STATS
        out: dict[int, dict[str, Any]] = {}
        for lineno, row in enumerate(self._jsonl(layout.EPISODES_STATS, required=False), 1):
            ep, stats = row.get("episode_index"), row.get("stats")
            if not isinstance(ep, int) or not isinstance(stats, dict):
                raise DatasetError(
                    f"{path}: row {lineno}: needs int episode_index and stats object"
                )
            out[ep] = stats
        return out

    @cached_property
    def all_image_histograms(self) -> dict[int, dict[str, np.ndarray]]:
        """episode_index -> {video_key: (3, 256) uint64 pixel counts} from eva's sidecar
        ``meta/eva_image_histograms.jsonl`` (empty if absent, as in LeRobot-written datasets).

        The counts are of the frames as given to the writer (before encoding), like the image
        mean/std in episodes_stats.jsonl. A re-committed index (a crash left an orphan row before
        the commit point) keeps its last row; rows of episodes not in episodes.jsonl are dropped.
        """
        path = self.root / layout.IMAGE_HISTOGRAMS
        video_keys = set(self.video_keys)
        out: dict[int, dict[str, np.ndarray]] = {}
        for lineno, row in enumerate(self._jsonl(layout.IMAGE_HISTOGRAMS, required=False), 1):
            ep, hists = row.get("episode_index"), row.get("histograms")
            if not isinstance(ep, int) or isinstance(ep, bool) or not isinstance(hists, dict):
                raise DatasetError(
                    f"{path}: row {lineno}: needs int episode_index and histograms object"
                )
            parsed: dict[str, np.ndarray] = {}
            for key, value in hists.items():
                if key not in video_keys:
                    raise DatasetError(f"{path}: row {lineno}: {key!r} is not a video feature")
                parsed[key] = _histogram_array(value, f"{path}: row {lineno}: {key}")
            out[ep] = parsed
        known = set(self.episode_indices)
        return {ep: h for ep, h in out.items() if ep in known}

    @cached_property
    def kept_histogram_rows(self) -> list[dict[str, Any]]:
        """The rows of eva's cache ``meta/eva_kept_histograms.jsonl`` as read (empty if absent;
        ``eva.dataset.kept_histograms`` decides which rows still hold)."""
        return self._jsonl(layout.KEPT_HISTOGRAMS, required=False)

    def image_histograms(self, episode_index: int) -> dict[str, np.ndarray] | None:
        """The episode's recorded per-camera pixel histograms, or None when it has none."""
        return self.all_image_histograms.get(int(episode_index))

    @cached_property
    def stats(self) -> dict[str, Any]:
        """meta/stats.json (empty dict if absent, as in LeRobot-written v2.1 datasets)."""
        stats = self._json(layout.STATS, required=False)
        if stats is None:
            return {}
        if not isinstance(stats, dict):
            raise DatasetError(f"{self.root / layout.STATS}: not a JSON object")
        return stats

    # ---- paths ---------------------------------------------------------------------------

    def _resolve_template(
        self, template_key: str, default: str, episode_index: int, **fields: str
    ) -> Path:
        cache_key = (template_key, episode_index, fields.get("video_key", ""))
        known = self._resolved.get(cache_key)
        if known is not None:
            return known
        path = self._resolve_uncached(template_key, default, episode_index, **fields)
        if path.exists():
            self._resolved[cache_key] = path
        return path

    def _resolve_uncached(
        self, template_key: str, default: str, episode_index: int, **fields: str
    ) -> Path:
        template = self.info.get(template_key) or default
        chunk = layout.episode_chunk(episode_index, self.chunks_size)
        try:
            rel = layout.format_path_template(
                template, episode_chunk=chunk, episode_index=episode_index, **fields
            )
        except layout.UnsafeNameError as e:
            raise DatasetError(
                f"{self.root / layout.INFO}: field {template_key} {template!r} unusable ({e})"
            ) from None
        path = self._path(rel)
        if chunk != 0 and not path.exists():
            # Older writers put every episode into chunk-000 regardless of chunks_size.
            fallback = self._path(
                layout.format_path_template(
                    template, episode_chunk=0, episode_index=episode_index, **fields
                )
            )
            if fallback.exists():
                return fallback
        return path

    def data_path(self, episode_index: int) -> Path:
        return self._resolve_template("data_path", layout.DATA_PATH, episode_index)

    def file_beneath(self, path: Path) -> fsafe.FileBeneath:
        """``path`` (below the root, as this reader names it) to be opened beneath the root on
        every read: what decoders, the box parser and exports get instead of the path."""
        return fsafe.FileBeneath(self.root, str(path.relative_to(self.root)), self.root_may_link)

    def data_file(self, episode_index: int) -> fsafe.FileBeneath:
        return self.file_beneath(self.data_path(episode_index))

    def video_file(self, episode_index: int, key: str) -> fsafe.FileBeneath:
        return self.file_beneath(self.video_path(episode_index, key))

    def video_path(self, episode_index: int, key: str) -> Path:
        feature = self.features.get(key)
        if not isinstance(feature, dict) or feature.get("dtype") != "video":
            raise DatasetError(f"{self.root / layout.INFO}: no video feature {key!r}")
        self._checked_video_key(key)
        return self._resolve_template("video_path", layout.VIDEO_PATH, episode_index, video_key=key)

    # ---- data ----------------------------------------------------------------------------

    def open_data(self, episode_index: int) -> BinaryIO:
        """The episode's parquet, opened now (``open_file``); ``DatasetError`` when missing."""
        path = self.data_path(episode_index)
        try:
            return self.open_file(path)
        except FileNotFoundError:
            raise DatasetError(f"{path}: episode {episode_index} parquet missing") from None
        except OSError as e:
            raise fsafe.os_error(e, path) from None

    def read_table(self, episode_index: int, columns: Sequence[str] | None = None) -> pa.Table:
        """The episode's parquet table (only ``columns`` if given), read on demand.

        The file is opened on every call; a whole table read before is served again only when
        the file just opened is that one (same identity: size, times, inode, device)."""
        with self.open_data(episode_index) as source:
            return self._read_open_table(episode_index, source, columns)

    def _read_open_table(
        self, episode_index: int, source: BinaryIO, columns: Sequence[str] | None
    ) -> pa.Table:
        path = self.data_path(episode_index)
        identity = None
        try:
            if columns is None:
                identity = fd_identity(source.fileno())
                with self._tables_lock:
                    cached = self._tables.get(episode_index)
                    if cached is not None and cached[0] == identity:
                        self._tables.move_to_end(episode_index)
                        return cached[1]
            # one file, read by its own reader: pq.read_table goes through the dataset layer
            # (discovery, fragments), which costs more than reading a small episode file
            with parquet_file(source) as parquet:
                if columns is None:
                    table = parquet.read(use_threads=False)
                    if identity == fd_identity(source.fileno()):  # not rewritten meanwhile
                        self._remember_table(episode_index, identity, table)
                    return table
                present = set(parquet.schema_arrow.names)
                missing = [c for c in columns if c not in present]
                if missing:  # ParquetFile.read would leave them out without a word
                    raise DatasetError(f"{path}: episode {episode_index}: no column {missing[0]!r}")
                return read_columns(parquet, list(columns))
        except (ValueError, pa.ArrowException, KeyError, OSError) as e:  # a damaged footer too
            raise DatasetError(f"{path}: episode {episode_index}: {e}") from None

    def read_schema(self, episode_index: int) -> tuple[int, pa.Schema]:
        """The episode parquet's size and Arrow schema (without metadata), from its footer."""
        with self.open_data(episode_index) as source:
            try:
                size = os.fstat(source.fileno()).st_size
                with parquet_file(source) as parquet:
                    return size, parquet.schema_arrow.remove_metadata()
            except (pa.ArrowInvalid, OSError) as e:
                path = self.data_path(episode_index)
                raise DatasetError(f"{path}: episode {episode_index}: {e}") from None

    def _remember_table(self, episode: int, identity: Identity, table: pa.Table) -> None:
        with self._tables_lock:
            self._remember_table_locked(episode, identity, table)

    def _remember_table_locked(self, episode: int, identity: Identity, table: pa.Table) -> None:
        old = self._tables.pop(episode, None)
        if old is not None:
            self._table_bytes -= old[1].nbytes
        if table.nbytes > TABLE_CACHE_BYTES // 2:
            return  # a huge episode: not worth the memory
        self._tables[episode] = (identity, table)
        self._table_bytes += table.nbytes
        while self._table_bytes > TABLE_CACHE_BYTES:
            _, (_, dropped) = self._tables.popitem(last=False)
            self._table_bytes -= dropped.nbytes

    def read_vector(self, episode_index: int, column: str) -> np.ndarray:
        """A vector column as an (n, dim) numpy array (scalars as (n,))."""
        table = self.read_table(episode_index, [column])
        chunked = table.column(column)
        arr = chunked.combine_chunks() if chunked.num_chunks != 1 else chunked.chunk(0)
        if pa.types.is_fixed_size_list(arr.type):
            flat = arr.flatten().to_numpy(zero_copy_only=False)
            if arr.null_count or len(flat) != len(arr) * arr.type.list_size:
                raise DatasetError(
                    f"{self.data_path(episode_index)}: episode {episode_index}: column {column} "
                    "has null rows"
                )
            return cast(np.ndarray, flat.reshape(len(arr), arr.type.list_size))
        if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
            rows = uniform_float_rows(arr)
            if rows is not None:
                return rows
            try:
                return np.asarray(arr.to_pylist())
            except ValueError:  # ragged rows
                raise DatasetError(
                    f"{self.data_path(episode_index)}: episode {episode_index}: column {column} "
                    "has rows of different lengths"
                ) from None
        return cast(np.ndarray, arr.to_numpy(zero_copy_only=False))

    def iter_frames(
        self,
        episode_index: int,
        key: str,
        batch_size: int = 32,
        *,
        out: np.ndarray | None = None,
        alternate: bool = False,
    ) -> Iterator[np.ndarray]:
        """Decoded (n, H, W, 3) uint8 RGB batches of one camera of one episode.

        The yielded arrays are views of ONE reused buffer (``out`` if given) and are overwritten by
        the next batch: ``.copy()`` a batch you keep. Memory stays bounded by ``batch_size``.
        ``alternate``: two batches in the buffer, filled in turn (``video.iter_frame_batches``).
        """
        path = self.video_path(episode_index, key)
        if not path.exists():
            raise DatasetError(f"{path}: episode {episode_index} camera {key} video missing")
        source = self.file_beneath(path)
        return video.iter_frame_batches(source, batch_size, out=out, alternate=alternate)

    def count_frames(self, episode_index: int, key: str) -> int:
        """Frames in the camera's MP4 according to the container (no decoding)."""
        path = self.video_path(episode_index, key)
        if not path.exists():
            raise DatasetError(f"{path}: episode {episode_index} camera {key} video missing")
        return video.count_frames(self.file_beneath(path))

    def count_rows(self, episode_index: int) -> int:
        """Rows of the episode's parquet, from the footer (no data read)."""
        with self.open_data(episode_index) as source:
            try:
                with parquet_file(source) as parquet:
                    return cast(int, parquet.metadata.num_rows)
            except (pa.ArrowInvalid, OSError) as e:
                path = self.data_path(episode_index)
                raise DatasetError(f"{path}: episode {episode_index}: {e}") from None


def _histogram_array(value: Any, where: str) -> np.ndarray:
    """A 3 x 256 list of non-negative ints -> (3, 256) uint64; DatasetError naming ``where``.
    (Checked with numpy, not per element: a dataset holds 768 counts per episode and camera.)"""
    try:
        array = np.asarray(value)
    except (ValueError, TypeError):  # ragged lists
        array = None
    if (
        array is None
        or array.shape != (3, 256)
        or array.dtype.kind not in "iu"
        or (array.dtype.kind == "i" and int(array.min()) < 0)
    ):
        raise DatasetError(f"{where}: histogram must be 3 lists of 256 non-negative integers")
    hist = array.astype(np.uint64)
    sums = hist.sum(axis=1)
    if not (sums == sums[0]).all():
        raise DatasetError(f"{where}: channel pixel counts differ ({sums.tolist()})")
    return hist
