"""MCAP export: eva's writer vs a naive one, vs the decode-only limit; the frame encoder; peak RSS.

The source is a synthetic v2.1 dataset (3 cameras, libx264 through eva's own writer).
Quick mode (default): 3 episodes x 3 cameras x 60 frames of 640x480 (~35 s). Full mode
(``report(quick=False)``, ``make bench``): 20 x 3 x 300 frames of 320x240, the issue's export size
at a frame size that keeps the run to a few minutes; ``python bench/bench_mcap.py --full --size
640x480`` runs it at 640x480 (about 15 minutes on a loaded 2-vCPU machine).
Every pass goes over the same episodes and decodes the same MP4s in lockstep batches:

* decode only: ``DatasetReader.iter_frames`` for every camera, nothing written (the limit);
  every pass decodes the cameras of an episode in parallel helper threads, as the eva writer does
  (one row compares that with decoding them one after another);
* raw: decode + ``f.write`` of every frame's bytes (the floor for an uncompressed export);
* eva: ``eva.formats.mcap.write_episode_file`` (frames encoded in place into the chunk buffer);
* naive: per frame ``msgpack.packb`` of the frame dict with ``tobytes()``, then
  ``mcap.writer.Writer.add_message`` (same compression setting; the naive zstd row uses the
  Writer's defaults: zstd, 1 MiB chunks);
* writer alone: ``McapEpisodeWriter`` against ``mcap.writer.Writer`` on the same messages (frames
  of one episode decoded beforehand; 4 MiB chunks; zstd-1 against the Writer's fixed level 3).

Episode files go to tmpfs (/dev/shm when present) and are deleted as soon as they are written, so
the figures measure the writer, not this VM's disk (which writes back at ~130 MB/s and would cap
every writer alike). ``ratio`` is
baseline_time / value_time (> 1: faster than the baseline); for RSS it is baseline / value.
Rows marked [CPU] divide by this process's CPU time (all its threads) instead of wall time: on a
shared machine they are much steadier.

Measured figures: bench/README.md.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from eva.capture.synthetic import write_synthetic_dataset
from eva.dataset import msgpack_codec
from eva.dataset.reader import DatasetReader
from eva.formats import mcap as mcap_format

WIDTH, HEIGHT = 640, 480  # the encoder rows and the quick export
FULL_SIZE = (320, 240)
CAMERAS = 3
BATCH = 32


def make_source(
    root: Path, episodes: int, frames: int, size: tuple[int, int] = (WIDTH, HEIGHT)
) -> Path:
    return write_synthetic_dataset(
        root, episodes=episodes, frames=frames, cameras=CAMERAS, width=size[0], height=size[1]
    )


def _lockstep(reader: DatasetReader, episode: int, parallel: bool = True) -> Any:
    """Yield lists of per-camera batches (same sizes for every camera). ``parallel`` decodes the
    cameras in helper threads exactly like the eva writer does, so the passes differ only in
    what they do with the frames."""
    iterators = [reader.iter_frames(episode, key, BATCH) for key in reader.video_keys]
    if not parallel:
        yield from zip(*iterators, strict=True)
        return
    feeds = [mcap_format.CameraFeed(it, f"bench-decode-{i}") for i, it in enumerate(iterators)]
    try:
        while True:
            for feed in feeds:
                feed.request()
            batches = [feed.result() for feed in feeds]
            if any(batch is None for batch in batches):
                assert all(batch is None for batch in batches), "cameras of unequal length"
                return
            yield batches
    finally:
        for feed in feeds:
            feed.close()


def decode_only(reader: DatasetReader, out_dir: Path) -> int:
    frames = 0
    for episode in reader.episode_indices:
        for batches in _lockstep(reader, episode):
            frames += sum(len(b) for b in batches)
    return frames


def decode_sequential(reader: DatasetReader, out_dir: Path) -> int:
    frames = 0
    for episode in reader.episode_indices:
        for batches in _lockstep(reader, episode, parallel=False):
            frames += sum(len(b) for b in batches)
    return frames


def raw_write(reader: DatasetReader, out_dir: Path) -> int:
    """Decode + write every frame's bytes to one file per episode: the floor for an uncompressed
    export (no container, no encoding, one write per frame)."""
    frames = 0
    for episode in reader.episode_indices:
        path = out_dir / f"raw_{episode:06d}.bin"
        with open(path, "wb") as f:
            for batches in _lockstep(reader, episode):
                for j in range(len(batches[0])):
                    for batch in batches:
                        f.write(batch[j])
                        frames += 1
        path.unlink()
    return frames


def eva_write(
    reader: DatasetReader,
    out_dir: Path,
    compression: str = "none",
    sizes: list[int] | None = None,
) -> int:
    frames = 0
    for episode in reader.episode_indices:
        path = out_dir / f"episode_{episode:06d}.mcap"
        table = reader.read_table(episode)
        mcap_format.write_episode_file(
            path,
            table=table,
            metadata=reader.episode(episode),
            fps=reader.fps,
            frame_batches={k: reader.iter_frames(episode, k, BATCH) for k in reader.video_keys},
            compression=compression,
        )
        frames += table.num_rows * len(reader.video_keys)
        if sizes is not None:
            sizes.append(path.stat().st_size)
        path.unlink()
    return frames


def naive_write(reader: DatasetReader, out_dir: Path, compression: str = "none") -> int:
    from mcap.writer import CompressionType, Writer

    kind = {"none": CompressionType.NONE, "zstd": CompressionType.ZSTD}[compression]
    frames = 0
    period = round(1e9 / reader.fps)
    for episode in reader.episode_indices:
        path = out_dir / f"naive_{episode:06d}.mcap"
        table = reader.read_table(episode)
        with open(path, "wb") as f:
            writer = Writer(f, compression=kind)
            writer.start(profile="eva-client", library="eva-client")
            schema = writer.register_schema(
                "eva_client.episode", "jsonschema", b'{"type": "object"}'
            )
            episode_channel = writer.register_channel("episode", "messagepack", schema)
            channels = [
                writer.register_channel(f"episode/image/{k}", "messagepack", 0)
                for k in reader.video_keys
            ]
            payload = {"columns": {n: table.column(n).to_pylist() for n in table.column_names}}
            writer.add_message(episode_channel, 0, msgpack.packb(payload), 0, 0)
            index = 0
            for batches in _lockstep(reader, episode):
                for j in range(len(batches[0])):
                    t = (index + 1) * period
                    for channel, batch in zip(channels, batches, strict=True):
                        frame = batch[j]
                        data = msgpack.packb(
                            {
                                "__ndarray__": True,
                                "data": frame.tobytes(),
                                "dtype": frame.dtype.str,
                                "shape": list(frame.shape),
                            }
                        )
                        writer.add_message(channel, t, data, t, index)
                        frames += 1
                    index += 1
            writer.finish()
        path.unlink()
    return frames


def camera_frames(reader: DatasetReader, limit: int) -> list[np.ndarray]:
    """The first ``limit`` frames of every camera of episode 0, decoded once (camera order)."""
    episode = reader.episode_indices[0]
    return [
        np.concatenate(list(reader.iter_frames(episode, key, BATCH)))[:limit].copy()
        for key in reader.video_keys
    ]


def writer_eva(cameras: list[np.ndarray], out: Path, compression: str, encoded: bool) -> int:
    """eva's McapEpisodeWriter on the frames (``encoded``: pre-encoded bytes, like the Writer)."""
    payloads = (
        [[msgpack_codec.encode_ndarray(f) for f in cam] for cam in cameras] if encoded else None
    )
    with open(out, "wb") as f:
        writer = mcap_format.McapEpisodeWriter(f, compression=compression)
        for i in range(len(cameras)):
            writer.register_channel(i + 1, f"episode/image/{i}", "messagepack")
        for index in range(len(cameras[0])):
            t = index + 1
            for i, cam in enumerate(cameras):
                if payloads is None:
                    writer.add_ndarray_message(i + 1, index, t, t, cam[index])
                else:
                    writer.add_message(i + 1, index, t, t, payloads[i][index])
        writer.finish()
    out.unlink()
    return len(cameras) * len(cameras[0])


def writer_library(cameras: list[np.ndarray], out: Path, compression: str, encoded: bool) -> int:
    """``mcap.writer.Writer`` on the same messages: each frame encoded to bytes, 4 MiB chunks."""
    from mcap.writer import CompressionType, Writer

    kind = {"none": CompressionType.NONE, "zstd": CompressionType.ZSTD}[compression]
    payloads = (
        [[msgpack_codec.encode_ndarray(f) for f in cam] for cam in cameras] if encoded else None
    )
    with open(out, "wb") as f:
        writer = Writer(f, compression=kind, chunk_size=mcap_format.DEFAULT_CHUNK_SIZE)
        writer.start(profile="eva-client", library="eva-client")
        for i in range(len(cameras)):
            writer.register_channel(f"episode/image/{i}", "messagepack", 0)
        for index in range(len(cameras[0])):
            t = index + 1
            for i, cam in enumerate(cameras):
                data = (
                    payloads[i][index]
                    if payloads is not None
                    else msgpack_codec.encode_ndarray(cam[index])
                )
                writer.add_message(i + 1, t, data, t, index)
        writer.finish()
    out.unlink()
    return len(cameras) * len(cameras[0])


def writer_rows(reader: DatasetReader, out_dir: Path, limit: int) -> list[dict[str, Any]]:
    """The writer alone (frames decoded beforehand): eva's against the library's plain Writer."""
    cameras = camera_frames(reader, limit)
    shape = "x".join(str(v) for v in cameras[0].shape[1:])
    note = f"{len(cameras)} cam x {len(cameras[0])} frames of {shape}, in memory; best of 3"
    out = out_dir / "writer.mcap"
    rows: list[dict[str, Any]] = []
    cases = [
        ("mcap writer (none) vs mcap.writer.Writer (none)", "none", False),
        ("mcap writer (zstd-1) vs mcap.writer.Writer (zstd-3)", "zstd", False),
        ("mcap writer (none) vs mcap.writer.Writer (none), payloads pre-encoded", "none", True),
    ]
    for name, compression, encoded in cases:
        best: dict[str, tuple[float, float, int]] = {}
        for _ in range(3):
            for who, run in (("eva", writer_eva), ("library", writer_library)):
                timed = _timed(partial(run, cameras, out, compression, encoded))
                if who not in best or timed[0] < best[who][0]:
                    best[who] = timed
        n = best["eva"][2]
        rows.append(_row(name, n / best["eva"][0], n / best["library"][0], "frames/s", note))
        rows.append(
            _row(
                name + " [CPU]",
                n / best["eva"][1],
                n / best["library"][1],
                "frames/CPU-s",
                note,
            )
        )
    return rows


def _seconds(run: Callable[[], int]) -> tuple[float, int]:
    start = time.perf_counter()
    frames = run()
    return time.perf_counter() - start, frames


def _timed(run: Callable[[], int]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of this process incl. its threads, frames)."""
    cpu = time.process_time()
    wall, frames = _seconds(run)
    return wall, time.process_time() - cpu, frames


def _row(name: str, value: float, baseline: float, unit: str, note: str) -> dict[str, Any]:
    return {
        "name": name,
        "value": round(value, 1),
        "baseline": round(baseline, 1),
        "ratio": round(value / baseline, 3) if baseline else None,
        "unit": unit,
        "note": note,
    }


def encoder_rows(frames: int = 200) -> list[dict[str, Any]]:
    frame = np.random.default_rng(0).integers(0, 255, (HEIGHT, WIDTH, 3), dtype=np.uint8)
    out = bytearray(msgpack_codec.encoded_ndarray_size(frame))

    def native() -> int:
        for _ in range(frames):
            msgpack_codec.encode_ndarray_into(frame, out)
        return frames

    def packb() -> int:
        for _ in range(frames):
            msgpack.packb(
                {
                    "__ndarray__": True,
                    "data": frame.tobytes(),
                    "dtype": frame.dtype.str,
                    "shape": list(frame.shape),
                }
            )
        return frames

    best_native = min(_seconds(native)[0] for _ in range(3))
    best_packb = min(_seconds(packb)[0] for _ in range(3))
    backend = "native" if msgpack_codec._native is not None else "reference"
    return [
        _row(
            "frame encoder (encode_into reused buffer) vs msgpack.packb(tobytes)",
            frames / best_native,
            frames / best_packb,
            "frames/s",
            f"{HEIGHT}x{WIDTH}x3 uint8, {backend} kernel, best of 3 x {frames} frames",
        )
    ]


# ru_maxrss survives execve on Linux (the child would report the parent's peak), so the child
# reads its own high-water mark from /proc (fresh per exec), falling back to getrusage elsewhere.
RSS_SCRIPT = """
import resource, sys
sys.path.insert(0, {bench_dir!r})
import bench_mcap
from pathlib import Path
from eva.dataset.reader import DatasetReader
reader = DatasetReader({root!r})
getattr(bench_mcap, {mode!r})(reader, Path({out!r}))
try:
    hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0].split()[1]
except OSError:
    hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(hwm)
"""


def peak_rss_mb(mode: str, root: Path, out_dir: Path) -> float:
    """Peak RSS (MB) of a fresh interpreter running pass ``mode`` over the whole source."""
    script = RSS_SCRIPT.format(
        bench_dir=str(Path(__file__).parent), root=str(root), mode=mode, out=str(out_dir)
    )
    result = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True, env=os.environ
    )
    return int(result.stdout.strip().splitlines()[-1]) / 1024.0


def report(quick: bool = True, frame_size: tuple[int, int] | None = None) -> list[dict[str, Any]]:
    episodes, frames = (3, 60) if quick else (20, 300)
    width, height = frame_size or ((WIDTH, HEIGHT) if quick else FULL_SIZE)
    size = f"{episodes} ep x {CAMERAS} cam x {frames} frames, {width}x{height}"
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="eva-bench-mcap-") as tmp:
        root = make_source(Path(tmp) / "raw", episodes, frames, (width, height))
        shm = Path("/dev/shm")
        out_dir = Path(
            tempfile.mkdtemp(prefix="eva-bench-mcap-", dir=shm if shm.is_dir() else Path(tmp))
        )
        reader = DatasetReader(root)
        decode_only(reader, out_dir)  # warm the page cache for every pass alike
        sizes: dict[str, list[int]] = {"none": [], "zstd": [], "lz4": []}
        t: dict[str, tuple[float, float, int]] = {
            "decode": _timed(lambda: decode_only(reader, out_dir)),
            "decode_seq": _timed(lambda: decode_sequential(reader, out_dir)),
            "eva": _timed(lambda: eva_write(reader, out_dir, "none", sizes["none"])),
            "naive": _timed(lambda: naive_write(reader, out_dir, "none")),
            "raw": _timed(lambda: raw_write(reader, out_dir)),
            "eva_zstd": _timed(lambda: eva_write(reader, out_dir, "zstd", sizes["zstd"])),
            "naive_zstd": _timed(lambda: naive_write(reader, out_dir, "zstd")),
            "eva_lz4": _timed(lambda: eva_write(reader, out_dir, "lz4", sizes["lz4"])),
        }
        n = t["decode"][2]
        assert n == t["eva"][2] == t["naive"][2]
        raw = sum(sizes["none"])
        size_note = ", ".join(
            f"{c} {sum(v) / n / 1e3:.0f} kB/frame ({sum(v) / raw:.2f})" for c, v in sizes.items()
        )

        def pair(name: str, value: str, baseline: str, note: str) -> None:
            # Wall-clock speed, and the same pair per CPU-second of this process (robust to the
            # other tenants of a shared machine, which wall time is not).
            rows.append(_row(name, n / t[value][0], n / t[baseline][0], "frames/s", note))
            rows.append(
                _row(
                    name + " [CPU]",
                    n / t[value][1],
                    n / t[baseline][1],
                    "frames/CPU-s",
                    note,
                )
            )

        pair(
            "mcap export (none) vs naive packb+Writer (none)",
            "eva",
            "naive",
            f"{size}; decode included",
        )
        pair(
            "mcap export (zstd-1) vs naive packb+Writer defaults (zstd-3, 1 MiB)",
            "eva_zstd",
            "naive_zstd",
            size,
        )
        pair(
            "mcap export (none) vs decode-only pass (limit)",
            "eva",
            "decode",
            f"{size}; ratio = fraction of the decode-only speed reached",
        )
        pair(
            "mcap export (none) vs decode + raw frame bytes to file (floor)",
            "eva",
            "raw",
            f"{size}; the same bytes written with f.write, no MCAP/MessagePack",
        )
        pair(
            "decode-only: cameras in parallel threads vs one after another",
            "decode",
            "decode_seq",
            f"{size}; the decode strategy of the eva writer and of every pass here",
        )
        pair("mcap export (zstd-1) vs decode-only pass", "eva_zstd", "decode", size_note)
        pair("mcap export (lz4) vs decode-only pass", "eva_lz4", "decode", size_note)
        rows.extend(writer_rows(reader, out_dir, 60))
        rows.extend(encoder_rows(100 if quick else 300))
        rss_eva = peak_rss_mb("eva_write", root, out_dir)
        rss_decode = peak_rss_mb("decode_only", root, out_dir)
        rows.append(
            {
                "name": "peak RSS: mcap export vs decode-only (subprocess)",
                "value": round(rss_eva, 1),
                "baseline": round(rss_decode, 1),
                "ratio": round(rss_decode / rss_eva, 3),
                "unit": "MB",
                "note": f"{size}; VmHWM of a fresh interpreter per pass",
            }
        )
        out_dir.rmdir()
    return rows


# ---- pytest-benchmark ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_source(tmp_path_factory: pytest.TempPathFactory) -> DatasetReader:
    root = make_source(tmp_path_factory.mktemp("mcap") / "raw", 2, 30)
    return DatasetReader(root)


def test_bench_encode_into(benchmark: Any) -> None:
    frame = np.zeros((HEIGHT, WIDTH, 3), dtype=np.uint8)
    out = bytearray(msgpack_codec.encoded_ndarray_size(frame))
    benchmark(msgpack_codec.encode_ndarray_into, frame, out)


def test_bench_packb_tobytes(benchmark: Any) -> None:
    frame = np.zeros((HEIGHT, WIDTH, 3), dtype=np.uint8)
    benchmark(
        lambda: msgpack.packb(
            {"__ndarray__": True, "data": frame.tobytes(), "dtype": "|u1", "shape": [480, 640, 3]}
        )
    )


def test_bench_eva_write(benchmark: Any, small_source: DatasetReader, tmp_path: Path) -> None:
    benchmark(eva_write, small_source, tmp_path)


def test_bench_naive_write(benchmark: Any, small_source: DatasetReader, tmp_path: Path) -> None:
    benchmark(naive_write, small_source, tmp_path)


if __name__ == "__main__":
    custom = sys.argv[sys.argv.index("--size") + 1] if "--size" in sys.argv else None
    chosen = tuple(int(v) for v in custom.split("x")) if custom else None
    for row in report(quick="--full" not in sys.argv, frame_size=chosen):  # type: ignore[arg-type]
        print(json.dumps(row))
    print(
        json.dumps({"peak_rss_self_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
    )
