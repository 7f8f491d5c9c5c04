"""The eva MCAP layout: file paths, topics, the episode schema and the frame timestamps.

One ``.mcap`` per episode at ``data/chunk-XXX/episode_NNNNNN.mcap``::

    header            profile = library = "eva-client"
    schema 1          "eva_client.episode", encoding "jsonschema", data {"type": "object"}
    channel 1         "episode" (schema 1, messagepack): ONE message, log/publish time 0,
                      {"columns": {name: ndarray}, "images": {key: inline values},
                       "metadata": {...episodes.jsonl row, "fps"}}
    channel 2..       "episode/image/<video_key>" (schema 0, messagepack): frame i of every
                      camera, cameras in order, sequence i, log = publish = (i+1)*round(1e9/fps)

Image channels use schema id 0 ("no schema", which the MCAP spec allows): only the ``episode``
channel has a registered schema, and an ndarray map is self-describing (dtype + shape).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcap.well_known import SchemaEncoding

from eva.dataset import embedded
from eva.dataset import layout as dataset_layout

FORMAT = "mcap"
PROFILE = "eva-client"
# The second profile (``--mcap-profile foxglove``; eva.formats.mcap.foxglove): info.json names it
# under INFO_PROFILE_KEY; without the key an export is of the default profile.
FOXGLOVE_PROFILE = "foxglove"
INFO_PROFILE_KEY = "mcap_profile"
LIBRARY = "eva-client"
EPISODE_TOPIC = "episode"
IMAGE_TOPIC_PREFIX = "episode/image/"
EPISODE_SCHEMA_NAME = "eva_client.episode"
EPISODE_SCHEMA_ENCODING = SchemaEncoding.JSONSchema
EPISODE_SCHEMA_DATA = b'{"type": "object"}'
# eva's own encoding name, not the registry's "msgpack": readers of eva files match this string.
MESSAGE_ENCODING = "messagepack"
DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.mcap"


def frame_period_ns(fps: float) -> int:
    return round(1e9 / fps)


def frame_time_ns(frame_index: int, fps: float) -> int:
    """log_time = publish_time of frame ``frame_index`` (the first frame is one period in)."""
    return (frame_index + 1) * frame_period_ns(fps)


def image_topic(video_key: str) -> str:
    return IMAGE_TOPIC_PREFIX + video_key


def episode_path(episode_index: int, chunks_size: int = dataset_layout.DEFAULT_CHUNKS_SIZE) -> str:
    """``data/chunk-XXX/episode_NNNNNN.mcap`` of an output episode, relative to the subset dir."""
    chunk = dataset_layout.episode_chunk(episode_index, chunks_size)
    return DATA_PATH.format(episode_chunk=chunk, episode_index=episode_index)


def export_info(source_info: Mapping[str, Any], profile: str = PROFILE) -> dict[str, Any]:
    """The subset's info.json adapted to embedded images (``eva.dataset.embedded``); a profile
    other than the default is named under ``INFO_PROFILE_KEY``."""
    info = embedded.embedded_images_info(source_info, dataset_format=FORMAT, data_path=DATA_PATH)
    if profile != PROFILE:
        info[INFO_PROFILE_KEY] = profile
    return info


def info_profile(info: Mapping[str, Any]) -> str:
    """The profile an export's info.json names (the default when it names none)."""
    profile = info.get(INFO_PROFILE_KEY, PROFILE)
    return profile if isinstance(profile, str) else repr(profile)
