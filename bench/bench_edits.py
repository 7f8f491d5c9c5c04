"""A v3 export of trimmed episodes against the same export without the trims (issue 29: at most
1.1x, i.e. ratio untrimmed / trimmed >= 0.91).

Two copies of one raw dataset, the second with every episode trimmed to its middle 80% (idle
frames cut at the start and the end, ``eva edit --trim``); both exported to lerobot_v3 in this
process, interleaved, best of N. The trimmed export packet-copies the same shards (from/to
timestamps select the kept frames) and computes each trimmed episode's stats over its kept
frames: the numeric columns from the kept rows and each camera's pixel histogram from its kept
frames, decoded from the recorded MP4 (``eva.export.source.kept_frame_stats``). Dataset: full
20 episodes x 2 cameras x 300 frames of 320x240; quick 20 x 2 x 60 of 160x120; written once and
cached under the temp dir.
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
    from eva.quality.edits import EditRequest, edit_episodes

    cameras, frames, width, height = (2, 60, 160, 120) if quick else (2, 300, 320, 240)
    shape = f"{EPISODES} episodes x {cameras} cameras x {frames} frames {width}x{height}"
    base = CACHE / f"{EPISODES}x{cameras}x{frames}x{width}x{height}"
    plain, trimmed = base / "plain" / "raw", base / "trimmed" / "raw"
    if not (trimmed / "meta" / "info.json").is_file():
        shutil.rmtree(base, ignore_errors=True)
        write_synthetic_dataset(
            plain, episodes=EPISODES, frames=frames, cameras=cameras, width=width, height=height
        )
        shutil.copytree(plain, trimmed, symlinks=True)
        cut = frames // 10
        edit_episodes(trimmed, list(range(EPISODES)), EditRequest(trim=(cut, frames - cut)))
    return plain, trimmed, shape


def report(quick: bool = False) -> list[dict[str, Any]]:
    from eva.export.pipeline import export_dataset

    plain, trimmed, shape = _datasets(quick)
    repeats = 3 if quick else 5
    best = {plain: float("inf"), trimmed: float("inf")}
    for _ in range(repeats):  # interleaved: a neighbour's load hits both sides alike
        for root in (plain, trimmed):
            start = time.perf_counter()
            export_dataset(root, "lerobot_v3")
            best[root] = min(best[root], time.perf_counter() - start)
    return [
        {
            "name": "v3 export, every episode trimmed to its middle 80% vs untrimmed",
            "value": round(best[trimmed], 3),
            "baseline": round(best[plain], 3),
            "ratio": round(best[plain] / best[trimmed], 3),
            "unit": "s",
            "note": f"{shape}; goal ratio >= 0.91 (at most 1.1x); best of {repeats}",
        }
    ]


if __name__ == "__main__":
    for row in report(quick="--quick" in sys.argv):
        print(row)
