"""Motion and content metrics of one episode, and the anomaly score that orders review.

Computed from data eva already holds: the action column, the vector's per-dim ``names``, the
first camera's capture times and each camera's longest run of identical frames. Capture computes
them when an episode is saved (``eva.capture.consumer``); ``eva qc DATASET --rescore`` recomputes
them for a saved dataset (``eva.quality.rescore``). Definitions, defaults and config keys are in
docs/capture.md ("Motion and content metrics").

The score orders the review queue (worst first); it never decides accepted or rejected. A metric
adds a red ``quality_issues`` code only when the rig config names it in ``metrics.red``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

QUALITY_METRICS = "quality_metrics"
ANOMALY_SCORE = "anomaly_score"
ANOMALY_REASONS = "anomaly_reasons"
TOP_REASONS = 3
FROZEN_ON = "frozen_camera_measured_on"
FROZEN_ON_FRAMES, FROZEN_ON_PACKETS = "frames", "packets"

# metric -> the red quality_issues code it adds when metrics.red names it
RED_CODES: dict[str, str] = {
    "idle": "idle_span",
    "jerk": "jerky_action",
    "gripper_chatter": "gripper_chatter",
    "saturation": "action_saturated",
    "frozen_camera": "frozen_camera_metric",
    "duplicated_frames": "duplicated_frames",
    "missing_frames": "missing_frames",
}


@dataclass(frozen=True)
class MetricThresholds:
    """The limits past which a metric counts toward the anomaly score (``collection.metrics``)."""

    idle_delta: float = 1e-3  # largest per-frame action change (any dim) that still counts idle
    idle_s: float = 1.0  # idle spans at least this long count
    jerk_ldj: float = -18.0  # log dimensionless jerk below this counts (more negative: jerkier)
    chatter_hz: float = 2.0  # gripper direction reversals per second above this count
    saturation_s: float = 0.5  # time a dim stays at its episode min or max beyond this counts
    frozen_s: float = 0.5  # identical consecutive frames over this span count
    duplicated_frames: int = 2  # grid rows reusing the previous row's image beyond this count
    missing_frames: int = 2  # grid instants with no image of their own beyond this count
    red: tuple[str, ...] = ()  # metrics that also add a red quality_issues code


def _longest_run(mask: np.ndarray) -> tuple[int, int]:
    """(length, start) of the longest run of True in ``mask``; (0, 0) when none."""
    if not mask.any():
        return 0, 0
    padded = np.concatenate([[False], mask, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    starts, ends = edges[::2], edges[1::2]
    k = int(np.argmax(ends - starts))
    return int(ends[k] - starts[k]), int(starts[k])


def idle_span(action: np.ndarray, fps: float, delta: float) -> tuple[float, str]:
    """Longest span (s) with no action change above ``delta`` in any dim, and where it lies."""
    if action.shape[0] < 2:
        return 0.0, "none"
    still = np.abs(np.diff(action, axis=0)).max(axis=1) <= delta
    length, start = _longest_run(still)
    if length == 0:
        return 0.0, "none"
    where = "start" if start == 0 else "end" if start + length == still.size else "middle"
    return length / fps, where


def log_dimensionless_jerk(action: np.ndarray, fps: float, window_s: float = 2.0) -> float | None:
    """The worst (lowest) log dimensionless jerk over ``window_s`` windows (half overlapping)
    of the action's velocity over all its dims: -ln(T^3 / v_peak^2 * integral |jerk|^2 dt).

    Per window, so the value does not drift with the episode's length and a jerky second stands
    out; v_peak is taken on a 5-frame moving average, so sensor noise raises the jerk, not the
    peak speed it is divided by."""
    x = action.astype(np.float64)
    width = max(int(round(window_s * fps)), 8)
    if x.shape[0] < 8:
        return None
    worst: float | None = None
    for start in range(0, max(x.shape[0] - width, 0) + 1, max(width // 2, 1)):
        value = _window_ldj(x[start : start + width], fps)
        if value is not None and (worst is None or value < worst):
            worst = value
    return worst


def _window_ldj(x: np.ndarray, fps: float) -> float | None:
    dt = 1.0 / fps
    sums = np.cumsum(np.vstack([np.zeros((1, x.shape[1])), x]), axis=0)
    smooth = (sums[5:] - sums[:-5]) / 5.0
    sv = np.diff(smooth, axis=0) / dt
    peak = float(np.sqrt((sv * sv).sum(axis=1)).max()) if sv.size else 0.0
    v = np.diff(x, axis=0) / dt
    jerk = np.diff(v, n=2, axis=0) / (dt * dt)
    integral = float((jerk * jerk).sum()) * dt
    if peak <= 0.0 or integral <= 0.0:
        return None
    return -math.log(((x.shape[0] - 1) * dt) ** 3 / (peak * peak) * integral)


def gripper_dims(names: Sequence[str] | None) -> list[int]:
    """Dims whose vector name says gripper."""
    return [i for i, n in enumerate(names or ()) if "gripper" in str(n).lower()]


def gripper_chatter(action: np.ndarray, fps: float, dims: Sequence[int]) -> float:
    """Most direction reversals per second of any gripper dim (moves of at most 1e-6 ignored)."""
    if not dims or action.shape[0] < 3:
        return 0.0
    seconds = action.shape[0] / fps
    worst = 0.0
    for d in dims:
        step = np.diff(action[:, d].astype(np.float64))
        signs = np.sign(step[np.abs(step) > 1e-6])
        reversals = int((signs[1:] != signs[:-1]).sum()) if signs.size > 1 else 0
        worst = max(worst, reversals / seconds)
    return worst


def saturation(action: np.ndarray, fps: float, skip: Sequence[int]) -> tuple[float, int | None]:
    """Longest time (s) a dim (grippers skipped: they rest at their ends) holds its episode min
    or max, and that dim."""
    best, best_dim = 0, None
    for d in range(action.shape[1]):
        if d in skip:
            continue
        col = action[:, d]
        lo, hi = col.min(), col.max()
        if hi - lo <= 0:
            continue  # a constant dim is idle, not saturated
        tol = (hi - lo) * 1e-4
        run = max(_longest_run(col >= hi - tol)[0], _longest_run(col <= lo + tol)[0])
        if run > best:
            best, best_dim = run, d
    return best / fps, best_dim


def grid_frames(capture_time: np.ndarray | None, fps: float) -> tuple[int, int]:
    """(duplicated, missing) grid rows from the first camera's capture times: a row reusing the
    previous row's image, and grid instants skipped between two rows."""
    if capture_time is None or capture_time.size < 2:
        return 0, 0
    step = np.diff(capture_time.astype(np.float64)) * fps
    reused = step < 0.5
    duplicated = int(reused.sum())
    # the step after a reused image spans two instants: the reuse already counted that one
    after_reuse = np.concatenate([[False], reused[:-1]])
    gaps = step[(step > 1.5) & ~after_reuse]
    missing = int(np.maximum(np.rint(gaps) - 1, 0).sum())
    return duplicated, missing


def episode_metrics(
    action: np.ndarray | None,
    names: Sequence[str] | None,
    fps: float,
    capture_time: np.ndarray | None,
    frozen_s: Mapping[str, float] | None,
    idle_delta: float = MetricThresholds.idle_delta,
    frozen_on: str = FROZEN_ON_FRAMES,
) -> dict[str, Any]:
    """The ``quality_metrics`` record of one episode (JSON-ready; None where not measurable).
    ``frozen_on`` says what ``frozen_s`` was measured on: the raw frames (capture) or the MP4
    packets (a rescore of an episode saved without the metrics)."""
    metrics: dict[str, Any] = {}
    if action is not None and action.ndim == 2 and action.shape[0] > 0:
        grippers = gripper_dims(names)
        idle, where = idle_span(action, fps, idle_delta)
        metrics["idle_s"] = round(idle, 4)
        metrics["idle_where"] = where
        moving = [d for d in range(action.shape[1]) if d not in grippers]  # grippers step
        ldj = log_dimensionless_jerk(action[:, moving], fps) if moving else None
        metrics["jerk_ldj"] = None if ldj is None else round(ldj, 4)
        metrics["gripper_chatter_hz"] = round(gripper_chatter(action, fps, grippers), 4)
        sat, dim = saturation(action, fps, grippers)
        metrics["saturation_s"] = round(sat, 4)
        metrics["saturation_dim"] = (
            None if dim is None else (str(names[dim]) if names and dim < len(names) else dim)
        )
    duplicated, missing = grid_frames(capture_time, fps)
    metrics["duplicated_frames"] = duplicated
    metrics["missing_frames"] = missing
    if frozen_s is not None:
        metrics["frozen_camera_s"] = {k: round(float(v), 4) for k, v in frozen_s.items()}
        metrics[FROZEN_ON] = frozen_on
    return metrics


def score(metrics: Mapping[str, Any], limits: MetricThresholds) -> tuple[float, list[str]]:
    """(anomaly score, top reasons): each metric past its limit adds measured/limit (>= 1),
    reasons worst first. 0.0 and no reason for an episode within every limit."""
    found: list[tuple[float, str, str]] = []  # (ratio, metric, reason)

    def over(name: str, ratio: float, reason: str) -> None:
        if ratio >= 1.0 and math.isfinite(ratio):
            found.append((ratio, name, reason))

    idle = _num(metrics.get("idle_s"))
    if idle is not None and limits.idle_s > 0:
        where = metrics.get("idle_where")
        over(
            "idle",
            idle / limits.idle_s,
            f"idle {idle:.1f} s at {where} (limit {limits.idle_s:g} s)",
        )
    ldj = _num(metrics.get("jerk_ldj"))
    if ldj is not None:
        over(
            "jerk",
            math.exp(min(limits.jerk_ldj - ldj, 50.0)),
            f"jerky action: log dimensionless jerk {ldj:.1f} (limit {limits.jerk_ldj:g})",
        )
    chatter = _num(metrics.get("gripper_chatter_hz"))
    if chatter is not None and limits.chatter_hz > 0:
        over(
            "gripper_chatter",
            chatter / limits.chatter_hz,
            f"gripper chatter {chatter:.1f} reversals/s (limit {limits.chatter_hz:g})",
        )
    sat = _num(metrics.get("saturation_s"))
    if sat is not None and limits.saturation_s > 0:
        over(
            "saturation",
            sat / limits.saturation_s,
            f"action {metrics.get('saturation_dim')} at its limit {sat:.1f} s "
            f"(limit {limits.saturation_s:g} s)",
        )
    frozen = metrics.get("frozen_camera_s")
    if isinstance(frozen, Mapping) and frozen and limits.frozen_s > 0:
        cam, span = max(((k, _num(v) or 0.0) for k, v in frozen.items()), key=lambda kv: kv[1])
        over(
            "frozen_camera",
            span / limits.frozen_s,
            f"camera {cam} frozen {span:.1f} s (limit {limits.frozen_s:g} s)",
        )
    for name in ("duplicated_frames", "missing_frames"):
        count = _num(metrics.get(name))
        limit = getattr(limits, name)
        if count is not None and count > limit:
            over(
                name, count / max(limit, 1), f"{count:.0f} {name.replace('_', ' ')} (limit {limit})"
            )
    found.sort(key=lambda f: -f[0])
    return round(float(sum(f[0] for f in found)), 3), [f[2] for f in found[:TOP_REASONS]]


def red_issues(metrics: Mapping[str, Any], limits: MetricThresholds) -> list[dict[str, str]]:
    """The red quality_issues records of the metrics the rig config enables (``metrics.red``)."""
    if not limits.red:
        return []
    out = []
    for name in limits.red:
        solo = MetricThresholds(**{**_only(name, limits)})
        _, reasons = score(metrics, solo)
        if reasons:
            out.append({"severity": "red", "code": RED_CODES[name], "detail": reasons[0]})
    return out


def _only(name: str, limits: MetricThresholds) -> dict[str, Any]:
    """``limits`` with every metric but ``name`` switched off."""
    off: dict[str, Any] = {
        "idle_s": 0.0,
        "chatter_hz": 0.0,
        "saturation_s": 0.0,
        "frozen_s": 0.0,
        "jerk_ldj": -math.inf,
        "duplicated_frames": 1 << 62,
        "missing_frames": 1 << 62,
    }
    keep = {
        "idle": ("idle_s",),
        "jerk": ("jerk_ldj",),
        "gripper_chatter": ("chatter_hz",),
        "saturation": ("saturation_s",),
        "frozen_camera": ("frozen_s",),
        "duplicated_frames": ("duplicated_frames",),
        "missing_frames": ("missing_frames",),
    }[name]
    fields = {k: getattr(limits, k) for k in off}
    fields.update({k: v for k, v in off.items() if k not in keep})
    return {**fields, "idle_delta": limits.idle_delta, "red": ()}


def row_fields(metrics: dict[str, Any], limits: MetricThresholds) -> dict[str, Any]:
    """The episodes.jsonl fields: ``quality_metrics``, ``anomaly_score``, ``anomaly_reasons``."""
    value, reasons = score(metrics, limits)
    return {QUALITY_METRICS: metrics, ANOMALY_SCORE: value, ANOMALY_REASONS: reasons}


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
