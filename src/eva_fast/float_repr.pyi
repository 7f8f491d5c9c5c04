import numpy as np
import numpy.typing as npt

def reprs(values: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """(uint8 array of every value's repr back to back, int64 length of each)."""
def objects(
    values: npt.NDArray[np.float64], keys: npt.NDArray[np.uint8], key_ends: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """JSON objects of each row (uint8 array back to back, int64 length of each): key j then
    value (i, j), then "}"; NaN and infinity as null. ``key_ends``: one per column."""
