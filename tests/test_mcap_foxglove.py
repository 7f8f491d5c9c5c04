"""The foxglove MCAP profile (``--mcap-profile foxglove``), read back with the official ``mcap``
reader and the protobuf decoder: the cameras' H.264 carried unchanged (decoded frames equal the
source MP4's), the B-frame fallback to RawImage, log times from ``started_at``, the vector
schemas and series names, the quality log, verify, and the missing-extra error."""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from foxglove_schemas_protobuf.CompressedVideo_pb2 import CompressedVideo
from foxglove_schemas_protobuf.Log_pb2 import Log
from foxglove_schemas_protobuf.RawImage_pb2 import RawImage
from google.protobuf.timestamp_pb2 import Timestamp
from mcap.reader import make_reader
from mcap_protobuf.decoder import DecoderFactory
from terminal_helpers import run_on_a_terminal
from video_helpers import encode_video, pyav_decode

from eva.capture.synthetic import write_synthetic_dataset
from eva.cli import main
from eva.dataset import layout
from eva.dataset.errors import DatasetError
from eva.export.pipeline import ExportResult, export_dataset
from eva.formats import catalog
from eva.formats import mcap as mcap_format
from eva.formats.base import ExportOptions, OptionError
from eva.formats.mcap import foxglove
from eva.formats.options import McapOptions
from eva.jobs import read_job

CAMERAS = ["observation.images.front", "observation.images.wrist"]
FOXGLOVE = ExportOptions(format=McapOptions(profile="foxglove"))
ISSUE = {"severity": "red", "code": "frozen_camera", "detail": "camera wrist frozen from frame 3"}


def _episode_file(subset_dir: Path, index: int) -> Path:
    return subset_dir / mcap_format.episode_path(index)


def _source_video(raw: Path, episode: int, key: str) -> Path:
    return raw / f"videos/chunk-000/{key}/episode_{episode:06d}.mp4"


def _messages(path: Path, topic: str) -> list[tuple[Any, Any]]:
    """(message record, decoded value) of one topic in log-time order: protobuf through the
    official decoder, JSON parsed."""
    decoders = DecoderFactory()
    out = []
    with open(path, "rb") as stream:
        for schema, channel, message in make_reader(stream).iter_messages(topics=[topic]):
            decode = decoders.decoder_for(channel.message_encoding, schema)
            value = decode(message.data) if decode else json.loads(message.data)
            out.append((message, value))
    return out


def _decode_units(units: Iterator[bytes]) -> list[np.ndarray]:
    codec = av.CodecContext.create("h264", "r")
    frames = []
    for unit in units:
        frames += [f.to_ndarray(format="rgb24") for f in codec.decode(av.Packet(unit))]  # type: ignore[attr-defined]
    frames += [f.to_ndarray(format="rgb24") for f in codec.decode(None)]  # type: ignore[attr-defined]
    return frames


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> ExportResult:
    raw = write_synthetic_dataset(
        tmp_path_factory.mktemp("foxglove") / "raw",
        episodes=3,
        frames=[24, 20, 40],
        cameras=CAMERAS,
        quality=["green", "red", "red"],
        quality_issues=[None, [ISSUE], [ISSUE]],
        qc_verdicts=[None, "fail", "pass"],
        qc_notes=[None, "gripper slipped", None],
        action_dim=6,
    )
    return export_dataset(raw, "mcap", options=FOXGLOVE)


def test_header_channels_schemas_and_info(exported: ExportResult) -> None:
    info = json.loads((exported.accepted_dir / layout.INFO).read_text())
    assert info["mcap_profile"] == "foxglove" and info["dataset_format"] == "mcap"
    with open(_episode_file(exported.accepted_dir, 0), "rb") as stream:
        reader = make_reader(stream)
        header, summary = reader.get_header(), reader.get_summary()
    assert (header.profile, header.library) == ("foxglove", "eva")
    found = {
        ch.topic: (ch.message_encoding, summary.schemas[ch.schema_id].name,
                   summary.schemas[ch.schema_id].encoding)
        for ch in summary.channels.values()
    }  # fmt: skip
    assert found == {
        "episode/metadata": ("json", "eva.episode", "jsonschema"),
        "episode/quality": ("protobuf", "foxglove.Log", "protobuf"),
        "episode/image/observation.images.front": ("protobuf", "foxglove.CompressedVideo", "protobuf"),
        "episode/image/observation.images.wrist": ("protobuf", "foxglove.CompressedVideo", "protobuf"),
        "episode/column/observation.state": ("json", "observation.state", "jsonschema"),
        "episode/column/action": ("json", "action", "jsonschema"),
        "episode/frame": ("json", "eva.frame", "jsonschema"),
    }  # fmt: skip
    assert exported.job.warnings == []


def test_compressed_video_is_the_source_h264_unchanged(exported: ExportResult) -> None:
    split = json.loads((exported.accepted_dir / layout.QUALITY_SPLIT).read_text())
    raw = Path(split["source_dir"])
    for new_index, source_index in enumerate(split["source_episode_indices"]):
        path = _episode_file(exported.accepted_dir, new_index)
        for key in CAMERAS:
            messages = _messages(path, foxglove.image_topic(key))
            assert [m.sequence for m, _ in messages] == list(range(len(messages)))
            for _, video in messages:
                assert video.format == "h264" and video.frame_id == key
                assert video.data.startswith(b"\x00\x00\x00\x01")  # Annex B
            # A keyframe (IDR, NAL type 5) carries an SPS (type 7) and a PPS (type 8).
            for _, video in messages:
                types = {
                    video.data[m.end()] & 0x1F for m in re.finditer(b"\x00\x00\x01", video.data)
                }
                assert 5 not in types or {7, 8} <= types
            frames = _decode_units(video.data for _, video in messages)
            source = pyav_decode(_source_video(raw, source_index, key))
            assert len(frames) == len(source)
            assert all(np.array_equal(a, b) for a, b in zip(frames, source, strict=True))


def test_hand_encoded_messages_equal_the_protobuf_serializer() -> None:
    frame = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    for time_ns in (0, 999, 1_767_268_800_033_333_335):
        seconds, nanos = divmod(time_ns, 1_000_000_000)
        stamp = Timestamp(seconds=seconds, nanos=nanos)
        unit = [b"\x00\x00\x00\x01\x67sps", b"\x00\x00\x00\x01\x65" + bytes(300)]
        expected = CompressedVideo(
            timestamp=stamp, frame_id="cam", data=b"".join(unit), format="h264"
        ).SerializeToString()
        assert b"".join(foxglove.compressed_video_parts(time_ns, "cam", unit)) == expected
        expected = RawImage(
            timestamp=stamp, frame_id="cam", width=3, height=2, encoding="rgb8", step=9,
            data=frame.tobytes(),
        ).SerializeToString()  # fmt: skip
        parts = foxglove.raw_image_parts(time_ns, "cam", frame)
        assert b"".join(bytes(p) for p in parts) == expected


def test_log_times_start_at_started_at(exported: ExportResult) -> None:
    episodes = [json.loads(line) for line in (exported.accepted_dir / layout.EPISODES).open()]
    split = json.loads((exported.accepted_dir / layout.QUALITY_SPLIT).read_text())
    starts = []
    for index, row in enumerate(episodes):
        path = _episode_file(exported.accepted_dir, index)
        started = datetime.fromisoformat(row["started_at"])
        start_ns = int(started.replace(microsecond=0).timestamp()) * 10**9
        start_ns += started.microsecond * 1000
        starts.append(start_ns)
        ((metadata_message, metadata),) = _messages(path, "episode/metadata")
        assert metadata_message.log_time == start_ns and metadata["started_at"] == row["started_at"]
        assert all(m.log_time == start_ns for m, _ in _messages(path, "episode/quality"))
        # frame i at started_at + the timestamp of row i (float32 seconds in the source)
        source = (
            Path(split["source_dir"])
            / "data/chunk-000"
            / (f"episode_{split['source_episode_indices'][index]:06d}.parquet")
        )
        timestamps = pq.read_table(source).column("timestamp").to_numpy()
        expected = [start_ns + round(float(t) * 1e9) for t in timestamps]
        for topic in ("episode/frame", "episode/column/action", foxglove.image_topic(CAMERAS[0])):
            messages = _messages(path, topic)
            assert [m.log_time for m, _ in messages] == expected
            assert [m.publish_time for m, _ in messages] == expected
        video = _messages(path, foxglove.image_topic(CAMERAS[1]))
        stamps = [v.timestamp.seconds * 10**9 + v.timestamp.nanos for _, v in video]
        assert stamps == expected
    # The session's episodes follow each other on one timeline.
    assert starts == sorted(starts) and len(set(starts)) == len(starts)


def test_vectors_are_named_series_with_a_json_schema(exported: ExportResult) -> None:
    info = json.loads((exported.accepted_dir / layout.INFO).read_text())
    path = _episode_file(exported.accepted_dir, 0)
    with open(path, "rb") as stream:
        summary = make_reader(stream).get_summary()
    schemas = {
        summary.schemas[c.schema_id].name: summary.schemas[c.schema_id]
        for c in summary.channels.values()
    }
    for name in ("observation.state", "action"):
        names = info["features"][name]["names"]
        schema = json.loads(schemas[name].data)
        assert schema["type"] == "object"
        assert list(schema["properties"]) == names
        assert all(p == {"type": "number"} for p in schema["properties"].values())
        messages = _messages(path, foxglove.column_topic(name))
        assert all(list(value) == names for _, value in messages)
    # The values are the exported columns' (float32, exactly).
    mcap_state = np.array(
        [list(v.values()) for _, v in _messages(path, "episode/column/observation.state")],
        np.float32,
    )
    source = Path(
        json.loads((exported.accepted_dir / layout.QUALITY_SPLIT).read_text())["source_dir"]
    )
    table = pq.read_table(source / "data/chunk-000/episode_000000.parquet")
    assert np.array_equal(
        mcap_state, np.stack(table.column("observation.state").to_numpy(zero_copy_only=False))
    )
    frame_schema = json.loads(schemas["eva.frame"].data)
    assert {"timestamp", "frame_index", "index", "task_index"} <= set(frame_schema["properties"])
    assert frame_schema["properties"]["frame_index"] == {"type": "integer"}


def test_quality_verdict_and_issues_are_foxglove_logs(exported: ExportResult) -> None:
    # rejected episode 0 is source episode 1: red, judged fail with a note
    logs = [
        value for _, value in _messages(_episode_file(exported.rejected_dir, 0), "episode/quality")
    ]
    assert [log.message for log in logs] == [
        "quality red, 1 issue; qc_verdict fail: gripper slipped",
        "frozen_camera: camera wrist frozen from frame 3",
    ]
    assert [log.level for log in logs] == [3, 3]  # WARNING
    assert all(log.name == "eva.quality" for log in logs)
    # accepted episode 1 is source episode 2: red but passed by the operator
    logs = [
        value for _, value in _messages(_episode_file(exported.accepted_dir, 1), "episode/quality")
    ]
    assert logs[0].message == "quality red, 1 issue; qc_verdict pass" and logs[0].level == 2  # INFO
    logs = [
        value for _, value in _messages(_episode_file(exported.accepted_dir, 0), "episode/quality")
    ]
    assert [log.message for log in logs] == ["quality green, 0 issues"]


def test_the_quality_log_level_is_the_split_decision_for_every_spelling(tmp_path: Path) -> None:
    # Verdicts and flags as the split reads them (spaces, any case): a " pass " overrides red,
    # a "Fail " rejects a green episode, a " Red " flag rejects. The log reports the split's
    # decision (WARNING iff the episode is in rejected), never a decision of its own.
    verdicts = [" pass ", "PASS", "\tPass", "Fail ", None, None]
    raw = write_synthetic_dataset(
        tmp_path / "raw",
        episodes=6,
        frames=4,
        cameras=1,
        quality=["red", "red", "red", "green", "green", "green"],
        qc_verdicts=verdicts,
        extra_rows=[None, None, None, None, {"quality": " Red "}, None],
    )
    result = export_dataset(raw, "mcap", options=FOXGLOVE)
    split = {
        subset: json.loads((subset_dir / layout.QUALITY_SPLIT).read_text())
        for subset, subset_dir in (
            ("accepted", result.accepted_dir),
            ("rejected", result.rejected_dir),
        )
    }
    assert split["accepted"]["source_episode_indices"] == [0, 1, 2, 5]
    assert split["rejected"]["source_episode_indices"] == [3, 4]
    for subset, subset_dir in (
        ("accepted", result.accepted_dir),
        ("rejected", result.rejected_dir),
    ):
        for index, source_index in enumerate(split[subset]["source_episode_indices"]):
            logs = [
                value for _, value in _messages(_episode_file(subset_dir, index), "episode/quality")
            ]
            expected = Log.WARNING if subset == "rejected" else Log.INFO
            assert logs[0].level == expected, (source_index, verdicts[source_index])
            if verdicts[source_index] is not None:  # the verdict as written
                assert f"qc_verdict {verdicts[source_index]}" in logs[0].message


def test_verify_passes_and_catches_damage(exported: ExportResult, tmp_path: Path) -> None:
    assert mcap_format.verify(exported.accepted_dir) == []
    assert mcap_format.verify(exported.rejected_dir) == []
    damaged = tmp_path / "accepted"
    shutil.copytree(exported.accepted_dir, damaged)
    path = _episode_file(damaged, 1)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    codes = {p.code for p in mcap_format.verify(damaged)}
    assert "unreadable_mcap" in codes
    # A foxglove file taken for the default profile: its layout is not the default's.
    shutil.rmtree(damaged)
    shutil.copytree(exported.accepted_dir, damaged)
    info = json.loads((damaged / layout.INFO).read_text())
    del info["mcap_profile"]
    (damaged / layout.INFO).write_text(json.dumps(info))
    problems = [p for p in mcap_format.verify(damaged) if p.code == "unreadable_mcap"]
    assert len(problems) == 2 and all("foxglove-profile file" in p.message for p in problems)
    # Frames that do not decode.
    shutil.rmtree(damaged)
    shutil.copytree(exported.accepted_dir, damaged)
    path = _episode_file(damaged, 0)
    data = bytearray(path.read_bytes())
    sps = data.index(b"\x00\x00\x00\x01\x67")  # the first frame's SPS, then its PPS and IDR
    data[sps : sps + 64] = bytes(64)
    path.write_bytes(bytes(data))
    problems = mcap_format.verify(damaged)
    assert [p.code for p in problems] == ["bad_frame"], problems


def _with_bframes(raw: Path, episode: int, key: str) -> np.ndarray:
    """Re-encode one camera's MP4 with B-frames (x264 bframes=2); return its frames as any
    consumer decodes them."""
    path = _source_video(raw, episode, key)
    options = {"bf": "2", "g": "12", "preset": "veryfast", "crf": "18"}
    encode_video(path, pyav_decode(path), fmt="mp4", options=options)
    with av.open(str(path)) as check:
        packets = [p for p in check.demux(video=0) if p.size]
        assert any(p.pts != p.dts for p in packets)  # really B-frames
    return pyav_decode(path)


def test_bframe_input_falls_back_to_raw_images_and_says_so(tmp_path: Path) -> None:
    raw = write_synthetic_dataset(tmp_path / "raw", episodes=2, frames=[18, 16], cameras=CAMERAS)
    decoded = {ep: _with_bframes(raw, ep, CAMERAS[0]) for ep in (0, 1)}
    runner = CliRunner()
    result = runner.invoke(
        main, ["export", str(raw), "--format", "mcap", "--mcap-profile", "foxglove", "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    warning = (
        "accepted: camera observation.images.front: B-frames (frames presented out of decode "
        "order), which Foxglove cannot play: written decoded as foxglove.RawImage rgb8 in 2 of 2 "
        "episodes"
    )
    assert summary["event"] == "completed" and summary["warnings"] == [warning]
    accepted = Path(summary["accepted_dir"])
    job = read_job(accepted.parent / "job.json")
    assert job is not None and job.warnings == [warning]
    for ep in (0, 1):
        path = _episode_file(accepted, ep)
        images = _messages(path, foxglove.image_topic(CAMERAS[0]))
        assert len(images) == len(decoded[ep])
        for (_, image), expected in zip(images, decoded[ep], strict=True):
            assert (image.encoding, image.width, image.height, image.step) == ("rgb8", 64, 48, 192)
            assert np.array_equal(np.frombuffer(image.data, np.uint8).reshape(48, 64, 3), expected)
        # the other camera is still carried as it was recorded
        video = _messages(path, foxglove.image_topic(CAMERAS[1]))
        frames = _decode_units(v.data for _, v in video)
        assert all(
            np.array_equal(a, b)
            for a, b in zip(frames, pyav_decode(_source_video(raw, ep, CAMERAS[1])), strict=True)
        )
    assert mcap_format.verify(accepted) == []
    # On a terminal (human text) the warning is printed too.
    command = [sys.executable, "-m", "eva.cli", "export", str(raw), "--format", "mcap"]
    status, shown = run_on_a_terminal([*command, "--mcap-profile", "foxglove"], columns=400)
    assert status == 0 and f"warning: {warning}" in shown.replace("\r\n", "\n")


def test_missing_extra_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "mcap_protobuf", None)  # as if not installed
    with pytest.raises(
        OptionError, match=r"^options\.mcap_profile: foxglove needs the foxglove extra"
    ):
        McapOptions(profile="foxglove")
    raw = write_synthetic_dataset(tmp_path / "raw", episodes=1, frames=6, cameras=1)
    result = CliRunner().invoke(
        main, ["export", str(raw), "--format", "mcap", "--mcap-profile", "foxglove"]
    )
    assert result.exit_code == 2
    (line,) = [line for line in result.output.splitlines() if "foxglove extra" in line]
    assert "pip install 'eva[foxglove]'" in line
    assert not catalog.parse("mcap").export_root(raw).parent.exists()  # refused before any job


def test_chunk_compression_and_size_options_apply(tmp_path: Path) -> None:
    raw = write_synthetic_dataset(tmp_path / "raw", episodes=1, frames=20, cameras=CAMERAS)
    options = McapOptions(profile="foxglove", compression="zstd", chunk_size=4096)
    result = export_dataset(raw, "mcap", options=ExportOptions(format=options))
    path = _episode_file(result.accepted_dir, 0)
    with open(path, "rb") as stream:
        reader = make_reader(stream, validate_crcs=True)
        summary = reader.get_summary()
        assert len(summary.chunk_indexes) > 1
        assert {c.compression for c in summary.chunk_indexes} == {"zstd"}
        assert sum(1 for _ in reader.iter_messages()) == summary.statistics.message_count
    frames = _decode_units(v.data for _, v in _messages(path, foxglove.image_topic(CAMERAS[0])))
    source = pyav_decode(_source_video(raw, 0, CAMERAS[0]))
    assert all(np.array_equal(a, b) for a, b in zip(frames, source, strict=True))
    assert mcap_format.verify(result.accepted_dir) == []
    # eva's own MessagePack reader says what the file is instead of failing on a missing topic
    with pytest.raises(DatasetError, match="foxglove-profile file"):
        mcap_format.read_episode(path)
