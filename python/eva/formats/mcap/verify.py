"""Checking an MCAP export: the embedded-images checks every such format shares, then each
episode file's header, channels, schema, message counts, frame order and timestamps, and a real
read of one state, one action and one image with the official ``mcap`` reader. info.json's
``mcap_profile`` says which profile's layout to check (the foxglove one:
``eva.formats.mcap.foxglove_verify``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from eva.dataset import embedded
from eva.dataset.errors import DatasetError
from eva.dataset.validate import Problem
from eva.formats._verify import VECTOR_FEATURES, ProblemCollector, check_frame, check_vectors
from eva.formats.mcap.layout import (
    EPISODE_SCHEMA_ENCODING,
    EPISODE_SCHEMA_NAME,
    EPISODE_TOPIC,
    FOXGLOVE_PROFILE,
    INFO_PROFILE_KEY,
    LIBRARY,
    MESSAGE_ENCODING,
    PROFILE,
    episode_path,
    frame_time_ns,
    image_topic,
    info_profile,
)
from eva.formats.mcap.reader import McapEpisode, read_episode
from eva.formats.options import FOXGLOVE_EXTRA_MISSING, McapOptions, missing_foxglove_modules


def verify(export_dir: Path) -> list[Problem]:
    """Totals and the message layout of every episode file, plus a real read of one state, one
    action and one image per episode with the official ``mcap`` reader."""
    add = ProblemCollector()

    def verify_file(path: Path, ep: int, row: Mapping[str, Any], info: Mapping[str, Any]) -> int:
        features, image_keys = info.get("features", {}), embedded.image_keys(info)
        profile = info_profile(info)
        if profile not in McapOptions.PROFILES:
            add(
                "mcap_profile",
                f"info.json {INFO_PROFILE_KEY} {profile!r} is not a profile",
                path,
                ep,
            )
            return 0
        try:
            if profile == FOXGLOVE_PROFILE:
                return _verify_foxglove(path, ep, row, info, add)
            with read_episode(path) as episode:
                return _verify_episode(episode, ep, row, features, image_keys, add)
        except DatasetError as e:
            add("unreadable_mcap", str(e).replace(f"{path}: ", ""), path, ep)
        except Exception as e:  # noqa: BLE001 - any reader failure is a verification problem
            add("unreadable_mcap", f"{type(e).__name__}: {e}", path, ep)
        return 0

    embedded.verify_export_files(
        Path(export_dir),
        episode_file=episode_path,
        verify_file=verify_file,
        problem=add,
        missing_code="missing_mcap",
    )
    return add.problems


def _verify_foxglove(
    path: Path, ep: int, row: Mapping[str, Any], info: Mapping[str, Any], add: ProblemCollector
) -> int:
    if missing_foxglove_modules():
        add(
            "foxglove_extra",
            f"cannot check the foxglove profile: {FOXGLOVE_EXTRA_MISSING}",
            path,
            ep,
        )
        return int(row.get("length", 0) or 0)
    from eva.formats.mcap.foxglove_verify import verify_foxglove_file

    try:
        stream = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError as e:
        raise DatasetError(f"{path}: cannot open ({e.strerror})") from None
    with stream:
        return verify_foxglove_file(stream, path, ep, row, info, add)


Report = Callable[[str, str], None]  # (code, message) of a problem in one episode file


def _verify_episode(
    episode: McapEpisode,
    ep: int,
    row: Mapping[str, Any],
    features: Mapping[str, Any],
    image_keys: Sequence[str],
    add: ProblemCollector,
) -> int:
    def problem(code: str, message: str) -> None:
        add(code, message, episode.path, ep)

    if not _check_layout(episode, problem):
        return 0
    rows = len(episode)
    if rows != row.get("length"):
        problem("length_mismatch", f"{rows} rows but length {row.get('length')}")
    if set(episode.video_keys) != set(image_keys):
        problem(
            "image_topics",
            f"cameras {sorted(episode.video_keys)} but info.json has {sorted(image_keys)}",
        )
    for key in episode.video_keys:
        n = episode.message_count(image_topic(key))
        if n != rows:
            problem("frame_count", f"camera {key!r}: {n} image messages but {rows} rows")
    if episode.video_keys and not _check_frame_order(episode, rows, problem):
        return rows
    _read_first_values(episode, ep, rows, features, add, problem)
    return rows


def _check_layout(episode: McapEpisode, problem: Report) -> bool:
    """The header, the episode channel and its schema, the message encodings, and the one
    episode message; False when the episode cannot be read on (no such channel or message)."""
    if episode.header.profile != PROFILE or episode.header.library != LIBRARY:
        problem(
            "mcap_header",
            f"profile/library {episode.header.profile!r}/{episode.header.library!r}, "
            f"expected {PROFILE!r}",
        )
    channels = {ch.topic: ch for ch in episode.summary.channels.values()}
    if EPISODE_TOPIC not in channels:
        problem("episode_topic", f"no {EPISODE_TOPIC!r} channel")
        return False
    schema = episode.summary.schemas.get(channels[EPISODE_TOPIC].schema_id)
    if schema is None or (schema.name, schema.encoding) != (
        EPISODE_SCHEMA_NAME,
        EPISODE_SCHEMA_ENCODING,
    ):
        problem("episode_schema", f"episode channel schema is not {EPISODE_SCHEMA_NAME}")
    for topic, channel in channels.items():
        if channel.message_encoding != MESSAGE_ENCODING:
            problem("message_encoding", f"{topic}: {channel.message_encoding!r}")
    count = episode.message_count(EPISODE_TOPIC)
    if count != 1:
        problem("episode_messages", f"{count} episode messages, expected 1")
        return False
    return True


def _check_frame_order(episode: McapEpisode, rows: int, problem: Report) -> bool:
    """Sequences 0..rows-1 and one shared timestamp per frame index, in one pass over the image
    messages' headers; False after a frame whose cameras disagree on its time."""
    expected_keys = len(episode.video_keys)
    topic_set = {image_topic(k) for k in episode.video_keys}
    seen: dict[int, tuple[int, int]] = {}  # sequence -> (log_time, cameras seen)
    order_ok = True
    last = -1
    for channel, message in episode.iter_messages(list(topic_set)):
        seq = message.sequence
        if seq < last:
            order_ok = False
        last = seq
        log_time, cams = seen.get(seq, (message.log_time, 0))
        if message.log_time != log_time or message.publish_time != log_time:
            problem(
                "timestamps",
                f"frame {seq}: {channel.topic} at {message.log_time} ns, other cameras at "
                f"{log_time} ns",
            )
            return False
        seen[seq] = (log_time, cams + 1)
    if not order_ok:
        problem("message_order", "image messages are not in frame order")
    if sorted(seen) != list(range(rows)):
        problem("sequences", f"image sequences are not 0..{rows - 1}")
    fps = episode.fps
    bad = [s for s, (t, c) in seen.items() if c != expected_keys or t != frame_time_ns(s, fps)]
    if bad:
        problem("timestamps", f"frame {bad[0]}: not every camera at (i+1)*round(1e9/fps) ns")
    return True


def _read_first_values(
    episode: McapEpisode,
    ep: int,
    rows: int,
    features: Mapping[str, Any],
    add: ProblemCollector,
    problem: Report,
) -> None:
    """The real read: one state value, one action value, one image frame."""
    first_values = {
        name: _first_value(episode.columns.get(name))
        for name in VECTOR_FEATURES
        if name in features
    }
    check_vectors(add, features, first_values, episode.path, ep)
    if not (episode.video_keys and rows):
        return
    key = episode.video_keys[0]
    try:
        frame = episode.frame(key, 0)
    except DatasetError as e:
        problem("bad_frame", str(e).replace(f"{episode.path}: ", ""))
        return
    shape = tuple(features.get(key, {}).get("shape", frame.shape))
    check_frame(add, key, frame, shape, episode.path, ep)
    # A message holds any ndarray; only uint8 is an image as the export writes it.
    if frame.shape == shape and frame.dtype != np.uint8:
        problem("bad_frame", f"camera {key!r}: frame 0 is {frame.dtype}, expected uint8")


def _first_value(values: Sequence[object] | np.ndarray | None) -> np.ndarray | None:
    """A column's first row as an array (None: no column, or an empty one)."""
    if values is None or len(values) == 0:
        return None
    return np.asarray(values[0], dtype=np.float32)
