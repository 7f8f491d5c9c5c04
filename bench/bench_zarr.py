"""zarr export (diffusion_policy's ReplayBuffer layout) against the decode limit, and its memory.

``report(quick)`` writes a synthetic v2.1 dataset once (cached under the temp dir; full: 8
episodes x 3 cameras x 300 frames at 320x240, quick: 4 x 3 x 60) and measures, in this run:

* export vs decode-only, in CPU seconds (all threads): ``eva export --format zarr`` as the
  library runs it (validation, the split, both subsets' stores and metadata; not synced) against
  a PyAV threaded decode of the same MP4s to rgb24 ndarrays, writing nothing (the limit of any
  exporter that starts from these MP4s). Goal: at most 1.2x (ratio = decode / export >= 0.833).
  The stores are written to the temp dir's filesystem (not tmpfs), as an export is;
* the same with ``--zarr-image-compressor zstd`` (level 3), the price of compression;
* peak RSS (a subprocess, ``resource.getrusage``) of a one-episode export of 100, 300 and 900
  frames: flat when memory is bounded by the decode batch, not by the episode.
"""

from __future__ import annotations

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

from eva.capture.synthetic import write_synthetic_dataset
from eva.dataset.reader import DatasetReader
from eva.export.pipeline import export_dataset
from eva.formats.base import ExportOptions
from eva.formats.options import ZarrOptions

CAMERAS = ("observation.images.front", "observation.images.wrist", "observation.images.side")
WIDTH, HEIGHT = 320, 240


def cached_dataset(episodes: int, frames: int, cameras: int = len(CAMERAS)) -> Path:
    """A synthetic v2.1 dataset, written once per shape under the temp dir."""
    root = Path(tempfile.gettempdir()) / f"eva-bench-zarr-{episodes}x{cameras}x{frames}"
    raw = root / "raw"
    if not (raw / "meta" / "info.json").is_file():
        shutil.rmtree(root, ignore_errors=True)
        write_synthetic_dataset(
            raw,
            episodes=episodes,
            frames=frames,
            cameras=CAMERAS[:cameras],
            width=WIDTH,
            height=HEIGHT,
        )
    return raw


def export_once(raw: Path, options: ZarrOptions) -> None:
    export_dataset(raw, "zarr", options=ExportOptions(durable=False, format=options))


def remove_export(raw: Path) -> None:
    """The export made by ``export_once`` (outside the measure: unlinking a store of one file
    per frame is the cost of replacing an export, not of writing one)."""
    shutil.rmtree(raw.parent / "export", ignore_errors=True)


def decode_only(raw: Path) -> None:
    reader = DatasetReader(raw)
    for episode in reader.episode_indices:
        for key in reader.video_keys:
            with av.open(str(reader.video_path(episode, key))) as container:
                stream = container.streams.video[0]
                stream.thread_type = "AUTO"
                for frame in container.decode(stream):
                    frame.to_ndarray(format="rgb24")


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # all threads, decoder threads included
    return usage.ru_utime + usage.ru_stime


def _measure(
    run: Callable[[], Any], repeats: int, after: Callable[[], Any] = lambda: None
) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of the run with the least CPU; ``after`` each run, unmeasured."""
    best = (float("inf"), float("inf"))
    for _ in range(repeats):
        cpu = _cpu_seconds()
        start = time.perf_counter()
        run()
        measured = (time.perf_counter() - start, _cpu_seconds() - cpu)
        after()
        if measured[1] < best[1]:
            best = measured
    return best


_RSS_SCRIPT = """
import resource, sys
sys.path.insert(0, {bench_dir!r})
import bench_zarr
from eva.formats.options import ZarrOptions
raw = bench_zarr.cached_dataset(1, {frames}, 1)
bench_zarr.remove_export(raw)
bench_zarr.export_once(raw, ZarrOptions())
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
bench_zarr.remove_export(raw)
"""


def peak_rss_mb(frames: int) -> float:
    cached_dataset(1, frames, 1)  # written beforehand: the subprocess measures the export only
    script = _RSS_SCRIPT.format(bench_dir=str(Path(__file__).parent), frames=frames)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    return int(result.stdout.strip().splitlines()[-1]) / 1024.0


def _row(name: str, value: float, baseline: float, ratio: float, unit: str, note: str) -> dict:
    return {
        "name": name,
        "value": round(value, 4),
        "baseline": round(baseline, 4),
        "ratio": round(ratio, 3),
        "unit": unit,
        "note": note,
    }


def report(quick: bool = False) -> list[dict[str, Any]]:
    episodes, frames = (4, 60) if quick else (8, 300)
    repeats = 2 if quick else 3
    raw = cached_dataset(episodes, frames)
    size = f"{episodes} ep x {len(CAMERAS)} cams x {frames} frames {WIDTH}x{HEIGHT}"
    decode_s, decode_cpu = _measure(lambda: decode_only(raw), repeats)
    remove_export(raw)
    clean = lambda: remove_export(raw)  # noqa: E731
    export_s, export_cpu = _measure(lambda: export_once(raw, ZarrOptions()), repeats, clean)
    zstd = ZarrOptions(image_compressor="zstd", compression_level=3)
    zstd_s, zstd_cpu = _measure(lambda: export_once(raw, zstd), repeats, clean)
    rss = {n: peak_rss_mb(n) for n in (100, 300, 900)}
    return [
        _row(
            "zarr export CPU vs decode-only (goal >= 0.833)",
            export_cpu,
            decode_cpu,
            decode_cpu / export_cpu,
            "cpu-s",
            f"{size}; wall {export_s:.2f} s vs {decode_s:.2f} s",
        ),
        _row(
            "zarr export zstd:3 CPU vs none",
            zstd_cpu,
            export_cpu,
            export_cpu / zstd_cpu,
            "cpu-s",
            f"{size}; wall {zstd_s:.2f} s",
        ),
        _row(
            "zarr export peak RSS, 900 vs 100 frames (flat: ~1)",
            rss[900],
            rss[100],
            rss[900] / rss[100],
            "MB",
            f"1 episode, 1 camera: {rss[100]:.0f} / {rss[300]:.0f} / {rss[900]:.0f} MB",
        ),
    ]


if __name__ == "__main__":
    for row in report(quick="--quick" in sys.argv):
        print(row)
