"""A realistic bench corpus: v2.1 datasets whose MP4s cost what camera footage costs.

The other benches use small, low-motion synthetic video encoded ultrafast with a fixed GOP and no
B-frames. Real rigs record H.264 High profile with B-frames and scene-cut keyframes, or (LeRobot)
AV1 with a keyframe every 2 frames; the box parser, the demuxer and the decoder behave differently
on those. This module writes the same synthetic content three ways:

* ``eva``: eva's own capture settings, through eva's ``DatasetWriter`` (libx264 veryfast, crf 23,
  fixed GOP 30, no B-frames, no scene cuts: ``VideoOptions()``);
* ``high``: H.264 High profile, x264 preset medium, crf 23, 3 B-frames, x264's default keyint 250
  with scene-cut keyframes (2-3 keyframes per 400 frames, like the footage this corpus stands in
  for);
* ``av1``: AV1 as ``lerobot-record`` writes it (LeRobot 0.4.4 ``encode_video_frames`` defaults:
  libsvtav1, yuv420p, ``g=2``, ``crf=30``, ``preset=12``).

``high`` and ``av1`` are the ``eva`` dataset with its videos re-encoded from the same frames (the
parquet, stats and histograms are of those frames, so they stay right); ``info.json`` gets the
codec name. The scene (``RealisticScene``) has a textured background seen by a slowly drifting,
shaking camera, several textured objects moving on smooth paths, sensor noise that differs in
every frame, slow lighting drift with flicker, and in some episodes an abrupt lighting change
(a scene cut for x264).

Corpora are generated once and cached under ``$EVA_BENCH_CORPUS`` (default
``~/.cache/eva-bench-corpus``) as ``<name>-<params hash>/raw``; a corpus is written into a temp
directory beside its final place and renamed there when complete, so a killed generation leaves no
half corpus (only a ``.tmp-*`` directory that the next run removes).

    python bench/corpus.py [--quick] [--episodes N] [--frames N] [--cameras N] [NAME ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np

from eva.capture.synthetic import joint_actions, joint_names, joint_states
from eva.dataset.video import VideoOptions
from eva.dataset.writer import CameraSpec, DatasetWriter, VectorSpec

# Bumped whenever the generated content or encodings change, so stale caches are not reused.
GENERATOR_VERSION = 1
CORPUS_NAMES = ("high", "eva", "av1")
DECODER_FORMAT = {"libdav1d": "av1", "libaom-av1": "av1"}
STATE = "observation.state"
ACTION = "action"
TASKS = ("pick the cube", "place the cube", "stack the cubes")
BATCH = 16
_EPOCH = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)

# Encoder settings of the re-encoded corpora (codec, pix_fmt, codec options, max B-frames).
# high: x264 defaults for keyint (250) and scenecut (40) are spelled out so FFmpeg's own
# defaults cannot change them; bframes=3 is also x264's default for preset medium.
HIGH_OPTIONS = {
    "preset": "medium",
    "crf": "23",
    "profile": "high",
    "x264-params": "keyint=250:min-keyint=25:scenecut=40:bframes=3:b-adapt=1",
}
# LeRobot 0.4.4 lerobot/datasets/video_utils.py: encode_video_frames(vcodec="libsvtav1",
# pix_fmt="yuv420p", g=2, crf=30, preset=None -> "12").
AV1_OPTIONS = {"g": "2", "crf": "30", "preset": "12"}


@dataclass(frozen=True)
class CorpusParams:
    episodes: int = 40
    frames: int = 400
    cameras: int = 3
    width: int = 640
    height: int = 480
    fps: int = 30
    seed: int = 14

    def digest(self) -> str:
        text = json.dumps({"v": GENERATOR_VERSION, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:10]

    def describe(self) -> str:
        return (
            f"{self.episodes} ep x {self.cameras} cams x {self.frames} frames "
            f"{self.width}x{self.height} @ {self.fps} fps"
        )


FULL = CorpusParams()
QUICK = CorpusParams(episodes=8, frames=150)


def cache_root() -> Path:
    env = os.environ.get("EVA_BENCH_CORPUS")
    return Path(env) if env else Path.home() / ".cache" / "eva-bench-corpus"


def corpus_dir(name: str, params: CorpusParams, root: Path | None = None) -> Path:
    """The cached corpus directory; the dataset itself is its ``raw/`` (eva export's layout)."""
    if name not in CORPUS_NAMES:
        raise ValueError(f"corpus {name!r}: choose one of {', '.join(CORPUS_NAMES)}")
    return (root or cache_root()) / f"{name}-{params.digest()}"


# --------------------------------------------------------------------------------------------
# The scene


def _smooth_noise(rng: np.random.Generator, h: int, w: int, cell: int) -> np.ndarray:
    """(h, w) float32 value noise: a random grid of cell size ``cell``, bilinearly upsampled."""
    gh, gw = h // cell + 2, w // cell + 2
    grid = rng.random((gh, gw), dtype=np.float32)
    y = np.arange(h, dtype=np.float32) / cell
    x = np.arange(w, dtype=np.float32) / cell
    y0, x0 = y.astype(np.int64), x.astype(np.int64)
    fy, fx = (y - y0)[:, None], (x - x0)[None, :]
    a = grid[y0][:, x0]
    b = grid[y0][:, x0 + 1]
    c = grid[y0 + 1][:, x0]
    d = grid[y0 + 1][:, x0 + 1]
    return (a * (1 - fx) + b * fx) * (1 - fy) + (c * (1 - fx) + d * fx) * fy


def _texture(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """(h, w, 3) int16 texture: large soft shapes, mid-scale detail and fine grain, coloured."""
    lum = (
        0.6 * _smooth_noise(rng, h, w, 64)
        + 0.32 * _smooth_noise(rng, h, w, 16)
        + 0.08 * _smooth_noise(rng, h, w, 4)
    )
    tint = rng.uniform(0.6, 1.0, size=3).astype(np.float32)
    colour = _smooth_noise(rng, h, w, 96)[..., None] * (1 - tint) + tint
    return np.clip(lum[..., None] * colour * 230 + 12, 0, 255).astype(np.int16)


class RealisticScene:
    """One camera of one episode; ``frames(start, n)`` is a pure function of the frame indices.

    The camera drifts and shakes over a background twice the frame size (integer offsets: whole
    pixel motion, plus sub-pixel-looking texture from the fine grain); 4 textured objects move on
    Lissajous paths at different speeds (one fast, like an arm); lighting drifts slowly with a
    small 2 Hz flicker; sensor noise is sliced from a larger noise field at a per-frame offset, so
    no two frames share their noise. With ``cut_at`` set, the light level drops abruptly there
    (x264 sees a scene cut).
    """

    def __init__(
        self,
        height: int,
        width: int,
        *,
        seed: int,
        fps: int = 30,
        noise: float = 1.2,
        moving_camera: bool = False,
    ) -> None:
        self.height, self.width, self.fps = int(height), int(width), int(fps)
        rng = np.random.default_rng(seed)
        h, w = self.height, self.width
        self._background = _texture(rng, 2 * h, 2 * w)
        self._objects = []
        for k in range(4):
            oh = max(2, int(h * rng.uniform(0.12, 0.3)))
            ow = max(2, int(w * rng.uniform(0.1, 0.25)))
            self._objects.append(
                {
                    "texture": _texture(rng, oh, ow),
                    "freq": rng.uniform(0.1, 0.3, size=2) * (3.0 if k == 0 else 1.0),
                    "phase": rng.uniform(0, 2 * np.pi, size=2),
                }
            )
        pad = 64
        self._noise = np.round(rng.normal(0.0, noise, size=(h + pad, w + pad, 3))).astype(np.int16)
        self._pad = pad
        # A fixed camera barely moves (mount vibration); a wrist camera pans and shakes.
        self.moving_camera = bool(moving_camera)
        self._pan = rng.uniform(0.15, 0.4, size=2) * (1.0 if moving_camera else 0.1)
        self._pan_phase = rng.uniform(0, 2 * np.pi, size=2)
        self._light_phase = float(rng.uniform(0, 2 * np.pi))
        self.cut_at: int | None = None

    def frame(self, index: int, out: np.ndarray) -> None:
        """Frame ``index`` into ``out`` ((H, W, 3) uint8)."""
        h, w = self.height, self.width
        t = index / self.fps
        rng = np.random.default_rng([index, 7])
        shake = rng.integers(-1, 2, size=2) if self.moving_camera else np.zeros(2, np.int64)
        oy = int((np.sin(t * self._pan[0] + self._pan_phase[0]) + 1) / 2 * (h - 2)) + 1
        ox = int((np.sin(t * self._pan[1] + self._pan_phase[1]) + 1) / 2 * (w - 2)) + 1
        oy = min(max(oy + int(shake[0]), 0), h)
        ox = min(max(ox + int(shake[1]), 0), w)
        img = self._background[oy : oy + h, ox : ox + w].copy()
        for obj in self._objects:
            tex = obj["texture"]
            th, tw = tex.shape[:2]
            fy, fx = obj["freq"]
            py, px = obj["phase"]
            y = int((np.sin(t * fy + py) + 1) / 2 * (h - th))
            x = int((np.sin(t * fx + px) + 1) / 2 * (w - tw))
            img[y : y + th, x : x + tw] = tex
        light = 1.0 + 0.12 * np.sin(t * 0.35 + self._light_phase) + 0.01 * np.sin(t * 2 * np.pi * 2)
        if self.cut_at is not None and index >= self.cut_at:
            light *= 0.55
        img *= int(light * 256)
        img >>= 8
        ny, nx = rng.integers(0, self._pad, size=2)
        img += self._noise[ny : ny + h, nx : nx + w]
        np.clip(img, 0, 255, out=img)
        out[...] = img

    def frames(self, start: int, n: int, out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            out = np.empty((n, self.height, self.width, 3), np.uint8)
        for i in range(n):
            self.frame(start + i, out[i])
        return out[:n]


def scene_for(params: CorpusParams, episode: int, camera: int) -> RealisticScene:
    scene = RealisticScene(
        params.height,
        params.width,
        seed=params.seed * 100_003 + episode * 101 + camera,
        fps=params.fps,
        moving_camera=camera == 2,
    )
    # An abrupt lighting change in every other episode, at the same instant for all cameras.
    rng = np.random.default_rng([params.seed, episode, 3])
    if episode % 2 == 1 and params.frames >= 60:
        scene.cut_at = int(rng.integers(params.frames // 4, params.frames * 3 // 4))
    return scene


# --------------------------------------------------------------------------------------------
# Writing


def camera_keys(params: CorpusParams) -> list[str]:
    names = ("front", "top", "wrist")
    return [
        f"observation.images.{names[c] if c < len(names) else f'cam{c}'}"
        for c in range(params.cameras)
    ]


def _episode_row(episode: int, params: CorpusParams) -> dict[str, Any]:
    started = _EPOCH + dt.timedelta(minutes=episode)
    duration = params.frames / params.fps
    return {
        "quality": "green",
        "quality_issues": [],
        "started_at": started.isoformat(),
        "ended_at": (started + dt.timedelta(seconds=duration)).isoformat(),
        "duration_seconds": duration,
    }


def _write_eva(root: Path, params: CorpusParams) -> None:
    """The ``eva`` corpus through eva's own writer and encoder settings."""
    keys = camera_keys(params)
    writer = DatasetWriter.create_or_open(
        root,
        fps=params.fps,
        cameras=[CameraSpec(k, params.height, params.width) for k in keys],
        vectors=[
            VectorSpec(STATE, 14, joint_names(14)),
            VectorSpec(ACTION, 14, joint_names(14)),
        ],
        robot_type="synthetic_aloha",
        video=VideoOptions(),
        durable=False,
    )
    buffers = [np.empty((BATCH, params.height, params.width, 3), np.uint8) for _ in keys]
    with writer:
        for ep in range(params.episodes):
            scenes = [scene_for(params, ep, c) for c in range(len(keys))]
            episode = writer.begin_episode(TASKS[ep % len(TASKS)])
            try:
                for start in range(0, params.frames, BATCH):
                    m = min(BATCH, params.frames - start)
                    images = {
                        k: s.frames(start, m, buf)
                        for k, s, buf in zip(keys, scenes, buffers, strict=True)
                    }
                    jitter = np.random.default_rng([params.seed, ep, start]).uniform(0, 0.2, m)
                    episode.add_frames(
                        images=images,
                        vectors={
                            STATE: joint_states(start, m, fps=params.fps, seed=params.seed, episode=ep),
                            ACTION: joint_actions(start, m, fps=params.fps, seed=params.seed, episode=ep),
                        },
                        capture_time=1000.0 + ep * 100.0 + (np.arange(start, start + m) + jitter) / params.fps,
                    )  # fmt: skip
                episode.commit(_episode_row(ep, params))
            except BaseException:
                episode.abort()
                raise


def _encoder_settings(name: str) -> tuple[str, dict[str, str], int | None]:
    if name == "high":
        return "libx264", HIGH_OPTIONS, 3
    if name == "av1":
        return "libsvtav1", AV1_OPTIONS, None
    raise ValueError(name)


def _encode(path: Path, name: str, scene: RealisticScene, frames: int, threads: int) -> None:
    """Encode ``frames`` frames of ``scene`` into ``path`` with corpus ``name``'s settings."""
    codec, options, bframes = _encoder_settings(name)
    options = dict(options)
    if codec == "libsvtav1":
        options["svtav1-params"] = f"lp={threads}"
    buf = np.empty((BATCH, scene.height, scene.width, 3), np.uint8)
    with av.open(str(path), mode="w", format="mp4") as container:
        stream = container.add_stream(codec, rate=scene.fps, options=options)
        stream.width, stream.height, stream.pix_fmt = scene.width, scene.height, "yuv420p"
        stream.codec_context.time_base = Fraction(1, scene.fps)
        if codec == "libx264":
            stream.codec_context.thread_count = threads
        if bframes is not None:
            stream.codec_context.max_b_frames = bframes
        for start in range(0, frames, BATCH):
            m = min(BATCH, frames - start)
            for i, image in enumerate(scene.frames(start, m, buf)):
                frame = av.VideoFrame.from_ndarray(image, format="rgb24")
                frame.pts = start + i
                for packet in stream.encode(frame):
                    container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)


def _derive(root: Path, template: Path, name: str, params: CorpusParams, workers: int) -> None:
    """``template`` (the eva corpus) with every video re-encoded with ``name``'s settings."""
    shutil.copytree(template, root, ignore=shutil.ignore_patterns("*.mp4"))
    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    codec_name = "av1" if name == "av1" else "h264"
    keys = camera_keys(params)
    for key in keys:
        info["features"][key]["info"]["video.codec"] = codec_name
    os.chmod(info_path, 0o644)
    info_path.write_text(json.dumps(info, indent=4) + "\n")
    jobs = []
    for src in sorted(template.rglob("*.mp4")):
        rel = src.relative_to(template)
        key = rel.parts[-2]
        episode = int(src.stem.rsplit("_", 1)[1])
        jobs.append((root / rel, episode, keys.index(key)))
    threads = max(1, (os.cpu_count() or 1) // workers)

    donor = _donor(name, params, root.parent.parent)

    def one(job: tuple[Path, int, int]) -> None:
        path, episode, camera = job
        path.parent.mkdir(parents=True, exist_ok=True)
        reuse = donor / path.relative_to(root) if donor is not None else None
        if reuse is not None and reuse.is_file():
            # The same episode of a larger corpus with the same settings: same frames, same
            # encoder, so its file is what encoding would give (minus minutes of x264 medium).
            shutil.copyfile(reuse, path)
        else:
            _encode(path, name, scene_for(params, episode, camera), params.frames, threads)
        os.chmod(path, 0o444)  # committed raw evidence is read-only, as the writer leaves it

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, jobs))


def _donor(name: str, params: CorpusParams, root: Path) -> Path | None:
    """A cached corpus of the same kind and settings with more episodes (episodes 0..n-1 of a
    corpus depend only on the seed, the episode and the camera), or None."""
    for episodes in (FULL.episodes, params.episodes * 10, params.episodes * 2):
        if episodes <= params.episodes:
            continue
        raw = corpus_dir(name, dataclasses.replace(params, episodes=episodes), root) / "raw"
        if raw.is_dir():
            return raw
    return None


def ensure_corpus(
    name: str,
    params: CorpusParams = FULL,
    *,
    root: Path | None = None,
    workers: int | None = None,
    log: bool = True,
) -> Path:
    """The cached corpus ``name`` (its ``raw/`` dataset directory), generated if missing."""
    final = corpus_dir(name, params, root)
    if (final / "raw").is_dir():
        return final / "raw"
    template = (
        ensure_corpus("eva", params, root=root, workers=workers, log=log) if name != "eva" else None
    )
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".tmp-{final.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    started = time.perf_counter()
    try:
        if template is None:
            _write_eva(tmp / "raw", params)
        else:
            _derive(tmp / "raw", template, name, params, workers or os.cpu_count() or 1)
        (tmp / "corpus.json").write_text(
            json.dumps(
                {"name": name, "params": dataclasses.asdict(params), "version": GENERATOR_VERSION},
                indent=2,
            )
            + "\n"
        )
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if log:
        print(
            f"generated {name} ({params.describe()}) in {time.perf_counter() - started:.0f} s: {final}",
            file=sys.stderr,
        )
    return final / "raw"


# --------------------------------------------------------------------------------------------
# Properties


def video_facts(path: Path) -> dict[str, Any]:
    """Codec, profile, packet count, keyframes and whether packets come out of display order."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        # The decoder's name; an AV1 stream opens with libdav1d (or libaom), name the format.
        codec = DECODER_FORMAT.get(stream.codec_context.name, stream.codec_context.name)
        profile = stream.codec_context.profile
        keyframes = packets = 0
        reordered = False
        last_pts = None
        for packet in container.demux(stream):
            if packet.size == 0:
                continue
            packets += 1
            keyframes += bool(packet.is_keyframe)
            if packet.pts is not None and packet.dts is not None and packet.pts != packet.dts:
                reordered = True
            if last_pts is not None and packet.pts is not None and packet.pts < last_pts:
                reordered = True
            last_pts = packet.pts
    return {
        "codec": codec,
        "profile": profile,
        "packets": packets,
        "keyframes": keyframes,
        "b_frames": reordered,
    }


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def summary(name: str, raw: Path) -> dict[str, Any]:
    """What the corpus holds: size, frames, keyframes per video, B-frames, codec."""
    videos = sorted(raw.rglob("*.mp4"))
    facts = [video_facts(v) for v in videos]
    info = json.loads((raw / "meta" / "info.json").read_text())
    keyframes = [f["keyframes"] for f in facts]
    return {
        "name": name,
        "path": str(raw),
        "mb": round(dir_bytes(raw) / 1e6, 2),
        "video_mb": round(sum(v.stat().st_size for v in videos) / 1e6, 2),
        "episodes": info["total_episodes"],
        "frames": info["total_frames"],
        "videos": len(videos),
        "codec": sorted({f["codec"] for f in facts}),
        "profile": sorted({str(f["profile"]) for f in facts}),
        "keyframes_per_video": [min(keyframes), max(keyframes)] if keyframes else [0, 0],
        "keyframes_mean": round(sum(keyframes) / max(1, len(keyframes)), 2),
        "b_frames": any(f["b_frames"] for f in facts),
        "all_b_frames": all(f["b_frames"] for f in facts),
        "bytes_per_frame": round(
            sum(v.stat().st_size for v in videos) / max(1, sum(f["packets"] for f in facts))
        ),
    }


def check(name: str, facts: dict[str, Any]) -> list[str]:
    """Properties each corpus must have; returns what is wrong (empty: fine)."""
    wrong = []
    if name == "high":
        if facts["codec"] != ["h264"] or facts["profile"] != ["High"]:
            wrong.append(f"high: codec/profile {facts['codec']} {facts['profile']}, want h264 High")
        if not facts["all_b_frames"]:
            wrong.append("high: some videos have no B-frames")
    elif name == "eva":
        if facts["codec"] != ["h264"] or facts["b_frames"]:
            wrong.append(f"eva: codec {facts['codec']}, B-frames {facts['b_frames']}")
    elif name == "av1" and facts["codec"] != ["av1"]:
        wrong.append(f"av1: codec {facts['codec']}")
    return wrong


def ensure_all(
    params: CorpusParams, names: Iterable[str] = CORPUS_NAMES, **kwargs: Any
) -> dict[str, Path]:
    return {name: ensure_corpus(name, params, **kwargs) for name in names}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # checked below, not with choices=: Python 3.11's argparse checks an empty or default list
    # against the choices as one value and refuses it
    parser.add_argument("names", nargs="*", metavar="NAME", help=", ".join(CORPUS_NAMES))
    parser.add_argument("--quick", action="store_true", help=f"{QUICK.describe()}")
    parser.add_argument("--episodes", type=int)
    parser.add_argument("--frames", type=int)
    parser.add_argument("--cameras", type=int)
    parser.add_argument("--workers", type=int, help="encode jobs at once (default: CPUs)")
    parser.add_argument("--json", action="store_true", help="print the summaries as JSON")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(CORPUS_NAMES))
    if unknown:
        parser.error(f"unknown corpus {', '.join(unknown)} (choose from {', '.join(CORPUS_NAMES)})")
    args.names = args.names or list(CORPUS_NAMES)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    params = QUICK if args.quick else FULL
    changes = {k: getattr(args, k) for k in ("episodes", "frames", "cameras") if getattr(args, k)}
    params = dataclasses.replace(params, **changes)
    problems: list[str] = []
    summaries = []
    for name in args.names:
        raw = ensure_corpus(name, params, workers=args.workers)
        facts = summary(name, raw)
        summaries.append(facts)
        problems += check(name, facts)
        if not args.json:
            print(
                f"{name:5s} {facts['mb']:8.1f} MB  {facts['frames']} frames x {params.cameras} cams  "
                f"{facts['codec']} {facts['profile']}  keyframes/video {facts['keyframes_per_video']} "
                f"(mean {facts['keyframes_mean']})  B-frames {facts['b_frames']}  "
                f"{facts['bytes_per_frame']} B/frame  {raw}"
            )
    if args.json:
        print(json.dumps(summaries, indent=2))
    for problem in problems:
        print(f"CHECK FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
