"""The source-kind registry: one entry per kind of capture source (``source = {kind = ...}``).

An entry (:class:`SourceKind`) holds all eva knows of a kind: the streams it can feed, its keys of
the ``source`` table and how they are read (the config schema), its one-line description
(``eva collect --list``, status screens), which streams share one source process, an optional
``eva collect --check`` probe, and its worker: the ``"module:function"`` that the source
process (``eva.capture.source_worker``) imports and runs with an
``eva.capture.source_context.SourceContext``. Nothing else in eva asks what a kind is.

Adding a kind from outside eva: build a :class:`SourceKind` and call
:func:`register_source_kind` at import of your module. To make the ``eva`` command (and the
console) know it, declare that module as an entry point of the group ``eva.source_kinds``
(``[project.entry-points."eva.source_kinds"] mykind = "mypackage.mykind"``): it is imported the
first time a config names a kind eva does not know. The worker reaches the source process by
its path alone (the process imports that module; it inherits the parent's environment, so the
module must be importable with the parent's ``PYTHONPATH``, not just its ``sys.path``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from eva.config_table import MAX_DURATION_S, TableReader
from eva.source_config import SOURCE_PRIORITIES, ZMQ_BATCH_S, SourceConfig

ENTRY_POINT_GROUP = "eva.source_kinds"
STREAM_TYPES = ("camera", "vector")


@dataclass(frozen=True)
class SourceKind:
    """One kind of capture source (see module doc).

    - ``streams``: the stream types it can feed (``"camera"``: (H, W, 3) uint8 images,
      ``"vector"``: float64 vectors);
    - ``keys``: its own keys of the ``source`` table (every kind also takes ``kind``,
      ``stall_timeout_s``, ``open_timeout_s`` and ``priority``; any other key is refused);
    - ``parse(table, base, stream_name)``: its config from its table, ``base`` holding the
      common keys already read; errors are ``table.fail(key, message)`` (one line naming the
      file and the key); its own settings go into ``SourceConfig.settings`` (JSON values);
    - ``describe(source)``: one line for ``--list`` and status screens;
    - ``group_key(source)``: streams with equal keys share one source process;
    - ``worker``: ``"module:function"``, called in the source process with a ``SourceContext``;
    - ``group_problem(source, stream_names)``: why those streams cannot share a process (None: they can);
    - ``check(source)``: ``eva collect --check``'s probe of what only this machine can show
      (one line, or None), before it waits for every stream's first sample.
    """

    name: str
    streams: tuple[str, ...]
    keys: frozenset[str]
    parse: Callable[[TableReader, SourceConfig, str], SourceConfig]
    describe: Callable[[SourceConfig], str]
    group_key: Callable[[SourceConfig], tuple[Hashable, ...]]
    worker: str
    group_problem: Callable[[SourceConfig, Sequence[str]], str | None] | None = None
    check: Callable[[SourceConfig], str | None] | None = None

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"source kind {self.name!r}: the name must be an identifier")
        if not self.streams or not set(self.streams) <= set(STREAM_TYPES):
            raise ValueError(f"source kind {self.name!r}: streams must be among {STREAM_TYPES}")
        module, _, function = self.worker.partition(":")
        if not module or not function:
            raise ValueError(f"source kind {self.name!r}: worker must be 'module:function'")

    def wrong_stream(self) -> str:
        """The error for a kind used on a stream type it cannot feed."""
        if self.streams == ("camera",):
            return f"{self.name} sources deliver images: use them for cameras"
        return f"{self.name} sources deliver vectors: use them for vector streams"


_KINDS: dict[str, SourceKind] = {}
_plugins_loaded = False


def register_source_kind(kind: SourceKind, *, replace: bool = False) -> SourceKind:
    """Make ``kind`` known to config loading, the rig and ``eva collect``; a name already taken
    is refused unless ``replace``."""
    if kind.name in _KINDS and not replace:
        raise ValueError(f"source kind {kind.name!r} is already registered")
    _KINDS[kind.name] = kind
    return kind


def unregister_source_kind(name: str) -> None:
    """Forget a registered kind (tests); an unknown name is ignored."""
    _KINDS.pop(name, None)


def find_source_kind(name: str) -> SourceKind | None:
    """The entry of ``name``, loading the ``eva.source_kinds`` entry points once if it is not
    registered yet; None for a kind nobody registers."""
    if name not in _KINDS:
        load_plugins()
    return _KINDS.get(name)


def source_kind(name: str) -> SourceKind:
    """The entry of a kind a parsed config names (KeyError: a config no parser produced)."""
    kind = find_source_kind(name)
    if kind is None:
        raise KeyError(f"unknown source kind {name!r}")
    return kind


def source_kind_names() -> list[str]:
    """Every kind's name, eva's own first (in registration order)."""
    load_plugins()
    return list(_KINDS)


def load_plugins() -> None:
    """Import the modules of the ``eva.source_kinds`` entry points (once): each registers its
    kinds. A module that fails to import raises ImportError naming the entry point."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry.load()  # an imported module is not run again: a retry registers nothing twice
        except Exception as e:
            text = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ImportError(
                f"source kind plugin {entry.name} ({entry.value}): {type(e).__name__}: {text}"
            ) from None
    _plugins_loaded = True


_COMMON_KEYS = frozenset({"kind", "stall_timeout_s", "open_timeout_s", "priority"})


def parse_source(
    r: TableReader, item: Mapping[str, Any], stream: str, name: str
) -> SourceConfig | None:
    """The ``source`` table of the ``stream`` ("camera" / "vector") called ``name``, read by its
    kind's entry (unknown keys refused, errors name them); None when it has none."""
    if "source" not in item:
        return None
    s = r.sub("source")
    kind_name = s.get("kind", str, None)
    try:  # a plugin that does not import is this key's problem
        kind = None if kind_name is None else find_source_kind(kind_name)
        known = ", ".join(source_kind_names())
    except ImportError as e:
        raise s.fail("kind", str(e)) from None
    if kind_name is None:
        raise s.fail("kind", f"missing: one of {known}")
    if kind is None:
        raise s.fail("kind", f"unknown source kind {kind_name!r}: use {known}")
    if stream not in kind.streams:
        raise s.fail("kind", kind.wrong_stream())
    s.refuse_unknown(_COMMON_KEYS | kind.keys, f"key of a {kind_name} source")
    base = SourceConfig(
        kind_name,
        stall_timeout_s=s.number("stall_timeout_s", 2.0, minimum=0.05, maximum=MAX_DURATION_S),
        open_timeout_s=s.number("open_timeout_s", 10.0, minimum=0.1, maximum=MAX_DURATION_S),
        priority=s.get("priority", str, SourceConfig.priority),
    )
    if base.priority not in SOURCE_PRIORITIES:
        raise s.fail("priority", f"expected one of {', '.join(SOURCE_PRIORITIES)}")
    return kind.parse(s, base, name)


# ---- eva's own kinds ----------------------------------------------------------------------


def _parse_ffmpeg(s: TableReader, base: SourceConfig, stream: str) -> SourceConfig:
    url = s.get("url", str, None)
    if not url:
        raise s.fail("url", "missing: a device, URL or file FFmpeg can open")
    options = s.get("options", dict, {})
    bad = [
        k for k, v in options.items() if not isinstance(v, str | int | float) or isinstance(v, bool)
    ]
    if bad:
        raise s.fail(f"options.{bad[0]}", "expected a string or number (FFmpeg option value)")
    return dataclasses.replace(
        base,
        url=url,
        format=s.get("format", str, None),
        options={k: str(v) for k, v in options.items()},
        realtime=s.get("realtime", bool, False),
        latency_s=s.number("latency_s", 0.0, minimum=0.0, maximum=MAX_DURATION_S),
        kernel_timestamps=s.get("kernel_timestamps", bool, True),
    )


def _describe_ffmpeg(source: SourceConfig) -> str:
    fmt = f" ({source.format})" if source.format else ""
    return f"ffmpeg {source.url}{fmt}"


def _one_camera_per_input(source: SourceConfig, names: Sequence[str]) -> str | None:
    if len(names) <= 1:
        return None
    return f"cameras {', '.join(names)} name the same FFmpeg input {source.url}: give each camera its own"


def _parse_zmq(s: TableReader, base: SourceConfig, stream: str) -> SourceConfig:
    endpoint = s.get("endpoint", str, None)
    if not endpoint or "://" not in endpoint:
        raise s.fail("endpoint", "missing or not a ZeroMQ endpoint (tcp://host:port, ipc://path)")
    batch_s = s.number("batch_s", ZMQ_BATCH_S, minimum=0.0, maximum=MAX_DURATION_S)
    if batch_s > base.stall_timeout_s / 2:
        raise s.fail("batch_s", "must be at most half of stall_timeout_s")
    topic = s.get("topic", str, None)
    return dataclasses.replace(
        base, endpoint=endpoint, topic=stream if topic is None else topic, batch_s=batch_s
    )


def _describe_zmq(source: SourceConfig) -> str:
    if source.topic:
        return f"zmq {source.endpoint} topic {source.topic!r}"
    return f"zmq {source.endpoint}"


def _zmq_group(source: SourceConfig) -> tuple[Hashable, ...]:
    # one subscriber process for every ZeroMQ stream with the same settings, whatever its
    # endpoint: one wake-up then serves them all (a wake-up, not a message, is what costs CPU)
    return ("zmq", source.priority, source.batch_s, source.stall_timeout_s, source.open_timeout_s)


def _parse_python(s: TableReader, base: SourceConfig, stream: str) -> SourceConfig:
    target = s.get("object", str, None)
    module, _, attr = (target or "").partition(":")
    names = module.split(".") + attr.split(".")
    if not module or not attr or not all(p.isidentifier() for p in names):
        raise s.fail("object", "expected 'package.module:Factory'")
    return dataclasses.replace(base, object=target, args=dict(s.get("args", dict, {})))


def _parse_sim(s: TableReader, base: SourceConfig, stream: str) -> SourceConfig:
    return base


for _kind in (
    SourceKind(
        "ffmpeg",
        ("camera",),
        frozenset({"url", "format", "options", "realtime", "latency_s", "kernel_timestamps"}),
        _parse_ffmpeg,
        _describe_ffmpeg,
        lambda s: ("ffmpeg", s.url, s.format, repr(sorted(s.options.items()))),
        "eva.capture.ffmpeg_source:run",
        group_problem=_one_camera_per_input,
    ),
    SourceKind(
        "zmq",
        ("vector",),
        frozenset({"endpoint", "topic", "batch_s"}),
        _parse_zmq,
        _describe_zmq,
        _zmq_group,
        "eva.capture.zmq_source:run",
    ),
    SourceKind(
        "python",
        STREAM_TYPES,
        frozenset({"object", "args"}),
        _parse_python,
        lambda s: f"python {s.object}",
        lambda s: ("python", s.object, repr(sorted(s.args.items()))),
        "eva.capture.plugin_source:run_plugin",
    ),
    SourceKind(
        "sim",
        STREAM_TYPES,
        frozenset(),
        _parse_sim,
        lambda s: "sim (simulated rig)",
        lambda s: ("sim",),
        "eva.capture.plugin_source:run_sim",
    ),
):
    register_source_kind(_kind)
