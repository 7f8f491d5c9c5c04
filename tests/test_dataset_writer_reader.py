"""DatasetWriter -> DatasetReader round trips on real PyAV MP4s and real parquet files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eva.capture.synthetic import SyntheticScene, joint_actions, joint_states
from eva.dataset import atomic, layout
from eva.dataset.errors import DatasetError
from eva.dataset.reader import DatasetReader
from eva.dataset.repair import MetadataNotUpdated
from eva.dataset.video import VideoOptions, count_decoded_frames, probe
from eva.dataset.writer import CameraSpec, DatasetWriter, VectorSpec

FRONT = "observation.images.front"


def _open(root: Path, **kwargs) -> DatasetWriter:
    kwargs.setdefault("fps", 30)
    kwargs.setdefault("cameras", [CameraSpec(FRONT, 48, 64)])
    kwargs.setdefault("vectors", [VectorSpec("observation.state", 3), VectorSpec("action", 3)])
    kwargs.setdefault("durable", False)
    return DatasetWriter.create_or_open(root, **kwargs)


def _add(episode, start: int, n: int, scene: SyntheticScene, seed: float = 0.0) -> np.ndarray:
    images = scene.frames(start, n)
    rows = np.arange(start, start + n, dtype=np.float32)[:, None]
    episode.add_frames(
        images={FRONT: images},
        vectors={
            "observation.state": rows + np.array([0.5, 1.5, seed], np.float32),
            "action": np.repeat(-rows + np.float32(0.25), 3, axis=1),
        },
        capture_time=100.0 + np.arange(start, start + n) / 30.0 + 1e-7,
    )
    return images


def test_round_trip_values_dtypes_and_pixels(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    scene = SyntheticScene(48, 64, seed=3)
    with _open(root, robot_type="test_bot") as writer:
        episode = writer.begin_episode("pick the red cube")
        images = np.concatenate([_add(episode, 0, 10, scene), _add(episode, 10, 7, scene)])
        assert (
            episode.commit({"quality": "green", "quality_issues": [], "note": np.float64(1.5)}) == 0
        )

    reader = DatasetReader(root)
    info = reader.info
    assert info["codebase_version"] == "v2.1"
    assert info["robot_type"] == "test_bot"
    assert (info["total_episodes"], info["total_frames"], info["total_videos"]) == (1, 17, 1)
    assert info["total_tasks"] == 1 and info["total_chunks"] == 1
    assert info["splits"] == {"train": "0:1"}
    feat = info["features"][FRONT]
    assert feat["dtype"] == "video" and feat["shape"] == [48, 64, 3]
    assert feat["names"] == ["height", "width", "channels"]
    assert feat["info"]["video.codec"] == "h264" and feat["info"]["video.fps"] == 30
    assert info["features"]["capture_time"]["dtype"] == "float64"
    assert reader.video_keys == [FRONT]
    assert reader.vector_keys == ["observation.state", "action"]
    assert reader.tasks == {0: "pick the red cube"}
    row = reader.episodes[0]
    assert row["tasks"] == ["pick the red cube"] and row["length"] == 17
    assert row["video_keys"] == [FRONT] and row["quality"] == "green" and row["note"] == 1.5

    table = reader.read_table(0)
    schema = table.schema
    assert schema.field("observation.state").type == pa.list_(pa.float32(), 3)
    assert schema.field("timestamp").type == pa.float32()
    assert schema.field("capture_time").type == pa.float64()
    for name in ("frame_index", "episode_index", "index", "task_index"):
        assert schema.field(name).type == pa.int64()
    assert b"huggingface" in schema.metadata
    ts = table.column("timestamp").to_numpy()
    assert np.array_equal(ts, (np.arange(17) / 30).astype(np.float32))
    assert np.array_equal(table.column("index").to_numpy(), np.arange(17))
    state = reader.read_vector(0, "observation.state")
    assert state.dtype == np.float32 and state.shape == (17, 3)
    assert np.array_equal(state[:, 0], np.arange(17, dtype=np.float32) + 0.5)
    np.testing.assert_allclose(
        table.column("capture_time").to_numpy(), 100.0 + np.arange(17) / 30.0 + 1e-7, rtol=0, atol=0
    )

    decoded = np.concatenate([b.copy() for b in reader.iter_frames(0, FRONT, batch_size=5)])
    assert decoded.shape == images.shape
    error = np.abs(decoded.astype(np.int16) - images.astype(np.int16))
    # crf 23 + 4:2:0 chroma on a tiny, sharply coloured noisy texture: ~12 mean abs error.
    assert error.mean() < 16
    # Frame order is exact: every decoded frame is closest to its own source frame.
    diff = np.abs(decoded[:, None].astype(np.int16) - images[None].astype(np.int16))
    assert np.array_equal(diff.mean(axis=(2, 3, 4)).argmin(axis=1), np.arange(len(images)))
    assert reader.count_frames(0, FRONT) == 17

    stats = reader.episodes_stats[0]
    assert stats["observation.state"]["min"][0] == 0.5
    assert stats["index"]["max"] == [16.0] and stats["index"]["count"] == [17]
    assert np.asarray(stats[FRONT]["mean"]).shape == (3, 1, 1)
    assert reader.stats["observation.state"]["count"] == [17]


def test_video_encoding_options_fixed_gop_no_bframes(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    with _open(root, video=VideoOptions(gop=8, crf=30, preset="ultrafast")) as writer:
        episode = writer.begin_episode("t")
        _add(episode, 0, 20, SyntheticScene(48, 64, seed=1))
        episode.commit()
    path = DatasetReader(root).video_path(0, FRONT)
    import av

    with av.open(str(path)) as container:
        packets = [p for p in container.demux(video=0) if p.size]
        keyframes = [i for i, p in enumerate(packets) if p.is_keyframe]
        assert keyframes == [0, 8, 16]
        # No B-frames: decode order == presentation order.
        pts = [p.pts for p in packets]
        assert pts == sorted(pts)
        assert [p.dts for p in packets] == pts
    info = probe(path)
    assert (info["codec"], info["pix_fmt"], info["fps"], info["frames"]) == (
        "h264",
        "yuv420p",
        30.0,
        20,
    )


def test_chunk_placement_beyond_chunks_size(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    with _open(root, chunks_size=2, cameras=[CameraSpec(FRONT, 16, 16)]) as writer:
        for _ in range(5):
            ep = writer.begin_episode("t")
            ep.add_frames(
                images={FRONT: np.zeros((2, 16, 16, 3), np.uint8)},
                vectors={"observation.state": np.zeros((2, 3)), "action": np.zeros((2, 3))},
            )
            ep.commit()
    reader = DatasetReader(root)
    assert reader.info["chunks_size"] == 2 and reader.info["total_chunks"] == 3
    for ep in range(5):
        chunk = ep // 2
        assert reader.data_path(ep) == root / f"data/chunk-{chunk:03d}/episode_{ep:06d}.parquet"
        assert reader.video_path(ep, FRONT) == (
            root / f"videos/chunk-{chunk:03d}/{FRONT}/episode_{ep:06d}.mp4"
        )
        assert reader.data_path(ep).exists() and reader.video_path(ep, FRONT).exists()
        assert reader.read_table(ep).column("index").to_pylist() == [2 * ep, 2 * ep + 1]


def test_reader_falls_back_to_chunk_000(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    with _open(root, chunks_size=2, cameras=[]) as writer:
        for _ in range(3):
            ep = writer.begin_episode("t")
            ep.add_frames(vectors={"observation.state": np.ones((2, 3)), "action": np.ones((2, 3))})
            ep.commit()
    # An older writer put everything in chunk-000.
    moved = root / "data/chunk-001/episode_000002.parquet"
    os.replace(moved, root / "data/chunk-000/episode_000002.parquet")
    reader = DatasetReader(root)
    assert reader.data_path(2) == root / "data/chunk-000/episode_000002.parquet"
    assert reader.read_table(2).num_rows == 2
    assert reader.info["video_path"] is None and reader.video_keys == []


def test_read_table_gives_exactly_the_columns_asked_for(tmp_path: Path) -> None:
    """The episode's file read by its own reader: every column, the ones named in their order,
    a missing one named in a one-line error, and a dotted name that also reads as a nested
    field's path (a hostile file) still meaning the top-level column."""
    root = tmp_path / "raw"
    with _open(root, cameras=[]) as writer:
        ep = writer.begin_episode("t")
        ep.add_frames(vectors={"observation.state": np.ones((2, 3)), "action": np.ones((2, 3))})
        ep.commit()
    reader = DatasetReader(root)
    path = reader.data_path(0)
    full = reader.read_table(0)
    assert full.equals(pq.read_table(path))
    picked = reader.read_table(0, ["action", "timestamp"])
    assert picked.column_names == ["action", "timestamp"]
    assert picked.equals(pq.read_table(path, columns=["action", "timestamp"]))
    with pytest.raises(DatasetError, match=r"episode 0: no column 'nope'$"):
        reader.read_table(0, ["timestamp", "nope"])
    # a struct "observation" with a field "state" beside the top-level "observation.state"
    hostile = full.append_column(
        "observation",
        pa.array([{"state": 1.0}, {"state": 2.0}], pa.struct([("state", pa.float64())])),
    )
    pq.write_table(hostile, path)
    state = reader.read_table(0, ["observation.state"])
    assert state.column_names == ["observation.state"]
    assert state.column(0).equals(full.column("observation.state"))


def test_a_table_read_twice_is_read_once_unless_its_file_changed(tmp_path: Path) -> None:
    """A validation and the export after it read every episode table: the second read is the
    first's table while the file is the one read, and a rewritten file is read anew."""
    from eva.dataset import reader as reader_module

    root = tmp_path / "raw"
    with _open(root, cameras=[]) as writer:
        for _ in range(3):
            ep = writer.begin_episode("t")
            ep.add_frames(vectors={"observation.state": np.ones((2, 3)), "action": np.ones((2, 3))})
            ep.commit()
    reader = DatasetReader(root)
    first = reader.read_table(0)
    assert reader.read_table(0) is first
    assert reader.read_table(0, ["action"]) is not first  # column reads are not cached
    path = reader.data_path(0)
    changed = first.set_column(
        first.column_names.index("action"),
        "action",
        pa.array([[2.0] * 3] * 2, pa.list_(pa.float32())),
    )
    tmp = path.with_name("tmp.parquet")
    pq.write_table(changed, tmp)
    tmp.replace(path)  # a new inode, as every writer commits
    again = reader.read_table(0)
    assert again is not first and again.equals(pq.read_table(path))
    # the budget: the oldest tables go first
    budget = reader_module.TABLE_CACHE_BYTES
    reader_module.TABLE_CACHE_BYTES = again.nbytes * 5 // 2  # room for two tables
    try:
        small = DatasetReader(root)
        tables = [small.read_table(i) for i in (0, 1)]
        assert small.read_table(0) is tables[0] and small.read_table(1) is tables[1]
        small.read_table(2)  # episode 0, the least recently read, makes room
        assert small.read_table(1) is tables[1]
        assert small.read_table(0) is not tables[0]
    finally:
        reader_module.TABLE_CACHE_BYTES = budget


@pytest.mark.parametrize("video_path", ["{video_key:03d}.mp4", 7])
def test_unusable_video_path_template_names_info_json(tmp_path: Path, video_path: object) -> None:
    """A template that passes the field-name check but cannot format (a numeric spec on the text
    field) or is no string is refused by reader and writer alike, naming the field."""
    root = tmp_path / "raw"
    with _open(root) as writer:
        ep = writer.begin_episode("t")
        _add(ep, 0, 2, SyntheticScene(48, 64))
        ep.commit()
    info = json.loads((root / layout.INFO).read_text())
    info["video_path"] = video_path
    (root / layout.INFO).write_text(json.dumps(info))
    with pytest.raises(DatasetError, match=r"info.json: field video_path .* unusable"):
        DatasetReader(root).video_path(0, FRONT)
    with _open(root) as writer, pytest.raises(DatasetError, match=r"field video_path .* unusable"):
        ep = writer.begin_episode("t")
        _add(ep, 0, 2, SyntheticScene(48, 64))
        ep.commit()


def test_zero_frame_commit_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    with _open(root) as writer:
        before = {p: p.read_bytes() for p in (root / "meta").iterdir()}
        empty = writer.begin_episode("never recorded")
        assert empty.commit({"quality": "green"}) is None
        assert {p: p.read_bytes() for p in (root / "meta").iterdir()} == before
        assert not (root / "data").exists() and not (root / "videos").exists()
        assert list((root / layout.WORK_DIR).iterdir()) == [root / layout.WORK_DIR / "writer.lock"]
        # The index was not consumed, and the never-used task did not enter tasks.jsonl.
        episode = writer.begin_episode("t")
        _add(episode, 0, 3, SyntheticScene(48, 64))
        assert episode.commit() == 0
    assert DatasetReader(root).tasks == {0: "t"}


def test_append_after_reopen_continues_indices(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    scene = SyntheticScene(48, 64)
    with _open(root) as writer:
        for task in ("a", "b"):
            ep = writer.begin_episode(task)
            _add(ep, 0, 4, scene)
            ep.commit({"quality": "green"})
    with _open(root) as writer:
        assert writer.next_episode_index == 2 and writer.total_frames == 8
        ep = writer.begin_episode("b")
        _add(ep, 0, 5, scene)
        assert ep.commit({"quality": "red"}) == 2
        ep = writer.begin_episode("c")
        _add(ep, 0, 1, scene)
        assert ep.commit() == 3
    reader = DatasetReader(root)
    assert reader.episode_indices == [0, 1, 2, 3]
    assert reader.tasks == {0: "a", 1: "b", 2: "c"}
    assert reader.read_table(2).column("index").to_pylist() == [8, 9, 10, 11, 12]
    assert reader.read_table(2).column("task_index").to_pylist() == [1] * 5
    assert reader.read_table(3).column("task_index").to_pylist() == [2]
    assert reader.info["total_frames"] == 14 and reader.info["splits"] == {"train": "0:4"}
    # stats.json equals a fresh merge of the per-episode stats (running merge survived reopen).
    from eva.dataset.stats import merge_stats

    fresh = merge_stats(reader.episodes_stats[e] for e in reader.episode_indices)
    for feature, stat in fresh.items():
        for key in ("min", "max", "mean", "std", "count"):
            np.testing.assert_allclose(
                reader.stats[feature][key], stat[key], rtol=1e-12, atol=1e-12
            )


def test_reopen_with_different_features_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    _open(root).close()
    with pytest.raises(DatasetError, match="fps"):
        _open(root, fps=15)
    with pytest.raises(DatasetError, match="cameras"):
        _open(root, cameras=[CameraSpec("observation.images.wrist", 48, 64)])
    with pytest.raises(DatasetError, match="shape"):
        _open(root, cameras=[CameraSpec(FRONT, 32, 64)])
    with pytest.raises(DatasetError, match="vectors"):
        _open(root, vectors=[VectorSpec("observation.state", 3)])


def test_second_writer_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    with _open(root), pytest.raises(DatasetError, match="another writer"):
        _open(root)
    _open(root).close()  # lock released on close


def test_abort_removes_work_dir(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    with _open(root) as writer:
        ep = writer.begin_episode("t")
        _add(ep, 0, 4, SyntheticScene(48, 64))
        assert ep.work_dir.is_dir() and ep.length == 4
        ep.abort()
        assert not ep.work_dir.exists()
    assert not (root / "data").exists()
    assert DatasetReader(root).episodes == []


def test_bad_frames_are_refused_with_field_names(tmp_path: Path) -> None:
    with _open(tmp_path / "raw") as writer:
        ep = writer.begin_episode("t")
        good = {"observation.state": np.zeros((2, 3)), "action": np.zeros((2, 3))}
        with pytest.raises(DatasetError, match=FRONT):
            ep.add_frames(images={FRONT: np.zeros((2, 48, 64, 3), np.float32)}, vectors=good)
        with pytest.raises(DatasetError, match="action"):
            ep.add_frames(
                images={FRONT: np.zeros((2, 48, 64, 3), np.uint8)},
                vectors={"observation.state": np.zeros((2, 3)), "action": np.zeros((2, 4))},
            )
        with pytest.raises(DatasetError, match="frame counts") as refused:
            ep.add_frames(images={FRONT: np.zeros((3, 48, 64, 3), np.uint8)}, vectors=good)
        assert str(refused.value).startswith(f"{tmp_path / 'raw'}: add_frames: ")  # the dataset
        with pytest.raises(DatasetError, match="may not set"):
            ep.commit({"length": 5})
        ep.abort()


def test_crash_during_metadata_write_keeps_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "raw"
    scene = SyntheticScene(48, 64)
    with _open(root) as writer:
        ep = writer.begin_episode("a")
        _add(ep, 0, 3, scene)
        ep.commit()
    info_before = (root / layout.INFO).read_bytes()
    episodes_before = (root / layout.EPISODES).read_bytes()

    real_replace = os.replace

    def crash_on_info(src, dst, *args, **kwargs):
        if Path(dst).name == "info.json":
            raise OSError("simulated power loss before rename")
        return real_replace(src, dst, *args, **kwargs)

    with _open(root) as writer:
        ep = writer.begin_episode("a")
        _add(ep, 0, 4, scene)
        monkeypatch.setattr(os, "replace", crash_on_info)
        # Past the commit point: reported as committed with stale metadata, naming the cause.
        with pytest.raises(MetadataNotUpdated, match="episode 1 committed; .*simulated"):
            ep.commit()
        monkeypatch.setattr(os, "replace", real_replace)
    # info.json: the old bytes, complete; no temp file left visible as a dataset file.
    assert (root / layout.INFO).read_bytes() == info_before
    assert json.loads(info_before)["total_episodes"] == 1
    assert not [p for p in (root / "meta").iterdir() if p.name.startswith(atomic.TMP_PREFIX)]
    # The episodes row was the commit point, so episode 1 exists; reopening repairs the totals.
    assert (root / layout.EPISODES).read_bytes() != episodes_before
    _open(root).close()
    reader = DatasetReader(root)
    assert reader.info["total_episodes"] == 2 and reader.info["total_frames"] == 7
    assert reader.stats["index"]["count"] == [7]


def test_crash_before_commit_point_leaves_dataset_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The episodes.jsonl append dies half-way (disk full): nothing of the episode is visible."""
    root = tmp_path / "raw"
    scene = SyntheticScene(48, 64)
    with _open(root) as writer:
        ep = writer.begin_episode("a")
        _add(ep, 0, 3, scene)
        ep.commit()
    meta_before = {p.name: p.read_bytes() for p in (root / "meta").iterdir()}
    rows_before = DatasetReader(root).episodes
    real_write_all = atomic._write_all

    def torn_write(fd: int, data: bytes) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("episodes.jsonl"):
            real_write_all(fd, data[: len(data) // 2])
            raise OSError(28, "simulated: no space left on device")
        real_write_all(fd, data)

    with _open(root) as writer:
        ep = writer.begin_episode("new task")
        _add(ep, 0, 4, scene)
        monkeypatch.setattr(atomic, "_write_all", torn_write)
        with pytest.raises(DatasetError, match="no space.*kept in .*eva recover"):
            ep.commit()
        kept = ep.work_dir  # the recording stays on disk for eva recover
        assert (kept / "spool.json").is_file()
        monkeypatch.setattr(atomic, "_write_all", real_write_all)
        assert not (root / "data/chunk-000/episode_000001.parquet").exists()
        assert not (root / f"videos/chunk-000/{FRONT}/episode_000001.mp4").exists()
        # A torn fragment is on disk, but no reader sees a row for it...
        torn = (root / layout.EPISODES).read_bytes()
        assert torn.startswith(meta_before["episodes.jsonl"]) and not torn.endswith(b"\n")
        assert DatasetReader(root).episodes == rows_before
        # ...the rows appended before the commit point were taken back...
        for name in ("episodes_stats.jsonl", "tasks.jsonl", "info.json", "stats.json"):
            assert (root / "meta" / name).read_bytes() == meta_before[name], name
        # ...and the same writer carries on, reusing index 1 (the fragment is dropped first).
        ep = writer.begin_episode("a")
        _add(ep, 0, 2, scene)
        assert ep.commit() == 1
        assert kept.is_dir()
    reader = DatasetReader(root)
    assert reader.episode_indices == [0, 1]
    assert reader.tasks == {0: "a"}
    assert sorted(reader.episodes_stats) == [0, 1]
    assert len(atomic.read_jsonl(root / layout.EPISODES)) == 2
    assert (root / layout.EPISODES).read_bytes().count(b"\n") == 2
    # The next writer turns the kept recording into an episode, marked as recovered.
    with _open(root) as writer:
        assert [r.episode_index for r in writer.recovered] == [2]
    row = DatasetReader(root).episodes[2]
    assert row["tasks"] == ["new task"] and row["length"] == 4 and row["quality"] == "red"
    assert not kept.exists()


def _commit_in_killed_process(root: Path, task: str, patch: str) -> None:
    """Commit a 2-frame episode in a child process whose ``patch`` (Python run first) SIGKILLs
    it part-way through the commit: a real process death, not an exception."""
    commit = f"""
        import numpy as np
        from eva.dataset.writer import CameraSpec, DatasetWriter, VectorSpec
        w = DatasetWriter.create_or_open({str(root)!r}, fps=30,
            cameras=[CameraSpec({FRONT!r}, 48, 64)],
            vectors=[VectorSpec("observation.state", 3), VectorSpec("action", 3)])
        ep = w.begin_episode({task!r})
        ep.add_frames(images={{{FRONT!r}: np.zeros((2, 48, 64, 3), np.uint8)}},
                      vectors={{"observation.state": np.zeros((2, 3)), "action": np.zeros((2, 3))}})
        ep.commit()
        """
    script = textwrap.dedent(patch) + textwrap.dedent(commit)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert proc.returncode == -9, proc.stderr.decode()


def test_killed_mid_append_is_repaired_on_reopen(tmp_path: Path) -> None:
    """SIGKILL half-way through writing the episodes.jsonl row (a real process death)."""
    from eva.dataset.validate import validate_dataset

    root = tmp_path / "raw"
    with _open(root) as writer:
        ep = writer.begin_episode("a")
        _add(ep, 0, 3, SyntheticScene(48, 64))
        ep.commit()
    episodes_before = (root / layout.EPISODES).read_bytes()
    torn_episodes_row = """
        import os, signal
        from eva.dataset import atomic
        real = atomic._write_all
        def torn(fd, data):
            if os.readlink(f"/proc/self/fd/{fd}").endswith("episodes.jsonl"):
                real(fd, data[: len(data) // 2])
                os.kill(os.getpid(), signal.SIGKILL)
            real(fd, data)
        atomic._write_all = torn
        """
    _commit_in_killed_process(root, "b", torn_episodes_row)
    assert (root / layout.EPISODES).read_bytes() != episodes_before  # torn fragment on disk
    reader = DatasetReader(root)
    assert reader.episode_indices == [0]  # readers ignore it, the validator reports it
    assert [p.code for p in validate_dataset(root)] == ["torn_jsonl_tail"]
    # Reopening drops the fragment and the orphan stats row, then recovers the episode from its
    # crash spool (all of it: the kill came after STOP), marked as recovered.
    with _open(root, recover=False) as writer:
        assert writer.next_episode_index == 1
    assert (root / layout.EPISODES).read_bytes() == episodes_before
    assert sorted(DatasetReader(root).episodes_stats) == [0]
    with _open(root) as writer:
        assert [(r.episode_index, r.frames) for r in writer.recovered] == [(1, 2)]
    row = DatasetReader(root).episodes[1]
    assert row["tasks"] == ["b"] and row["quality"] == "red"
    assert [i["code"] for i in row["quality_issues"]] == ["recovered_after_crash"]
    assert sorted(DatasetReader(root).episodes_stats) == [0, 1]
    assert validate_dataset(root) == []


def test_killed_writer_process_leaves_old_metadata_intact(tmp_path: Path) -> None:
    """A real process killed (SIGKILL) between temp write and rename of info.json."""
    root = tmp_path / "raw"
    with _open(root) as writer:
        ep = writer.begin_episode("a")
        _add(ep, 0, 3, SyntheticScene(48, 64))
        ep.commit()
    info_before = (root / layout.INFO).read_bytes()
    killed_before_info_rename = """
        import os, signal
        from pathlib import Path
        real = os.replace
        def replace(src, dst, *a, **k):
            if Path(dst).name == "info.json":
                os.kill(os.getpid(), signal.SIGKILL)  # dies with the temp file written
            return real(src, dst, *a, **k)
        os.replace = replace
        """
    _commit_in_killed_process(root, "a", killed_before_info_rename)
    assert (root / layout.INFO).read_bytes() == info_before
    leftovers = [p for p in (root / "meta").iterdir() if p.name.startswith(atomic.TMP_PREFIX)]
    assert leftovers  # the torn temp file exists, but under a name no reader looks at
    # Reopening cleans up the temporaries and the crashed work dir, and repairs totals.
    with _open(root) as writer:
        assert writer.next_episode_index == 2
    assert not [p for p in (root / "meta").iterdir() if p.name.startswith(atomic.TMP_PREFIX)]
    assert not [p for p in (root / layout.WORK_DIR).iterdir() if p.is_dir()]
    assert not list((root / "data").glob(f"*/{atomic.TMP_PREFIX}*"))
    assert DatasetReader(root).info["total_episodes"] == 2


def test_read_lerobot_written_fixture(lerobot_fixture_dir: Path) -> None:
    reader = DatasetReader(lerobot_fixture_dir)
    assert reader.codebase_version == "v2.1" and reader.fps == 30
    assert reader.video_keys == ["observation.images.front", "observation.images.wrist"]
    assert reader.vector_keys == ["observation.state", "action"]
    assert reader.tasks == {0: "pick the red cube", 1: "place it in the bin"}
    assert reader.stats == {}  # LeRobot 0.3.3 does not write stats.json
    total = 0
    for ep in reader.episode_indices:
        n = reader.length(ep)
        table = reader.read_table(ep)
        assert table.num_rows == n
        assert reader.read_vector(ep, "observation.state").shape == (n, 6)
        assert table.column("index").to_pylist() == list(range(total, total + n))
        total += n
        for key in reader.video_keys:
            assert reader.count_frames(ep, key) == n
            batches = [b.shape for b in reader.iter_frames(ep, key, batch_size=8)]
            assert sum(s[0] for s in batches) == n and all(s[1:] == (48, 64, 3) for s in batches)
            assert count_decoded_frames(reader.video_path(ep, key)) == n
    assert total == reader.info["total_frames"] == reader.total_frames


def test_iter_frames_reuses_one_buffer(small_dataset: Path) -> None:
    reader = DatasetReader(small_dataset)
    out = np.empty((4, 48, 64, 3), np.uint8)
    batches = list(reader.iter_frames(0, FRONT, batch_size=4, out=out))
    assert [len(b) for b in batches] == [4, 4, 4]
    assert all(np.shares_memory(b, out) for b in batches)


def test_reader_refuses_symlink_escape(tmp_path: Path, small_dataset: Path) -> None:
    outside = tmp_path / "outside.parquet"
    target = DatasetReader(small_dataset).data_path(1)
    pq.write_table(pq.read_table(target), outside)
    target.unlink()
    target.symlink_to(outside)
    with pytest.raises(DatasetError, match="is a symlink; eva follows no links"):
        DatasetReader(small_dataset).read_table(1)


def test_reader_errors_name_the_file(tmp_path: Path, small_dataset: Path) -> None:
    (small_dataset / layout.EPISODES).write_text('{"episode_index": 0, "length": 3}\n{oops\n')
    with pytest.raises(DatasetError, match=r"episodes\.jsonl:2"):
        _ = DatasetReader(small_dataset).episodes
    (small_dataset / layout.INFO).write_text("[]")
    with pytest.raises(DatasetError, match=r"info\.json: not a JSON object"):
        _ = DatasetReader(small_dataset).info
    with pytest.raises(DatasetError, match="not a directory"):
        DatasetReader(tmp_path / "nope")


def test_synthetic_generators_are_deterministic_and_batch_independent() -> None:
    scene = SyntheticScene(48, 64, seed=5)
    whole = scene.frames(0, 12)
    parts = np.concatenate([SyntheticScene(48, 64, seed=5).frames(s, 4) for s in (0, 4, 8)])
    assert np.array_equal(whole, parts)
    assert not np.array_equal(whole[0], whole[5])  # it moves
    assert whole.std() > 20  # it is textured
    s = joint_states(0, 30, dim=14, seed=1)
    assert s.shape == (30, 14) and s.dtype == np.float32
    assert set(np.unique(s[:, [6, 13]])) <= {0.0, 1.0}
    assert np.array_equal(joint_states(10, 5, seed=1), joint_states(0, 30, seed=1)[10:15])
    a = joint_actions(0, 30, dim=14, seed=1)
    assert np.abs(a[:-1, :6] - s[1:, :6]).max() < 0.1


def test_synthetic_dataset_flags(synthetic_dataset) -> None:
    root = synthetic_dataset(
        episodes=4,
        frames=[5, 0, 6, 7],
        cameras=2,
        width=32,
        height=16,
        quality=["green", "red", "red", "green"],
        qc_verdicts=[None, None, "pass", "fail"],
        qc_notes=[None, None, "looks fine", None],
        tasks=["x", "y"],
        state_dim=7,
    )
    reader = DatasetReader(root)
    rows = reader.episodes
    assert [r["episode_index"] for r in rows] == [0, 1, 2]  # the zero-frame episode is not written
    assert [r["quality"] for r in rows] == ["green", "red", "green"]
    assert rows[1]["qc_verdict"] == "pass" and rows[1]["qc_note"] == "looks fine"
    assert rows[1]["quality_issues"][0]["severity"] == "red"
    assert rows[2]["qc_verdict"] == "fail" and "qc_verdict" not in rows[0]
    assert reader.video_keys == ["observation.images.cam0", "observation.images.cam1"]
    assert reader.features["observation.state"]["shape"] == [7]
    assert pq.read_table(reader.data_path(2)).num_rows == 7


def test_commit_holds_saving_marker_and_meta_lock_for_eva_qc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The protocol of docs/design.md "Saving marker", checked with eva qc's own lock probes."""
    from eva.dataset.locks import is_flocked
    from eva.quality import verdicts

    root = tmp_path / "raw"
    seen: dict[str, bool] = {}
    real_append = atomic.append_jsonl_inplace

    def spying_append(path, rows, **kwargs):
        if Path(path).name == "episodes.jsonl":
            seen["saving"] = verdicts.is_being_saved(root, 0)
            seen["meta"] = is_flocked(root / layout.WORK_DIR / verdicts.META_LOCK)
        return real_append(path, rows, **kwargs)

    with _open(root) as writer:
        ep = writer.begin_episode("a")
        _add(ep, 0, 2, SyntheticScene(48, 64))
        monkeypatch.setattr(atomic, "append_jsonl_inplace", spying_append)
        assert ep.commit() == 0
    assert seen == {"saving": True, "meta": True}
    assert not verdicts.saving_marker(root, 0).exists()  # unlinked after the append
    verdicts.review_episode(root, 0, verdict="pass")  # and qc works right after
    assert DatasetReader(root).episodes[0]["qc_verdict"] == "pass"


def test_refuses_to_create_over_orphan_episodes(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    with _open(root) as writer:
        ep = writer.begin_episode("a")
        _add(ep, 0, 2, SyntheticScene(48, 64))
        ep.commit()
    (root / layout.INFO).unlink()
    with pytest.raises(DatasetError, match="already holds episodes"):
        _open(root)


def test_append_to_lerobot_written_dataset(tmp_path: Path, lerobot_fixture_dir: Path) -> None:
    import shutil

    from eva.dataset.validate import validate_dataset

    root = tmp_path / "raw"
    shutil.copytree(lerobot_fixture_dir, root)
    reader = DatasetReader(root)
    names = reader.features["observation.state"]["names"]
    with DatasetWriter.create_or_open(
        root,
        fps=30,
        cameras=[CameraSpec(k, 48, 64) for k in reader.video_keys],
        vectors=[VectorSpec("observation.state", 6, names), VectorSpec("action", 6, names)],
        video=VideoOptions(codec="libsvtav1", preset="12"),
        durable=False,
    ) as writer:
        assert writer.next_episode_index == 2 and writer.total_frames == 51
        ep = writer.begin_episode("place it in the bin")
        scene = SyntheticScene(48, 64)
        ep.add_frames(
            images={k: scene.frames(0, 5) for k in reader.video_keys},
            vectors={"observation.state": np.zeros((5, 6)), "action": np.ones((5, 6))},
        )
        assert ep.commit({"quality": "green"}) == 2
    reader = DatasetReader(root)
    assert reader.tasks == {0: "pick the red cube", 1: "place it in the bin"}
    table = reader.read_table(2)
    assert "capture_time" not in table.column_names  # the dataset's own schema is kept
    assert table.column("index").to_pylist() == list(range(51, 56))
    assert table.column("task_index").to_pylist() == [1] * 5
    assert reader.info["total_episodes"] == 3 and reader.info["total_frames"] == 56
    assert reader.stats["index"]["count"] == [56]  # stats.json created from all episodes
    assert validate_dataset(root, decode=True) == []


def test_non_finite_vectors_are_kept_but_left_out_of_stats(tmp_path: Path) -> None:
    """A red episode with NaN samples (non_finite_value) is still saved as evidence."""
    from eva.dataset.validate import validate_dataset

    root = tmp_path / "raw"
    state = np.arange(12, dtype=np.float32).reshape(4, 3)
    state[1, 2] = np.nan
    state[3, 0] = np.inf
    with _open(root) as writer:
        ep = writer.begin_episode("a")
        ep.add_frames(
            images={FRONT: SyntheticScene(48, 64).frames(0, 4)},
            vectors={"observation.state": state, "action": np.full((4, 3), np.nan)},
        )
        ep.commit({"quality": "red", "quality_issues": [{"severity": "red", "code": "non_finite_value", "detail": "observation.state frame 1"}]})  # fmt: skip
    reader = DatasetReader(root)
    stored = reader.read_vector(0, "observation.state")
    assert np.isnan(stored[1, 2]) and np.isinf(stored[3, 0])
    stats = reader.episodes_stats[0]
    assert stats["observation.state"]["count"] == [2]  # rows 0 and 2
    assert stats["observation.state"]["max"] == [6.0, 7.0, 8.0]
    assert "action" not in stats  # no finite row at all; still computable from the table
    # Kept as evidence, but named by validation (an export refuses them unless asked to carry them).
    problems = validate_dataset(root)
    assert [p.code for p in problems] == ["non_finite_values"] * 2
    assert "column observation.state: 2 NaN/inf values, the first in row 1" in problems[0].message


def test_bad_options_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="even sizes"):  # refused by the camera's own spec
        _open(tmp_path / "odd", cameras=[CameraSpec(FRONT, 47, 64)])
    assert not (tmp_path / "odd").exists()
    with pytest.raises(ValueError, match="preset"):
        VideoOptions(preset="warp9")
    with pytest.raises(ValueError, match="codec"):
        VideoOptions(codec="mjpeg")
    with pytest.raises(ValueError, match="pix_fmt"):
        VideoOptions(pix_fmt="yuv444p")


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cuts=st.lists(st.integers(min_value=1, max_value=11), min_size=0, max_size=4))
def test_batching_does_not_change_the_output(tmp_path_factory, cuts: list[int]) -> None:
    """Frames fed in any batch split give the same table and stats, and the same video content."""
    n = 12
    scene = SyntheticScene(16, 32, seed=9)
    images = scene.frames(0, n)
    state = joint_states(0, n, dim=3, seed=4)
    bounds = [0, *sorted(set(cuts)), n]
    outputs = []
    for split in ([0, n], bounds):
        root = tmp_path_factory.mktemp("batched") / "raw"
        with _open(root, cameras=[CameraSpec(FRONT, 16, 32)]) as writer:
            ep = writer.begin_episode("t")
            for a, b in zip(split[:-1], split[1:], strict=True):
                ep.add_frames(
                    images={FRONT: images[a:b]},
                    vectors={"observation.state": state[a:b], "action": state[a:b] * 2},
                    capture_time=np.arange(a, b) / 30.0,
                )
            ep.commit()
        reader = DatasetReader(root)
        frames = np.concatenate([f.copy() for f in reader.iter_frames(0, FRONT, batch_size=5)])
        outputs.append((reader.read_table(0), reader.episodes_stats[0], frames))
    (table_a, stats_a, frames_a), (table_b, stats_b, frames_b) = outputs
    assert table_a.equals(table_b)
    # Pixels: x264 output is not bit-reproducible run to run on these tiny frames (rate-control
    # decisions vary rarely under load, even unbatched), so check content and order, not bytes.
    for frames in (frames_a, frames_b):
        assert frames.shape == images.shape
        error = np.abs(frames.astype(np.int16) - images.astype(np.int16))
        assert error.mean() < 16
        diff = np.abs(frames[:, None].astype(np.int16) - images[None].astype(np.int16))
        assert np.array_equal(diff.mean(axis=(2, 3, 4)).argmin(axis=1), np.arange(n))
    assert stats_a.keys() == stats_b.keys()
    for feature in stats_a:
        for key in ("min", "max", "mean", "std", "count"):
            np.testing.assert_allclose(stats_a[feature][key], stats_b[feature][key], rtol=1e-12)


def test_synthetic_dataset_appends_and_keeps_capture_time_monotonic(synthetic_dataset) -> None:
    root = synthetic_dataset(episodes=1, frames=9, tasks=["first"])
    synthetic_dataset(episodes=2, frames=[4, 5], tasks=["second"])  # same name: appends
    reader = DatasetReader(root)
    assert reader.episode_indices == [0, 1, 2]
    assert reader.tasks == {0: "first", 1: "second"}
    for ep in reader.episode_indices:
        capture = reader.read_vector(ep, "capture_time")
        assert np.all(np.diff(capture) > 0)
    with pytest.raises(DatasetError, match="episode 7"):
        reader.read_table(7)
    with pytest.raises(DatasetError, match="episode 0"):
        reader.read_table(0, columns=["no_such_column"])


@pytest.mark.parametrize("parallel_encode", [True, False])
def test_cameras_encode_in_parallel_with_exact_stats_and_order(
    tmp_path: Path, parallel_encode: bool
) -> None:
    """Three cameras, batches larger and smaller than the encoder's batch buffers, and the
    caller's frame buffer reused after every add_frames (as the recorder does)."""
    import av

    from eva.dataset.encoder_pool import ENCODE_BATCH_FRAMES
    from eva.dataset.stats import ImageStats

    keys = [f"observation.images.cam{i}" for i in range(3)]
    sizes = [(48, 64), (32, 48), (48, 64)]
    cameras = [CameraSpec(k, h, w) for k, (h, w) in zip(keys, sizes, strict=True)]
    n = 2 * ENCODE_BATCH_FRAMES + 5
    sources = {
        k: SyntheticScene(h, w, seed=20 + i).frames(0, n)
        for i, (k, (h, w)) in enumerate(zip(keys, sizes, strict=True))
    }
    reused = {
        k: np.empty((ENCODE_BATCH_FRAMES + 3, h, w, 3), np.uint8)
        for k, (h, w) in zip(keys, sizes, strict=True)
    }
    root = tmp_path / "raw"
    video = VideoOptions(gop=8)
    with _open(
        root, cameras=cameras, vectors=[], parallel_encode=parallel_encode, video=video
    ) as writer:
        ep = writer.begin_episode("t")
        for a, b in ((0, 3), (3, 3 + ENCODE_BATCH_FRAMES + 3), (3 + ENCODE_BATCH_FRAMES + 3, n)):
            for k in keys:
                reused[k][: b - a] = sources[k][a:b]
            ep.add_frames(images={k: reused[k][: b - a] for k in keys})
            for k in keys:
                reused[k].fill(255)  # the writer must not read the caller's buffer afterwards
        assert ep.commit() == 0
    reader = DatasetReader(root)
    for k in keys:
        images = sources[k]
        decoded = np.concatenate([f.copy() for f in reader.iter_frames(0, k, batch_size=7)])
        assert decoded.shape == images.shape
        assert np.abs(decoded.astype(np.int16) - images.astype(np.int16)).mean() < 16
        diff = np.abs(decoded[:, None].astype(np.int16) - images[None].astype(np.int16))
        assert np.array_equal(diff.mean(axis=(2, 3, 4)).argmin(axis=1), np.arange(n))
        assert reader.count_frames(0, k) == n
        # Whatever the codec threading the writer picks: fixed GOP, no B-frames.
        with av.open(str(reader.video_path(0, k))) as container:
            packets = [p for p in container.demux(video=0) if p.size]
            assert [i for i, p in enumerate(packets) if p.is_keyframe] == list(range(0, n, 8))
            pts = [p.pts for p in packets]
            assert pts == sorted(pts) and [p.dts for p in packets] == pts
        expected = ImageStats()
        expected.update(images)
        want = expected.result()
        got = reader.episodes_stats[0][k]
        for stat in ("min", "max", "mean", "std", "count"):
            np.testing.assert_array_equal(np.asarray(got[stat]), np.asarray(want[stat]))


@pytest.mark.parametrize("parallel_encode", [True, False])
def test_one_camera_encoder_failure_aborts_the_episode(
    tmp_path: Path, parallel_encode: bool
) -> None:
    """A real failure of one camera's encoder (its MP4 path cannot be opened) is raised, names
    the camera, and leaves nothing committed and no work dir; the writer stays usable."""
    good, bad = "observation.images.good", "observation.images.bad"
    cameras = [CameraSpec(good, 48, 64), CameraSpec(bad, 48, 64)]
    scene = SyntheticScene(48, 64, seed=5)
    root = tmp_path / "raw"
    with _open(root, cameras=cameras, vectors=[], parallel_encode=parallel_encode) as writer:
        ep = writer.begin_episode("t")
        # A directory where camera `bad` must write its MP4: opening it fails in FFmpeg.
        (ep.work_dir / "01.mp4").mkdir()
        with pytest.raises(DatasetError, match=f"camera {bad}: encoding 01.mp4 failed"):
            for start in range(0, 40, 8):
                frames = scene.frames(start, 8)
                ep.add_frames(images={good: frames, bad: frames})
            ep.commit()
        assert not ep.work_dir.exists()
        with pytest.raises(DatasetError, match="aborted: camera"):
            ep.commit()
        ep.abort()  # idempotent
        assert DatasetReader(root).episodes == []
        assert not (root / "data").exists() and not (root / "videos").exists()
        assert [p.name for p in writer.work_root.iterdir() if p.is_dir()] == []

        ep = writer.begin_episode("t")
        frames = scene.frames(0, 5)
        ep.add_frames(images={good: frames, bad: frames})
        assert ep.commit() == 0
    assert DatasetReader(root).count_frames(0, bad) == 5


@pytest.mark.parametrize(
    ("thread_type", "thread_count"), [(None, None), ("FRAME", 2), ("SLICE", 2), ("NONE", 1)]
)
def test_encoder_threading_keeps_fixed_gop_and_no_bframes(
    tmp_path: Path, thread_type: str | None, thread_count: int | None
) -> None:
    import av

    from eva.dataset.video import VideoEncoder

    images = SyntheticScene(48, 64, seed=2).frames(0, 20)
    path = tmp_path / "v.mp4"
    options = VideoOptions(gop=8, crf=30, preset="ultrafast")
    with VideoEncoder(
        path, 64, 48, 30, options, thread_type=thread_type, thread_count=thread_count
    ) as encoder:
        padded = np.zeros((7, 48, 70, 3), np.uint8)
        padded[:, :, :64] = images[:7]
        encoder.write(padded[:, :, :64])  # padded rows: wrapped without a copy
        spaced = np.zeros((13, 48, 128, 3), np.uint8)
        spaced[:, :, ::2] = images[7:]
        encoder.write(spaced[:, :, ::2])  # pixels not adjacent: copied
    with av.open(str(path)) as container:
        packets = [p for p in container.demux(video=0) if p.size]
        assert [i for i, p in enumerate(packets) if p.is_keyframe] == [0, 8, 16]
        pts = [p.pts for p in packets]
        assert pts == sorted(pts) and [p.dts for p in packets] == pts
    assert count_decoded_frames(path) == 20 and probe(path)["frames"] == 20
    from eva.dataset.video import iter_frame_batches

    decoded = np.concatenate([b.copy() for b in iter_frame_batches(path, 8)])
    diff = np.abs(decoded[:, None].astype(np.int16) - images[None].astype(np.int16))
    assert np.array_equal(diff.mean(axis=(2, 3, 4)).argmin(axis=1), np.arange(20))


def test_encoder_threads_end_with_commit_abort_or_a_dropped_episode(tmp_path: Path) -> None:
    import gc
    import threading
    import time

    others = {t for t in threading.enumerate() if t.name.startswith("eva-encode-")}

    def encoder_threads() -> list[threading.Thread]:
        return [
            t for t in threading.enumerate() if t.name.startswith("eva-encode-") and t not in others
        ]

    scene = SyntheticScene(48, 64)
    with _open(tmp_path / "raw") as writer:
        for end in ("commit", "abort", "drop"):
            ep = writer.begin_episode("t")
            _add(ep, 0, 5, scene)
            assert encoder_threads()
            if end == "commit":
                ep.commit()
            elif end == "abort":
                ep.abort()
            else:
                del ep  # never committed nor aborted: collecting it stops its threads
                gc.collect()
            deadline = time.monotonic() + 30
            while encoder_threads():
                assert time.monotonic() < deadline, (end, encoder_threads())
                time.sleep(0.01)


@pytest.mark.parametrize(
    "rows",
    [
        [[0.5, 1.25, -2.0], [3.0, 4.5, 5.0], [6.0, 7.0, 8.5]],  # uniform: the fast path
        [[0.5, None], [2.0, 3.0], [4.0, 5.0]],  # a null value: the per-element path
        [[0.5, 1.0], [2.0], [3.0, 4.0]],  # ragged: refused, naming file, episode and column
    ],
)
def test_read_vector_of_list_column_matches_to_pylist(tmp_path: Path, rows: list) -> None:
    """LeRobot stores vectors as list<float> (not fixed-size lists): read_vector gives what
    np.asarray(to_pylist()) gives, float32 values widened to float64, across row groups."""
    root = tmp_path / "raw"
    with _open(root, cameras=[]) as writer:
        ep = writer.begin_episode("t")
        ep.add_frames(vectors={"observation.state": np.zeros((3, 3)), "action": np.zeros((3, 3))})
        ep.commit()
    column = pa.array(rows, type=pa.list_(pa.float32()))
    path = DatasetReader(root).data_path(0)
    table = pq.read_table(path).set_column(0, "observation.state", column)
    pq.write_table(table, path, row_group_size=2)  # two chunks, the second one offset
    if len({len(r) for r in rows}) > 1:
        with pytest.raises(DatasetError, match=r"episode_000000.parquet: episode 0: column obs"):
            DatasetReader(root).read_vector(0, "observation.state")
        return
    got = DatasetReader(root).read_vector(0, "observation.state")
    want = np.asarray(column.to_pylist())
    if got.dtype == object or want.dtype == object:
        assert got.tolist() == want.tolist()
    else:
        assert got.dtype == want.dtype == np.float64
        np.testing.assert_array_equal(got, want)


def test_validation_reads_each_table_whole_once_for_the_export(small_dataset: Path) -> None:
    # every column of a LeRobot table is a feature or an index column: validation reads the
    # table whole through the reader, and the export's writers get that read again
    from eva.dataset.validate import validate_dataset

    reader = DatasetReader(small_dataset)
    assert validate_dataset(small_dataset, reader=reader) == []
    read = {ep: table for ep, (_, table) in reader._tables.items()}
    assert sorted(read) == reader.episode_indices  # kept by the validation's reads
    for ep, table in read.items():
        assert reader.read_table(ep) is table and table.equals(pq.read_table(reader.data_path(ep)))
