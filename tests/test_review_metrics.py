"""Review metrics (eva.dataset.motion_metrics): their definitions, capture storing them at save
time, eva qc --rescore and the worst-first queue of eva qc --list --sort score."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eva.capture.recorder import Recorder
from eva.capture.synthetic_defects import DEFECTS, write_defect_dataset
from eva.config import ConfigError, config_from_dict
from eva.dataset import motion_metrics as mm
from eva.dataset.reader import DatasetReader
from eva.dataset.validate import validate_dataset

FPS = 30


def _eva(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eva.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_idle_span_says_where_it_lies() -> None:
    ramp = np.linspace(0, 1, 90)[:, None].repeat(2, axis=1)
    for where, held in (("start", slice(0, 40)), ("middle", slice(30, 70)), ("end", slice(50, 90))):
        action = ramp.copy()
        action[held] = action[held.start]
        seconds, found = mm.idle_span(action, FPS, 1e-3)
        assert found == where and seconds == pytest.approx(39 / FPS)
    assert mm.idle_span(ramp, FPS, 1e-3) == (0.0, "none")


def test_gripper_chatter_saturation_and_grid_frames() -> None:
    names = ["joint_0", "Left_Gripper"]
    assert mm.gripper_dims(names) == [1]
    action = np.zeros((60, 2))
    action[:, 0] = np.sin(np.linspace(0, 3, 60))
    action[:, 1] = np.arange(60) // 2 % 2  # open/close every 2 frames: 29 reversals in 2 s
    assert mm.gripper_chatter(action, FPS, [1]) == pytest.approx(28 / 2.0)
    pinned = action.copy()
    pinned[:, 0] = np.minimum(pinned[:, 0], 0.5)
    seconds, dim = mm.saturation(pinned, FPS, skip=[1])
    assert dim == 0 and seconds > 1.0
    assert mm.saturation(action, FPS, skip=[1])[0] == pytest.approx(1 / FPS)
    times = np.arange(20) / FPS
    times[5] = times[4]  # row 5 reuses row 4's image: one duplicate, not also a missing one
    times[12:] += 3 / FPS  # three grid instants with no image
    assert mm.grid_frames(times, FPS) == (1, 3)


def test_score_orders_and_names_reasons_and_red_only_where_enabled() -> None:
    limits = mm.MetricThresholds()
    clean = {"idle_s": 0.2, "jerk_ldj": -16.0, "gripper_chatter_hz": 0.5, "saturation_s": 0.1}
    assert mm.score(clean, limits) == (0.0, [])
    bad = {**clean, "idle_s": 3.0, "idle_where": "start", "missing_frames": 8}
    value, reasons = mm.score(bad, limits)
    assert value == pytest.approx(3.0 + 4.0)
    assert reasons == ["8 missing frames (limit 2)", "idle 3.0 s at start (limit 1 s)"]
    assert mm.red_issues(bad, limits) == []
    red = mm.red_issues(bad, mm.MetricThresholds(red=("idle", "jerk")))
    assert [i["code"] for i in red] == ["idle_span"]


def test_metric_config_keys(tmp_path: Path) -> None:
    def parse(metrics: dict[str, Any]) -> mm.MetricThresholds:
        table = {"log_dir": str(tmp_path), "tasks": {"d": ["t"]}, "metrics": metrics}
        return config_from_dict({"collection": table}).collection.metrics

    got = parse({"idle_s": 2, "jerk_ldj": -20, "red": ["idle", "missing_frames"]})
    assert got.idle_s == 2.0 and got.jerk_ldj == -20.0 and got.red == ("idle", "missing_frames")
    with pytest.raises(ConfigError, match="collection.metrics.idle_sec: unknown key"):
        parse({"idle_sec": 2})
    with pytest.raises(ConfigError, match="unknown metric 'idel'"):
        parse({"red": ["idel"]})


def test_seeded_defects_rank_first_with_reasons(tmp_path: Path) -> None:
    """One episode of each defect kind among 21 rank as the 7 worst, each naming its defect;
    every clean one scores 0 (the 100-episode version is bench/bench_review_metrics.py)."""
    defects = {2 + 3 * k: kind for k, kind in enumerate(DEFECTS)}
    root = write_defect_dataset(tmp_path / "ds", episodes=21, defects=defects, frames=120)
    done = _eva("qc", str(root), "--rescore", "--json")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 21
    listed = _eva("qc", str(root), "--list", "--sort", "score", "--json")
    assert listed.returncode == 0, listed.stderr
    queue = [json.loads(line) for line in listed.stdout.splitlines()]
    assert {e["episode_index"] for e in queue[:7]} == set(defects)
    words = {
        "idle": "idle",
        "jerk": "jerk",
        "gripper_chatter": "gripper chatter",
        "saturation": "at its limit",
        "frozen_camera": "frozen",
        "duplicated_frames": "duplicated",
        "missing_frames": "missing",
    }
    for entry in queue[:7]:
        kind = defects[entry["episode_index"]]
        assert any(words[kind] in r for r in entry["anomaly_reasons"]), (kind, entry)
    assert all(e["anomaly_score"] == 0.0 and e["anomaly_reasons"] == [] for e in queue[7:])
    assert validate_dataset(root) == []
    text = _eva("qc", str(root), "--list", "--sort", "score")
    assert text.returncode == 0 and "reasons: " in text.stdout.splitlines()[1]
    # A second rescore of one episode measures the same (frozen camera from the MP4 packets).
    frozen = next(ep for ep, kind in defects.items() if kind == "frozen_camera")
    again = _eva("qc", str(root), "--rescore", str(frozen), "--json")
    first = next(e for e in queue if e["episode_index"] == frozen)
    assert json.loads(again.stdout)["anomaly_score"] == first["anomaly_score"] > 0
    bad = _eva("qc", str(root), "--sort", "score")
    assert bad.returncode == 2 and "--sort goes with --list" in bad.stderr


@pytest.mark.realtime
def test_capture_stores_metrics_at_save_time(tmp_path: Path) -> None:
    """A recorded episode's row holds the metrics measured on the raw frames; a metric the rig
    enables in metrics.red adds its red code, the others only score."""
    h, w, fps = 48, 64, 10
    table = {
        "log_dir": str(tmp_path / "logs"),
        "fps": fps,
        "tasks": {"demo": ["wave"]},
        "cameras": [{"key": "observation.images.front", "width": w, "height": h}],
        "vectors": [{"name": "action", "dim": 2, "discrete": [1], "names": ["arm", "gripper"]}],
        "encoder": {"preset": "ultrafast", "gop": 10},
        "min_episode_frames": 5,
        "frozen_camera_s": 5.0,  # the frozen check stays quiet; its run length is measured
        "metrics": {"red": ["gripper_chatter"]},
    }
    cfg = config_from_dict({"collection": table}).collection
    rec = Recorder(cfg, durable=False)
    try:
        root = rec.start()
        still = np.full((h, w, 3), 90, np.uint8)
        for i in range(41):
            t = i / fps
            image = still if 10 <= i <= 25 else np.full((h, w, 3), i * 5 % 256, np.uint8)
            rec.push_image("observation.images.front", t, image)
            rec.push_vector("action", t, np.array([np.sin(t), float(i % 2)]))
        job = rec.stop()
        assert job.wait(60)
    finally:
        rec.close(timeout=60)
    row = DatasetReader(root).episode(0)
    metrics = row["quality_metrics"]
    assert metrics["frozen_camera_s"]["observation.images.front"] == pytest.approx(1.5)
    assert metrics["frozen_camera_measured_on"] == "frames"
    assert metrics["gripper_chatter_hz"] > 5
    assert [i["code"] for i in row["quality_issues"]] == ["gripper_chatter"]
    assert row["quality"] == "red"
    assert row["anomaly_score"] > 0 and any("frozen" in r for r in row["anomaly_reasons"])
    # --rescore keeps the capture's frozen measure (on frames) and never changes the flag
    assert _eva("qc", str(root), "--rescore").returncode == 0
    again = DatasetReader(root).episode(0)
    assert again["quality_metrics"]["frozen_camera_measured_on"] == "frames"
    assert again["quality"] == "red" and again["anomaly_score"] == row["anomaly_score"]
    assert validate_dataset(root) == []


def test_validate_names_a_metric_field_of_the_wrong_type(tmp_path: Path) -> None:
    from eva.quality.verdicts import update_episode_rows

    root = write_defect_dataset(tmp_path / "ds", episodes=2, defects={}, frames=30)

    def spoil(row: dict[str, Any]) -> None:
        row.update(anomaly_score="high", anomaly_reasons=[1], quality_metrics=[])

    update_episode_rows(root, [1], spoil, "test")
    found = [p.message for p in validate_dataset(root) if p.code == "invalid_episode_row"]
    assert len(found) == 3 and all("episode 1" in m for m in found)
    assert any("anomaly_score 'high' is not a number" in m for m in found)
    # the queue still lists it (as unscored, last) rather than failing
    listed = _eva("qc", str(root), "--list", "--sort", "score", "--json")
    assert listed.returncode == 0
    assert [json.loads(line)["anomaly_score"] for line in listed.stdout.splitlines()] == [
        None,
        None,
    ]
