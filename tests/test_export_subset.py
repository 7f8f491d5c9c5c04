"""SubsetMeta over plain dicts: renumbering, task remap by first use, recomputed index stats."""

from __future__ import annotations

import math

import numpy as np
import pytest

from eva.dataset.errors import DatasetError
from eva.dataset.subset import build_subset_meta


def _stats(values: np.ndarray) -> dict:
    v = values.astype(np.float64)
    return {
        "min": [int(v.min())],
        "max": [int(v.max())],
        "mean": [float(v.mean())],
        "std": [float(v.std())],
        "count": [len(v)],
    }


INFO = {
    "codebase_version": "v2.1",
    "fps": 30,
    "chunks_size": 2,
    "features": {
        "observation.images.front": {"dtype": "video", "shape": [48, 64, 3]},
        "episode_index": {"dtype": "int64", "shape": [1]},
        "index": {"dtype": "int64", "shape": [1]},
        "task_index": {"dtype": "int64", "shape": [1]},
    },
    "total_episodes": 4,
}
TASKS = {0: "a", 1: "b", 2: "c", 3: "d"}
TASK_VALUES = {
    0: np.array([3, 3, 3]),
    1: np.array([2, 2, 0, 0]),  # an episode that switches task
    2: np.array([1, 1]),
    3: np.array([0, 2, 2, 2, 2]),
}
LENGTHS = {0: 3, 1: 4, 2: 2, 3: 5}
ROWS = {
    i: {"episode_index": i, "length": n, "quality": "green", "x": [i]} for i, n in LENGTHS.items()
}


def _ep_stats(ep: int, start: int) -> dict:
    n = LENGTHS[ep]
    return {
        "episode_index": _stats(np.full(n, ep)),
        "index": _stats(np.arange(start, start + n)),
        "task_index": _stats(TASK_VALUES[ep]),
    }


EP_STATS = {0: _ep_stats(0, 0), 1: _ep_stats(1, 3), 2: _ep_stats(2, 7), 3: _ep_stats(3, 9)}


def test_renumbering_task_remap_and_stats() -> None:
    meta = build_subset_meta(
        "accepted",
        source_info=INFO,
        source_episodes=ROWS,
        source_tasks=TASKS,
        source_episodes_stats=EP_STATS,
        source_indices=[1, 3],
        task_index_values=TASK_VALUES,
    )
    assert meta.source_episode_indices == [1, 3]
    assert [r["episode_index"] for r in meta.episodes] == [0, 1]
    assert meta.episodes[1]["x"] == [3] and ROWS[3]["episode_index"] == 3  # source rows unchanged
    assert meta.lengths == [4, 5] and meta.index_offsets == [0, 4]
    # Tasks numbered by first use: source 2 -> 0, source 0 -> 1.
    assert meta.task_remap == {2: 0, 0: 1}
    assert meta.tasks == {0: "c", 1: "a"}
    second = meta.episodes_stats[1]
    assert second["episode_index"] == {
        "min": [1],
        "max": [1],
        "mean": [1.0],
        "std": [0.0],
        "count": [5],
    }
    assert second["index"]["min"] == [4] and second["index"]["max"] == [8]
    assert second["index"]["mean"] == [6.0]
    assert math.isclose(second["index"]["std"][0], float(np.arange(4, 9).std()))
    assert second["task_index"] == _stats(np.array([1, 0, 0, 0, 0]))
    # Merged stats equal a direct computation over the rewritten columns.
    all_index = np.arange(9)
    all_tasks = np.array([0, 0, 1, 1, 1, 0, 0, 0, 0])
    for name, values in (("index", all_index), ("task_index", all_tasks)):
        assert meta.stats[name]["min"] == [values.min()] and meta.stats[name]["max"] == [
            values.max()
        ]
        assert math.isclose(meta.stats[name]["mean"][0], values.mean())
        assert math.isclose(meta.stats[name]["std"][0], values.std())
    info = meta.info
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (2, 9, 2)
    assert (info["total_videos"], info["total_chunks"], info["splits"]) == (2, 1, {"train": "0:2"})
    assert INFO["total_episodes"] == 4  # the source info is not modified


def test_empty_subset_meta() -> None:
    meta = build_subset_meta(
        "rejected",
        source_info=INFO,
        source_episodes=ROWS,
        source_tasks=TASKS,
        source_episodes_stats=EP_STATS,
        source_indices=[],
        task_index_values=TASK_VALUES,
    )
    assert meta.total_episodes == 0 and meta.total_frames == 0
    assert meta.tasks == {} and meta.stats == {}
    assert (meta.info["total_videos"], meta.info["total_chunks"], meta.info["splits"]) == (0, 0, {})


def test_unknown_task_index() -> None:
    with pytest.raises(DatasetError, match="task_index 9"):
        build_subset_meta(
            "accepted",
            source_info=INFO,
            source_episodes=ROWS,
            source_tasks=TASKS,
            source_episodes_stats=EP_STATS,
            source_indices=[0],
            task_index_values={0: np.array([9, 9, 9])},
        )
