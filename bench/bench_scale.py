"""Datasets beyond one machine: executors and incremental re-export on the realistic corpus.

Rows (``bench/README.md``, "Scale", has the model of how these times scale):

* ``<fmt> processes vs serial`` / ``<fmt> ray vs serial``: a full export of the ``high`` corpus
  (quick: 8 ep x 3 cams x 150 frames; full: 40 x 3 x 400, whose HDF5 pair is 44 GB of decoded
  frames: mind the disk) on a pool of one worker per free core,
  and on a Ray cluster of this machine (a head started once, as ``ray start`` would, with one CPU
  per free core; its start-up is not counted), against the serial executor; the note has the
  core count and the per-episode time the model uses;
* ``<fmt> incremental, nothing changed`` / ``last verdict changed`` / ``middle verdict
  changed``: on a synthetic dataset of 40 episodes (``INCREMENTAL``; either mode), nothing or
  one episode's verdict changed and ``--incremental`` against a full export of the changed
  source (alternated, best of ``REPEATS``): time, episodes rewritten, renumbered (copied from
  the published pair and patched) and linked, and episode files written (the last episode moves
  no other; the middle one renumbers the later half of both subsets); the note has the model's
  t (a full export's time per episode) and c (per renumbered episode, from the same run);
* ``ray fixed overhead, 1 episode``: a 1-episode hdf5 export on the running cluster, and with a
  local Ray started for the export (``--executor ray`` without an address), against serial;
* ``lerobot_v3 ...``: the same executor rows for v3 (one task per data or video file; with the
  default file sizes the corpus is one data file and one video file per camera and subset, so
  the rows show the fixed costs), and the incremental rows with the default file sizes and with
  files of about 5 episodes each (``V3_SMALL_FILES``), counting the shard files written.

    python bench/bench_scale.py [--full] [--formats hdf5,mcap,lerobot_v3] [--incremental]

``--formats``: only those formats' executor and incremental rows (the Ray overhead rows are
hdf5's: they run when hdf5 is among them); ``--incremental``: the incremental rows alone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import FULL, QUICK, CorpusParams, ensure_corpus  # noqa: E402

from eva.capture.synthetic import write_synthetic_dataset  # noqa: E402
from eva.dataset import layout  # noqa: E402
from eva.export.executors import free_cores  # noqa: E402
from eva.export.pipeline import ExportResult, export_dataset  # noqa: E402
from eva.formats import catalog
from eva.formats.base import ExportOptions  # noqa: E402
from eva.formats.options import LeRobotV3Options  # noqa: E402

FORMATS = ("hdf5", "mcap", "lerobot_v3")
V3_SMALL_FILES = 5  # episodes per file in the small-files incremental rows
REPEATS = 3  # incremental rows: incremental and full exports alternated, best of each
RAY = str(Path(sys.executable).with_name("ray"))


def _row(name: str, value: float, baseline: float, unit: str, note: str) -> dict[str, Any]:
    ratio = baseline / value if value else 0.0
    return {"name": name, "value": value, "baseline": baseline, "ratio": ratio, "unit": unit,
            "note": note}  # fmt: skip


def _timed(source: Path, fmt: str, **run: Any) -> tuple[float, ExportResult]:
    """One export of ``source`` (``export_dataset``'s keywords): its seconds and its result."""
    start = time.perf_counter()
    result = export_dataset(source, fmt, **run)
    return time.perf_counter() - start, result


def _source_copy(params: CorpusParams, into: Path, verdicts: bool = True) -> Path:
    """A writable copy of the cached corpus, every episode judged "pass"."""
    raw = ensure_corpus("high", params)
    source = into / "raw"
    shutil.copytree(raw, source)
    if verdicts:
        for episode in range(params.episodes):
            _set_verdict(source, episode, "pass")
    return source


def _set_verdict(source: Path, episode: int, verdict: str) -> None:
    path = source / layout.EPISODES
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    rows[episode]["qc_verdict"] = verdict
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


@contextmanager
def ray_head(cpus: int, into: Path) -> Iterator[str]:
    """A Ray head on 127.0.0.2 (Ray rewrites 127.0.0.1 to the routable address), stopped by its
    process group; its address."""
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        port = s.getsockname()[1]
    environ = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": os.urandom(16).hex()}
    temp = Path(tempfile.mkdtemp(prefix="eva-ray-", dir="/tmp"))
    argv = [RAY, "start", "--block", "--head", "--node-ip-address=127.0.0.2", f"--port={port}",
            f"--num-cpus={cpus}", "--include-dashboard=false", "--disable-usage-stats",
            f"--temp-dir={temp}"]  # fmt: skip
    with open(into / "ray-head.log", "ab") as log:
        head = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=environ,
                                start_new_session=True)  # fmt: skip
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    os.environ.update({k: environ[k] for k in saved})
    try:
        time.sleep(15)  # the head's processes up (the first export waits for it otherwise)
        yield f"127.0.0.2:{port}"
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(head.pid, sig)
            except ProcessLookupError:
                break
            time.sleep(10 if sig == signal.SIGTERM else 1)
        head.wait()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(temp, ignore_errors=True)


def executor_rows(
    params: CorpusParams, tmp: Path, address: str, formats: tuple[str, ...]
) -> list[dict[str, Any]]:
    cores = free_cores()
    source = _source_copy(params, tmp / "executors")
    frames = params.episodes * params.frames * params.cameras
    rows = []
    for fmt in formats:
        serial_s, _ = _timed(source, fmt, executor="serial")
        per_episode = serial_s / params.episodes
        for executor in ("processes", "ray"):
            seconds, _ = _timed(source, fmt, executor=executor, workers=cores, ray_address=address)
            rows.append(
                _row(f"{fmt} {executor} vs serial", seconds, serial_s, "s",
                     f"{params.describe()}, {cores} cores, {cores} workers; serial "
                     f"{frames / serial_s:.0f} frames/s, {per_episode:.2f} s/episode")
            )  # fmt: skip
    return rows


# The incremental rows' source: 40 episodes as the issue counts them, small enough that the
# decoded frames of two HDF5 pairs fit the disk (the 40 x 3 x 400 corpus at 640x480 is 44 GB per
# HDF5 pair, uncompressed).
INCREMENTAL = {"episodes": 40, "frames": 60, "cameras": 3, "width": 320, "height": 240}


def incremental_rows(tmp: Path, formats: tuple[str, ...]) -> list[dict[str, Any]]:
    episodes = INCREMENTAL["episodes"]
    shape = "{episodes} ep x {cameras} cams x {frames} frames {width}x{height}".format(
        **INCREMENTAL
    )
    rows = []
    for fmt in formats:
        source = write_synthetic_dataset(
            tmp / f"incremental-{fmt}" / "raw", qc_verdicts=["pass"] * episodes, seed=11,
            **INCREMENTAL,
        )  # fmt: skip
        variants: list[tuple[str, ExportOptions | None]] = [("", None)]
        if fmt == "lerobot_v3":
            variants = [(", default files", None), (", small files", small_files(source))]
        for variant, options in variants:
            rows += incremental_variant(source, fmt, f"{shape}{variant}", options)
        shutil.rmtree(source.parent)
    return rows


def small_files(source: Path) -> ExportOptions:
    """v3 files of about ``V3_SMALL_FILES`` episodes each (their source files' sizes)."""
    parquet = max(p.stat().st_size for p in (source / "data").rglob("*.parquet"))
    mp4 = max(p.stat().st_size for p in (source / "videos").rglob("*.mp4"))
    return ExportOptions(
        format=LeRobotV3Options(
            data_files_size_in_mb=V3_SMALL_FILES * parquet / 2**20,
            video_files_size_in_mb=V3_SMALL_FILES * mp4 / 2**20,
        )
    )


def _inodes(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_ino for p in root.rglob("*") if p.is_file()}


def _load() -> str:
    return "load " + " ".join(f"{v:.1f}" for v in os.getloadavg())


def incremental_variant(
    source: Path, fmt: str, shape: str, options: ExportOptions | None
) -> list[dict[str, Any]]:
    """Nothing changed, the last and the middle verdict changed: incremental against a full
    export of the changed source, alternated ``REPEATS`` times, best of each."""
    episodes = INCREMENTAL["episodes"]
    root = catalog.parse(fmt).export_root(source)
    tag = shape.split(", ", 1)[1] if ", " in shape else ""
    name = f"{fmt} incremental{f' ({tag})' if tag else ''}"
    export_dataset(source, fmt, options=options)
    unchanged = min(
        _timed(source, fmt, options=options, incremental=True)[0] for _ in range(REPEATS)
    )
    rows = [
        _row(f"{name}, nothing changed (p + m)", unchanged, unchanged, "s",
             f"{shape}: every episode linked; {_load()}")
    ]  # fmt: skip
    for where, episode in (("last", episodes - 1), ("middle", episodes // 2)):
        inc_times, full_times = [], []
        for repeat in range(REPEATS):
            _set_verdict(source, episode, "fail")
            before = _inodes(root)
            inc_s, result = _timed(source, fmt, options=options, incremental=True)
            after = _inodes(root)
            full_s, _ = _timed(source, fmt, options=options)
            inc_times.append(inc_s)
            full_times.append(full_s)
            if repeat == 0:
                inc = result
                payload = [p for p in after if "/data/" in f"/{p}" or "/videos/" in f"/{p}"]
                written = sum(1 for p in payload if before.get(p) != after[p])
            _set_verdict(source, episode, "pass")
            export_dataset(source, fmt, options=options)  # the pair before the change again
        inc_s, full_s = min(inc_times), min(full_times)
        job = inc.job
        per_episode = full_s / episodes
        copied = job.episodes_renumbered
        # T = p + R t + C c + m, with p + m the unchanged export and t a full export's share
        cost = (inc_s - unchanged - job.episodes_rewritten * per_episode) / copied if copied else 0
        rows.append(
            _row(f"{name}, {where} verdict changed", inc_s, full_s, "s",
                 f"{shape}: {job.episodes_rewritten} rewritten, {copied} renumbered (copied and "
                 f"patched), {job.episodes_reused} reused of {episodes}; {written} of "
                 f"{len(payload)} episode or shard files written; best of {REPEATS} "
                 f"(incremental {', '.join(f'{v:.2f}' for v in inc_times)} s, full "
                 f"{', '.join(f'{v:.2f}' for v in full_times)} s); t {per_episode:.3f} s"
                 + (f", c {cost:.3f} s" if copied else "") + f"; {_load()}")
        )  # fmt: skip
        rows.append(
            _row(f"{name} files written, {where}", written, len(payload), "files",
                 f"episode or shard files written ({copied} of them copied and patched), "
                 "incremental vs full")
        )  # fmt: skip
    return rows


def ray_overhead_rows(tmp: Path, address: str) -> list[dict[str, Any]]:
    params = CorpusParams(episodes=1, frames=QUICK.frames)
    source = _source_copy(params, tmp / "one")
    serial_s, _ = _timed(source, "hdf5", executor="serial")
    running_s, _ = _timed(source, "hdf5", executor="ray", ray_address=address)
    saved = os.environ.pop("RAY_ADDRESS", None)
    local_s, _ = _timed(source, "hdf5", executor="ray")
    if saved is not None:
        os.environ["RAY_ADDRESS"] = saved
    note = f"hdf5, {params.describe()}"
    return [
        _row("ray fixed overhead, 1 episode, running cluster", running_s, serial_s, "s", note),
        _row("ray fixed overhead, 1 episode, local Ray started", local_s, serial_s, "s", note),
    ]


def _show(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows on stderr as they are measured (a long run keeps what it measured)."""
    for row in rows:
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def report(
    quick: bool = True, formats: tuple[str, ...] = FORMATS, incremental_only: bool = False
) -> list[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="eva-bench-scale-"))
    try:
        rows = incremental_rows(tmp, formats)
        _show(rows)
        if incremental_only:
            return rows
        with ray_head(free_cores(), tmp) as address:
            if "hdf5" in formats:
                rows += _show(ray_overhead_rows(tmp, address))
            rows += _show(executor_rows(QUICK if quick else FULL, tmp, address, formats))
        return rows
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    # one JSON row per line (bench/run_all.py prints the aligned table)
    chosen = FORMATS
    if "--formats" in sys.argv:
        chosen = tuple(sys.argv[sys.argv.index("--formats") + 1].split(","))
    rows = report(
        quick="--full" not in sys.argv, formats=chosen, incremental_only="--incremental" in sys.argv
    )
    print("\n".join(json.dumps(row) for row in rows))
