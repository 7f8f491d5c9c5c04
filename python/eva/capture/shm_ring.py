"""Cross-process SPSC snapshot ring in a shared file mapping (camera/robot source processes).

A source running in its own process (where no recorder-side Python thread can stall it on the
GIL) pushes samples and their capture times into a ``MAP_SHARED`` mapping of a file; the
recorder's consumer thread pops them exactly as it pops the in-process ring: both sides get an
object satisfying :class:`eva.capture.ring.Ring`.

- The CONSUMER calls :func:`create_shm_ring`: exclusive create of ``path`` (an existing path or a
  symlink there is refused: ``FileExistsError``), mode 0600, size reserved with
  ``posix_fallocate`` (a full tmpfs fails here with ENOSPC instead of SIGBUS-ing a producer
  later), header written with the magic last. It owns the file: :meth:`unlink` removes it.
  Put it on tmpfs (``/dev/shm``): a disk-backed file works but its dirty pages get written back.
- The PRODUCER (another process) calls :func:`attach_shm_ring` with the same path: the last path
  component may not be a symlink (``ValueError``), the file must be a regular file, and a bad
  header raises ``ValueError`` naming the path and the field. Attach records the producer's pid
  and stamps the heartbeat; each push (stored or refused) stamps it again, :meth:`heartbeat`
  stamps it between pushes (``time.monotonic_ns()``, the clock of both sides).
- ``slots`` is fixed: a push into a full ring returns False and counts one overflow, it never
  waits. The consumer can :meth:`request_stop`; the producer polls ``stop_requested``.
- One producer and one consumer at a time, each from one thread at a time (like the in-process
  ring); :meth:`close` (unmap) must not race a push/pop of the same object on another thread.

Two implementations over the SAME bytes (layout: ``native/shm_ring.hpp``, mirrored by the
``OFF_*`` constants of ``capture/shm_layout.py``): ``eva_fast.shm_ring.ShmRing`` (C++, ``__atomic`` acquire/release on
the counters) and :class:`ReferenceShmRing` (numpy + ``memoryview`` over the mmap). A native
producer can feed a reference consumer and vice versa. ``native=None`` picks the native one when
``eva_fast.shm_ring`` is importable and ``EVA_PUREPYTHON`` is not set, ``True`` demands it,
``False`` forces the reference.

Protocol: ``head`` (pushed) and ``tail`` (popped) are free-running u64 counters, slot = counter %
slots. The producer loads tail (full when head - tail >= slots), writes the slot data and its
time, then stores head + 1; the consumer loads head, copies slots tail..head-1 out, then stores
the new tail. What the reference relies on for that to be the native acquire/release protocol:

- x86-64 (TSO): stores become visible in program order, loads are not reordered with older
  loads, and stores are not reordered with older loads. The only reordering TSO allows (a later
  load passing an earlier store to another address) only ever makes the producer see an older
  tail (the ring looks fuller) or the consumer an older head (emptier): never an unwritten slot.
  The slot copy itself may use fast-string stores (``rep movsb``: ordered before later stores,
  Intel SDM 8.2.4.2) or non-temporal ones (glibc's large-copy path, which ends with ``sfence``).
  On x86-64 the native release store / acquire load are these same plain ``mov``s; on a weakly
  ordered CPU (aarch64) use the native implementation.
- Aligned 8-byte loads and stores are single-copy atomic on x86-64, and CPython performs each
  access of a ``memoryview.cast("Q")`` item as one fixed-size 8-byte ``memcpy`` (compiled to one
  ``mov``): a counter is never seen half-written, even when the other process dies mid-store.
- CPython executes one bytecode after another through opaque calls, so the compiler cannot move
  the slot copy past the head store (or the copy out past the tail store).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

import numpy as np
import numpy.typing as npt

from eva._native import load
from eva.capture.ring import Ring
from eva.capture.shm_layout import (
    HEADER_BYTES,
    OFF_CONSUMER_PID,
    OFF_HEAD,
    OFF_HEARTBEAT,
    OFF_HIGH_WATER,
    OFF_OVERFLOW,
    OFF_PRODUCER_PID,
    OFF_STOP,
    OFF_TAIL,
    ShmLayout,
    parse_header,
)

_HEAD = OFF_HEAD // 8
_OVERFLOW = OFF_OVERFLOW // 8
_HEARTBEAT = OFF_HEARTBEAT // 8
_PRODUCER_PID = OFF_PRODUCER_PID // 8
_HIGH_WATER = OFF_HIGH_WATER // 8
_TAIL = OFF_TAIL // 8
_STOP = OFF_STOP // 8

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


class ShmRing(Ring, Protocol):
    """What create_shm_ring / attach_shm_ring return (both implementations)."""

    path: str
    owner: bool
    release_gil: bool

    def heartbeat(self, now_ns: int | None = None) -> None: ...
    def claim_producer(self, pid: int) -> None: ...
    @property
    def heartbeat_ns(self) -> int: ...
    @property
    def producer_pid(self) -> int: ...
    @property
    def consumer_pid(self) -> int: ...
    def request_stop(self) -> None: ...
    @property
    def stop_requested(self) -> bool: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def unlink(self) -> None: ...
    def __enter__(self) -> ShmRing: ...
    def __exit__(self, *exc: object) -> None: ...


class ReferenceShmRing:
    """Pure Python/numpy implementation over the mmap (same bytes as the native one).

    Counters are read and written as aligned 8-byte ``memoryview`` items, slots through numpy
    views of the mapping; see the module docstring for what makes that correct on x86-64.
    Normally made by :func:`create_shm_ring` / :func:`attach_shm_ring`, which validate the file;
    the ring takes ownership of ``mm`` (``close()`` closes it).
    """

    def __init__(
        self,
        mm: mmap.mmap,
        path: str,
        shape: tuple[int, ...],
        dtype: npt.DTypeLike,
        *,
        owner: bool = False,
        file_id: tuple[int, int] | None = None,
        release_gil_min_bytes: int | None = None,
    ) -> None:
        self.release_gil = False  # the reference copies under the GIL
        self.path = str(path)
        self.owner = bool(owner)
        self._file_id = file_id
        # The mapping itself is checked again (not just the file the factory validated).
        layout = parse_header(self.path, bytes(mm[:HEADER_BYTES]), len(mm))
        if layout.shape != tuple(int(s) for s in shape) or layout.dtype != np.dtype(dtype):
            raise ValueError(
                f"{self.path}: shm ring holds {layout.shape} {layout.dtype.str!r} samples, "
                f"not {tuple(shape)} {np.dtype(dtype).str!r}"
            )
        self.shape = layout.shape
        self.dtype = layout.dtype
        self.item_bytes = layout.item_bytes
        self.block_slots = layout.slots
        self.slot_stride = layout.slot_stride
        self._n = layout.slots
        self._mm: mmap.mmap | None = mm
        self._hdr: memoryview | None = memoryview(mm)[:HEADER_BYTES].cast("Q")
        self._times: np.ndarray | None = np.frombuffer(
            mm, np.float64, count=layout.slots, offset=layout.times_offset
        )
        inner = np.empty(0, layout.dtype).reshape((0, *layout.shape)).strides[1:]
        self._slots: np.ndarray | None = np.ndarray(
            (layout.slots, *layout.shape),
            layout.dtype,
            buffer=mm,
            offset=layout.data_offset,
            strides=(layout.slot_stride, *inner),
        )

    # -- helpers --

    def _h(self) -> memoryview:
        h = self._hdr
        if h is None:
            raise ValueError(f"shm ring {self.path} is closed")
        return h

    def _available(self, tail: int, head: int) -> int:
        return 0 if head <= tail else min(head - tail, self._n)

    # -- producer --

    def push(self, t: float, sample: npt.ArrayLike) -> bool:
        h = self._h()
        arr = np.asarray(sample, dtype=self.dtype)
        if arr.nbytes != self.item_bytes:
            raise ValueError(f"sample shape {arr.shape} does not match the ring's {self.shape}")
        t = float(t)
        head = h[_HEAD]
        tail = h[_TAIL]
        ok = tail <= head < tail + self._n
        if ok:
            slot = head % self._n
            self._slots[slot] = arr.reshape(self.shape)  # type: ignore[index]
            self._times[slot] = t  # type: ignore[index]
            h[_HEAD] = head + 1  # publishes the slot (after the copy: TSO keeps store order)
            occupancy = head + 1 - tail
            if occupancy > h[_HIGH_WATER]:
                h[_HIGH_WATER] = occupancy
        else:
            h[_OVERFLOW] = h[_OVERFLOW] + 1
        h[_HEARTBEAT] = time.monotonic_ns()
        return ok

    def heartbeat(self, now_ns: int | None = None) -> None:
        stamp = time.monotonic_ns() if now_ns is None else int(now_ns)
        if not 0 <= stamp < 2**64:
            raise ValueError(f"heartbeat now_ns must be a u64 (>= 0), not {now_ns}")
        self._h()[_HEARTBEAT] = stamp

    def claim_producer(self, pid: int) -> None:
        """PRODUCER side: record ``pid`` as the producer's and stamp the heartbeat (what
        :func:`eva.capture.shm_ring.attach_shm_ring` does on attach)."""
        h = self._h()
        h[_PRODUCER_PID] = int(pid)
        h[_HEARTBEAT] = time.monotonic_ns()

    # -- consumer --

    def pop_batch(
        self, out: npt.NDArray[Any], out_times: npt.NDArray[np.float64], max_n: int = -1
    ) -> int:
        h = self._h()
        if out.dtype != self.dtype or not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError(
                "pop_batch: out must be a writable C-contiguous array of the ring dtype"
            )
        if (
            out_times.dtype != np.float64
            or not out_times.flags.c_contiguous
            or not out_times.flags.writeable
            or out_times.ndim != 1
        ):
            raise ValueError(
                "pop_batch: out_times must be a writable C-contiguous 1-D float64 array"
            )
        limit: int = min(out.nbytes // self.item_bytes, out_times.shape[0])
        if max_n >= 0:
            limit = min(limit, max_n)
        tail = h[_TAIL]
        head = h[_HEAD]
        n = min(self._available(tail, head), limit)
        if n == 0:
            return 0
        per = self.item_bytes // self.dtype.itemsize
        dst = out.reshape(-1)[: n * per].reshape(n, *self.shape)
        first = tail % self._n
        k = min(n, self._n - first)
        dst[:k] = self._slots[first : first + k]  # type: ignore[index]
        out_times[:k] = self._times[first : first + k]  # type: ignore[index]
        if n > k:
            dst[k:n] = self._slots[: n - k]  # type: ignore[index]
            out_times[k:n] = self._times[: n - k]  # type: ignore[index]
        h[_TAIL] = tail + n  # hands the slots back (after the copy: stores follow older loads)
        return n

    def discard(self, max_n: int = -1) -> int:
        h = self._h()
        tail = h[_TAIL]
        avail = self._available(tail, h[_HEAD])
        n = avail if max_n < 0 else min(max_n, avail)
        if n:
            h[_TAIL] = tail + n
        return n

    def peek_time(self) -> float | None:
        h = self._h()
        tail = h[_TAIL]
        if self._available(tail, h[_HEAD]) == 0:
            return None
        return float(self._times[tail % self._n])  # type: ignore[index]

    def request_stop(self) -> None:
        self._h()[_STOP] = 1

    def reset_high_water(self) -> None:
        h = self._h()
        h[_HIGH_WATER] = len(self)

    # -- either side --

    def __len__(self) -> int:
        h = self._h()
        tail = h[_TAIL]  # tail first: head only grows
        return self._available(tail, h[_HEAD])

    @property
    def pushed(self) -> int:
        return self._h()[_HEAD]

    @property
    def popped(self) -> int:
        return self._h()[_TAIL]

    @property
    def overflow_count(self) -> int:
        return self._h()[_OVERFLOW]

    @property
    def high_water(self) -> int:
        return self._h()[_HIGH_WATER]

    @property
    def heartbeat_ns(self) -> int:
        return self._h()[_HEARTBEAT]

    @property
    def producer_pid(self) -> int:
        return self._h()[_PRODUCER_PID]

    @property
    def consumer_pid(self) -> int:
        return self._h()[OFF_CONSUMER_PID // 8]

    @property
    def stop_requested(self) -> bool:
        return self._h()[_STOP] != 0

    @property
    def capacity(self) -> int:
        return self._n

    @property
    def max_capacity(self) -> int:
        return self._n

    @property
    def allocated_bytes(self) -> int:
        return self._n * self.item_bytes

    @property
    def closed(self) -> bool:
        return self._hdr is None

    def close(self) -> None:
        """Unmap (idempotent). The file stays until the owner's ``unlink()``."""
        if self._hdr is None:
            return
        self._hdr.release()
        self._hdr = None
        self._times = None
        self._slots = None
        mm, self._mm = self._mm, None
        if mm is not None:
            mm.close()

    def unlink(self) -> None:
        _unlink_owned(self.path, self.owner, self._file_id)

    def __enter__(self) -> ReferenceShmRing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _unlink_owned(path: str, owner: bool, file_id: tuple[int, int] | None) -> None:
    """Remove the ring file if it is still the one this consumer created (idempotent)."""
    if not owner:
        raise ValueError(f"shm ring {path}: only the consumer that created it unlinks it")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if file_id is None or (st.st_dev, st.st_ino) == file_id:
        os.unlink(path)


def _implementation(native: bool | None) -> Callable[..., ShmRing]:
    """The ring class: both take ReferenceShmRing's constructor arguments."""
    mod = load("shm_ring") if native is not False else None
    if native is True and mod is None:
        raise ImportError("the native shm ring (eva_fast.shm_ring) is not available")
    if mod is None:
        return ReferenceShmRing
    return cast(Callable[..., ShmRing], mod.ShmRing)


def _map(fd: int, nbytes: int) -> mmap.mmap:
    return mmap.mmap(
        fd, nbytes, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
    )


def create_shm_ring(
    path: str | os.PathLike[str],
    shape: tuple[int, ...],
    dtype: npt.DTypeLike,
    slots: int,
    *,
    native: bool | None = None,
    release_gil_min_bytes: int | None = None,
) -> ShmRing:
    """CONSUMER side: create the ring file at ``path`` and map it (see the module docstring).

    ``FileExistsError`` when anything (a file, a symlink) is at ``path``; ``ValueError`` for a
    shape/dtype/slots the ring cannot carry. ``release_gil_min_bytes``: pushes through this
    object copy with the GIL released from this sample size up (native; default 32 MiB, as
    ``make_ring``); pops release it like the in-process ring's.
    """
    cls = _implementation(native)
    layout = ShmLayout.compute(shape, dtype, slots)
    path = os.fspath(path)
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    mm = None
    try:
        os.fchmod(fd, 0o600)  # exactly 0600 whatever the umask
        os.ftruncate(fd, layout.file_bytes)
        # Reserve the pages now: on a full tmpfs this fails here (ENOSPC), not as a SIGBUS in
        # the producer's first push into a hole.
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, layout.file_bytes)
        st = os.fstat(fd)
        mm = _map(fd, layout.file_bytes)
        header = layout.header(os.getpid())
        mm[8:HEADER_BYTES] = header[8:]
        mm[0:8] = header[:8]  # magic last: an attach that sees it sees the whole header
        ring = cls(
            mm,
            path,
            layout.shape,
            layout.dtype,
            owner=True,
            file_id=(st.st_dev, st.st_ino),
            release_gil_min_bytes=release_gil_min_bytes,
        )
    except BaseException:
        if mm is not None:
            mm.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    finally:
        os.close(fd)
    return ring


def attach_shm_ring(
    path: str | os.PathLike[str],
    *,
    native: bool | None = None,
    shape: tuple[int, ...] | None = None,
    dtype: npt.DTypeLike | None = None,
    release_gil_min_bytes: int | None = None,
) -> ShmRing:
    """PRODUCER side: map the ring file the consumer created at ``path`` and validate it.

    ``FileNotFoundError`` while it does not exist yet; ``ValueError`` naming the path and the
    field for a symlink, a non-regular file or a bad header, and when ``shape`` / ``dtype`` are
    given and differ from the file's. Records this process as the producer (``producer_pid``)
    and stamps the heartbeat.
    """
    cls = _implementation(native)
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise ValueError(
                f"{path}: is a symlink; a shm ring is attached by its real path"
            ) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path}: not a regular file, not a shm ring")
        layout = parse_header(path, os.pread(fd, HEADER_BYTES, 0), st.st_size)
        if shape is not None and tuple(int(s) for s in shape) != layout.shape:
            raise ValueError(f"{path}: shm ring shape is {layout.shape}, expected {tuple(shape)}")
        if dtype is not None and np.dtype(dtype) != layout.dtype:
            raise ValueError(
                f"{path}: shm ring dtype is {layout.dtype.str!r}, expected {np.dtype(dtype).str!r}"
            )
        mm = _map(fd, layout.file_bytes)
    finally:
        os.close(fd)
    try:
        ring = cls(
            mm,
            path,
            layout.shape,
            layout.dtype,
            owner=False,
            file_id=(st.st_dev, st.st_ino),
            release_gil_min_bytes=release_gil_min_bytes,
        )
    except BaseException:
        mm.close()
        raise
    ring.claim_producer(os.getpid())
    return ring
