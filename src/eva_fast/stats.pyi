import numpy as np
import numpy.typing as npt
from typing_extensions import disjoint_base

@disjoint_base
class ImageAccumulator:
    """Exact per-channel 256-bin histogram of interleaved RGB uint8 pixels."""

    def update(self, pixels: npt.NDArray[np.uint8], n_frames: int) -> None:
        """``pixels``: ONE flat C-contiguous buffer of interleaved RGB bytes (``frames.reshape(-1)``)."""
    def histogram(self) -> npt.NDArray[np.uint64]: ...
    @property
    def frame_count(self) -> int: ...
    @property
    def pixel_count(self) -> int: ...

@disjoint_base
class VectorAccumulator:
    """Running float64 per-dim count, min, max, mean, M2 over (n, dim) row batches."""

    def __init__(self, dim: int) -> None: ...
    def update_f64(self, rows: npt.NDArray[np.float64]) -> None: ...
    def update_f32(self, rows: npt.NDArray[np.float32]) -> None: ...
    @property
    def dim(self) -> int: ...
    @property
    def count(self) -> int: ...
    def moments(
        self,
    ) -> tuple[
        npt.NDArray[np.float64],
        npt.NDArray[np.float64],
        npt.NDArray[np.float64],
        npt.NDArray[np.float64],
    ]: ...
