"""Export goals on the realistic corpus (``bench/corpus.py``), each as a ratio in one run.

Every row is ``ratio = baseline / value`` (> 1: eva beats the baseline) with the goal stated as
a bound on that ratio in ``goal`` and whether this run met it in ``met``. Sources are copied
into a temp dir (untimed) before each run; eva runs as a subprocess (``eva export SRC --format
F``): wall time and the CPU time of the child process.

* lerobot_v3 on ``high``: eva vs LeRobot 0.4.4 ``convert_dataset_v21_to_v30`` (the call alone,
  after its imports, in the oracle venv, offline: ``bench/lerobot_convert_driver.py``) and vs
  ``cp -r`` of the source; and on ``eva`` (GOP 30) against ``high`` and ``av1`` (as fast on each).
* lerobot_v21 on ``high`` vs ``cp -r``.
* hdf5 and mcap on 4 episodes of ``high``: CPU vs a decode-only pass (PyAV, threaded, every
  frame to an rgb24 ndarray) over the same videos, and the floor: that decode plus writing every
  frame's bytes to a file.
* the page cache: hdf5/mcap (4 episodes) and v3 (``high``, ``av1``) again with
  ``EVA_DIRECT_IO=0``, so that the cost of writing through the page cache is measured in the
  same run as the direct writes eva makes by default.
* ``eva --help`` and ``eva export --help`` vs ``python -c pass`` / ``python -c "import click"``
  (best of N, same interpreter).
* fixed cost: a 1-episode export in each format vs the per-episode cost of the whole corpus
  (hdf5/mcap: of the 4-episode set, whose per-episode cost is decode-bound).

``EVA_BENCH_CORPUS_NAMES`` (default ``high,eva,av1``) limits the corpora (``high`` is always
used). Quick mode runs on the quick corpora (``corpus.QUICK``), generated on first use; full mode on
``corpus.FULL`` (40 episodes x 3 cameras x 400 frames; generating it takes tens of minutes on
2 cores the first time, then it is cached).
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import av

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402  (beside this file; run_all puts bench/ on sys.path too)

REPO = Path(__file__).resolve().parent.parent
ORACLE_DIR = Path(os.environ.get("EVA_ORACLE_DIR", REPO.parent / "shared" / "oracle"))
LEROBOT_PYTHON = Path(os.environ.get("LEROBOT_V3_PYTHON", "/tmp/lerobot-v3-venv/bin/python"))
DRIVER = Path(__file__).resolve().parent / "lerobot_convert_driver.py"
FORMAT_DIRS = {"v3": "lerobot_v3", "v21": "lerobot_v21", "hdf5": "hdf5", "mcap": "mcap"}
SUBSET_EPISODES = 4
PAGE_CACHE_WRITES = {"EVA_DIRECT_IO": "0"}  # the baseline of the direct-write rows


def eva_command() -> list[str]:
    script = Path(sys.executable).parent / "eva"
    return [str(script)] if script.exists() else [sys.executable, "-m", "eva.cli"]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_timed(cmd: Sequence[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """(wall s, CPU s of the child, stdout) of one subprocess run; raises on failure."""
    cpu = _children_cpu()
    start = time.perf_counter()
    proc = subprocess.run(list(cmd), capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - start
    cpu = _children_cpu() - cpu
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"{' '.join(cmd[:4])}... failed ({proc.returncode}): {tail}")
    return wall, cpu, proc.stdout


def fresh_copy(source: Path, work: Path) -> Path:
    """``work/raw``: a private copy of the source (eva export writes beside its source)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    subprocess.run(["cp", "-r", str(source), str(work / "raw")], check=True)
    # Written back before the timed run: eva's durable publish (one syncfs) would otherwise also
    # flush this copy's dirty pages, a cost of the bench's setup, not of the export.
    os.sync()
    return work / "raw"


def eva_export(
    source: Path, work: Path, fmt: str, repeats: int = 1, env: dict[str, str] | None = None
) -> tuple[float, float]:
    """Best (wall, CPU) of ``repeats`` runs of ``eva export`` on fresh copies of ``source``
    (``env``: variables added to the export's environment)."""
    best: tuple[float, float] | None = None
    for i in range(repeats):
        src = fresh_copy(source, work / f"{fmt}-{i}")
        wall, cpu, _ = run_timed(
            [*eva_command(), "export", str(src), "--format", fmt],
            env={**os.environ, **env} if env else None,
        )
        out = src.parent / "export" / FORMAT_DIRS[fmt] / "accepted"
        if not out.is_dir():
            raise RuntimeError(f"eva export --format {fmt}: no {out}")
        shutil.rmtree(src.parent, ignore_errors=True)  # hdf5/mcap outputs are GBs
        if best is None or wall < best[0]:
            best = (wall, cpu)
    assert best is not None
    return best


def cp_seconds(source: Path, work: Path, repeats: int = 3) -> float:
    best = float("inf")
    for i in range(repeats):
        target = work / f"cp{i}"
        shutil.rmtree(target, ignore_errors=True)
        start = time.perf_counter()
        subprocess.run(["cp", "-r", str(source), str(target)], check=True)
        best = min(best, time.perf_counter() - start)
        shutil.rmtree(target, ignore_errors=True)
    return best


def lerobot_convert(source: Path, work: Path) -> tuple[float | None, float | None, str]:
    """(wall s, CPU s) of LeRobot's convert_dataset call on a copy of ``source``, and a note."""
    if not LEROBOT_PYTHON.exists():
        return None, None, f"LeRobot venv missing ({LEROBOT_PYTHON}): run make compat first"
    repo_id = "bench/v21"
    root = work / "lerobot"
    shutil.rmtree(root, ignore_errors=True)
    (root / "bench").mkdir(parents=True)
    subprocess.run(["cp", "-r", str(source), str(root / repo_id)], check=True)
    os.sync()  # as fresh_copy: the same starting state for both
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env["HF_HOME"] = str(work / "hf-home")  # nothing of the user's cache is read or written
    try:
        _, _, out = run_timed(
            [str(LEROBOT_PYTHON), str(DRIVER), str(ORACLE_DIR), str(root), repo_id], env=env
        )
    except RuntimeError as error:
        return None, None, f"LeRobot converter failed: {error}"
    result = json.loads(out.strip().splitlines()[-1])
    shutil.rmtree(root, ignore_errors=True)
    return (
        result["seconds"],
        result["cpu_seconds"],
        f"LeRobot {result['lerobot']} convert_dataset, offline, call only "
        f"({result['cpu_seconds']:.2f} CPU-s)",
    )


def episode_videos(source: Path, episodes: int) -> list[Path]:
    return sorted(p for p in source.rglob("*.mp4") if int(p.stem.rsplit("_", 1)[1]) < episodes)


def _cpu_now() -> float:
    return time.process_time()  # all threads of this process (PyAV decodes in its own threads)


def decode_pass(
    videos: Sequence[Path], sink: Callable[[Any], None] | None = None
) -> tuple[float, float]:
    """(wall, CPU) of decoding every frame of ``videos`` to rgb24 ndarrays, PyAV threaded."""
    cpu = _cpu_now()
    start = time.perf_counter()
    for path in videos:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for frame in container.decode(stream):
                array = frame.to_ndarray(format="rgb24")
                if sink is not None:
                    sink(array)
    return time.perf_counter() - start, _cpu_now() - cpu


def decode_and_write(videos: Sequence[Path], target: Path) -> tuple[float, float]:
    """The floor of a raw-frame export: the decode pass plus writing each frame's bytes."""
    with open(target, "wb") as out:
        result = decode_pass(videos, lambda array: out.write(memoryview(array).cast("B")))
    target.unlink()
    return result


def import_floor_seconds(repeats: int) -> float:
    """Best wall time of an interpreter that loads the libraries every v3/v21 export needs
    (the Parquet reader/writer, the decoder of validation's keyframe checks, NumPy, click), with
    the OpenBLAS setting the ``eva`` command makes: what a one-episode export costs at least."""
    code = "import numpy, pyarrow.parquet, av, click"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    return min(run_timed([sys.executable, "-c", code], env=env)[0] for _ in range(repeats))


def inspection_floor(source: Path) -> tuple[float, float, int]:
    """(wall, CPU, files) of the MP4 checks every export's validation must make (sample table,
    the framing of every sample, the first keyframe decoded: ``decode_check.inspect_video``)
    over every MP4 of ``source``, on two threads, after a warm-up read of the files."""
    from concurrent.futures import ThreadPoolExecutor

    from eva.dataset.decode_check import inspect_video

    videos = sorted(source.rglob("*.mp4"))
    for path in videos:
        path.read_bytes()  # in the page cache, as the exports find them
    cpu = _cpu_now()
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(inspect_video, videos))
    return time.perf_counter() - start, _cpu_now() - cpu, len(videos)


def help_ms(cmd: Sequence[str], repeats: int) -> float:
    return min(run_timed(cmd)[0] for _ in range(repeats)) * 1000


def _row(
    name: str,
    value: float | None,
    baseline: float | None,
    unit: str,
    note: str,
    *,
    goal: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """ratio = baseline / value; ``goal`` is the least ratio the issue asks for."""
    ratio = None if value is None or baseline is None or value == 0 else baseline / value
    row: dict[str, Any] = {
        "name": name,
        "value": None if value is None else round(value, 4),
        "baseline": None if baseline is None else round(baseline, 4),
        "ratio": None if ratio is None else round(ratio, 3),
        "unit": unit,
        "note": note if goal is None else f"{note}; goal ratio >= {goal:.3g}",
    }
    if goal is not None:
        row["goal"] = goal
        row["met"] = None if ratio is None else bool(ratio >= goal)
    row.update(extra)
    return row


def _compile_eva() -> None:
    """Bytecode for eva's sources, as an installed wheel has it: with PYTHONDONTWRITEBYTECODE=1
    (set on the project VMs) an editable install would compile them in every timed run."""
    import compileall

    import eva

    compileall.compile_dir(str(Path(eva.__file__).parent), quiet=1)


def report(quick: bool = False) -> list[dict[str, Any]]:
    params = corpus.QUICK if quick else corpus.FULL
    repeats = 1 if quick else 2
    # EVA_BENCH_CORPUS_NAMES=high,eva leaves out a corpus not generated yet (high is needed).
    names = [
        n.strip()
        for n in os.environ.get("EVA_BENCH_CORPUS_NAMES", ",".join(corpus.CORPUS_NAMES)).split(",")
        if n.strip()
    ]
    if "high" not in names:
        names.insert(0, "high")
    sources = corpus.ensure_all(params, names)
    _compile_eva()
    subset = corpus.ensure_corpus("high", dataclasses.replace(params, episodes=SUBSET_EPISODES))
    single = {
        name: corpus.ensure_corpus(name, dataclasses.replace(params, episodes=1))
        for name in ("high",)
    }["high"]
    high = sources["high"]
    size = params.describe()
    mb = corpus.dir_bytes(high) / 1e6
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="eva-bench-corpus-") as tmp:
        work = Path(tmp)
        cp_s = {name: cp_seconds(src, work) for name, src in sources.items()}
        v3 = {name: eva_export(src, work, "v3", repeats) for name, src in sources.items()}
        lr_s, lr_cpu, lr_note = lerobot_convert(high, work)
        wall, cpu = v3["high"]
        rows.append(
            _row(
                "corpus v3 export vs LeRobot convert_dataset_v21_to_v30",
                wall,
                lr_s,
                "s",
                f"high {size}, {mb:.0f} MB; eva whole process {cpu:.2f} CPU-s; {lr_note}",
                goal=3.0,
                eva_cpu_seconds=cpu,
                lerobot_seconds=lr_s,
                lerobot_cpu_seconds=lr_cpu,
            )
        )
        rows.append(
            _row(
                "corpus v3 export vs cp -r",
                wall,
                cp_s["high"],
                "s",
                f"high {size}; within 8x of cp -r",
                goal=1 / 8,
                eva_cpu_seconds=cpu,
            )
        )
        for name in [n for n in ("high", "av1") if n in v3 and "eva" in v3]:
            rows.append(
                _row(
                    f"corpus v3 export on {name} vs on eva GOP-30",
                    v3[name][0],
                    v3["eva"][0],
                    "s",
                    f"{size}; as fast on {name} as on eva's own files; cp -r {name} "
                    f"{cp_s[name]:.3f} s vs eva {cp_s['eva']:.3f} s",
                    goal=0.9,
                    eva_cpu_seconds=v3[name][1],
                )
            )
        for name in [n for n in ("eva", "av1") if n in v3]:
            rows.append(
                _row(
                    f"corpus v3 export ({name}) vs cp -r",
                    v3[name][0],
                    cp_s[name],
                    "s",
                    f"{name} {size}; {corpus.dir_bytes(sources[name]) / 1e6:.0f} MB",
                    eva_cpu_seconds=v3[name][1],
                )
            )
        v21 = eva_export(high, work, "v21", repeats)
        rows.append(
            _row(
                "corpus v21 export vs cp -r",
                v21[0],
                cp_s["high"],
                "s",
                f"high {size}; {v21[1]:.2f} CPU-s; within 3x of cp -r",
                goal=1 / 3,
                eva_cpu_seconds=v21[1],
            )
        )

        # What any v3/v21 export pays before it copies a byte: the interpreter with its
        # libraries, and validation's MP4 checks (2 cores). The goals' bounds are set against it.
        imports_s = import_floor_seconds(5 if quick else 9)
        inspect_wall, inspect_cpu, inspected = inspection_floor(high)
        floor_s = imports_s + inspect_wall
        cp_high = cp_s["high"]
        rows.append(
            _row(
                "corpus v3/v21 floor (interpreter + imports + MP4 checks) vs cp -r",
                floor_s,
                cp_high,
                "s",
                f"high; imports {imports_s:.3f} s, {inspected} MP4 checks {inspect_wall:.3f} s "
                f"({inspect_cpu:.2f} CPU-s) on 2 threads; the bounds: v3 8x cp -r = "
                f"{8 * cp_high:.3f} s, v21 3x cp -r = {3 * cp_high:.3f} s; eva v3 "
                f"{v3['high'][0]:.3f} s = floor + {v3['high'][0] - floor_s:.3f} s, v21 "
                f"{v21[0]:.3f} s = floor + {v21[0] - floor_s:.3f} s",
                import_seconds=imports_s,
                inspection_seconds=inspect_wall,
                inspection_cpu_seconds=inspect_cpu,
            )
        )
        if "eva" in v3 and "av1" in v3:
            # each corpus against the copy of its own bytes: AV1 is 4x eva's bytes
            per_eva = v3["eva"][0] / cp_s["eva"]
            per_av1 = v3["av1"][0] / cp_s["av1"]
            rows.append(
                _row(
                    "corpus v3 export on av1 vs on eva GOP-30, each against its own cp -r",
                    per_av1,
                    per_eva,
                    "x cp -r",
                    f"{size}; av1 {v3['av1'][0]:.2f} s / cp -r {cp_s['av1']:.3f} s; eva "
                    f"{v3['eva'][0]:.2f} s / cp -r {cp_s['eva']:.3f} s",
                )
            )

        videos = episode_videos(subset, SUBSET_EPISODES)
        frames = SUBSET_EPISODES * params.frames * params.cameras
        dec_wall, dec_cpu = decode_pass(videos)
        # eva's exports first: the floor and the EVA_DIRECT_IO=0 runs then fill the page cache
        # with GBs of frames, and a run after them pays the reclaim of those pages
        direct = {fmt: eva_export(subset, work, fmt, 1) for fmt in ("hdf5", "mcap")}
        cached = {fmt: eva_export(subset, work, fmt, 1, PAGE_CACHE_WRITES) for fmt in direct}
        floor_wall, floor_cpu = decode_and_write(videos, work / "floor.bin")
        sub = f"high, {SUBSET_EPISODES} ep x {params.cameras} cams x {params.frames} frames"
        raw_per_episode: dict[str, float] = {}
        for fmt, goal in (("hdf5", 1 / 1.2), ("mcap", 1 / 1.3)):
            f_wall, f_cpu = direct[fmt]
            cached_wall, cached_cpu = cached[fmt]
            rows.append(
                _row(
                    f"corpus {fmt} export CPU, writes past the page cache vs through it",
                    f_cpu,
                    cached_cpu,
                    "CPU-s",
                    f"high, {SUBSET_EPISODES} episodes; EVA_DIRECT_IO=0 for the baseline; wall "
                    f"{f_wall:.2f} s vs {cached_wall:.2f} s",
                    wall_seconds=f_wall,
                    baseline_wall_seconds=cached_wall,
                )
            )
            raw_per_episode[fmt] = f_wall / SUBSET_EPISODES
            rows.append(
                _row(
                    f"corpus {fmt} export CPU vs decode-only rgb24",
                    f_cpu,
                    dec_cpu,
                    "CPU-s",
                    f"{sub} ({frames} frames); wall {f_wall:.2f} s vs decode {dec_wall:.2f} s; "
                    f"floor (decode + write the bytes) {floor_cpu:.2f} CPU-s",
                    goal=goal,
                    wall_seconds=f_wall,
                    decode_wall_seconds=dec_wall,
                    floor_cpu_seconds=floor_cpu,
                    floor_wall_seconds=floor_wall,
                )
            )
            rows.append(
                _row(
                    f"corpus {fmt} export CPU vs decode + write floor",
                    f_cpu,
                    floor_cpu,
                    "CPU-s",
                    f"{sub}; floor wall {floor_wall:.2f} s",
                )
            )

        help_repeats = 5 if quick else 9
        pass_ms = help_ms([sys.executable, "-c", "pass"], help_repeats)
        click_ms = help_ms([sys.executable, "-c", "import click"], help_repeats)
        for args in (["--help"], ["export", "--help"]):
            ms = help_ms([*eva_command(), *args], help_repeats)
            label = " ".join(["eva", *args])
            rows.append(
                _row(
                    f"{label} vs python -c 'import click'",
                    ms,
                    click_ms,
                    "ms",
                    f"best of {help_repeats}; python -c pass {pass_ms:.0f} ms; goal <= 100 ms",
                    met=ms <= 100.0,
                    python_pass_ms=pass_ms,
                )
            )

        for fmt in ("v3", "v21", "hdf5", "mcap"):
            one_wall, one_cpu = eva_export(single, work, fmt, repeats)
            if fmt in raw_per_episode:
                per_episode = raw_per_episode[fmt]
                where = f"{SUBSET_EPISODES}-episode set"
            else:
                per_episode = (v3["high"] if fmt == "v3" else v21)[0] / params.episodes
                where = f"{params.episodes}-episode set"
            rows.append(
                _row(
                    f"corpus {fmt} 1-episode export vs per-episode cost",
                    one_wall,
                    per_episode,
                    "s",
                    f"high 1 ep vs the {where} / episodes; {one_cpu:.2f} CPU-s; fixed cost at "
                    f"most 2x the per-episode cost; the interpreter and imports alone "
                    f"{imports_s:.3f} s",
                    goal=0.5,
                    eva_cpu_seconds=one_cpu,
                    import_seconds=imports_s,
                )
            )
        for name in [n for n in ("high", "av1") if n in v3]:
            # last: these runs leave the page cache full of shard pages
            cached = eva_export(sources[name], work, "v3", repeats, PAGE_CACHE_WRITES)
            rows.append(
                _row(
                    f"corpus v3 export ({name}), shards past the page cache vs through it",
                    v3[name][0],
                    cached[0],
                    "s",
                    f"{name} {size}; EVA_DIRECT_IO=0 (copy_file_range) for the baseline; CPU "
                    f"{v3[name][1]:.2f} vs {cached[1]:.2f} CPU-s",
                    eva_cpu_seconds=v3[name][1],
                    baseline_cpu_seconds=cached[1],
                )
            )
    return rows


if __name__ == "__main__":
    from run_all import format_table

    quick_mode = "--quick" in sys.argv
    print(format_table(report(quick=quick_mode)))
