"""Raw v2.1 writer: the cost of appending one episode must not grow with the dataset.

``report(quick)`` rows (best of several alternating appends, measured in this run):

* append one episode (30 frames, 1 camera 64x48, 14-dim state/action) to a dataset that already
  holds 200 episodes, against the same append to a 10-episode dataset. ``ratio`` =
  t(10) / t(200): ~1 means the append cost is independent of the dataset size.
* the same comparison with durable writes (fsync of every file and directory), the production
  setting; fsync latency is noisy on shared machines.
* the metadata work a naive writer would add per append at 200 episodes (re-reading
  episodes.jsonl + episodes_stats.jsonl and re-merging all stats), against the append itself.
* one jsonl row appended to a 2000-row episodes_stats.jsonl in place (what the writer does)
  against copy + rename (``append_by_copy``, the way eva no longer appends), whose cost grows
  with the file.
* reader side: ``iter_frame_batches`` at 640x480 (decode, rgb24, copy into the reused buffer)
  against decoding alone (no pixel conversion).
* ``count_frames`` (MP4 box parse, what the validator calls per camera per episode) against
  opening the file with PyAV for its frame count.
* ``DatasetReader.read_table`` (the file opened beneath the root on every read, pyarrow reading
  from that open file) against pyarrow opening the path itself (the reader before issue 27),
  for a whole large episode (too large for the reader's table cache) and for one column of a
  300-frame episode (the console's series, the export's stats).

The 10/200-episode datasets are built cheaply: 2 frames of 16x16 per episode, no fsync.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from eva.capture.synthetic import (
    SyntheticScene,
    joint_actions,
    joint_states,
    write_synthetic_dataset,
)
from eva.dataset import atomic, layout
from eva.dataset.stats import merge_stats
from eva.dataset.video import (
    VideoEncoder,
    VideoOptions,
    count_decoded_frames,
    count_frames,
    iter_frame_batches,
)
from eva.dataset.writer import CameraSpec, DatasetWriter, VectorSpec

CAMERA = "observation.images.front"
HEIGHT, WIDTH = 48, 64
APPEND_FRAMES = 30


def _writer(root: Path, durable: bool) -> DatasetWriter:
    return DatasetWriter.create_or_open(
        root,
        fps=30,
        cameras=[CameraSpec(CAMERA, HEIGHT, WIDTH)],
        vectors=[VectorSpec("observation.state", 14), VectorSpec("action", 14)],
        robot_type="bench",
        durable=durable,
    )


def _episode(writer: DatasetWriter, frames: int, images: np.ndarray, seed: int) -> None:
    episode = writer.begin_episode(f"task {seed % 3}")
    episode.add_frames(
        images={CAMERA: images[:frames]},
        vectors={
            "observation.state": joint_states(0, frames, seed=seed),
            "action": joint_actions(0, frames, seed=seed),
        },
    )
    episode.commit({"quality": "green", "quality_issues": [], "duration_seconds": frames / 30})


def build_dataset(root: Path, episodes: int) -> Path:
    """``episodes`` tiny episodes written through the real writer (no fsync, 2 frames each)."""
    images = SyntheticScene(HEIGHT, WIDTH, seed=1).frames(0, 2)
    with _writer(root, durable=False) as writer:
        for i in range(episodes):
            _episode(writer, 2, images, i)
    return root


def time_appends(roots: list[Path], appends: int, durable: bool) -> list[list[float]]:
    """Seconds per append of one 30-frame episode, for each dataset in ``roots``.

    The appends alternate between the datasets (a, b, a, b...) so that load from other processes
    on the shared machine hits both sides alike; writers are opened outside the timing.
    """
    images = SyntheticScene(HEIGHT, WIDTH, seed=2).frames(0, APPEND_FRAMES)
    writers = [_writer(root, durable=durable) for root in roots]
    times: list[list[float]] = [[] for _ in roots]
    try:
        for writer in writers:
            _episode(writer, APPEND_FRAMES, images, 0)  # warm-up (imports, encoder init paths)
        for i in range(appends):
            for writer, series in zip(writers, times, strict=True):
                start = time.perf_counter()
                _episode(writer, APPEND_FRAMES, images, i + 1)
                series.append(time.perf_counter() - start)
    finally:
        for writer in writers:
            writer.close()
    return times


def naive_metadata_reread(root: Path) -> float:
    """What a writer that re-derives state from disk would pay on every append."""
    start = time.perf_counter()
    episodes = atomic.read_jsonl(root / layout.EPISODES)
    stats_rows = atomic.read_jsonl(root / layout.EPISODES_STATS)
    merge_stats(r["stats"] for r in stats_rows)
    _ = max(r["episode_index"] for r in episodes), sum(r["length"] for r in episodes)
    return time.perf_counter() - start


def decode_rows(tmp: Path, frames: int) -> list[dict[str, Any]]:
    """iter_frames (decode + rgb24 + copy into the reused buffer) vs decode alone."""
    path = tmp / "decode.mp4"
    scene = SyntheticScene(480, 640, seed=3, noise=2)
    with VideoEncoder(path, 640, 480, 30) as encoder:
        for start in range(0, frames, 30):
            encoder.write(scene.frames(start, min(30, frames - start)))
    out = np.empty((32, 480, 640, 3), np.uint8)
    out.fill(0)

    def iterate() -> None:
        for _ in iter_frame_batches(path, 32, out=out):
            pass

    t_iter = min(_seconds(iterate) for _ in range(3))
    t_decode = min(_seconds(lambda: count_decoded_frames(path)) for _ in range(3))
    return [
        {
            "name": "dataset.iter_frames 640x480 vs decode without rgb conversion",
            "value": frames / t_iter,
            "baseline": frames / t_decode,
            "ratio": t_decode / t_iter,
            "unit": "fps",
            "note": f"{frames} H.264 frames (synthetic, noisy), thread_type AUTO, batches of 32 "
            "into one reused buffer; the gap is the yuv->rgb conversion + copy",
        }
    ]


def frame_count_rows(tmp: Path, frames: int) -> list[dict[str, Any]]:
    """count_frames (MP4 box parse) vs opening the file with PyAV for ``stream.frames``."""
    path = tmp / "count.mp4"
    # Camera-sized frames: PyAV's open probes the stream (decodes its first frame), so its cost
    # grows with the resolution; the box parse only reads the sample table.
    scene = SyntheticScene(480, 640, seed=4, noise=2)
    with VideoEncoder(path, 640, 480, 30, VideoOptions(preset="ultrafast")) as encoder:
        for start in range(0, frames, 30):
            encoder.write(scene.frames(start, min(30, frames - start)))

    def pyav_count() -> int:
        with av.open(str(path)) as container:
            return int(container.streams.video[0].frames)

    assert count_frames(path) == pyav_count() == frames
    box_calls, pyav_calls = 200, 30
    t_boxes = min(
        _seconds(lambda: [count_frames(path) for _ in range(box_calls)]) for _ in range(5)
    )
    t_boxes /= box_calls
    t_pyav = min(_seconds(lambda: [pyav_count() for _ in range(pyav_calls)]) for _ in range(3))
    t_pyav /= pyav_calls
    return [
        {
            "name": "dataset.count_frames per MP4, box parse vs PyAV open",
            "value": t_boxes * 1e6,
            "baseline": t_pyav * 1e6,
            "ratio": t_pyav / t_boxes,
            "unit": "us",
            "note": f"{frames}-frame 640x480 H.264 file, page cache warm, best of 5 x "
            f"{box_calls} / 3 x {pyav_calls} calls; the validator counts every camera of every "
            "episode before each export",
        }
    ]


def append_by_copy(path: Path, rows: list[dict[str, Any]], *, durable: bool) -> None:
    """The baseline: the whole file and the new lines written to a temporary, renamed over it
    (no reader sees a partial line, at a cost that grows with the file)."""
    data = path.read_bytes()
    atomic.atomic_write_bytes(
        path, data + b"".join(atomic.jsonl_line(r) for r in rows), durable=durable
    )


def jsonl_append_rows(tmp: Path, root: Path, rows_in_file: int) -> list[dict[str, Any]]:
    """One per-episode stats row appended to a ``rows_in_file``-row episodes_stats.jsonl."""
    line = (root / layout.EPISODES_STATS).read_bytes().splitlines(keepends=True)[0]
    row = json.loads(line)
    times = {}
    for name, append in (
        ("in place", atomic.append_jsonl_inplace),
        ("copy+rename", append_by_copy),
    ):
        path = tmp / f"stats-{name.replace(' ', '_').replace('+', '_')}.jsonl"
        path.write_bytes(line * rows_in_file)
        times[name] = min(
            _seconds(lambda append=append, path=path: append(path, [row], durable=False))
            for _ in range(5)
        )
    return [
        {
            "name": f"dataset.jsonl append @{rows_in_file} rows, in place vs copy+rename",
            "value": times["in place"] * 1e3,
            "baseline": times["copy+rename"] * 1e3,
            "ratio": times["copy+rename"] / times["in place"],
            "unit": "ms",
            "note": f"episodes_stats rows of {len(line)} B ({len(line) * rows_in_file / 1e6:.1f} MB "
            "file), no fsync; the writer appends in place, so this cost stays flat",
        }
    ]


def table_read_rows(tmp: Path, large_rows: int) -> list[dict[str, Any]]:
    """read_table opened beneath the root vs pq.ParquetFile(path), large and small."""
    from eva.dataset.reader import TABLE_CACHE_BYTES, DatasetReader

    root = write_synthetic_dataset(tmp / "tables", episodes=1, frames=300)
    reader = DatasetReader(root)
    path = reader.data_path(0)
    state = "observation.state"

    def by_path(columns: list[str] | None) -> pa.Table:
        """The reader before: pyarrow opens the path (checked beforehand, not timed here); a
        column read first checks the column exists, as read_table does."""
        with pq.ParquetFile(path) as parquet:
            if columns is not None:
                assert set(columns) <= set(parquet.schema_arrow.names)
            return parquet.read(columns=columns, use_threads=False)

    def compare(columns: list[str] | None, runs: int) -> tuple[float, float]:
        pairs = [  # alternated, so that a busy moment of the host weighs on both alike
            (_seconds(lambda: reader.read_table(0, columns)), _seconds(lambda: by_path(columns)))
            for _ in range(runs)
        ]
        return min(p[0] for p in pairs), min(p[1] for p in pairs)

    small_beneath, small_path = compare([state], 200)
    table = by_path(None)
    big = pa.table(
        {c: pa.concat_arrays([table.column(c).combine_chunks()] * (large_rows // 300))
         for c in table.column_names}
    )  # fmt: skip
    assert big.nbytes > TABLE_CACHE_BYTES // 2  # not cached: every read_table reads the file
    path.chmod(0o644)
    pq.write_table(big, path)
    large_beneath, large_path = compare(None, 7)
    size_mb = path.stat().st_size / 1e6
    return [
        {
            "name": f"dataset.read_table {large_rows} rows opened beneath the root vs by path",
            "value": large_beneath * 1e3,
            "baseline": large_path * 1e3,
            "ratio": large_path / large_beneath,
            "unit": "ms",
            "note": f"whole table, {size_mb:.1f} MB file, {big.nbytes / 1e6:.0f} MB in memory, "
            "best of 7; ratio ~1: reading from the open file costs what pyarrow's own open does",
        },
        {
            "name": "dataset.read_table 1 column of 300 rows opened beneath the root vs by path",
            "value": small_beneath * 1e6,
            "baseline": small_path * 1e6,
            "ratio": small_path / small_beneath,
            "unit": "us",
            "note": "best of 200; the difference is the openat2 walk, an fstat and the Python "
            "file object pyarrow reads through",
        },
    ]


def _seconds(run: Any) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def validate_row(root: Path) -> dict[str, Any]:
    """``validate_dataset`` (which decodes a few keyframes of every MP4 to catch a damaged
    bitstream) against the same validation without that decode: the keyframe checks alone,
    timed over the same files, subtracted."""
    from eva.dataset.decode_check import check_keyframes
    from eva.dataset.reader import DatasetReader
    from eva.dataset.validate import validate_dataset

    reader = DatasetReader(root)
    videos = [reader.video_path(ep, k) for ep in reader.episode_indices for k in reader.video_keys]
    t_validate = min(_timed(lambda: validate_dataset(root)) for _ in range(3))
    t_keyframes = min(_timed(lambda: [check_keyframes(v) for v in videos]) for _ in range(3))
    return {
        "name": f"validate @{len(reader.episode_indices)} episodes vs without keyframe decoding",
        "value": t_validate * 1e3,
        "baseline": (t_validate - t_keyframes) * 1e3,
        "ratio": (t_validate - t_keyframes) / t_validate,
        "unit": "ms",
        "note": f"{len(videos)} MP4s, {t_keyframes / len(videos) * 1e3:.2f} ms of keyframe "
        "decoding each (up to 3 keyframes: the first, one between, the last)",
    }


def _timed(work: Any) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def report(quick: bool = False) -> list[dict[str, Any]]:
    """Rows for bench/run_all.py; about 15 s, 8 s with quick."""
    appends = 9 if quick else 25
    small_n, large_n = 10, 200
    rows: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix="eva-bench-dataset-"))
    try:
        build_start = time.perf_counter()
        small = build_dataset(tmp / "small", small_n)
        large = build_dataset(tmp / "large", large_n)
        build_s = time.perf_counter() - build_start
        for durable in (False, True):
            small_times, large_times = time_appends([small, large], appends, durable)
            t_small, t_large = min(small_times), min(large_times)
            label = "durable (fsync)" if durable else "no fsync"
            rows.append(
                {
                    "name": f"dataset.append episode @{large_n} vs @{small_n} episodes, {label}",
                    "value": t_large * 1e3,
                    "baseline": t_small * 1e3,
                    "ratio": t_small / t_large,
                    "unit": "ms",
                    "note": f"{APPEND_FRAMES} frames {WIDTH}x{HEIGHT} + 2x14-dim vectors; "
                    f"best of {appends}; ratio ~1 = O(1) append "
                    f"(datasets built in {build_s:.1f} s)",
                }
            )
            if not durable:
                t_append_large = t_large
        reread = min(naive_metadata_reread(large) for _ in range(3))
        rows.append(
            {
                "name": f"dataset.append vs naive metadata re-read @{large_n + 2 * (appends + 1)}",
                "value": t_append_large * 1e3,
                "baseline": (t_append_large + reread) * 1e3,
                "ratio": (t_append_large + reread) / t_append_large,
                "unit": "ms",
                "note": f"re-reading jsonl + re-merging stats alone costs {reread * 1e3:.1f} ms "
                "per append and grows with every episode",
            }
        )
        rows.append(validate_row(large))
        rows += jsonl_append_rows(tmp, large, 2000)
        rows += decode_rows(tmp, 60 if quick else 150)
        rows += frame_count_rows(tmp, 150 if quick else 600)
        rows += table_read_rows(tmp, 120_000 if quick else 420_000)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


# --------------------------------------------------------------------------------------------------
# pytest-benchmark (`pytest bench/bench_dataset.py --benchmark-enable`)
# --------------------------------------------------------------------------------------------------


def _bench_append(benchmark: Any, tmp_path: Path, episodes: int) -> None:
    root = build_dataset(tmp_path / "raw", episodes)
    images = SyntheticScene(HEIGHT, WIDTH, seed=2).frames(0, APPEND_FRAMES)
    with _writer(root, durable=False) as writer:
        counter = iter(range(10**6))
        benchmark(lambda: _episode(writer, APPEND_FRAMES, images, next(counter)))


def test_append_to_10_episodes(benchmark: Any, tmp_path: Path) -> None:
    _bench_append(benchmark, tmp_path, 10)


def test_append_to_200_episodes(benchmark: Any, tmp_path: Path) -> None:
    _bench_append(benchmark, tmp_path, 200)


if __name__ == "__main__":
    for row in report(quick=True):
        print(row)
