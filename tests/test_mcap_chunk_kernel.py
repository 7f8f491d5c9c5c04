"""The ``mcap_chunk`` kernel against its references: the chunk CRC (``zlib.crc32``), the Annex B
conversion of a read window (``h264.annexb_in_place_batch``), the foxglove frame records
(``frame_records.reference_fill``, numpy), and whole episodes written natively against the same
episodes written under ``EVA_PUREPYTHON=1`` (real PyAV-encoded MP4s, byte for byte). Under
``EVA_PUREPYTHON=1`` both sides of the first three are the reference."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcap.reader import make_reader

from eva.capture.synthetic import write_synthetic_dataset
from eva.dataset.errors import DatasetError
from eva.dataset.mp4box import read_video_samples
from eva.dataset.reader import DatasetReader
from eva.formats.mcap import foxglove, frame_records, h264, records, wire
from eva.formats.mcap.foxglove_export import CarriedVideo, EpisodeContent, write_foxglove_episode
from eva.formats.mcap.frame_records import CameraUnits, JsonColumn
from eva.formats.mcap.h264 import UnitBatch


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=3000), skip=st.integers(0, 15), value=st.integers(0, 2**32 - 1))
def test_crc32_is_zlibs(data: bytes, skip: int, value: int) -> None:
    view = memoryview(data)[skip:]  # any alignment
    assert records.crc32(view, value) == zlib.crc32(view, value)


def test_crc32_of_chunk_sized_buffers_is_zlibs() -> None:
    rng = np.random.default_rng(7)
    for size in (63, 64, 65, 79, 80, 4095, 65536 + 17, (4 << 20) + 64 * 1024 + 5):
        buffer = bytearray(rng.integers(0, 256, size, np.uint8).tobytes())
        assert records.crc32(buffer) == zlib.crc32(buffer)
        assert records.crc32(memoryview(buffer)[3:], 99) == zlib.crc32(memoryview(buffer)[3:], 99)


def _samples(units: list[list[bytes]], gap: int) -> tuple[bytearray, list[int], list[int]]:
    window = bytearray()
    starts, ends = [], []
    for sample in units:
        window += b"\xaa" * gap
        starts.append(len(window))
        window += b"".join(len(u).to_bytes(4, "big") + u for u in sample)
        ends.append(len(window))
    return window, starts, ends


@settings(max_examples=200, deadline=None)
@given(
    samples=st.lists(
        st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=6),
        min_size=1,
        max_size=12,
    ),
    gap=st.integers(min_value=0, max_value=3),
    damage=st.one_of(st.none(), st.tuples(st.integers(0, 11), st.integers(0, 2**32 - 1))),
)
def test_annexb_window_is_the_reference(
    samples: list[list[bytes]], gap: int, damage: tuple[int, int] | None
) -> None:
    window, starts, ends = _samples(samples, gap)
    if damage is not None and damage[0] < len(samples):
        at = starts[damage[0]]
        window[at : at + 4] = damage[1].to_bytes(4, "big")
    reference = np.frombuffer(bytearray(window), np.uint8)
    native = np.frombuffer(window, np.uint8)
    bounds = np.array(starts, np.int64), np.array(ends, np.int64)
    try:
        expected = h264.annexb_in_place_batch(reference, *bounds)
    except ValueError:
        with pytest.raises((ValueError, h264._Damaged)):
            h264.annexb_window(native, *bounds)
        return
    assert h264.annexb_window(native, *bounds).tolist() == expected.tolist()
    assert native.tobytes() == reference.tobytes()


JSON_ROWS = st.lists(st.binary(max_size=50), min_size=1, max_size=12)
UNIT = st.binary(max_size=400)


@st.composite
def _batches(draw: st.DrawFn) -> tuple[list[JsonColumn], list[CameraUnits], np.ndarray, int]:
    """JSON columns of a whole episode, and a batch of its frames (from ``first``) of cameras."""
    rows = draw(st.integers(min_value=1, max_value=12))
    first = draw(st.integers(min_value=0, max_value=rows - 1))
    frames = rows - first
    channels = iter(draw(st.permutations(range(1, 12))))
    columns = [
        JsonColumn(next(channels), wire.Ragged.of(draw(st.lists(st.binary(max_size=50),
                                                                min_size=rows, max_size=rows))))
        for _ in range(draw(st.integers(0, 3)))
    ]  # fmt: skip
    cameras = []
    for _ in range(draw(st.integers(0 if columns else 1, 3))):
        units = draw(st.lists(UNIT, min_size=frames, max_size=frames))
        gap = draw(st.integers(0, 5))
        data = bytearray(b"\xbb" * gap)
        starts = []
        for unit in units:
            starts.append(len(data))
            data += unit + b"\xcc" * gap
        prefixed = draw(st.lists(st.booleans(), min_size=frames, max_size=frames))
        batch = UnitBatch(
            np.frombuffer(data, np.uint8),
            np.array(starts, np.int64),
            np.array([len(u) for u in units], np.int64),
            np.array(prefixed, bool),
            draw(st.binary(max_size=30)),
        )
        cameras.append(CameraUnits(next(channels), draw(st.text(max_size=12)), batch))
    times = draw(
        st.lists(st.integers(min_value=-(2**62), max_value=2**62), min_size=frames, max_size=frames)
    )
    return columns, cameras, np.array(times, np.int64), first


def _fill_all(fill: records.RecordFill, count: int, chunk_size: int) -> list[tuple[object, ...]]:
    """Every step of the fill as the writer drives it (a flushed chunk starts empty; a record
    larger than the buffer gets one of its size): each step's result, offsets and chunk."""
    steps: list[tuple[object, ...]] = []
    buffer = bytearray(chunk_size + 64)
    offsets = np.full(count, -1, np.int64)
    first, used = 0, 0
    while first < count:
        done, used, needed = fill(buffer, used, chunk_size, first, offsets)
        steps.append((done, used, needed, offsets[first:done].tolist(), bytes(buffer[:used])))
        first = done
        if first < count and needed:
            if used:
                used = 0
            else:
                buffer = bytearray(needed)
    return steps


@settings(max_examples=200, deadline=None)
@given(batch=_batches(), chunk_size=st.sampled_from([1, 64, 200, 1000, 1 << 20]))
def test_frame_records_are_the_reference(
    batch: tuple[list[JsonColumn], list[CameraUnits], np.ndarray, int], chunk_size: int
) -> None:
    columns, cameras, times, first = batch
    count = len(times) * (len(columns) + len(cameras))
    native = frame_records.frame_fill(columns, cameras, times, first)
    reference = frame_records.reference_fill(columns, cameras, times, first)
    assert _fill_all(native, count, chunk_size) == _fill_all(reference, count, chunk_size)


@pytest.mark.native
def test_frame_records_refuse_sources_outside_their_data() -> None:
    column = JsonColumn(1, wire.Ragged.of([b"{}", b"{}"]))
    batch = UnitBatch(np.zeros(10, np.uint8), np.array([4]), np.array([7]), np.zeros(1, bool), b"")
    fill = frame_records.frame_fill([column], [CameraUnits(2, "cam", batch)], np.zeros(1), 1)
    with pytest.raises(ValueError):
        fill(bytearray(1000), 0, 500, 0, np.zeros(2, np.int64))


def _write_episodes(raw: Path, out: Path, pure_python: bool) -> None:
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from eva.dataset.mp4box import read_video_samples\n"
        "from eva.dataset.reader import DatasetReader\n"
        "from eva.formats.mcap.foxglove_export import CarriedVideo, EpisodeContent, "
        "write_foxglove_episode\n"
        "reader = DatasetReader(Path(sys.argv[1]))\n"
        "for e in reader.episode_indices:\n"
        "    cameras = {k: CarriedVideo(reader.video_path(e, k), "
        "read_video_samples(reader.video_path(e, k))) for k in reader.video_keys}\n"
        "    content = EpisodeContent(reader.read_table(e), reader.episode(e), reader.fps, "
        "reader.features)\n"
        "    for chunk_size in (4096, 1 << 20, 4 << 20):\n"
        "        write_foxglove_episode(Path(sys.argv[2]) / f'{e}-{chunk_size}.mcap', content, "
        "cameras, chunk_size=chunk_size)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "EVA_PUREPYTHON"}
    if pure_python:
        env["EVA_PUREPYTHON"] = "1"
    out.mkdir()
    subprocess.run([sys.executable, "-c", script, str(raw), str(out)], check=True, env=env)


@pytest.mark.native
def test_native_episodes_are_the_pure_python_episodes_byte_for_byte(tmp_path: Path) -> None:
    """The writer with every kernel against the writer with every reference (the numpy writer
    of before the kernel): 3 cameras of 640x480 H.264 at 30 fps, 4 MiB read windows holding
    many frames, chunks smaller and larger than a window."""
    raw = write_synthetic_dataset(
        tmp_path / "raw", episodes=2, frames=[70, 45], cameras=3, width=640, height=480
    )
    _write_episodes(raw, tmp_path / "native", pure_python=False)
    _write_episodes(raw, tmp_path / "reference", pure_python=True)
    names = sorted(p.name for p in (tmp_path / "native").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "reference").iterdir())
    assert len(names) == 6
    for name in names:
        native = (tmp_path / "native" / name).read_bytes()
        assert native == (tmp_path / "reference" / name).read_bytes(), name
    with open(tmp_path / "native" / "0-4194304.mcap", "rb") as stream:
        reader = make_reader(stream, validate_crcs=True)
        counts: dict[str, int] = {}
        for _, channel, _ in reader.iter_messages():
            counts[channel.topic] = counts.get(channel.topic, 0) + 1
    for i in range(3):
        assert counts[foxglove.image_topic(f"observation.images.cam{i}")] == 70


def test_a_damaged_sample_is_named_whichever_code_converts_it(tmp_path: Path) -> None:
    """A NAL length running past its sample: the kernel leaves the wording to the reference, so
    the one-line error is the same natively and under EVA_PUREPYTHON=1."""
    raw = write_synthetic_dataset(tmp_path / "raw", episodes=1, frames=12, width=64, height=48)
    reader = DatasetReader(raw)
    key = reader.video_keys[0]
    path = reader.video_path(0, key)
    samples = read_video_samples(path)
    damaged = bytearray(path.read_bytes())
    at = int(samples.offsets[5])
    damaged[at : at + 4] = b"\xff\xff\xff\xff"
    path.write_bytes(bytes(damaged))
    content = EpisodeContent(reader.read_table(0), reader.episode(0), reader.fps, reader.features)
    with pytest.raises(DatasetError) as raised:
        write_foxglove_episode(
            tmp_path / "out.mcap", content, {key: CarriedVideo(path, samples)}, warn=None
        )
    assert str(raised.value) == (
        f"out.mcap: {path}: sample 5: NAL unit of 4294967295 bytes at sample byte 0"
    )
    assert not (tmp_path / "out.mcap").exists()
