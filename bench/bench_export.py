"""Native v2.1 quality export against ``cp -r`` of the same dataset (the physical limit).

The export validates the source, splits it, rewrites every parquet's index columns column-wise,
hard-links (or with ``--copy-videos`` copies) the MP4s, writes both subsets' metadata and
publishes the pair. ``cp -r`` of the source directory is what a plain copy costs on this disk.

``report(quick)`` rows (best of several repeats, page cache warm for both):

* export with hard-linked MP4s vs ``cp -r`` (ratio > 1: cheaper than a copy);
* export with copied MP4s vs ``cp -r`` (the cross-filesystem case: close to 1 is the goal);
* the default export (linked, one ``syncfs`` before publication) vs ``cp -r`` + ``syncfs``;
* each format's export with every dataset file opened beneath the root (``fsafe.FileBeneath``:
  FFmpeg reads ``/proc/self/fd/<fd>``, the box parser and packet copies ``pread`` the fd) vs the
  same export given plain paths (``open_beneath_rows``; ratio ~1: the safe open costs nothing).

``ratio`` = baseline_time / value_time.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from eva.capture.synthetic import write_synthetic_dataset
from eva.dataset.reader import DatasetReader
from eva.dataset.video import VideoOptions
from eva.export.pipeline import export_dataset
from eva.formats.base import ExportOptions
from eva.formats.options import LeRobotV21Options
from eva.publish import sync_filesystem


def make_source(
    base: Path, *, episodes: int, frames: int, width: int, height: int, crf: int = 23
) -> Path:
    """A synthetic source; a low ``crf`` gives MP4s of camera-footage size (MBs per episode)."""
    return write_synthetic_dataset(
        base / "raw",
        episodes=episodes,
        frames=frames,
        cameras=2,
        width=width,
        height=height,
        state_dim=14,
        quality=["green" if i % 4 else "red" for i in range(episodes)],
        batch_size=30,
        video=VideoOptions(crf=crf, preset="ultrafast"),
    )


def _best_seconds(run: Callable[[], Any], before: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        before()
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def report(quick: bool = False) -> list[dict]:
    """About 10 s with quick (6 x 150 frames), 30 s full (10 x 300 frames); 320x240, crf 18."""
    episodes, frames, width, height = (6, 150, 320, 240) if quick else (10, 300, 320, 240)
    repeats = 3 if quick else 5
    with tempfile.TemporaryDirectory(prefix="eva-bench-export-") as tmp:
        base = Path(tmp)
        source = make_source(
            base, episodes=episodes, frames=frames, width=width, height=height, crf=18
        )
        export_parent = base / "export"
        copy_dest = base / "copy"
        megabytes = _tree_bytes(source) / 1e6

        def clear_export() -> None:
            shutil.rmtree(export_parent, ignore_errors=True)

        def clear_copy() -> None:
            shutil.rmtree(copy_dest, ignore_errors=True)

        def cp_r() -> None:
            subprocess.run(["cp", "-r", str(source), str(copy_dest)], check=True)

        def cp_r_sync() -> None:
            cp_r()
            sync_filesystem(copy_dest)

        def export(**options: Any) -> Callable[[], Any]:
            return lambda: export_dataset(source, "lerobot_v21", options=ExportOptions(**options))

        copy_s = _best_seconds(cp_r, clear_copy, repeats)
        copy_sync_s = _best_seconds(cp_r_sync, clear_copy, repeats)
        link_s = _best_seconds(export(durable=False), clear_export, repeats)
        copied = LeRobotV21Options(copy_videos=True)
        copied_s = _best_seconds(export(durable=False, format=copied), clear_export, repeats)
        durable_s = _best_seconds(export(), clear_export, repeats)
        beneath = open_beneath_rows(source, repeats)
    size = f"{episodes} episodes x {frames} frames, 2 cameras {width}x{height}, {megabytes:.1f} MB"
    return [
        {
            "name": "export lerobot_v21 (hard-linked MP4s) vs cp -r",
            "value": link_s * 1e3,
            "baseline": copy_s * 1e3,
            "ratio": copy_s / link_s,
            "unit": "ms",
            "note": f"{size}; validate + split + parquet rewrite + publish, no sync",
        },
        {
            "name": "export lerobot_v21 (copied MP4s) vs cp -r",
            "value": copied_s * 1e3,
            "baseline": copy_s * 1e3,
            "ratio": copy_s / copied_s,
            "unit": "ms",
            "note": f"{size}; the cross-filesystem path, no sync",
        },
        {
            "name": "export lerobot_v21 default (linked, durable) vs cp -r + syncfs",
            "value": durable_s * 1e3,
            "baseline": copy_sync_s * 1e3,
            "ratio": copy_sync_s / durable_s,
            "unit": "ms",
            "note": f"{size}; both flush to disk once (shared disk: noisy)",
        },
        *beneath,
    ]


FORMATS = ("lerobot_v21", "lerobot_v3", "hdf5", "mcap")


class _PlainPath(type(Path())):  # type: ignore[misc]
    """A path standing in for a ``FileBeneath`` (same ``path`` attribute), opened as a path."""

    @property
    def path(self) -> Path:
        return Path(self)


@contextlib.contextmanager
def _paths_not_beneath() -> Iterator[None]:
    """The baseline: the reader hands out plain paths, which FFmpeg, the box parser and the
    exports open as paths (what they did before issue 27's open-beneath)."""
    beneath = DatasetReader.file_beneath
    DatasetReader.file_beneath = lambda self, path: _PlainPath(path)  # type: ignore[assignment,method-assign,return-value]
    try:
        yield
    finally:
        DatasetReader.file_beneath = beneath  # type: ignore[method-assign]


def open_beneath_rows(source: Path, repeats: int, formats: Sequence[str] = FORMATS) -> list[dict]:
    """Per format: the export (serial, in this process, no sync) with files opened beneath the
    root vs with paths; the two run alternately, best of ``repeats`` each."""
    rows = []
    for fmt in formats:
        export_root = source.parent / "export"
        best = {"beneath": float("inf"), "path": float("inf")}
        for _ in range(repeats):
            for arm in ("path", "beneath"):
                shutil.rmtree(export_root, ignore_errors=True)
                with _paths_not_beneath() if arm == "path" else contextlib.nullcontext():
                    start = time.perf_counter()
                    export_dataset(source, fmt, options=ExportOptions(durable=False))
                    best[arm] = min(best[arm], time.perf_counter() - start)
        shutil.rmtree(export_root, ignore_errors=True)
        rows.append(
            {
                "name": f"export {fmt}: files opened beneath the root vs by path",
                "value": best["beneath"] * 1e3,
                "baseline": best["path"] * 1e3,
                "ratio": best["path"] / best["beneath"],
                "unit": "ms",
                "note": f"{source.parent.name}; FFmpeg on /proc/self/fd, pread on the fd",
            }
        )
    return rows


# --------------------------------------------------------------------------------------------------
# pytest-benchmark (small sizes; `pytest bench/bench_export.py --benchmark-enable`)
# --------------------------------------------------------------------------------------------------


def test_export_v21_small(benchmark: Any, tmp_path: Path) -> None:
    source = make_source(tmp_path, episodes=4, frames=30, width=64, height=48)

    def run() -> None:
        export_dataset(source, "lerobot_v21")

    benchmark(run)


def test_cp_r_small(benchmark: Any, tmp_path: Path) -> None:
    source = make_source(tmp_path, episodes=4, frames=30, width=64, height=48)
    dest = tmp_path / "copy"

    def run() -> None:
        shutil.rmtree(dest, ignore_errors=True)
        subprocess.run(["cp", "-r", str(source), str(dest)], check=True)

    benchmark(run)


if __name__ == "__main__":
    for row in report(quick=True):
        print(row)
