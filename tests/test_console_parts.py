"""The console's parts below HTTP: the preview tap, JPEG previews, export option parsing, clearing
a verdict, and the caller-chosen export job id."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import av
import numpy as np
import pytest
from click.testing import CliRunner

from eva.capture.preview import PreviewTap
from eva.capture.recorder import Recorder
from eva.cli import main
from eva.config import config_from_dict
from eva.console.jpeg import JpegEncoder
from eva.dataset.errors import DatasetError
from eva.export.options import describe_options, parse_options
from eva.export.pipeline import export_dataset
from eva.formats.options import Hdf5Options, LeRobotV3Options, LeRobotV21Options, McapOptions
from eva.quality.verdicts import review_episode

pytestmark = pytest.mark.realtime


def frame(seed: int, h: int = 48, w: int = 64) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


@pytest.fixture(params=["native", "reference"])
def ring_kind(request: pytest.FixtureRequest) -> bool:
    return request.param == "native"


def test_preview_tap_copies_only_while_wanted(ring_kind: bool) -> None:
    tap = PreviewTap(
        {"cam": (48, 64)}, max_fps=1000.0, max_width=32, linger_s=0.2, native=ring_kind
    )
    tap.offer("cam", 0.0, frame(0))
    assert tap.latest("cam") is None  # nobody asked: nothing copied
    tap.want()
    source = frame(1)
    tap.offer("cam", 1.0, source)
    source[:] = 0  # the tap copied the frame: the caller may reuse its buffer at once
    seq, t, preview = tap.latest("cam")
    assert (seq, t) == (1, 1.0)
    np.testing.assert_array_equal(preview, frame(1)[::2, ::2])  # 64 -> 32 wide
    assert not preview.flags.writeable  # shared by readers
    assert tap.latest("cam")[0] == 1  # nothing newer: the same preview again
    time.sleep(0.25)
    tap.offer("cam", 2.0, frame(2))  # the viewer went away
    assert tap.latest("cam")[0] == 1
    with pytest.raises(KeyError):
        tap.latest("other")


def test_preview_tap_rate_limit_and_newest_first(ring_kind: bool) -> None:
    tap = PreviewTap({"cam": (48, 64)}, max_fps=2.0, native=ring_kind)
    tap.want()
    for i in range(50):
        tap.offer("cam", float(i), frame(i))
    seq, t, preview = tap.latest("cam")
    assert (seq, t) == (1, 0.0) and preview.shape == (48, 64, 3)
    fast = PreviewTap({"cam": (48, 64)}, max_fps=1e6, native=ring_kind)
    fast.want()
    for i in range(5):  # only 2 slots: the rest wait for a reader
        time.sleep(0.001)
        fast.offer("cam", float(i), frame(i))
    seq, t, preview = fast.latest("cam")
    assert t == 1.0  # the newest of what the ring held
    np.testing.assert_array_equal(preview, frame(1))
    time.sleep(0.001)
    fast.offer("cam", 9.0, frame(9))
    assert fast.latest("cam")[:2] == (2, 9.0)


def test_recorder_previews_idle_and_recording(tmp_path: Path) -> None:
    cfg = config_from_dict(
        {
            "collection": {
                "log_dir": str(tmp_path),
                "tasks": {"d": ["t"]},
                "cameras": [{"key": "cam", "width": 64, "height": 48}],
                "vectors": [],
            }
        }
    ).collection
    with Recorder(cfg, durable=False) as recorder:
        tap = recorder.enable_preview(max_fps=1000.0, max_width=64)
        assert recorder.enable_preview() is tap
        tap.want()
        assert recorder.push_image("cam", 0.0, frame(3)) is False  # idle: not recorded...
        np.testing.assert_array_equal(tap.latest("cam")[2], frame(3))  # ...but previewed
        recorder.push_image("cam", 0.1, np.zeros((5, 5, 3), np.uint8))  # wrong shape: ignored
        assert tap.latest("cam")[0] == 1
        recorder.start("d")
        time.sleep(0.002)
        assert recorder.push_image("cam", 0.2, frame(4)) is True
        np.testing.assert_array_equal(tap.latest("cam")[2], frame(4))
        recorder.cancel()


def test_jpeg_preview_decodes_to_the_frame() -> None:
    image = np.zeros((120, 161, 3), np.uint8)
    image[:, :80] = (200, 30, 30)
    image[:, 80:] = (20, 40, 220)
    data = JpegEncoder(161, 120).encode(image)
    assert data[:2] == b"\xff\xd8" and data[-2:] == b"\xff\xd9"
    with av.open(io.BytesIO(data)) as container:
        decoded = next(container.decode(video=0)).to_ndarray(format="rgb24")
    assert decoded.shape == (120, 160, 3)  # odd width cropped for yuv420
    assert np.abs(decoded[:, 10:70].astype(int) - (200, 30, 30)).mean() < 12
    assert np.abs(decoded[:, 90:150].astype(int) - (20, 40, 220)).mean() < 12


def test_parse_options_checks_every_field() -> None:
    assert parse_options("lerobot_v21", None).format == LeRobotV21Options(copy_videos=False)
    assert parse_options("v21", {"copy_videos": True}).format == LeRobotV21Options(copy_videos=True)
    options = parse_options("v3", {"data_files_size_in_mb": 5, "image_quantiles": "none"})
    assert options.format == LeRobotV3Options(data_files_size_in_mb=5.0, image_quantiles="none")
    assert parse_options("hdf5", {"hdf5_compression": "gzip:4"}).format == Hdf5Options("gzip:4")
    assert parse_options("mcap", {"mcap_chunk_size": 2048.0}).format == McapOptions(chunk_size=2048)
    assert parse_options("mcap", {"allow_non_finite": True}).allow_non_finite is True
    for fmt, values, field in [
        ("v3", {"nope": 1}, "options.nope"),
        ("v3", {"data_files_size_in_mb": 0}, "options.data_files_size_in_mb"),
        ("v3", {"verify_decode": "yes"}, "options.verify_decode"),
        ("v3", {"image_quantile_keyframes": 1.5}, "options.image_quantile_keyframes"),
        ("v3", {"image_quantile_keyframes": True}, "options.image_quantile_keyframes"),
        ("hdf5", {"hdf5_compression": "zip"}, "options.hdf5_compression"),
        ("hdf5", {"hdf5_frames_per_chunk": 0}, "options.hdf5_frames_per_chunk"),
        ("mcap", {"mcap_compression": "gzip"}, "options.mcap_compression"),
        ("mcap", {"mcap_chunk_size": 10}, "options.mcap_chunk_size"),
    ]:
        with pytest.raises(DatasetError, match=rf"^{field}: "):
            parse_options(fmt, values)
    # every option is described for the console's format panel
    for described_format in describe_options().values():
        for described in described_format:
            assert described["help"] and described["type"] in (
                "bool",
                "int",
                "float",
                "choice",
                "text",
                "mapping",  # a text box of NAME=VALUE pairs, or a JSON object
            )


def test_clear_verdict_and_cli(small_dataset: Path) -> None:
    review_episode(small_dataset, 2, verdict="pass", note="fine")
    update = review_episode(small_dataset, 2, clear_verdict=True)
    assert "qc_verdict" not in update.row and update.row["qc_note"] == "fine" and update.changed
    with pytest.raises(DatasetError, match="exclude each other"):
        review_episode(small_dataset, 2, verdict="fail", clear_verdict=True)
    review_episode(small_dataset, 2, verdict="fail")
    runner = CliRunner()
    result = runner.invoke(main, ["qc", str(small_dataset), "2", "--clear", "--json"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.output)
    assert "qc_verdict" not in row and row["qc_note"] == "fine"
    assert runner.invoke(main, ["qc", str(small_dataset), "2", "--clear", "--pass"]).exit_code == 2


def test_export_job_id_is_checked(small_dataset: Path) -> None:
    with pytest.raises(DatasetError, match="job id"):
        export_dataset(small_dataset, "v21", job_id="../x")
    result = export_dataset(small_dataset, "v21", job_id="console-0001")
    marker = json.loads((result.accepted_dir / "meta" / "quality_split.json").read_text())
    assert result.job.job_id == marker["export_id"] == "console-0001"
