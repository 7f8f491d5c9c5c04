import numpy as np
import numpy.typing as npt

def pack_frame(frame: npt.NDArray[np.uint8], batch: npt.NDArray[np.uint8], slot: int) -> None: ...
