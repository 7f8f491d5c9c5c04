"""Checking a zarr export: the embedded-images info.json, the store's totals against
episodes.jsonl and info.json, and a real read of one state, one action and one frame of each
camera per episode (zarr's own reader)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from eva.dataset import embedded, layout
from eva.dataset.errors import error_line
from eva.dataset.validate import Problem
from eva.formats._verify import VECTOR_FEATURES, ProblemCollector, check_frame, check_vectors
from eva.formats.zarr.store import ROW_ARRAYS, STORE


def verify(export_dir: Path) -> list[Problem]:
    """See the module doc; every finding names the store (and the episode)."""
    root = Path(export_dir)
    add = ProblemCollector()
    try:
        info, episodes = embedded.read_export_meta(root)
    except (OSError, ValueError) as e:
        add("unreadable_meta", f"cannot read metadata: {e}", root / layout.META_DIR)
        return add.problems
    for code, message in embedded.embedded_info_problems(info, len(episodes)):
        add(code, message, root / layout.INFO)
    store = root / STORE
    if not (store / ".zgroup").is_file():
        add("missing_store", "the Zarr store is missing", store)
        return add.problems
    try:
        group = zarr.open_group(zarr.DirectoryStore(str(store)), mode="r")
        _verify_store(group, info, episodes, store, add)
    except Exception as e:  # noqa: BLE001 - any zarr failure on a damaged store is a finding
        add("unreadable_store", f"cannot read: {error_line(e)}", store)
    return add.problems


def _verify_store(
    group: zarr.Group,
    info: Mapping[str, Any],
    episodes: Sequence[Mapping[str, Any]],
    store: Path,
    add: ProblemCollector,
) -> None:
    ends = np.asarray(group["meta/episode_ends"][:], np.int64)
    lengths = [int(row.get("length", -1)) for row in episodes]
    if ends.tolist() != np.cumsum(lengths, dtype=np.int64).tolist():
        add("episode_ends", f"episode_ends {ends.tolist()[:8]} disagree with the lengths", store)
        return
    total = int(ends[-1]) if len(ends) else 0
    if info.get("total_frames") != total:
        add("total_frames", f"info total_frames {info.get('total_frames')} but {total} rows", store)
    if "eva" not in group.attrs:
        add("missing_attrs", "the store has no eva attributes", store)
    data = group["data"]
    features = info.get("features", {})
    cameras = embedded.image_keys(info)
    for name in [*ROW_ARRAYS, *cameras, *(n for n in VECTOR_FEATURES if n in features)]:
        if name not in data:
            add("missing_array", f"data/{name} missing", store)
        elif data[name].shape[0] != total:
            add("row_count", f"data/{name} has {data[name].shape[0]} rows, {total} expected", store)
    if add.problems:
        return
    starts = [0, *ends.tolist()[:-1]] if len(ends) else []
    for ep, start in enumerate(starts):
        _verify_episode(data, ep, int(start), features, cameras, store, add)


def _verify_episode(
    data: zarr.Group,
    ep: int,
    start: int,
    features: Mapping[str, Mapping[str, Any]],
    cameras: Sequence[str],
    store: Path,
    add: ProblemCollector,
) -> None:
    """The real read: the episode's first row of state, action and episode_index, and its first
    frame of each camera."""
    if int(data["episode_index"][start]) != ep:
        add(
            "episode_index", f"row {start}: episode_index {data['episode_index'][start]}", store, ep
        )
    first = {name: np.asarray(data[name][start]) for name in VECTOR_FEATURES if name in data}
    check_vectors(add, features, first, store, ep)
    for key in cameras:
        shape = features.get(key, {}).get("shape") or []
        check_frame(add, key, np.asarray(data[key][start]), tuple(shape), store, ep)
