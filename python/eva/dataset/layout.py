"""Names and paths of the LeRobot v2.1 layout (docs/formats.md); an export's paths are its
format's (``eva.formats.catalog.FormatEntry.export_root``).

Everything that turns a user-supplied name into a path goes through here, so the hostile-input
rules (no traversal, no separators, no control characters) live in one place.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CODEBASE_VERSION = "v2.1"
DEFAULT_CHUNKS_SIZE = 1000
# LeRobot's feature names of the robot state and the commanded action.
STATE = "observation.state"
ACTION = "action"
DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"

META_DIR = "meta"
INFO = "meta/info.json"
EPISODES = "meta/episodes.jsonl"
EPISODES_STATS = "meta/episodes_stats.jsonl"
TASKS = "meta/tasks.jsonl"
STATS = "meta/stats.json"
QUALITY_SPLIT = "meta/quality_split.json"
# eva-owned sidecar: one row per episode, {"episode_index": N, "histograms": {video_key: 3 x 256
# pixel counts}} of the frames given to the writer (exact image quantiles without decoding). Kept
# out of episodes_stats.jsonl: LeRobot 0.3.3 asserts image stats have shape (3, 1, 1).
IMAGE_HISTOGRAMS = "meta/eva_image_histograms.jsonl"
# eva-owned cache: each trimmed episode's cameras' pixel histograms over its kept frames,
# decoded when the trim is set (eva.dataset.kept_histograms), so that exports need not.
KEPT_HISTOGRAMS = "meta/eva_kept_histograms.jsonl"

# The values of an episodes.jsonl row's review fields (compared case-insensitively; absent or
# null: not set): the operator's qc_verdict and the capture's automatic quality flag.
QC_VERDICTS = ("pass", "fail")
QUALITY_FLAGS = ("green", "red")

# Work in progress lives here, outside the published layout (hidden, inside the dataset).
WORK_DIR = ".eva-work"
# Lock files in WORK_DIR shared by the capture writer, the save worker and `eva qc`
# (docs/design.md, "Saving marker"): held while a writer has the dataset open, around every
# read-modify-write of episodes.jsonl, and while episode N is being committed.
WRITER_LOCK = "writer.lock"
META_LOCK = "meta.lock"


def saving_marker_name(episode_index: int) -> str:
    return f"saving-{episode_index:06d}.lock"


SUBSETS = ("accepted", "rejected")

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")


class UnsafeNameError(ValueError):
    """A user-supplied name that would escape its directory or is not a plain file name."""


def check_component(name: str, what: str = "name") -> str:
    """Accept ``name`` only as one plain path component: no '/', '..', leading dot or control chars."""
    # fullmatch: ``$`` alone would also accept a name ending in "\n".
    if not isinstance(name, str) or not _SAFE_NAME.fullmatch(name) or name in (".", ".."):
        raise UnsafeNameError(
            f"invalid {what} {name!r}: use 1-128 letters, digits, '.', '_', '+' or '-', "
            "starting with a letter or digit"
        )
    return name


def sanitize_dataset_name(name: str) -> str:
    """Turn a free-form dataset name into a safe directory name, refusing traversal attempts."""
    if any(part in ("..", ".") for part in re.split(r"[\\/]", name)) or "\x00" in name:
        raise UnsafeNameError(f"dataset name {name!r} would escape the log directory")
    cleaned = re.sub(r"[^A-Za-z0-9._+-]+", "_", name.strip()).strip("._")
    if not cleaned:
        raise UnsafeNameError(f"dataset name {name!r} has no usable characters")
    return check_component(cleaned[:128], "dataset name")


def check_video_key(key: str) -> str:
    """Video keys become directory names (``observation.images.front``): one safe component."""
    return check_component(key, "video key")


def safe_video_keys(features: Mapping[str, Any]) -> tuple[list[str], list[UnsafeNameError]]:
    """The ``dtype: video`` keys of an info.json ``features`` map that are safe path components,
    and one error per key that is not (a hostile info.json must not steer reads with ``../``)."""
    keys: list[str] = []
    refused: list[UnsafeNameError] = []
    for key, feature in features.items():
        if feature.get("dtype") != "video":
            continue
        try:
            keys.append(check_video_key(key))
        except UnsafeNameError as e:
            refused.append(e)
    return keys, refused


_FIELD_SPEC = re.compile(r"0?[0-9]{0,2}d?")


def check_path_template(template: str, fields: tuple[str, ...]) -> str:
    """Accept a path template from a dataset's info.json (``data_path``, ``video_path``) only if
    it uses plain ``{field}`` / ``{field:03d}`` replacement fields from ``fields``: no attribute or
    index access, no conversion, no width that would build a huge string."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise UnsafeNameError(f"path template {template!r} is malformed ({e})") from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in fields or conversion or not _FIELD_SPEC.fullmatch(spec or ""):
            raise UnsafeNameError(
                f"path template {template!r}: field {{{name}{'!' + conversion if conversion else ''}"
                f"{':' + spec if spec else ''}}} is not one of "
                + ", ".join(f"{{{f}}}" for f in fields)
                + " (optionally zero-padded, e.g. {episode_index:06d})"
            )
    return template


def format_path_template(template: object, **fields: object) -> str:
    """The relative path a dataset's ``data_path`` / ``video_path`` template gives for ``fields``,
    after ``check_path_template``; ``UnsafeNameError`` (naming the template) otherwise."""
    if not isinstance(template, str):
        raise UnsafeNameError(f"path template {template!r} is not a string")
    check_path_template(template, tuple(fields))
    try:
        return template.format(**fields)
    except ValueError as e:  # a numeric spec on a text field: {video_key:03d}
        raise UnsafeNameError(f"path template {template!r}: {e}") from None


def episode_chunk(episode_index: int, chunks_size: int = DEFAULT_CHUNKS_SIZE) -> int:
    return episode_index // chunks_size


def is_within(path: Path, root: Path) -> bool:
    """True when ``path`` (symlinks resolved) stays inside ``root``."""
    try:
        Path(path).resolve().relative_to(Path(root).resolve())
        return True
    except ValueError:
        return False
