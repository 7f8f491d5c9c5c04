#!/usr/bin/env bash
# `make compat`, part hdf5: eva's HDF5 trainer layouts read by the trainers' own loaders
# (offline, CPU).
#
# tests/test_hdf5_oracles.py exports a synthetic dataset (4 episodes x 2 cameras: one rejected,
# one trimmed, one with an edited task) with --hdf5-layout aloha and robomimic, and reads both
# subsets with
#   - ACT's get_norm_stats and EpisodicDataset (every frame of every episode), its utils.py copied
#     unmodified out of a git snapshot of the tonyzhaozh/act repository (ACT_REPO) into a temp dir;
#   - robomimic 0.3.0's FileUtils.get_shape_metadata_from_dataset and SequenceDataset (every demo,
#     then the mask/train and mask/valid filter keys),
# both in the trainer oracle venv (torch, h5py, IPython, robomimic). Every frame and row must
# equal the source's; docs/formats.md's ACT and robomimic examples run as written
# (tests/test_docs_formats.py). Here no test may skip: a missing venv is built (the oracle's
# setup_trainer_oracles.sh, ~3 min the first time), a missing snapshot fails.
#
# Environment: EVA_ORACLE_DIR (default <repo>/../shared/oracle), TRAINER_ORACLES (default
# /tmp/trainer-oracles), ACT_REPO (a git directory of tonyzhaozh/act).
set -uo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
export EVA_ORACLE_DIR="${EVA_ORACLE_DIR:-$REPO/../shared/oracle}"
export TRAINER_ORACLES="${TRAINER_ORACLES:-/tmp/trainer-oracles}"
export ACT_REPO="${ACT_REPO:-/work/.mirror/tonyzhaozh+act/repo}"

if [[ ! -f "$TRAINER_ORACLES/venv/.ready" ]]; then
  echo "compat_hdf5: trainer oracle venv missing, building it (setup_trainer_oracles.sh)" >&2
  bash "$EVA_ORACLE_DIR/setup_trainer_oracles.sh" >/dev/null || {
    echo "FAIL hdf5: building the trainer oracle venvs failed" >&2
    exit 2
  }
fi
if ! git -C "$ACT_REPO" cat-file -e HEAD:utils.py 2>/dev/null; then
  echo "FAIL hdf5: no ACT snapshot at $ACT_REPO (set ACT_REPO)" >&2
  exit 1
fi

LOG="$(mktemp -t eva-compat-hdf5.XXXXXX)"
trap 'rm -f "$LOG"' EXIT
"$REPO/.venv/bin/pytest" -q -p no:cacheprovider -rs "$REPO/tests/test_hdf5_oracles.py" \
  "$REPO/tests/test_docs_formats.py" -k "test_act or test_robomimic or trainer_example" >"$LOG" 2>&1
status=$?
if [[ $status -eq 0 ]] && ! grep -q "skipped" "$LOG"; then
  echo "PASS hdf5: ACT (aloha layout) and robomimic 0.3.0 (robomimic layout) load every episode ($(tail -n 1 "$LOG"))"
  exit 0
fi
echo "FAIL hdf5:"
tail -30 "$LOG"
exit 1
