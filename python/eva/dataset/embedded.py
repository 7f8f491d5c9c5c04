"""info.json of an export whose images live inside the episode files (HDF5, MCAP).

Both embedded-image formats adapt the subset's v2.1 info the same way and check it the same way
in ``verify``; the one copy of that logic lives here so the formats, which never import each
other, cannot drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eva.dataset import layout
from eva.dataset.atomic import read_jsonl


def embedded_images_info(
    source_info: Mapping[str, Any], *, dataset_format: str, data_path: str
) -> dict[str, Any]:
    """A deep copy of ``source_info`` adapted to embedded images: video features become ``image``
    (shape and names kept; the ``info`` block, which describes an MP4 stream that no longer
    exists, dropped), ``embedded_images`` true, ``total_videos`` 0, no ``video_path``, and the
    format's own ``dataset_format`` / ``data_path``."""
    info = json.loads(json.dumps(dict(source_info)))
    for feature in info.get("features", {}).values():
        if feature.get("dtype") == "video":
            feature["dtype"] = "image"
            feature.pop("info", None)
    info["dataset_format"] = dataset_format
    info["data_path"] = data_path
    info.pop("video_path", None)
    info["embedded_images"] = True
    info["total_videos"] = 0
    return info


def image_keys(info: Mapping[str, Any]) -> list[str]:
    """The image features of an embedded-images info.json, in declaration order."""
    return [k for k, f in info.get("features", {}).items() if f.get("dtype") == "image"]


def read_export_meta(root: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(info, episodes rows)`` of an export directory; OSError / ValueError when unreadable."""
    info = json.loads((Path(root) / layout.INFO).read_text(encoding="utf-8"))
    if not isinstance(info, dict):
        raise ValueError(f"{Path(root) / layout.INFO}: not a JSON object")
    return info, read_jsonl(Path(root) / layout.EPISODES)


def embedded_info_problems(info: Mapping[str, Any], episode_count: int) -> list[tuple[str, str]]:
    """``(code, message)`` for every way ``info`` departs from the embedded-images layout, or
    disagrees with the number of episodes in episodes.jsonl."""
    problems: list[tuple[str, str]] = []
    if any(f.get("dtype") == "video" for f in info.get("features", {}).values()):
        problems.append(("video_feature", "info.json still declares video features"))
    if info.get("embedded_images") is not True:
        problems.append(("embedded_images", "info.json embedded_images is not true"))
    if info.get("total_videos") != 0:
        problems.append(
            ("total_videos", f"info total_videos {info.get('total_videos')!r}, expected 0")
        )
    if "video_path" in info:
        problems.append(("video_path", "info.json still has video_path"))
    if info.get("total_episodes") != episode_count:
        problems.append(
            (
                "total_episodes",
                f"info total_episodes {info.get('total_episodes')} but {episode_count} episodes",
            )
        )
    return problems
