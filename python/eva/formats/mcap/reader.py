"""Reading one exported episode file through the official ``mcap`` reader (the eva-client side)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
from mcap.records import Channel, Message

from eva.dataset.errors import DatasetError
from eva.dataset.msgpack_codec import decode_ndarray, unpackb
from eva.formats.mcap.layout import (
    EPISODE_TOPIC,
    FOXGLOVE_PROFILE,
    IMAGE_TOPIC_PREFIX,
    frame_time_ns,
    image_topic,
)


class McapEpisode:
    """One exported episode, read through the official ``mcap`` reader without loading it whole.

    ``episode`` (columns / images / metadata) is read on first use from the chunks that hold the
    ``episode`` channel only. ``iter_camera(key)`` streams one camera (topic filter);
    ``iter_frames()`` streams frame indices with every camera's image; ``frame(key, i)`` reads one
    image by its timestamp (only the chunks around it). Decoded frames are read-only views of the
    message payloads. Use as a context manager, or call ``close()``.
    """

    def __init__(self, path: Path | str) -> None:
        from mcap.reader import make_reader

        self.path = Path(path)
        try:
            self._stream: IO[bytes] = open(self.path, "rb")  # noqa: SIM115 - closed in close()
        except OSError as e:
            raise DatasetError(f"{self.path}: cannot open ({e.strerror})") from None
        try:
            self._reader = make_reader(self._stream)
            self.header = self._reader.get_header()
            summary = self._reader.get_summary()
        except Exception as e:  # the mcap reader raises assorted errors on damaged files
            self._stream.close()
            raise DatasetError(f"{self.path}: not a readable MCAP file ({e})") from None
        if summary is None:
            self._stream.close()
            raise DatasetError(f"{self.path}: MCAP file has no summary section")
        if self.header.profile == FOXGLOVE_PROFILE:
            self._stream.close()
            raise DatasetError(
                f"{self.path}: a foxglove-profile file (protobuf and JSON messages): read it with "
                "the mcap reader and mcap_protobuf's decoder (docs/formats.md)"
            )
        self.summary = summary
        self._episode: dict[str, Any] | None = None

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> McapEpisode:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    @property
    def topics(self) -> dict[str, int]:
        """Topic -> channel id."""
        return {ch.topic: ch.id for ch in self.summary.channels.values()}

    @property
    def video_keys(self) -> list[str]:
        return [
            ch.topic[len(IMAGE_TOPIC_PREFIX) :]
            for ch in sorted(self.summary.channels.values(), key=lambda c: c.id)
            if ch.topic.startswith(IMAGE_TOPIC_PREFIX)
        ]

    def message_count(self, topic: str) -> int:
        stats = self.summary.statistics
        channel_id = self.topics.get(topic)
        if stats is None or channel_id is None:
            return 0
        return int(stats.channel_message_counts.get(channel_id, 0))

    @property
    def num_frames(self) -> int:
        keys = self.video_keys
        return self.message_count(image_topic(keys[0])) if keys else len(self)

    def __len__(self) -> int:
        columns = self.columns
        for values in columns.values():
            return len(values)
        return 0

    @property
    def episode(self) -> dict[str, Any]:
        if self._episode is None:
            payloads = [
                message.data for _, _, message in self._reader.iter_messages(topics=[EPISODE_TOPIC])
            ]
            if len(payloads) != 1:
                raise DatasetError(
                    f"{self.path}: {len(payloads)} messages on topic {EPISODE_TOPIC!r}, expected 1"
                )
            value = unpackb(payloads[0])
            if not isinstance(value, dict) or not {"columns", "images", "metadata"} <= set(value):
                raise DatasetError(
                    f"{self.path}: episode message is not a {{columns, images, metadata}} map"
                )
            self._episode = value
        return self._episode

    def _part(self, name: str) -> dict[str, Any]:
        part: dict[str, Any] = self.episode[name]
        return part

    @property
    def columns(self) -> dict[str, Any]:
        return self._part("columns")

    @property
    def images(self) -> dict[str, Any]:
        return self._part("images")

    @property
    def metadata(self) -> dict[str, Any]:
        return self._part("metadata")

    @property
    def fps(self) -> float:
        fps: float = self.metadata["fps"]
        return fps

    def iter_messages(self, topics: Iterable[str]) -> Iterator[tuple[Channel, Message]]:
        """(channel, message) of the given topics in log-time order, payloads undecoded."""
        for _, channel, message in self._reader.iter_messages(topics=list(topics)):
            yield channel, message

    def iter_camera(self, key: str) -> Iterator[tuple[int, int, np.ndarray]]:
        """(sequence, log_time, frame) of one camera, in frame order."""
        for _, _, message in self._reader.iter_messages(topics=[image_topic(key)]):
            yield message.sequence, message.log_time, decode_ndarray(message.data)

    def iter_frames(self) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        """(frame_index, {video_key: frame}) for every frame index, cameras grouped."""
        topics = [image_topic(k) for k in self.video_keys]
        prefix = len(IMAGE_TOPIC_PREFIX)
        current: int | None = None
        group: dict[str, np.ndarray] = {}
        for _, channel, message in self._reader.iter_messages(topics=topics):
            if current is not None and message.sequence != current:
                yield current, group
                group = {}
            current = message.sequence
            group[channel.topic[prefix:]] = decode_ndarray(message.data)
        if current is not None:
            yield current, group

    def frame(self, key: str, frame_index: int) -> np.ndarray:
        """One camera image by frame index (reads only the chunks at its timestamp)."""
        t = frame_time_ns(frame_index, self.fps)
        for _, _, message in self._reader.iter_messages(
            topics=[image_topic(key)], starting_at=t, ending_before=t + 1
        ):
            if message.sequence == frame_index:
                return decode_ndarray(message.data)
        raise DatasetError(f"{self.path}: camera {key}: no frame {frame_index}")


def read_episode(path: Path | str) -> McapEpisode:
    """Open one exported ``episode_NNNNNN.mcap`` for streaming reads (see ``McapEpisode``)."""
    return McapEpisode(path)
