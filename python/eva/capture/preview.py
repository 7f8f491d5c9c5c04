"""Live camera previews for an operator screen, taken in the push path without slowing capture.

The recorder's episode rings have one consumer (the consumer thread), so a preview cannot read
their slots. Instead ``Recorder.push_image`` offers each frame to a :class:`PreviewTap`, which
holds a second, tiny snapshot ring per camera (2 slots, allocated once):

- nothing happens unless a viewer asked for a preview within the last ``linger_s`` seconds
  (``want()``): with no client the cost is one comparison per frame;
- at most ``max_fps`` frames per camera and second are pushed, and only while the preview ring
  has a free slot (a viewer that stopped reading costs nothing more);
- the push is the native ring's copy of the whole frame, which keeps the GIL (measured: a numpy
  copy, strided or not, releases the GIL, and taking it back behind a busy thread costs the
  push a whole switch interval, several ms);
- the reader (``latest``, on the console's worker threads) pops what is there, keeps the newest
  and downscales it (every ``step``-th row and column, so the width is at most ``max_width``).

Previews are taken while idle too (the streams are not recording), so the operator can frame the
scene before START.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from eva.capture.ring import Ring, make_ring

SLOTS = 2


@dataclass
class _CameraPreview:
    ring: Ring
    step: int
    out: np.ndarray  # (SLOTS, H, W, 3): pop target, read under the lock
    times: np.ndarray
    lock: threading.Lock = field(default_factory=threading.Lock)  # one reader at a time (SPSC)
    seq: int = 0  # previews read so far
    t: float = math.nan
    frame: np.ndarray | None = None  # the newest downscaled preview
    next_due: float = 0.0  # monotonic time before which frames are not pushed


class PreviewTap:
    """Downscaled latest frames per camera (see module doc)."""

    def __init__(
        self,
        cameras: dict[str, tuple[int, int]],
        *,
        max_fps: float = 5.0,
        max_width: int = 320,
        linger_s: float = 3.0,
        native: bool | None = None,
    ) -> None:
        self.period = 1.0 / max_fps
        self.linger_s = linger_s
        self.wanted_until = 0.0
        self._cameras: dict[str, _CameraPreview] = {}
        for key, (height, width) in cameras.items():
            shape = (height, width, 3)
            ring = make_ring(
                shape,
                np.uint8,
                block_slots=SLOTS,
                initial_blocks=1,
                max_bytes=SLOTS * height * width * 3,
                native=native,
            )
            step = max(1, math.ceil(width / max_width))
            self._cameras[key] = _CameraPreview(
                ring, step, np.zeros((SLOTS, *shape), np.uint8), np.zeros(SLOTS)
            )

    @property
    def keys(self) -> list[str]:
        return list(self._cameras)

    def want(self) -> None:
        """A viewer is watching: take previews for the next ``linger_s`` seconds."""
        self.wanted_until = time.monotonic() + self.linger_s

    def due(self, key: str) -> bool:
        """Would ``offer`` take a frame of ``key`` now? (Lets a caller skip fetching one.)"""
        cam = self._cameras.get(key)
        now = time.monotonic()
        return bool(
            cam is not None
            and now < self.wanted_until
            and now >= cam.next_due
            and len(cam.ring) < SLOTS
        )

    def offer(self, key: str, t: float, frame: np.ndarray) -> None:
        """Called for every pushed frame (already shape-checked); pushes one when due."""
        now = time.monotonic()
        if now >= self.wanted_until:
            return
        cam = self._cameras.get(key)
        if cam is None or now < cam.next_due or len(cam.ring) >= SLOTS:
            return
        cam.next_due = now + self.period
        cam.ring.push(t, frame)

    def latest(self, key: str) -> tuple[int, float, np.ndarray] | None:
        """``(seq, capture time, downscaled frame)`` of the newest preview, None before the first.
        ``seq`` grows by one for every new preview read."""
        cam = self._cameras.get(key)
        if cam is None:
            raise KeyError(key)
        with cam.lock:
            n = cam.ring.pop_batch(cam.out, cam.times)
            if n:
                frame = np.ascontiguousarray(cam.out[n - 1, :: cam.step, :: cam.step])
                frame.flags.writeable = False  # shared by every reader until the next preview
                cam.frame = frame
                cam.t = float(cam.times[n - 1])
                cam.seq += 1
            if cam.frame is None:
                return None
            return cam.seq, cam.t, cam.frame
