"""Automatic quality checks of live capture and the issue records they produce.

The per-stream checks (:class:`StreamCheck`) run incrementally on the samples the consumer pops;
at STOP :func:`validate_episode` checks the aligned totals the consumer tallied
(:class:`EpisodeTally`) and builds the episode's quality record. Any issue makes the episode red.
Codes produced here:

- ``non_monotonic_timestamp``: a sample whose time is not later than the stream's previous one
  (it is left out of alignment, which needs sorted times);
- ``non_finite_value``: a vector sample with NaN/inf values or a non-finite time (left out);
- ``source_clock_discontinuity``: a gap between consecutive samples of a stream larger than
  ``clock_jump_s`` (StreamCheck), or a stream whose samples all end before the grid starts
  (validate_episode: streams on different clocks);
- ``frozen_camera``: a camera delivering identical images for at least ``frozen_camera_s``;
- ``invalid_image_shape`` / ``invalid_vector_dim``: pushed samples of the wrong shape (refused at
  push time, counted);
- ``unexpected_image_stream``: images pushed for a camera the config does not declare;
- ``missing_camera_stream`` / ``missing_configured_column``: a configured camera / vector stream
  that delivered nothing in the episode;
- ``missing_camera``: a camera that delivered, but only after part of the episode was aligned
  (those frames carry black images);
- ``image_skew_exceeded``: grid frames whose nearest image is farther than the tolerance;
- ``episode_too_short``, ``frame_count_mismatch``: from the aligned totals;
- ``capture_backlog_overflow`` (project code): samples refused because the ring hit its hard
  memory limit;
- ``unexpected_vector_stream`` (project code): vector samples pushed for a stream the config does
  not declare.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eva.capture import align
from eva.config import CollectionConfig
from eva.dataset import layout, motion_metrics
from eva.dataset.writer import EpisodeWriter

EPISODE_TOO_SHORT = "episode_too_short"
FRAME_COUNT_MISMATCH = "frame_count_mismatch"
NON_MONOTONIC_TIMESTAMP = "non_monotonic_timestamp"
MISSING_CAMERA = "missing_camera"
INVALID_IMAGE_SHAPE = "invalid_image_shape"
MISSING_CONFIGURED_COLUMN = "missing_configured_column"
INVALID_VECTOR_DIM = "invalid_vector_dim"
NON_FINITE_VALUE = "non_finite_value"
MISSING_CAMERA_STREAM = "missing_camera_stream"
UNEXPECTED_IMAGE_STREAM = "unexpected_image_stream"
IMAGE_SKEW_EXCEEDED = "image_skew_exceeded"
FROZEN_CAMERA = "frozen_camera"
SOURCE_CLOCK_DISCONTINUITY = "source_clock_discontinuity"
CAPTURE_BACKLOG_OVERFLOW = "capture_backlog_overflow"
UNEXPECTED_VECTOR_STREAM = "unexpected_vector_stream"
SOURCE_STALLED = "source_stalled"  # a source process died or delivered nothing for its timeout

log = logging.getLogger(__name__)


def _same_image(a: np.ndarray, b: np.ndarray) -> bool:
    """Exact equality, checking a sparse pixel grid first: live images almost always differ
    there, which spares the full-frame comparison (and its frame-sized temporary)."""
    if not np.array_equal(a[::7, ::7], b[::7, ::7]):
        return False
    return bool(np.array_equal(a, b))


def issue(code: str, detail: str) -> dict[str, str]:
    return {"severity": "red", "code": code, "detail": detail}


@dataclass
class IssueLog:
    """Issues of one episode, at most one record per (code, stream) with an occurrence count."""

    _issues: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    def add(self, code: str, stream: str, detail: str, count: int = 1) -> None:
        key = (code, stream)
        if key in self._issues:
            self._issues[key]["count"] += count
        else:
            self._issues[key] = {"detail": detail, "count": count}

    def records(self) -> list[dict[str, str]]:
        out = []
        for (code, _stream), entry in self._issues.items():
            detail = entry["detail"]
            if entry["count"] > 1:
                detail += f" ({entry['count']} occurrences in total)"
            out.append(issue(code, detail))
        return out


@dataclass
class StreamCheck:
    """Incremental per-stream checks over popped samples; returns the usable ones."""

    stream: str
    kind: str  # "camera" | "vector"
    clock_jump_s: float
    frozen_s: float = 0.0
    last_time: float = -np.inf
    samples_seen: int = 0
    usable: int = 0
    frozen_since: float | None = None
    frozen_since_sample: int = 0
    frozen_flagged: bool = False
    longest_frozen_s: float = 0.0  # the episode's longest run of identical images (metrics)
    _prev_frame: np.ndarray | None = None
    _prev_t: float = 0.0
    _prev_sample: int = 0  # number of the sample _prev_frame holds

    def filter(
        self,
        times: np.ndarray,
        values: np.ndarray,
        issues: IssueLog,
        frame_at: Callable[[float], str],
    ) -> np.ndarray:
        """Boolean mask of the samples in ``times``/``values`` that may be aligned.

        ``frame_at(t)`` names the approximate grid frame of a time for the details.
        """
        n = times.shape[0]
        finite_t = np.isfinite(times)
        prior = np.maximum.accumulate(
            np.concatenate([[self.last_time], np.where(finite_t, times, -np.inf)])
        )[:-1]
        ordered = finite_t & (times > prior)
        ok: np.ndarray = ordered.copy()
        base = self.samples_seen
        bad_order = np.flatnonzero(finite_t & ~ordered)
        if bad_order.size:
            i = int(bad_order[0])
            issues.add(
                NON_MONOTONIC_TIMESTAMP,
                self.stream,
                f"{self.kind} {self.stream}: sample {base + i} at t={times[i]:.6f} s is not after "
                f"the previous sample (t={prior[i]:.6f} s){frame_at(prior[i])}; left out",
                int(bad_order.size),
            )
        if not finite_t.all():
            i = int(np.flatnonzero(~finite_t)[0])
            issues.add(
                NON_FINITE_VALUE,
                self.stream,
                f"{self.kind} {self.stream}: sample {base + i} has a non-finite timestamp; left out",
                int((~finite_t).sum()),
            )
        if self.kind == "vector" and n:
            finite_v = np.isfinite(values.reshape(n, -1)).all(axis=1)
            bad = np.flatnonzero(~finite_v & finite_t)
            if bad.size:
                i = int(bad[0])
                dims = np.flatnonzero(~np.isfinite(values.reshape(n, -1)[i])).tolist()
                issues.add(
                    NON_FINITE_VALUE,
                    self.stream,
                    f"vector {self.stream}: sample {base + i} at t={times[i]:.6f} s has "
                    f"non-finite values in dims {dims}{frame_at(times[i])}; left out",
                    int(bad.size),
                )
            ok &= finite_v
        good = np.flatnonzero(ok)
        if good.size:
            seq = np.concatenate([[self.last_time], times[good]])
            gaps = np.diff(seq)
            if self.usable == 0:
                gaps[0] = 0.0
            jumps = np.flatnonzero(gaps > self.clock_jump_s)
            if jumps.size:
                j = int(jumps[0])
                i = int(good[j])
                issues.add(
                    SOURCE_CLOCK_DISCONTINUITY,
                    self.stream,
                    f"{self.kind} {self.stream}: {gaps[j]:.3f} s gap before sample {base + i} "
                    f"(t={times[i]:.6f} s){frame_at(times[i])}, limit {self.clock_jump_s} s",
                    int(jumps.size),
                )
            self.last_time = float(times[good[-1]])
            if self.kind == "camera" and self.frozen_s > 0:
                self._check_frozen(times, values, good, issues, frame_at)
        self.samples_seen += n
        self.usable += int(good.size)
        return ok

    def _check_frozen(
        self,
        times: np.ndarray,
        frames: np.ndarray,
        good: np.ndarray,
        issues: IssueLog,
        frame_at: Callable[[float], str],
    ) -> None:
        for i in good:
            frame = frames[i]
            t = float(times[i])
            prev = self._prev_frame
            if prev is not None and _same_image(prev, frame):
                if self.frozen_since is None:
                    self.frozen_since = self._prev_t
                    self.frozen_since_sample = self._prev_sample
                self.longest_frozen_s = max(self.longest_frozen_s, t - self.frozen_since)
                if not self.frozen_flagged and t - self.frozen_since >= self.frozen_s:
                    self.frozen_flagged = True
                    issues.add(
                        FROZEN_CAMERA,
                        self.stream,
                        f"camera {self.stream}: identical images from sample "
                        f"{self.frozen_since_sample} (t={self.frozen_since:.3f} s)"
                        f"{frame_at(self.frozen_since)} for at least {self.frozen_s} s",
                    )
            else:
                self.frozen_since = None
                if prev is None:
                    self._prev_frame = frame.copy()
                else:
                    np.copyto(prev, frame)
            self._prev_t = t
            self._prev_sample = self.samples_seen + int(i)


@dataclass
class EpisodeTally:
    """What the consumer counted over one aligned episode: the input of :func:`validate_episode`.

    Per-stream dicts are keyed by stream name (cameras by their feature key); ``cameras`` and
    ``vectors`` list the configured streams in config order, which is the order of the issues.
    """

    fps: float
    skew_tolerance_s: float
    rows: int  # grid rows aligned and written
    cameras: list[str]
    vectors: list[str]
    kinds: dict[str, str]  # "camera" | "vector"
    samples_seen: dict[str, int]
    first_t: dict[str, float]  # first usable sample time, streams that delivered
    last_t: dict[str, float]
    grid_start: float | None
    late_rows: dict[str, int]  # rows aligned before a late stream's first sample
    skew_count: dict[str, int]
    skew_first: dict[str, int]
    skew_max: dict[str, float]
    skew_sum: dict[str, float]
    bad_shapes: dict[str, tuple[int, str]]  # samples refused at push: count, first detail
    stalls: dict[str, str]
    unexpected: dict[str, int]  # samples pushed for streams the config does not declare
    refused: dict[str, int]  # samples refused past the backlog's hard limit, every stream
    high_water: dict[str, int]
    started_at: str
    ended_at: str | None
    duration_seconds: float


def validate_episode(
    tally: EpisodeTally, issues: IssueLog, cfg: CollectionConfig, frame_at: Callable[[float], str]
) -> dict[str, Any]:
    """Add the checks of the aligned totals to ``issues``; the episode's quality record (the
    ``quality``, ``quality_issues``, timing, ``alignment`` and ``capture_backlog`` fields of its
    row in episodes.jsonl)."""
    _check_streams_arrived(tally, issues)
    _check_refused_samples(tally, issues, cfg, frame_at)
    _check_grid(tally, issues, cfg)
    records = issues.records()
    return {
        "quality": "red" if records else "green",
        "quality_issues": records,
        "started_at": tally.started_at,
        "ended_at": tally.ended_at,
        "duration_seconds": round(tally.duration_seconds, 6),
        "alignment": _alignment(tally),
        "capture_backlog": {
            "high_water": tally.high_water,
            "refused": tally.refused,
        },
    }


def add_metrics(
    row: dict[str, Any],
    cfg: CollectionConfig,
    episode: EpisodeWriter,
    checks: Mapping[str, StreamCheck],
) -> None:
    """Put the save-time motion and content metrics, the anomaly score and its reasons into
    the quality record ``row``; a metric the rig enables in ``metrics.red`` adds its red issue."""
    try:
        _add_metrics(row, cfg, episode, checks)
    except Exception as e:  # a metric must never cost the episode: it is saved without them
        log.warning("capture: review metrics not computed: %s", e)


def _add_metrics(
    row: dict[str, Any],
    cfg: CollectionConfig,
    episode: EpisodeWriter,
    checks: Mapping[str, StreamCheck],
) -> None:
    vectors, capture_time = episode.recorded_columns()
    spec = next((v for v in cfg.vectors if v.name == layout.ACTION), None)
    frozen = None
    if cfg.frozen_camera_s > 0:  # the frozen check (and its run length) is off at 0
        frozen = {c.key: checks[c.key].longest_frozen_s for c in cfg.cameras if c.key in checks}
    metrics = motion_metrics.episode_metrics(
        vectors.get(layout.ACTION),
        spec.names if spec is not None else None,
        cfg.fps,
        capture_time,
        frozen,
        cfg.metrics.idle_delta,
    )
    row.update(motion_metrics.row_fields(metrics, cfg.metrics))
    red = motion_metrics.red_issues(metrics, cfg.metrics)
    if red:
        row["quality_issues"] = [*row["quality_issues"], *red]
        row["quality"] = "red"


def _check_streams_arrived(tally: EpisodeTally, issues: IssueLog) -> None:
    """Streams that delivered nothing, or started after the grid did; cameras off the grid."""
    rows = tally.rows
    for name in tally.cameras:
        if name not in tally.first_t:
            issues.add(
                MISSING_CAMERA_STREAM,
                name,
                f"camera {name}: no image arrived during the episode"
                + (f"; its {rows} frames are black" if rows else ""),
            )
        elif name in tally.late_rows:
            k = tally.late_rows[name]
            issues.add(
                MISSING_CAMERA,
                name,
                f"camera {name}: no image for frames 0-{k - 1} (the stream started "
                f"{tally.first_t[name] - (tally.grid_start or 0.0):.3f} s late); they are black",
            )
        if tally.skew_count.get(name):
            issues.add(
                IMAGE_SKEW_EXCEEDED,
                name,
                f"camera {name}: {tally.skew_count[name]} frames (first: frame "
                f"{tally.skew_first[name]}) whose nearest image is farther than "
                f"{tally.skew_tolerance_s * 1e3:.1f} ms from the grid (max {tally.skew_max[name] * 1e3:.1f} ms)",
            )
    for name in tally.vectors:
        if name not in tally.first_t:
            issues.add(
                MISSING_CONFIGURED_COLUMN,
                name,
                f"vector {name}: no sample arrived during the episode; column is zeros",
            )
        elif name in tally.late_rows:
            k = tally.late_rows[name]
            issues.add(
                MISSING_CONFIGURED_COLUMN,
                name,
                f"vector {name}: no sample for frames 0-{k - 1} (stream started late); "
                "they are zeros",
            )


def _check_refused_samples(
    tally: EpisodeTally, issues: IssueLog, cfg: CollectionConfig, frame_at: Callable[[float], str]
) -> None:
    """Samples that were not recorded: bad shapes, stalls, undeclared streams, a full backlog."""
    for name, (count, detail) in tally.bad_shapes.items():
        kind = tally.kinds[name]
        code = INVALID_IMAGE_SHAPE if kind == "camera" else INVALID_VECTOR_DIM
        what = "camera" if kind == "camera" else "vector"
        issues.add(code, name, f"{what} {name}: {count} samples refused: {detail}")
    for name, detail in tally.stalls.items():
        what = "camera" if tally.kinds[name] == "camera" else "stream"
        issues.add(
            SOURCE_STALLED,
            name,
            f"{what} {name} stalled{frame_at(tally.last_t.get(name, math.nan))}: {detail}",
        )
    for key, count in tally.unexpected.items():
        if key.startswith("vector:"):
            issues.add(
                UNEXPECTED_VECTOR_STREAM,
                key,
                f"vector stream {key[7:]!r} is not in the config: {count} samples ignored",
            )
        else:
            issues.add(
                UNEXPECTED_IMAGE_STREAM,
                key,
                f"camera {key!r} is not in the config: {count} images ignored",
            )
    for name, count in tally.refused.items():
        if count:
            issues.add(
                CAPTURE_BACKLOG_OVERFLOW,
                name,
                f"stream {name}: {count} samples refused: the capture backlog reached its "
                f"hard memory limit ({cfg.backlog.max_memory_mb:g} MB over all cameras)",
            )


def _check_grid(tally: EpisodeTally, issues: IssueLog, cfg: CollectionConfig) -> None:
    """The aligned grid against the streams' span: clocks apart, frames lost, too short."""
    rows = tally.rows
    if tally.grid_start is not None:
        # A stream whose samples all end before the grid starts runs on another clock.
        for name, last in tally.last_t.items():
            if last < tally.grid_start - cfg.clock_jump_s:
                starter = max(tally.first_t, key=tally.first_t.__getitem__)
                issues.add(
                    SOURCE_CLOCK_DISCONTINUITY,
                    name,
                    f"stream {name}: its samples end at t={last:.3f} s, before stream "
                    f"{starter} starts at t={tally.grid_start:.3f} s: are they on one clock?",
                )
    if tally.grid_start is not None and tally.last_t:
        expected = align.grid_length(tally.grid_start, min(tally.last_t.values()), tally.fps)
        if expected != rows:
            issues.add(
                FRAME_COUNT_MISMATCH,
                "episode",
                f"aligned {rows} frames but the streams' common span holds {expected} grid "
                "instants",
            )
    if 0 < rows < cfg.min_episode_frames:
        issues.add(
            EPISODE_TOO_SHORT,
            "episode",
            f"episode has {rows} frames, fewer than min_episode_frames={cfg.min_episode_frames}",
        )


def _alignment(tally: EpisodeTally) -> dict[str, Any]:
    rows = tally.rows
    return {
        "fps": tally.fps,
        "grid_start": tally.grid_start,
        "grid_end": min(tally.last_t.values()) if tally.last_t else None,
        "skew_tolerance_s": tally.skew_tolerance_s,
        "cameras": {
            name: {
                "samples": tally.samples_seen[name],
                "max_skew_s": tally.skew_max[name],
                "mean_skew_s": tally.skew_sum[name] / rows if rows else 0.0,
                "skew_violations": tally.skew_count[name],
            }
            for name in tally.cameras
        },
        "vectors": {name: {"samples": tally.samples_seen[name]} for name in tally.vectors},
    }
