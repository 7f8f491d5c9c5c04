"""MCAP export, checked with the official ``mcap`` reader and PyAV decodes."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import msgpack
import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner
from mcap.reader import make_reader
from mcap.stream_reader import StreamReader
from video_helpers import pyav_decode

from eva.cli import main
from eva.dataset import layout
from eva.dataset.columns import column_values
from eva.dataset.errors import DatasetError
from eva.dataset.msgpack_codec import packb
from eva.dataset.video import VideoEncoder, iter_frame_batches
from eva.export.pipeline import export_dataset
from eva.formats import catalog
from eva.formats import mcap as mcap_format
from eva.formats.base import ExportOptions, OptionError
from eva.formats.mcap import McapOptions
from eva.formats.mcap.export import CameraFeed

FPS = 30
W, H = 64, 48


def make_video(path: Path, frames: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 255, (H, W, 3), dtype=np.uint8)
    batch = np.stack([np.roll(base, 3 * i, axis=1) for i in range(frames)])
    with VideoEncoder(path, W, H, FPS) as encoder:
        encoder.write(batch)


def episode_table(rows: int) -> pa.Table:
    state = np.arange(rows * 4, dtype=np.float32)
    return pa.table(
        {
            "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(state), 4),
            "action": pa.FixedSizeListArray.from_arrays(pa.array(state * 2), 4),
            "timestamp": pa.array(np.arange(rows, dtype=np.float32) / FPS),
            "frame_index": pa.array(np.arange(rows, dtype=np.int64)),
            "note": pa.array(["x"] * rows),
        }
    )


@pytest.fixture
def two_cameras(tmp_path: Path) -> dict[str, Path]:
    videos = {"cam_high": tmp_path / "high.mp4", "cam_wrist": tmp_path / "wrist.mp4"}
    for seed, path in enumerate(videos.values()):
        make_video(path, 17, seed)
    return videos


def write(
    path: Path, videos: dict[str, Path], rows: int, batch_size: int = 5, **kwargs: object
) -> int:
    return mcap_format.write_episode_file(
        path,
        table=episode_table(rows),
        metadata={"episode_index": 0, "tasks": ["pick"], "length": rows},
        fps=FPS,
        frame_batches={k: iter_frame_batches(p, batch_size) for k, p in videos.items()},
        episode_label="episode 0",
        **kwargs,
    )


@pytest.mark.parametrize("compression", ["none", "zstd", "lz4"])
def test_episode_file_reads_back_with_the_official_reader(
    tmp_path: Path, two_cameras: dict[str, Path], compression: str
) -> None:
    path = tmp_path / "episode_000000.mcap"
    # A small chunk size forces many chunks, so frames of one index straddle chunk boundaries.
    size = write(path, two_cameras, 17, compression=compression, chunk_size=20_000)
    assert size == path.stat().st_size
    sources = {k: pyav_decode(p) for k, p in two_cameras.items()}
    period = round(1e9 / FPS)

    with open(path, "rb") as f:
        reader = make_reader(f, validate_crcs=True)
        header = reader.get_header()
        assert (header.profile, header.library) == ("eva-client", "eva-client")
        summary = reader.get_summary()
        assert summary is not None and len(summary.chunk_indexes) > 3
        channels = {c.topic: c for c in summary.channels.values()}
        assert list(channels) == ["episode", "episode/image/cam_high", "episode/image/cam_wrist"]
        assert {c.message_encoding for c in channels.values()} == {"messagepack"}
        schema = summary.schemas[channels["episode"].schema_id]
        assert (schema.name, schema.encoding) == ("eva_client.episode", "jsonschema")
        assert json.loads(schema.data) == {"type": "object"}
        assert channels["episode/image/cam_high"].schema_id == 0

        messages = list(reader.iter_messages(log_time_order=False))
        assert len(messages) == 1 + 2 * 17
        _, channel, episode_message = messages[0]
        assert channel.topic == "episode"
        assert (episode_message.log_time, episode_message.publish_time) == (0, 0)
        payload = msgpack.unpackb(episode_message.data)
        assert set(payload) == {"columns", "images", "metadata"}
        assert payload["metadata"] == {
            "episode_index": 0,
            "tasks": ["pick"],
            "length": 17,
            "fps": 30,
        }
        state = payload["columns"]["observation.state"]
        assert (
            state["__ndarray__"] is True and state["dtype"] == "<f4" and state["shape"] == [17, 4]
        )
        assert payload["columns"]["note"] == ["x"] * 17
        assert payload["images"] == {}

        # File order: all cameras of frame i before frame i+1, channel order within a frame.
        for i in range(17):
            for j, key in enumerate(["cam_high", "cam_wrist"]):
                _, channel, message = messages[1 + 2 * i + j]
                assert channel.topic == f"episode/image/{key}"
                assert message.sequence == i
                assert message.log_time == message.publish_time == (i + 1) * period
                frame = msgpack.unpackb(message.data)
                assert frame["dtype"] == "|u1" and frame["shape"] == [H, W, 3]
                decoded = np.frombuffer(frame["data"], np.uint8).reshape(H, W, 3)
                np.testing.assert_array_equal(decoded, sources[key][i])

    # A linear, non-seeking pass (what `mcap cat` / streaming consumers do) sees the same file.
    with open(path, "rb") as f:
        records = list(StreamReader(f, skip_magic=False).records)
    assert sum(type(r).__name__ == "Message" for r in records) == 35


def test_read_episode_streams_by_camera_and_by_frame(
    tmp_path: Path, two_cameras: dict[str, Path]
) -> None:
    path = tmp_path / "episode_000000.mcap"
    write(path, two_cameras, 17, chunk_size=30_000)
    sources = {k: pyav_decode(p) for k, p in two_cameras.items()}
    with mcap_format.read_episode(path) as episode:
        assert episode.video_keys == ["cam_high", "cam_wrist"]
        assert episode.num_frames == 17 and len(episode) == 17
        assert episode.fps == 30 and episode.metadata["tasks"] == ["pick"]
        state = episode.columns["observation.state"]
        assert state.dtype == np.float32 and state.shape == (17, 4)
        np.testing.assert_array_equal(state.ravel(), np.arange(68, dtype=np.float32))
        camera = list(episode.iter_camera("cam_wrist"))
        assert [seq for seq, _, _ in camera] == list(range(17))
        for seq, _, frame in camera:
            np.testing.assert_array_equal(frame, sources["cam_wrist"][seq])
        by_frame = list(episode.iter_frames())
        assert [i for i, _ in by_frame] == list(range(17))
        for i, frames in by_frame:
            assert set(frames) == {"cam_high", "cam_wrist"}
            np.testing.assert_array_equal(frames["cam_high"], sources["cam_high"][i])
        np.testing.assert_array_equal(episode.frame("cam_high", 11), sources["cam_high"][11])


@pytest.mark.parametrize(
    ("camera", "frames", "seed", "message"),
    [
        ("cam_wrist", 12, 5, r"episode 0: camera cam_wrist ended early after 12"),
        ("cam_high", 20, 6, r"episode 0: camera cam_high has trailing frames"),
    ],
    ids=["ends_early", "trailing_frames"],
)
def test_camera_frame_count_mismatch_aborts_and_leaves_no_file(
    tmp_path: Path, two_cameras: dict[str, Path], camera: str, frames: int, seed: int, message: str
) -> None:
    make_video(two_cameras[camera], frames, seed)
    path = tmp_path / "episode_000000.mcap"
    with pytest.raises(DatasetError, match=message):
        write(path, two_cameras, 17)
    assert not path.exists()


def test_every_camera_longer_than_the_table_aborts(
    tmp_path: Path, two_cameras: dict[str, Path]
) -> None:
    path = tmp_path / "episode_000000.mcap"
    with pytest.raises(DatasetError, match="trailing frames beyond the 15 table rows"):
        write(path, two_cameras, 15, batch_size=15)
    assert not path.exists()


def test_column_values_come_from_arrow_buffers() -> None:
    table = episode_table(3)
    state = column_values(table.column("observation.state"))
    assert isinstance(state, np.ndarray) and state.shape == (3, 4) and state.dtype == np.float32
    assert column_values(pa.chunked_array([[1, None]])) == [1, None]
    assert column_values(table.column("frame_index")).dtype == np.int64


# ---- through the export pipeline --------------------------------------------------------------


def test_export_pipeline_writes_verifiable_mcap(synthetic_dataset: Callable[..., Path]) -> None:
    source = synthetic_dataset(
        episodes=3,
        frames=[12, 16, 14],
        cameras=2,
        quality=["green", "red", "green"],
        tasks=["pick the red cube", "place it"],
    )
    result = export_dataset(
        source, "mcap", options=ExportOptions(format=McapOptions(compression="zstd"))
    )
    accepted = result.accepted_dir
    assert accepted == source.parent / "export" / "mcap" / "accepted"
    info = json.loads((accepted / layout.INFO).read_text())
    assert info["embedded_images"] is True and info["total_videos"] == 0
    assert "video_path" not in info and info["dataset_format"] == "mcap"
    keys = [k for k, f in info["features"].items() if f["dtype"] == "image"]
    assert len(keys) == 2
    assert not (accepted / "videos").exists()
    for name in ("episodes.jsonl", "tasks.jsonl", "stats.json", "quality_split.json"):
        assert (accepted / "meta" / name).is_file()
    files = sorted((accepted / "data" / "chunk-000").iterdir())
    assert [f.name for f in files] == ["episode_000000.mcap", "episode_000001.mcap"]
    assert mcap_format.verify(accepted) == []
    assert mcap_format.verify(result.rejected_dir) == []

    # Accepted episode 1 is source episode 2: its frames and renumbered columns.
    from eva.dataset.reader import DatasetReader

    src = DatasetReader(source)
    with mcap_format.read_episode(files[1]) as episode:
        assert episode.metadata["episode_index"] == 1 and episode.metadata["fps"] == 30
        np.testing.assert_array_equal(episode.columns["episode_index"], np.ones(14, np.int64))
        np.testing.assert_array_equal(episode.columns["index"], np.arange(12, 26))
        for key in keys:
            frames = pyav_decode(src.video_path(2, key))
            for seq, _, frame in episode.iter_camera(key):
                np.testing.assert_array_equal(frame, frames[seq])


def test_verify_reports_a_missing_episode_file(synthetic_dataset: Callable[..., Path]) -> None:
    source = synthetic_dataset(episodes=2, frames=10, cameras=1)
    result = export_dataset(source, "mcap")
    victim = result.accepted_dir / "data" / "chunk-000" / "episode_000001.mcap"
    victim.unlink()
    problems = mcap_format.verify(result.accepted_dir)
    assert [p.code for p in problems] == ["missing_mcap", "total_frames"]


def test_short_camera_in_source_publishes_nothing(synthetic_dataset: Callable[..., Path]) -> None:
    source = synthetic_dataset(episodes=2, frames=[12, 14], cameras=2)
    from eva.dataset.reader import DatasetReader

    reader = DatasetReader(source)
    key = reader.video_keys[1]
    make_video(reader.video_path(1, key), 9, 3)
    with pytest.raises(DatasetError, match=rf"{key}"):
        export_dataset(source, "mcap")
    # Refused by the source validation: nothing is written at all.
    assert not catalog.parse("mcap").export_root(source).parent.exists()


def test_bad_compression_option_is_refused(synthetic_dataset: Callable[..., Path]) -> None:
    source = synthetic_dataset(episodes=1, frames=10, cameras=1)
    # The options refuse the value before any export starts, from Python and from the CLI.
    with pytest.raises(
        OptionError, match=r"^options\.mcap_compression: 'brotli': use one of none, zstd, lz4$"
    ):
        McapOptions(compression="brotli")
    result = CliRunner().invoke(
        main, ["export", str(source), "--format", "mcap", "--mcap-compression", "brotli"]
    )
    assert result.exit_code == 2, result.output
    assert (
        "Invalid value for '--mcap-compression': 'brotli' is not one of 'none', 'zstd', 'lz4'."
        in result.output
    )
    assert not catalog.parse("mcap").export_root(source).parent.exists()


def test_dataset_without_cameras_and_empty_subset(synthetic_dataset: Callable[..., Path]) -> None:
    source = synthetic_dataset(episodes=2, frames=[10, 12], cameras=0)
    result = export_dataset(source, "mcap")
    assert mcap_format.verify(result.accepted_dir) == []
    # Every episode is green, so the rejected subset is empty but complete and valid.
    assert mcap_format.verify(result.rejected_dir) == []
    assert json.loads((result.rejected_dir / layout.INFO).read_text())["total_episodes"] == 0
    path = result.accepted_dir / "data" / "chunk-000" / "episode_000001.mcap"
    with mcap_format.read_episode(path) as episode:
        assert episode.video_keys == [] and len(episode) == 12
        assert list(episode.iter_frames()) == []
        assert episode.columns["observation.state"].shape[0] == 12


def _rewrite_with(path: Path, mutate: Callable[[int, str, int], tuple[int, int]]) -> None:
    """Rewrite an exported episode file, passing each image message's (sequence, log_time)
    through ``mutate(frame_index, video_key, log_time)``."""
    with mcap_format.read_episode(path) as episode:
        payload = packb(episode.episode)
        keys = episode.video_keys
        frames = list(episode.iter_frames())
    with open(path, "wb") as f:
        writer = mcap_format.McapEpisodeWriter(f)
        writer.register_schema(1, "eva_client.episode", "jsonschema", b'{"type": "object"}')
        writer.register_channel(1, "episode", "messagepack", 1)
        for i, key in enumerate(keys):
            writer.register_channel(2 + i, f"episode/image/{key}", "messagepack")
        writer.add_message(1, 0, 0, 0, payload)
        for index, images in frames:
            for i, key in enumerate(keys):
                t = (index + 1) * round(1e9 / FPS)
                seq, log_time = mutate(index, key, t)
                writer.add_ndarray_message(2 + i, seq, log_time, log_time, images[key])
        writer.finish()


def test_verify_detects_bad_sequences_and_timestamps(
    synthetic_dataset: Callable[..., Path],
) -> None:
    source = synthetic_dataset(episodes=2, frames=10, cameras=2)
    accepted = export_dataset(source, "mcap").accepted_dir
    first = accepted / "data" / "chunk-000" / "episode_000000.mcap"
    second = accepted / "data" / "chunk-000" / "episode_000001.mcap"
    _rewrite_with(first, lambda i, key, t: (i, t))  # an unchanged rewrite verifies clean
    assert mcap_format.verify(accepted) == []
    with mcap_format.read_episode(first) as episode:
        keys = episode.video_keys
    _rewrite_with(first, lambda i, key, t: (i, t + (1 if key == keys[1] and i == 4 else 0)))
    _rewrite_with(second, lambda i, key, t: (i + 1, t))
    problems = mcap_format.verify(accepted)
    found = [(p.code, p.episode) for p in problems]
    assert found[:2] == [("timestamps", 0), ("sequences", 1)]
    assert "frame 4" in problems[0].message and "observation.images.cam1" in problems[0].message
    # Shifted sequences also break the (i+1)*period rule and the lookup of frame 0.
    assert found[2:] == [("timestamps", 1), ("bad_frame", 1)]


def test_lerobot_written_source_exports_and_matches_its_videos(
    tmp_path: Path, lerobot_fixture_dir: Path
) -> None:
    import shutil

    source = tmp_path / "raw"
    shutil.copytree(lerobot_fixture_dir, source)
    result = export_dataset(source, "mcap")
    assert mcap_format.verify(result.accepted_dir) == []
    from eva.dataset.reader import DatasetReader

    src = DatasetReader(source)
    path = result.accepted_dir / "data" / "chunk-000" / "episode_000000.mcap"
    with mcap_format.read_episode(path) as episode:
        assert episode.video_keys == src.video_keys
        for key in src.video_keys:
            frames = pyav_decode(src.video_path(0, key))  # AV1, as LeRobot writes it
            got = list(episode.iter_camera(key))
            assert len(got) == len(frames) == len(episode)
            for seq, _, frame in got:
                np.testing.assert_array_equal(frame, frames[seq])


def test_inline_image_columns_go_to_images() -> None:
    rows = 2
    table = episode_table(rows).append_column(
        "observation.images.top",
        pa.array(
            [{"bytes": b"\x89PNG-0", "path": "a.png"}, {"bytes": b"\x89PNG-1", "path": None}],
        ),
    )
    payload = msgpack.unpackb(
        mcap_format.episode_payload(table, {"episode_index": 0}, FPS, ["observation.images.top"])
    )
    assert payload["images"] == {"observation.images.top": [b"\x89PNG-0", b"\x89PNG-1"]}
    assert "observation.images.top" not in payload["columns"]
    assert payload["metadata"] == {"episode_index": 0, "fps": FPS}


def test_unreadable_camera_video_aborts_and_leaves_no_file(
    tmp_path: Path, two_cameras: dict[str, Path]
) -> None:
    two_cameras["cam_wrist"].write_bytes(b"not an mp4 at all" * 10)
    path = tmp_path / "episode_000000.mcap"
    with pytest.raises(DatasetError, match="wrist.mp4: cannot open video"):
        write(path, two_cameras, 17)
    assert not path.exists()


def test_camera_feed_ahead_decodes_the_next_batch_while_the_consumer_holds_one() -> None:
    """``ahead=True``: taking batch k starts batch k+1 at once, without a request; a request
    while one is under way asks nothing more; the batches arrive in order, then None."""
    started: list[threading.Event] = [threading.Event() for _ in range(4)]

    def batches():
        for k in range(3):
            started[k].set()
            yield np.full((2, 1, 1, 3), k, np.uint8)
        started[3].set()

    feed = CameraFeed(batches(), "test-feed", ahead=True)
    try:
        assert not started[0].wait(0.05)  # nothing before the first request
        feed.request()
        feed.request()  # already asked: no second batch is started
        first = feed.result()
        assert first is not None and int(first[0, 0, 0, 0]) == 0
        assert started[1].wait(5)  # batch 1 decodes while batch 0 is held
        feed.request()
        second = feed.result()
        assert second is not None and int(second[0, 0, 0, 0]) == 1
        third = feed.result()  # started when batch 1 was taken
        assert third is not None and int(third[0, 0, 0, 0]) == 2
        assert feed.result() is None
    finally:
        feed.close()
