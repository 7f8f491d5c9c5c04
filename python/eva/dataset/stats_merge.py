"""Dataset-level stats (``meta/stats.json``) from per-episode stats (``eva.dataset.stats``).

``merge_stats`` and ``RunningMerge``: count-weighted mean, pooled population std (Chan et al.'s
parallel update of mean and M2 = N * var, in float64), min of mins, max of maxes, count sum.
Quantile keys are not mergeable from per-episode summaries and are left out of merged results.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

__all__ = ["RunningMerge", "merge_stats"]


def _to_list(array: np.ndarray) -> Any:
    return array.tolist()


class _FeatureMerge:
    """Running merge of one feature: count, mean and M2 (= N * var) in float64, min, max."""

    def __init__(self, stat: Mapping[str, Any]) -> None:
        self.shape = np.asarray(stat["mean"], dtype=np.float64).shape
        self.count = 0
        self.mean = np.zeros(self.shape)
        self.m2 = np.zeros(self.shape)
        self.minimum = np.full(self.shape, np.inf)
        self.maximum = np.full(self.shape, -np.inf)

    def add(self, feature: str, stat: Mapping[str, Any]) -> None:
        count = _stat_count(feature, stat)
        if count == 0:
            return
        mean = self._field(feature, stat, "mean")
        std = self._field(feature, stat, "std")
        # Chan's parallel combination (see eva.dataset.stats); M2 of the added part is n * std^2.
        total = self.count + count
        delta = mean - self.mean
        self.mean = self.mean + delta * (count / total)
        self.m2 = self.m2 + count * np.square(std) + np.square(delta) * (self.count * count / total)
        self.minimum = np.minimum(self.minimum, self._field(feature, stat, "min"))
        self.maximum = np.maximum(self.maximum, self._field(feature, stat, "max"))
        self.count = total

    def _field(self, feature: str, stat: Mapping[str, Any], key: str) -> np.ndarray:
        if key not in stat:
            raise ValueError(f"stats of feature {feature!r} lack {key!r}")
        value = np.asarray(stat[key], dtype=np.float64)
        if value.shape != self.shape:
            raise ValueError(
                f"stats of feature {feature!r}: {key!r} has shape {value.shape}, expected {self.shape}"
            )
        return value

    def result(self) -> dict[str, Any]:
        std = np.sqrt(np.maximum(self.m2, 0.0) / self.count)
        return {
            "min": _to_list(self.minimum),
            "max": _to_list(self.maximum),
            "mean": _to_list(self.mean),
            "std": _to_list(std),
            "count": [int(self.count)],
        }


def _stat_count(feature: str, stat: Mapping[str, Any]) -> int:
    if "count" not in stat:
        raise ValueError(f"stats of feature {feature!r} lack 'count'")
    count = np.asarray(stat["count"]).reshape(-1)
    if count.shape != (1,) or count[0] < 0:
        raise ValueError(
            f"stats of feature {feature!r}: 'count' must be [n >= 0], got {stat['count']!r}"
        )
    return int(count[0])


class RunningMerge:
    """Dataset stats updated one episode at a time in O(features), e.g. on every append.

    ``RunningMerge.from_stats(json.load(stats.json))`` seeds the merge from existing dataset stats
    (mean, std and count fully describe the pooled moments), so the writer never re-reads the
    per-episode stats. ``result()`` equals ``merge_stats`` over all episodes up to float rounding.
    """

    def __init__(self) -> None:
        self._features: dict[str, _FeatureMerge] = {}

    @classmethod
    def from_stats(cls, stats: Mapping[str, Mapping[str, Any]]) -> RunningMerge:
        merge = cls()
        merge.add(stats)
        return merge

    def add(self, stats: Mapping[str, Mapping[str, Any]]) -> None:
        """Fold one episode's (or one dataset's) {feature: {min, max, mean, std, count}} in."""
        for feature, stat in stats.items():
            if feature not in self._features:
                self._features[feature] = _FeatureMerge(stat)
            self._features[feature].add(feature, stat)

    def result(self) -> dict[str, dict[str, Any]]:
        return {
            feature: merged.result()
            for feature, merged in self._features.items()
            if merged.count > 0
        }


def merge_stats(
    per_episode: Iterable[Mapping[str, Mapping[str, Any]]],
) -> dict[str, dict[str, Any]]:
    """Dataset stats from per-episode stats (LeRobot's aggregate_stats semantics, exact formula).

    Per feature over the episodes that have it: count-weighted mean, pooled population std
    sqrt(sum_i n_i * (std_i^2 + (mean_i - mean)^2) / N), min of mins, max of maxes, count sum.
    Shapes are preserved ([dim] for vectors, [3][1][1] for images). Quantile keys are dropped.
    """
    by_feature: dict[str, list[Mapping[str, Any]]] = {}
    for episode in per_episode:
        for feature, stat in episode.items():
            by_feature.setdefault(feature, []).append(stat)
    merged: dict[str, dict[str, Any]] = {}
    for feature, stats in by_feature.items():
        counts = [_stat_count(feature, stat) for stat in stats]
        stats = [stat for stat, count in zip(stats, counts, strict=True) if count > 0]
        counts = [count for count in counts if count > 0]
        if not stats:
            continue
        shape_probe = _FeatureMerge(stats[0])
        means = np.stack([shape_probe._field(feature, s, "mean") for s in stats])
        stds = np.stack([shape_probe._field(feature, s, "std") for s in stats])
        mins = np.stack([shape_probe._field(feature, s, "min") for s in stats])
        maxs = np.stack([shape_probe._field(feature, s, "max") for s in stats])
        weights = np.asarray(counts, dtype=np.float64).reshape((-1,) + (1,) * (means.ndim - 1))
        total = sum(counts)
        mean = (weights * means).sum(axis=0) / total
        variance = (weights * (np.square(stds) + np.square(means - mean))).sum(axis=0) / total
        merged[feature] = {
            "min": _to_list(mins.min(axis=0)),
            "max": _to_list(maxs.max(axis=0)),
            "mean": _to_list(mean),
            "std": _to_list(np.sqrt(variance)),
            "count": [int(total)],
        }
    return merged
