"""The foxglove profile's batch encoders against their one-message references and the official
serializers: protobuf varints and CompressedVideo heads (``protobuf``), JSON rows
(``json.dumps``), Annex B conversion of a window of samples (the per-sample walk), message
records framed with numpy (``PayloadFill``, against ``McapEpisodeWriter.add_message`` and the
``mcap`` reader), and a whole episode written in batches against the same episode written
message by message."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from foxglove_schemas_protobuf.CompressedVideo_pb2 import CompressedVideo
from foxglove_schemas_protobuf.Log_pb2 import Log
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st
from mcap.reader import make_reader
from mcap.records import MessageIndex
from mcap.stream_reader import StreamReader

from eva.capture.synthetic import write_synthetic_dataset
from eva.dataset.mp4box import read_video_samples
from eva.dataset.reader import DatasetReader
from eva.formats.mcap import McapEpisodeWriter, foxglove, h264, json_rows, spec, wire
from eva.formats.mcap.foxglove_export import (
    CarriedVideo,
    EpisodeContent,
    frame_times,
    json_columns,
    write_foxglove_episode,
)
from eva.formats.mcap.records import PayloadFill, SpareBuffers
from eva.formats.mcap.spec import message_index
from eva.formats.mcap.writer import episode_file

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@pytest.mark.kernel_independent
@settings(max_examples=200, deadline=None)
@given(st.lists(INT64, min_size=1, max_size=50))
def test_varints_are_protobufs(values: list[int]) -> None:
    padded = wire.varints(np.array(values, np.int64))
    rows = wire.concat([padded])
    for i, value in enumerate(values):
        # the official serializer: an int64 field 1 (tag 0x08), left out when 0
        expected = Timestamp(seconds=value).SerializeToString()[1:] if value else b"\x00"
        assert rows.row(i) == expected


@pytest.mark.kernel_independent
@settings(max_examples=150, deadline=None)
@given(
    frames=st.lists(
        st.tuples(
            st.integers(min_value=-(2**62), max_value=2**62),  # ns since the epoch
            st.binary(max_size=300),  # the access unit
            st.booleans(),  # prefixed with the parameter sets
        ),
        min_size=1,
        max_size=20,
    ),
    frame_id=st.text(max_size=20),
    prefix=st.binary(max_size=40),
)
def test_compressed_video_heads_equal_the_protobuf_serializer(
    frames: list[tuple[int, bytes, bool]], frame_id: str, prefix: bytes
) -> None:
    times = np.array([t for t, _, _ in frames], np.int64)
    sizes = np.array([len(u) for _, u, _ in frames], np.int64)
    prefixed = np.array([p for _, _, p in frames], bool)
    heads = foxglove.compressed_video_heads(times, frame_id, sizes, prefix, prefixed)
    for i, (time_ns, unit, has_prefix) in enumerate(frames):
        seconds, nanos = divmod(time_ns, 1_000_000_000)
        expected = CompressedVideo(
            timestamp=Timestamp(seconds=seconds, nanos=nanos),
            frame_id=frame_id,
            data=(prefix if has_prefix else b"") + unit,
            format="h264",
        ).SerializeToString()
        assert heads.row(i) + unit + foxglove.COMPRESSED_VIDEO_TAIL == expected
        data = [prefix, unit] if has_prefix else [unit]
        if time_ns >= 0 and any(data):  # the one-frame encoder's range: recorded frames
            assert b"".join(foxglove.compressed_video_parts(time_ns, frame_id, data)) == expected


FLOATS = st.floats(allow_nan=True, allow_infinity=True)


@settings(max_examples=150, deadline=None)
@given(
    rows=st.integers(min_value=1, max_value=8),
    kinds=st.lists(st.sampled_from(["f4", "f8", "i8", "u1", "bool"]), min_size=1, max_size=6),
    names=st.lists(st.text(max_size=8), min_size=6, max_size=6, unique=True),
    data=st.data(),
)
def test_json_rows_equal_json_dumps(
    rows: int, kinds: list[str], names: list[str], data: st.DataObject
) -> None:
    columns = []
    for kind in kinds:
        if kind == "bool":
            values = data.draw(st.lists(st.booleans(), min_size=rows, max_size=rows))
        elif kind[0] == "f":
            width = 32 if kind == "f4" else 64
            values = data.draw(st.lists(st.floats(width=width), min_size=rows, max_size=rows))
        elif kind == "u1":
            values = data.draw(st.lists(st.integers(0, 255), min_size=rows, max_size=rows))
        else:
            values = data.draw(st.lists(INT64, min_size=rows, max_size=rows))
        columns.append(np.array(values, dtype=kind))
    keys = names[: len(columns)]
    expected = [
        foxglove.json_payload({k: c[i].item() for k, c in zip(keys, columns, strict=True)})
        for i in range(rows)
    ]
    assert json_rows.json_rows(keys, columns).to_list() == expected
    reference = json_rows.float_reprs_reference
    for column in columns:
        if column.dtype.kind == "f":  # the native kernel (when built) against repr
            assert json_rows.float_reprs(column).to_list() == reference(column).to_list()


def _nal_sample(units: list[bytes]) -> bytes:
    return b"".join(len(u).to_bytes(4, "big") + u for u in units)


NAL_UNITS = st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=6)


@pytest.mark.kernel_independent
@settings(max_examples=200, deadline=None)
@given(
    samples=st.lists(NAL_UNITS, min_size=1, max_size=12),
    gap=st.integers(min_value=0, max_value=3),
    damage=st.one_of(st.none(), st.tuples(st.integers(0, 11), st.integers(0, 2**32 - 1))),
)
def test_annexb_of_a_window_agrees_with_the_per_sample_walk(
    samples: list[list[bytes]], gap: int, damage: tuple[int, int] | None
) -> None:
    encoded = [bytearray(_nal_sample(s)) for s in samples]
    if damage is not None and damage[0] < len(encoded):
        encoded[damage[0]][0:4] = damage[1].to_bytes(4, "big")  # the first NAL length
    window = bytearray()
    starts, ends = [], []
    for sample in encoded:
        window += b"\xaa" * gap
        starts.append(len(window))
        window += sample
        ends.append(len(window))
    reference = bytearray(window)
    expected_sps: list[bool] = []
    expected_error = None
    for i, (a, b) in enumerate(zip(starts, ends, strict=True)):
        try:
            expected_sps.append(h264.annexb_in_place(reference, a, b))
        except ValueError as e:
            expected_error = (i, str(e))
            break
    batch = np.frombuffer(window, np.uint8)
    if expected_error is not None:
        with pytest.raises(ValueError) as raised:
            h264.annexb_in_place_batch(batch, np.array(starts), np.array(ends))
        assert raised.value.args == expected_error
        return
    has_sps = h264.annexb_in_place_batch(batch, np.array(starts), np.array(ends))
    assert has_sps.tolist() == expected_sps
    assert window == reference


@settings(max_examples=60, deadline=None)
@given(
    payloads=st.lists(
        st.tuples(st.binary(max_size=60), st.binary(max_size=3000), st.binary(max_size=10)),
        min_size=1,
        max_size=40,
    ),
    singles=st.integers(min_value=0, max_value=3),
    chunk_size=st.sampled_from([1024, 4096, 1 << 20]),
    compression=st.sampled_from(["none", "zstd"]),
    background=st.booleans(),
)
def test_batched_messages_are_the_single_messages_bytes(
    payloads: list[tuple[bytes, bytes, bytes]],
    singles: int,
    chunk_size: int,
    compression: str,
    background: bool,
) -> None:
    def new_writer(stream: io.BytesIO) -> McapEpisodeWriter:
        writer = McapEpisodeWriter(
            stream, compression=compression, chunk_size=chunk_size, background=background
        )
        for channel in (1, 2, 3):
            writer.register_channel(channel, f"topic/{channel}", "json")
        return writer

    count = len(payloads)
    channels = np.arange(count) % 3 + 1
    times = 1_700_000_000_000_000_000 + 1000 * np.arange(count) // 2
    one_by_one, batched = io.BytesIO(), io.BytesIO()
    writer = new_writer(one_by_one)
    for i, (head, data, tail) in enumerate(payloads):
        t = int(times[i])
        writer.add_message(int(channels[i]), i, t, t, head + data + tail)
    writer.finish()
    writer = new_writer(batched)
    # a few messages one by one first (the metadata of an episode), then the rest in batches
    for i in range(min(singles, count)):
        t = int(times[i])
        writer.add_message(int(channels[i]), i, t, t, b"".join(payloads[i]))
    first = min(singles, count)
    while first < count:
        last = min(count, first + 7)
        part = payloads[first:last]
        fill = PayloadFill(
            channels[first:last],
            np.arange(first, last),
            times[first:last],
            wire.Ragged.of([h for h, _, _ in part]),
            [d for _, d, _ in part],
            wire.Ragged.of([t for _, _, t in part]),
        )
        writer.add_records(channels[first:last], times[first:last], fill)
        first = last
    writer.finish()
    assert batched.getvalue() == one_by_one.getvalue()
    reader = make_reader(io.BytesIO(batched.getvalue()), validate_crcs=True)
    read = [(c.id, m.sequence, m.log_time, m.data) for _, c, m in reader.iter_messages()]
    assert read == [
        (int(channels[i]), i, int(times[i]), b"".join(p)) for i, p in enumerate(payloads)
    ]


@pytest.mark.kernel_independent
def test_message_index_bytes_read_back_by_the_library() -> None:
    pairs = [(0, 0), (5, 31), (2**63 - 1, 2**40)]
    for channel_id, entries in ((7, pairs), (3, [])):
        data = message_index(channel_id, np.array(entries, np.uint64).reshape(-1, 2))
        framed = io.BytesIO(spec.MAGIC + data + spec.footer(0, 0, 0) + spec.MAGIC)
        records = list(StreamReader(framed, skip_magic=False).records)
        assert records[0] == MessageIndex(channel_id=channel_id, records=entries)


def _write_one_by_one(path: Path, content: EpisodeContent, cameras: dict[str, CarriedVideo],
                      chunk_size: int) -> None:  # fmt: skip
    """The episode as the profile describes it, a message at a time from the one-frame
    encoders: metadata, quality logs, then per frame its columns and every camera's frame."""
    start = foxglove.started_at_ns(content.metadata) or 0
    times = frame_times(content.table, start, content.fps).tolist()
    columns, _ = json_columns(content.table, content.features, ())
    info = {**content.metadata, "fps": content.fps}
    with episode_file(
        path, chunk_size=chunk_size, profile=foxglove.PROFILE, library=foxglove.LIBRARY
    ) as writer:
        # schema and channel ids in registration order, as the profile's writer hands them out
        schema = foxglove.object_schema("eva.episode", info)
        writer.register_schema(1, "eva.episode", "jsonschema", schema)
        writer.register_channel(1, foxglove.METADATA_TOPIC, "json", 1)
        name, data = foxglove.protobuf_schema(Log)
        writer.register_schema(2, name, "protobuf", data)
        writer.register_channel(2, foxglove.QUALITY_TOPIC, "protobuf", 2)
        name, data = foxglove.protobuf_schema(CompressedVideo)
        writer.register_schema(3, name, "protobuf", data)
        for channel, key in enumerate(cameras, start=3):
            writer.register_channel(channel, foxglove.image_topic(key), "protobuf", 3)
        column_ids = []
        for schema_id, (topic, series) in enumerate(columns.items(), start=4):
            channel = schema_id + len(cameras) - 1
            schema = foxglove.object_schema(series.title, series.first)
            writer.register_schema(schema_id, series.title, "jsonschema", schema)
            writer.register_channel(channel, topic, "json", schema_id)
            column_ids.append((channel, series.payloads.to_list()))
        writer.add_message(1, 0, start, start, foxglove.json_payload(info))
        for i, log in enumerate(
            foxglove.quality_logs(content.metadata, start, rejected=content.rejected)
        ):
            writer.add_message(2, i, start, start, log)
        units = {k: h264.access_units(v.path, v.samples, "test") for k, v in cameras.items()}
        for i, t in enumerate(times):
            for channel_id, payloads in column_ids:
                writer.add_message(channel_id, i, t, t, payloads[i])
            for c, key in enumerate(cameras):
                parts = foxglove.compressed_video_parts(t, key, next(units[key]))
                writer.add_message_parts(3 + c, i, t, t, parts)


@pytest.mark.parametrize("chunk_size", [4096, 64 * 1024, 4 << 20])
def test_an_episode_in_batches_is_the_episode_message_by_message(
    tmp_path: Path, chunk_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = write_synthetic_dataset(tmp_path / "raw", episodes=1, frames=45, cameras=2, width=96,
                                  height=64, action_dim=5)  # fmt: skip
    reader = DatasetReader(raw)
    cameras = {
        key: CarriedVideo(reader.video_path(0, key), read_video_samples(reader.video_path(0, key)))
        for key in reader.video_keys
    }
    content = EpisodeContent(reader.read_table(0), reader.episode(0), reader.fps, reader.features)
    # windows of a few frames, so that an episode takes several batches
    monkeypatch.setattr(h264, "WINDOW", 8 * 1024)
    monkeypatch.setattr(h264, "spare_windows", SpareBuffers())  # none of an earlier test's
    write_foxglove_episode(tmp_path / "batched.mcap", content, cameras, chunk_size=chunk_size)
    _write_one_by_one(tmp_path / "single.mcap", content, cameras, chunk_size)
    assert (tmp_path / "batched.mcap").read_bytes() == (tmp_path / "single.mcap").read_bytes()


def test_the_float_repr_kernel_writes_pythons_repr() -> None:
    """The native kernel against ``repr`` on random bit patterns (every exponent, subnormals),
    float32 readings widened to doubles, and the layout's edges (under EVA_PUREPYTHON=1 both
    sides are the reference)."""
    rng = np.random.default_rng(16)
    edges = [0.0, -0.0, 1.0, 1e16, 1e15, 9999999999999998.0, 1e-4, 1e-5, 0.00012345, 5e-324,
             1.7976931348623157e308, 0.1, 2.5e-05, 1e22, 100.0, 123456789012345678.0, -1e-7,
             float(np.float32(0.1)), float("inf"), float("-inf"), float("nan")]  # fmt: skip
    values = np.concatenate(
        [
            np.array(edges),
            rng.integers(0, 2**64, 200_000, dtype=np.uint64).view(np.float64),
            rng.standard_normal(50_000).astype(np.float32).astype(np.float64),
            rng.integers(-(10**6), 10**6, 10_000).astype(np.float64),
        ]
    )
    written = json_rows.float_reprs(values).to_list()
    assert written == [repr(v).encode() for v in values.tolist()]
