"""Per-stream snapshot rings between the rig's threads and the recorder's consumer.

``make_ring`` returns the native lock-free SPSC ring (``eva_fast.ring.SnapshotRing``, see
``native/ring.hpp``) or, under ``EVA_PUREPYTHON=1`` / without a build, :class:`ReferenceRing`,
a deque + lock implementation with the same API and the same capacity rules.

Capacity and overflow (both implementations):

- storage grows in blocks of ``block_slots`` samples; ``initial_blocks`` are allocated (and
  pre-touched by the native ring) up front, the rest only while the consumer is behind;
- ``max_bytes`` is the hard limit of slot storage (at least ``initial_blocks`` blocks). A push
  past it returns False and is counted in ``overflow_count``; the recorder reports a non-zero count
  as the red quality issue ``capture_backlog_overflow``. Samples are never dropped uncounted and
  the producer never waits for the consumer.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from eva._native import load


class Ring(Protocol):
    shape: tuple[int, ...]
    dtype: np.dtype
    item_bytes: int
    block_slots: int

    def push(self, t: float, sample: npt.ArrayLike) -> bool: ...
    def pop_batch(
        self, out: npt.NDArray[Any], out_times: npt.NDArray[np.float64], max_n: int = -1
    ) -> int: ...
    def discard(self, max_n: int = -1) -> int: ...
    def peek_time(self) -> float | None: ...
    def __len__(self) -> int: ...
    @property
    def pushed(self) -> int: ...
    @property
    def popped(self) -> int: ...
    @property
    def overflow_count(self) -> int: ...
    @property
    def high_water(self) -> int: ...
    def reset_high_water(self) -> None: ...
    @property
    def capacity(self) -> int: ...
    @property
    def max_capacity(self) -> int: ...
    @property
    def allocated_bytes(self) -> int: ...


class ReferenceRing:
    """Plain Python reference of the native ring: a deque of (time, copy) under a lock."""

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: npt.DTypeLike,
        block_slots: int = 64,
        initial_blocks: int = 2,
        max_bytes: int = 0,
        release_gil_min_bytes: int | None = None,
    ) -> None:
        self.release_gil = False  # the reference copies under the GIL (np.array)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.item_bytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        if self.item_bytes <= 0:
            raise ValueError(f"ring sample shape {self.shape} holds no bytes")
        if block_slots <= 0 or initial_blocks <= 0:
            raise ValueError("ring block_slots and initial_blocks must be positive")
        self.block_slots = int(block_slots)
        self._blocks = int(initial_blocks)
        self._max_blocks = max(self._blocks, int(max_bytes) // (self.item_bytes * self.block_slots))
        self._items: deque[tuple[float, np.ndarray]] = deque()
        self._lock = threading.Lock()
        self._pushed = 0
        self._popped = 0
        self._overflow = 0
        self._high_water = 0

    def push(self, t: float, sample: npt.ArrayLike) -> bool:
        arr = np.asarray(sample, dtype=self.dtype)
        if arr.nbytes != self.item_bytes:
            raise ValueError(f"sample shape {arr.shape} does not match the ring's {self.shape}")
        copy = np.array(arr, dtype=self.dtype, copy=True).reshape(self.shape)
        with self._lock:
            if len(self._items) >= self._blocks * self.block_slots:
                if self._blocks >= self._max_blocks:
                    self._overflow += 1
                    return False
                self._blocks += 1
            self._items.append((float(t), copy))
            self._pushed += 1
            self._high_water = max(self._high_water, len(self._items))
        return True

    def pop_batch(
        self, out: npt.NDArray[Any], out_times: npt.NDArray[np.float64], max_n: int = -1
    ) -> int:
        if out.dtype != self.dtype or not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError(
                "pop_batch: out must be a writable C-contiguous array of the ring dtype"
            )
        if out_times.dtype != np.float64 or not out_times.flags.c_contiguous or out_times.ndim != 1:
            raise ValueError(
                "pop_batch: out_times must be a writable C-contiguous 1-D float64 array"
            )
        flat = out.reshape(-1, *self.shape) if out.size else out
        limit = min(out.nbytes // self.item_bytes, out_times.shape[0])
        if max_n >= 0:
            limit = min(limit, max_n)
        n = 0
        with self._lock:
            while n < limit and self._items:
                t, sample = self._items.popleft()
                flat[n] = sample
                out_times[n] = t
                n += 1
            self._popped += n
        return n

    def discard(self, max_n: int = -1) -> int:
        with self._lock:
            n = len(self._items) if max_n < 0 else min(max_n, len(self._items))
            for _ in range(n):
                self._items.popleft()
            self._popped += n
        return n

    def peek_time(self) -> float | None:
        with self._lock:
            return self._items[0][0] if self._items else None

    def __len__(self) -> int:
        return len(self._items)

    @property
    def pushed(self) -> int:
        return self._pushed

    @property
    def popped(self) -> int:
        return self._popped

    @property
    def overflow_count(self) -> int:
        return self._overflow

    @property
    def high_water(self) -> int:
        return self._high_water

    def reset_high_water(self) -> None:
        self._high_water = len(self._items)

    @property
    def capacity(self) -> int:
        return self._blocks * self.block_slots

    @property
    def max_capacity(self) -> int:
        return self._max_blocks * self.block_slots

    @property
    def allocated_bytes(self) -> int:
        return self.capacity * self.item_bytes


def make_ring(
    shape: tuple[int, ...],
    dtype: npt.DTypeLike,
    *,
    block_slots: int = 64,
    initial_blocks: int = 2,
    max_bytes: int = 0,
    release_gil_min_bytes: int | None = None,
    native: bool | None = None,
) -> Ring:
    """The native ring when available (``native=None``), else the reference.

    ``native=True`` demands the native ring (ImportError without it); ``False`` forces the
    reference. ``release_gil_min_bytes``: samples at least this big are copied with the GIL
    released (native ring; default 32 MiB: re-taking the GIL after a release can wait a whole
    switch interval when another Python thread is busy, which costs far more than the copy).
    """
    mod = load("ring") if native is not False else None
    if native is True and mod is None:
        raise ImportError("the native ring (eva_fast.ring) is not available")
    cls = mod.SnapshotRing if mod is not None else ReferenceRing
    return cls(
        shape,
        dtype,
        block_slots=block_slots,
        initial_blocks=initial_blocks,
        max_bytes=max_bytes,
        release_gil_min_bytes=release_gil_min_bytes,
    )
