"""LeRobot v3.0 export (``eva.formats.lerobot_v3``) against LeRobot's own converter and ``cp -r``.

``report(quick)`` builds one all-green synthetic v2.1 dataset (full: 50 episodes x 3 cameras x 90
frames at 320x240; quick: 12 x 3 x 45 at 160x120; cached in the temp dir between runs), so the
accepted subset is the whole dataset, then measures in this run:

* ``eva export --format v3`` (``export_dataset``: source validation, split, v3 writer with packet
  copy from the MP4 sample tables, exact image quantiles from the histograms the capture writer
  recorded (no decode), one ``syncfs``, publication) against LeRobot 0.4.4's
  ``convert_dataset_v21_to_v30.convert_dataset`` on a copy of the same v2.1 dataset, run offline
  in the oracle venv in a subprocess; its time is measured inside that process around
  ``convert_dataset`` only (imports excluded). ``ratio`` = LeRobot / eva (> 1: eva is faster).
* the v3 writer alone (``write_subset`` of the accepted subset, metadata prepared beforehand)
  against the same LeRobot time: the like-for-like part of the comparison.
* the writer on the same source without its recorded histograms (as for a LeRobot-written
  source): image quantiles from one keyframe per episode and camera; with
  ``image_quantiles="none"`` (no keyframe decoding), like LeRobot's converter, which computes no
  quantiles at all; and with ``image_quantile_keyframes=0`` (every keyframe decoded).
* bytes written: the accepted v3 directory against LeRobot's converted directory (ratio = LeRobot
  bytes / eva bytes; eva also writes quantile stats and the kept jsonl metadata).
* ``cp -r`` of the v2.1 source: the practical limit of any converter that must read and rewrite
  every byte (ratio = cp / eva: the fraction of plain-copy speed eva reaches).
* eva with ``--verify-decode`` (every frame decoded): the price of the full check.

Without the LeRobot venv the LeRobot rows say so in their note (baseline None), never vanish.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from eva.capture.synthetic import write_synthetic_dataset
from eva.dataset.reader import DatasetReader
from eva.export.pipeline import export_dataset, prepare
from eva.formats import lerobot_v3
from eva.formats.base import ExportOptions
from eva.formats.options import LeRobotV3Options
from eva.progress import Progress

REPO = Path(__file__).resolve().parent.parent
ORACLE_DIR = Path(os.environ.get("EVA_ORACLE_DIR", REPO.parent / "shared" / "oracle"))
LEROBOT_PYTHON = Path(os.environ.get("LEROBOT_V3_PYTHON", "/tmp/lerobot-v3-venv/bin/python"))
CAMERAS = 3

# Runs inside the LeRobot 0.4.4 venv: offline, torchvision CPU shim first (see oracle README).
_LEROBOT_CONVERT = """
import json, os, sys, time
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, sys.argv[1])
import _tv_cpu_shim  # noqa: F401
import logging
logging.disable(logging.WARNING)
from lerobot.datasets.v30.convert_dataset_v21_to_v30 import convert_dataset
start = time.perf_counter()
convert_dataset(repo_id=sys.argv[3], root=sys.argv[2], push_to_hub=False)
print(json.dumps({"seconds": time.perf_counter() - start}))
"""


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def source_dataset(episodes: int, frames: int, width: int, height: int) -> Path:
    """The v2.1 source, written once per size through the real capture writer and cached."""
    cache = (
        Path(tempfile.gettempdir()) / f"eva-bench-v3-{episodes}x{CAMERAS}x{frames}-{width}x{height}"
    )
    root = cache / "raw"
    if not (cache / ".complete").exists():
        shutil.rmtree(cache, ignore_errors=True)
        write_synthetic_dataset(
            root,
            episodes=episodes,
            frames=frames,
            cameras=CAMERAS,
            width=width,
            height=height,
            tasks=["pick the cube", "place the cube", "stack the cubes"],
            seed=11,
        )
        (cache / ".complete").touch()
    return root


def eva_export_seconds(source: Path, work: Path, **extra: Any) -> tuple[float, Path]:
    """Copy the source into ``work`` (untimed) and export it there; returns (seconds, accepted)."""
    src = work / "raw"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(source, src)
    start = time.perf_counter()
    result = export_dataset(
        src, "lerobot_v3", options=ExportOptions(format=LeRobotV3Options(**extra))
    )
    seconds = time.perf_counter() - start
    return seconds, result.accepted_dir


def writer_seconds(source: Path, work: Path, *, recorded: bool = True, **extra: Any) -> float:
    """The v3 writer alone (``write_subset`` of the accepted subset): the part that corresponds to
    LeRobot's converter, without eva's source validation, split and publication.
    ``recorded=False`` drops the source's recorded image histograms, as for a LeRobot-written
    source (image quantiles then come from the keyframe sample)."""
    shutil.rmtree(work, ignore_errors=True)
    reader, _plan, metas = prepare(source)
    meta = metas["accepted"]
    if not recorded:
        meta = dataclasses.replace(meta, image_histograms={})
    start = time.perf_counter()
    lerobot_v3.write_subset(
        reader, meta, work, Progress(), ExportOptions(format=LeRobotV3Options(**extra))
    )
    return time.perf_counter() - start


def lerobot_convert(source: Path, work: Path) -> tuple[float | None, int | None, str]:
    """(seconds inside convert_dataset, bytes of the converted dataset, note)."""
    if not LEROBOT_PYTHON.exists():
        return None, None, f"LeRobot venv missing ({LEROBOT_PYTHON}); run make compat first"
    repo_id = "bench/v21"
    dataset = work / repo_id
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(source, dataset)
    proc = subprocess.run(
        [str(LEROBOT_PYTHON), "-c", _LEROBOT_CONVERT, str(ORACLE_DIR), str(work), repo_id],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return None, None, f"LeRobot converter failed: {tail}"
    seconds = json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]
    return seconds, dir_bytes(dataset), "LeRobot 0.4.4 convert_dataset, offline, in-process time"


def cp_seconds(source: Path, work: Path) -> float:
    shutil.rmtree(work, ignore_errors=True)
    start = time.perf_counter()
    subprocess.run(["cp", "-r", str(source), str(work)], check=True)
    return time.perf_counter() - start


def _row(
    name: str, value: float, baseline: float | None, unit: str, note: str, ratio: float | None
) -> dict[str, Any]:
    return {
        "name": name,
        "value": round(value, 4),
        "baseline": None if baseline is None else round(baseline, 4),
        "ratio": None if ratio is None else round(ratio, 3),
        "unit": unit,
        "note": note,
    }


def report(quick: bool = False) -> list[dict[str, Any]]:
    episodes, frames, width, height = (12, 45, 160, 120) if quick else (50, 90, 320, 240)
    repeats = 1 if quick else 2
    source = source_dataset(episodes, frames, width, height)
    size = f"{episodes} ep x {CAMERAS} cams x {frames} frames {width}x{height}"
    src_bytes = dir_bytes(source)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="eva-bench-v3-") as tmp:
        work = Path(tmp)
        eva_runs = [eva_export_seconds(source, work / f"eva{i}") for i in range(repeats)]
        eva_s = min(s for s, _ in eva_runs)
        accepted = eva_runs[0][1]
        problems = lerobot_v3.verify(accepted)
        if problems:
            raise RuntimeError(f"bench export does not verify: {problems[0]}")
        eva_bytes = dir_bytes(accepted)
        shards = len(list((accepted / "videos").rglob("*.mp4")))
        write_s = min(writer_seconds(source, work / f"writer{i}") for i in range(repeats))
        sampled_s = min(
            writer_seconds(source, work / f"sampled{i}", recorded=False) for i in range(repeats)
        )
        bare_s = min(
            writer_seconds(source, work / f"bare{i}", recorded=False, image_quantiles="none")
            for i in range(repeats)
        )
        every_s = min(
            writer_seconds(source, work / f"every{i}", recorded=False, image_quantile_keyframes=0)
            for i in range(repeats)
        )
        lr_s, lr_bytes, lr_note = lerobot_convert(source, work / "lerobot")
        cp_s = min(cp_seconds(source, work / f"cp{i}") for i in range(max(repeats, 3)))
        verify_s, _ = eva_export_seconds(source, work / "verify", verify_decode=True)
        total_frames = DatasetReader(source).total_frames * CAMERAS

        rows.append(
            _row(
                "v3 export vs LeRobot convert_dataset_v21_to_v30",
                eva_s,
                lr_s,
                "s",
                f"{size}; {lr_note}; eva end to end incl. validation and publication",
                None if lr_s is None else lr_s / eva_s,
            )
        )
        rows.append(
            _row(
                "v3 writer alone vs LeRobot convert_dataset_v21_to_v30",
                write_s,
                lr_s,
                "s",
                f"{size}; write_subset of the accepted subset (packet copy, parquet shards, "
                "metadata; exact image quantiles from the histograms recorded at capture, no "
                "decode)",
                None if lr_s is None else lr_s / write_s,
            )
        )
        rows.append(
            _row(
                "v3 writer, foreign source (keyframe sample) vs LeRobot converter",
                sampled_s,
                lr_s,
                "s",
                f"{size}; without recorded histograms (as for a LeRobot-written source): image "
                "quantiles from 1 keyframe per episode and camera, decoded in worker threads",
                None if lr_s is None else lr_s / sampled_s,
            )
        )
        rows.append(
            _row(
                "v3 writer without image quantiles vs LeRobot converter",
                bare_s,
                lr_s,
                "s",
                f"{size}; foreign source, image_quantiles=none: what LeRobot's converter does (it "
                "computes no image quantiles); the keyframe sample costs the difference to the "
                "foreign-source row",
                None if lr_s is None else lr_s / bare_s,
            )
        )
        rows.append(
            _row(
                "v3 writer, every keyframe decoded vs LeRobot converter",
                every_s,
                lr_s,
                "s",
                f"{size}; foreign source, image_quantile_keyframes=0: every GOP-th frame decoded "
                "for the image "
                "quantiles instead of the default bound of one keyframe per episode and camera",
                None if lr_s is None else lr_s / every_s,
            )
        )
        rows.append(
            _row(
                "v3 bytes written vs LeRobot converter",
                eva_bytes / 2**20,
                None if lr_bytes is None else lr_bytes / 2**20,
                "MiB",
                f"{size}; {shards} MP4 shards; eva adds quantile stats + kept jsonl metadata "
                "(ratio = LeRobot / eva)",
                None if lr_bytes is None else lr_bytes / eva_bytes,
            )
        )
        rows.append(
            _row(
                "v3 export vs cp -r of the source (limit)",
                eva_s,
                cp_s,
                "s",
                f"{size}; source {src_bytes / 2**20:.1f} MiB; ratio = fraction of plain-copy speed",
                cp_s / eva_s,
            )
        )
        rows.append(
            _row(
                "v3 export --verify-decode vs default",
                verify_s,
                eva_s,
                "s",
                f"{size}; decodes all {total_frames} frames (exact image quantiles); "
                "ratio < 1 = the cost of the full check",
                eva_s / verify_s,
            )
        )
    return rows


def test_bench_v3_write_subset(benchmark: Any, tmp_path: Path) -> None:
    """pytest-benchmark: the whole pipeline export of a tiny 6 x 3-camera dataset."""
    source = source_dataset(6, 30, 64, 48)
    counter = iter(range(10**6))

    def run() -> None:
        eva_export_seconds(source, tmp_path / f"run{next(counter)}")

    benchmark.pedantic(run, rounds=3, iterations=1)


if __name__ == "__main__":
    for row in report(quick="--quick" in sys.argv):
        print(row)
