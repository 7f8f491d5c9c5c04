#!/usr/bin/env bash
# `make compat`, part zarr: eva's zarr stores read by the trainers' own code (offline, CPU).
#
# tests/test_zarr_oracles.py exports a synthetic dataset (4 episodes x 2 cameras: one rejected,
# one trimmed, one with an edited task) to zarr, raw and Blosc/zstd, and reads both subsets with
#   - diffusion_policy's ReplayBuffer (copy_from_path into numpy and into a zarr MemoryStore,
#     get_episode of every episode), its replay_buffer.py copied unmodified out of a git snapshot
#     of the real-stanford/diffusion_policy repository (DIFFUSION_POLICY_REPO) into a temp dir,
#     run in the trainer oracle venv (zarr 2.x, numcodecs);
#   - zarr 3 reading the v2 store (the oracle's zarr3 venv).
# Every frame and row must equal the source's. Here no test may skip: a missing venv is built
# (the oracle's setup_trainer_oracles.sh, ~3 min the first time), a missing snapshot fails.
#
# Environment: EVA_ORACLE_DIR (default <repo>/../shared/oracle), TRAINER_ORACLES (default
# /tmp/trainer-oracles), DIFFUSION_POLICY_REPO (a git directory of diffusion_policy).
set -uo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
ORACLE="${EVA_ORACLE_DIR:-$REPO/../shared/oracle}"
export TRAINER_ORACLES="${TRAINER_ORACLES:-/tmp/trainer-oracles}"
export DIFFUSION_POLICY_REPO="${DIFFUSION_POLICY_REPO:-/work/.mirror/real-stanford+diffusion_policy/repo}"

if [[ ! -f "$TRAINER_ORACLES/venv/.ready" || ! -f "$TRAINER_ORACLES/zarr3/.ready" ]]; then
  echo "compat_zarr: trainer oracle venvs missing, building them (setup_trainer_oracles.sh)" >&2
  bash "$ORACLE/setup_trainer_oracles.sh" >/dev/null || {
    echo "FAIL zarr: building the trainer oracle venvs failed" >&2
    exit 2
  }
fi
if ! git -C "$DIFFUSION_POLICY_REPO" cat-file -e HEAD:diffusion_policy/common/replay_buffer.py 2>/dev/null; then
  echo "FAIL zarr: no diffusion_policy snapshot at $DIFFUSION_POLICY_REPO (set DIFFUSION_POLICY_REPO)" >&2
  exit 1
fi

LOG="$(mktemp -t eva-compat-zarr.XXXXXX)"
trap 'rm -f "$LOG"' EXIT
"$REPO/.venv/bin/pytest" -q -p no:cacheprovider -rs "$REPO/tests/test_zarr_oracles.py" >"$LOG" 2>&1
status=$?
if [[ $status -eq 0 ]] && ! grep -q "skipped" "$LOG"; then
  echo "PASS zarr: diffusion_policy ReplayBuffer and zarr 3 read every episode ($(tail -n 1 "$LOG"))"
  exit 0
fi
echo "FAIL zarr:"
tail -30 "$LOG"
exit 1
