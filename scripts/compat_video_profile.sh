#!/usr/bin/env bash
# Part of `make compat` / `make compat-06`: training-profile v3 exports (--video-profile training,
# libsvtav1 and libx264, one episode trimmed) read by LeRobot 0.4.4 (and 0.6.1 when its venv
# exists): the oracle (every frame, both video backends, strict timestamps, nothing logged about
# the data), then each frame as LeRobot decodes it must be nearest the recorded frame at its index
# (compat_profile_check.py), with each camera's PSNR against the recorded frames (>= 35 dB at the
# default libsvtav1, >= 30 dB with libx264 at the same CRF; the footage is bench/corpus.py's
# camera-like scene, 3 episodes x 2 cameras x 40 frames 640x480).
# Exits 1 on any failure.
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
ORACLE="${EVA_ORACLE_DIR:-$REPO/../shared/oracle}"
WORK="$(mktemp -d -t eva-compat-profile.XXXXXX)"
[[ "${COMPAT_KEEP:-0}" == 1 ]] || trap 'rm -rf "$WORK"' EXIT
# shellcheck source=scripts/lerobot_warnings.sh
source "$REPO/scripts/lerobot_warnings.sh"
"$REPO/.venv/bin/python" - "$WORK" "$REPO/bench" <<'PY' || { echo "FAIL compat_video_profile: writing the exports"; exit 1; }
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, sys.argv[2])
import corpus  # bench/corpus.py: camera-like footage (texture, moving objects, sensor noise)

from eva.dataset.reader import DatasetReader
from eva.export.pipeline import export_dataset
from eva.formats.base import ExportOptions
from eva.formats.options import LeRobotV3Options
from eva.quality.edits import EditRequest, edit_episodes

work = Path(sys.argv[1])
params = corpus.CorpusParams(episodes=3, frames=40, cameras=2)  # 640x480
cameras = corpus.camera_keys(params)
raw = work / "raw"
shutil.copytree(corpus.ensure_corpus("eva", params, root=work / "corpus", log=False), raw)
edit_episodes(raw, [1], EditRequest(trim=(5, 30)))
reader = DatasetReader(raw)
keep = {0: (0, 40), 1: (5, 30), 2: (0, 40)}
expected = {
    f"{camera}|{ep}": np.concatenate([b.copy() for b in reader.iter_frames(ep, camera)])[a:b]
    for camera in cameras
    for ep, (a, b) in keep.items()
}
np.savez(work / "expected.npz", **expected)
for codec in ("libsvtav1", "libx264"):
    src = work / codec / "raw"
    shutil.copytree(raw, src)
    options = LeRobotV3Options(video_profile="training", video_codec=codec)
    export_dataset(src, "lerobot_v3", options=ExportOptions(format=options))
PY
status=0
for venv in "${LEROBOT_V3_VENV:-/tmp/lerobot-v3-venv}" "${LEROBOT_V06_VENV:-/tmp/lerobot-v06-venv}"; do
  [[ -x "$venv/bin/python" ]] || continue
  script=lerobot_read_v30.py
  [[ "$venv" == *06* ]] && script=lerobot_read_v30_06.py
  for codec in libsvtav1 libx264; do
    dir="$WORK/$codec/export/lerobot_v3/accepted"
    name="$(basename "$venv") $codec"
    if err=$(LEROBOT_V3_PYTHON="$venv/bin/python" LEROBOT_V06_PYTHON="$venv/bin/python" \
      "$REPO/.venv/bin/python" "$ORACLE/$script" "$dir" --backend all --all-frames \
      --strict-timestamps 2>&1 >/dev/null); then
      warned=$(data_warnings "$err")
      if [[ -n "$warned" ]]; then
        echo "FAIL $name: $script logged: $(head -n 1 <<<"$warned")"; status=1
      else
        echo "PASS $name: $script --backend all --all-frames --strict-timestamps, no warning"
      fi
    else
      echo "FAIL $name: $(grep -m1 'ORACLE FAIL' <<<"$err" || tail -n 1 <<<"$err")"; status=1
    fi
    # default settings (libsvtav1, crf 30): 37-38 dB here; libx264 at the same crf ~32 dB
    psnr_min=35
    [[ "$codec" == libx264 ]] && psnr_min=30
    for backend in pyav torchcodec; do
      HF_HOME="${HF_HOME:-/tmp/lerobot-v06-hf}" "$venv/bin/python" "$REPO/scripts/compat_profile_check.py" \
        "$dir" "$WORK/expected.npz" "$backend" "$ORACLE" "$psnr_min" 2>&1 | grep -E "^(PASS|FAIL|Traceback|[A-Za-z]*Error)" | sed "s|^|$name |"
      [[ ${PIPESTATUS[0]} == 0 ]] || status=1
    done
  done
done
exit $status
