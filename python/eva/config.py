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
  ``source`` (cameras and vectors): ``{kind = "ffmpeg" | "zmq" | "python" | "sim", ...}``, see
  :class:`SourceConfig` and docs/config.md ("Sources"); absent: the simulator.
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
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eva.dataset import layout
from eva.dataset.video import VideoOptions

# re-exported: a stream's source is part of the config
from eva.source_config import SOURCE_KINDS as SOURCE_KINDS
from eva.source_config import SOURCE_PRIORITIES as SOURCE_PRIORITIES
from eva.source_config import ZMQ_BATCH_S as ZMQ_BATCH_S
from eva.source_config import SourceConfig as SourceConfig

DEFAULT_CAMERAS: tuple[tuple[str, int, int], ...] = (
    ("observation.images.cam_high", 640, 480),
    ("observation.images.cam_left_wrist", 640, 480),
    ("observation.images.cam_right_wrist", 640, 480),
)
DEFAULT_VECTOR_DIM = 14
DEFAULT_GRIPPERS = (6, 13)
DEFAULT_WARN_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0)


class ConfigError(ValueError):
    """An invalid configuration; the message names the file and the key."""


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


class _Reader:
    """Typed access to one table, with errors that name ``<file>: <dotted key>``."""

    def __init__(self, where: str, table: Mapping[str, Any], prefix: str) -> None:
        self.where = where
        self.table = table
        self.prefix = prefix

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def fail(self, name: str, message: str) -> ConfigError:
        return ConfigError(f"{self.where}: {self.key(name)}: {message}")

    def get(self, name: str, kind: type | tuple[type, ...], default: Any) -> Any:
        if name not in self.table:
            return default
        value = self.table[name]
        if isinstance(value, bool) and kind is not bool and bool not in _as_tuple(kind):
            raise self.fail(name, f"expected {_kind_name(kind)}, got a boolean")
        if not isinstance(value, kind):
            raise self.fail(name, f"expected {_kind_name(kind)}, got {type(value).__name__}")
        return value

    def number(
        self, name: str, default: float, *, minimum: float | None = None, integer: bool = False
    ) -> Any:
        kind: tuple[type, ...] = (int,) if integer else (int, float)
        value = self.get(name, kind, default)
        if minimum is not None and value < minimum:
            raise self.fail(name, f"must be >= {minimum}, got {value}")
        return int(value) if integer else float(value)

    def refuse_unknown(self, known: set[str] | frozenset[str], what: str = "key") -> None:
        """A key of this table outside ``known`` is a mistake (a typo is otherwise silently
        ignored and its setting left at the default): refuse it, suggesting the closest one."""
        for name in self.table:
            if name not in known:
                close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise self.fail(name, f"unknown {what}{hint}; known: {', '.join(sorted(known))}")

    def sub(self, name: str) -> _Reader:
        return _Reader(self.where, self.get(name, dict, {}), self.key(name))

    def tables(self, name: str, fields: str) -> Iterator[tuple[dict[str, Any], _Reader]]:
        """Each table of the array ``name`` with a reader whose errors name ``name[i]``."""
        for i, item in enumerate(self.get(name, list, [])):
            prefix = f"{self.key(name)}[{i}]"
            if not isinstance(item, dict):
                raise ConfigError(f"{self.where}: {prefix}: expected a table {{{fields}}}")
            yield item, _Reader(self.where, item, prefix)


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", dict: "a table", list: "a list"}
    return " or ".join(names.get(k, k.__name__) for k in _as_tuple(kind))


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
}


# Subtables of [collection] that later stages parse themselves (CollectionConfig.extra):
# storage.sftp is the upload's (eva.upload.config).
_COLLECTION_TABLES_OF_OTHER_STAGES = frozenset({"storage"})


def parse_collection(
    table: Mapping[str, Any], *, where: str = "config", base_dir: Path | None = None
) -> CollectionConfig:
    """Validate the ``collection`` table; ``base_dir`` anchors a relative ``log_dir``."""
    r = _Reader(where, table, "collection")
    r.refuse_unknown(_COLLECTION_KEYS | _COLLECTION_TABLES_OF_OTHER_STAGES)
    extra = {k: v for k, v in table.items() if k not in _COLLECTION_KEYS}

    log_dir, derived = resolve_log_dir(r.get("log_dir", str, ""), base_dir)

    fps = r.number("fps", 30, minimum=2, integer=True)
    if "tasks" not in table:
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

    cameras = _parse_cameras(r)
    vectors = _parse_vectors(r)
    names = [c.key for c in cameras] + [v.name for v in vectors]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise r.fail("cameras", f"duplicate stream name {dupes[0]!r} among cameras and vectors")

    enc = r.sub("encoder")
    codec = enc.get("codec", str, "libx264")
    if codec not in ("libx264", "libsvtav1"):
        raise enc.fail("codec", f"unsupported codec {codec!r}: use libx264 or libsvtav1")
    crf = enc.number("crf", 23, minimum=0, integer=True)
    if crf > 63:
        raise enc.fail("crf", f"must be <= 63, got {crf}")
    enc.refuse_unknown({"codec", "crf", "preset", "gop"})
    preset = enc.get("preset", (str, int), "veryfast")
    encoder = EncoderConfig(
        codec=codec, crf=crf, preset=str(preset), gop=enc.number("gop", 30, minimum=1, integer=True)
    )

    bl = r.sub("backlog")
    warn = bl.get("warn_seconds", list, list(DEFAULT_WARN_SECONDS))
    if not all(isinstance(w, int | float) and not isinstance(w, bool) and w > 0 for w in warn):
        raise bl.fail("warn_seconds", "expected a list of positive numbers (seconds of lag)")
    backlog = BacklogConfig(
        warn_seconds=tuple(sorted(float(w) for w in warn)),
        max_memory_mb=bl.number("max_memory_mb", 2048.0, minimum=0.001),
        ring_seconds=bl.number("ring_seconds", 1.0, minimum=0.01),
    )
    bl.refuse_unknown({"warn_seconds", "max_memory_mb", "ring_seconds"})

    skew = table.get("skew_tolerance_s")
    if skew is not None:
        skew = r.number("skew_tolerance_s", 0.0, minimum=0.0)
    return CollectionConfig(
        log_dir=log_dir,
        tasks=tasks,
        fps=fps,
        robot_type=r.get("robot_type", str, "unknown"),
        cameras=cameras,
        vectors=vectors,
        encoder=encoder,
        backlog=backlog,
        min_episode_frames=r.number("min_episode_frames", 10, minimum=1, integer=True),
        skew_tolerance_s=skew,
        stream_start_timeout_s=r.number("stream_start_timeout_s", 1.0, minimum=0.0),
        frozen_camera_s=r.number("frozen_camera_s", 1.0, minimum=0.0),
        clock_jump_s=r.number("clock_jump_s", 0.5, minimum=0.0),
        log_dir_derived=derived,
        extra=extra,
    )


def _parse_cameras(r: _Reader) -> tuple[CameraConfig, ...]:
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
        width = c.number("width", 0, minimum=2, integer=True)
        height = c.number("height", 0, minimum=2, integer=True)
        if "width" not in item or "height" not in item:
            raise c.fail("width" if "width" not in item else "height", "missing")
        if width % 2 or height % 2:
            raise c.fail("width", f"{width}x{height}: yuv420p video needs even sizes")
        source = _parse_source(c, item, "camera")
        cameras.append(CameraConfig(key, width, height, source))
    return tuple(cameras)


# Columns every episode table has already (docs/formats.md): a vector may not take their name.
_BOOKKEEPING_COLUMNS = frozenset(
    {"timestamp", "capture_time", "frame_index", "episode_index", "index", "task_index"}
)


def _parse_vectors(r: _Reader) -> tuple[VectorConfig, ...]:
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
        dim = v.number("dim", 1, minimum=1, integer=True)
        discrete = v.get("discrete", list, [])
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in discrete) or any(
            not 0 <= d < dim for d in discrete
        ):
            raise v.fail("discrete", f"expected dimension indices in 0..{dim - 1}")
        names = v.get("names", list, None)
        if names is not None and (len(names) != dim or not all(isinstance(n, str) for n in names)):
            raise v.fail("names", f"expected {dim} strings")
        source = _parse_source(v, item, "vector")
        if source is not None and source.kind == "zmq" and source.topic is None:
            source = dataclasses.replace(source, topic=name)
        vectors.append(
            VectorConfig(
                name, dim, tuple(sorted(set(discrete))), tuple(names) if names else None, source
            )
        )
    return tuple(vectors)


_SOURCE_KEYS = {
    "ffmpeg": {"url", "format", "options", "realtime", "latency_s", "kernel_timestamps"},
    "zmq": {"endpoint", "topic", "batch_s"},
    "python": {"object", "args"},
    "sim": set(),
}
_COMMON_SOURCE_KEYS = {"kind", "stall_timeout_s", "open_timeout_s", "priority"}


def _parse_source(r: _Reader, item: Mapping[str, Any], stream: str) -> SourceConfig | None:
    """The stream's ``source`` table, checked per kind (unknown keys refused, errors name them)."""
    if "source" not in item:
        return None
    s = r.sub("source")
    kind = s.get("kind", str, None)
    if kind is None:
        raise s.fail("kind", f"missing: one of {', '.join(SOURCE_KINDS)}")
    if kind not in SOURCE_KINDS:
        raise s.fail("kind", f"unknown source kind {kind!r}: use {', '.join(SOURCE_KINDS)}")
    if kind == "ffmpeg" and stream != "camera":
        raise s.fail("kind", "ffmpeg sources deliver images: use them for cameras")
    if kind == "zmq" and stream != "vector":
        raise s.fail("kind", "zmq sources deliver vectors: use them for vector streams")
    s.refuse_unknown(_COMMON_SOURCE_KEYS | _SOURCE_KEYS[kind], f"key of a {kind} source")
    common = {
        "stall_timeout_s": s.number("stall_timeout_s", 2.0, minimum=0.05),
        "open_timeout_s": s.number("open_timeout_s", 10.0, minimum=0.1),
        "priority": s.get("priority", str, SourceConfig.priority),
    }
    if common["priority"] not in SOURCE_PRIORITIES:
        raise s.fail("priority", f"expected one of {', '.join(SOURCE_PRIORITIES)}")
    if kind == "ffmpeg":
        url = s.get("url", str, None)
        if not url:
            raise s.fail("url", "missing: a device, URL or file FFmpeg can open")
        options = s.get("options", dict, {})
        bad = [
            k
            for k, v in options.items()
            if not isinstance(v, str | int | float) or isinstance(v, bool)
        ]
        if bad:
            raise s.fail(f"options.{bad[0]}", "expected a string or number (FFmpeg option value)")
        return SourceConfig(
            kind,
            url=url,
            format=s.get("format", str, None),
            options={k: str(v) for k, v in options.items()},
            realtime=s.get("realtime", bool, False),
            latency_s=s.number("latency_s", 0.0, minimum=0.0),
            kernel_timestamps=s.get("kernel_timestamps", bool, True),
            **common,
        )
    if kind == "zmq":
        endpoint = s.get("endpoint", str, None)
        if not endpoint or "://" not in endpoint:
            raise s.fail(
                "endpoint", "missing or not a ZeroMQ endpoint (tcp://host:port, ipc://path)"
            )
        batch_s = s.number("batch_s", ZMQ_BATCH_S, minimum=0.0)
        if batch_s > common["stall_timeout_s"] / 2:
            raise s.fail("batch_s", "must be at most half of stall_timeout_s")
        return SourceConfig(
            kind, endpoint=endpoint, topic=s.get("topic", str, None), batch_s=batch_s, **common
        )
    if kind == "python":
        target = s.get("object", str, None)
        module, _, attr = (target or "").partition(":")
        if (
            not module
            or not attr
            or not all(p.isidentifier() for p in module.split(".") + attr.split("."))
        ):
            raise s.fail("object", "expected 'package.module:Factory'")
        return SourceConfig(kind, object=target, args=dict(s.get("args", dict, {})), **common)
    return SourceConfig(kind, **common)


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


def collection_table(raw: Mapping[str, Any], *, where: str = "config") -> dict[str, Any]:
    """The raw ``[collection]`` table of a parsed config (ConfigError when absent or no table)."""
    table = raw.get("collection")
    if table is None:
        raise ConfigError(f"{where}: no [collection] table")
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: collection: expected a table")
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
