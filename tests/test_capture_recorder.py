"""Recorder lifecycle and automatic quality codes, on real rings, a real writer and real MP4s."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eva.capture import align
from eva.capture.quality_checks import IssueLog, StreamCheck
from eva.capture.recorder import Recorder, RecorderError
from eva.capture.ring import make_ring
from eva.capture.save_worker import FAILED, SAVED, remove_stale_markers
from eva.capture.sources import SimulatedRig
from eva.config import CollectionConfig, config_from_dict
from eva.dataset import layout
from eva.dataset.locks import flocked
from eva.dataset.reader import DatasetReader
from eva.dataset.validate import validate_dataset

pytestmark = pytest.mark.realtime

FRONT = "observation.images.front"
WRIST = "observation.images.wrist"
STATE = "observation.state"
H, W = 48, 64
FPS = 10


def make_config(tmp_path: Path, **overrides: Any) -> CollectionConfig:
    table: dict[str, Any] = {
        "log_dir": str(tmp_path / "logs"),
        "fps": FPS,
        "tasks": {"demo": ["wave", "point"], "other set": ["stack"]},
        "cameras": [
            {"key": FRONT, "width": W, "height": H},
            {"key": WRIST, "width": W, "height": H},
        ],
        "vectors": [{"name": STATE, "dim": 3, "discrete": [2]}],
        "encoder": {"preset": "ultrafast", "gop": 10},
        "min_episode_frames": 5,
        "stream_start_timeout_s": 0.5,
        "frozen_camera_s": 0.5,
        "clock_jump_s": 0.5,
    }
    table.update(overrides)
    return config_from_dict({"collection": table}).collection


def frame(i: int, cam: int = 0) -> np.ndarray:
    """A distinct image per sample (so no camera looks frozen)."""
    img = np.empty((H, W, 3), np.uint8)
    img[...] = (i * 7 + cam * 50) % 256
    img[0, 0, 0] = i % 251
    return img


def timeline(
    t0: float,
    t1: float,
    *,
    cameras: dict[str, int] | None = None,
    vector_hz: float = 50.0,
    vectors: bool = True,
) -> Iterator[tuple[float, str, str, int]]:
    """(t, kind, stream, sample number) in time order; cameras at FPS with a per-camera phase."""
    cams = cameras if cameras is not None else {FRONT: 0, WRIST: 1}
    events = []
    for key, c in cams.items():
        n = int(round((t1 - t0) * FPS))
        events += [(t0 + i / FPS + 0.003 * c, "image", key, i) for i in range(n + 1)]
    if vectors:
        n = int(round((t1 - t0) * vector_hz))
        events += [(t0 + i / vector_hz, "vector", STATE, i) for i in range(n + 1)]
    return iter(sorted(events))


def push_timeline(
    rec: Recorder, events: Iterator[tuple[float, str, str, int]], **mods: Any
) -> None:
    image_fn: Callable[[str, int, float], Any] = mods.get(
        "image_fn", lambda key, i, t: frame(i, 0 if key == FRONT else 1)
    )
    vector_fn: Callable[[int, float], Any] = mods.get(
        "vector_fn", lambda i, t: np.array([np.sin(t), t, float(int(t) % 2)])
    )
    for t, kind, stream, i in events:
        if kind == "image":
            data = image_fn(stream, i, t)
            if data is not None:
                rec.push_image(stream, t, data)
        else:
            data = vector_fn(i, t)
            if data is not None:
                rec.push_vector(stream, t, data)


def record(rec: Recorder, events: Iterator[Any] | None = None, **mods: Any) -> dict[str, Any]:
    """One STOPped episode; returns its job dict plus the episodes.jsonl row (if written)."""
    root = rec.start()
    push_timeline(rec, events if events is not None else timeline(0.0, 2.0), **mods)
    job = rec.stop()
    assert job.wait(60)
    out = job.as_dict()
    if job.episode_index is not None:
        out["row"] = DatasetReader(root).episode(job.episode_index)
    return out


def codes(result: dict[str, Any]) -> list[str]:
    return [i["code"] for i in result["row"]["quality_issues"]]


def detail(result: dict[str, Any], code: str) -> str:
    return next(i["detail"] for i in result["row"]["quality_issues"] if i["code"] == code)


@pytest.fixture
def rec(tmp_path: Path) -> Iterator[Recorder]:
    recorder = Recorder(make_config(tmp_path), durable=False)
    yield recorder
    recorder.close(timeout=60)


# ---- lifecycle ----


def test_clean_episode_is_green_and_complete(rec: Recorder) -> None:
    result = record(rec)
    assert result["state"] == SAVED and result["episode_index"] == 0
    row = result["row"]
    assert row["quality"] == "green" and row["quality_issues"] == []
    assert row["length"] == result["frames"] == 20  # grid 0.003 .. 2.0 s at 10 fps
    assert row["duration_seconds"] >= 0 and row["started_at"] <= row["ended_at"]
    align = row["alignment"]
    assert align["fps"] == FPS and align["grid_start"] == pytest.approx(0.003)
    assert align["cameras"][FRONT]["skew_violations"] == 0
    root = rec.dataset_dir()
    reader = DatasetReader(root)
    table = reader.read_table(0)
    assert table.num_rows == 20
    assert reader.count_frames(0, FRONT) == 20 and reader.count_frames(0, WRIST) == 20
    # The frames handed to the encoder are exactly the pushed ones (the sidecar counts them).
    pushed = np.stack([frame(i) for i in range(20)])
    want = [np.bincount(pushed[..., c].ravel(), minlength=256) for c in range(3)]
    np.testing.assert_array_equal(reader.image_histograms(0)[FRONT], want)
    # capture_time is the chosen FRONT image's time; timestamp is the even grid.
    capture = table.column("capture_time").to_numpy()
    assert np.allclose(capture, 0.0 + np.arange(20) / FPS, atol=1e-9)
    assert np.allclose(table.column("timestamp").to_numpy(), np.arange(20) / FPS)
    # The gripper dim (2) is held, the others interpolated at grid instants.
    state = reader.read_vector(0, STATE)
    grid = 0.003 + np.arange(20) / FPS
    assert np.allclose(state[:, 1], grid, atol=1e-6)
    assert np.array_equal(state[:, 2], (grid.astype(int) % 2).astype(np.float32))
    # The decoded images are the ones pushed, nearest-first.
    batch = next(reader.iter_frames(0, FRONT, batch_size=20))
    assert abs(int(batch[5].mean()) - int(frame(5).mean())) <= 3
    assert validate_dataset(root) == []
    for path in (root.parent / "export", root.parent / "accepted", root.parent / "rejected"):
        assert not path.exists()


def test_zero_frame_episode_writes_nothing_and_uses_no_index(rec: Recorder) -> None:
    root = rec.start()
    job = rec.stop()
    assert job.wait(30) and job.state == SAVED and job.episode_index is None and job.frames == 0
    assert (root / layout.EPISODES).read_text() == ""
    assert not (root / "data").exists() or not any((root / "data").rglob("*.parquet"))
    assert record(rec)["episode_index"] == 0


def test_cancel_discards_samples_and_temp_files(rec: Recorder) -> None:
    root = rec.start()
    push_timeline(rec, timeline(0.0, 1.5))
    rec.cancel()
    assert rec.wait_idle(30)
    assert (root / layout.EPISODES).read_text() == ""
    assert not [p for p in (root / layout.WORK_DIR).iterdir() if p.is_dir()]
    assert rec.jobs == []
    assert all(v == 0 for v in rec.status()["backlog"].values())
    # The next episode starts clean: index 0, only its own samples.
    result = record(rec, timeline(10.0, 12.0))
    assert result["episode_index"] == 0 and result["row"]["quality"] == "green"
    assert result["row"]["alignment"]["grid_start"] == pytest.approx(10.003)


def test_cancel_racing_the_consumer_never_stops_it(rec: Recorder) -> None:
    # CANCEL lands at every point of the consumer's pass: right after it has drained the
    # episode, a pass that had seen no limit once took the CANCEL for a STOP with no save job
    # and the consumer died (every later START refused: "capture consumer failed").
    for k in range(200):
        rec.start()
        push_timeline(rec, timeline(3.0 * k, 3.0 * k + 0.3))
        time.sleep(0.002 * (k % 7))
        rec.cancel()
        assert rec.status()["consumer_error"] is None, k
    assert rec.wait_idle(30)
    assert rec.status()["consumer_error"] is None and rec.jobs == []
    assert record(rec, timeline(1000.0, 1002.0))["row"]["quality"] == "green"


def test_relaunch_appends_and_consecutive_stops_keep_order(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    with Recorder(cfg, durable=False) as first:
        assert record(first)["episode_index"] == 0
    with Recorder(cfg, durable=False) as second:
        jobs = []
        for k in range(2):  # START the next one while the previous may still be saving
            second.start(task="point")
            push_timeline(second, timeline(5.0 * k, 5.0 * k + 1.0))
            jobs.append(second.stop())
        assert second.wait_idle(60)
        assert [j.episode_index for j in jobs] == [1, 2]
    reader = DatasetReader(cfg.dataset_dir("demo"))
    assert [e["episode_index"] for e in reader.episodes] == [0, 1, 2]
    assert reader.tasks == {0: "wave", 1: "point"}
    assert validate_dataset(cfg.dataset_dir("demo")) == []


def test_crash_leftovers_are_reported_and_removed(tmp_path: Path, caplog) -> None:
    cfg = make_config(tmp_path)
    with Recorder(cfg, durable=False) as rec:
        record(rec)
    root = cfg.dataset_dir("demo")
    # What a crash mid-episode / mid-save leaves: an episode work dir and a saving marker.
    crashed = root / layout.WORK_DIR / "ep-crashed"
    crashed.mkdir()
    (crashed / "00.mp4").write_bytes(b"\x00" * 100)
    (root / layout.WORK_DIR / "saving-000001.lock").write_text("")
    # A crash after the files moved into place but before the episodes.jsonl row: orphans.
    (root / "data" / "chunk-000" / "episode_000001.parquet").write_bytes(b"torn")
    with (
        caplog.at_level(logging.WARNING, logger="eva.capture"),
        Recorder(cfg, durable=False) as rec,
    ):
        result = record(rec)
        assert any("ep-crashed" in m for m in rec.recovered)
        assert any("saving-000001.lock" in m for m in rec.recovered)
    assert "interrupted capture session" in caplog.text
    assert result["episode_index"] == 1
    assert not crashed.exists()
    assert validate_dataset(root) == []


def test_lifecycle_errors(rec: Recorder, tmp_path: Path) -> None:
    with pytest.raises(RecorderError, match="no episode"):
        rec.stop()
    with pytest.raises(RecorderError, match="no episode"):
        rec.cancel()
    rec.start()
    with pytest.raises(RecorderError, match="already recording"):
        rec.start()
    rec.cancel()
    assert rec.push_image(FRONT, 0.0, frame(0)) is False  # not recording: ignored
    with pytest.raises(Exception, match="escape"):
        rec.start("../../x")


def test_other_dataset_name_is_sanitised(rec: Recorder, tmp_path: Path) -> None:
    root = rec.start("other set")
    push_timeline(rec, timeline(0.0, 1.0))
    job = rec.stop()
    assert job.wait(30) and job.state == SAVED
    assert root == tmp_path / "logs" / "other_set" / "raw"
    assert DatasetReader(root).episode(0)["tasks"] == ["stack"]


def test_sim_rig_session(rec: Recorder) -> None:
    cfg = rec.config
    rig = SimulatedRig.from_config(cfg, vector_hz=100, duration_s=1.5, seed=3)
    rec.start()
    for s in rig.samples():
        (rec.push_image if s.kind == "image" else rec.push_vector)(s.stream, s.t, s.data)
    job = rec.stop()
    assert job.wait(30) and job.state == SAVED and job.quality == "green"
    assert 13 <= job.frames <= 15


# ---- backlog ----


def test_backlog_warning_names_stream_size_and_lag(tmp_path: Path, caplog) -> None:
    cfg = make_config(tmp_path, backlog={"warn_seconds": [0.3, 0.6]})
    with (
        caplog.at_level(logging.WARNING, logger="eva.capture"),
        Recorder(cfg, durable=False, consumer_throttle_s=0.2) as slow,
    ):
        result = record(slow, timeline(0.0, 3.0))
    assert result["row"]["quality"] == "green"  # slow is fine while memory lasts
    warnings = [r.getMessage() for r in caplog.records if "capture backlog" in r.getMessage()]
    assert warnings, caplog.text
    assert any(FRONT in w and "samples waiting" in w and "s behind" in w for w in warnings)
    assert result["row"]["capture_backlog"]["high_water"][FRONT] > 3


def test_backlog_hard_limit_counts_and_flags_red(tmp_path: Path) -> None:
    # 0.1 MB over two cameras: a few 9 KB frames each, then pushes are refused and counted.
    cfg = make_config(tmp_path, backlog={"max_memory_mb": 0.1, "ring_seconds": 0.2})
    with Recorder(cfg, durable=False, consumer_throttle_s=0.3) as slow:
        slow.start()
        refused = 0
        for t, kind, stream, i in timeline(0.0, 3.0):
            if kind == "image":
                refused += not slow.push_image(stream, t, frame(i))
            else:
                slow.push_vector(stream, t, np.array([0.0, t, 0.0]))
        job = slow.stop()
        assert job.wait(60)
        row = DatasetReader(cfg.dataset_dir("demo")).episode(job.episode_index)
        assert slow.status()["dropped"] == refused > 0
    assert row["quality"] == "red"
    issue = next(i for i in row["quality_issues"] if i["code"] == "capture_backlog_overflow")
    assert "refused" in issue["detail"] and "hard memory limit" in issue["detail"]
    assert sum(row["capture_backlog"]["refused"].values()) == refused


# ---- each automatic quality code from a crafted input ----


def test_episode_too_short(rec: Recorder) -> None:
    result = record(rec, timeline(0.0, 0.3))
    assert codes(result) == ["episode_too_short"] and "min_episode_frames=5" in detail(
        result, "episode_too_short"
    )


def test_non_monotonic_timestamp(rec: Recorder) -> None:
    events = list(timeline(0.0, 2.0))
    # One FRONT image arrives with a time earlier than the previous FRONT image.
    events.append((1.05, "image", FRONT, 99))
    events.sort(key=lambda e: 1.25 if (e[2] == FRONT and e[3] == 99) else e[0])
    result = record(rec, iter(events))
    assert "non_monotonic_timestamp" in codes(result)
    assert FRONT in detail(result, "non_monotonic_timestamp")
    assert result["row"]["length"] == 20  # the bad sample is left out, the rest aligns


def test_invalid_image_shape_and_vector_dim(rec: Recorder) -> None:
    def image_fn(key: str, i: int, t: float) -> np.ndarray:
        return np.zeros((10, 10, 3), np.uint8) if (key == WRIST and i == 4) else frame(i)

    def vector_fn(i: int, t: float) -> np.ndarray:
        return np.zeros(2) if i == 7 else np.array([0.0, t, 0.0])

    result = record(rec, image_fn=image_fn, vector_fn=vector_fn)
    assert {"invalid_image_shape", "invalid_vector_dim"} <= set(codes(result))
    assert WRIST in detail(result, "invalid_image_shape")
    assert "(10, 10, 3)" in detail(result, "invalid_image_shape")
    assert STATE in detail(result, "invalid_vector_dim")


def test_non_finite_value(rec: Recorder) -> None:
    result = record(rec, vector_fn=lambda i, t: np.array([np.nan if i == 30 else 0.0, t, 0.0]))
    assert codes(result) == ["non_finite_value"]
    assert "dims [0]" in detail(result, "non_finite_value") and "sample 30" in detail(
        result, "non_finite_value"
    )
    state = DatasetReader(rec.dataset_dir()).read_vector(0, STATE)
    assert np.isfinite(state).all()


def test_missing_camera_stream_and_missing_column(rec: Recorder) -> None:
    result = record(rec, timeline(0.0, 2.0, cameras={FRONT: 0}, vectors=False))
    assert set(codes(result)) == {"missing_camera_stream", "missing_configured_column"}
    assert WRIST in detail(result, "missing_camera_stream")
    assert STATE in detail(result, "missing_configured_column")
    assert result["row"]["length"] >= 15
    reader = DatasetReader(rec.dataset_dir())
    assert reader.count_frames(0, WRIST) == result["row"]["length"]


def test_unexpected_image_stream(rec: Recorder) -> None:
    def image_fn(key: str, i: int, t: float) -> np.ndarray:
        if i == 3:
            rec.push_image("observation.images.ghost", t, frame(i))
        return frame(i)

    result = record(rec, image_fn=image_fn)
    assert codes(result) == ["unexpected_image_stream"]
    assert "observation.images.ghost" in detail(result, "unexpected_image_stream")


def test_image_skew_exceeded(rec: Recorder) -> None:
    # WRIST misses 0.3 s of images (below the 0.5 s clock-jump limit): nearest images are far.
    events = [e for e in timeline(0.0, 2.0) if not (e[2] == WRIST and 0.75 < e[0] < 1.05)]
    result = record(rec, iter(events))
    assert codes(result) == ["image_skew_exceeded"]
    text = detail(result, "image_skew_exceeded")
    assert WRIST in text and "frame 8" in text
    assert result["row"]["alignment"]["cameras"][WRIST]["skew_violations"] == 3


def test_frozen_camera(rec: Recorder) -> None:
    still = frame(0)

    def image_fn(key: str, i: int, t: float) -> np.ndarray:
        return still if (key == FRONT and 5 <= i <= 14) else frame(i, 0 if key == FRONT else 1)

    result = record(rec, image_fn=image_fn)
    assert codes(result) == ["frozen_camera"]
    assert FRONT in detail(result, "frozen_camera") and "sample 5" in detail(
        result, "frozen_camera"
    )


def test_source_clock_discontinuity(rec: Recorder) -> None:
    events = [e for e in timeline(0.0, 2.0) if not (e[1] == "vector" and 0.6 < e[0] < 1.3)]
    result = record(rec, iter(events))
    assert codes(result) == ["source_clock_discontinuity"]
    assert STATE in detail(result, "source_clock_discontinuity")


def _wait_frames(rec: Recorder, n: int) -> None:
    deadline = time.monotonic() + 30
    while rec.status()["frames"] < n:
        assert time.monotonic() < deadline, rec.status()
        time.sleep(0.01)


def test_missing_camera_and_frame_count_mismatch_from_late_streams(rec: Recorder) -> None:
    root = rec.start()
    # FRONT alone for 2 s: the grid starts without WRIST and STATE (start timeout 0.5 s).
    push_timeline(rec, timeline(0.0, 2.0, cameras={FRONT: 0}, vectors=False))
    # Every FRONT-only row (0-19; row 20 would need a later image) is aligned before STATE's
    # sample at t=1.5 arrives: those past it make the frame count mismatch. Waiting for fewer
    # would race the consumer (then STATE holds the grid at t=1.5 and the counts agree).
    _wait_frames(rec, 2 * FPS)
    # WRIST shows up late and keeps going; STATE delivers a single late sample and stops.
    push_timeline(rec, timeline(2.1, 3.0, cameras={FRONT: 0, WRIST: 1}, vectors=False))
    rec.push_vector(STATE, 1.5, np.array([0.0, 1.5, 0.0]))
    job = rec.stop()
    assert job.wait(30) and job.state == SAVED
    row = DatasetReader(root).episode(job.episode_index)
    found = {i["code"]: i["detail"] for i in row["quality_issues"]}
    assert "missing_camera" in found and WRIST in found["missing_camera"]
    assert "frames 0-" in found["missing_camera"]
    assert "missing_configured_column" in found and STATE in found["missing_configured_column"]
    assert "frame_count_mismatch" in found


def test_a_camera_lagging_behind_the_grid_start_still_aligns(tmp_path: Path, caplog) -> None:
    """A camera whose first frames are stamped before the grid start (its decoder still worked
    through frames received before START) arrives after the grid is fixed: those frames are
    freed, never left to fill the camera's pending buffer and block alignment for good."""
    config = make_config(tmp_path, stream_start_timeout_s=30.0)
    with Recorder(config, durable=False) as recorder, caplog.at_level(logging.WARNING):
        root = recorder.start()
        # WRIST and STATE from t=1.0; FRONT from t=0.0 (ten frames older than the grid start).
        # FRONT's first frame goes first: every stream has a first sample before WRIST can fill
        # its pending buffer, so the grid starts at 1.0 with FRONT present whatever the
        # consumer thread's timing (else a full buffer starts the grid without FRONT).
        front = list(timeline(0.0, 3.0, cameras={FRONT: 0}, vectors=False))
        push_timeline(recorder, iter(front[:1]))
        push_timeline(recorder, timeline(1.0, 3.0, cameras={WRIST: 1}))
        push_timeline(recorder, iter(front[1:]))
        job = recorder.stop()
        assert job.wait(60) and job.state == SAVED, job.error
    assert "made no progress" not in caplog.text
    assert job.frames == 20 and job.episode_index == 0  # grid 1.003 .. 3.0 s at 10 fps
    row = DatasetReader(root).episode(0)
    assert row["quality"] == "green", row["quality_issues"]
    capture = DatasetReader(root).read_table(0).column("capture_time").to_numpy()
    assert np.allclose(capture, 1.0 + np.arange(20) / FPS, atol=1e-9)  # FRONT's own frames


def test_source_process_samples_captured_before_start_are_not_the_episodes(
    tmp_path: Path,
) -> None:
    """Rings fed by source processes carry wall-clock times: a frame captured just before START
    but pushed after it (a demuxer releases a frame when the next one arrives) is left out, so
    the grid starts at the episode's own first samples. A stream on another clock is kept."""
    # all pushed at once, not in real time: the grid must wait for every stream's first sample
    config = make_config(tmp_path, stream_start_timeout_s=30.0)
    shapes = {FRONT: (H, W, 3), WRIST: (H, W, 3), STATE: (3,)}
    rings = {
        name: make_ring(shape, np.uint8 if len(shape) == 3 else np.float64)
        for name, shape in shapes.items()
    }
    with Recorder(config, durable=False, rings=rings) as recorder:
        root = recorder.start()
        t0 = time.time()
        # every stream from 0.25 s before START: those samples were captured before it
        for i in range(-5, 20):
            t = t0 + i / FPS
            rings[FRONT].push(t, frame(i + 5, 0))
            rings[WRIST].push(t + 0.003, frame(i + 5, 1))
            for j in range(5):
                rings[STATE].push(t + j / (5 * FPS), np.array([0.0, t, 0.0]))
        job = recorder.stop()
        assert job.wait(60) and job.state == SAVED, job.error
        row = DatasetReader(root).episode(job.episode_index)
        assert row["alignment"]["grid_start"] >= t0 - 1 / FPS  # not the frames before START
        assert row["alignment"]["grid_start"] == pytest.approx(t0 + 0.003, abs=0.021)
        assert row["quality"] == "green", row["quality_issues"]
        # a stream 100 s behind the wall clock (another clock) keeps its samples: reported
        root = recorder.start()
        t0 = time.time()
        for i in range(20):
            t = t0 + i / FPS
            rings[FRONT].push(t - 100.0, frame(i, 0))
            rings[WRIST].push(t + 0.003, frame(i, 1))
            rings[STATE].push(t, np.array([0.0, t, 0.0]))
        job = recorder.stop()
        assert job.wait(60)
        found = {i["code"]: i["detail"] for i in job.quality_issues}
        assert job.frames == 0 and FRONT in found["source_clock_discontinuity"], found


def test_backend_reference_rings_work_too(tmp_path: Path) -> None:
    with Recorder(make_config(tmp_path), durable=False, native=False) as ref:
        result = record(ref)
    assert result["row"]["quality"] == "green" and result["row"]["length"] == 20


def test_failed_save_is_reported(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    with Recorder(cfg, durable=False) as rec:
        root = rec.start()
        push_timeline(rec, timeline(0.0, 1.0))
        # Make the commit fail: the data directory is a file.
        (root / "data").write_text("not a directory")
        job = rec.stop()
        assert job.wait(30)
        assert job.state == FAILED and job.error and job.episode_index is None
        (root / "data").unlink()
        assert record(rec)["episode_index"] == 0  # the recorder keeps working


def test_streaming_alignment_equals_batch_alignment_of_all_samples(rec: Recorder) -> None:
    """Rows aligned incrementally while recording == the alignment rule (docs/capture.md) applied to the whole episode."""
    cfg = rec.config
    rig = SimulatedRig.from_config(cfg, vector_hz=97, duration_s=3.0, seed=11, jitter_s=0.01)
    samples = list(rig.samples())
    rec.start()
    for s in samples:
        (rec.push_image if s.kind == "image" else rec.push_vector)(s.stream, s.t, s.data)
    job = rec.stop()
    assert job.wait(30) and job.state == SAVED and job.quality == "green", job.quality_issues
    times = {
        name: np.array([s.t for s in samples if s.stream == name]) for name in (FRONT, WRIST, STATE)
    }
    start = max(t[0] for t in times.values())
    end = min(t[-1] for t in times.values())
    n = align.grid_length(start, end, FPS)
    grid = align.grid_times(start, FPS, 0, n)
    idx, _ = align.nearest_indices(times[FRONT], grid, cfg.skew_tolerance)
    values = np.array([s.data for s in samples if s.stream == STATE])
    expected_state = align.align_vector(times[STATE], values, grid, [2]).astype(np.float32)
    reader = DatasetReader(rec.dataset_dir())
    table = reader.read_table(0)
    assert table.num_rows == n == job.frames
    assert np.array_equal(table.column("capture_time").to_numpy(), times[FRONT][idx])
    assert np.array_equal(reader.read_vector(0, STATE), expected_state)


def test_streams_on_different_clocks_are_reported(tmp_path: Path, caplog) -> None:
    # Cameras on a wall clock, the state on a monotonic clock: no common span, nothing to save.
    # (A long start timeout: the grid start waits until every stream has shown up.)
    events = list(timeline(1000.0, 1002.0, vectors=False))
    events += list(timeline(5.0, 7.0, cameras={}, vector_hz=50.0))
    cfg = make_config(tmp_path, stream_start_timeout_s=100.0)
    with (
        caplog.at_level(logging.WARNING, logger="eva.capture"),
        Recorder(cfg, durable=False) as rec,
    ):
        result = record(rec, iter(sorted(events)))
    assert result["state"] == SAVED and result["episode_index"] is None
    found = {i["code"]: i["detail"] for i in result["quality_issues"]}
    assert "source_clock_discontinuity" in found and STATE in found["source_clock_discontinuity"]
    assert "aligned no frame" in caplog.text


def _wait_for_episode_dir(root: Path) -> Path:
    """The episode work dir the consumer creates under .eva-work once START is processed, once
    its crash spool has started (its manifest and row stream are the dir's first files)."""
    work = root / layout.WORK_DIR
    deadline = time.monotonic() + 30
    while not (found := [p for p in work.iterdir() if (p / "rows.arrows").exists()]):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return found[0]


def test_failure_while_recording_fails_the_job_and_recorder_goes_on(rec: Recorder) -> None:
    # The encoder cannot create its MP4 any more (the dir holds the crash spool's first files).
    shutil.rmtree(_wait_for_episode_dir(rec.start()))
    push_timeline(rec, timeline(0.0, 1.0))
    job = rec.stop()
    assert job.wait(30) and job.state == FAILED and job.error
    assert rec.status()["consumer_error"] is None
    assert record(rec)["episode_index"] == 0


def test_one_camera_encoder_failure_fails_the_job_and_publishes_nothing(rec: Recorder) -> None:
    """A real failure in one camera's encoder thread (its MP4 path is taken by a directory)."""
    root = rec.start()
    episode_dir = _wait_for_episode_dir(root)
    (episode_dir / "01.mp4").mkdir()  # WRIST is the second camera; encoders open on first rows
    push_timeline(rec, timeline(0.0, 1.0))
    job = rec.stop()
    assert job.wait(30) and job.state == FAILED and job.episode_index is None
    assert job.error and f"camera {WRIST}" in job.error and "01.mp4" in job.error
    assert not episode_dir.exists()
    assert DatasetReader(root).episodes == []
    assert not (root / "data").exists() and not (root / "videos").exists()
    assert rec.status()["consumer_error"] is None
    assert record(rec)["episode_index"] == 0  # the next episode records normally


def test_remove_stale_markers_keeps_a_held_marker(tmp_path: Path) -> None:
    work = tmp_path / layout.WORK_DIR
    work.mkdir()
    stale = work / layout.saving_marker_name(1)
    stale.touch()
    held = work / layout.saving_marker_name(2)
    with flocked(held):  # a writer committing episode 2 right now
        removed = remove_stale_markers(tmp_path)
    assert removed == [stale]
    assert not stale.exists()
    assert held.exists()


def test_stop_after_the_consumer_died_fails_the_job_at_once(rec: Recorder) -> None:
    """A job nobody will process must not stay queued (job.wait() would never return)."""
    rec.start()
    rec.consumer_throttle_s = "slow"  # type: ignore[assignment]  # a real TypeError in its loop
    deadline = time.monotonic() + 30
    while rec.status()["consumer_error"] is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    job = rec.stop()
    assert job.wait(5) and job.state == FAILED
    assert job.error and "capture consumer failed" in job.error and "TypeError" in job.error
    with pytest.raises(RecorderError, match="capture consumer failed"):
        rec.start()


def test_live_episode_of_another_recorder_is_not_reported_as_leftover(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    with Recorder(cfg, durable=False) as first, Recorder(cfg, durable=False) as second:
        episode_dir = _wait_for_episode_dir(first.start())
        with pytest.raises(RecorderError, match="another writer"):
            second.start()
        assert second.recovered == []
        assert episode_dir.exists()
        first.cancel()


def test_frozen_camera_names_the_first_identical_sample_across_a_left_out_one() -> None:
    """The freeze starts at the previous usable sample, not at the one just before (sample 2
    here is left out for its time, so the identical pair is samples 1 and 3)."""
    check = StreamCheck(FRONT, "camera", clock_jump_s=1.0, frozen_s=0.05)
    issues = IssueLog()
    frames = np.zeros((6, 4, 4, 3), np.uint8)
    frames[0] = 7  # then 1..5 are identical
    times = np.array([0.0, 0.1, 0.05, 0.2, 0.3, 0.4])
    ok = check.filter(times, frames, issues, lambda t: "")
    assert ok.tolist() == [True, True, False, True, True, True]
    details = {r["code"]: r["detail"] for r in issues.records()}
    assert "identical images from sample 1 (t=0.100 s)" in details["frozen_camera"]
