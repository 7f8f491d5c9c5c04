"""Producer process of tests/test_shm_ring.py: attaches a shm ring by path and pushes into it.

    python tests/shm_ring_producer.py MODE PATH NATIVE [N]

NATIVE is 1 (eva_fast.shm_ring) or 0 (the reference). MODE:

* ``stream``: push samples 0..N-1 (``pattern(i)`` at time ``i * STEP``), retrying a refused push
  until it is stored (each refusal is one overflow);
* ``drop``: the same, but a refused sample is not retried;
* ``heartbeat``: no samples; stamp the heartbeat every 5 ms until the consumer requests a stop;
* ``forever``: push frames filled with ``i % 251`` (retrying when full) until killed or stopped.

Prints one JSON line at the end: ``{"attempts", "pushed", "overflow"}`` (this side's counts).
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from eva.capture.shm_ring import attach_shm_ring

STEP = 0.25  # i * STEP is exact in float64: times double as the sample index
SAFETY_S = 30.0  # a producer left behind by a failed test still exits


def pattern(i: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Sample i: every element differs and depends on its position and on i."""
    base = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    if np.dtype(dtype).kind in "iu":
        return ((base * 7 + i) % 251).astype(dtype)
    return (base + i * 1000.0).astype(dtype)


def main() -> int:
    mode, path, native = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    ring = attach_shm_ring(path, native=native)
    deadline = time.monotonic() + SAFETY_S
    attempts = 0
    if mode in ("stream", "drop"):
        for i in range(n):
            sample = pattern(i, ring.shape, ring.dtype)
            while True:
                attempts += 1
                if ring.push(i * STEP, sample) or mode == "drop":
                    break
                os.sched_yield()
                if time.monotonic() > deadline:
                    return 3
    elif mode == "heartbeat":
        while not ring.stop_requested:
            ring.heartbeat()
            time.sleep(0.005)
            if time.monotonic() > deadline:
                return 3
    elif mode == "forever":
        frame = np.empty(ring.shape, ring.dtype)
        i = 0
        while not ring.stop_requested and time.monotonic() < deadline:
            frame.fill(i % 251)
            attempts += 1
            if ring.push(float(i), frame):
                i += 1
            else:
                os.sched_yield()
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(
        json.dumps({"attempts": attempts, "pushed": ring.pushed, "overflow": ring.overflow_count})
    )
    ring.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
