"""Run inside a LeRobot venv (0.4.4 or 0.6.1) by scripts/compat_trim.sh: every kept frame of a
trimmed eva v3 export, as LeRobot decodes it (backend given), must be the raw frame at its index
plus the trim start (expected.npz: the raw frames of each episode's trim, decoded by eva).

usage: python compat_trim_check.py EXPORT_DIR EXPECTED_NPZ BACKEND ORACLE_DIR
"""

import os
import sys

sys.path.insert(0, sys.argv[4])
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
import _tv_cpu_shim  # noqa: E402,F401 - before anything imports torchvision
import numpy as np  # noqa: E402
from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: E402

root, expected_path, backend = sys.argv[1:4]
expected = np.load(expected_path)
ds = LeRobotDataset("eva/trim", root=root, video_backend=backend)
camera = "observation.images.front"
index, worst = 0, 0
for ep in range(ds.num_episodes):
    frames = expected[str(ep)].astype(np.int16)
    for k in range(len(frames)):
        item = ds[index]
        index += 1
        image = (item[camera].permute(1, 2, 0).numpy() * 255).round().astype(np.int16)
        nearest = int(np.argmin([np.abs(image - f).mean() for f in frames]))
        if nearest != k or int(item["frame_index"]) != k or int(item["episode_index"]) != ep:
            sys.exit(f"FAIL {backend}: episode {ep} frame {k} decodes as kept frame {nearest}")
        worst = max(worst, int(np.abs(image - frames[k]).max()))
if worst:
    sys.exit(f"FAIL {backend}: pixels differ from the raw frames by up to {worst}")
print(f"PASS {backend}: {index} kept frames, each the raw frame at index + trim start")
