"""The trainer layouts' episode files (``--hdf5-layout aloha|robomimic``, ``eva.formats.hdf5``).

aloha: ``episode_<i>.hdf5`` per episode: the attributes ``sim`` and ``compress`` (False: a real
robot, raw frames), ``/observations/qpos|qvel|effort`` (T, D), ``/observations/images/<camera>``
(T, H, W, 3) uint8, ``/action`` (T, D), every other feature under ``/observations/extra/<key>``;
no velocity or effort: zeros shaped as qpos, with the attribute ``eva_zeros`` saying why.

robomimic: each episode is a part file ``.eva-demos/demo_<i>.hdf5`` holding one group ``demo``
(``obs/<key>``, ``actions``, ``rewards``, ``dones``, the ``num_samples`` attribute), which the
subset's finish copies into ``data.hdf5`` as ``data/demo_<i>`` (``eva.formats.hdf5.robomimic``).

Both: each dataset made from a feature carries ``eva_feature`` (its key), and the episode (the
aloha file, the robomimic demo) carries eva's provenance: ``eva_source_episode_index``,
``eva_subset``, ``eva_verdict``, ``eva_quality``, ``eva_note``, ``eva_quality_issues`` (JSON),
``eva_tasks`` (JSON) and ``eva_episode`` (the whole episodes.jsonl row, JSON). Frames are decoded
and written as in the eva layout (``EpisodeWriter.write_camera``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pyarrow as pa

from eva.dataset.columns import column_values
from eva.dataset.errors import DatasetError
from eva.dataset.reader import DatasetReader
from eva.formats.base import ExportOptions
from eva.formats.hdf5.names import (
    ALOHA_VECTORS,
    ALOHA_ZERO_FILLED,
    ROBOMIMIC_ACTIONS,
    LayoutNames,
    layout_names,
)
from eva.formats.hdf5.writer import EpisodeWriter
from eva.formats.options import Hdf5Options
from eva.formats.tasks import EpisodeResult, EpisodeTask

ALOHA_PATH = "episode_{episode_index}.hdf5"
DEMO_PARTS = ".eva-demos"  # the robomimic demos' part files, inside the staged subset
DEMO_GROUP = "demo"


def aloha_path(index: int, chunks_size: int) -> str:
    return ALOHA_PATH.format(episode_index=index)


def demo_part_path(index: int, chunks_size: int) -> str:
    return f"{DEMO_PARTS}/demo_{index:06d}.hdf5"


def provenance(task: EpisodeTask) -> dict[str, Any]:
    """eva's provenance of an episode, as HDF5 attributes (texts and numbers only)."""
    row = task.row

    def text(key: str) -> str:
        value = row.get(key)
        return "" if value is None else str(value)

    return {
        "eva_source_episode_index": task.source_index,
        "eva_subset": task.subset,
        "eva_verdict": text("qc_verdict"),
        "eva_quality": text("quality"),
        "eva_note": text("qc_note"),
        "eva_quality_issues": json.dumps(row.get("quality_issues") or []),
        "eva_tasks": json.dumps(row.get("tasks") or []),
        "eva_episode": json.dumps(dict(row), sort_keys=True, default=str),
    }


class TrainerEpisodeSession:
    """Writes aloha episode files or robomimic demo parts from one reader; one
    ``EpisodeWriter`` (batch buffers, converter) serves every episode."""

    def __init__(self, reader: DatasetReader, options: ExportOptions) -> None:
        self.reader = reader
        self.options = options.format_options(Hdf5Options)
        self.writer = EpisodeWriter(self.options)
        self._names: dict[tuple[str, ...], LayoutNames] = {}

    def names(self, video_keys: tuple[str, ...]) -> LayoutNames:
        found = self._names.get(video_keys)
        if found is None:
            opts = self.options
            found = layout_names(opts.layout, self.reader.features, video_keys, opts.feature_map)
            self._names[video_keys] = found
        return found

    def write(self, task: EpisodeTask) -> EpisodeResult:
        from eva.dataset.subset import rewrite_index_columns
        from eva.dataset.subset_edits import trim_table

        reader, src = self.reader, task.source_index
        table = trim_table(reader.read_table(src), task.trim, task.fps, task.label)
        if table.num_rows != task.length:
            raise DatasetError(
                f"{reader.data_path(src)}: episode {src}: {table.num_rows} rows but "
                f"episodes.jsonl length {task.length}"
            )
        if table.num_rows == 0:
            raise DatasetError(
                f"{task.label}: the episode has no rows (empty episodes are not exported)"
            )
        table = rewrite_index_columns(table, task.index, task.index_offset, dict(task.task_remap))
        path = task.subset_dir / task.path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self.writer.staged_file(path) as (h5, tmp):
            if self.options.layout == "aloha":
                self._aloha(h5, tmp, task, table)
            else:
                self._demo(h5, tmp, task, table)
        size = path.stat().st_size
        current = f"{task.subset}/{task.path}"
        if self.options.layout == "robomimic":  # a part: data.hdf5 is the subset's one file
            return EpisodeResult(task.subset, task.index, task.path, size, current, files=0)
        return EpisodeResult(task.subset, task.index, task.path, size, current)

    def _vectors(self, table: pa.Table, names: LayoutNames) -> dict[str, np.ndarray]:
        """Each vector feature's values by its name in the layout."""
        return {
            name: np.asarray(column_values(table.column(feature)))
            for feature, name in names.vectors.items()
            if feature in table.column_names
        }

    def _aloha(self, h5: h5py.File, tmp: Path, task: EpisodeTask, table: pa.Table) -> None:
        names = self.names(task.video_keys)
        features = {name: feature for feature, name in names.vectors.items()}
        h5.attrs["sim"] = False
        h5.attrs["compress"] = False
        for key, value in provenance(task).items():
            h5.attrs[key] = value
        observations = h5.create_group("observations")
        values = self._vectors(table, names)
        qpos = as_matrix(values["qpos"])
        for name, value in values.items():
            if name in ALOHA_VECTORS:
                where = h5 if name == "action" else observations
                self._dataset(where, name, as_matrix(value), features[name])
        for name in ALOHA_ZERO_FILLED:
            if name not in values:
                zeros = observations.create_dataset(name, data=np.zeros_like(qpos))
                zeros.attrs["eva_zeros"] = f"the dataset has no {name}: zeros shaped as qpos"
        images = observations.create_group("images")
        self._cameras(images, tmp, task, names)
        extra = [name for name in values if name not in ALOHA_VECTORS]
        if extra:
            group = observations.create_group("extra")
            for name in extra:
                self._dataset(group, name, values[name], features[name])

    def _demo(self, h5: h5py.File, tmp: Path, task: EpisodeTask, table: pa.Table) -> None:
        names = self.names(task.video_keys)
        features = {name: feature for feature, name in names.vectors.items()}
        rows = table.num_rows
        demo = h5.create_group(DEMO_GROUP)
        demo.attrs["num_samples"] = rows
        for key, value in provenance(task).items():
            demo.attrs[key] = value
        obs = demo.create_group("obs")
        for name, value in self._vectors(table, names).items():
            where = demo if name == ROBOMIMIC_ACTIONS else obs
            self._dataset(where, name, as_matrix(value), features[name])
        self._cameras(obs, tmp, task, names)
        last = np.zeros(rows, dtype=np.float64)
        last[-1] = 1.0
        rewards = last if task.subset == "accepted" else np.zeros(rows, dtype=np.float64)
        demo.create_dataset("rewards", data=rewards)
        demo.create_dataset("dones", data=last.astype(np.int64))

    def _cameras(self, group: h5py.Group, tmp: Path, task: EpisodeTask, names: LayoutNames) -> None:
        for key, name in names.cameras.items():
            video = self.reader.video_file(task.source_index, key)
            self.writer.write_camera(
                group, key, video, task.length, task.label, tmp, task.trim, name=name
            )
            group[name].attrs["eva_feature"] = key

    def _dataset(self, group: h5py.Group, name: str, value: np.ndarray, feature: str) -> None:
        opts = self.options
        if value.dtype.kind in "biuf":
            compressed = value.ndim >= 1 and value.size and opts.h5py_compression is not None
            dataset = group.create_dataset(
                name,
                data=value,
                compression=opts.h5py_compression if compressed else None,
                compression_opts=opts.compression_level if compressed else None,
            )
        else:  # a column of texts (or anything else): its values as UTF-8 strings
            texts = [str(v) for v in value.tolist()]
            dataset = group.create_dataset(name, data=texts, dtype=h5py.string_dtype("utf-8"))
        dataset.attrs["eva_feature"] = feature

    def close(self) -> None:
        self.writer.close()


def as_matrix(value: np.ndarray) -> np.ndarray:
    """A feature's values as (T, D): a scalar per frame becomes (T, 1)."""
    return value.reshape(len(value), 1) if value.ndim == 1 else value


def attrs_text(attrs: Mapping[str, Any], key: str) -> str:
    value = attrs.get(key, "")
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
