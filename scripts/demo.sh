#!/usr/bin/env bash
# `make demo`: record a short simulated multi-camera session, review it, export it, verify it.
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO="${1:-demo-data}"
EVA=".venv/bin/eva"
rm -rf "$DEMO"
mkdir -p "$DEMO"
DEMO="$(cd "$DEMO" && pwd)"
cat > "$DEMO/collect.toml" <<TOML
[collection]
log_dir = "$DEMO/logs"
fps = 30
min_episode_frames = 10

[collection.tasks]
pick_cube = ["pick up the red cube and place it in the bin"]

[[collection.cameras]]
key = "observation.images.front"
width = 320
height = 240

[[collection.cameras]]
key = "observation.images.wrist"
width = 320
height = 240

[[collection.cameras]]
key = "observation.images.side"
width = 320
height = 240
TOML

echo "== record: 3 simulated episodes of 2 s, 3 cameras at 30 fps =="
$EVA collect "$DEMO/collect.toml" --episodes 3 --seconds 2 --source sim --dataset pick_cube
RAW="$DEMO/logs/pick_cube/raw"
$EVA info "$RAW"
$EVA validate "$RAW"

echo "== review: reject episode 1, accept the rest =="
$EVA qc "$RAW" 1 --fail --note "gripper slipped"
$EVA qc "$RAW" 2 --pass --note "checked by the demo"
$EVA qc "$RAW" --list

for fmt in lerobot_v21 lerobot_v3 hdf5 mcap; do
  echo "== export: $fmt =="
  $EVA export "$RAW" --format "$fmt"
  $EVA verify "$DEMO/logs/pick_cube/export/$fmt/accepted"
  $EVA verify "$DEMO/logs/pick_cube/export/$fmt/rejected"
done
echo "== merge: a second session of 2 episodes, then both sessions into one dataset =="
$EVA collect "$DEMO/collect.toml" --episodes 2 --seconds 2 --source sim --dataset pick_cube_2
$EVA merge "$RAW" "$DEMO/logs/pick_cube_2/raw" --into "$DEMO/logs/pick_cube_all/raw"
$EVA validate "$DEMO/logs/pick_cube_all/raw"

echo
echo "demo done: raw dataset in $RAW, exports in $DEMO/logs/pick_cube/export/"
echo "review it in the browser: $EVA console $DEMO/collect.toml   (prints http://127.0.0.1:8750/?token=...)"
