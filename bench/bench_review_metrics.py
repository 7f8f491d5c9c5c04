"""Review metrics (eva.dataset.motion_metrics): their cost at capture, eva qc --rescore's speed,
and how the anomaly score ranks seeded defects.

``report(quick)`` rows, every baseline the issue's goal:

* ``capture metrics CPU share``: the CPU the save-time metrics take for one simulated session's
  episode (``add_metrics``'s work: the action and capture-time columns of the saved episode,
  14 dims with gripper names, best of 5), against the process CPU of recording that session
  (``bench_capture.run_session``: 3 cameras 640x480 at 30 fps, state/action at 200 Hz). Goal
  <= 5%. The frozen-camera run length adds one ``max`` per identical frame to the frame
  comparison capture already made (``StreamCheck``): not measurable apart.
* ``rescore x real time``: ``eva.quality.rescore.rescore`` of 100 episodes at 640x480 (one
  camera, libx264; the frozen camera from the MP4 sample tables, no decoding): recorded seconds
  per wall second. Goal >= 20.
* ``seeded defects in top 15``: 100 synthetic episodes, 10 with a defect (kinds and episodes
  drawn from a fixed seed over the 7 kinds of ``eva.capture.synthetic_defects``), rescored, then
  how many of the 10 rank among the 15 highest scores. Goal >= 9.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_capture import run_session  # noqa: E402  (beside this file; run_all puts bench/ on sys.path)

from eva.capture.synthetic import joint_names  # noqa: E402
from eva.capture.synthetic_defects import DEFECTS, write_defect_dataset  # noqa: E402
from eva.dataset import layout, motion_metrics  # noqa: E402
from eva.dataset.features import CAPTURE_TIME  # noqa: E402
from eva.dataset.reader import DatasetReader  # noqa: E402
from eva.quality.rescore import rescore  # noqa: E402


def capture_share(seconds: float, work: Path) -> dict[str, float]:
    """Metrics CPU over the session's CPU, for one recorded episode of ``seconds``."""
    session = run_session(seconds, work / "logs")
    root = next((work / "logs").glob("*/raw"))
    reader = DatasetReader(root)
    action = reader.read_vector(0, layout.ACTION)
    times = reader.read_table(0, [CAPTURE_TIME]).column(CAPTURE_TIME).to_numpy()
    names = joint_names(action.shape[1])
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        metrics = motion_metrics.episode_metrics(action, names, 30.0, times, {"cam0": 0.0})
        motion_metrics.row_fields(metrics, motion_metrics.MetricThresholds())
        best = min(best, time.process_time() - t0)
    return {"metrics_cpu_s": best, "session_cpu_s": session["cpu_s"], "recorded_s": seconds}


def seeded_defects(episodes: int, count: int, seed: int = 31) -> dict[int, str]:
    rng = np.random.default_rng(seed)
    chosen = rng.choice(episodes, size=count, replace=False)
    return {int(ep): DEFECTS[int(rng.integers(0, len(DEFECTS)))] for ep in chosen}


def ranking(work: Path, episodes: int = 100, count: int = 10, top: int = 15) -> dict[str, Any]:
    defects = seeded_defects(episodes, count)
    root = write_defect_dataset(work / "rank", episodes=episodes, defects=defects, frames=150)
    rows = [u.row for u in rescore(root)]
    rows.sort(key=lambda r: (-r["anomaly_score"], r["episode_index"]))
    found = {r["episode_index"] for r in rows[:top]} & set(defects)
    missed = sorted(set(defects) - found)
    return {"hits": len(found), "missed": [(ep, defects[ep]) for ep in missed]}


def rescore_speed(work: Path, episodes: int, frames: int) -> dict[str, float]:
    root = write_defect_dataset(
        work / "speed", episodes=episodes, defects={}, frames=frames, width=640, height=480
    )
    t0 = time.perf_counter()  # one run: a second would find the MP4 sample tables cached
    rescore(root)
    return {"wall_s": time.perf_counter() - t0, "recorded_s": episodes * frames / 30.0}


def report(quick: bool = False) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="eva-bench-review-") as tmp:
        work = Path(tmp)
        share = capture_share(10.0 if quick else 30.0, work)
        value = share["metrics_cpu_s"] / share["session_cpu_s"]
        rows.append(
            {
                "name": "capture metrics CPU share",
                "value": round(100 * value, 3),
                "baseline": 5.0,
                "ratio": round(0.05 / value, 1) if value > 0 else None,
                "unit": "%",
                "note": f"metrics {share['metrics_cpu_s'] * 1e3:.1f} ms CPU vs session "
                f"{share['session_cpu_s']:.1f} s CPU for {share['recorded_s']:g} s recorded",
            }
        )
        speed = rescore_speed(work, 100, 60 if quick else 150)
        factor = speed["recorded_s"] / speed["wall_s"]
        rows.append(
            {
                "name": "rescore 100 episodes 640x480",
                "value": round(factor, 1),
                "baseline": 20.0,
                "ratio": round(factor / 20.0, 2),
                "unit": "x real time",
                "note": f"{speed['recorded_s']:g} s recorded rescored in {speed['wall_s']:.2f} s",
            }
        )
        ranked = ranking(work)
        rows.append(
            {
                "name": "seeded defects in top 15",
                "value": ranked["hits"],
                "baseline": 9,
                "ratio": round(ranked["hits"] / 9, 2),
                "unit": "of 10",
                "note": f"100 episodes, 10 seeded; missed {ranked['missed'] or 'none'}",
            }
        )
    return rows


if __name__ == "__main__":
    for row in report(quick="--quick" in sys.argv):
        print(row)
