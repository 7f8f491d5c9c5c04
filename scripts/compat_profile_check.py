"""Run inside a LeRobot venv (0.4.4 or 0.6.1) by scripts/compat_video_profile.sh: every frame of
a training-profile eva v3 export, as LeRobot decodes it (backend given), must be closer to the
recorded frame at its index than to either neighbour (expected.npz: each episode's kept recorded
frames per camera, decoded by eva); prints each camera's PSNR against them and fails below
PSNR_MIN dB.

usage: python compat_profile_check.py EXPORT_DIR EXPECTED_NPZ BACKEND ORACLE_DIR PSNR_MIN
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
psnr_min = float(sys.argv[5])
expected = np.load(expected_path)
ds = LeRobotDataset("eva/profile", root=root, video_backend=backend)
cameras = sorted({name.split("|")[0] for name in expected.files})
squared = {camera: [0.0, 0] for camera in cameras}
index = 0
for ep in range(ds.num_episodes):
    for k in range(len(expected[f"{cameras[0]}|{ep}"])):
        item = ds[index]
        index += 1
        for camera in cameras:
            frames = expected[f"{camera}|{ep}"].astype(np.float64)
            image = item[camera].permute(1, 2, 0).numpy().astype(np.float64) * 255
            near = range(max(0, k - 1), min(len(frames), k + 2))
            errors = {j: float(np.abs(image - frames[j]).mean()) for j in near}
            if min(errors, key=errors.get) != k:
                sys.exit(f"FAIL {backend}: episode {ep} frame {k} {camera}: nearest is {errors}")
            squared[camera][0] += float(((image - frames[k]) ** 2).sum())
            squared[camera][1] += image.size
report = []
for camera, (total, count) in squared.items():
    psnr = 10 * np.log10(255.0**2 / (total / count))
    report.append(f"{camera} {psnr:.1f} dB")
    if psnr < psnr_min:
        sys.exit(f"FAIL {backend}: {camera} PSNR {psnr:.1f} dB < {psnr_min}")
print(f"PASS {backend}: {index} frames, each nearest the recorded one at its index; PSNR {', '.join(report)}")
