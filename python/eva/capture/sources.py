"""Where samples come from: the Source API for your own rig, a simulated rig, a dataset replay.

Writing a source
----------------

A real rig usually has one thread per device. Such code needs no adapter: call
``recorder.push_image(camera_key, t, frame)`` and ``recorder.push_vector(stream, t, values)``
from those threads (each call copies the sample and returns within microseconds). ``t`` is the
capture time in seconds on one clock shared by all streams of the rig (e.g. ``time.monotonic()``
or a hardware clock); ``frame`` is an ``(H, W, 3)`` uint8 RGB array of the configured size and
``values`` a ``(dim,)`` array. Samples pushed while no episode records are ignored.

A source that is easier to write as one loop implements :class:`Source`: ``samples()`` yields
:class:`Sample` objects in (roughly) capture order, pacing itself as the hardware would, and
:class:`SourcePump` runs it on a background thread into a recorder::

    class MyRig:
        def samples(self):
            while True:
                t, img = camera.read()          # your driver
                yield Sample("image", "observation.images.front", t, img)
                t, q = arm.joint_positions()
                yield Sample("vector", "observation.state", t, q)

    pump = SourcePump(MyRig(), recorder)
    pump.start()
    recorder.start("pick-cube", "pick the red cube")
    ...
    recorder.stop()
    pump.stop()

The arrays yielded may be reused by the source once the next sample is requested (the recorder
copies them).
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from eva.capture.synthetic import SyntheticScene, joint_actions, joint_states
from eva.config import CameraConfig, CollectionConfig, VectorConfig, ring_memory_problem
from eva.dataset import layout
from eva.dataset.errors import DatasetError
from eva.dataset.limits import MAX_FPS, MAX_VECTOR_DIM, image_size_problem
from eva.dataset.reader import DatasetReader

if TYPE_CHECKING:
    from eva.capture.rig import SourceRig
    from eva.capture.ring import Ring


@dataclass(frozen=True)
class Sample:
    """One timestamped sample: ``kind`` is "image" (camera key) or "vector" (stream name)."""

    kind: str
    stream: str
    t: float
    data: np.ndarray


class Source(Protocol):
    """Yields the rig's samples, paced as the hardware delivers them (see module doc)."""

    def samples(self) -> Iterator[Sample]: ...


class SampleSink(Protocol):
    """What a source feeds: :class:`eva.capture.recorder.Recorder` is one."""

    def push_image(self, camera: str, t: float, frame: np.ndarray) -> bool: ...
    def push_vector(self, stream_name: str, t: float, values: np.ndarray) -> bool: ...


class SourcePump:
    """Runs ``source.samples()`` on a thread and pushes every sample into ``sink``."""

    def __init__(self, source: Source, sink: SampleSink) -> None:
        self.source = source
        self.sink = sink
        self.samples = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="eva-source", daemon=True)
        self.finished = threading.Event()

    def start(self) -> SourcePump:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            for sample in self.source.samples():
                if self._stop.is_set():
                    break
                if sample.kind == "image":
                    self.sink.push_image(sample.stream, sample.t, sample.data)
                else:
                    self.sink.push_vector(sample.stream, sample.t, sample.data)
                self.samples += 1
        except BaseException as e:  # surfaced through .error (the CLI reports it)
            self.error = e
        finally:
            self.finished.set()

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)


class _Pacer:
    """Sleeps until the wall clock reaches a sample's time (relative to the first sample)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.origin: tuple[float, float] | None = None

    def wait(self, t: float) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if self.origin is None:
            self.origin = (now, t)
            return
        delay = self.origin[0] + (t - self.origin[1]) - now
        if delay > 0:
            time.sleep(delay)


class SimulatedRig:
    """A deterministic, seedable rig: cameras at ``fps`` and vector streams at ``vector_hz``.

    Defaults: three 640x480 cameras at 30 fps and 14-dim ``observation.state`` / ``action`` at
    200 Hz (gripper dims step between 0 and 1). Every stream has its own phase offset and
    uniform timestamp jitter (``jitter_s``, kept below half a period so times stay increasing).
    Images cycle through a bank of ``frame_bank`` distinct synthetic frames per camera (generated
    once, so the rig itself costs almost nothing per frame). ``realtime`` paces samples on the
    wall clock; ``t0`` is the time of the first sample (default: ``time.time()`` when realtime,
    else 0). ``duration_s`` ends the stream (None: endless).
    """

    def __init__(
        self,
        cameras: Sequence[CameraConfig] | None = None,
        vectors: Sequence[VectorConfig] | None = None,
        *,
        fps: float = 30.0,
        vector_hz: float = 200.0,
        seed: int = 0,
        jitter_s: float = 0.002,
        realtime: bool = False,
        t0: float | None = None,
        duration_s: float | None = None,
        frame_bank: int = 16,
    ) -> None:
        self.cameras = list(
            cameras
            if cameras is not None
            else [
                CameraConfig(f"observation.images.{name}", 640, 480)
                for name in ("cam_high", "cam_left_wrist", "cam_right_wrist")
            ]
        )
        self.vectors = list(
            vectors
            if vectors is not None
            else [VectorConfig(n, 14, (6, 13)) for n in ("observation.state", "action")]
        )
        self.fps = float(fps)
        self.vector_hz = float(vector_hz)
        self.seed = seed
        self.jitter_s = float(jitter_s)
        self.realtime = realtime
        self.t0 = t0
        self.duration_s = duration_s
        self.frame_bank = max(2, int(frame_bank))
        self._banks: dict[str, np.ndarray] = {}

    @classmethod
    def from_config(cls, config: CollectionConfig, **kwargs: object) -> SimulatedRig:
        return cls(config.cameras, config.vectors, fps=config.fps, **kwargs)  # type: ignore[arg-type]

    def _bank(self, k: int, cam: CameraConfig) -> np.ndarray:
        bank = self._banks.get(cam.key)
        if bank is None:
            scene = SyntheticScene(cam.height, cam.width, seed=self.seed * 1000 + k)
            bank = scene.frames(0, self.frame_bank)
            bank.setflags(write=False)
            self._banks[cam.key] = bank
        return bank

    def _vector_chunk(self, k: int, vec: VectorConfig, start: int, n: int) -> np.ndarray:
        hz = max(1, round(self.vector_hz))
        if vec.name == "action":
            values = joint_actions(start, n, dim=vec.dim, fps=hz, seed=self.seed)
        else:
            values = joint_states(start, n, dim=vec.dim, fps=hz, seed=self.seed + k)
        return values.astype(np.float64)

    def samples(self) -> Iterator[Sample]:
        t0 = self.t0 if self.t0 is not None else (time.time() if self.realtime else 0.0)
        rng = np.random.default_rng([self.seed, 17])
        pacer = _Pacer(self.realtime)
        # (time, order, kind, stream index, sample number); order breaks ties deterministically.
        heap: list[tuple[float, int, str, int, int]] = []
        periods: dict[tuple[str, int], float] = {}
        offsets: dict[tuple[str, int], float] = {}
        jitter = {}
        for k, _cam in enumerate(self.cameras):
            periods[("image", k)] = 1.0 / self.fps
            offsets[("image", k)] = k * 0.001
        for k, _vec in enumerate(self.vectors):
            periods[("vector", k)] = 1.0 / self.vector_hz
            offsets[("vector", k)] = 0.0005 * k
        for key in periods:
            jitter[key] = min(self.jitter_s, 0.45 * periods[key])
        for order, (kind, k) in enumerate(periods):
            heapq.heappush(heap, (offsets[(kind, k)], order, kind, k, 0))
        chunks: dict[int, tuple[int, np.ndarray]] = {}
        chunk_len = 256
        while heap:
            nominal, o, kind, k, i = heapq.heappop(heap)
            if self.duration_s is not None and nominal > self.duration_s:
                continue
            j = jitter[(kind, k)]
            t = t0 + nominal + (rng.uniform(-j, j) if j > 0 else 0.0)
            pacer.wait(t)
            if kind == "image":
                cam = self.cameras[k]
                bank = self._bank(k, cam)
                yield Sample("image", cam.key, t, bank[i % self.frame_bank])
            else:
                vec = self.vectors[k]
                start, chunk = chunks.get(k, (-chunk_len, np.empty(0)))
                if i >= start + chunk_len:
                    start = i - i % chunk_len
                    chunk = self._vector_chunk(k, vec, start, chunk_len)
                    chunks[k] = (start, chunk)
                yield Sample("vector", vec.name, t, chunk[i - start])
            period = periods[(kind, k)]
            heapq.heappush(heap, (offsets[(kind, k)] + (i + 1) * period, o, kind, k, i + 1))


class ReplaySource:
    """Replays an existing raw v2.1 dataset's frames and vectors as a live rig would.

    Episodes are played back to back on one continuous clock (each row at its ``timestamp``
    plus the episode's offset; the next episode starts one frame period after the previous one
    ended), with real-time pacing unless ``realtime=False``; ``loop`` repeats the dataset.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        realtime: bool = True,
        loop: bool = False,
        episodes: Sequence[int] | None = None,
        t0: float = 0.0,
        batch_size: int = 16,
    ) -> None:
        self.reader = DatasetReader(Path(path))
        self.realtime = realtime
        self.loop = loop
        self.episodes = list(episodes) if episodes is not None else self.reader.episode_indices
        self.t0 = t0
        self.batch_size = batch_size

    def stream_config(self) -> tuple[list[CameraConfig], list[VectorConfig]]:
        """The dataset's cameras and vector streams, for a collection config that matches.
        DatasetError (info.json and the field) for a stream or fps a config could not declare:
        capture rings are preallocated from these numbers (a 100000x100000 camera of a hostile
        dataset would be an allocation of terabytes), so they meet the config's own limits."""
        problem = replay_stream_problem(self.reader.info, self.reader.vector_keys)
        if problem is not None:
            raise DatasetError(f"{self.reader.root / layout.INFO}: {problem}")
        features = self.reader.features
        cameras = [
            CameraConfig(k, int(features[k]["shape"][1]), int(features[k]["shape"][0]))
            for k in self.reader.video_keys
        ]
        vectors = [
            VectorConfig(k, int(features[k]["shape"][0]))
            for k in self.reader.vector_keys
            if features[k].get("shape") and len(features[k]["shape"]) == 1
        ]
        return cameras, vectors

    @property
    def fps(self) -> int:
        return self.reader.fps

    def _next_batch(
        self, frames: Iterator[np.ndarray], ep: int, key: str, row: int, rows: int
    ) -> np.ndarray:
        """The camera's next decoded batch, which must cover rows ``row..`` and no more."""
        batch = next(frames, None)
        if batch is None:
            raise self._frame_count_error(
                ep, key, f"ends after {row} frames, but the table has {rows} rows"
            )
        if row + len(batch) > rows:
            raise self._frame_count_error(ep, key, f"has more frames than the {rows} table rows")
        return batch

    def _frame_count_error(self, ep: int, key: str, detail: str) -> DatasetError:
        return DatasetError(
            f"{self.reader.video_path(ep, key)}: episode {ep} camera {key} {detail}"
        )

    def samples(self) -> Iterator[Sample]:
        _, vectors = self.stream_config()
        keys = self.reader.video_keys
        fps = self.reader.fps
        pacer = _Pacer(self.realtime)
        offset = self.t0
        while True:
            for ep in self.episodes:
                table = self.reader.read_table(ep, ["timestamp"])
                stamps = table.column("timestamp").to_numpy().astype(np.float64)
                columns = {v.name: self.reader.read_vector(ep, v.name) for v in vectors}
                frames = [self.reader.iter_frames(ep, key, self.batch_size) for key in keys]
                row = 0
                while row < len(stamps):
                    batches = [
                        self._next_batch(it, ep, key, row, len(stamps))
                        for key, it in zip(keys, frames, strict=True)
                    ]
                    lengths = [len(b) for b in batches]
                    n = min(lengths) if batches else min(self.batch_size, len(stamps) - row)
                    if batches and max(lengths) != n:  # a shorter video's last batch
                        raise self._frame_count_error(
                            ep,
                            keys[lengths.index(n)],
                            f"ends after {row + n} frames, other cameras go on",
                        )
                    for i in range(n):
                        t = offset + float(stamps[row + i])
                        pacer.wait(t)
                        for key, batch in zip(keys, batches, strict=True):
                            yield Sample("image", key, t, batch[i])
                        for v in vectors:
                            yield Sample(
                                "vector",
                                v.name,
                                t,
                                np.asarray(columns[v.name][row + i], np.float64),
                            )
                    row += n
                if len(stamps):
                    offset += float(stamps[-1]) + 1.0 / fps
            if not self.loop:
                return


def replay_stream_problem(info: Mapping[str, Any], vector_keys: Sequence[str]) -> str | None:
    """Why a dataset's info.json (already past the reader's ``info_field_problems``) declares
    streams a collection config could not (None when it could): fps, camera sizes and vector
    widths are held to the limits ``eva.config`` holds a config to (``eva.dataset.limits``)."""
    fps = info["fps"]
    if not 2 <= fps <= MAX_FPS:
        return f"field fps {fps!r}: recording needs 2..{MAX_FPS} frames per second"
    for key, feature in info["features"].items():
        shape = feature["shape"]
        if feature.get("dtype") == "video":
            if len(shape) != 3 or shape[2] != 3:
                return f"feature {key!r}: shape {shape!r} is not [height, width, 3]"
            problem = image_size_problem(shape[1], shape[0])
            if problem is not None:
                return f"feature {key!r}: shape {shape!r}: {problem}"
        elif key in vector_keys and len(shape) == 1 and not 1 <= shape[0] <= MAX_VECTOR_DIM:
            return f"feature {key!r}: shape {shape!r}: a vector of 1..{MAX_VECTOR_DIM} values"
    return None


class SourceSpecError(ValueError):
    """A ``--source`` value that names no usable source (the message says why in one line)."""


def source_from_spec(
    config: CollectionConfig, spec: str, *, seed: int = 0
) -> tuple[CollectionConfig, Source, str | None]:
    """``(config, source, note)`` for a source spec: ``sim`` or ``replay:PATH``.

    A replayed dataset's streams replace the config's cameras, vectors and fps (the recorder must
    expect what the replay delivers); ``note`` then says so in one line for the operator.
    Both ``eva collect`` and ``eva console`` build their source here.
    """
    import dataclasses

    if spec == "sim":
        return config, SimulatedRig.from_config(config, realtime=True, seed=seed), None
    if not spec.startswith("replay:"):
        raise SourceSpecError(f"--source {spec!r}: use 'sim' or 'replay:PATH'")
    path = Path(spec[len("replay:") :]).expanduser()
    try:
        replay = ReplaySource(path, realtime=True, loop=True)
        cameras, vectors = replay.stream_config()
    except Exception as e:  # DatasetError / OSError: one line
        raise SourceSpecError(f"--source {spec}: {e}") from None
    discrete = {v.name: v.discrete for v in config.vectors}
    vectors = [dataclasses.replace(v, discrete=discrete.get(v.name, ())) for v in vectors]
    if (config.cameras, config.vectors, config.fps) == (tuple(cameras), tuple(vectors), replay.fps):
        return config, replay, None
    note = (
        f"recording the replayed dataset's streams ({len(cameras)} cameras, "
        f"{len(vectors)} vectors, {replay.fps} fps) instead of the config's"
    )
    config = dataclasses.replace(
        config, cameras=tuple(cameras), vectors=tuple(vectors), fps=replay.fps
    )
    problem = ring_memory_problem(config)  # the check a config's own cameras passed
    if problem is not None:
        raise SourceSpecError(f"--source {spec}: the replayed streams: {problem}")
    return config, replay, note


def describe_source(spec: str | None) -> str:
    """What the operator is recording from, for status lines and the console."""
    if spec is None:
        return "the config's sources"
    if spec == "sim":
        return "simulated rig (--source sim)"
    return f"replay of {spec[len('replay:') :]}"


class RecordingSource:
    """What feeds a recorder: an in-process source (``--source sim`` / ``replay:``, pumped on a
    thread) or the config's source processes (``capture/rig.SourceRig``, shared-memory rings).

    Use: ``rs = open_source(cfg, spec)``; ``Recorder(rs.config, rings=rs.rings)``;
    ``rs.start(recorder)``; ``rs.before_start()`` before each START (restarts stopped source
    processes); ``rs.close()``. ``streams`` maps each stream to its source's one-line text.
    """

    def __init__(
        self,
        config: CollectionConfig,
        *,
        source: Source | None = None,
        rig: SourceRig | None = None,
        note: str | None = None,
        description: str = "",
    ) -> None:
        self.config = config
        self.source = source
        self.rig = rig
        self.note = note
        self.description = description
        self.pump: SourcePump | None = None
        self.finished = threading.Event()

    @property
    def rings(self) -> Mapping[str, Ring] | None:
        return self.rig.rings if self.rig is not None else None

    @property
    def streams(self) -> dict[str, str]:
        if self.rig is not None:
            return self.rig.describe()
        names = [c.key for c in self.config.cameras] + [v.name for v in self.config.vectors]
        return dict.fromkeys(names, self.description)

    @property
    def error(self) -> BaseException | None:
        return self.pump.error if self.pump is not None else None

    def start(self, recorder: SampleSink) -> RecordingSource:
        if self.rig is not None:
            self.rig.attach(recorder)
            self.rig.start()
        else:
            assert self.source is not None
            self.pump = SourcePump(self.source, recorder).start()
            self.finished = self.pump.finished
        return self

    def before_start(self) -> list[str]:
        if self.rig is not None:
            return self.rig.restart_stopped()
        return []

    def check(self, timeout: float | None = None) -> list[str]:
        if self.rig is not None:
            return self.rig.check(timeout)
        return []

    def close(self) -> None:
        if self.pump is not None:
            self.pump.stop()
        if self.rig is not None:
            self.rig.close()


def open_source(config: CollectionConfig, spec: str | None, *, seed: int = 0) -> RecordingSource:
    """The recording source for a ``--source`` value: ``sim``, ``replay:PATH``, or None for the
    config's sources (streams without one come from the simulator, in a source process; a config
    with no source at all records the in-process simulator, and ``note`` says so)."""
    from eva.capture.rig import SourceRig, has_sources

    if spec is None:
        if not has_sources(config):
            return RecordingSource(
                config,
                source=SimulatedRig.from_config(config, realtime=True, seed=seed),
                note="the config names no sources: recording the simulated rig",
                description="simulated rig (the config names no sources)",
            )
        return RecordingSource(
            config, rig=SourceRig(config), description="the config's sources (one process each)"
        )
    config, source, note = source_from_spec(config, spec, seed=seed)
    return RecordingSource(config, source=source, note=note, description=describe_source(spec))
