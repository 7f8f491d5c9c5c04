"""The ``foxglove`` MCAP profile: topics, schemas, payloads and log times (docs/formats.md).

One ``.mcap`` per episode, at the same path as the ``eva-client`` profile's, header profile
``foxglove``, library ``eva``; every time is nanoseconds since the Unix epoch, frame *i* at the
episode's recorded ``started_at`` + the ``timestamp`` of row *i*::

    episode/metadata          json, jsonschema      one: the episodes.jsonl row + "fps"
    episode/quality           protobuf foxglove.Log the verdict, then one per quality issue
    episode/image/<key>       protobuf foxglove.CompressedVideo (the MP4's H.264, Annex B) or
                              foxglove.RawImage (rgb8, decoded) per frame, sequence i
    episode/column/<name>     json, jsonschema      per frame: {dimension name: value}
    episode/frame             json, jsonschema      per frame: {scalar column: value}

The protobuf schemas are the ``foxglove-schemas-protobuf`` package's (a FileDescriptorSet made by
``mcap-protobuf-support``, as Foxglove reads them). The two per-frame image messages are encoded
here in protobuf's wire format around their payload, so that a frame is copied once, straight
into the chunk; the tests check these bytes against the package's own serializer.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from foxglove_schemas_protobuf.CompressedVideo_pb2 import CompressedVideo
from foxglove_schemas_protobuf.Log_pb2 import Log
from foxglove_schemas_protobuf.RawImage_pb2 import RawImage
from google.protobuf.message import Message as ProtobufMessage
from google.protobuf.timestamp_pb2 import Timestamp
from mcap.well_known import MessageEncoding, SchemaEncoding
from mcap_protobuf.schema import build_file_descriptor_set

from eva.formats.mcap import wire
from eva.formats.mcap.layout import FOXGLOVE_PROFILE, IMAGE_TOPIC_PREFIX
from eva.formats.mcap.records import Bytes

PROFILE = FOXGLOVE_PROFILE
LIBRARY = "eva"
METADATA_TOPIC = "episode/metadata"
QUALITY_TOPIC = "episode/quality"
COLUMN_TOPIC_PREFIX = "episode/column/"
FRAME_TOPIC = "episode/frame"
JSON_ENCODING = MessageEncoding.JSON
JSON_SCHEMA_ENCODING = SchemaEncoding.JSONSchema
PROTOBUF_ENCODING = MessageEncoding.Protobuf
PROTOBUF_SCHEMA_ENCODING = SchemaEncoding.Protobuf
VIDEO_SCHEMA = CompressedVideo.DESCRIPTOR.full_name  # "foxglove.CompressedVideo"
RAW_IMAGE_SCHEMA = RawImage.DESCRIPTOR.full_name
RAW_IMAGE_ENCODING = "rgb8"
VIDEO_FORMAT = "h264"
LOG_NAME = "eva.quality"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def image_topic(video_key: str) -> str:
    return IMAGE_TOPIC_PREFIX + video_key


def column_topic(column: str) -> str:
    return COLUMN_TOPIC_PREFIX + column


@functools.cache
def protobuf_schema(message_class: type[ProtobufMessage]) -> tuple[str, bytes]:
    """(schema name, FileDescriptorSet bytes) of a Foxglove message type (built once per
    process: every episode file carries the same)."""
    descriptors = build_file_descriptor_set(message_class)
    return message_class.DESCRIPTOR.full_name, descriptors.SerializeToString()


# --- times -------------------------------------------------------------------------------------


def started_at_ns(row: Mapping[str, Any]) -> int | None:
    """The episode's ``started_at`` (ISO 8601; UTC when it names no zone) in ns since the
    epoch; None when the row has none or it does not parse."""
    text = row.get("started_at")
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return ((moment - _EPOCH) // timedelta(microseconds=1)) * 1000


def frame_times_ns(start_ns: int, timestamps: np.ndarray) -> np.ndarray:
    """int64 log time of each frame: ``start_ns`` + the row's ``timestamp`` (seconds)."""
    offsets = np.round(np.asarray(timestamps, np.float64) * 1e9).astype(np.int64)
    return start_ns + offsets


# --- protobuf wire format of the per-frame messages ---------------------------------------------


def _varint(value: int) -> bytes:
    if value < 0x80:
        return _SMALL_VARINTS[value]
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL_VARINTS = [bytes((i,)) for i in range(0x80)]


@functools.cache
def _tag(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


@functools.cache
def _string_field(number: int, text: str) -> bytes:
    """A string field (the per-camera constants: frame id, format, encoding), encoded once."""
    return _bytes_field(number, text.encode())


def _varint_field(number: int, value: int) -> bytes:
    return _tag(number, 0) + _varint(value) if value else b""  # proto3 omits zero


def _fixed32_field(number: int, value: int) -> bytes:
    return _tag(number, 5) + value.to_bytes(4, "little") if value else b""


def _bytes_field(number: int, data: bytes) -> bytes:
    return _tag(number, 2) + _varint(len(data)) + data if data else b""


@functools.lru_cache(maxsize=64)
def _seconds_field(seconds: int) -> bytes:
    return _varint_field(Timestamp.SECONDS_FIELD_NUMBER, seconds)


def _timestamp_field(number: int, time_ns: int) -> bytes:
    seconds, nanos = divmod(time_ns, 1_000_000_000)
    body = _seconds_field(seconds) + _varint_field(Timestamp.NANOS_FIELD_NUMBER, nanos)
    return _bytes_field(number, body) if body else _tag(number, 2) + b"\x00"


def _message_parts(
    fields: dict[int, bytes], data_number: int, data: Sequence[Bytes]
) -> list[Bytes]:
    """A message's wire bytes as parts: the encoded ``fields`` and the length-delimited field
    ``data_number`` holding ``data``'s parts (uncopied), all in field-number order (as
    protobuf's serializer writes them)."""
    size = sum(len(part) for part in data)
    parts: list[Bytes] = []
    head = bytearray()
    for number in sorted([*fields, data_number]):
        if number != data_number:
            head += fields[number]
            continue
        head += _tag(number, 2) + _varint(size)
        parts += [bytes(head), *data]
        head = bytearray()
    if head:
        parts.append(bytes(head))
    return parts


def compressed_video_parts(time_ns: int, frame_id: str, unit: Sequence[Bytes]) -> list[Bytes]:
    """The ``foxglove.CompressedVideo`` of one access unit (its parts), as payload parts."""
    fields = {
        CompressedVideo.TIMESTAMP_FIELD_NUMBER: _timestamp_field(
            CompressedVideo.TIMESTAMP_FIELD_NUMBER, time_ns
        ),
        CompressedVideo.FRAME_ID_FIELD_NUMBER: _string_field(
            CompressedVideo.FRAME_ID_FIELD_NUMBER, frame_id
        ),
        CompressedVideo.FORMAT_FIELD_NUMBER: _string_field(
            CompressedVideo.FORMAT_FIELD_NUMBER, VIDEO_FORMAT
        ),
    }
    return _message_parts(fields, CompressedVideo.DATA_FIELD_NUMBER, unit)


def compressed_video_heads(
    times_ns: np.ndarray,
    frame_id: str,
    data_sizes: np.ndarray,
    prefix: bytes = b"",
    prefixed: np.ndarray | None = None,
) -> wire.Ragged:
    """What comes before each frame's data in its ``foxglove.CompressedVideo``, for a batch of
    frames at once (``compressed_video_parts`` of one frame, with numpy): frame *i*'s message is
    its head, then its ``data_sizes[i]`` bytes of access unit, then ``COMPRESSED_VIDEO_TAIL``.
    The data field of a frame flagged in ``prefixed`` starts with ``prefix`` (in its head)."""
    rows = len(times_ns)
    has_prefix = np.zeros(rows, bool) if prefixed is None else np.asarray(prefixed, bool)
    seconds, nanos = np.divmod(np.asarray(times_ns, np.int64), 1_000_000_000)
    seconds_field = _varint_field_of(_tag(Timestamp.SECONDS_FIELD_NUMBER, 0), seconds)
    nanos_field = _varint_field_of(_tag(Timestamp.NANOS_FIELD_NUMBER, 0), nanos)
    stamp_size = seconds_field.lengths + nanos_field.lengths  # at most 17: a one-byte length
    stamp_head = np.empty((rows, 2), np.uint8)
    stamp_head[:, 0] = _tag(CompressedVideo.TIMESTAMP_FIELD_NUMBER, 2)[0]
    stamp_head[:, 1] = stamp_size
    data_size = np.asarray(data_sizes, np.int64) + np.where(has_prefix, len(prefix), 0)
    has_data = data_size > 0  # proto3 leaves an empty bytes field out
    frame_id_bytes = frame_id_field(frame_id)
    data_tag = _tag(CompressedVideo.DATA_FIELD_NUMBER, 2)
    pieces = [wire.Padded(stamp_head, np.full(rows, 2, np.int64)), seconds_field, nanos_field]
    if has_data.all():  # every recorded frame: the frame id and the data's key in one piece
        pieces.append(_varint_field_of(frame_id_bytes + data_tag, data_size, has_data))
    else:
        pieces += [
            wire.Padded.constant(frame_id_bytes, rows),
            _varint_field_of(data_tag, data_size, has_data),
        ]
    if has_prefix.any():
        pieces.append(wire.Padded.constant(prefix, rows, has_prefix))
    return wire.concat(pieces)


def _varint_field_of(
    key: bytes, values: np.ndarray, present: np.ndarray | None = None
) -> wire.Padded:
    """``key`` (a field's tag, after any constant bytes) and the varint of each value, left
    out where not ``present`` (by default: where the value is 0, as proto3 leaves it out)."""
    if present is None:
        present = values != 0
    value = wire.varints(values)
    head = np.broadcast_to(np.frombuffer(key, np.uint8), (len(values), len(key)))
    matrix = np.hstack([head, value.matrix])
    return wire.Padded(matrix, np.where(present, len(key) + value.lengths, 0))


def frame_id_field(frame_id: str) -> bytes:
    """The encoded ``frame_id`` field of a camera's ``CompressedVideo`` (empty for "")."""
    return _string_field(CompressedVideo.FRAME_ID_FIELD_NUMBER, frame_id)


# The fields after the data in every frame's CompressedVideo: its format.
COMPRESSED_VIDEO_TAIL = _string_field(CompressedVideo.FORMAT_FIELD_NUMBER, VIDEO_FORMAT)


def raw_image_parts(time_ns: int, frame_id: str, frame: np.ndarray) -> list[Bytes]:
    """The ``foxglove.RawImage`` (rgb8) of one (h, w, 3) uint8 frame, as payload parts."""
    height, width = int(frame.shape[0]), int(frame.shape[1])
    pixels = np.ascontiguousarray(frame).data.cast("B")
    fields = {
        RawImage.TIMESTAMP_FIELD_NUMBER: _timestamp_field(RawImage.TIMESTAMP_FIELD_NUMBER, time_ns),
        RawImage.FRAME_ID_FIELD_NUMBER: _string_field(RawImage.FRAME_ID_FIELD_NUMBER, frame_id),
        # width, height and step are fixed32 in Foxglove's schema
        RawImage.WIDTH_FIELD_NUMBER: _fixed32_field(RawImage.WIDTH_FIELD_NUMBER, width),
        RawImage.HEIGHT_FIELD_NUMBER: _fixed32_field(RawImage.HEIGHT_FIELD_NUMBER, height),
        RawImage.ENCODING_FIELD_NUMBER: _string_field(
            RawImage.ENCODING_FIELD_NUMBER, RAW_IMAGE_ENCODING
        ),
        RawImage.STEP_FIELD_NUMBER: _fixed32_field(RawImage.STEP_FIELD_NUMBER, width * 3),
    }
    return _message_parts(fields, RawImage.DATA_FIELD_NUMBER, [pixels])


# --- the quality log ---------------------------------------------------------------------------


def quality_logs(row: Mapping[str, Any], time_ns: int, *, rejected: bool) -> list[bytes]:
    """``foxglove.Log`` payloads: the verdict (the recorder's quality and the operator's
    review), then one per quality issue; WARNING when the episode is ``rejected`` (its subset,
    which the export's split decided: this module applies no accept/reject rule of its own)."""
    quality = str(row.get("quality", "green"))
    verdict = row.get("qc_verdict")
    note = row.get("qc_note")
    issues = [i for i in row.get("quality_issues") or [] if isinstance(i, Mapping)]
    text = f"quality {quality}, {len(issues)} issue{'s' if len(issues) != 1 else ''}"
    if verdict is not None:
        text += f"; qc_verdict {verdict}"
    if note:
        text += f": {note}"
    level = Log.WARNING if rejected else Log.INFO
    seconds, nanos = divmod(time_ns, 1_000_000_000)
    stamp = Timestamp(seconds=seconds, nanos=nanos)
    logs = [Log(timestamp=stamp, level=level, message=text, name=LOG_NAME)]
    for issue in issues:
        message = f"{issue.get('code', '?')}: {issue.get('detail', '')}".rstrip(": ")
        logs.append(Log(timestamp=stamp, level=Log.WARNING, message=message, name=LOG_NAME))
    return [log.SerializeToString() for log in logs]


# --- JSON messages -----------------------------------------------------------------------------


def _json_type(value: object) -> str:
    if isinstance(value, bool | np.bool_):
        return "boolean"
    if isinstance(value, int | np.integer):
        return "integer"
    if isinstance(value, float | np.floating):
        return "number"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    return "array" if isinstance(value, list | tuple) else "object"


def object_schema(title: str, example: Mapping[str, object]) -> bytes:
    """A JSON schema of an object with ``example``'s keys, typed as ``example``'s values."""
    schema = {
        "title": title,
        "type": "object",
        "properties": {key: {"type": _json_type(value)} for key, value in example.items()},
    }
    return json.dumps(schema).encode()


def json_payload(value: Mapping[str, object]) -> bytes:
    """JSON bytes; NaN and infinity (JSON has neither) become null."""
    try:
        return json.dumps(value, allow_nan=False).encode()
    except ValueError:
        clean = {
            k: None if isinstance(v, float) and not math.isfinite(v) else v
            for k, v in value.items()
        }
        return json.dumps(clean, allow_nan=False).encode()


def dimension_names(feature: Mapping[str, Any] | None, name: str, dims: int) -> list[str]:
    """One series name per dimension: info.json's ``names`` (a list, or a mapping holding one
    list, as LeRobot writes either) when they are ``dims`` distinct strings, else
    ``<name>_<i>``."""
    names = feature.get("names") if feature else None
    if isinstance(names, Mapping) and len(names) == 1:
        names = next(iter(names.values()))
    if (
        isinstance(names, list)
        and len(names) == dims
        and all(isinstance(n, str) and n for n in names)
        and len(set(names)) == dims
    ):
        return list(names)
    return [f"{name}_{i}" for i in range(dims)]
