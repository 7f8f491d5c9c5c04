"""info.json of an export whose images live inside the episode files (HDF5, MCAP).

Both embedded-image formats adapt the subset's v2.1 info the same way and check it the same way
in ``verify``; the one copy of that logic lives here so the formats, which never import each
other, cannot drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from eva.dataset import layout
from eva.dataset.atomic import read_json_object, read_jsonl


def embedded_images_info(
    source_info: Mapping[str, Any], *, dataset_format: str, data_path: str
) -> dict[str, Any]:
    """A deep copy of ``source_info`` adapted to embedded images: video features become ``image``
    (shape and names kept; the ``info`` block, which describes an MP4 stream that no longer
    exists, dropped), ``embedded_images`` true, ``total_videos`` 0, no ``video_path``, and the
    format's own ``dataset_format`` / ``data_path``."""
    info: dict[str, Any] = json.loads(json.dumps(dict(source_info)))
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
    """``(info, episodes rows)`` of an export directory; OSError / ValueError (a
    ``DatasetError`` naming the file, for any reason JSON text is unreadable) otherwise."""
    return read_json_object(Path(root) / layout.INFO), read_jsonl(Path(root) / layout.EPISODES)


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


# (code, message, path, episode or None): how a format's verify collects its problems.
ProblemSink = Callable[[str, str, Path, int | None], None]


def verify_export_files(
    root: Path,
    *,
    episode_file: Callable[[int, int], str],
    verify_file: Callable[[Path, int, Mapping[str, Any], Mapping[str, Any]], int],
    problem: ProblemSink,
    missing_code: str,
    file_glob: str | None = None,
) -> None:
    """The checks every embedded-images export shares, reported through ``problem``: readable
    metadata, the info.json layout (``embedded_info_problems``), one file per episode
    (``episode_file(episode, chunks_size)``, relative to ``root``; ``missing_code`` when absent;
    with ``file_glob``, files that no episode lists are ``unexpected_file``), and info's
    ``total_frames`` against the rows the files hold. ``verify_file(path, episode, row, info)``
    checks one file, reports its own problems and returns its row count (0 when unreadable)."""
    root = Path(root)
    info_path = root / layout.INFO
    try:
        info, episodes = read_export_meta(root)
    except (OSError, ValueError) as e:
        problem("unreadable_meta", f"cannot read metadata: {e}", root / layout.META_DIR, None)
        return
    for code, message in embedded_info_problems(info, len(episodes)):
        problem(code, message, info_path, None)
    chunks_size = int(info.get("chunks_size", layout.DEFAULT_CHUNKS_SIZE))
    paths = [root / episode_file(ep, chunks_size) for ep in range(len(episodes))]
    if file_glob is not None:
        for extra in sorted(set(root.glob(file_glob)) - set(paths)):
            problem("unexpected_file", "episode file not listed in episodes.jsonl", extra, None)
    total_rows = 0
    for ep, (path, row) in enumerate(zip(paths, episodes, strict=True)):
        if not path.is_file():
            problem(missing_code, "episode file missing", path, ep)
            continue
        total_rows += verify_file(path, ep, row, info)
    if info.get("total_frames") != total_rows:
        problem(
            "total_frames",
            f"info total_frames {info.get('total_frames')} but the files hold {total_rows} rows",
            info_path,
            None,
        )
