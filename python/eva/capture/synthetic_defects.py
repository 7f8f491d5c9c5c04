"""Synthetic episodes with seeded bad-demonstration defects: the test set of the review queue.

``write_defect_dataset`` writes a raw v2.1 dataset like ``write_synthetic_dataset`` (the same
scenes and joint signals) through the real ``DatasetWriter``, with a defect injected into the
episodes it is told: the kinds the review metrics look for (``eva.dataset.motion_metrics``).
Capture would store the metrics at save time; here ``eva qc --rescore`` computes them, as for
any dataset recorded before them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from eva.capture.synthetic import (
    SyntheticScene,
    gripper_dims,
    joint_actions,
    joint_names,
    joint_states,
)
from eva.dataset import layout
from eva.dataset.video import VideoOptions
from eva.dataset.writer import CameraSpec, DatasetWriter, VectorSpec

DEFECTS = (
    "idle",
    "jerk",
    "gripper_chatter",
    "saturation",
    "frozen_camera",
    "duplicated_frames",
    "missing_frames",
)


def inject(
    kind: str,
    images: dict[str, np.ndarray],
    action: np.ndarray,
    capture_time: np.ndarray,
    fps: int,
    rng: np.random.Generator,
) -> None:
    """Put one defect of ``kind`` into a whole episode's arrays, in place."""
    n = action.shape[0]
    span = min(int(2 * fps), n // 2)  # the defect lasts 2 s (at most half the episode)
    at = int(rng.integers(0, n - span + 1))
    arms = [d for d in range(action.shape[1]) if d not in gripper_dims(action.shape[1])]
    if kind == "idle":
        action[at : at + span] = action[at]
    elif kind == "jerk":
        action[at : at + span, arms] += rng.normal(0, 0.08, (span, len(arms))).astype(np.float32)
    elif kind == "gripper_chatter":
        g = gripper_dims(action.shape[1])[0]
        action[at : at + span, g] = (np.arange(span) // 2 % 2).astype(np.float32)
    elif kind == "saturation":
        d = arms[int(rng.integers(0, len(arms)))]
        col = action[:, d]
        np.minimum(col, np.quantile(col, 0.6), out=col)  # pinned at a limit 40% of the time
    elif kind == "frozen_camera":
        cam = images[sorted(images)[0]]
        cam[at : at + span] = cam[at]
    elif kind == "duplicated_frames":
        for k in range(at + 1, at + span, 4):  # a row reusing the previous row's image
            capture_time[k] = capture_time[k - 1]
            for frames in images.values():
                frames[k] = frames[k - 1]
    elif kind == "missing_frames":
        capture_time[at:] += 6.0 / fps  # six grid instants with no image of their own
    else:
        raise ValueError(f"unknown defect {kind!r}; known: {', '.join(DEFECTS)}")


def write_defect_dataset(
    root: Path | str,
    *,
    episodes: int,
    defects: Mapping[int, str],
    frames: int = 120,
    cameras: int = 1,
    width: int = 64,
    height: int = 48,
    fps: int = 30,
    dim: int = 14,
    seed: int = 0,
    video: VideoOptions | None = None,
) -> Path:
    """A dataset of ``episodes`` episodes, ``defects`` (episode index -> kind) injected."""
    root = Path(root)
    keys = [f"observation.images.cam{c}" for c in range(cameras)]
    writer = DatasetWriter.create_or_open(
        root,
        fps=fps,
        cameras=[CameraSpec(k, height, width) for k in keys],
        vectors=[
            VectorSpec(layout.STATE, dim, joint_names(dim)),
            VectorSpec(layout.ACTION, dim, joint_names(dim)),
        ],
        robot_type="synthetic_aloha",
        video=video,
    )
    with writer:
        for ep in range(episodes):
            scenes = [
                SyntheticScene(height, width, seed=seed * 1000 + c * 101 + ep)
                for c in range(cameras)
            ]
            images = {k: s.frames(0, frames) for k, s in zip(keys, scenes, strict=True)}
            state = joint_states(0, frames, dim=dim, fps=fps, seed=seed, episode=ep)
            action = joint_actions(0, frames, dim=dim, fps=fps, seed=seed, episode=ep)
            jitter = np.random.default_rng([seed, ep]).uniform(0, 0.2, frames)
            capture_time = 1000.0 + ep * 100.0 + (np.arange(frames) + jitter) / fps
            if ep in defects:
                rng = np.random.default_rng([seed, ep, 31])
                inject(defects[ep], images, action, capture_time, fps, rng)
            episode = writer.begin_episode("pick the red cube")
            try:
                episode.add_frames(
                    images=images,
                    vectors={layout.STATE: state, layout.ACTION: action},
                    capture_time=capture_time,
                )
                episode.commit({"quality": "green", "quality_issues": []})
            except BaseException:
                episode.abort()
                raise
    return root
