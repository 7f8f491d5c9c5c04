"""``eva merge`` of two 20-episode sessions against ``cp -r`` of the same two directories.

The goal (issue 29): the merge runs within 3x the time ``cp -r`` takes to copy their bytes, i.e.
ratio (cp time / merge time) >= 0.33. Both run as subprocesses on warm page caches, into the same
filesystem; the merge is the command users run (``eva merge ... --into``: validation of both
sessions, every MP4 inspected, parquet rewritten, MP4s copied, one syncfs), so a second baseline
row adds ``sync -f`` to the copy. Two pairs of sessions:

* synthetic: 2 x 20 episodes x 3 cameras x 300 frames of 320x240 (10 s at 30 fps; quick: 2 x 20
  x 2 x 60 of 160x120), small low-motion MP4s (~0.9 MB per camera episode), so the fixed costs
  (interpreter, imports, per-file checks) weigh most; written once and cached under the temp dir;
* realistic (full mode only): ``bench/corpus.py``'s ``eva`` corpus (eva's capture encoder on
  textured, moving, noisy footage) of 20 episodes x 3 cameras x 400 frames at 640x480 (~2.2 MB
  per camera episode, 133 MB a session), and a copy of it as the second session (cached beside
  the synthetic ones). Generating the corpus takes ~6 minutes the first time.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402  (beside this file; run_all puts bench/ on sys.path too)

CACHE = Path(tempfile.gettempdir()) / "eva-bench-merge"
EPISODES = 20
REALISTIC = dataclasses.replace(corpus.FULL, episodes=EPISODES)


def _synthetic_sessions(quick: bool) -> tuple[list[Path], str]:
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
        f"synthetic: 2 sessions x {EPISODES} episodes x {cameras} cameras x {frames} frames "
        f"{width}x{height}",
    )


def _realistic_sessions() -> tuple[list[Path], str]:
    first = corpus.ensure_corpus("eva", REALISTIC)
    second = CACHE / f"corpus-{first.parent.name}-copy" / "raw"
    if not (second / "meta" / "info.json").is_file():
        shutil.rmtree(second.parent, ignore_errors=True)
        partial = second.parent.with_name(second.parent.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(first, partial / "raw")
        partial.rename(second.parent)
    return [first, second], f"realistic: 2 sessions x the eva corpus ({REALISTIC.describe()})"


def _size(roots: list[Path]) -> int:
    return sum(p.stat().st_size for root in roots for p in root.rglob("*") if p.is_file())


def _timed(run: Callable[[], None]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _compare(roots: list[Path], shape: str, repeats: int, label: str) -> list[dict[str, Any]]:
    size = _size(roots)
    with tempfile.TemporaryDirectory(prefix="eva-bench-merge-", dir=CACHE) as tmp:
        out = Path(tmp)
        eva = [sys.executable, "-m", "eva.cli", "merge", *map(str, roots), "--into"]

        def merge() -> None:
            subprocess.run([*eva, str(out / "merged" / "raw")], check=True, capture_output=True)

        def copy(sync: bool) -> None:
            dest = out / "copied"
            dest.mkdir()
            subprocess.run(["cp", "-r", *map(str, roots), str(dest)], check=True)
            if sync:
                subprocess.run(["sync", "-f", str(dest)], check=True)

        # interleaved, so that a neighbour's load hits both sides alike; each result removed
        # (and its removal flushed) outside the timing
        best = {"merge": float("inf"), "copy": float("inf"), "synced": float("inf")}
        runs: dict[str, Callable[[], None]] = {
            "merge": merge,
            "copy": lambda: copy(False),
            "synced": lambda: copy(True),
        }
        for _ in range(repeats):
            for name, run in runs.items():
                subprocess.run(["sync", "-f", str(out)], check=True)
                best[name] = min(best[name], _timed(run))
                for produced in ("merged", "copied"):
                    shutil.rmtree(out / produced, ignore_errors=True)
    note = f"{shape}, {size / 1e6:.0f} MB; goal ratio >= 0.33 (within 3x); best of {repeats}"
    merge_s, copy_s, synced_s = best["merge"], best["copy"], best["synced"]
    return [
        {
            "name": f"eva merge vs cp -r of the same bytes ({label})",
            "value": round(merge_s, 3),
            "baseline": round(copy_s, 3),
            "ratio": round(copy_s / merge_s, 3),
            "unit": "s",
            "note": note,
        },
        {
            "name": f"eva merge vs cp -r + sync -f ({label})",
            "value": round(merge_s, 3),
            "baseline": round(synced_s, 3),
            "ratio": round(synced_s / merge_s, 3),
            "unit": "s",
            "note": "the merge syncs the filesystem before it publishes",
        },
    ]


def report(quick: bool = False) -> list[dict[str, Any]]:
    CACHE.mkdir(parents=True, exist_ok=True)
    repeats = 3 if quick else 5
    rows = _compare(*_synthetic_sessions(quick), repeats, "synthetic")
    if not quick:
        rows += _compare(*_realistic_sessions(), repeats, "realistic")
    return rows


if __name__ == "__main__":
    for row in report(quick="--quick" in sys.argv):
        print(row)
