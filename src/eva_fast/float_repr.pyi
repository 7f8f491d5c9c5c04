import numpy as np
import numpy.typing as npt

def reprs(values: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """(uint8 array of every value's repr back to back, int64 length of each)."""
