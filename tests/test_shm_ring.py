"""Cross-process shared-memory snapshot ring: native vs reference vs a model, across processes.

Every behaviour test runs on each producer x consumer combination of the native ring
(``eva_fast.shm_ring``) and the reference (``eva.capture.shm_ring.ReferenceShmRing``) mapping the
same file, which also proves the two use the same bytes. Combinations with a native side carry
the ``native`` mark (deselected under EVA_PUREPYTHON=1); reference x reference runs in both passes.
The producer of the cross-process tests is ``tests/shm_ring_producer.py`` in a real subprocess.
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shm_ring_producer import STEP, pattern

from eva.capture import shm_layout
from eva.capture.shm_layout import HEADER_BYTES, ShmLayout
from eva.capture.shm_ring import ReferenceShmRing, attach_shm_ring, create_shm_ring

pytestmark = pytest.mark.kernels

PRODUCER = str(Path(__file__).with_name("shm_ring_producer.py"))
native = pytest.mark.native

# (producer native?, consumer native?)
COMBOS = [
    pytest.param(True, True, id="native_producer-native_consumer", marks=native),
    pytest.param(True, False, id="native_producer-reference_consumer", marks=native),
    pytest.param(False, True, id="reference_producer-native_consumer", marks=native),
    pytest.param(False, False, id="reference_producer-reference_consumer"),
]
IMPLS = [pytest.param(True, id="native", marks=native), pytest.param(False, id="reference")]


@pytest.fixture
def ring_path(tmp_path: Path) -> Path:
    return tmp_path / "test.ring"


def _pair(path: Path, shape, dtype, slots: int, producer_native: bool, consumer_native: bool):
    consumer = create_shm_ring(path, shape, dtype, slots, native=consumer_native)
    producer = attach_shm_ring(path, native=producer_native)
    return producer, consumer


# ---- layout and the model ----


@native
def test_native_and_reference_layout_constants_agree() -> None:
    from eva_fast import shm_ring as native_mod

    assert native_mod.LAYOUT == shm_layout.LAYOUT


@pytest.mark.parametrize("producer_native,consumer_native", COMBOS)
def test_roundtrip_fills_counts_overflow_and_wraps(
    ring_path: Path, producer_native: bool, consumer_native: bool
) -> None:
    producer, consumer = _pair(ring_path, (2, 3), np.float64, 4, producer_native, consumer_native)
    with producer, consumer:
        assert consumer.capacity == consumer.max_capacity == consumer.block_slots == 4
        assert consumer.item_bytes == 48 and consumer.allocated_bytes == 4 * 48
        assert consumer.shape == producer.shape == (2, 3)
        assert consumer.dtype == producer.dtype == np.float64
        accepted = [producer.push(i * 0.5, np.full((2, 3), i, np.float64)) for i in range(6)]
        assert accepted == [True] * 4 + [False] * 2
        assert consumer.overflow_count == 2 and len(consumer) == 4 and consumer.high_water == 4
        out = np.zeros((3, 2, 3))
        times = np.zeros(3)
        assert consumer.pop_batch(out, times) == 3
        assert times.tolist() == [0.0, 0.5, 1.0] and out[:, 0, 0].tolist() == [0, 1, 2]
        assert consumer.peek_time() == 1.5 and len(producer) == 1
        assert all(producer.push(10.0 + i, np.full((2, 3), 10 + i)) for i in range(3))  # wraps
        out = np.zeros((8, 2, 3))
        times = np.zeros(8)
        assert consumer.pop_batch(out, times, 3) == 3
        assert times[:3].tolist() == [1.5, 10.0, 11.0]
        assert (out[1] == 10).all() and (out[3:] == 0).all()
        assert consumer.discard() == 1 and consumer.peek_time() is None
        assert consumer.pop_batch(out, times) == 0 and consumer.discard(5) == 0
        assert (consumer.pushed, consumer.popped, consumer.overflow_count) == (7, 7, 2)
        assert (producer.pushed, producer.popped) == (7, 7)
        consumer.reset_high_water()
        assert consumer.high_water == 0


class _Model:
    """A deque with a capacity: what every ring must behave like."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.items: deque[tuple[float, np.ndarray]] = deque()
        self.pushed = self.popped = self.overflow = self.high_water = 0

    def push(self, t: float, sample: np.ndarray) -> bool:
        if len(self.items) >= self.slots:
            self.overflow += 1
            return False
        self.items.append((t, sample.copy()))
        self.pushed += 1
        self.high_water = max(self.high_water, len(self.items))
        return True

    def take(self, n: int) -> list[tuple[float, np.ndarray]]:
        n = len(self.items) if n < 0 else min(n, len(self.items))
        self.popped += n
        return [self.items.popleft() for _ in range(n)]


SAMPLE_KINDS = [
    ((3,), "float64"),
    ((2, 3, 4), "uint8"),
    ((5,), "int16"),
    ((), "float32"),
    ((2, 2), "complex128"),
    ((3,), "bool"),
]

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 10**6)),
        st.tuples(st.just("push"), st.integers(0, 10**6)),
        st.tuples(st.just("pop"), st.integers(-1, 6), st.integers(0, 7)),
        st.tuples(st.just("discard"), st.integers(-1, 4)),
        st.tuples(st.just("peek")),
        st.tuples(st.just("reset_high_water")),
        st.tuples(st.just("heartbeat"), st.integers(0, 2**63)),
    ),
    max_size=40,
)


def _sample(seed: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.integers(0, 250, size=shape).astype(dtype)


@pytest.mark.parametrize("producer_native,consumer_native", COMBOS)
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(kind=st.sampled_from(SAMPLE_KINDS), slots=st.integers(1, 5), ops=OPS)
def test_ring_behaves_like_a_bounded_deque(
    tmp_path: Path, producer_native: bool, consumer_native: bool, kind, slots: int, ops
) -> None:
    shape, dtype = kind[0], np.dtype(kind[1])
    path = tmp_path / f"{uuid.uuid4().hex}.ring"
    producer, consumer = _pair(path, shape, dtype, slots, producer_native, consumer_native)
    model = _Model(slots)
    try:
        for op in ops:
            if op[0] == "push":
                sample = _sample(op[1], shape, dtype)
                t = op[1] * 0.5
                assert producer.push(t, sample) == model.push(t, sample)
            elif op[0] == "pop":
                out = np.zeros((op[2], *shape), dtype)
                times = np.zeros(op[2])
                k = consumer.pop_batch(out, times, op[1])
                want = model.take(min(op[2], op[1]) if op[1] >= 0 else op[2])
                assert k == len(want)
                for j, (t, sample) in enumerate(want):
                    assert times[j] == t and np.array_equal(out[j], sample)
                assert not out[k:].any() and not times[k:].any()  # untouched
            elif op[0] == "discard":
                assert consumer.discard(op[1]) == len(model.take(op[1]))
            elif op[0] == "peek":
                assert consumer.peek_time() == (model.items[0][0] if model.items else None)
            elif op[0] == "reset_high_water":
                consumer.reset_high_water()
                model.high_water = len(model.items)
            else:
                producer.heartbeat(op[1])
                assert consumer.heartbeat_ns == op[1]
            for ring in (producer, consumer):
                assert len(ring) == len(model.items)
                assert ring.pushed == model.pushed and ring.popped == model.popped
                assert ring.overflow_count == model.overflow
                assert ring.high_water == model.high_water
    finally:
        producer.close()
        consumer.close()
        consumer.unlink()


@pytest.mark.parametrize("native_impl", IMPLS)
def test_push_converts_and_checks_shape_pop_checks_arrays(
    ring_path: Path, native_impl: bool
) -> None:
    with create_shm_ring(ring_path, (2, 2), np.uint8, 4, native=native_impl) as ring:
        with pytest.raises(ValueError, match="shape"):
            ring.push(0.0, np.zeros((3, 2), np.uint8))
        assert ring.push(0.0, np.arange(8, dtype=np.int64).reshape(2, 4)[:, ::2])
        with pytest.raises(ValueError, match="out must"):
            ring.pop_batch(np.zeros((1, 2, 2), np.float64), np.zeros(1))
        with pytest.raises(ValueError, match="out_times"):
            ring.pop_batch(np.zeros((1, 2, 2), np.uint8), np.zeros((1, 1)))
        with pytest.raises(ValueError, match="out_times"):
            ring.pop_batch(np.zeros((1, 2, 2), np.uint8), np.zeros(1, np.float32))
        assert len(ring) == 1
        out = np.zeros((1, 2, 2), np.uint8)
        assert ring.pop_batch(out, np.zeros(1)) == 1
        assert out[0].tolist() == [[0, 2], [4, 6]]
        for bad in (-1, 2**64):
            with pytest.raises(ValueError, match="now_ns"):
                ring.heartbeat(bad)
    with pytest.raises(ValueError, match="closed"):
        ring.push(0.0, np.zeros((2, 2), np.uint8))
    with pytest.raises(ValueError, match="closed"):
        len(ring)
    ring.close()  # idempotent
    assert ring.closed and ring.shape == (2, 2)
    ring.unlink()
    ring.unlink()  # idempotent
    assert not ring_path.exists()


@pytest.mark.parametrize("native_impl", IMPLS)
def test_create_owns_a_0600_file_and_attach_records_the_producer(
    ring_path: Path, native_impl: bool
) -> None:
    consumer = create_shm_ring(ring_path, (4,), np.float64, 3, native=native_impl)
    st_ = ring_path.stat()
    assert st_.st_mode & 0o777 == 0o600
    assert st_.st_size == ShmLayout.compute((4,), np.float64, 3).file_bytes
    assert consumer.owner and consumer.path == str(ring_path)
    assert consumer.producer_pid == 0 and consumer.heartbeat_ns == 0
    assert consumer.consumer_pid == os.getpid() and not consumer.stop_requested
    before = time.monotonic_ns()
    producer = attach_shm_ring(ring_path, native=native_impl, shape=(4,), dtype=np.float64)
    assert not producer.owner
    assert consumer.producer_pid == os.getpid() and consumer.heartbeat_ns >= before
    with pytest.raises(ValueError, match="only the consumer"):
        producer.unlink()
    consumer.request_stop()
    assert producer.stop_requested
    with pytest.raises(ValueError, match="shape"):
        attach_shm_ring(ring_path, native=native_impl, shape=(5,))
    with pytest.raises(ValueError, match="dtype"):
        attach_shm_ring(ring_path, native=native_impl, dtype=np.float32)
    producer.close()
    consumer.close()
    consumer.unlink()
    with pytest.raises(FileNotFoundError):
        attach_shm_ring(ring_path, native=native_impl)


@pytest.mark.parametrize(
    "shape,dtype,slots,match",
    [
        ((3,), np.float64, 0, "slots"),
        ((0, 3), np.float64, 2, "no bytes"),
        ((3,), object, 2, "numeric"),
        ((3,), ">f8", 2, "byte order"),
        ((3,), [("a", "<f8")], 2, "numeric"),
        ((1,) * 9, np.uint8, 2, "dims"),
    ],
)
def test_create_refuses_what_a_ring_cannot_carry(
    ring_path: Path, shape, dtype, slots, match
) -> None:
    with pytest.raises(ValueError, match=match):
        create_shm_ring(ring_path, shape, dtype, slots, native=False)
    assert not ring_path.exists()


@pytest.mark.parametrize("native_impl", IMPLS)
def test_native_is_the_default_unless_pure_python(
    ring_path: Path, native_impl: bool, monkeypatch
) -> None:
    if native_impl:
        ring = create_shm_ring(ring_path, (2,), np.float64, 2)
        assert type(ring).__module__ == "eva_fast.shm_ring"
    else:
        monkeypatch.setenv("EVA_PUREPYTHON", "1")
        ring = create_shm_ring(ring_path, (2,), np.float64, 2)
        assert isinstance(ring, ReferenceShmRing)
        with pytest.raises(ImportError):
            attach_shm_ring(ring_path, native=True)
    ring.close()
    ring.unlink()


@native
def test_native_push_with_the_gil_released_loses_nothing(ring_path: Path) -> None:
    """release_gil_min_bytes=0: pushes on a thread copy without the GIL while pops run."""
    consumer = create_shm_ring(ring_path, (24, 32, 3), np.uint8, 4, native=True)
    producer = attach_shm_ring(ring_path, native=True, release_gil_min_bytes=0)
    assert producer.release_gil and not consumer.release_gil
    n = 300
    got: list[int] = []

    def produce() -> None:
        frame = np.zeros((24, 32, 3), np.uint8)
        for i in range(n):
            frame[...] = i % 251
            while not producer.push(float(i), frame):
                time.sleep(0)

    thread = threading.Thread(target=produce)
    thread.start()
    out = np.zeros((3, 24, 32, 3), np.uint8)
    times = np.zeros(3)
    while len(got) < n:
        k = consumer.pop_batch(out, times)
        for frame, t in zip(out[:k], times[:k], strict=True):
            assert (frame == int(t) % 251).all()
            got.append(int(t))
    thread.join()
    assert got == list(range(n))
    assert producer.pushed + 0 == n and consumer.overflow_count == producer.overflow_count
    producer.close()
    consumer.close()
    consumer.unlink()


# ---- header validation ----


def _made(path: Path) -> ShmLayout:
    ring = create_shm_ring(path, (4, 5), np.uint8, 3, native=False)
    ring.close()  # the file stays
    return ShmLayout.compute((4, 5), np.uint8, 3)


def _poke(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


@pytest.mark.parametrize("native_impl", IMPLS)
@pytest.mark.parametrize(
    "offset,data,field",
    [
        (0, b"EVASHMR0", "magic"),
        (8, struct.pack("<I", 2), "version"),
        (12, struct.pack("<I", 256), "header_bytes"),
        (16, struct.pack("<Q", 21), "item_bytes"),
        (24, struct.pack("<Q", 4), "slot_stride|data_offset|file_bytes|truncated"),
        (32, struct.pack("<Q", 20), "slot_stride"),
        (56, struct.pack("<Q", 1 << 20), "file_bytes"),
        (64, struct.pack("<I", 9), "ndim"),
        (80, b"<XX\0", "dtype"),
        (80, b"|O8\0", "dtype"),
        (96, struct.pack("<Q", 0), "shape"),
    ],
)
def test_attach_refuses_a_bad_header_naming_path_and_field(
    ring_path: Path, native_impl: bool, offset: int, data: bytes, field: str
) -> None:
    _made(ring_path)
    _poke(ring_path, offset, data)
    with pytest.raises(ValueError, match=field) as info:
        attach_shm_ring(ring_path, native=native_impl)
    assert str(ring_path) in str(info.value)


@pytest.mark.parametrize("native_impl", IMPLS)
def test_attach_refuses_a_truncated_file(ring_path: Path, native_impl: bool) -> None:
    layout = _made(ring_path)
    for size in (layout.file_bytes - 1, HEADER_BYTES - 1, 0):
        os.truncate(ring_path, size)
        with pytest.raises(ValueError, match="truncated") as info:
            attach_shm_ring(ring_path, native=native_impl)
        assert str(ring_path) in str(info.value)


@pytest.mark.parametrize("native_impl", IMPLS)
def test_symlinks_existing_paths_and_special_files_are_refused(
    tmp_path: Path, native_impl: bool
) -> None:
    real = tmp_path / "real.ring"
    _made(real)
    link = tmp_path / "link.ring"
    link.symlink_to(real)
    with pytest.raises(ValueError, match="symlink") as info:
        attach_shm_ring(link, native=native_impl)
    assert str(link) in str(info.value)
    with pytest.raises(FileExistsError):
        create_shm_ring(link, (2,), np.float64, 2, native=native_impl)
    dangling = tmp_path / "dangling.ring"
    dangling.symlink_to(tmp_path / "target.ring")
    with pytest.raises(FileExistsError):
        create_shm_ring(dangling, (2,), np.float64, 2, native=native_impl)
    assert not (tmp_path / "target.ring").exists()
    before = real.read_bytes()
    with pytest.raises(FileExistsError):
        create_shm_ring(real, (2,), np.float64, 2, native=native_impl)
    assert real.read_bytes() == before  # untouched, still attachable
    attach_shm_ring(real, native=native_impl).close()
    fifo = tmp_path / "fifo.ring"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="regular file"):
        attach_shm_ring(fifo, native=native_impl)


@native
def test_native_class_checks_the_mapping_itself() -> None:
    """Handed a mapping directly (no Python-side validation), the C++ checks still hold."""
    from eva_fast.shm_ring import ShmRing

    mm = mmap.mmap(-1, 4096)
    with pytest.raises(ValueError, match="magic"):
        ShmRing(mm, "anon", (2,), np.float64)
    layout = ShmLayout.compute((2,), np.float64, 1000)  # more slots than the mapping holds
    mm[:HEADER_BYTES] = layout.header(0)
    with pytest.raises(ValueError, match="slots"):
        ShmRing(mm, "anon", (2,), np.float64)
    small = ShmLayout.compute((2,), np.float64, 4)
    mm[:HEADER_BYTES] = small.header(0)
    with pytest.raises(ValueError, match="item_bytes|samples"):
        ShmRing(mm, "anon", (3,), np.float64)
    ring = ShmRing(mm, "anon", (2,), np.float64)
    assert ring.block_slots == 4 and ring.push(1.0, np.ones(2))
    ring.close()
    assert mm.closed


# ---- across processes ----
# (realtime: the consumer's deadlines assume the producer process gets the CPU when it needs it)


def _spawn(mode: str, path: Path, producer_native: bool, n: int = 0) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, PRODUCER, mode, str(path), "1" if producer_native else "0", str(n)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _drain(ring, proc: subprocess.Popen, rows: int = 3, timeout: float = 20.0):
    """Pop concurrently until the producer has exited and the ring is empty."""
    out = np.zeros((rows, *ring.shape), ring.dtype)
    times = np.zeros(rows)
    values: list[np.ndarray] = []
    stamps: list[float] = []
    deadline = time.monotonic() + timeout
    while True:
        exited = proc.poll() is not None  # before the pop: then an empty pop means drained
        k = ring.pop_batch(out, times)
        if k:
            values.extend(out[:k].copy())
            stamps.extend(times[:k].tolist())
        elif exited:
            return values, stamps
        else:
            time.sleep(0.0001)
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the producer did not finish")


@pytest.mark.realtime
@pytest.mark.parametrize("producer_native,consumer_native", COMBOS)
@pytest.mark.parametrize("shape,dtype", [((2, 3), np.float64), ((4, 5, 3), np.uint8)])
def test_cross_process_stream_is_exact_and_overflow_counted(
    ring_path: Path, producer_native: bool, consumer_native: bool, shape, dtype
) -> None:
    n = 3000
    ring = create_shm_ring(ring_path, shape, dtype, 4, native=consumer_native)
    proc = _spawn("stream", ring_path, producer_native, n)
    # Let the producer fill the tiny ring and be refused at least once before popping.
    deadline = time.monotonic() + 20
    while ring.overflow_count == 0 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert ring.overflow_count > 0
    values, stamps = _drain(ring, proc)
    report = _finish(proc)
    assert stamps == [i * STEP for i in range(n)]
    for i, value in enumerate(values):
        assert np.array_equal(value, pattern(i, shape, np.dtype(dtype))), f"sample {i}"
    assert ring.pushed == report["pushed"] == n and ring.popped == n and len(ring) == 0
    assert ring.overflow_count == report["overflow"] == report["attempts"] - n
    assert ring.high_water == 4 and ring.producer_pid == proc.pid
    ring.close()
    ring.unlink()


@pytest.mark.realtime
@pytest.mark.parametrize("producer_native,consumer_native", COMBOS)
def test_cross_process_refused_samples_are_counted_not_delivered(
    ring_path: Path, producer_native: bool, consumer_native: bool
) -> None:
    n = 2000
    shape = (3, 4)
    ring = create_shm_ring(ring_path, shape, np.uint8, 2, native=consumer_native)
    proc = _spawn("drop", ring_path, producer_native, n)
    values, stamps = _drain(ring, proc, rows=1)
    report = _finish(proc)
    indices = [int(t / STEP) for t in stamps]
    assert indices == sorted(set(indices)) and [i * STEP for i in indices] == stamps
    for i, value in zip(indices, values, strict=True):
        assert np.array_equal(value, pattern(i, shape, np.dtype(np.uint8)))
    assert len(indices) == ring.pushed == report["pushed"]
    assert ring.pushed + ring.overflow_count == n == report["attempts"]
    ring.close()
    ring.unlink()


HEARTBEAT_COMBOS = [
    pytest.param(True, False, id="native_producer-reference_consumer", marks=native),
    pytest.param(False, True, id="reference_producer-native_consumer", marks=native),
    pytest.param(False, False, id="reference_producer-reference_consumer"),
]


@pytest.mark.realtime
@pytest.mark.parametrize("producer_native,consumer_native", HEARTBEAT_COMBOS)
def test_cross_process_heartbeat_and_stop_request(
    ring_path: Path, producer_native: bool, consumer_native: bool
) -> None:
    ring = create_shm_ring(ring_path, (2,), np.float64, 2, native=consumer_native)
    assert ring.heartbeat_ns == 0 and ring.producer_pid == 0
    proc = _spawn("heartbeat", ring_path, producer_native)
    deadline = time.monotonic() + 20
    while ring.producer_pid != proc.pid and time.monotonic() < deadline:
        time.sleep(0.005)
    assert ring.producer_pid == proc.pid
    first = ring.heartbeat_ns
    time.sleep(0.05)
    second = ring.heartbeat_ns
    now = time.monotonic_ns()
    assert 0 < first < second <= now and now - second < 1_000_000_000  # one monotonic clock
    ring.request_stop()
    assert _finish(proc)["pushed"] == 0
    ring.close()
    ring.unlink()


KILL_COMBOS = [
    pytest.param(True, True, id="native_producer-native_consumer", marks=native),
    pytest.param(True, False, id="native_producer-reference_consumer", marks=native),
    pytest.param(False, False, id="reference_producer-reference_consumer"),
]


@pytest.mark.realtime
@pytest.mark.parametrize("producer_native,consumer_native", KILL_COMBOS)
def test_cross_process_producer_killed_mid_stream_leaves_a_consistent_ring(
    ring_path: Path, producer_native: bool, consumer_native: bool
) -> None:
    shape = (256, 1024)  # 256 KiB frames: the kill likely lands inside a copy
    ring = create_shm_ring(ring_path, shape, np.uint8, 8, native=consumer_native)
    proc = _spawn("forever", ring_path, producer_native)
    out = np.zeros((2, *shape), np.uint8)
    times = np.zeros(2)
    got: list[int] = []

    def take(k: int) -> None:
        for frame, t in zip(out[:k], times[:k], strict=True):
            assert (frame == int(t) % 251).all(), f"frame {int(t)} torn"
            got.append(int(t))

    deadline = time.monotonic() + 20
    while len(got) < 150 and time.monotonic() < deadline:
        take(ring.pop_batch(out, times))
    while len(ring) == 0 and time.monotonic() < deadline:
        time.sleep(0.0002)  # something published and not popped; the next push is under way
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    stamp = ring.heartbeat_ns
    published = ring.pushed
    assert len(ring) == published - len(got) > 0
    while k := ring.pop_batch(out, times):
        take(k)
    assert got == list(range(published)) and len(ring) == 0 and ring.popped == published
    time.sleep(0.03)
    assert ring.heartbeat_ns == stamp and ring.pushed == published  # nothing moves any more
    ring.close()
    ring.unlink()
