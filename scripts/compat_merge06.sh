#!/usr/bin/env bash
# `make compat-06`, part 2: a v3 export of a dataset made by `eva merge` goes through LeRobot
# 0.6.1's own editing tool, offline, CPU.
#
# 1. Three synthetic sessions of one rig (2 cameras). a and b are merged by eva merge. Then the
#    merged dataset and c are exported to lerobot_v3, the merged one with small shard limits so
#    that each camera has several video files.
# 2. lerobot-edit-dataset --operation.type merge (concatenate_videos on, the default) joins the
#    two accepted subsets. lerobot_read_v30_06.py then reads the result: every frame, both
#    decoders, strict timestamps, and the episode count is the sum of the two.
# 3. lerobot-edit-dataset --operation.type delete_episodes deletes episodes 0 and 2 of the
#    merged export; the reader checks the result the same way.
# Prints PASS/FAIL per check; exits 1 if anything failed, 2 when the 0.6.1 venv is missing.
#
# Environment: EVA_ORACLE_DIR, LEROBOT_V06_VENV (default /tmp/lerobot-v06-venv), COMPAT_WORK.
set -uo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
ORACLE="${EVA_ORACLE_DIR:-$REPO/../shared/oracle}"
V06="${LEROBOT_V06_VENV:-/tmp/lerobot-v06-venv}"
PY="$REPO/.venv/bin/python"
EVA="$REPO/.venv/bin/eva"
if [[ ! -x "$V06/bin/lerobot-edit-dataset" ]]; then
  echo "compat-merge: $V06/bin/lerobot-edit-dataset missing (setup_lerobot06_venv.sh builds it)" >&2
  exit 2
fi
export LEROBOT_V06_PYTHON="$V06/bin/python"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export HF_HOME="${HF_HOME:-/tmp/lerobot-v06-hf}"

WORK="${COMPAT_WORK:-$(mktemp -d -t eva-compat-merge.XXXXXX)}"
mkdir -p "$WORK"
cleanup() { [[ "${COMPAT_KEEP:-0}" == 1 || -n "${COMPAT_WORK:-}" ]] || rm -rf "$WORK"; }
trap cleanup EXIT
export HF_LEROBOT_HOME="$WORK/hf_lerobot_home"
echo "compat-merge: work dir $WORK"

pass=0
fail=0
report() {  # status, what, detail
  printf '%-5s %s%s\n' "$1" "$2" "${3:+  ($3)}"
  if [[ "$1" == FAIL ]]; then fail=$((fail + 1)); else pass=$((pass + 1)); fi
}
run() {  # what, log, command...
  local what="$1" log="$2"
  shift 2
  if "$@" >"$log" 2>&1; then report PASS "$what"; else report FAIL "$what" "$(tail -n 1 "$log")"; fi
}
read_v3() {  # what, dir, expected episodes
  local out
  if out=$("$PY" "$ORACLE/lerobot_read_v30_06.py" "$2" --backend all --all-frames \
      --strict-timestamps 2>"$WORK/oracle.err"); then
    local n
    n=$("$PY" -c 'import json,sys; print(json.loads(sys.argv[1])["episodes"])' "$out" 2>/dev/null)
    if [[ -n "$3" && "$n" != "$3" ]]; then
      report FAIL "$1" "LeRobot 0.6.1 read $n episodes, expected $3"
    else
      report PASS "$1" "LeRobot 0.6.1 read $n episodes, every frame, both decoders"
    fi
  else
    report FAIL "$1" "$(grep -m1 'ORACLE FAIL' "$WORK/oracle.err" || tail -n 1 "$WORK/oracle.err")"
  fi
}

"$PY" - "$WORK" <<'EOF' || { echo "compat-merge: FAIL writing the sessions" >&2; exit 1; }
import sys
from pathlib import Path

from eva.capture.synthetic import write_synthetic_dataset

work = Path(sys.argv[1])
write_synthetic_dataset(work / "a" / "raw", episodes=3, frames=[24, 31, 18], cameras=2,
                        tasks=["pick the cube", "place the cube"], seed=1)
write_synthetic_dataset(work / "b" / "raw", episodes=3, frames=[27, 20, 35], cameras=2,
                        quality=["green", "red", "green"], tasks=["wipe the table"], seed=2)
write_synthetic_dataset(work / "c" / "raw", episodes=2, frames=[22, 26], cameras=2,
                        tasks=["pick the cube"], seed=3)
EOF

run "eva merge a b" "$WORK/merge.log" "$EVA" merge "$WORK/a/raw" "$WORK/b/raw" --into "$WORK/ab/raw"
run "eva validate ab" "$WORK/validate.log" "$EVA" validate "$WORK/ab/raw"
run "eva export ab -> v3 (small shards)" "$WORK/export-ab.log" "$EVA" export "$WORK/ab/raw" \
  --format v3 --data-file-size-mb 0.012 --video-file-size-mb 0.025
run "eva export c -> v3" "$WORK/export-c.log" "$EVA" export "$WORK/c/raw" --format v3
AB="$WORK/ab/export/lerobot_v3/accepted"
C="$WORK/c/export/lerobot_v3/accepted"
episodes_of() { "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["total_episodes"])' "$1/meta/info.json"; }
N_AB=$(episodes_of "$AB")
N_C=$(episodes_of "$C")
read_v3 "merged export as exported" "$AB" "$N_AB"

run "lerobot-edit-dataset merge (concatenate_videos on)" "$WORK/lerobot-merge.log" \
  "$V06/bin/lerobot-edit-dataset" --new_repo_id eva/merged --new_root "$WORK/lerobot_merged" \
  --operation.type merge --operation.repo_ids "['eva/ab', 'eva/c']" \
  --operation.roots "['$AB', '$C']" --operation.concatenate_videos true
read_v3 "LeRobot's merge of eva's merged export and another eva export" "$WORK/lerobot_merged" \
  $((N_AB + N_C))

run "lerobot-edit-dataset delete_episodes [0, 2]" "$WORK/lerobot-delete.log" \
  "$V06/bin/lerobot-edit-dataset" --repo_id eva/ab --root "$AB" --new_repo_id eva/ab_deleted \
  --new_root "$WORK/lerobot_deleted" --operation.type delete_episodes \
  --operation.episode_indices "[0, 2]"
read_v3 "LeRobot's delete_episodes of eva's merged export" "$WORK/lerobot_deleted" $((N_AB - 2))

echo "compat-merge: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
