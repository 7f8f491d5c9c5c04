"""Where a camera or vector stream of the rig comes from: the ``source`` table of its config entry.

Parsed here (``parse_source``) for ``eva.config``, which re-exports these names; read by the
capture stage, which starts a source process per group of streams (``SourceConfig.group_key``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from eva.config_table import MAX_DURATION_S, TableReader

SOURCE_KINDS = ("ffmpeg", "zmq", "python", "sim")
# normal: as started; high: nice -10; realtime: SCHED_FIFO (each falls back to the one before it,
# with a warning, where the host does not permit it)
SOURCE_PRIORITIES = ("normal", "high", "realtime")
# A ZeroMQ source wakes at most this often (its messages carry their sender's time, so waking
# for each one would only cost CPU: on small VMs a wake-up costs more than handling a message)
ZMQ_BATCH_S = 0.02


@dataclass(frozen=True)
class SourceConfig:
    """Where one camera or vector stream comes from (``source = {kind = ...}`` in its table).

    - ``ffmpeg`` (cameras): ``url`` opened by FFmpeg through PyAV (a V4L2/UVC device, RTSP, UDP or
      RTP, HTTP MJPEG, a file), with ``format`` and ``options`` passed to ``av.open``;
      ``realtime`` plays a file at its own pace; ``latency_s`` is subtracted from the receipt time;
      ``kernel_timestamps`` (unicast ``udp://``): eva reads the socket, the kernel stamps arrivals.
    - ``zmq`` (vectors): a SUB socket on ``endpoint``, messages ``[topic, msgpack({"t", "value"})]``
      with ``topic`` (default: the stream name); ``batch_s``: the source process wakes at most
      this often and takes every waiting message (they keep their sender's ``t``).
    - ``python``: ``object = "package.module:Factory"`` called with ``args`` gives a source
      object with ``samples()``; streams naming the same object and args share one instance.
    - ``sim``: the simulated rig.
    ``stall_timeout_s``: a stream that delivers nothing for this long while recording is reported
    (a warning and a red ``source_stalled`` flag); ``open_timeout_s``: how long the pre-check
    waits for the first sample. ``priority``: the source process's CPU scheduling (one of
    ``SOURCE_PRIORITIES``): a receipt time is only as exact as the process's wake-up when the
    sample arrives, and on a loaded host an ordinary process wakes milliseconds late.
    """

    kind: str
    url: str | None = None
    format: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    realtime: bool = False
    latency_s: float = 0.0
    kernel_timestamps: bool = True
    endpoint: str | None = None
    topic: str | None = None
    batch_s: float = ZMQ_BATCH_S
    object: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    stall_timeout_s: float = 2.0
    open_timeout_s: float = 10.0
    priority: str = "high"

    def describe(self) -> str:
        """One line for status screens: the kind and what it reads."""
        if self.kind == "ffmpeg":
            fmt = f" ({self.format})" if self.format else ""
            return f"ffmpeg {self.url}{fmt}"
        if self.kind == "zmq":
            return (
                f"zmq {self.endpoint} topic {self.topic!r}"
                if self.topic
                else f"zmq {self.endpoint}"
            )
        if self.kind == "python":
            return f"python {self.object}"
        return "sim (simulated rig)"

    def group_key(self) -> tuple[Any, ...]:
        """Streams with the same key share one source process (one plugin object, one rig)."""
        if self.kind == "python":
            return ("python", self.object, repr(sorted(self.args.items())))
        if self.kind == "sim":
            return ("sim",)
        if self.kind == "zmq":
            # one subscriber process for every ZeroMQ stream with the same settings, whatever
            # its endpoint: one wake-up then serves them all (a wake-up, not a message, is
            # what costs CPU)
            return ("zmq", self.priority, self.batch_s, self.stall_timeout_s, self.open_timeout_s)
        return ("ffmpeg", self.url, self.format, repr(sorted(self.options.items())))


_SOURCE_KEYS = {
    "ffmpeg": {"url", "format", "options", "realtime", "latency_s", "kernel_timestamps"},
    "zmq": {"endpoint", "topic", "batch_s"},
    "python": {"object", "args"},
    "sim": set(),
}
_COMMON_SOURCE_KEYS = {"kind", "stall_timeout_s", "open_timeout_s", "priority"}


def parse_source(r: TableReader, item: Mapping[str, Any], stream: str) -> SourceConfig | None:
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
        "stall_timeout_s": s.number("stall_timeout_s", 2.0, minimum=0.05, maximum=MAX_DURATION_S),
        "open_timeout_s": s.number("open_timeout_s", 10.0, minimum=0.1, maximum=MAX_DURATION_S),
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
            latency_s=s.number("latency_s", 0.0, minimum=0.0, maximum=MAX_DURATION_S),
            kernel_timestamps=s.get("kernel_timestamps", bool, True),
            **common,
        )
    if kind == "zmq":
        endpoint = s.get("endpoint", str, None)
        if not endpoint or "://" not in endpoint:
            raise s.fail(
                "endpoint", "missing or not a ZeroMQ endpoint (tcp://host:port, ipc://path)"
            )
        batch_s = s.number("batch_s", ZMQ_BATCH_S, minimum=0.0, maximum=MAX_DURATION_S)
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
