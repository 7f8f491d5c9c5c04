"""Live camera previews for an operator screen, taken in the push path without slowing capture.

The recorder's rings are single-consumer (the consumer thread pops them), so a preview cannot
read a ring slot without racing the consumer. Instead, ``Recorder.push_image`` offers every frame
to a :class:`PreviewTap`, which keeps one downscaled copy per camera:

- nothing happens unless a viewer asked for a preview within the last ``linger_s`` seconds
  (``want()``): with no client the cost is one attribute check per frame;
- at most ``max_fps`` copies per camera and second, each a strided subsample (every ``step``-th
  row and column, ``step`` chosen so the width is at most ``max_width``) copied into a buffer
  allocated once: no allocation, a few tens of microseconds for 640x480 -> 320x240;
- the reader gets a copy of the latest preview under a per-camera lock held only for that copy.

Previews are taken while idle too (the streams are not recording), so the operator can frame the
scene before START.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class _CameraPreview:
    buffer: np.ndarray
    step: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    seq: int = 0  # previews taken so far (0: none yet)
    t: float = math.nan  # capture time of the latest preview
    next_due: float = 0.0  # monotonic time before which frames are not copied


class PreviewTap:
    """Downscaled latest frames per camera (see module doc)."""

    def __init__(
        self,
        cameras: dict[str, tuple[int, int]],
        *,
        max_fps: float = 5.0,
        max_width: int = 320,
        linger_s: float = 3.0,
    ) -> None:
        self.period = 1.0 / max_fps
        self.linger_s = linger_s
        self.wanted_until = 0.0
        self._cameras: dict[str, _CameraPreview] = {}
        for key, (height, width) in cameras.items():
            step = max(1, math.ceil(width / max_width))
            shape = (-(-height // step), -(-width // step), 3)
            self._cameras[key] = _CameraPreview(np.zeros(shape, np.uint8), step)

    @property
    def keys(self) -> list[str]:
        return list(self._cameras)

    def want(self) -> None:
        """A viewer is watching: take previews for the next ``linger_s`` seconds."""
        self.wanted_until = time.monotonic() + self.linger_s

    def offer(self, key: str, t: float, frame: np.ndarray) -> None:
        """Called for every pushed frame (already shape-checked); copies one when due."""
        now = time.monotonic()
        if now >= self.wanted_until:
            return
        cam = self._cameras.get(key)
        if cam is None or now < cam.next_due:
            return
        cam.next_due = now + self.period
        with cam.lock:
            np.copyto(cam.buffer, frame[:: cam.step, :: cam.step])
            cam.t = t
            cam.seq += 1

    def latest(self, key: str) -> tuple[int, float, np.ndarray] | None:
        """``(seq, capture time, frame copy)`` of the newest preview, None before the first."""
        cam = self._cameras.get(key)
        if cam is None:
            raise KeyError(key)
        with cam.lock:
            if cam.seq == 0:
                return None
            return cam.seq, cam.t, cam.buffer.copy()
