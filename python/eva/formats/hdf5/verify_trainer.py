"""Checking a trainer-layout HDF5 export (aloha, robomimic): the embedded-images checks every
such format shares, then each episode's datasets under the layout's own keys, with a real read
of the first state, action and frame of each (the state and action found by their
``eva_feature`` attribute)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from eva.dataset import embedded
from eva.dataset.errors import error_line
from eva.formats._verify import ProblemCollector, check_vectors
from eva.formats.hdf5.robomimic import DATA_FILE
from eva.formats.hdf5.trainer import aloha_path, attrs_text

Problem = Callable[[str, str], None]


def _first_values(group: h5py.Group) -> dict[str, np.ndarray | None]:
    """The first row of every dataset below ``group`` that came from a feature, by feature."""
    found: dict[str, np.ndarray | None] = {}

    def visit(_name: str, item: Any) -> None:
        if isinstance(item, h5py.Dataset) and "eva_feature" in item.attrs and item.ndim <= 2:
            found[attrs_text(item.attrs, "eva_feature")] = np.asarray(item[0])

    group.visititems(visit)
    return found


def _check_rows(group: h5py.Group, names: tuple[str, ...], rows: int, problem: Problem) -> None:
    for name in names:
        item = group.get(name)
        if not isinstance(item, h5py.Dataset):
            problem("missing_dataset", f"{group.name}/{name} missing")
        elif item.ndim < 1 or item.shape[0] != rows:
            problem("length_mismatch", f"{item.name} is {item.shape}, {rows} rows expected")


def _check_images(
    group: h5py.Group | None,
    rows: int,
    info: Mapping[str, Any],
    problem: Problem,
) -> None:
    """Every image feature of info.json as a dataset of ``group`` (by ``eva_feature``): its
    shape, dtype, frame count and a real read of frame 0."""
    images: dict[str, h5py.Dataset] = {}
    if group is not None:
        for item in group.values():
            if isinstance(item, h5py.Dataset) and item.ndim == 4:
                images[attrs_text(item.attrs, "eva_feature")] = item
    features = info.get("features", {})
    for key in embedded.image_keys(info):
        dataset = images.get(key)
        if dataset is None:
            problem("missing_image", f"camera {key!r} missing")
            continue
        if dataset.shape[3] != 3 or dataset.dtype != np.uint8:
            problem("bad_image", f"{dataset.name} is {dataset.shape} {dataset.dtype}")
            continue
        if dataset.shape[0] != rows:
            problem("frame_count", f"{dataset.name} has {dataset.shape[0]} frames, {rows} rows")
        expected = features.get(key, {}).get("shape")
        if expected is not None and tuple(expected) != dataset.shape[1:]:
            problem(
                "image_shape", f"{dataset.name} frames are {dataset.shape[1:]}, info {expected}"
            )
        if dataset[0].shape != dataset.shape[1:]:  # real read of one frame
            problem("bad_image", f"{dataset.name} frame 0 reads as {dataset[0].shape}")


def _row_length(row: Mapping[str, Any], problem: Problem) -> int:
    rows = row.get("length")
    if not isinstance(rows, int) or rows <= 0:
        problem("empty_episode", "no rows")
        return 0
    return rows


def verify_aloha(export_dir: Path) -> list[Any]:
    """Totals against the episode files; each file's attributes, qpos/qvel/effort/action rows,
    cameras, and a real read."""
    add = ProblemCollector()

    def verify_file(path: Path, ep: int, row: Mapping[str, Any], info: Mapping[str, Any]) -> int:
        def problem(code: str, message: str) -> None:
            add(code, message, path, ep)

        try:
            with h5py.File(path, "r") as h5:
                for attr in ("sim", "compress"):
                    if attr not in h5.attrs:
                        problem("missing_attrs", f"file attribute {attr!r} missing")
                rows = _row_length(row, problem)
                observations = h5.get("observations")
                if rows and not isinstance(observations, h5py.Group):
                    problem("missing_group", "/observations missing")
                if rows == 0 or not isinstance(observations, h5py.Group):
                    return 0
                _check_rows(observations, ("qpos", "qvel", "effort"), rows, problem)
                _check_rows(h5, ("action",), rows, problem)
                check_vectors(add, info.get("features", {}), _first_values(h5), path, ep)
                _check_images(observations.get("images"), rows, info, problem)
                return rows
        except Exception as e:  # noqa: BLE001 - any h5py failure on a damaged file is a finding
            add("unreadable_episode", f"cannot read: {error_line(e)}", path, ep)
            return 0

    embedded.verify_export_files(
        Path(export_dir),
        episode_file=aloha_path,
        verify_file=verify_file,
        problem=add,
        missing_code="missing_episode_file",
        file_glob="episode_*.hdf5",
    )
    return add.problems


def verify_robomimic(export_dir: Path) -> list[Any]:
    """Totals against ``data.hdf5``'s demos; each demo's ``num_samples``, actions, rewards,
    dones, obs and cameras with a real read; ``total`` and the filter keys."""
    add = ProblemCollector()
    opened: list[h5py.File] = []
    episodes = [0]

    def verify_file(path: Path, ep: int, row: Mapping[str, Any], info: Mapping[str, Any]) -> int:
        def problem(code: str, message: str) -> None:
            add(code, message, path, ep)

        episodes[0] += 1
        try:
            if not opened:
                opened.append(h5py.File(path, "r"))
            demo = opened[0].get(f"data/demo_{ep}")
            rows = _row_length(row, problem)
            if not isinstance(demo, h5py.Group):
                problem("missing_demo", f"data/demo_{ep} missing")
                return 0
            if int(demo.attrs.get("num_samples", -1)) != rows:
                problem(
                    "length_mismatch", f"num_samples {demo.attrs.get('num_samples')}, {rows} rows"
                )
            _check_rows(demo, ("actions", "rewards", "dones"), rows, problem)
            check_vectors(add, info.get("features", {}), _first_values(demo), path, ep)
            _check_images(demo.get("obs"), rows, info, problem)
            return rows
        except Exception as e:  # noqa: BLE001 - any h5py failure on a damaged file is a finding
            add("unreadable_episode", f"cannot read: {error_line(e)}", path, ep)
            return 0

    try:
        embedded.verify_export_files(
            Path(export_dir),
            episode_file=lambda ep, chunks_size: DATA_FILE,
            verify_file=verify_file,
            problem=add,
            missing_code="missing_data_file",
        )
        if opened:
            _check_data(opened[0], Path(export_dir) / DATA_FILE, episodes[0], add)
    finally:
        for h5 in opened:
            h5.close()
    return add.problems


def _check_data(h5: h5py.File, path: Path, episodes: int, add: ProblemCollector) -> None:
    """``data``'s total against its demos, no demo beyond episodes.jsonl's, and the filter
    keys splitting the demos."""
    demos = sorted(h5["data"].keys())
    if len(demos) != episodes:
        add("demo_count", f"{len(demos)} demos but {episodes} episodes in episodes.jsonl", path)
    total = sum(int(h5["data"][d].attrs.get("num_samples", 0)) for d in demos)
    if int(h5["data"].attrs.get("total", -1)) != total:
        add("total", f"data total {h5['data'].attrs.get('total')}, demos hold {total}", path)
    try:
        train = {bytes(n).decode() for n in h5["mask/train"][()]}
        valid = {bytes(n).decode() for n in h5["mask/valid"][()]}
    except (KeyError, TypeError, ValueError) as e:
        add("filter_keys", f"mask/train or mask/valid unreadable: {error_line(e)}", path)
        return
    if train & valid or train | valid != set(demos):
        add("filter_keys", "mask/train and mask/valid do not split the demos", path)
