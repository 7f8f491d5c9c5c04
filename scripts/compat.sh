#!/usr/bin/env bash
# `make compat`: prove eva's outputs load in the real LeRobot readers (offline, CPU).
#
# 1. The LeRobot oracle venvs are built only when missing (setup_lerobot_venvs.sh, ~5 min).
# 2. Small synthetic v2.1 datasets are written with eva and exported to lerobot_v21 and lerobot_v3:
#      multi   : 5 episodes x 2 cameras, one red and one operator-FAILed (both subsets non-empty)
#      shards  : 6 episodes x 3 cameras, tiny shard limits and chunks_size 2 -> many data/video
#                files across chunk folders, exported with --verify-decode
#      allgood : 3 green episodes x 1 camera -> an empty rejected subset
#    plus the committed LeRobot-written v2.1 fixture (AV1) exported to v3.
# 3. lerobot_read_v21.py (LeRobot 0.3.3) reads every raw dir and v2.1 export; lerobot_read_v30.py
#    --backend all (LeRobot 0.4.4, torchcodec and pyav, pixels compared) reads every v3 export.
#    LeRobot cannot open a dataset with zero episodes (HF datasets refuses an empty split:
#    'Instruction "train" corresponds to no data'), so an empty subset is checked with
#    `eva verify` instead and reported as such, never silently skipped.
#    When the LeRobot 0.6.1 venv exists (setup_lerobot06_venv.sh; `make compat-06`),
#    lerobot_read_v30_06.py reads every v3 export too, every frame, both backends.
#    Any line an oracle prints on stderr about the data (LeRobot's log lines; only torchvision's
#    warnings about the venv itself are left out, scripts/lerobot_warnings.sh) fails its check.
# Prints PASS/FAIL per directory; exits 1 if anything failed.
#
# Environment: EVA_ORACLE_DIR (default <repo>/../shared/oracle), LEROBOT_V3_VENV /
# LEROBOT_V21_VENV (default /tmp/lerobot-v3-venv, /tmp/lerobot-v21-venv), COMPAT_WORK (default a
# fresh temp dir, removed at the end unless COMPAT_KEEP=1).
set -uo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
ORACLE="${EVA_ORACLE_DIR:-$REPO/../shared/oracle}"
V3_VENV="${LEROBOT_V3_VENV:-/tmp/lerobot-v3-venv}"
V21_VENV="${LEROBOT_V21_VENV:-/tmp/lerobot-v21-venv}"
PY="$REPO/.venv/bin/python"
EVA="$REPO/.venv/bin/eva"

if [[ ! -f "$ORACLE/lerobot_read_v30.py" ]]; then
  echo "compat: oracle not found at $ORACLE (set EVA_ORACLE_DIR)" >&2
  exit 2
fi
if [[ ! -x "$V3_VENV/bin/python" || ! -x "$V21_VENV/bin/python" ]]; then
  echo "compat: LeRobot venvs missing, building them (setup_lerobot_venvs.sh)" >&2
  LEROBOT_V3_VENV="$V3_VENV" LEROBOT_V21_VENV="$V21_VENV" bash "$ORACLE/setup_lerobot_venvs.sh" || {
    echo "compat: building the LeRobot venvs failed" >&2
    exit 2
  }
fi
export LEROBOT_V3_PYTHON="$V3_VENV/bin/python"
export LEROBOT_V21_PYTHON="$V21_VENV/bin/python"

WORK="${COMPAT_WORK:-$(mktemp -d -t eva-compat.XXXXXX)}"
mkdir -p "$WORK"
cleanup() { [[ "${COMPAT_KEEP:-0}" == 1 || -n "${COMPAT_WORK:-}" ]] || rm -rf "$WORK"; }
trap cleanup EXIT
echo "compat: work dir $WORK, oracle $ORACLE"

# ---- 2. datasets and exports ----
"$PY" - "$WORK" <<'EOF' || { echo "compat: FAIL writing the synthetic datasets" >&2; exit 1; }
import sys
from pathlib import Path

from eva.capture.synthetic import write_synthetic_dataset

work = Path(sys.argv[1])
write_synthetic_dataset(
    work / "multi" / "raw", episodes=5, frames=[24, 31, 18, 40, 27], cameras=2,
    quality=["green", "red", "green", "green", "green"],
    qc_verdicts=[None, None, None, "fail", None], tasks=["pick the cube", "place the cube"], seed=1,
)
write_synthetic_dataset(
    work / "shards" / "raw", episodes=6, frames=[33, 21, 45, 30, 26, 38], cameras=3,
    quality=["green", "green", "red", "green", "green", "green"], seed=2,
)
write_synthetic_dataset(work / "allgood" / "raw", episodes=3, frames=[20, 25, 30], cameras=1, seed=3)
EOF

export_ok=1
run_export() {  # dataset, format, extra eva export options...
  local ds="$1" fmt="$2"
  shift 2
  if ! "$EVA" export "$WORK/$ds/raw" --format "$fmt" --json "$@" >"$WORK/$ds-$fmt.log" 2>&1; then
    echo "FAIL export $ds -> $fmt: $(tail -n 1 "$WORK/$ds-$fmt.log")"
    export_ok=0
  fi
}
for ds in multi allgood; do
  run_export "$ds" v21
  run_export "$ds" v3
done
run_export shards v21
# ~0.01 MB per data file and ~0.02 MB per MP4: several episodes per file, many files.
run_export shards v3 --verify-decode --data-file-size-mb 0.012 --video-file-size-mb 0.025

# chunks_size is not a CLI option: one more v3 export through the API with chunks_size 2.
"$PY" - "$WORK" <<'EOF' >"$WORK/shards-chunks.log" 2>&1 || { echo "FAIL export shards -> v3 chunks_size 2: $(tail -n 1 "$WORK/shards-chunks.log")"; export_ok=0; }
import shutil
import sys
from pathlib import Path

from eva.export.pipeline import export_dataset
from eva.formats.base import ExportOptions
from eva.formats.options import LeRobotV3Options

work = Path(sys.argv[1])
src = work / "shards_chunks" / "raw"
shutil.copytree(work / "shards" / "raw", src)
v3 = LeRobotV3Options(chunks_size=2, data_files_size_in_mb=1e-6, video_files_size_in_mb=1e-6)
export_dataset(src, "lerobot_v3", options=ExportOptions(format=v3))
EOF

# A v2.1 dataset written by LeRobot 0.3.3 itself (AV1 video, committed fixture) through eva to v3.
mkdir -p "$WORK/lerobot_fixture"
cp -r "$REPO/tests/fixtures/lerobot_v21_fixture" "$WORK/lerobot_fixture/raw"
run_export lerobot_fixture v3

# ---- 3. the real readers ----
pass=0
fail=0
report() {  # status, dir, detail
  printf '%-5s %s%s\n' "$1" "${2#"$WORK"/}" "${3:+  ($3)}"
  if [[ "$1" == FAIL ]]; then fail=$((fail + 1)); else pass=$((pass + 1)); fi
}
# shellcheck source=scripts/lerobot_warnings.sh
source "$REPO/scripts/lerobot_warnings.sh"
oracle() {  # reader script, dir, extra args...
  local script="$1" dir="$2"
  shift 2
  local out warned
  if out=$("$PY" "$ORACLE/$script" "$dir" "$@" 2>&1 >/dev/null); then
    # A load that logs about the data (an info.json key LeRobot does not know...) is a failure:
    # a training log full of warnings makes users doubt the data.
    warned=$(data_warnings "$out")
    if [[ -n "$warned" ]]; then
      report FAIL "$dir" "$script logged: $(head -n 1 <<<"$warned")"
    else
      report PASS "$dir" "$script $*, no warning"
    fi
  else
    report FAIL "$dir" "$(grep -m1 'ORACLE FAIL' <<<"$out" || tail -n 1 <<<"$out")"
  fi
}
episodes_of() {
  "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["total_episodes"])' "$1/meta/info.json"
}
check_subset() {  # script, dir, extra args...
  local script="$1" dir="$2"
  shift 2
  if [[ ! -f "$dir/meta/info.json" ]]; then
    report FAIL "$dir" "missing"
    return
  fi
  if [[ "$(episodes_of "$dir")" == 0 ]]; then
    # LeRobot cannot load an empty dataset at all; eva's own verifier is the check here.
    if msg=$("$EVA" verify "$dir" 2>&1); then
      report PASS "$dir" "empty subset: eva verify (LeRobot cannot load 0 episodes)"
    else
      report FAIL "$dir" "eva verify: $(tail -n 1 <<<"$msg")"
    fi
    return
  fi
  oracle "$script" "$dir" "$@"
}

for ds in multi shards allgood; do
  check_subset lerobot_read_v21.py "$WORK/$ds/raw"
  for subset in accepted rejected; do
    check_subset lerobot_read_v21.py "$WORK/$ds/export/lerobot_v21/$subset"
  done
done
for ds in multi shards allgood shards_chunks lerobot_fixture; do
  for subset in accepted rejected; do
    check_subset lerobot_read_v30.py "$WORK/$ds/export/lerobot_v3/$subset" --backend all --strict-timestamps
  done
done
check_subset lerobot_read_v30.py "$WORK/shards/export/lerobot_v3/accepted" --backend pyav --all-frames
# LeRobot 0.6.1, the newest release, when its venv is built (5 GB: `make compat-06` builds it).
V06_PYTHON="${LEROBOT_V06_PYTHON:-${LEROBOT_V06_VENV:-/tmp/lerobot-v06-venv}/bin/python}"
if [[ -x "$V06_PYTHON" ]]; then
  export LEROBOT_V06_PYTHON="$V06_PYTHON"
  for ds in multi shards allgood shards_chunks lerobot_fixture; do
    for subset in accepted rejected; do
      check_subset lerobot_read_v30_06.py "$WORK/$ds/export/lerobot_v3/$subset" \
        --backend all --all-frames --strict-timestamps
    done
  done
else
  echo "note: LeRobot 0.6.1 not checked ($V06_PYTHON missing; make compat-06 builds it and runs this)"
fi

# docs/formats.md's LeRobot example, as written, in LeRobot's venv.
if EVA_ORACLE_DIR="$ORACLE" "$REPO/.venv/bin/pytest" -q -p no:cacheprovider \
    "$REPO/tests/test_docs_formats.py" -k lerobot_example >"$WORK/docs_example.log" 2>&1 &&
    grep -q "1 passed" "$WORK/docs_example.log"; then
  echo "PASS docs/formats.md LeRobot example"
  pass=$((pass + 1))
else
  echo "FAIL docs/formats.md LeRobot example:"
  tail -20 "$WORK/docs_example.log"
  fail=$((fail + 1))
fi

echo "compat: $pass passed, $fail failed"
[[ $fail -eq 0 && $export_ok -eq 1 ]]
