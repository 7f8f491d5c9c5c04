"""Capture kernels: the SPSC snapshot ring and fps-grid alignment, native vs numpy reference."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eva.capture import align
from eva.capture.ring import ReferenceRing, make_ring

pytestmark = pytest.mark.kernels


ring_impls = pytest.mark.parametrize(
    "native",
    [
        pytest.param(True, id="native"),
        pytest.param(False, id="reference"),
    ],
)


def _ring(native: bool, *args, **kwargs):
    return make_ring(*args, native=native, **kwargs)


# ---- ring ----


@ring_impls
def test_ring_roundtrip_keeps_order_and_times(native: bool) -> None:
    ring = _ring(native, (4, 3), np.uint8, block_slots=4, initial_blocks=1, max_bytes=1 << 20)
    for i in range(10):
        assert ring.push(i * 0.5, np.full((4, 3), i, dtype=np.uint8))
    assert len(ring) == 10 and ring.pushed == 10 and ring.high_water == 10
    out = np.zeros((6, 4, 3), np.uint8)
    times = np.zeros(6)
    assert ring.pop_batch(out, times) == 6
    assert [int(x[0, 0]) for x in out] == [0, 1, 2, 3, 4, 5]
    assert list(times) == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    assert ring.peek_time() == 3.0
    assert ring.pop_batch(out, times, 2) == 2
    assert ring.discard() == 2
    assert len(ring) == 0 and ring.peek_time() is None
    assert ring.pop_batch(out, times) == 0
    assert ring.popped == 10 and ring.overflow_count == 0


@ring_impls
def test_ring_grows_then_counts_overflow(native: bool) -> None:
    item = 16 * 8
    ring = _ring(native, (16,), np.float64, block_slots=4, initial_blocks=1, max_bytes=3 * 4 * item)
    assert ring.capacity == 4 and ring.max_capacity == 12
    accepted = [ring.push(float(i), np.full(16, i, np.float64)) for i in range(15)]
    assert accepted == [True] * 12 + [False] * 3
    assert ring.overflow_count == 3 and ring.capacity == 12
    out = np.zeros((20, 16))
    times = np.zeros(20)
    assert ring.pop_batch(out, times) == 12
    assert list(times[:12]) == [float(i) for i in range(12)]
    # After draining, the grown storage is reused without new overflow.
    assert all(ring.push(100.0 + i, np.zeros(16)) for i in range(12))
    assert ring.overflow_count == 3


@ring_impls
def test_ring_rejects_wrong_shape(native: bool) -> None:
    ring = _ring(native, (2, 2), np.uint8)
    with pytest.raises(ValueError, match="shape"):
        ring.push(0.0, np.zeros((3, 2), np.uint8))
    # Non-contiguous and other-dtype inputs are converted, not rejected.
    assert ring.push(0.0, np.arange(8, dtype=np.int64).reshape(2, 4)[:, ::2])
    out = np.zeros((1, 2, 2), np.uint8)
    ring.pop_batch(out, np.zeros(1))
    assert out[0].tolist() == [[0, 2], [4, 6]]


@ring_impls
@pytest.mark.parametrize(
    "times", [np.array(0.0), np.zeros((2, 2)), np.zeros(4, np.float32), np.zeros(8)[::2]]
)
def test_ring_pop_batch_refuses_bad_time_arrays(native: bool, times: np.ndarray) -> None:
    ring = _ring(native, (2,), np.float64)
    assert ring.push(1.0, np.zeros(2))
    with pytest.raises(ValueError, match="out_times"):
        ring.pop_batch(np.zeros((4, 2)), times)
    assert len(ring) == 1  # nothing was taken out


@ring_impls
def test_ring_concurrent_producer_consumer_loses_nothing(native: bool) -> None:
    n = 20000
    ring = _ring(native, (8,), np.int64, block_slots=16, initial_blocks=2, max_bytes=1 << 24)
    seen_values: list[np.ndarray] = []
    seen_times: list[np.ndarray] = []
    done = threading.Event()

    def consume() -> None:
        out = np.zeros((37, 8), np.int64)
        times = np.zeros(37)
        while True:
            finished = done.is_set()
            k = ring.pop_batch(out, times)
            if k:
                seen_values.append(out[:k, 0].copy())
                seen_times.append(times[:k].copy())
            elif finished:
                return

    consumer = threading.Thread(target=consume)
    consumer.start()
    sample = np.zeros(8, np.int64)
    for i in range(n):
        sample[:] = i
        assert ring.push(i * 1e-3, sample)
    done.set()
    consumer.join()
    values = np.concatenate(seen_values)
    assert np.array_equal(values, np.arange(n))
    assert np.array_equal(np.concatenate(seen_times), np.arange(n) * 1e-3)
    assert ring.overflow_count == 0 and len(ring) == 0


@ring_impls
def test_ring_grows_and_reuses_blocks_under_a_slow_consumer(native: bool) -> None:
    """Growth (new blocks linked in) and reuse race with the consumer: still nothing lost."""
    n = 3000
    ring = _ring(native, (3,), np.float64, block_slots=4, initial_blocks=1, max_bytes=1 << 22)
    got: list[np.ndarray] = []
    done = threading.Event()

    def consume() -> None:
        out = np.zeros((5, 3))
        times = np.zeros(5)
        rounds = 0
        while True:
            finished = done.is_set()
            k = ring.pop_batch(out, times)
            got.append(times[:k].copy())
            rounds += 1
            if rounds % 50 == 0:
                time.sleep(0.002)  # fall behind now and then: the producer must grow the ring
            if not k and finished:
                return

    consumer = threading.Thread(target=consume)
    consumer.start()
    for i in range(n):
        assert ring.push(float(i), np.full(3, i, np.float64))
        if i % 500 == 0:
            time.sleep(0.003)  # and catch up now and then: blocks are reused around the cycle
    done.set()
    consumer.join()
    assert np.array_equal(np.concatenate(got), np.arange(n, dtype=np.float64))
    assert ring.capacity > 4 and ring.overflow_count == 0


@pytest.mark.native
def test_native_ring_with_the_gil_released_loses_nothing() -> None:
    """The copy-without-GIL path (release_gil_min_bytes=0): producer and consumer copy frames
    concurrently while neither holds the GIL; every frame arrives intact and in order."""
    n = 400
    ring = make_ring(
        (24, 32, 3),
        np.uint8,
        block_slots=8,
        initial_blocks=1,
        max_bytes=1 << 24,
        release_gil_min_bytes=0,
        native=True,
    )
    assert ring.release_gil
    assert not make_ring((24, 32, 3), np.uint8, native=True).release_gil  # default keeps it
    got: list[int] = []
    done = threading.Event()

    def consume() -> None:
        out = np.zeros((7, 24, 32, 3), np.uint8)
        times = np.zeros(7)
        while True:
            finished = done.is_set()
            k = ring.pop_batch(out, times)
            for frame, t in zip(out[:k], times[:k], strict=True):
                assert (frame == int(t) % 251).all()
                got.append(int(t))
            if not k and finished:
                return

    consumer = threading.Thread(target=consume)
    consumer.start()
    frame = np.zeros((24, 32, 3), np.uint8)
    for i in range(n):
        frame[...] = i % 251
        assert ring.push(float(i), frame)
    done.set()
    consumer.join()
    assert got == list(range(n)) and ring.overflow_count == 0


def test_reference_ring_is_what_make_ring_gives_without_native(monkeypatch) -> None:
    monkeypatch.setenv("EVA_PUREPYTHON", "1")
    assert isinstance(make_ring((3,), np.float64), ReferenceRing)


# ---- alignment ----

align_impls = pytest.mark.parametrize(
    "native", [pytest.param(True, id="native"), pytest.param(False, id="reference")]
)


@align_impls
def test_nearest_tie_takes_earlier_and_flags_skew(native: bool) -> None:
    times = np.array([0.0, 0.1, 0.2, 0.5])
    grid = np.array([0.0, 0.05, 0.15, 0.3, 0.35, 0.4, 0.6])
    idx, skew = align.nearest_indices(times, grid, 0.06, native=native)
    # 0.05 is a tie between 0.0 and 0.1 in exact arithmetic; floats decide like numpy does.
    ref_idx, _ = align.nearest_reference(times, grid, 0.06)
    assert idx.tolist() == ref_idx.tolist()
    exact = np.array([0.0, 1.0, 2.0])
    idx, skew = align.nearest_indices(exact, np.array([-1.0, 0.5, 1.5, 2.5]), 0.4, native=native)
    assert idx.tolist() == [0, 0, 1, 2]
    assert skew.tolist() == [True, True, True, True]
    idx, skew = align.nearest_indices(exact, np.array([0.0, 0.9, 2.0]), 0.4, native=native)
    assert idx.tolist() == [0, 1, 2] and skew.tolist() == [False, False, False]


@align_impls
def test_hold_and_interp_basics(native: bool) -> None:
    times = np.array([1.0, 2.0, 4.0])
    values = np.array([[0.0, 10.0], [1.0, 20.0], [3.0, 0.0]])
    grid = np.array([0.5, 1.0, 1.5, 3.0, 4.0, 5.0])
    assert align.hold_indices(times, grid, native=native).tolist() == [-1, 0, 0, 1, 2, 2]
    out = align.interpolate(times, values, grid, native=native)
    assert out.tolist() == [
        [0.0, 10.0],
        [0.0, 10.0],
        [0.5, 15.0],
        [2.0, 10.0],
        [3.0, 0.0],
        [3.0, 0.0],
    ]
    mixed = align.align_vector(times, values, grid, discrete_dims=[1], native=native)
    assert mixed[:, 1].tolist() == [10.0, 10.0, 10.0, 20.0, 0.0, 0.0]
    assert mixed[:, 0].tolist() == out[:, 0].tolist()


def test_grid_length() -> None:
    assert align.grid_length(0.0, 1.0, 30) == 31
    assert align.grid_length(0.0, 1.0 - 1e-9, 30) == 30
    assert align.grid_length(1.0, 0.5, 30) == 0
    assert align.grid_length(2.0, 2.0, 30) == 1


@st.composite
def stream_and_grid(draw):
    """Sorted sample times with jitter, duplicates (ties), gaps; a grid that may overhang."""
    n = draw(st.integers(1, 60))
    base = draw(st.sampled_from([0.0, 1.0, 1234.5678]))
    period = draw(st.sampled_from([1 / 30, 1 / 200, 0.1]))
    steps = draw(
        st.lists(
            st.one_of(
                st.just(period),
                st.just(0.0),  # duplicate timestamp
                st.floats(0.0, 3 * period, allow_subnormal=False),  # jitter
                st.floats(5 * period, 40 * period, allow_subnormal=False),  # gap
            ),
            min_size=n - 1,
            max_size=n - 1,
        )
    )
    times = base + np.concatenate([[0.0], np.cumsum(steps)]) if n > 1 else np.array([base])
    fps = draw(st.sampled_from([10.0, 15.0, 30.0, 60.0]))
    start = base + draw(st.floats(-0.5, 0.5, allow_nan=False))
    m = draw(st.integers(0, 80))
    grid = align.grid_times(start, fps, 0, m)
    # Exact ties: grid instants halfway between samples.
    if n > 1 and draw(st.booleans()):
        grid = np.sort(np.concatenate([grid, (times[:-1] + times[1:]) / 2]))
    dim = draw(st.integers(1, 5))
    values = np.asarray(
        draw(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=n * dim, max_size=n * dim)),
        dtype=np.float64,
    ).reshape(n, dim)
    tol = draw(st.sampled_from([0.0, 1 / 58, 0.05]))
    return times, values, grid, tol


@pytest.mark.native
@settings(max_examples=300, deadline=None)
@given(stream_and_grid())
def test_native_alignment_matches_reference_exactly(case) -> None:
    times, values, grid, tol = case
    idx_n, skew_n = align.nearest_indices(times, grid, tol, native=True)
    idx_r, skew_r = align.nearest_reference(times, grid, tol)
    assert np.array_equal(idx_n, idx_r)
    assert np.array_equal(skew_n, skew_r)
    assert np.array_equal(
        align.hold_indices(times, grid, native=True), align.hold_reference(times, grid)
    )
    out_n = align.interpolate(times, values, grid, native=True)
    out_r = align.interp_reference(times, values, grid)
    assert np.array_equal(out_n, out_r)
    # The nearest sample really is nearest (ties are pinned down in the unit test above).
    if grid.size:
        d = np.abs(times[None, :] - grid[:, None])
        best = d.min(axis=1)
        assert np.array_equal(np.abs(times[idx_r] - grid), best)


@pytest.mark.native
def test_missing_stream_and_bad_times_are_refused() -> None:
    with pytest.raises(ValueError, match="no samples"):
        align.nearest_indices(np.array([]), np.array([0.0]), 0.1)
    with pytest.raises(ValueError, match="non-decreasing"):
        align.nearest_indices(np.array([1.0, 0.5]), np.array([0.0]), 0.1)
    with pytest.raises(ValueError, match="grid"):
        align.nearest_indices(np.array([0.0, 1.0]), np.array([1.0, 0.0]), 0.1)
    with pytest.raises(ValueError, match="finite"):
        align.interpolate(np.array([0.0, np.nan]), np.zeros((2, 1)), np.array([0.0]))
    # An empty stream holds nothing: every index is -1.
    assert align.hold_indices(np.array([]), np.array([0.0, 1.0])).tolist() == [-1, -1]
    assert align.hold_reference(np.array([]), np.array([0.0, 1.0])).tolist() == [-1, -1]
