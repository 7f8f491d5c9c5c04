"""Checking one episode file of the ``foxglove`` MCAP profile (``eva.formats.mcap.foxglove``):
header, channels and schemas, message counts, sequences and log times, then a real read with the
official ``mcap`` reader and protobuf decoder: the first state and action, and the first frame of
every camera (CompressedVideo decoded with PyAV, RawImage as stored)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
from mcap.reader import McapReader, make_reader
from mcap.records import Channel, Schema

from eva.dataset import embedded
from eva.dataset.atomic import UnreadableJSON, parse_json
from eva.dataset.errors import DatasetError, error_line
from eva.formats._verify import VECTOR_FEATURES, ProblemCollector, check_frame, check_vectors
from eva.formats.mcap import foxglove
from eva.formats.mcap.layout import IMAGE_TOPIC_PREFIX

ProtobufDecode = Callable[[bytes], Any]


def verify_foxglove_file(
    stream: IO[bytes],
    path: Path,
    ep: int,
    row: Mapping[str, Any],
    info: Mapping[str, Any],
    add: ProblemCollector,
) -> int:
    """Report the problems of episode ``ep``'s file (open as ``stream``; ``row``: its
    episodes.jsonl row) through ``add``; return its row count (0 when unreadable)."""
    features, image_keys = info.get("features", {}), embedded.image_keys(info)

    def problem(code: str, message: str) -> None:
        add(code, message, path, ep)

    reader = make_reader(stream)
    header = reader.get_header()
    if (header.profile, header.library) != (foxglove.PROFILE, foxglove.LIBRARY):
        problem(
            "mcap_header",
            f"profile/library {header.profile!r}/{header.library!r}, expected "
            f"{foxglove.PROFILE!r}/{foxglove.LIBRARY!r}",
        )
    summary = reader.get_summary()
    if summary is None or summary.statistics is None:
        problem("unreadable_mcap", "MCAP file has no summary section")
        return 0
    channels = {ch.topic: ch for ch in summary.channels.values()}
    counts = summary.statistics.channel_message_counts

    def count(topic: str) -> int:
        return int(counts.get(channels[topic].id, 0)) if topic in channels else 0

    def schema_of(topic: str) -> Schema | None:
        schema: Schema | None = summary.schemas.get(channels[topic].schema_id)
        return schema

    for topic in (foxglove.METADATA_TOPIC, foxglove.QUALITY_TOPIC, foxglove.FRAME_TOPIC):
        if topic not in channels:
            problem("missing_topic", f"no {topic!r} channel")
            return 0
    if count(foxglove.METADATA_TOPIC) != 1:
        problem(
            "episode_messages", f"{count(foxglove.METADATA_TOPIC)} metadata messages, expected 1"
        )
    rows = count(foxglove.FRAME_TOPIC)
    if rows != row.get("length"):
        problem("length_mismatch", f"{rows} rows but length {row.get('length')}")
    cameras = [t[len(IMAGE_TOPIC_PREFIX) :] for t in channels if t.startswith(IMAGE_TOPIC_PREFIX)]
    if set(cameras) != set(image_keys):
        problem("image_topics", f"cameras {sorted(cameras)} but info.json has {sorted(image_keys)}")
    per_frame = [t for t in channels if t not in (foxglove.METADATA_TOPIC, foxglove.QUALITY_TOPIC)]
    for topic in per_frame:
        schema = schema_of(topic)
        expected = (
            (foxglove.PROTOBUF_ENCODING, (foxglove.VIDEO_SCHEMA, foxglove.RAW_IMAGE_SCHEMA))
            if topic.startswith(IMAGE_TOPIC_PREFIX)
            else (foxglove.JSON_ENCODING, (schema.name if schema else "",))
        )
        if channels[topic].message_encoding != expected[0] or schema is None:
            problem("message_encoding", f"{topic}: {channels[topic].message_encoding!r}")
        elif schema.name not in expected[1]:
            problem("schema", f"{topic}: schema {schema.name!r}")
        if count(topic) != rows:
            problem("frame_count", f"{topic}: {count(topic)} messages but {rows} rows")
    _check_order(reader, per_frame, rows, foxglove.started_at_ns(row), problem)
    _read_back(reader, channels, summary.schemas, features, rows, add, path, ep)
    return rows


def _check_order(
    reader: McapReader,
    topics: list[str],
    rows: int,
    start_ns: int | None,
    problem: Callable[[str, str], None],
) -> None:
    """Per topic: sequences 0..rows-1 in file order; every message of frame i at one log time
    (= publish time), frame 0 at ``started_at`` when the row has one, times increasing."""
    times: dict[int, int] = {}
    next_sequence: dict[str, int] = {}
    for _, channel, message in reader.iter_messages(topics=topics, log_time_order=False):
        seq = message.sequence
        if seq != next_sequence.get(channel.topic, 0):
            problem("sequences", f"{channel.topic}: message {seq} out of frame order")
            return
        next_sequence[channel.topic] = seq + 1
        expected = times.setdefault(seq, message.log_time)
        if message.log_time != expected or message.publish_time != expected:
            at = f"{channel.topic} at {message.log_time} ns"
            problem("timestamps", f"frame {seq}: {at}, other topics at {expected} ns")
            return
    ordered = [times[i] for i in range(rows) if i in times]
    if len(ordered) == rows and any(b <= a for a, b in zip(ordered, ordered[1:], strict=False)):
        problem("timestamps", "frame times do not increase")
    elif ordered and start_ns is not None and ordered[0] != start_ns:
        problem("timestamps", f"frame 0 at {ordered[0]} ns, started_at is {start_ns} ns")


def _read_back(
    reader: McapReader,
    channels: Mapping[str, Channel],
    schemas: Mapping[int, Schema],
    features: Mapping[str, Any],
    rows: int,
    add: ProblemCollector,
    path: Path,
    ep: int,
) -> None:
    """The first state and action (from their JSON messages) and every camera's first frame."""
    from mcap_protobuf.decoder import DecoderFactory

    first_values: dict[str, np.ndarray | None] = {}
    unreadable: set[str] = set()
    for name in VECTOR_FEATURES:
        topic = foxglove.column_topic(name)
        if name not in features or topic not in channels:
            continue
        for _, _, message in reader.iter_messages(topics=[topic]):
            try:  # a hostile file's message: any JSON (or none), 5000 digits, deep nesting
                values = parse_json(message.data, path).values()
                first_values[name] = np.asarray(list(values), np.float32)
            except (DatasetError, AttributeError, TypeError, ValueError, OverflowError) as e:
                why = e.reason if isinstance(e, UnreadableJSON) else error_line(e)
                message_problem = f"{topic}: first message is not an object of numbers ({why})"
                add("bad_value", message_problem, path, ep)
                unreadable.add(name)
            break
    checked = {k: v for k, v in features.items() if k not in unreadable}
    check_vectors(add, checked, first_values, path, ep)
    if not rows:
        return
    decoders = DecoderFactory()
    for topic, channel in channels.items():
        if not topic.startswith(IMAGE_TOPIC_PREFIX):
            continue
        key = topic[len(IMAGE_TOPIC_PREFIX) :]
        schema = schemas.get(channel.schema_id)
        decode = decoders.decoder_for(channel.message_encoding, schema)
        if decode is None or schema is None:
            add("bad_frame", f"camera {key!r}: no protobuf decoder for its schema", path, ep)
            continue
        try:
            frame = _first_frame(reader, topic, schema.name, decode)
        except Exception as e:  # noqa: BLE001 - a frame that does not decode is the finding
            add("bad_frame", f"camera {key!r}: frame 0 does not decode ({e})", path, ep)
            continue
        shape = tuple(features.get(key, {}).get("shape", frame.shape if frame is not None else ()))
        check_frame(add, key, frame, shape, path, ep)


def _first_frame(
    reader: McapReader, topic: str, schema_name: str, decode: ProtobufDecode
) -> np.ndarray | None:
    """Frame 0 of one camera (None: it holds no picture): RawImage as stored; CompressedVideo's
    first unit alone through PyAV's H.264 decoder (a keyframe with its SPS/PPS, as Foxglove
    needs it, decodes by itself)."""
    import av

    for _, _, message in reader.iter_messages(topics=[topic]):
        value = decode(message.data)
        if schema_name != foxglove.VIDEO_SCHEMA:
            pixels = np.frombuffer(value.data, np.uint8)
            rows = pixels[: value.step * value.height].reshape(value.height, value.step)
            return rows[:, : value.width * 3].reshape(value.height, value.width, 3)
        codec = cast(av.VideoCodecContext, av.CodecContext.create(foxglove.VIDEO_FORMAT, "r"))
        pictures = [*codec.decode(av.Packet(value.data)), *codec.decode(None)]
        return pictures[0].to_ndarray(format="rgb24") if pictures else None
    return None
