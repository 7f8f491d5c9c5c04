"""A v3 export of trimmed episodes against the same export without the trims (issue 29: at most
1.1x, i.e. ratio untrimmed / trimmed >= 0.91).

Two copies of one raw dataset, the second with every episode trimmed to its middle 80% (idle
frames cut at the start and the end, ``eva edit --trim``); both exported to lerobot_v3 in this
process, interleaved, best of N. The trimmed export packet-copies the same shards (from/to
timestamps select the kept frames) and computes each trimmed episode's stats over its kept
frames: the numeric columns from the kept rows, each camera's pixel histogram from the cache
``eva edit`` wrote when it set the trim (``eva.dataset.kept_histograms``: the kept frames
decoded once). A second row: what that edit costs (``eva edit --trim`` of the 20 episodes on
a fresh copy, its decodes included), and a third: the trimmed export without the cache (the
kept frames decoded by the export, as for a dataset whose trims another tool wrote). Dataset:
full 20 episodes x 2 cameras x 300 frames of 320x240; quick 20 x 2 x 60 of 160x120; written
once and cached under the temp dir.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CACHE = Path(tempfile.gettempdir()) / "eva-bench-edits"
EPISODES = 20


def _datasets(quick: bool) -> tuple[Path, Path, str]:
    from eva.capture.synthetic import write_synthetic_dataset
    from eva.dataset import layout
    from eva.quality.edits import EditRequest, edit_episodes

    cameras, frames, width, height = (2, 60, 160, 120) if quick else (2, 300, 320, 240)
    shape = f"{EPISODES} episodes x {cameras} cameras x {frames} frames {width}x{height}"
    base = CACHE / f"{EPISODES}x{cameras}x{frames}x{width}x{height}"
    plain, trimmed = base / "plain" / "raw", base / "trimmed" / "raw"
    if not (trimmed / layout.KEPT_HISTOGRAMS).is_file():
        shutil.rmtree(base, ignore_errors=True)
        write_synthetic_dataset(
            plain, episodes=EPISODES, frames=frames, cameras=cameras, width=width, height=height
        )
        shutil.copytree(plain, trimmed, symlinks=True)
        cut = frames // 10
        edit_episodes(trimmed, list(range(EPISODES)), EditRequest(trim=(cut, frames - cut)))
    return plain, trimmed, shape


def _edit_seconds(plain: Path, frames: int) -> float:
    """``eva edit --trim`` of every episode of a fresh copy of ``plain`` (the copy not timed)."""
    from eva.quality.edits import EditRequest, edit_episodes

    copy = plain.parent.parent / "edit-copy"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(plain, copy, symlinks=True)
    cut = frames // 10
    start = time.perf_counter()
    edit_episodes(copy, list(range(EPISODES)), EditRequest(trim=(cut, frames - cut)))
    seconds = time.perf_counter() - start
    shutil.rmtree(copy, ignore_errors=True)
    return seconds


def _uncached(trimmed: Path) -> Path:
    """A copy of ``trimmed`` without the kept-histogram cache (its export decodes)."""
    from eva.dataset import layout

    copy = trimmed.parent.parent / "uncached" / "raw"
    if not (copy / layout.INFO).is_file():
        shutil.copytree(trimmed, copy, symlinks=True)
    (copy / layout.KEPT_HISTOGRAMS).unlink(missing_ok=True)
    return copy


def report(quick: bool = False) -> list[dict[str, Any]]:
    from eva.export.pipeline import export_dataset

    plain, trimmed, shape = _datasets(quick)
    uncached = _uncached(trimmed)
    repeats = 3 if quick else 5
    best = {plain: float("inf"), trimmed: float("inf"), uncached: float("inf")}
    for _ in range(repeats):  # interleaved: a neighbour's load hits both sides alike
        for root in (plain, trimmed, uncached):
            start = time.perf_counter()
            export_dataset(root, "lerobot_v3")
            best[root] = min(best[root], time.perf_counter() - start)
    frames = 60 if quick else 300
    note = f"{shape}; best of {repeats}"
    return [
        {
            "name": "v3 export, every episode trimmed to its middle 80% vs untrimmed",
            "value": round(best[trimmed], 3),
            "baseline": round(best[plain], 3),
            "ratio": round(best[plain] / best[trimmed], 3),
            "unit": "s",
            "note": f"{note}; goal ratio >= 0.91 (at most 1.1x)",
        },
        {
            "name": "eva edit --trim of every episode (kept frames decoded once) vs the export",
            "value": round(_edit_seconds(plain, frames), 3),
            "baseline": round(best[plain], 3),
            "unit": "s",
            "note": shape,
        },
        {
            "name": "v3 export of the trims without the cache (kept frames decoded) vs untrimmed",
            "value": round(best[uncached], 3),
            "baseline": round(best[plain], 3),
            "ratio": round(best[plain] / best[uncached], 3),
            "unit": "s",
            "note": note,
        },
    ]


if __name__ == "__main__":
    for row in report(quick="--quick" in sys.argv):
        print(row)
