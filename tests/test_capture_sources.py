"""Sources: the deterministic simulated rig and dataset replay, fed into a real recorder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from video_helpers import encode_video

from eva.capture.recorder import Recorder
from eva.capture.sources import ReplaySource, Sample, SimulatedRig, SourcePump
from eva.config import CameraConfig, VectorConfig, config_from_dict
from eva.dataset.errors import DatasetError
from eva.dataset.reader import DatasetReader

pytestmark = pytest.mark.realtime

CAMS = [CameraConfig("observation.images.a", 64, 48), CameraConfig("observation.images.b", 32, 24)]
VECS = [VectorConfig("observation.state", 14, (6, 13)), VectorConfig("action", 14, (6, 13))]


def rig(seed: int) -> SimulatedRig:
    return SimulatedRig(CAMS, VECS, fps=30, vector_hz=200, seed=seed, duration_s=1.0)


def test_sim_rig_is_deterministic_with_jittered_increasing_streams() -> None:
    first = list(rig(1).samples())
    again = list(rig(1).samples())
    other = list(rig(2).samples())
    assert [(s.stream, s.t) for s in first] == [(s.stream, s.t) for s in again]
    assert all(np.array_equal(a.data, b.data) for a, b in zip(first, again, strict=True))
    assert [s.t for s in first] != [s.t for s in other]
    by_stream: dict[str, list[Sample]] = {}
    for s in first:
        by_stream.setdefault(s.stream, []).append(s)
    assert {k: len(v) for k, v in by_stream.items()} == {
        "observation.images.a": 31,
        "observation.images.b": 30,  # phase offsets push the last nominal sample past 1.0 s
        "observation.state": 201,
        "action": 200,
    }
    for samples in by_stream.values():
        times = np.array([s.t for s in samples])
        assert np.all(np.diff(times) > 0)
    assert by_stream["observation.images.b"][0].data.shape == (24, 32, 3)
    # Frames change from sample to sample (no frozen camera) and grippers are 0/1.
    a = by_stream["observation.images.a"]
    assert not np.array_equal(a[0].data, a[1].data)
    grip = np.array([s.data[6] for s in by_stream["observation.state"]])
    assert set(np.unique(grip)) <= {0.0, 1.0}


def test_replay_records_the_same_content(
    synthetic_dataset: Callable[..., Path], tmp_path: Path
) -> None:
    source_dir = synthetic_dataset(episodes=2, frames=[12, 10], fps=10, state_dim=4)
    replay = ReplaySource(source_dir, realtime=False)
    cameras, vectors = replay.stream_config()
    assert [c.key for c in cameras] == ["observation.images.front"]
    assert {v.name for v in vectors} == {"observation.state", "action"}
    cfg = config_from_dict(
        {
            "collection": {
                "log_dir": str(tmp_path / "logs"),
                "fps": 10,
                "tasks": {"copy": ["replayed"]},
                "cameras": [{"key": c.key, "width": c.width, "height": c.height} for c in cameras],
                "vectors": [{"name": v.name, "dim": v.dim} for v in vectors],
                "encoder": {"preset": "ultrafast"},
                "min_episode_frames": 2,
            }
        }
    ).collection
    with Recorder(cfg, durable=False) as rec:
        rec.start()
        pump = SourcePump(replay, rec).start()
        assert pump.finished.wait(60) and pump.error is None
        job = rec.stop()
        assert job.wait(60) and job.state == "saved", job.error
    # Two episodes played back to back on one clock: 12 + 10 rows, one period apart.
    assert job.frames == 22 and job.quality == "green"
    original = DatasetReader(source_dir)
    copy = DatasetReader(cfg.dataset_dir("copy"))
    state = copy.read_vector(0, "observation.state")
    expected = np.concatenate(
        [original.read_vector(0, "observation.state"), original.read_vector(1, "observation.state")]
    )
    assert np.allclose(state, expected, atol=1e-6)
    capture = copy.read_table(0).column("capture_time").to_numpy()
    assert np.allclose(np.diff(capture), 0.1, atol=1e-6)


def test_realtime_replay_paces_and_pump_stops(synthetic_dataset: Callable[..., Path]) -> None:
    source_dir = synthetic_dataset(episodes=1, frames=6, fps=30, state_dim=2)

    class Collect:
        def __init__(self) -> None:
            self.samples: list[tuple[str, float]] = []

        def push_image(self, camera: str, t: float, frame: np.ndarray) -> bool:
            self.samples.append((camera, t))
            return True

        def push_vector(self, stream_name: str, t: float, values: np.ndarray) -> bool:
            self.samples.append((stream_name, t))
            return True

    sink = Collect()
    pump = SourcePump(ReplaySource(source_dir, realtime=True), sink).start()
    assert pump.finished.wait(30) and pump.error is None
    assert len(sink.samples) == 6 * 3
    looping = SourcePump(ReplaySource(source_dir, realtime=True, loop=True), Collect()).start()
    looping.stop()
    assert looping.finished.is_set()


@pytest.mark.parametrize(("camera", "frames"), [(0, 7), (1, 7), (1, 14)])
def test_replay_of_a_video_that_does_not_match_its_table_names_the_file(
    synthetic_dataset: Callable[..., Path], camera: int, frames: int
) -> None:
    root = synthetic_dataset(episodes=1, frames=10, cameras=2)
    reader = DatasetReader(root)
    key = reader.video_keys[camera]
    video = reader.video_path(0, key)
    rng = np.random.default_rng(camera)
    encode_video(video, rng.integers(0, 255, (frames, 48, 64, 3), dtype=np.uint8))
    replay = ReplaySource(root, realtime=False, batch_size=4)
    with pytest.raises(DatasetError, match=rf"{video.name}: episode 0 camera {key} "):
        list(replay.samples())
