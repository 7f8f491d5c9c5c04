"""``eva qc DATASET --rescore``: the review metrics of a saved dataset, computed again.

Each episode's ``quality_metrics``, ``anomaly_score`` and ``anomaly_reasons``
(``eva.dataset.motion_metrics``) are recomputed from its parquet (the action and capture-time
columns) and written into ``meta/episodes.jsonl`` in one atomic rewrite under the meta lock, as
qc verdicts are (``eva.quality.verdicts.update_episode_rows``).

Frozen camera: capture measures it on the raw frames as they arrive. A rescore keeps that
measure when the row has it; otherwise it reads each camera's MP4 sample table (no decoding): a
run of packets no larger than ``FROZEN_PACKET_BYTES`` or 2% of the episode's median packet is a
run of frames the encoder coded as unchanged. Decoding 640x480 video would cost more than the
rest of the rescore together.

A rescore never changes ``quality`` or ``quality_issues``: the red codes of ``metrics.red``
are the capture's, at save time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from eva.dataset import layout, motion_metrics
from eva.dataset.errors import DatasetError
from eva.dataset.features import CAPTURE_TIME
from eva.dataset.mp4box import Mp4Error, read_video_samples
from eva.dataset.reader import DatasetReader
from eva.quality.verdicts import ReviewUpdate, update_episode_rows

FROZEN_PACKET_BYTES = 64  # an H.264/AV1 frame coded as "same as the reference" is this small


def frozen_from_packets(sizes: np.ndarray, keyframes: np.ndarray, fps: float) -> float:
    """Longest run (s) of packets small enough to be frames coded as unchanged. A keyframe
    inside such a run (the GOP restarts) neither ends nor starts it; a video of keyframes only
    says nothing (every frame is coded alone), so 0."""
    if sizes.size < 2 or bool(np.all(keyframes)):
        return 0.0
    limit = max(FROZEN_PACKET_BYTES, 0.02 * float(np.median(sizes[~keyframes])))
    small = (np.asarray(sizes) <= limit) & ~keyframes
    best = run = 0
    for is_small, is_key in zip(small.tolist(), keyframes.tolist(), strict=True):
        if is_small:
            run += 1
            best = max(best, run)
        elif not (is_key and run):
            run = 0
    return float(best + (1 if best else 0)) / fps  # a run of n unchanged frames follows one


def episode_metrics(reader: DatasetReader, row: dict[str, Any]) -> dict[str, Any]:
    """The ``quality_metrics`` of one saved episode (see the module doc for frozen camera)."""
    ep = int(row["episode_index"])
    fps = float(reader.fps)
    features = reader.features
    columns = [c for c in (layout.ACTION, CAPTURE_TIME) if c in features]
    table = reader.read_table(ep, columns)
    action = _matrix(table.column(layout.ACTION)) if layout.ACTION in columns else None
    capture_time = None
    if CAPTURE_TIME in columns:
        capture_time = table.column(CAPTURE_TIME).to_numpy(zero_copy_only=False)
    names = _dim_names(features.get(layout.ACTION))
    stored = row.get(motion_metrics.QUALITY_METRICS)
    frozen = stored.get("frozen_camera_s") if isinstance(stored, dict) else None
    on = motion_metrics.FROZEN_ON_FRAMES
    if not (
        isinstance(frozen, dict)
        and isinstance(stored, dict)
        and stored.get(motion_metrics.FROZEN_ON) == on
    ):
        frozen, on = _frozen_from_videos(reader, ep, fps), motion_metrics.FROZEN_ON_PACKETS
    return motion_metrics.episode_metrics(action, names, fps, capture_time, frozen, frozen_on=on)


def _matrix(column: Any) -> np.ndarray | None:
    """A list column as an (n, dim) float64 array; None when its rows are not one length."""
    n = len(column)
    if n == 0:
        return None
    flat = column.combine_chunks().flatten().to_numpy(zero_copy_only=False)
    if flat.size % n:
        return None
    return np.asarray(flat, dtype=np.float64).reshape(n, -1)


def _dim_names(feature: Any) -> list[str] | None:
    """A vector feature's per-dim names: a list, or LeRobot's ``{"motors": [...]}``."""
    names = feature.get("names") if isinstance(feature, dict) else None
    if isinstance(names, dict) and len(names) == 1:
        names = next(iter(names.values()))
    if isinstance(names, list) and all(isinstance(n, str) for n in names):
        return names
    return None


def _frozen_from_videos(reader: DatasetReader, ep: int, fps: float) -> dict[str, float]:
    frozen = {}
    for key in reader.video_keys:
        try:
            samples = read_video_samples(reader.video_file(ep, key))
        except (Mp4Error, OSError, DatasetError):
            continue  # eva validate names a missing or broken video; the rescore goes on
        frozen[key] = frozen_from_packets(samples.sizes, samples.keyframes, fps)
    return frozen


def rescore(
    root: Path,
    limits: motion_metrics.MetricThresholds | None = None,
    progress: Callable[[int, int], None] | None = None,
    episodes: Sequence[int] | None = None,
) -> list[ReviewUpdate]:
    """Recompute and store the review metrics of every episode (or of ``episodes``)."""
    limits = limits or motion_metrics.MetricThresholds()
    reader = DatasetReader(root)
    rows = {int(r["episode_index"]): r for r in reader.episodes}
    wanted = sorted(rows) if episodes is None else list(episodes)
    fields: dict[int, dict[str, Any]] = {}
    for done, ep in enumerate(wanted, 1):
        if ep not in rows:
            raise DatasetError(f"{Path(root) / layout.EPISODES}: episode {ep} does not exist")
        fields[ep] = motion_metrics.row_fields(episode_metrics(reader, rows[ep]), limits)
        if progress is not None:
            progress(done, len(wanted))

    def change(row: dict[str, Any]) -> None:
        row.update(fields[int(row["episode_index"])])

    return update_episode_rows(root, wanted, change, "rescore")
