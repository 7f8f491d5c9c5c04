"""The training video profile (``--video-profile training``) against LeRobot's own encoder on the
same frames, in the same run.

Input: the realistic corpus (bench/corpus.py, ``eva`` encoding: eva's capture settings, GOP 30;
quick: 640x480, 150 frames per episode), camera 0 of its first ``episodes`` episodes. For each
episode:

* eva: ``eva.formats._training_video.encode_episode`` (what the export runs per camera and
  episode: the recorded MP4 decoded and re-encoded, libsvtav1 g 2 crf 30 preset 12), its CPU time
  (this process's user + system, encoder threads included);
* LeRobot 0.4.4 (the oracle venv, /tmp/lerobot-v3-venv): the same frames written as the PNGs
  lerobot-record leaves, then ``encode_video_frames(imgs_dir, path, fps)`` at its defaults (the
  same settings); the CPU time of that call alone (PNG writing left out).

Then, over all episodes: CPU per frame (ratio eva / LeRobot, goal <= 1.1), random-access decode
latency of both outputs measured alike (``eva.export.decode_latency.read_frame_at``: open, seek
to the keyframe before, decode forward, as LeRobot's pyav backend does), the same random frame of
each read one after the other (600 reads each; ratio of p99, goal <= 1.2),
bytes per frame, and the PSNR of each output against the recorded frames.

    python bench/bench_video_profile.py [--quick | --full] [--episodes N]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import av
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402

from eva.dataset.reader import DatasetReader  # noqa: E402
from eva.export.decode_latency import frame_times, read_frame_at  # noqa: E402
from eva.formats._training_video import TrainingEncoding, encode_episode  # noqa: E402

LEROBOT_PYTHON = Path(os.environ.get("LEROBOT_V3_VENV", "/tmp/lerobot-v3-venv")) / "bin/python"
ORACLE = Path(
    os.environ.get("EVA_ORACLE_DIR", Path(__file__).resolve().parents[1] / "../shared/oracle")
)

# Run in LeRobot's venv: the recorded MP4 to PNGs (untimed), then LeRobot's encoder call (timed).
LEROBOT_SIDE = r"""
import json, resource, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[4])
import _tv_cpu_shim  # the oracle's: PyPI torchvision beside a CPU torch
import av
from lerobot.datasets.video_utils import encode_video_frames
src, dest, fps = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
with tempfile.TemporaryDirectory() as tmp:
    with av.open(src) as c:
        for i, frame in enumerate(c.decode(video=0)):
            frame.to_image().save(f"{tmp}/frame-{i:06d}.png")
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    encode_video_frames(tmp, dest, fps, overwrite=True)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu_s": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, "frames": i + 1}))
"""


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _frames(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def paired_latency(
    eva_files: list[Path], lerobot_files: list[Path], samples: int
) -> tuple[tuple[float, float], tuple[float, float]]:
    """(p50, p99) ms of random reads (``read_frame_at``) of each output: the same frame of both
    read one after the other, so a load spike on the shared machine meets both alike."""
    picks = [
        (mine, theirs, t)
        for mine, theirs in zip(eva_files, lerobot_files, strict=True)
        for t in frame_times(mine)
    ]
    rng = random.Random(0)
    times: list[list[float]] = [[], []]
    for _ in range(samples):
        pick = picks[rng.randrange(len(picks))]
        for side in (0, 1):
            started = time.perf_counter()
            read_frame_at(pick[side], pick[2])
            times[side].append(1000 * (time.perf_counter() - started))
    eva, lerobot = (np.percentile(t, [50, 99]) for t in times)
    return (float(eva[0]), float(eva[1])), (float(lerobot[0]), float(lerobot[1]))


def run(params: corpus.CorpusParams, episodes: int, out: Path, samples: int) -> dict[str, Any]:
    raw = corpus.ensure_corpus("eva", params)
    reader = DatasetReader(raw)
    key = corpus.camera_keys(params)[0]
    encoding = TrainingEncoding("libsvtav1", 30)
    eva_files, lerobot_files = [], []
    eva_cpu = lerobot_cpu = 0.0
    frames = 0
    psnr_eva, psnr_lerobot = [], []
    for episode in range(min(episodes, params.episodes)):
        source = reader.video_file(episode, key)
        length = int(reader.episodes[episode]["length"])
        mine, theirs = out / f"eva-{episode}.mp4", out / f"lerobot-{episode}.mp4"
        started = _cpu()
        encode_episode(source, mine, encoding, params.fps, None, length)
        eva_cpu += _cpu() - started
        done = subprocess.run(
            [LEROBOT_PYTHON, "-c", LEROBOT_SIDE, source.path, theirs, str(params.fps), ORACLE],
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, "SVT_LOG": "1"},
        )
        lerobot_cpu += json.loads(done.stdout.strip().splitlines()[-1])["cpu_s"]
        frames += length
        recorded = np.concatenate([b.copy() for b in reader.iter_frames(episode, key)])
        psnr_eva.append(psnr(_frames(mine), recorded))
        psnr_lerobot.append(psnr(_frames(theirs), recorded))
        eva_files.append(mine)
        lerobot_files.append(theirs)
    eva_lat, lerobot_lat = paired_latency(eva_files, lerobot_files, samples)
    p99 = [eva_lat[1], lerobot_lat[1]]
    p50 = [eva_lat[0], lerobot_lat[0]]
    size = [sum(f.stat().st_size for f in files) / frames for files in (eva_files, lerobot_files)]
    return {
        "input": f"{min(episodes, params.episodes)} episodes of {key}, {params.width}x"
        f"{params.height}, {frames} frames",
        "cpu_ms_per_frame": {
            "eva": 1000 * eva_cpu / frames,
            "lerobot": 1000 * lerobot_cpu / frames,
        },
        "cpu_ratio": eva_cpu / lerobot_cpu,
        "p50_ms": {"eva": p50[0], "lerobot": p50[1]},
        "p99_ms": {"eva": p99[0], "lerobot": p99[1]},
        "p99_ratio": p99[0] / p99[1],
        "bytes_per_frame": {"eva": size[0], "lerobot": size[1]},
        "latency_samples": samples,
        "psnr_db": {"eva": float(np.mean(psnr_eva)), "lerobot": float(np.mean(psnr_lerobot))},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the full corpus (default: quick)")
    parser.add_argument("--episodes", type=int, default=2)
    parser.add_argument("--samples", type=int, default=600, help="random reads of each output")
    args = parser.parse_args(argv)
    if not LEROBOT_PYTHON.exists():
        print(
            f"bench_video_profile: {LEROBOT_PYTHON} missing (make compat builds it)",
            file=sys.stderr,
        )
        return 2
    params = corpus.FULL if args.full else corpus.QUICK
    with tempfile.TemporaryDirectory(prefix="eva-bench-profile-") as tmp:
        result = run(params, args.episodes, Path(tmp), args.samples)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
