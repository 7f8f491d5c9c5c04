import numpy as np
import numpy.typing as npt

def pack_frame(frame: npt.NDArray[np.uint8], batch: npt.NDArray[np.uint8], slot: int) -> None: ...
def yuv420p_to_rgb24(
    y_plane: npt.NDArray[np.uint8],
    u_plane: npt.NDArray[np.uint8],
    v_plane: npt.NDArray[np.uint8],
    width: int,
    height: int,
    lut_r: npt.NDArray[np.uint8],
    lut_b: npt.NDArray[np.uint8],
    g_rows: npt.NDArray[np.uint8],
    g_index: npt.NDArray[np.uint16],
    batch: npt.NDArray[np.uint8],
    slot: int,
) -> None: ...
