"""Turn crash spools (``eva.dataset.spool``) into episodes: what ``eva recover`` runs, and what a
``DatasetWriter`` runs as it opens a dataset.

A spooled episode becomes a normal episode of its dataset, holding the prefix every stream has
complete: the rows of the complete record batches and, per camera, the frames of the complete
fragments, cut to the shortest. Its MP4s are packet copies of the spool's first frames (no
re-encoding), its image stats come from decoding them, and its row says what happened: quality
``red`` with the issue ``recovered_after_crash`` (beside the issues STOP's checks found, when
the crash came after them).

Recovery is idempotent and survives its own kill: the spool stays until the episode's row is
committed, and a spool whose commit was already done (``committing.json`` names an index whose
row has its length) is only removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import av
import numpy as np
import pyarrow as pa

from eva.dataset import fsafe, layout, spool
from eva.dataset.episode_writer import RecordedEpisode
from eva.dataset.errors import DatasetError, error_line
from eva.dataset.repair import MetadataNotUpdated, read_meta_jsonl
from eva.dataset.stats import ImageStats
from eva.dataset.video import iter_frame_batches
from eva.timestamps import utc_now

if TYPE_CHECKING:
    from eva.dataset.writer import DatasetWriter

__all__ = ["RECOVERED_CODE", "Recovery", "complete_fragments", "find_spools", "recover_spools"]

RECOVERED_CODE = "recovered_after_crash"


@dataclass(frozen=True)
class Recovery:
    """What became of one spool: an episode (``episode_index``), nothing (no complete frame,
    or committed before the crash), or an ``error`` (the spool stays for another try)."""

    work_dir: Path
    episode_index: int | None = None
    frames: int = 0
    spooled_rows: int = 0
    note: str = ""
    error: str | None = None

    def line(self) -> str:
        if self.error is not None:
            return f"{self.work_dir}: not recovered: {self.error}"
        return f"{self.work_dir.name}: {self.note}"


def find_spools(work_root: Path) -> list[Path]:
    """The episode work dirs under ``work_root`` that hold a crash spool, oldest first."""
    if not work_root.is_dir() or work_root.is_symlink():
        return []
    found = [p for p in work_root.iterdir() if p.is_dir() and not p.is_symlink()]
    found = [p for p in found if spool.is_spool(p)]
    return sorted(found, key=lambda p: ((p / spool.MANIFEST).stat().st_mtime_ns, p.name))


def recover_spools(writer: DatasetWriter) -> list[Recovery]:
    """Recover every spool of ``writer``'s dataset (the caller holds the writer lock)."""
    results = []
    for work_dir in find_spools(writer.work_root):
        try:
            result = recover_spool(writer, work_dir)
        except (DatasetError, OSError, av.error.FFmpegError, pa.ArrowException) as e:
            result = Recovery(work_dir, error=error_line(e))
        results.append(result)
    return results


# ---- reading a spool -----------------------------------------------------------------------


def _manifest(work_dir: Path, writer: DatasetWriter) -> dict[str, Any]:
    """The spool's manifest, checked against the dataset the writer has open."""
    manifest = spool.read_marker(work_dir, spool.MANIFEST)
    where = work_dir / spool.MANIFEST
    if manifest is None or manifest.get("format") != spool.SPOOL_FORMAT:
        raise DatasetError(f"{where}: not an eva episode spool")
    task = manifest.get("task")
    if not isinstance(task, str) or not task.strip():
        raise DatasetError(f"{where}: field task is not a prompt")
    if manifest.get("fps") != writer.fps:
        raise DatasetError(f"{where}: fps {manifest.get('fps')!r} != the dataset's {writer.fps}")
    cameras = [(c.key, c.height, c.width) for c in writer.cameras]
    spooled = [
        (c.get("key"), c.get("height"), c.get("width"))
        for c in _objects(manifest, "cameras", where)
    ]
    if spooled != cameras:
        raise DatasetError(f"{where}: cameras {spooled} are not the dataset's {cameras}")
    vectors = [(v.name, v.dim) for v in writer.vectors]
    spooled_vectors = [(v.get("name"), v.get("dim")) for v in _objects(manifest, "vectors", where)]
    if spooled_vectors != vectors:
        raise DatasetError(f"{where}: vectors {spooled_vectors} are not the dataset's {vectors}")
    return manifest


def _objects(manifest: dict[str, Any], field: str, where: Path) -> list[dict[str, Any]]:
    value = manifest.get(field)
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise DatasetError(f"{where}: field {field} is not a list of objects")
    return value


def _open_spool_file(path: Path, flags: int = os.O_RDONLY) -> int:
    """An fd of a spool file: a regular file, never a link (a planted link would have recovery
    read, truncate or overwrite a file outside the dataset)."""
    return fsafe.open_regular(path, flags)


def read_spooled_rows(path: Path, schema: pa.Schema) -> pa.Table:
    """The complete record batches of a row spool (a batch cut short by a kill is left out)."""
    batches: list[pa.RecordBatch] = []
    try:
        with os.fdopen(_open_spool_file(path), "rb") as source:
            reader = pa.ipc.open_stream(source)
            if not reader.schema.equals(schema):
                raise DatasetError(f"{path}: row schema {reader.schema} is not the dataset's")
            while True:
                try:
                    batches.append(reader.read_next_batch())
                except StopIteration:
                    break
                except (pa.ArrowInvalid, OSError, EOFError):
                    break  # the batch being written when the process died
    except FileNotFoundError:
        pass
    except (pa.ArrowInvalid, OSError, EOFError):
        pass  # killed before the schema reached the file: no rows
    return pa.Table.from_batches(batches, schema=schema)


_HEADER = struct.Struct(">I4s")


def complete_fragments(path: Path) -> int:
    """The length of ``path``'s prefix that ends with its last complete fragment (``moof`` and
    its ``mdat``); 0 when not even the header (``ftyp`` + ``moov``) is complete."""
    try:
        fd = _open_spool_file(path)
    except FileNotFoundError:
        return 0
    with os.fdopen(fd, "rb") as f:
        return _complete_prefix(f.fileno())


def _complete_prefix(fd: int) -> int:
    size = os.fstat(fd).st_size
    end = offset = 0
    seen_moov = pending_moof = False
    while offset + 8 <= size:
        header = os.pread(fd, 16, offset)
        box_size, kind = _HEADER.unpack(header[:8])
        if box_size == 1 and len(header) == 16:  # a 64-bit size follows the type
            box_size = struct.unpack(">Q", header[8:16])[0]
        if box_size < 8 or offset + box_size > size:
            break  # torn: the box was being written when the process died
        offset += box_size
        if kind == b"moov":
            seen_moov = True
        elif kind == b"moof":
            pending_moof = True
        elif kind == b"mdat" and pending_moof and seen_moov:
            pending_moof = False
            end = offset
        elif kind == b"mfra" and seen_moov and not pending_moof:
            end = offset
    return end


def _spooled_frames(path: Path) -> int:
    """Frames in the complete fragments of a camera spool (cutting off a torn last one)."""
    try:
        fd = _open_spool_file(path, os.O_RDWR)
    except FileNotFoundError:
        return 0
    try:
        keep = _complete_prefix(fd)
        if keep == 0:
            return 0
        if os.fstat(fd).st_size != keep:
            os.ftruncate(fd, keep)
        # The fd's own file, whatever the path names by now (no second lookup of the path).
        with av.open(f"/proc/self/fd/{fd}") as container:
            return sum(1 for p in container.demux(video=0) if p.size)
    finally:
        os.close(fd)


def _copy_frames(source: Path, dest: Path, frames: int, fps: int) -> None:
    """The first ``frames`` packets of ``source`` into a regular MP4 (no re-encoding), on the
    time base a recorded MP4 has (1/fps, which the muxer scales as it does for the encoder)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(dest)  # a planted link there would be written through
    fd = _open_spool_file(source)
    try:
        copied = _copy_packets(f"/proc/self/fd/{fd}", dest, frames, fps)
    finally:
        os.close(fd)
    if copied != frames:
        raise DatasetError(f"{source}: {copied} frames, {frames} expected")


def _copy_packets(source: str, dest: Path, frames: int, fps: int) -> int:
    with av.open(source) as inp:
        in_stream = inp.streams.video[0]
        with av.open(str(dest), mode="w", format="mp4") as out:
            out_stream = out.add_stream_from_template(in_stream, opaque=True)
            out_stream.time_base = Fraction(1, fps)
            copied = 0
            for packet in inp.demux(in_stream):
                if packet.dts is None or not packet.size:
                    continue
                if copied == frames:
                    break
                packet.stream = out_stream
                out.mux(packet)
                copied += 1
    return copied


def _image_stats(path: Path) -> tuple[dict[str, Any], list[list[int]]]:
    stats = ImageStats()
    for batch in iter_frame_batches(path, 8):
        stats.update(batch)
    return stats.result(), stats.histogram().tolist()


# ---- recovering ----------------------------------------------------------------------------


def _already_committed(writer: DatasetWriter, work_dir: Path) -> bool:
    marker = spool.read_marker(work_dir, spool.COMMITTING)
    if marker is None:
        return False
    index, length = marker.get("episode_index"), marker.get("length")
    for row in read_meta_jsonl(writer.root / layout.EPISODES):
        if row.get("episode_index") == index:
            return bool(row.get("length") == length)
    return False


def _row_fields(
    work_dir: Path, manifest: dict[str, Any], kept: int, spooled: int
) -> dict[str, Any]:
    """The recovered episode's row: what STOP's checks found (if they ran) plus the recovery."""
    stopped = spool.read_marker(work_dir, spool.STOPPED)
    raw = stopped.get("row_fields") if stopped else None
    fields = dict(raw) if isinstance(raw, dict) else {}
    fields.setdefault("started_at", manifest.get("started_at"))
    issues = [i for i in fields.get("quality_issues") or [] if isinstance(i, dict)]
    fps = manifest["fps"]
    detail = (
        f"recovered after a crash: kept the first {kept} frames ({kept / fps:.2f} s) that every "
        f"stream had complete on disk"
    )
    if stopped is None:
        detail += f" ({spooled} rows were spooled; the end of the recording was lost)"
    issues.append({"severity": "red", "code": RECOVERED_CODE, "detail": detail})
    fields["quality"] = "red"
    fields["quality_issues"] = issues
    fields["recovered_at"] = utc_now()
    return fields


def recover_spool(writer: DatasetWriter, work_dir: Path) -> Recovery:
    """One spool into an episode of ``writer``'s dataset (see the module doc)."""
    manifest = _manifest(work_dir, writer)
    if _already_committed(writer, work_dir):
        shutil.rmtree(work_dir, ignore_errors=True)
        return Recovery(work_dir, note="committed before the crash; spool removed")
    schema = spool.rows_schema([(v.name, v.dim) for v in writer.vectors])
    rows = read_spooled_rows(work_dir / spool.ROWS, schema)
    spools = {c["key"]: work_dir / str(c.get("spool")) for c in manifest["cameras"]}
    for key, path in spools.items():
        if path.parent != work_dir:
            raise DatasetError(f"{work_dir / spool.MANIFEST}: camera {key}: bad spool file name")
    frames = min([rows.num_rows] + [_spooled_frames(p) for p in spools.values()])
    if frames == 0:
        shutil.rmtree(work_dir, ignore_errors=True)
        return Recovery(work_dir, spooled_rows=rows.num_rows, note="no complete frame; removed")
    videos: dict[str, Path] = {}
    image_stats: dict[str, Any] = {}
    histograms: dict[str, list[list[int]]] = {}
    for number, (key, path) in enumerate(spools.items()):
        videos[key] = work_dir / f"{number:02d}.mp4"
        _copy_frames(path, videos[key], frames, writer.fps)
        image_stats[key], histograms[key] = _image_stats(videos[key])
    rows = rows.slice(0, frames)
    vectors = {
        v.name: np.asarray(rows.column(v.name).combine_chunks().flatten(), np.float32).reshape(
            frames, v.dim
        )
        for v in writer.vectors
    }
    episode = RecordedEpisode(
        task=manifest["task"].strip(),
        length=frames,
        vectors=vectors,
        capture_time=np.asarray(rows.column("capture_time"), np.float64),
        image_stats=image_stats,
        histograms=histograms,
        video_files=videos,
        spool_dir=work_dir,
    )
    extra = _row_fields(work_dir, manifest, frames, rows.num_rows)
    try:
        index = writer.commit_episode(episode, extra)
    except MetadataNotUpdated as e:  # committed; info.json / stats.json are repaired later
        index = e.episode_index
    shutil.rmtree(work_dir, ignore_errors=True)
    return Recovery(
        work_dir,
        index,
        frames,
        rows.num_rows,
        note=f"recovered as episode {index} ({frames} frames, red: {RECOVERED_CODE})",
    )
