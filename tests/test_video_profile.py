"""The training video profile (``--video-profile training``, eva.formats._training_video) on real
synthetic datasets: exported through the pipeline and the CLI, read back with pyarrow and PyAV.
LeRobot's own readers load it in ``make compat`` (scripts/compat_video_profile.sh)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import av
import numpy as np
import pytest
from click.testing import CliRunner

from eva.capture.synthetic import write_synthetic_dataset
from eva.cli import main
from eva.dataset.reader import DatasetReader
from eva.export.pipeline import export_dataset
from eva.export.verify import verify_export
from eva.formats import lerobot_v3
from eva.formats.base import ExportOptions
from eva.formats.options import LeRobotV3Options, LeRobotV21Options
from eva.quality.edits import EditRequest, edit_episodes

CAM = "observation.images.front"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("profile") / "raw"
    return write_synthetic_dataset(root, episodes=3, frames=[21, 16, 19], cameras=[CAM], seed=5)


def _decoded(path: Path) -> tuple[list[float], list[bool], np.ndarray]:
    """Presentation times, keyframe flags (in decode order) and RGB frames of ``path``."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        keys = [bool(p.is_keyframe) for p in container.demux(stream) if p.size]
    with av.open(str(path)) as container:
        frames = list(container.decode(video=0))
    times = [float(f.pts * f.time_base) for f in frames]
    return times, keys, np.stack([f.to_ndarray(format="rgb24") for f in frames])


def _nearest_is_same_index(decoded: np.ndarray, recorded: np.ndarray) -> None:
    """Each decoded frame is closer to the recorded frame at its index than to either
    neighbour."""
    assert len(decoded) == len(recorded)
    for i, frame in enumerate(decoded):
        err = [
            np.abs(frame.astype(np.int16) - recorded[j].astype(np.int16)).mean()
            for j in range(max(0, i - 1), min(len(recorded), i + 2))
        ]
        own = err[1] if i > 0 else err[0]
        assert own == min(err), (i, err)


def _recorded(reader: DatasetReader, episode: int) -> np.ndarray:
    return np.concatenate([b.copy() for b in reader.iter_frames(episode, CAM)])


@pytest.mark.parametrize("codec", ["libsvtav1", "libx264"])
def test_v3_training_frames_keyframes_and_info(source: Path, tmp_path: Path, codec: str) -> None:
    raw = tmp_path / "raw"
    shutil.copytree(source, raw)
    edit_episodes(raw, [1], EditRequest(trim=(3, 12)))  # encoded from its kept frames only
    options = LeRobotV3Options(video_profile="training", video_codec=codec)
    out = export_dataset(raw, "v3", options=ExportOptions(format=options)).accepted_dir
    assert verify_export(out) == []
    info = json.loads((out / "meta/info.json").read_text())
    block = info["features"][CAM]["info"]
    assert block["video.codec"] == {"libsvtav1": "av1", "libx264": "h264"}[codec]
    assert (
        block["video.g"] == 2 and block["video.crf"] == 30 and block["video.pix_fmt"] == "yuv420p"
    )
    assert block["video.preset"] == (12 if codec == "libsvtav1" else None)
    times, keys, frames = _decoded(next((out / "videos" / CAM).rglob("*.mp4")))
    assert len(frames) == 21 + 9 + 19  # episode 1 trimmed to [3, 12)
    assert times == pytest.approx([k / 30 for k in range(len(frames))], abs=1e-6)
    assert all(keys[k] for k in range(0, len(keys), 2))  # a keyframe every 2 frames
    reader = DatasetReader(raw)
    recorded = np.concatenate(
        [_recorded(reader, 0), _recorded(reader, 1)[3:12], _recorded(reader, 2)]
    )
    _nearest_is_same_index(frames, recorded)
    rows = lerobot_v3.read_episode_locators(out).to_pylist()
    spans = [
        t
        for r in rows
        for t in (r[f"videos/{CAM}/from_timestamp"], r[f"videos/{CAM}/to_timestamp"])
    ]
    assert spans == pytest.approx([0, 21 / 30, 21 / 30, 30 / 30, 30 / 30, 49 / 30])


def test_v21_training_episode_files(source: Path) -> None:
    options = LeRobotV21Options(video_profile="training", video_codec="libx264", video_crf=23)
    result = export_dataset(source, "v21", options=ExportOptions(format=options))
    out = result.accepted_dir
    assert verify_export(out) == []
    info = json.loads((out / "meta/info.json").read_text())
    assert info["features"][CAM]["info"]["video.crf"] == 23
    reader = DatasetReader(source)
    for episode, mp4 in enumerate(sorted((out / "videos").rglob("*.mp4"))):
        _, keys, frames = _decoded(mp4)
        assert all(keys[k] for k in range(0, len(keys), 2))
        _nearest_is_same_index(frames, _recorded(reader, episode))
        assert mp4.stat().st_nlink == 1  # a new file, not the recorded one linked


def test_cli_video_profile_options(source: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    base = ["export", str(source), "--format"]
    crf = runner.invoke(main, [*base, "v3", "--video-crf", "40"])
    assert crf.exit_code == 2 and "--video-profile" in crf.output and "training" in crf.output
    x264 = ["--video-profile", "training", "--video-codec", "libx264", "--video-crf", "60"]
    past = runner.invoke(main, [*base, "v21", *x264])
    assert past.exit_code == 2 and "51" in past.output
    other = runner.invoke(main, [*base, "hdf5", "--video-profile", "training"])
    assert other.exit_code == 2 and "--video-profile" in other.output


def test_verify_decode_latency_reports_each_camera(source: Path) -> None:
    from eva.export.decode_latency import camera_files, read_frame_at

    options = ExportOptions(format=LeRobotV3Options(video_profile="training"))
    out = export_dataset(source, "v3", options=options).accepted_dir
    result = CliRunner().invoke(main, ["verify", str(out), "--decode-latency", "--json"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines()]
    (latency,) = [line for line in lines if "decode_latency" in line]
    assert latency["decode_latency"] == CAM and latency["frames"] == 21 + 16 + 19
    assert 0 < latency["p50_ms"] <= latency["p99_ms"] and latency["bytes_per_frame"] > 0
    # a read as LeRobot's pyav backend does one is the frame at that index
    (mp4,) = camera_files(out)[CAM]
    _, _, frames = _decoded(mp4)
    assert np.array_equal(read_frame_at(mp4, 25 / 30), frames[25])
