"""Checking an HDF5 export: the embedded-images checks every such format shares, then each
episode file's groups, items, columns and images."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from eva.dataset import embedded
from eva.dataset.errors import error_line
from eva.dataset.validate import Problem
from eva.formats._verify import VECTOR_FEATURES, ProblemCollector, check_vectors
from eva.formats.hdf5.items import GROUPS, KINDS, attr_text
from eva.formats.hdf5.writer import episode_path


def _check_items(group: h5py.Group, problem: Callable[[str, str], None]) -> dict[str, h5py.Group]:
    items: dict[str, h5py.Group] = {}
    for name in sorted(group):
        item = group[name]
        if not isinstance(item, h5py.Group) or "value" not in item:
            problem("bad_item", f"{item.name} is not an item group with a value dataset")
            continue
        key, kind = item.attrs.get("key"), item.attrs.get("kind")
        if key is None or kind is None:
            problem("missing_attrs", f"{item.name} lacks the key or kind attribute")
            continue
        if attr_text(kind) not in KINDS:
            problem("bad_kind", f"{item.name} has unknown kind {attr_text(kind)!r}")
            continue
        items[attr_text(key)] = item
    return items


def verify(export_dir: Path) -> list[Problem]:
    """Totals against the episode files, the three groups with key/kind attributes, every image
    value's frame axis against the row count, and a real h5py read of one state, one action and
    one image frame per episode. A trainer layout (info.json's ``data_path`` names its files)
    is checked under its own keys (``verify_trainer``)."""
    from eva.formats.hdf5 import verify_trainer
    from eva.formats.hdf5.robomimic import DATA_FILE
    from eva.formats.hdf5.trainer import ALOHA_PATH

    try:
        data_path = embedded.read_export_meta(Path(export_dir))[0].get("data_path")
    except (OSError, ValueError):
        data_path = None  # reported by the checks below
    if data_path == ALOHA_PATH:
        return verify_trainer.verify_aloha(Path(export_dir))
    if data_path == DATA_FILE:
        return verify_trainer.verify_robomimic(Path(export_dir))
    add = ProblemCollector()

    def verify_file(path: Path, ep: int, row: Mapping[str, Any], info: Mapping[str, Any]) -> int:
        try:
            with h5py.File(path, "r") as h5:
                features = info.get("features", {})
                return _verify_episode(h5, ep, row, embedded.image_keys(info), features, path, add)
        except Exception as e:  # noqa: BLE001 - any h5py failure on a damaged file is a finding
            # (h5py raises OSError, RuntimeError, KeyError, ValueError... for a damaged header,
            # object header or B-tree, depending on which lookup meets it)
            add("unreadable_episode", f"cannot read: {error_line(e)}", path, ep)
            return 0

    embedded.verify_export_files(
        Path(export_dir),
        episode_file=episode_path,
        verify_file=verify_file,
        problem=add,
        missing_code="missing_episode_file",
        file_glob="data/chunk-*/episode_*.hdf5",
    )
    return add.problems


def _verify_episode(
    h5: h5py.File,
    ep: int,
    row: Mapping[str, Any],
    image_keys: list[str],
    features: Mapping[str, Any],
    path: Path,
    add: ProblemCollector,
) -> int:
    def problem(code: str, message: str) -> None:
        add(code, message, path, ep)

    missing = [g for g in GROUPS if g not in h5]
    if missing:
        problem("missing_group", f"missing group(s) {', '.join(missing)}")
        return 0
    columns = _check_items(h5["columns"], problem)
    images = _check_items(h5["images"], problem)
    _check_items(h5["metadata"], problem)
    rows = row.get("length")
    index_item = columns.get("index")
    if index_item is not None:
        rows_in_file = int(index_item["value"].shape[0])
        if rows_in_file != rows:
            problem("length_mismatch", f"{rows_in_file} rows but episodes.jsonl length {rows}")
            rows = rows_in_file
    else:
        problem("missing_column", "column 'index' missing")
    if not isinstance(rows, int) or rows <= 0:
        problem("empty_episode", "no rows")
        return 0
    first_values = {  # real read of one value
        name: np.asarray(columns[name]["value"][0]) for name in VECTOR_FEATURES if name in columns
    }
    check_vectors(add, features, first_values, path, ep)
    for key in image_keys:
        if key not in images:
            problem("missing_image", f"images item {key!r} missing")
    for key, item in images.items():
        dataset = item["value"]
        if dataset.ndim != 4 or dataset.shape[3] != 3 or dataset.dtype != np.uint8:
            problem("bad_image", f"images {key!r} is {dataset.shape} {dataset.dtype}")
            continue
        if dataset.shape[0] != rows:
            problem("frame_count", f"images {key!r} has {dataset.shape[0]} frames, {rows} rows")
        expected = features.get(key, {}).get("shape")
        if expected is not None and tuple(expected) != dataset.shape[1:]:
            problem(
                "image_shape", f"images {key!r} frames are {dataset.shape[1:]}, info {expected}"
            )
        frame = dataset[0]  # real read of one frame
        if frame.shape != dataset.shape[1:]:
            problem("bad_image", f"images {key!r} frame 0 reads as {frame.shape}")
    return rows
