"""Verification of an MCAP export: totals, the message layout of every episode file, and a real
read of one state, one action and one image per episode with the official ``mcap`` reader."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from eva.dataset import embedded
from eva.dataset import layout as dataset_layout
from eva.dataset.errors import DatasetError
from eva.formats.mcap.layout import (
    EPISODE_SCHEMA_ENCODING,
    EPISODE_SCHEMA_NAME,
    EPISODE_TOPIC,
    LIBRARY,
    MESSAGE_ENCODING,
    PROFILE,
    episode_path,
    frame_time_ns,
    image_topic,
)
from eva.formats.mcap.reader import McapEpisode, read_episode

STATE = dataset_layout.STATE
ACTION = dataset_layout.ACTION


def verify(export_dir: Path) -> list[Any]:
    """Totals and the message layout of every episode file, plus a real read of one state, one
    action and one image per episode with the official ``mcap`` reader."""
    from eva.dataset.validate import Problem

    problems: list[Problem] = []

    def problem(code: str, message: str, path: Path, episode: int | None = None) -> None:
        problems.append(Problem(code=code, message=message, path=path, episode=episode))

    def verify_file(path: Path, ep: int, row: Mapping[str, Any], info: Mapping[str, Any]) -> int:
        features, image_keys = info.get("features", {}), embedded.image_keys(info)
        try:
            with read_episode(path) as episode:
                return _verify_episode(episode, ep, row, features, image_keys, problem)
        except DatasetError as e:
            problem("unreadable_mcap", str(e).replace(f"{path}: ", ""), path, ep)
        except Exception as e:  # noqa: BLE001 - any reader failure is a verification problem
            problem("unreadable_mcap", f"{type(e).__name__}: {e}", path, ep)
        return 0

    embedded.verify_export_files(
        Path(export_dir),
        episode_file=episode_path,
        verify_file=verify_file,
        problem=problem,
        missing_code="missing_mcap",
    )
    return problems


def _verify_episode(
    episode: McapEpisode,
    ep: int,
    row: Mapping[str, Any],
    features: Mapping[str, Any],
    image_keys: Sequence[str],
    problem: Any,
) -> int:
    path = episode.path
    if episode.header.profile != PROFILE or episode.header.library != LIBRARY:
        problem(
            "mcap_header",
            f"profile/library {episode.header.profile!r}/{episode.header.library!r}, "
            f"expected {PROFILE!r}",
            path,
            ep,
        )
    channels = {ch.topic: ch for ch in episode.summary.channels.values()}
    if EPISODE_TOPIC not in channels:
        problem("episode_topic", f"no {EPISODE_TOPIC!r} channel", path, ep)
        return 0
    schema = episode.summary.schemas.get(channels[EPISODE_TOPIC].schema_id)
    if schema is None or (schema.name, schema.encoding) != (
        EPISODE_SCHEMA_NAME,
        EPISODE_SCHEMA_ENCODING,
    ):
        problem("episode_schema", f"episode channel schema is not {EPISODE_SCHEMA_NAME}", path, ep)
    for topic, channel in channels.items():
        if channel.message_encoding != MESSAGE_ENCODING:
            problem("message_encoding", f"{topic}: {channel.message_encoding!r}", path, ep)
    count = episode.message_count(EPISODE_TOPIC)
    if count != 1:
        problem("episode_messages", f"{count} episode messages, expected 1", path, ep)
        return 0
    rows = len(episode)
    if rows != row.get("length"):
        problem("length_mismatch", f"{rows} rows but length {row.get('length')}", path, ep)
    if set(episode.video_keys) != set(image_keys):
        problem(
            "image_topics",
            f"cameras {sorted(episode.video_keys)} but info.json has {sorted(image_keys)}",
            path,
            ep,
        )
    for key in episode.video_keys:
        n = episode.message_count(image_topic(key))
        if n != rows:
            problem("frame_count", f"camera {key!r}: {n} image messages but {rows} rows", path, ep)
    # Sequences 0..n-1 and one shared timestamp per frame index, in one pass over the headers.
    expected_keys = len(episode.video_keys)
    fps = episode.fps
    if expected_keys:
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
                    path,
                    ep,
                )
                return rows
            seen[seq] = (log_time, cams + 1)
        if not order_ok:
            problem("message_order", "image messages are not in frame order", path, ep)
        if sorted(seen) != list(range(rows)):
            problem("sequences", f"image sequences are not 0..{rows - 1}", path, ep)
        bad = [s for s, (t, c) in seen.items() if c != expected_keys or t != frame_time_ns(s, fps)]
        if bad:
            problem(
                "timestamps",
                f"frame {bad[0]}: not every camera at (i+1)*round(1e9/fps) ns",
                path,
                ep,
            )
    # Real read: one state value, one action value, one image frame.
    for name in (STATE, ACTION):
        if name in features:
            values = episode.columns.get(name)
            if values is None or len(values) == 0:
                problem("missing_column", f"column {name!r} missing", path, ep)
                continue
            value = np.asarray(values[0], dtype=np.float32)
            if value.shape != tuple(features[name].get("shape", value.shape)):
                problem("bad_value", f"{name} has shape {value.shape}", path, ep)
    if episode.video_keys and rows:
        key = episode.video_keys[0]
        try:
            frame = episode.frame(key, 0)
        except DatasetError as e:
            problem("bad_frame", str(e).replace(f"{path}: ", ""), path, ep)
            return rows
        shape = tuple(features.get(key, {}).get("shape", frame.shape))
        if frame.shape != shape or frame.dtype != np.uint8:
            problem(
                "bad_frame",
                f"camera {key!r}: frame 0 is {frame.shape} {frame.dtype}, expected {shape} uint8",
                path,
                ep,
            )
    return rows
