"""robomimic's one file per subset, ``data.hdf5``, assembled from the demos' part files.

Each demo is written by its own task (any executor) as a part file holding one group ``demo``
(``eva.formats.hdf5.trainer``); the subset's finish, in the driver, makes ``data.hdf5`` and
copies the parts' groups into it in demo order with HDF5's object copy (``H5Ocopy``: chunk by
chunk, so memory stays one chunk whatever the demo's length), then removes the parts. The file
is a function of the parts and their order alone, so every executor gives the same bytes.

``data`` carries ``total`` (the samples of every demo) and ``env_args`` (JSON: no simulator,
eva's fps and source); ``mask/train`` and ``mask/valid`` list the demos' names (bytes, as
robomimic writes them). A demo is in ``valid`` when its source episode index ``s`` satisfies
``floor((s + 1) * f) > floor(s * f)`` (``f``: ``--valid-fraction``): about one episode in
``1 / f``, evenly spread, and the same episode stays on the same side when others come and go.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np

from eva.dataset.subset import SubsetMeta
from eva.formats.hdf5.trainer import DEMO_GROUP, DEMO_PARTS
from eva.formats.hdf5.writer import EpisodeWriter
from eva.formats.options import Hdf5Options
from eva.formats.tasks import EpisodeResult

DATA_FILE = "data.hdf5"
# robomimic's EnvType.GYM_TYPE: the nearest to "no simulator" its env_args can say.
ENV_TYPE_GYM = 2


def in_valid(source_index: int, fraction: float) -> bool:
    """Whether the demo of source episode ``source_index`` is in ``mask/valid``."""
    return math.floor((source_index + 1) * fraction) > math.floor(source_index * fraction)


def env_args(meta: SubsetMeta) -> str:
    """``data``'s ``env_args``: robomimic reads it as JSON (env_name, type, env_kwargs)."""
    info = meta.info
    return json.dumps(
        {
            "env_name": str(info.get("robot_type") or "eva"),
            "type": ENV_TYPE_GYM,
            "env_kwargs": {},
            "eva": {"fps": info.get("fps"), "note": "recorded on a real robot: no simulator"},
        },
        sort_keys=True,
    )


def _names(indices: Sequence[int]) -> np.ndarray:
    names = [f"demo_{i}".encode() for i in indices]
    width = max((len(name) for name in names), default=1)
    return np.array(names, dtype=f"S{width}")


def assemble(
    meta: SubsetMeta,
    subset_dir: Path,
    results: Sequence[EpisodeResult],
    options: Hdf5Options,
) -> int:
    """``data.hdf5`` from the subset's demo parts (``results`` in demo order); the parts are
    removed after. Returns the file's size."""
    path = Path(subset_dir) / DATA_FILE
    writer = EpisodeWriter(options)
    with writer.staged_file(path) as (h5, _tmp):
        data = h5.create_group("data")
        data.attrs["total"] = int(sum(meta.lengths))
        data.attrs["env_args"] = env_args(meta)
        for index, result in enumerate(results):
            with h5py.File(Path(subset_dir) / result.path, "r") as part:
                h5py.h5o.copy(part.id, DEMO_GROUP.encode(), data.id, f"demo_{index}".encode())
        valid = [
            i
            for i, source in enumerate(meta.source_episode_indices)
            if in_valid(source, options.valid_fraction)
        ]
        train = sorted(set(range(len(meta.source_episode_indices))) - set(valid))
        mask = h5.create_group("mask")
        mask.create_dataset("train", data=_names(train))
        mask.create_dataset("valid", data=_names(valid))
    shutil.rmtree(Path(subset_dir) / DEMO_PARTS, ignore_errors=True)
    return path.stat().st_size
