import numpy as np
import numpy.typing as npt

def nearest(
    times: npt.NDArray[np.float64],
    grid: npt.NDArray[np.float64],
    tolerance: float,
    out_index: npt.NDArray[np.int64],
    out_skew: npt.NDArray[np.uint8],
) -> None: ...
def hold(
    times: npt.NDArray[np.float64],
    grid: npt.NDArray[np.float64],
    out_index: npt.NDArray[np.int64],
) -> None: ...
def interp(
    times: npt.NDArray[np.float64],
    values: npt.NDArray[np.float64],
    grid: npt.NDArray[np.float64],
    out: npt.NDArray[np.float64],
) -> None: ...
