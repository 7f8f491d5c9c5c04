"""HDF5 export: the batched decode -> chunk writer against a naive writer and the decode limit.

``report(quick)`` exports ``episodes`` x 3 cameras x ``frames`` (full: 20 x 3 x 300 at 320x240;
quick: 4 x 3 x 60) from PyAV-encoded H.264 MP4s generated once and cached under the temp dir.
Rows (times are the best of ``repeats`` runs measured in this run; ratio = baseline / value, so
> 1 is faster than the baseline and against a limit it is the fraction of the limit reached):

* export vs naive writer: decode frame by frame (no codec threading), one resize + one write per
  frame into a (1, H, W, 3)-chunked dataset;
* export vs decode-only: a PyAV threaded decode to rgb24 ndarrays of the same videos, writing
  nothing (the speed limit of any exporter that starts from these MP4s);
* export vs decode without pixel conversion (the decoder alone);
* native yuv->rgb conversion vs PyAV's own conversion inside the exporter;
* gzip:1 export vs uncompressed (the price of compression);
* export to disk (temp dir, synced) vs a plain write + sync of the same pixel bytes (the disk
  limit: on a slow disk both are bound by it);
* peak RSS (subprocess, ``resource.getrusage``) of a one-episode export against episode length:
  flat when memory is bounded by the batch, not by the episode.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import av
import h5py
import numpy as np
import pyarrow as pa
import pytest

from eva.formats import hdf5

CAMERAS = ("observation.images.front", "observation.images.left", "observation.images.right")
CACHE = Path(tempfile.gettempdir()) / "eva-bench-hdf5"


def _best_seconds(run: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def camera_frames(count: int, width: int, height: int, seed: int) -> np.ndarray:
    """Camera-like content: textured gradient, a moving block, light noise (H.264 must work)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([(xx * 0.5 + yy * 0.2), (yy * 0.6 + 40), (xx * 0.3 + yy * 0.3 + 80)], axis=-1)
    frames = np.empty((count, height, width, 3), dtype=np.uint8)
    for i in range(count):
        image = base + rng.integers(0, 8, base.shape)
        x0 = (i * 3) % max(1, width - 40)
        image[height // 3 : height // 3 + 40, x0 : x0 + 40] = (200, 30 + seed * 40, 40)
        np.clip(np.roll(image, i, axis=1), 0, 255, out=frames[i], casting="unsafe")
    return frames


def cached_video(frames: int, width: int, height: int, seed: int) -> Path:
    path = CACHE / f"cam{seed}_{width}x{height}_{frames}.mp4"
    if path.exists():
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    container = av.open(str(tmp), "w", format="mp4")
    stream = container.add_stream("libx264", rate=30)
    stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
    stream.options = {"preset": "ultrafast", "g": "30", "bf": "0", "sc_threshold": "0"}
    for start in range(0, frames, 60):
        for image in camera_frames(min(60, frames - start), width, height, seed + start):
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)
    container.close()
    os.replace(tmp, path)
    return path


def episode_table(rows: int) -> pa.Table:
    state = np.linspace(0, 1, rows * 14, dtype=np.float32)
    return pa.table(
        {
            "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(state), 14),
            "action": pa.FixedSizeListArray.from_arrays(pa.array(state * 2), 14),
            "timestamp": pa.array(np.arange(rows, dtype=np.float32) / 30),
            "frame_index": pa.array(np.arange(rows, dtype=np.int64)),
            "index": pa.array(np.arange(rows, dtype=np.int64)),
        }
    )


def export_episodes(
    out: Path,
    videos: dict[str, Path],
    episodes: int,
    rows: int,
    options: hdf5.Hdf5Options,
    *,
    delete_each: bool = False,
) -> None:
    writer = hdf5.EpisodeWriter(options)
    table = episode_table(rows)
    for ep in range(episodes):
        path = out / hdf5.episode_path(ep)
        writer.write_episode(
            path,
            columns=table,
            videos=videos,
            metadata={"episode_index": ep, "fps": 30},
            label=f"episode {ep}",
        )
        if delete_each:
            path.unlink()


def naive_export(
    out: Path, videos: dict[str, Path], episodes: int, rows: int, *, delete_each: bool = False
) -> None:
    """What a first version does: frame by frame, resize + write per frame, chunks (1, H, W, 3)."""
    table = episode_table(rows)
    for ep in range(episodes):
        path = out / hdf5.episode_path(ep)
        path.parent.mkdir(parents=True, exist_ok=True)
        with h5py.File(path, "w") as h5:
            hdf5.write_mapping(
                h5.create_group("columns"),
                {n: hdf5.column_value(table.column(n)) for n in table.column_names},
            )
            images = h5.create_group("images")
            for index, (key, video) in enumerate(videos.items()):
                item = images.create_group(hdf5.ITEM_NAME.format(index))
                item.attrs["key"], item.attrs["kind"] = key, "array"
                dataset = None
                with av.open(str(video)) as container:
                    for i, frame in enumerate(container.decode(video=0)):
                        image = frame.to_ndarray(format="rgb24")
                        if dataset is None:
                            dataset = item.create_dataset(
                                "value",
                                shape=(0, *image.shape),
                                maxshape=(None, *image.shape),
                                chunks=(1, *image.shape),
                                dtype=np.uint8,
                            )
                        dataset.resize(i + 1, axis=0)
                        dataset[i] = image
            hdf5.write_mapping(h5.create_group("metadata"), {"episode_index": ep, "fps": 30})
        if delete_each:
            path.unlink()


def decode_only(videos: dict[str, Path], episodes: int, convert: bool) -> None:
    for _ in range(episodes):
        for video in videos.values():
            with av.open(str(video)) as container:
                stream = container.streams.video[0]
                stream.thread_type = "AUTO"
                for frame in container.decode(stream):
                    if convert:
                        frame.to_ndarray(format="rgb24")


_RSS_SCRIPT = """
import resource, sys
from pathlib import Path
sys.path.insert(0, {bench_dir!r})
import bench_hdf5
from eva.formats import hdf5
video = Path({video!r})
bench_hdf5.export_episodes(Path({out!r}), {{"cam": video}}, 1, {rows}, hdf5.Hdf5Options())
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def peak_rss_mb(video: Path, rows: int, out: Path) -> float:
    script = _RSS_SCRIPT.format(
        bench_dir=str(Path(__file__).parent), video=str(video), out=str(out), rows=rows
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    return int(result.stdout.strip().splitlines()[-1]) / 1024.0


def _row(name: str, value: float, baseline: float, unit: str, note: str) -> dict[str, Any]:
    if unit == "s":
        ratio = baseline / value if value else float("nan")
    else:
        ratio = value / baseline if baseline else float("nan")
    return {
        "name": name,
        "value": round(value, 4),
        "baseline": round(baseline, 4),
        "ratio": round(ratio, 3),
        "unit": unit,
        "note": note,
    }


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # all threads, decoder threads included
    return usage.ru_utime + usage.ru_stime


def _measure(run: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """(best wall seconds, CPU seconds of that run)."""
    best = (float("inf"), float("inf"))
    for _ in range(repeats):
        cpu = _cpu_seconds()
        start = time.perf_counter()
        run()
        wall = time.perf_counter() - start
        if wall < best[0]:
            best = (wall, _cpu_seconds() - cpu)
    return best


def _output_root() -> Path:
    """tmpfs when there is one: the CPU-side comparisons should not measure the disk."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def report(quick: bool = False) -> list[dict[str, Any]]:
    episodes, frames, width, height = (4, 60, 320, 240) if quick else (20, 300, 320, 240)
    repeats = 2 if quick else 1
    videos = {key: cached_video(frames, width, height, seed) for seed, key in enumerate(CAMERAS)}
    total = episodes * len(CAMERAS) * frames
    size = f"{episodes} ep x {len(CAMERAS)} cams x {frames} frames {width}x{height}"
    few = max(1, episodes // 5)
    few_total = few * len(CAMERAS) * frames
    rows: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="eva-bench-hdf5-", dir=_output_root()) as tmp,
        tempfile.TemporaryDirectory(prefix="eva-bench-hdf5-disk-") as disk_tmp,
    ):
        work, disk = Path(tmp), Path(disk_tmp)

        def export_run(
            options: hdf5.Hdf5Options, count: int, root: Path = work
        ) -> Callable[[], None]:
            def run() -> None:
                out = Path(tempfile.mkdtemp(dir=root))
                # One episode on disk at a time: tmpfs memory stays bounded.
                export_episodes(out, videos, count, frames, options, delete_each=True)
                shutil.rmtree(out)

            return run

        def naive_run() -> None:
            out = Path(tempfile.mkdtemp(dir=work))
            naive_export(out, videos, episodes, frames, delete_each=True)
            shutil.rmtree(out)

        export_s, export_cpu = _measure(export_run(hdf5.Hdf5Options(), episodes), repeats)
        naive_s, naive_cpu = _measure(naive_run, repeats)
        decode_s, decode_cpu = _measure(lambda: decode_only(videos, episodes, True), repeats)
        raw_s, _ = _measure(lambda: decode_only(videos, episodes, False), repeats)
        native_few_s, _ = _measure(export_run(hdf5.Hdf5Options(), few), repeats)
        pyav_few_s, _ = _measure(export_run(hdf5.Hdf5Options(native_convert=False), few), repeats)
        gzip_s, _ = _measure(export_run(hdf5.Hdf5Options(compression="gzip:1"), 1), repeats)
        plain_one_s, _ = _measure(export_run(hdf5.Hdf5Options(), 1), repeats)

        def synced_export() -> None:
            # Written, synced, then deleted: the run pays its own writeback (so does raw_write).
            out = Path(tempfile.mkdtemp(dir=disk))
            export_episodes(out, videos, few, frames, hdf5.Hdf5Options())
            os.sync()
            shutil.rmtree(out)

        frame_bytes = width * height * 3
        block = np.full((frames, height, width, 3), 7, dtype=np.uint8)

        def raw_write() -> None:
            # The disk limit: the same pixel bytes, one plain file per camera, no HDF5.
            for ep in range(few):
                for cam in range(len(CAMERAS)):
                    path = disk / f"raw-{ep}-{cam}.bin"
                    block.tofile(path)
            os.sync()
            for path in disk.glob("raw-*.bin"):
                path.unlink()

        os.sync()
        disk_s, _ = _measure(synced_export, repeats)
        os.sync()
        raw_write_s, _ = _measure(raw_write, repeats)

        where = f"output on {_output_root()}"
        rows.append(
            _row(
                "hdf5 export vs naive per-frame writer",
                export_s,
                naive_s,
                "s",
                f"{size}, {where}; export {total / export_s:.0f} frames/s, naive "
                f"{total / naive_s:.0f} frames/s",
            )
        )
        rows.append(
            _row(
                "hdf5 export CPU vs naive writer CPU",
                export_cpu,
                naive_cpu,
                "s",
                f"{size}; CPU s of all threads (robust on a shared machine): "
                f"{export_cpu / total * 1e3:.3f} vs {naive_cpu / total * 1e3:.3f} ms/frame",
            )
        )
        rows.append(
            _row(
                "hdf5 export vs decode-only rgb24 (limit)",
                export_s,
                decode_s,
                "s",
                f"{size}; decode-only {total / decode_s:.0f} frames/s (PyAV threaded to_ndarray)",
            )
        )
        rows.append(
            _row(
                "hdf5 export CPU vs decode-only rgb24 CPU",
                export_cpu,
                decode_cpu,
                "s",
                f"{size}; {export_cpu / total * 1e3:.3f} vs {decode_cpu / total * 1e3:.3f} "
                "CPU ms/frame",
            )
        )
        rows.append(
            _row(
                "hdf5 export vs decode without conversion",
                export_s,
                raw_s,
                "s",
                f"{size}; decoder alone {total / raw_s:.0f} frames/s",
            )
        )
        rows.append(
            _row(
                "hdf5 export: native yuv->rgb vs PyAV conversion",
                native_few_s,
                pyav_few_s,
                "s",
                f"{few} episodes; identical pixels; with PyAV's conversion "
                f"{few_total / pyav_few_s:.0f} frames/s, native {few_total / native_few_s:.0f}",
            )
        )
        one = len(CAMERAS) * frames
        rows.append(
            _row(
                "hdf5 export gzip:1 vs uncompressed",
                gzip_s,
                plain_one_s,
                "s",
                f"1 episode; gzip {one / gzip_s:.0f} frames/s (ratio < 1: compression is slower)",
            )
        )
        rows.append(
            _row(
                "hdf5 export to disk vs raw write of the same bytes",
                disk_s,
                raw_write_s,
                "s",
                f"{few} episodes to {tempfile.gettempdir()}; export "
                f"{few_total * frame_bytes / disk_s / 1e6:.0f} MB/s, plain write "
                f"{few_total * frame_bytes / raw_write_s / 1e6:.0f} MB/s",
            )
        )

        lengths = (60, 180, 540) if quick else (100, 300, 900)
        rss: list[tuple[int, float]] = []
        for length in lengths:
            video = cached_video(length, width, height, 7)
            rss.append((length, peak_rss_mb(video, length, Path(tempfile.mkdtemp(dir=work)))))
        base_len, base_rss = rss[0]
        for length, value in rss:
            episode_mb = length * frame_bytes / 2**20
            rows.append(
                _row(
                    f"hdf5 export peak RSS, {length}-frame episode",
                    value,
                    base_rss,
                    "MB",
                    f"1 camera {width}x{height}; vs the {base_len}-frame episode "
                    f"(ratio ~1 = flat); the decoded episode alone would be {episode_mb:.0f} MB",
                )
            )
    return rows


# ---- pytest-benchmark (small sizes) -------------------------------------------------------------


@pytest.fixture(scope="module")
def small_videos() -> dict[str, Path]:
    return {key: cached_video(30, 160, 120, seed) for seed, key in enumerate(CAMERAS)}


def test_bench_export_episode(
    benchmark: Any, small_videos: dict[str, Path], tmp_path: Path
) -> None:
    def run() -> None:
        export_episodes(
            tmp_path / f"e{time.perf_counter_ns()}", small_videos, 1, 30, hdf5.Hdf5Options()
        )

    benchmark(run)


def test_bench_naive_episode(benchmark: Any, small_videos: dict[str, Path], tmp_path: Path) -> None:
    benchmark(lambda: naive_export(tmp_path / f"n{time.perf_counter_ns()}", small_videos, 1, 30))


def test_bench_decode_only(benchmark: Any, small_videos: dict[str, Path]) -> None:
    benchmark(lambda: decode_only(small_videos, 1, True))


if __name__ == "__main__":
    for row in report(quick="--quick" in sys.argv):
        print(row)
