"""What the recorder and its consumer share about streams and episodes.

:class:`Stream` is a configured stream (its ring and the producer-side gate), an
:class:`EpisodeSession` one START..STOP/CANCEL episode as the consumer sees it, and
:class:`PendingSamples` the samples of one stream popped from its ring and still needed for
alignment.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from eva.capture.ring import Ring, make_ring
from eva.capture.save_worker import SaveJob
from eva.config import CollectionConfig
from eva.dataset.writer import DatasetWriter


@dataclass
class Stream:
    """A configured stream: its ring and the producer-side gate."""

    name: str
    kind: str  # "camera" | "vector"
    shape: tuple[int, ...]
    ring: Ring
    discrete: tuple[int, ...] = ()
    lock: threading.Lock = field(default_factory=threading.Lock)
    open: bool = False  # accepting samples (an episode is recording)
    last_pushed_t: float = math.nan
    bad_shape: int = 0
    bad_shape_detail: str = ""
    external: bool = False  # fed by a source process through a shared-memory ring


def build_streams(
    config: CollectionConfig, external_rings: Mapping[str, Ring], native: bool | None
) -> dict[str, Stream]:
    """Every configured stream with its ring: the shared ring of its source process where
    ``external_rings`` has one (which must hold what the config says), else a ring of this
    process sized by ``config.backlog``."""
    streams: dict[str, Stream] = {}
    n_cam = max(len(config.cameras), 1)
    cam_limit = int(config.backlog.max_memory_mb * 1e6 / n_cam)
    ring_s = config.backlog.ring_seconds
    for cam in config.cameras:
        shape = (cam.height, cam.width, 3)
        if cam.key in external_rings:
            ring = _external(external_rings, cam.key, shape, np.uint8)
            streams[cam.key] = Stream(cam.key, "camera", shape, ring, external=True)
            continue
        item = cam.height * cam.width * 3
        block = max(2, min(16, int(config.fps * ring_s / 2) or 2))
        blocks = max(1, math.ceil(config.fps * ring_s / block))
        ring = make_ring(
            shape,
            np.uint8,
            block_slots=block,
            initial_blocks=blocks,
            max_bytes=max(cam_limit, item * block * blocks),
            native=native,
        )
        streams[cam.key] = Stream(cam.key, "camera", shape, ring)
    for vec in config.vectors:
        external = vec.name in external_rings
        if external:
            ring = _external(external_rings, vec.name, (vec.dim,), np.float64)
        else:  # vectors are tiny: 60 s at 1 kHz of storage as their hard limit
            ring = make_ring(
                (vec.dim,),
                np.float64,
                block_slots=1024,
                initial_blocks=1,
                max_bytes=60_000 * vec.dim * 8,
                native=native,
            )
        streams[vec.name] = Stream(
            vec.name, "vector", (vec.dim,), ring, vec.discrete, external=external
        )
    return streams


def _external(rings: Mapping[str, Ring], name: str, shape: tuple[int, ...], dtype: type) -> Ring:
    ring = rings[name]
    if tuple(ring.shape) != shape or np.dtype(ring.dtype) != np.dtype(dtype):
        raise ValueError(
            f"stream {name}: its ring holds {ring.shape} {np.dtype(ring.dtype)}, the config "
            f"says {shape} {np.dtype(dtype)}"
        )
    return ring


@dataclass
class EpisodeSession:
    """One START..STOP/CANCEL episode as the consumer sees it."""

    dataset_dir: Path
    task: str
    writer: DatasetWriter
    started_at: str
    started_mono: float
    started_wall: float  # time.time() at START: the clock of source processes' samples
    base: dict[str, int]  # ring.pushed at START, per stream
    overflow_base: dict[str, int]
    overflow_end: dict[str, int] = field(default_factory=dict)  # overflow_count at STOP/CANCEL
    limit: dict[str, int] | None = None  # ring.pushed at STOP/CANCEL
    cancelled: bool = False
    job: SaveJob | None = None
    ended_at: str | None = None
    ended_mono: float | None = None
    unexpected: dict[str, int] = field(default_factory=dict)
    bad_shapes: dict[str, tuple[int, str]] = field(default_factory=dict)
    stalls: dict[str, str] = field(default_factory=dict)  # stream -> what the supervisor saw


class PendingSamples:
    """Samples of one stream popped from its ring and still needed for alignment."""

    def __init__(self, stream: Stream, capacity: int) -> None:
        dtype = np.uint8 if stream.kind == "camera" else np.float64
        self.stream = stream
        # Filled, not np.zeros: calloc'd pages would be touched (and counted in RSS) only as the
        # buffer is first used deeper, page faults in the middle of an episode.
        self.values = np.empty((capacity, *stream.shape), dtype=dtype)
        self.values.fill(0)
        self.times = np.zeros(capacity, dtype=np.float64)
        self.n = 0
        self.capacity = capacity

    def drop_front(self, k: int) -> None:
        if k <= 0:
            return
        keep = max(self.n - k, 0)
        # Move the kept samples to the front in steps of k: a step's source and destination never
        # overlap, so numpy copies directly and allocates nothing (an overlapping assignment goes
        # through a temporary, frame-sized for cameras), and a vector backlog of thousands of
        # samples moves in a few slices rather than one Python step per sample.
        for start in range(0, keep, k):
            stop = min(start + k, keep)
            self.values[start:stop] = self.values[start + k : stop + k]
            self.times[start:stop] = self.times[start + k : stop + k]
        self.n = keep


def discard_before(stream: Stream, base: int) -> int:
    """Free the samples of an external ring pushed before ``base`` (they belong to no episode)."""
    excess = base - stream.ring.popped
    return stream.ring.discard(excess) if excess > 0 else 0
