"""``eva merge`` of two 20-episode sessions against ``cp -r`` of the same two directories.

The goal (issue 29): the merge runs within 3x the time ``cp -r`` takes to copy their bytes, i.e.
ratio (cp time / merge time) >= 0.33. Both run as subprocesses on warm page caches, into the same
filesystem; the merge is the command users run (``eva merge ... --into``: validation of both
sessions, every MP4 probed, parquet rewritten, MP4s copied, one syncfs), so a second baseline row
adds ``sync -f`` to the copy. Sessions: full 2 x 20 episodes x 3 cameras x 300 frames of 320x240
(10 s at 30 fps); quick 2 x 20 x 2 x 60 of 160x120. They are written once and cached under the
temp dir.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CACHE = Path(tempfile.gettempdir()) / "eva-bench-merge"
EPISODES = 20


def _sessions(quick: bool) -> tuple[list[Path], str]:
    from eva.capture.synthetic import write_synthetic_dataset

    cameras, frames, width, height = (2, 60, 160, 120) if quick else (3, 300, 320, 240)
    shape = f"{EPISODES}x{cameras}x{frames}x{width}x{height}"
    roots = []
    for seed in (1, 2):
        root = CACHE / f"{shape}-{seed}" / "raw"
        if not (root / "meta" / "info.json").is_file():
            shutil.rmtree(root.parent, ignore_errors=True)
            write_synthetic_dataset(
                root,
                episodes=EPISODES,
                frames=frames,
                cameras=cameras,
                width=width,
                height=height,
                seed=seed,
            )
        roots.append(root)
    return (
        roots,
        f"2 sessions x {EPISODES} episodes x {cameras} cameras x {frames} frames {width}x{height}",
    )


def _size(roots: list[Path]) -> int:
    return sum(p.stat().st_size for root in roots for p in root.rglob("*") if p.is_file())


def _best(run: Any, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def report(quick: bool = False) -> list[dict[str, Any]]:
    roots, shape = _sessions(quick)
    size = _size(roots)
    repeats = 3 if quick else 5
    with tempfile.TemporaryDirectory(prefix="eva-bench-merge-", dir=CACHE) as tmp:
        out = Path(tmp)
        eva = [sys.executable, "-m", "eva.cli", "merge", *map(str, roots), "--into"]

        def merge() -> None:
            subprocess.run([*eva, str(out / "merged" / "raw")], check=True, capture_output=True)
            shutil.rmtree(out / "merged")

        def copy(sync: bool) -> None:
            dest = out / "copied"
            dest.mkdir()
            subprocess.run(["cp", "-r", *map(str, roots), str(dest)], check=True)
            if sync:
                subprocess.run(["sync", "-f", str(dest)], check=True)
            shutil.rmtree(dest)

        # interleaved, so that a neighbour's load hits both sides alike
        merge_s, copy_s, synced_s = float("inf"), float("inf"), float("inf")
        for _ in range(repeats):
            merge_s = min(merge_s, _best(merge, 1))
            copy_s = min(copy_s, _best(lambda: copy(False), 1))
            synced_s = min(synced_s, _best(lambda: copy(True), 1))
    note = f"{shape}, {size / 1e6:.0f} MB; goal ratio >= 0.33 (within 3x); best of {repeats}"
    return [
        {
            "name": "eva merge vs cp -r of the same bytes",
            "value": round(merge_s, 3),
            "baseline": round(copy_s, 3),
            "ratio": round(copy_s / merge_s, 3),
            "unit": "s",
            "note": note,
        },
        {
            "name": "eva merge vs cp -r + sync -f",
            "value": round(merge_s, 3),
            "baseline": round(synced_s, 3),
            "ratio": round(synced_s / merge_s, 3),
            "unit": "s",
            "note": "the merge syncs the filesystem before it publishes",
        },
    ]


if __name__ == "__main__":
    for row in report(quick="--quick" in sys.argv):
        print(row)
