"""MCAP export: one ``.mcap`` per episode with EVA MessagePack messages and embedded images.

Description "MCAP: EVA messages and embedded images". The package, one module per concern:

- ``layout``: paths, topics, the episode schema and the frame timestamps (the file layout);
- ``writer``: ``McapEpisodeWriter``, the chunked MCAP file writer;
- ``export``: ``write_subset`` / ``write_episode_file``, the cameras decoded in lockstep;
  its options are ``McapOptions`` (``eva.formats.options``: compression, chunk size, batch size);
- ``reader``: ``read_episode`` -> ``McapEpisode``, streaming reads through the official reader;
- ``verify``: ``verify``, the export's checks with the official ``mcap`` reader as the oracle.

The ``foxglove`` profile (``McapOptions(profile="foxglove")``, docs/formats.md) needs the
``foxglove`` extra, so its modules are imported only when used, and not re-exported here:
``foxglove`` (its layout: topics, schemas, protobuf payloads, times), ``h264`` (an MP4's samples
as Annex B access units), ``foxglove_export`` (``write_foxglove_episode``, the subset writer) and
``foxglove_verify``.
"""

from __future__ import annotations

from eva.formats.mcap.export import (
    TASKS,
    CameraFeed,
    McapEpisodeSession,
    camera_batches,
    episode_payload,
    write_episode_file,
    write_subset,
)
from eva.formats.mcap.layout import (
    DATA_PATH,
    EPISODE_SCHEMA_DATA,
    EPISODE_SCHEMA_ENCODING,
    EPISODE_SCHEMA_NAME,
    EPISODE_TOPIC,
    FORMAT,
    IMAGE_TOPIC_PREFIX,
    LIBRARY,
    MESSAGE_ENCODING,
    PROFILE,
    episode_path,
    export_info,
    frame_period_ns,
    frame_time_ns,
    image_topic,
)
from eva.formats.mcap.reader import McapEpisode, read_episode
from eva.formats.mcap.verify import verify
from eva.formats.mcap.writer import (
    COMPRESSIONS,
    DEFAULT_CHUNK_SIZE,
    DEFAULT_COMPRESSION,
    MIN_CHUNK_SIZE,
    ZSTD_LEVEL,
    McapEpisodeWriter,
)
from eva.formats.options import McapOptions

__all__ = [
    "TASKS",
    "COMPRESSIONS",
    "DATA_PATH",
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_COMPRESSION",
    "EPISODE_SCHEMA_DATA",
    "EPISODE_SCHEMA_ENCODING",
    "EPISODE_SCHEMA_NAME",
    "EPISODE_TOPIC",
    "FORMAT",
    "IMAGE_TOPIC_PREFIX",
    "LIBRARY",
    "MESSAGE_ENCODING",
    "MIN_CHUNK_SIZE",
    "PROFILE",
    "ZSTD_LEVEL",
    "CameraFeed",
    "McapEpisode",
    "McapEpisodeSession",
    "McapEpisodeWriter",
    "McapOptions",
    "camera_batches",
    "episode_path",
    "episode_payload",
    "export_info",
    "frame_period_ns",
    "frame_time_ns",
    "image_topic",
    "read_episode",
    "verify",
    "write_episode_file",
    "write_subset",
]
