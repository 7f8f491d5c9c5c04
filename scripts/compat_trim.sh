#!/usr/bin/env bash
# Part of `make compat` / `make compat-06`: a v3 export of trimmed episodes read by LeRobot 0.4.4
# (and 0.6.1 when its venv exists): at each kept frame index, both video backends must decode the
# raw frame at that index plus the trim start, pixel for pixel (the shard holds every recorded
# frame packet-copied; from_timestamp selects the kept ones). Exits 1 on any failure.
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
ORACLE="${EVA_ORACLE_DIR:-$REPO/../shared/oracle}"
WORK="$(mktemp -d -t eva-compat-trim.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
"$REPO/.venv/bin/python" - "$WORK" <<'PY' || { echo "FAIL compat_trim: writing the export"; exit 1; }
import sys
from pathlib import Path

import numpy as np

from eva.capture.synthetic import write_synthetic_dataset
from eva.dataset.reader import DatasetReader
from eva.export.pipeline import export_dataset
from eva.quality.edits import EditRequest, edit_episodes

work, camera = Path(sys.argv[1]), "observation.images.front"
trims = {0: (5, 25), 1: (7, 30), 2: (0, 20)}  # episode 2 as recorded
root = write_synthetic_dataset(work / "raw", episodes=3, frames=[30, 32, 20], cameras=[camera])
edit_episodes(root, [0], EditRequest(trim=trims[0]))
edit_episodes(root, [1], EditRequest(trim=trims[1], task="stack"))
export_dataset(root, "lerobot_v3")
reader = DatasetReader(root)
kept = {
    str(ep): np.concatenate([b.copy() for b in reader.iter_frames(ep, camera)])[start:end]
    for ep, (start, end) in trims.items()
}
np.savez(work / "expected.npz", **kept)
PY
status=0
for venv in "${LEROBOT_V3_VENV:-/tmp/lerobot-v3-venv}" "${LEROBOT_V06_VENV:-/tmp/lerobot-v06-venv}"; do
  [[ -x "$venv/bin/python" ]] || continue
  for backend in pyav torchcodec; do
    HF_HOME="${HF_HOME:-/tmp/lerobot-v06-hf}" "$venv/bin/python" "$REPO/scripts/compat_trim_check.py" \
      "$WORK/export/lerobot_v3/accepted" "$WORK/expected.npz" "$backend" "$ORACLE" 2>/dev/null \
      | sed "s|^|$(basename "$venv") |" || status=1
    [[ ${PIPESTATUS[0]} == 0 ]] || status=1
  done
done
exit $status
