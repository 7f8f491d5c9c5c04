import numpy as np
import numpy.typing as npt

_Buffer = bytes | bytearray | memoryview | np.ndarray
# written through a uint8_t[::1] memoryview: bytes (read-only) is refused
_WritableBuffer = bytearray | memoryview | np.ndarray

def crc32(data: _Buffer, value: int = 0) -> int:
    """``zlib.crc32(data, value)``."""
def crc32_folds() -> bool:
    """Whether ``crc32`` runs the carry-less multiply folding (else a table walk)."""
def annexb_in_place(
    window: _WritableBuffer,
    starts: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
    has_sps: npt.NDArray[np.uint8],
) -> int:
    """4-byte NAL lengths -> start codes in every sample ``window[starts[i]:ends[i]]``, SPS flags
    into ``has_sps``; -1, or the first sample whose lengths do not add up."""
def frame_records(
    sources: list[tuple[object, ...]],
    times: npt.NDArray[np.int64],
    frame_base: int,
    first: int,
    buffer: _WritableBuffer,
    used: int,
    chunk_size: int,
    offsets: npt.NDArray[np.int64],
) -> tuple[int, int, int]:
    """Message records of ``len(times)`` frames x ``len(sources)`` into ``buffer`` from message
    ``first`` at ``used``, while the chunk takes them; ``(next message, used, size of the record
    that did not fit or 0)``. A source is ``(channel, data, starts)`` (JSON rows of the
    episode, row r = data[starts[r]:starts[r + 1]]) or ``(channel, data, starts, sizes,
    prefixed, prefix, frame_id, tail)`` (a camera's units of these frames)."""
