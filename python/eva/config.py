"""The eva configuration file (TOML, read with the stdlib ``tomllib``).

Only the ``[collection]`` table is interpreted here; every other table, and the subtables of
``collection`` that other stages own (``collection.storage``: the upload's), stay available as
plain dicts through ``Config.raw`` and ``CollectionConfig.extra`` so those stages parse their own
parts. Any other key or table in ``[collection]`` and its tables is refused, naming it and the
closest known key (``collection.encodr: unknown key (did you mean 'encoder'?)``).

``[collection]`` keys (all optional except ``tasks``):

- ``log_dir``: where datasets live. Empty or missing -> a derived work directory:
  ``$EVA_HOME/logs`` when ``EVA_HOME`` is set, else ``$XDG_DATA_HOME/eva/logs`` (default
  ``~/.local/share/eva/logs``). A relative path is taken relative to the config file's directory.
  The dataset ``NAME`` is recorded in ``<log_dir>/<NAME>/raw/``.
- ``tasks``: table dataset name -> list of task prompts (the COLLECT panel's choices).
- ``fps`` (default 30), ``robot_type`` (default "unknown").
- ``cameras``: array of ``{key, width, height, source}``; ``key`` is the video feature name
  (``observation.images.front``). Default: the simulated rig's three 640x480 cameras.
  ``source`` (cameras and vectors): ``{kind = "ffmpeg" | "zmq" | "python" | "sim", ...}`` or a
  registered kind (``eva.source_kinds``), see :class:`SourceConfig` and docs/config.md
  ("Sources"); absent: the simulator.
- ``vectors``: array of ``{name, dim, discrete = [dims], names = [...]}``; ``discrete`` dims
  (grippers) are held, not interpolated. Default: ``observation.state`` and ``action``, 14 dims,
  grippers 6 and 13.
- ``encoder``: ``{codec = "libx264", crf = 23, preset = "veryfast", gop = 30}``.
- ``backlog``: ``{warn_seconds = [0.5, 1, 2, 5, 10], max_memory_mb = 2048, ring_seconds = 1.0}``:
  a warning is logged each time a stream's lag rises past a threshold; ``max_memory_mb`` is the
  hard limit of ring storage over all cameras (split evenly), past which samples are refused,
  counted and the episode is marked red (``capture_backlog_overflow``); ``ring_seconds`` of
  storage per stream are preallocated.
- ``min_episode_frames`` (default 10): shorter episodes are saved red (``episode_too_short``).
- ``skew_tolerance_s``: image skew tolerance; default ``1 / (2 (fps - 1))``.
- ``stream_start_timeout_s`` (default 1.0): how long (source clock) the grid start waits for a
  stream's first sample before treating the stream as missing.
- ``frozen_camera_s`` (default 1.0): identical consecutive images over this span -> frozen_camera.
- ``clock_jump_s`` (default 0.5): a gap between a stream's consecutive samples larger than this
  -> source_clock_discontinuity.
- ``metrics``: the limits of the motion and content metrics that order review
  (:class:`eva.dataset.motion_metrics.MetricThresholds`, docs/capture.md): ``idle_delta``,
  ``idle_s``, ``jerk_ldj``, ``chatter_hz``, ``saturation_s``, ``frozen_s``,
  ``duplicated_frames``, ``missing_frames``, and ``red``: the metrics that also add a red issue.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eva.config_table import MAX_DURATION_S, TableReader, check_strings
from eva.config_table import ConfigError as ConfigError  # re-exported: raised by load_config
from eva.dataset import layout
from eva.dataset.limits import (
    MAX_FPS,
    MAX_GOP,
    MAX_IMAGE_SIDE,
    MAX_VECTOR_DIM,
    image_size_problem,
)
from eva.dataset.motion_metrics import RED_CODES, MetricThresholds
from eva.dataset.video import VideoOptions

# re-exported: a stream's source is part of the config
from eva.source_config import SOURCE_PRIORITIES as SOURCE_PRIORITIES
from eva.source_config import ZMQ_BATCH_S as ZMQ_BATCH_S
from eva.source_config import SourceConfig as SourceConfig
from eva.source_kinds import parse_source

DEFAULT_CAMERAS: tuple[tuple[str, int, int], ...] = (
    ("observation.images.cam_high", 640, 480),
    ("observation.images.cam_left_wrist", 640, 480),
    ("observation.images.cam_right_wrist", 640, 480),
)
DEFAULT_VECTOR_DIM = 14
DEFAULT_GRIPPERS = (6, 13)
DEFAULT_WARN_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0)
# Capture storage bounds: ring memory over all cameras (1 TiB) and the seconds of samples each
# stream's ring preallocates; the rings must also fit this machine (``ring_memory_problem``).
MAX_MEMORY_MB = 1_048_576.0
MAX_RING_SECONDS = 60.0


@dataclass(frozen=True)
class CameraConfig:
    key: str
    width: int
    height: int
    source: SourceConfig | None = None  # None: the simulated rig (or a --source override)


@dataclass(frozen=True)
class VectorConfig:
    name: str
    dim: int
    discrete: tuple[int, ...] = ()
    names: tuple[str, ...] | None = None
    source: SourceConfig | None = None


@dataclass(frozen=True)
class EncoderConfig:
    # The defaults are the raw writer's (VideoOptions), stated once there.
    codec: str = VideoOptions.codec
    crf: int = VideoOptions.crf
    preset: str = VideoOptions.preset
    gop: int = VideoOptions.gop


@dataclass(frozen=True)
class BacklogConfig:
    warn_seconds: tuple[float, ...] = DEFAULT_WARN_SECONDS
    max_memory_mb: float = 2048.0
    ring_seconds: float = 1.0


@dataclass(frozen=True)
class CollectionConfig:
    log_dir: Path
    tasks: dict[str, list[str]]
    fps: int = 30
    robot_type: str = "unknown"
    cameras: tuple[CameraConfig, ...] = ()
    vectors: tuple[VectorConfig, ...] = ()
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    backlog: BacklogConfig = field(default_factory=BacklogConfig)
    min_episode_frames: int = 10
    skew_tolerance_s: float | None = None
    stream_start_timeout_s: float = 1.0
    frozen_camera_s: float = 1.0
    clock_jump_s: float = 0.5
    metrics: MetricThresholds = field(default_factory=MetricThresholds)
    log_dir_derived: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def skew_tolerance(self) -> float:
        if self.skew_tolerance_s is not None:
            return self.skew_tolerance_s
        return 1.0 / (2.0 * (self.fps - 1))

    def dataset_dir(self, name: str) -> Path:
        """``<log_dir>/<sanitised name>/raw``; a name that would escape log_dir is refused."""
        return dataset_dir(self.log_dir, name)


@dataclass(frozen=True)
class Config:
    path: Path | None
    collection: CollectionConfig
    raw: dict[str, Any]


def default_log_dir(env: Mapping[str, str] | None = None) -> Path:
    """The derived work directory used when ``collection.log_dir`` is empty (see module doc)."""
    env = os.environ if env is None else env
    if env.get("EVA_HOME"):
        return Path(env["EVA_HOME"]).expanduser() / "logs"
    data_home = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home).expanduser() / "eva" / "logs"


def resolve_log_dir(text: str, base_dir: Path | None = None) -> tuple[Path, bool]:
    """``(absolute log_dir, derived)`` for the ``collection.log_dir`` text: empty -> the derived
    work directory (``default_log_dir``); relative -> under ``base_dir`` (the config's folder)."""
    derived = not text.strip()
    if derived:
        log_dir = default_log_dir()
    else:
        log_dir = Path(text).expanduser()
        if not log_dir.is_absolute():
            log_dir = (base_dir or Path.cwd()) / log_dir
    return Path(os.path.abspath(log_dir)), derived


def ring_memory_problem(config: CollectionConfig, available_bytes: int | None = None) -> str | None:
    """Why this machine cannot hold the capture rings ``config`` preallocates (None when it can):
    each camera's ring holds ``backlog.ring_seconds`` of frames at ``fps`` from the start, whatever
    ``max_memory_mb`` allows later. ``available_bytes``: default, the machine's physical memory."""
    if available_bytes is None:
        try:
            available_bytes = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            return None
    frames = math.ceil(config.fps * config.backlog.ring_seconds)
    needed = sum(frames * c.width * c.height * 3 for c in config.cameras)
    if needed <= available_bytes:
        return None
    return (
        f"collection.backlog.ring_seconds: {config.backlog.ring_seconds:g} s of frames at "
        f"{config.fps} fps from {len(config.cameras)} camera(s) need {needed / 1e6:.0f} MB of "
        f"memory, this machine has {available_bytes / 1e6:.0f} MB (fewer or smaller cameras, "
        "a lower fps or ring_seconds)"
    )


def dataset_dir(log_dir: Path, name: str) -> Path:
    """``<log_dir>/<sanitised name>/raw``; ConfigError for a name that would escape log_dir."""
    try:
        safe = layout.sanitize_dataset_name(name)
    except layout.UnsafeNameError as e:
        raise ConfigError(str(e)) from None
    path = Path(log_dir) / safe / "raw"
    if not layout.is_within(path, log_dir):
        raise ConfigError(f"dataset name {name!r} would escape the log directory")
    return path


_COLLECTION_KEYS = {
    "log_dir",
    "tasks",
    "fps",
    "robot_type",
    "cameras",
    "vectors",
    "encoder",
    "backlog",
    "min_episode_frames",
    "skew_tolerance_s",
    "stream_start_timeout_s",
    "frozen_camera_s",
    "clock_jump_s",
    "metrics",
}


# Subtables of [collection] that later stages parse themselves (CollectionConfig.extra):
# storage.sftp is the upload's (eva.upload.config).
_COLLECTION_TABLES_OF_OTHER_STAGES = frozenset({"storage"})


def parse_collection(
    table: Mapping[str, Any], *, where: str = "config", base_dir: Path | None = None
) -> CollectionConfig:
    """Validate the ``collection`` table; ``base_dir`` anchors a relative ``log_dir``."""
    r = TableReader(where, table, "collection")
    r.refuse_unknown(_COLLECTION_KEYS | _COLLECTION_TABLES_OF_OTHER_STAGES)
    extra = {k: v for k, v in table.items() if k not in _COLLECTION_KEYS}

    log_dir, derived = resolve_log_dir(r.get("log_dir", str, ""), base_dir)

    fps = r.number("fps", 30, minimum=2, maximum=MAX_FPS, integer=True)
    tasks = _parse_tasks(r)
    cameras = _parse_cameras(r)
    vectors = _parse_vectors(r)
    names = [c.key for c in cameras] + [v.name for v in vectors]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise r.fail("cameras", f"duplicate stream name {dupes[0]!r} among cameras and vectors")

    encoder = _parse_encoder(r.sub("encoder"))
    backlog = _parse_backlog(r.sub("backlog"))

    skew = table.get("skew_tolerance_s")
    if skew is not None:
        skew = r.number("skew_tolerance_s", 0.0, minimum=0.0, maximum=MAX_DURATION_S)
    return CollectionConfig(
        log_dir=log_dir,
        tasks=tasks,
        fps=fps,
        robot_type=r.get("robot_type", str, "unknown"),
        cameras=cameras,
        vectors=vectors,
        encoder=encoder,
        backlog=backlog,
        min_episode_frames=r.number(
            "min_episode_frames", 10, minimum=1, maximum=MAX_FPS * MAX_DURATION_S, integer=True
        ),
        skew_tolerance_s=skew,
        stream_start_timeout_s=r.duration("stream_start_timeout_s", 1.0),
        frozen_camera_s=r.duration("frozen_camera_s", 1.0),
        clock_jump_s=r.duration("clock_jump_s", 0.5),
        metrics=_parse_metrics(r.sub("metrics")),
        log_dir_derived=derived,
        extra=extra,
    )


def _parse_tasks(r: TableReader) -> dict[str, list[str]]:
    """``collection.tasks``: dataset name -> its prompts; two names may not share a directory."""
    if "tasks" not in r.table:
        raise r.fail("tasks", "missing: map each dataset name to a list of task prompts")
    tasks_table = r.get("tasks", dict, {})
    if not tasks_table:
        raise r.fail("tasks", "needs at least one dataset name")
    tasks: dict[str, list[str]] = {}
    directories: dict[str, str] = {}  # sanitised directory name -> the dataset name it came from
    for name, prompts in tasks_table.items():
        key = f"tasks.{name}"
        if isinstance(prompts, str):
            prompts = [prompts]
        if (
            not isinstance(prompts, list)
            or not prompts
            or not all(isinstance(p, str) and p.strip() for p in prompts)
        ):
            raise r.fail(key, "expected a non-empty list of non-empty task prompts")
        if "/" in name or "\\" in name:
            # A user writing "pick/red" expects a subdirectory; one dataset is one directory.
            raise r.fail(key, f"dataset name {name!r}: '/' and '\\' are not allowed")
        try:
            directory = layout.sanitize_dataset_name(name)
        except layout.UnsafeNameError as e:
            raise r.fail(key, str(e)) from None
        if directory in directories:
            # Both would record into one raw dataset.
            raise r.fail(
                key,
                f"dataset name {name!r} and {directories[directory]!r} both map to the "
                f"directory {directory!r}; rename one",
            )
        directories[directory] = name
        tasks[name] = [p.strip() for p in prompts]
    return tasks


def _parse_encoder(enc: TableReader) -> EncoderConfig:
    codec = enc.get("codec", str, "libx264")
    if codec not in ("libx264", "libsvtav1"):
        raise enc.fail("codec", f"unsupported codec {codec!r}: use libx264 or libsvtav1")
    crf = enc.number("crf", 23, minimum=0, maximum=63, integer=True)
    enc.refuse_unknown({"codec", "crf", "preset", "gop"})
    preset = enc.get("preset", (str, int), "veryfast")
    return EncoderConfig(
        codec=codec,
        crf=crf,
        preset=str(preset),
        gop=enc.number("gop", 30, minimum=1, maximum=MAX_GOP, integer=True),
    )


def _parse_metrics(m: TableReader) -> MetricThresholds:
    """``collection.metrics``: the limits of the review metrics; ``red`` lists the metrics that
    also add a red quality_issues code (none by default: the score only orders review)."""
    d = MetricThresholds()
    m.refuse_unknown({f.name for f in dataclasses.fields(MetricThresholds)})
    red = m.get("red", list, [])
    for name in red:
        if not isinstance(name, str) or name not in RED_CODES:
            raise m.fail("red", f"unknown metric {name!r}; known: {', '.join(RED_CODES)}")

    def count(name: str, default: int) -> int:
        return int(
            m.number(name, default, minimum=0, maximum=MAX_FPS * MAX_DURATION_S, integer=True)
        )

    return MetricThresholds(
        idle_delta=m.duration("idle_delta", d.idle_delta),
        idle_s=m.duration("idle_s", d.idle_s),
        jerk_ldj=m.number("jerk_ldj", d.jerk_ldj, minimum=-100.0, maximum=100.0),
        chatter_hz=m.duration("chatter_hz", d.chatter_hz),
        saturation_s=m.duration("saturation_s", d.saturation_s),
        frozen_s=m.duration("frozen_s", d.frozen_s),
        duplicated_frames=count("duplicated_frames", d.duplicated_frames),
        missing_frames=count("missing_frames", d.missing_frames),
        red=tuple(dict.fromkeys(red)),
    )


def _parse_backlog(bl: TableReader) -> BacklogConfig:
    warn = bl.get("warn_seconds", list, list(DEFAULT_WARN_SECONDS))
    if not all(
        isinstance(w, int | float) and not isinstance(w, bool) and 0 < w <= MAX_DURATION_S
        for w in warn
    ):
        raise bl.fail(
            "warn_seconds", f"expected a list of numbers in 0..{MAX_DURATION_S:g} (seconds of lag)"
        )
    backlog = BacklogConfig(
        warn_seconds=tuple(sorted(float(w) for w in warn)),
        max_memory_mb=bl.number("max_memory_mb", 2048.0, minimum=0.001, maximum=MAX_MEMORY_MB),
        ring_seconds=bl.number("ring_seconds", 1.0, minimum=0.01, maximum=MAX_RING_SECONDS),
    )
    bl.refuse_unknown({"warn_seconds", "max_memory_mb", "ring_seconds"})
    return backlog


def _parse_cameras(r: TableReader) -> tuple[CameraConfig, ...]:
    if "cameras" not in r.table:
        return tuple(CameraConfig(k, w, h) for k, w, h in DEFAULT_CAMERAS)
    cameras = []
    for item, c in r.tables("cameras", "key, width, height"):
        c.refuse_unknown({"key", "width", "height", "source"})
        key = c.get("key", str, None)
        if key is None:
            raise c.fail("key", "missing")
        try:
            layout.check_video_key(key)
        except layout.UnsafeNameError as e:
            raise c.fail("key", str(e)) from None
        if "width" not in item or "height" not in item:
            raise c.fail("width" if "width" not in item else "height", "missing")
        width = c.number("width", 0, minimum=2, maximum=MAX_IMAGE_SIDE, integer=True)
        height = c.number("height", 0, minimum=2, maximum=MAX_IMAGE_SIDE, integer=True)
        problem = image_size_problem(width, height)
        if problem is not None:
            raise c.fail("width", problem)
        source = parse_source(c, item, "camera", key)
        cameras.append(CameraConfig(key, width, height, source))
    return tuple(cameras)


# Columns every episode table has already (docs/formats.md): a vector may not take their name.
_BOOKKEEPING_COLUMNS = frozenset(
    {"timestamp", "capture_time", "frame_index", "episode_index", "index", "task_index"}
)


def _parse_vectors(r: TableReader) -> tuple[VectorConfig, ...]:
    if "vectors" not in r.table:
        return tuple(
            VectorConfig(name, DEFAULT_VECTOR_DIM, DEFAULT_GRIPPERS)
            for name in ("observation.state", "action")
        )
    vectors = []
    for item, v in r.tables("vectors", "name, dim, discrete"):
        v.refuse_unknown({"name", "dim", "discrete", "names", "source"})
        name = v.get("name", str, None)
        if not name or not name.strip() or any(ch in name for ch in "\n\r\x00"):
            raise v.fail("name", "missing or not a usable column name")
        if name in _BOOKKEEPING_COLUMNS:
            raise v.fail("name", f"{name!r} collides with a bookkeeping column")
        if "dim" not in item:
            raise v.fail("dim", "missing")
        dim = v.number("dim", 1, minimum=1, maximum=MAX_VECTOR_DIM, integer=True)
        discrete = v.get("discrete", list, [])
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in discrete) or any(
            not 0 <= d < dim for d in discrete
        ):
            raise v.fail("discrete", f"expected dimension indices in 0..{dim - 1}")
        names = v.get("names", list, None)
        if names is not None and (len(names) != dim or not all(isinstance(n, str) for n in names)):
            raise v.fail("names", f"expected {dim} strings")
        source = parse_source(v, item, "vector", name)
        vectors.append(
            VectorConfig(
                name, dim, tuple(sorted(set(discrete))), tuple(names) if names else None, source
            )
        )
    return tuple(vectors)


def read_toml(path: Path | str) -> dict[str, Any]:
    """The parsed TOML file; ConfigError naming the file when it is missing, unreadable or bad."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config file ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML ({e})") from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ConfigError(f"{path}: invalid TOML (nested too deeply)") from None


def collection_table(raw: Mapping[str, Any], *, where: str = "config") -> dict[str, Any]:
    """The raw ``[collection]`` table of a parsed config (ConfigError when absent or no table)."""
    table = raw.get("collection")
    if table is None:
        raise ConfigError(f"{where}: no [collection] table")
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: collection: expected a table")
    check_strings(table, "collection", where)
    return table


def load_config(path: Path | str) -> Config:
    """Read and validate a TOML config file."""
    path = Path(path)
    raw = read_toml(path)
    return config_from_dict(raw, where=str(path), base_dir=path.resolve().parent, path=path)


def config_from_dict(
    raw: Mapping[str, Any],
    *,
    where: str = "config",
    base_dir: Path | None = None,
    path: Path | None = None,
) -> Config:
    table = collection_table(raw, where=where)
    return Config(path, parse_collection(table, where=where, base_dir=base_dir), dict(raw))
