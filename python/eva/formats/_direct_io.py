"""Export files written past the page cache (``O_DIRECT``), where the filesystem allows it.

An HDF5 or MCAP export writes every decoded frame: 4.4 GB for 4,800 640x480 frames. Through the
page cache each written byte first needs a fresh cache page. On small and virtual hosts that
allocation is the cost: buffered writes of 1 GiB took 0.7-3.7 s of system time on the project's
2-core VMs (the guest's pages being backed anew), against 0.06-0.08 s with ``O_DIRECT`` at 1.5
GiB/s. Exports are read back rarely and are made durable (``fsync``) before they are published
anyway, so caching what they write buys nothing.

``O_DIRECT`` wants the file offset, the length and the memory address aligned (to the device's
logical block; ``ALIGN`` = 4096 covers 512- and 4096-byte devices). Here the aligned body of a
write goes direct and an unaligned head or tail through an ordinary descriptor on the same file
(Linux keeps the two coherent). A filesystem that refuses ``O_DIRECT`` (``EINVAL`` at open or
at the first write: some FUSE and older tmpfs) gets ordinary writes, silently: the bytes are the
same either way. ``EVA_DIRECT_IO=0`` turns it off (benchmarks compare the two).
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from types import TracebackType

import numpy as np

__all__ = ["ALIGN", "PositionedWriter", "SequentialWriter", "aligned_empty", "enabled"]

ALIGN = 4096
STAGING_BYTES = 8 << 20  # a sequential writer's buffer: one direct write per 8 MiB
_OPEN_FLAGS = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_REFUSED = {errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP}


def enabled() -> bool:
    """Whether exports try ``O_DIRECT`` (Linux, and ``EVA_DIRECT_IO`` is not ``0``)."""
    return hasattr(os, "O_DIRECT") and os.environ.get("EVA_DIRECT_IO", "1") != "0"


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype | type = np.uint8) -> np.ndarray:
    """An uninitialised C-contiguous array whose first byte is ``ALIGN``-aligned."""
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start : start + nbytes].view(dt).reshape(shape)


def _address(data: np.ndarray) -> int:
    return int(data.ctypes.data)


class PositionedWriter:
    """Writes byte runs at given offsets of an existing file (the HDF5 chunks HDF5 allocated):
    each run's ``ALIGN``-aligned body past the page cache, the rest through it."""

    def __init__(
        self, path: Path | str, *, direct: bool | None = None, create: bool = False
    ) -> None:
        self.path = Path(path)
        if create:  # a new file (truncated if it exists), mode 0644
            self.plain = os.open(self.path, _OPEN_FLAGS | os.O_CREAT | os.O_TRUNC, 0o644)
        else:
            self.plain = os.open(self.path, _OPEN_FLAGS)
        self.direct: int | None = None
        self.direct_bytes = 0  # bytes that went past the page cache (tests, benchmarks)
        self._scratch_buffer: np.ndarray | None = None
        if enabled() if direct is None else direct:
            try:
                self.direct = os.open(self.path, _OPEN_FLAGS | os.O_DIRECT)
            except OSError as e:
                if e.errno not in _REFUSED:
                    os.close(self.plain)
                    raise

    def write_at(self, offset: int, data: np.ndarray) -> None:
        """Write ``data`` (a C-contiguous array, any dtype) at byte ``offset``. A body whose
        memory is not aligned (frames of a size that is no multiple of ``ALIGN``) is copied
        into an aligned scratch buffer first: a memcpy costs a fraction of a cache page."""
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        size = raw.size
        done = 0
        if self.direct is not None and offset % ALIGN == 0:
            body = size - size % ALIGN
            aligned = _address(raw) % ALIGN == 0
            while done < body:
                if aligned:
                    piece = raw[done:body]
                else:
                    step = min(body - done, STAGING_BYTES)
                    piece = self._scratch(step)
                    piece[:] = raw[done : done + step]
                try:
                    written = os.pwrite(self.direct, piece.data, offset + done)
                except OSError as e:
                    if e.errno not in _REFUSED:
                        raise
                    self._stop_direct()
                    break
                if written <= 0:
                    break
                done += written
                self.direct_bytes += written
                if written % ALIGN:
                    break  # a short write left the rest unaligned: the plain descriptor takes it
        view = raw.data
        while done < size:
            written = os.pwrite(self.plain, view[done:], offset + done)
            if written <= 0:
                raise OSError(errno.EIO, f"{self.path}: a write made no progress")
            done += written

    def _scratch(self, size: int) -> np.ndarray:
        if self._scratch_buffer is None or self._scratch_buffer.size < size:
            self._scratch_buffer = aligned_empty((size,))
        return self._scratch_buffer[:size]

    def _stop_direct(self) -> None:
        if self.direct is not None:
            with contextlib.suppress(OSError):
                os.close(self.direct)
            self.direct = None

    def close(self) -> None:
        self._stop_direct()
        if self.plain >= 0:
            os.close(self.plain)
            self.plain = -1

    def __enter__(self) -> PositionedWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class SequentialWriter:
    """A new file written front to back (``write``, as a binary file object), staged in one
    aligned buffer that goes to the file a whole buffer at a time; ``close`` writes the tail.

    ``copy_from`` appends a byte range of another file, read straight into the buffer (the MP4
    samples of a v3 shard). The file is created (``O_CREAT | O_TRUNC | O_NOFOLLOW``, mode 0644).
    """

    def __init__(
        self, path: Path | str, *, direct: bool | None = None, buffer_bytes: int = STAGING_BYTES
    ) -> None:
        self.path = Path(path)
        self._file = PositionedWriter(self.path, direct=direct, create=True)
        size = max(ALIGN, buffer_bytes - buffer_bytes % ALIGN)
        self._buffer = aligned_empty((size,))
        self._view = self._buffer.data
        self._filled = 0
        self._flushed = 0  # file offset of the buffer's first byte
        self.uncopied_bytes = 0  # written straight from the caller's memory (tests, benches)
        self.closed = False

    @property
    def direct_bytes(self) -> int:
        return self._file.direct_bytes

    @property
    def direct(self) -> bool:
        """Whether whole buffers go past the page cache (the filesystem took ``O_DIRECT``)."""
        return self._file.direct is not None

    def tell(self) -> int:
        return self._flushed + self._filled

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Append ``data``. A large write whose memory sits at the same offset from a block
        boundary as its place in the file (``address - tell()`` a multiple of ``ALIGN``, which
        a caller can arrange: the MCAP writer places its chunk records so) goes to the file
        from that memory, uncopied, apart from its unaligned head and tail."""
        source = memoryview(data).cast("B")
        size = len(source)
        if size >= 4 * ALIGN and self._file.direct is not None:
            memory = np.frombuffer(source, np.uint8)
            if (_address(memory) - self.tell()) % ALIGN == 0:
                self._write_in_place(memory)
                return size
        taken = 0
        while taken < size:
            room = len(self._buffer) - self._filled
            step = min(room, size - taken)
            self._view[self._filled : self._filled + step] = source[taken : taken + step]
            self._filled += step
            taken += step
            if self._filled == len(self._buffer):
                self._spill()
        return size

    def _write_in_place(self, memory: np.ndarray) -> None:
        head = (-self.tell()) % ALIGN
        self.write(memory[:head].data)  # the staged bytes now end on a block boundary
        whole = self._filled  # the buffer starts on one (only whole blocks are ever written)
        if whole:
            self._file.write_at(self._flushed, self._buffer[:whole])
            self._flushed += whole
            self._filled = 0
        body = (len(memory) - head) - (len(memory) - head) % ALIGN
        self._file.write_at(self._flushed, memory[head : head + body])
        self._flushed += body
        self.uncopied_bytes += body
        self.write(memory[head + body :].data)

    def copy_from(self, fd: int, offset: int, length: int) -> None:
        """Append ``length`` bytes of the open file ``fd`` from ``offset``; raises
        ``EOFError`` when the file ends first."""
        done = 0
        while done < length:
            room = len(self._buffer) - self._filled
            step = min(room, length - done)
            got = os.preadv(fd, [self._view[self._filled : self._filled + step]], offset + done)
            if got <= 0:
                raise EOFError(f"the file ended {length - done} bytes early")
            self._filled += got
            done += got
            if self._filled == len(self._buffer):
                self._spill()

    def _spill(self) -> None:
        """Write the buffer's whole aligned blocks; an unaligned rest moves to its front."""
        whole = self._filled - self._filled % ALIGN
        if whole == 0:
            return
        self._file.write_at(self._flushed, self._buffer[:whole])
        rest = self._filled - whole
        if rest:
            self._buffer[:rest] = self._buffer[whole : self._filled]
        self._flushed += whole
        self._filled = rest

    def flush(self) -> None:
        """Nothing to do: bytes reach the file by whole buffers and at ``close``."""

    def close(self) -> None:
        """Write what is staged (the tail through the page cache) and close the file."""
        if self.closed:
            return
        self.closed = True
        try:
            if self._filled:
                self._file.write_at(self._flushed, self._buffer[: self._filled])
                self._flushed += self._filled
                self._filled = 0
        finally:
            self._file.close()

    def abandon(self) -> None:
        """Close without writing what is staged (the file is being removed)."""
        self.closed = True
        self._file.close()

    def __enter__(self) -> SequentialWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is None:
            self.close()
        else:
            self.abandon()
