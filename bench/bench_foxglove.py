"""The foxglove MCAP profile: episodes written from the MP4s' H.264 without decoding, against
``cp`` of the same MP4 bytes (the limit), and the files' size against the videos'.

The source is a synthetic v2.1 dataset (3 cameras, libx264 through eva's own writer, no
B-frames: every camera is carried). Quick mode (default): 3 episodes x 3 cameras x 90 frames of
640x480; full (``report(quick=False)``): 10 x 3 x 300. Everything lives in tmpfs (/dev/shm when
present), so that the figures measure the work, not this VM's disk. Rows:

* writer: ``write_foxglove_episode`` of every episode (its table, metadata and the carried MP4s)
  against one ``cp`` of every episode MP4 into a fresh directory (process start included), each
  the best of ``FAST_REPEATS`` runs;
* export: ``eva export --format mcap --mcap-profile foxglove`` end to end (validation, split,
  both subsets, metadata, publish) against ``cp -r`` of the source dataset;
* eva-client: the default profile's export (frames decoded and stored raw) against the foxglove
  one, end to end: what not decoding buys;
* size: the episode files' bytes against the MP4s' bytes.

``ratio`` is baseline_time / value_time (> 1: faster than the baseline); for the size,
baseline_bytes / value_bytes. Measured figures: bench/README.md.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eva.capture.synthetic import write_synthetic_dataset
from eva.dataset.mp4box import read_video_samples
from eva.dataset.reader import DatasetReader
from eva.export.pipeline import export_dataset
from eva.formats.base import ExportOptions
from eva.formats.mcap.foxglove_export import CarriedVideo, EpisodeContent, write_foxglove_episode
from eva.formats.options import McapOptions

WIDTH, HEIGHT = 640, 480
CAMERAS = 3
REPEATS = 3
# The writer and cp rows take tens of milliseconds: the best of more runs, so that the ratio
# measures the work rather than the other processes of a shared machine.
FAST_REPEATS = 10


def _tmp_root() -> Path:
    shm = Path("/dev/shm")
    return Path(tempfile.mkdtemp(prefix="eva-bench-foxglove-", dir=shm if shm.is_dir() else None))


def _seconds(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _best(run: Callable[[], object], repeats: int = REPEATS) -> float:
    """The best wall time of ``repeats`` runs."""
    return min(_seconds(run) for _ in range(repeats))


def write_episodes(reader: DatasetReader, out_dir: Path) -> int:
    """Every episode in the foxglove profile; returns the bytes written."""
    total = 0
    for episode in reader.episode_indices:
        cameras = {
            key: CarriedVideo(path, read_video_samples(path))
            for key in reader.video_keys
            for path in [reader.video_path(episode, key)]
        }
        content = EpisodeContent(
            reader.read_table(episode), reader.episode(episode), reader.fps, reader.features
        )
        total += write_foxglove_episode(out_dir / f"episode_{episode:06d}.mcap", content, cameras)
    return total


def copy_videos(videos: list[Path], out_dir: Path) -> None:
    out_dir.mkdir()
    names = []
    for i, path in enumerate(videos):  # distinct names: every camera's files share a name
        link = out_dir.parent / f"src-{i}.mp4"
        if not link.exists():
            link.symlink_to(path)
        names.append(str(link))
    subprocess.run(["cp", "-L", *names, str(out_dir)], check=True)


def _row(name: str, value: float, baseline: float, unit: str, note: str) -> dict[str, Any]:
    ratio = baseline / value if value else 0.0
    return {"name": name, "value": value, "baseline": baseline, "ratio": ratio, "unit": unit,
            "note": note}  # fmt: skip


def report(quick: bool = True) -> list[dict[str, Any]]:
    episodes, frames = (3, 90) if quick else (10, 300)
    root = _tmp_root()
    try:
        raw = write_synthetic_dataset(
            root / "raw", episodes=episodes, frames=frames, cameras=CAMERAS, width=WIDTH,
            height=HEIGHT,
        )  # fmt: skip
        reader = DatasetReader(raw)
        videos = [
            reader.video_path(e, k) for e in reader.episode_indices for k in reader.video_keys
        ]
        video_bytes = sum(p.stat().st_size for p in videos)
        shape = f"{episodes} x {CAMERAS} x {frames} frames of {WIDTH}x{HEIGHT}"
        rows: list[dict[str, Any]] = []
        written = [0]

        def writer() -> None:
            out = root / "out"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            written[0] = write_episodes(reader, out)

        def cp() -> None:
            shutil.rmtree(root / "cp", ignore_errors=True)
            copy_videos(videos, root / "cp")

        writer_s, cp_s = _best(writer, FAST_REPEATS), _best(cp, FAST_REPEATS)
        rows.append(_row("foxglove writer vs cp of the MP4s", writer_s, cp_s, "s", shape))
        rows.append(
            _row("foxglove file bytes vs the MP4s'", written[0], video_bytes, "bytes", shape)
        )
        foxglove = ExportOptions(format=McapOptions(profile="foxglove"))

        def export_foxglove() -> None:
            export_dataset(raw, "mcap", options=foxglove)

        def export_default() -> None:
            export_dataset(raw, "mcap")

        def cp_r() -> None:
            shutil.rmtree(root / "cp-r", ignore_errors=True)
            subprocess.run(["cp", "-r", str(raw), str(root / "cp-r")], check=True)

        export_s, cp_r_s = _best(export_foxglove), _best(cp_r)
        rows.append(_row("foxglove export vs cp -r of the source", export_s, cp_r_s, "s", shape))
        default_s = _best(export_default, 1)
        rows.append(
            _row("foxglove export vs eva-client export", export_s, default_s, "s",
                 f"{shape}; eva-client decodes every frame")
        )  # fmt: skip
        return rows
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    import sys

    for row in report(quick="--full" not in sys.argv):
        print(f"{row['name']:<45} {row['value']:>14.4g} {row['baseline']:>14.4g} "
              f"{row['ratio']:>7.3f} {row['unit']:<6} {row['note']}")  # fmt: skip


def test_bench_foxglove_writer(benchmark: Any, tmp_path: Path) -> None:
    raw = write_synthetic_dataset(tmp_path / "raw", episodes=2, frames=30, cameras=2)
    reader = DatasetReader(raw)

    def run() -> int:
        out = tmp_path / f"out-{time.perf_counter_ns()}"
        out.mkdir()
        return write_episodes(reader, out)

    assert benchmark(run) > 0
