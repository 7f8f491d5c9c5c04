"""Deterministic synthetic robot data: camera scenes, joint trajectories, whole raw datasets.

Everything is a pure function of (seed, frame index), independent of how the frames are batched,
so a test can regenerate the exact input of any frame and compare it with what was read back.

* ``SyntheticScene``: a scrolling textured background, a moving coloured block and per-frame
  noise, so H.264 has real motion and texture to code (not a flat image it compresses to nothing).
  Numpy slices, frame by frame: cheaper than encoding the frame.
* ``joint_states`` / ``joint_actions``: smooth multi-sine joint angles plus gripper dimensions that
  open and close in steps (default 14 dims = 2 arms x (6 joints + gripper), ALOHA-style).
* ``write_synthetic_dataset``: a complete raw v2.1 dataset through ``DatasetWriter`` with chosen
  quality flags, issues, QC verdicts and tasks.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eva.dataset import layout
from eva.dataset.video import VideoOptions
from eva.dataset.writer import CameraSpec, DatasetWriter, VectorSpec

__all__ = [
    "DEFAULT_CAMERAS",
    "DEFAULT_TASKS",
    "SyntheticScene",
    "default_issue",
    "gripper_dims",
    "joint_actions",
    "joint_names",
    "joint_states",
    "write_synthetic_dataset",
]

DEFAULT_CAMERAS: tuple[str, ...] = ("observation.images.front",)
DEFAULT_TASKS: tuple[str, ...] = ("pick the red cube",)
STATE = layout.STATE
ACTION = layout.ACTION
_NOISE_BANK = 8
_EPOCH = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)


class SyntheticScene:
    """A moving, textured, noisy RGB scene; ``frames(start, n)`` is deterministic per index."""

    def __init__(
        self,
        height: int = 48,
        width: int = 64,
        *,
        seed: int = 0,
        noise: int = 6,
        speed: float = 1.0,
    ) -> None:
        self.height = int(height)
        self.width = int(width)
        self.noise = int(noise)
        self.speed = float(speed)
        rng = np.random.default_rng(seed)
        th, tw = 2 * self.height, 2 * self.width
        # Texture: coarse random blocks (upsampled) + diagonal stripes + a colour gradient.
        coarse = rng.integers(40, 200, size=(th // 8 + 1, tw // 8 + 1, 3)).astype(np.int16)
        blocks = np.repeat(np.repeat(coarse, 8, axis=0), 8, axis=1)[:th, :tw]
        yy, xx = np.mgrid[0:th, 0:tw]
        stripes = (((xx + yy) // 6) % 2 * 40 - 20).astype(np.int16)
        gradient = np.stack(
            [xx * 60 // tw, yy * 60 // th, (xx + yy) * 30 // (tw + th)], axis=-1
        ).astype(np.int16)
        self._texture = np.clip(blocks + stripes[..., None] + gradient - 30, 0, 255).astype(
            np.uint8
        )
        self._noise = (
            rng.integers(
                -self.noise, self.noise + 1, size=(_NOISE_BANK, self.height, self.width, 3)
            )
            if self.noise > 0
            else np.zeros((_NOISE_BANK, self.height, self.width, 3))
        ).astype(np.int16)
        self._colour = rng.integers(0, 256, size=3).astype(np.int16)
        self._phase = rng.uniform(0, 2 * np.pi, size=2)
        # The texture repeated to (3H, 3W): every scrolled window (offset < 2H, 2W) is one slice.
        self._tiled = np.ascontiguousarray(
            np.tile(self._texture, (2, 2, 1))[: 3 * self.height, : 3 * self.width]
        )

    def frames(self, start: int, n: int) -> np.ndarray:
        """Frames ``start .. start+n-1`` as a new (n, H, W, 3) uint8 array."""
        h, w = self.height, self.width
        t = np.arange(start, start + n, dtype=np.float64) * self.speed
        dy = np.round(t * 0.7).astype(np.int64) % (2 * h)
        dx = np.round(t * 1.3).astype(np.int64) % (2 * w)
        # A coloured block on a Lissajous path.
        size_y, size_x = max(2, h // 4), max(2, w // 4)
        cy = ((np.sin(t * 0.11 + self._phase[0]) + 1) / 2 * (h - size_y)).astype(np.int64)
        cx = ((np.sin(t * 0.07 + self._phase[1]) + 1) / 2 * (w - size_x)).astype(np.int64)
        # Frame by frame with slices into one reused int16 buffer: a gather through index arrays
        # and a whole-batch block mask cost 10x more (the suite writes thousands of frames).
        frames = np.empty((n, h, w, 3), np.uint8)
        frame = np.empty((h, w, 3), np.int16)
        for i in range(n):
            y, x = int(dy[i]), int(dx[i])
            np.copyto(frame, self._tiled[y : y + h, x : x + w])
            # the block's rows cy .. cy+size_y-1 and columns cx .. that lie inside the frame
            y0, y1 = max(int(cy[i]), 0), min(max(int(cy[i]) + size_y, 0), h)
            x0, x1 = max(int(cx[i]), 0), min(max(int(cx[i]) + size_x, 0), w)
            frame[y0:y1, x0:x1] = self._colour
            frame += self._noise[(start + i) % _NOISE_BANK]
            np.clip(frame, 0, 255, out=frame)
            frames[i] = frame
        return frames


def gripper_dims(dim: int) -> list[int]:
    """Gripper positions: 14 -> [6, 13] (two 7-dof arms), 7 -> [6], else the last dim."""
    if dim >= 14 and dim % 7 == 0:
        return [k * 7 + 6 for k in range(dim // 7)]
    if dim == 7:
        return [6]
    return [dim - 1] if dim >= 2 else []


def joint_names(dim: int) -> list[str]:
    """Readable per-dim names: ``left_joint_0 .. left_gripper, right_joint_0 ..`` for 14 dims."""
    grippers = set(gripper_dims(dim))
    arms = dim // 7 if dim >= 14 and dim % 7 == 0 else 1
    names = []
    for d in range(dim):
        arm = d // (dim // arms)
        prefix = ("left_", "right_")[arm] if arms == 2 else (f"arm{arm}_" if arms > 2 else "")
        local = d % (dim // arms)
        names.append(f"{prefix}gripper" if d in grippers else f"{prefix}joint_{local}")
    return names


def joint_states(
    start: int, n: int, *, dim: int = 14, fps: int = 30, seed: int = 0, episode: int = 0
) -> np.ndarray:
    """(n, dim) float32 joint angles (rad) for frames ``start..start+n-1``; grippers in {0, 1}."""
    rng = np.random.default_rng([seed, episode, dim])
    freq = rng.uniform(0.05, 0.4, size=(3, dim))
    amp = rng.uniform(0.1, 0.8, size=(3, dim))
    phase = rng.uniform(0, 2 * np.pi, size=(3, dim))
    offset = rng.uniform(-1.0, 1.0, size=dim)
    t = (np.arange(start, start + n, dtype=np.float64) / fps)[:, None]
    angles = offset + sum(amp[k] * np.sin(2 * np.pi * freq[k] * t + phase[k]) for k in range(3))
    grip_period = rng.uniform(1.0, 3.0)
    for g in gripper_dims(dim):
        angles[:, g] = (np.floor(t[:, 0] / grip_period + g * 0.37) % 2).astype(np.float64)
    values: np.ndarray = angles.astype(np.float32)
    return values


def joint_actions(
    start: int, n: int, *, dim: int = 14, fps: int = 30, seed: int = 0, episode: int = 0
) -> np.ndarray:
    """Commanded positions: the state one frame ahead plus small deterministic tracking error."""
    ahead = joint_states(start + 1, n, dim=dim, fps=fps, seed=seed, episode=episode)
    rng = np.random.default_rng([seed, episode, dim, start, 7])
    error = rng.normal(0.0, 0.01, size=ahead.shape).astype(np.float32)
    grippers = gripper_dims(dim)
    error[:, grippers] = 0.0
    return ahead + error


def default_issue(code: str = "frozen_camera", detail: str | None = None) -> dict[str, str]:
    return {
        "severity": "red",
        "code": code,
        "detail": detail or f"synthetic {code}: camera observation.images.front frames 3-9",
    }


def _per_episode(value: Any, episodes: int, default: Any, name: str) -> list[Any]:
    """None -> default for all; a list/tuple -> must have one entry per episode; else broadcast."""
    if value is None:
        return [default] * episodes
    if isinstance(value, list | tuple):
        if len(value) != episodes:
            raise ValueError(f"{name}: {len(value)} entries for {episodes} episodes")
        return list(value)
    return [value] * episodes


def write_synthetic_dataset(
    root: Path | str,
    *,
    episodes: int = 3,
    frames: int | Sequence[int] = 20,
    cameras: Sequence[str] | int = DEFAULT_CAMERAS,
    width: int = 64,
    height: int = 48,
    fps: int = 30,
    state_dim: int = 14,
    action_dim: int | None = None,
    quality: str | Sequence[str] | None = None,
    quality_issues: Sequence[Sequence[Mapping[str, Any]] | None] | None = None,
    qc_verdicts: Sequence[str | None] | None = None,
    qc_notes: Sequence[str | None] | None = None,
    tasks: Sequence[str] | None = None,
    extra_rows: Sequence[Mapping[str, Any] | None] | None = None,
    seed: int = 0,
    video: VideoOptions | None = None,
    chunks_size: int = 1000,
    robot_type: str = "synthetic_aloha",
    batch_size: int = 16,
    durable: bool = False,
) -> Path:
    """Write (or append to) a raw v2.1 dataset at ``root`` and return ``root``.

    Per-episode lists (one entry per episode, ``None`` = default): ``frames`` (an int applies to
    all; 0 makes a zero-frame episode that is not written), ``quality`` ("green"/"red", default
    green), ``quality_issues`` (default: none for green, one ``frozen_camera`` issue for red),
    ``qc_verdicts`` ("pass"/"fail"/None: no key), ``qc_notes``, ``extra_rows`` (merged into the
    episodes.jsonl row). ``tasks`` is cycled over the episodes. ``cameras`` is a list of video keys
    or a count (``observation.images.cam0..``). Appending to an existing dataset continues its
    indices; the generated content then depends on the new episode indices.
    """
    root = Path(root)
    if isinstance(cameras, int):
        camera_keys = [f"observation.images.cam{i}" for i in range(cameras)]
    else:
        camera_keys = list(cameras)
    action_dim = state_dim if action_dim is None else action_dim
    frame_counts = _per_episode(
        list(frames) if not isinstance(frames, int) else None, episodes, frames, "frames"
    )
    qualities = _per_episode(
        None if isinstance(quality, str) else quality,
        episodes,
        quality if isinstance(quality, str) else "green",
        "quality",
    )
    issues = _per_episode(quality_issues, episodes, None, "quality_issues")
    verdicts = _per_episode(qc_verdicts, episodes, None, "qc_verdicts")
    notes = _per_episode(qc_notes, episodes, None, "qc_notes")
    extras = _per_episode(extra_rows, episodes, None, "extra_rows")
    task_list = list(tasks) if tasks else list(DEFAULT_TASKS)

    rig = _SyntheticRig(camera_keys, height, width, fps, state_dim, action_dim, seed)
    writer = rig.open_writer(root, robot_type, video, chunks_size, durable)
    with writer:
        for i in range(episodes):
            ep_seed = writer.next_episode_index
            n = int(frame_counts[i])
            episode = writer.begin_episode(task_list[i % len(task_list)])
            try:
                for images, vectors, capture_time in rig.batches(ep_seed, n, batch_size):
                    episode.add_frames(images=images, vectors=vectors, capture_time=capture_time)
                row = _episode_row(i, n, fps, ep_seed, qualities, issues, verdicts, notes, extras)
                episode.commit(row)
            except BaseException:
                episode.abort()
                raise
    return root


@dataclass(frozen=True)
class _SyntheticRig:
    """What the synthetic rig records: each camera's scene, the joint signals, jittered times."""

    camera_keys: list[str]
    height: int
    width: int
    fps: int
    state_dim: int
    action_dim: int
    seed: int

    def open_writer(
        self,
        root: Path,
        robot_type: str,
        video: VideoOptions | None,
        chunks_size: int,
        durable: bool,
    ) -> DatasetWriter:
        """The dataset at ``root`` (created, or opened to append) for this rig's streams."""
        state_dim, action_dim = self.state_dim, self.action_dim
        return DatasetWriter.create_or_open(
            root,
            fps=self.fps,
            cameras=[CameraSpec(k, self.height, self.width) for k in self.camera_keys],
            vectors=[
                VectorSpec(STATE, state_dim, joint_names(state_dim)),
                VectorSpec(ACTION, action_dim, joint_names(action_dim)),
            ],
            robot_type=robot_type,
            video=video,
            chunks_size=chunks_size,
            durable=durable,
        )

    def batches(
        self, ep_seed: int, n: int, batch_size: int
    ) -> Iterator[tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]]:
        """``(images, vectors, capture_time)`` of the episode seeded ``ep_seed``, ``batch_size``
        frames at a time."""
        seed, fps = self.seed, self.fps
        scenes = [
            SyntheticScene(self.height, self.width, seed=seed * 1000 + c * 101 + ep_seed)
            for c in range(len(self.camera_keys))
        ]
        for start in range(0, n, batch_size):
            m = min(batch_size, n - start)
            jitter = np.random.default_rng([seed, ep_seed, start]).uniform(0, 0.2, m)
            images = {k: s.frames(start, m) for k, s in zip(self.camera_keys, scenes, strict=True)}
            vectors = {
                STATE: joint_states(
                    start, m, dim=self.state_dim, fps=fps, seed=seed, episode=ep_seed
                ),
                ACTION: joint_actions(
                    start, m, dim=self.action_dim, fps=fps, seed=seed, episode=ep_seed
                ),
            }
            yield (
                images,
                vectors,
                1000.0 + ep_seed * 100.0 + (np.arange(start, start + m) + jitter) / fps,
            )


def _episode_row(
    i: int,
    n: int,
    fps: int,
    ep_seed: int,
    qualities: list[Any],
    issues: list[Any],
    verdicts: list[Any],
    notes: list[Any],
    extras: list[Any],
) -> dict[str, Any]:
    quality = str(qualities[i])
    if quality not in ("green", "red"):
        raise ValueError(f"quality[{i}] = {quality!r}: use 'green' or 'red'")
    episode_issues = issues[i]
    if episode_issues is None:
        episode_issues = [default_issue()] if quality == "red" else []
    started = _EPOCH + dt.timedelta(minutes=ep_seed)
    duration = n / fps
    row: dict[str, Any] = {
        "quality": quality,
        "quality_issues": [dict(x) for x in episode_issues],
        "started_at": started.isoformat(),
        "ended_at": (started + dt.timedelta(seconds=duration)).isoformat(),
        "duration_seconds": duration,
    }
    if verdicts[i] is not None:
        row["qc_verdict"] = verdicts[i]
    if notes[i] is not None:
        row["qc_note"] = notes[i]
    if extras[i]:
        row.update(extras[i])
    return row
