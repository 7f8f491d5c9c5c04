"""Where a camera or vector stream of the rig comes from: the ``source`` table of its config entry.

Its kind's entry in the registry (``eva.source_kinds``) parses the table (``parse_source``, for
``eva.config``, which re-exports these names); the capture stage starts a source process per
group of streams (``SourceConfig.group_key``).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

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
    - a kind registered outside eva (``eva.source_kinds``) keeps its own keys in ``settings``.
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

    settings: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """One line for status screens: the kind and what it reads."""
        from eva.source_kinds import source_kind  # the registry imports this module

        return source_kind(self.kind).describe(self)

    def group_key(self) -> tuple[Hashable, ...]:
        """Streams with the same key share one source process (one plugin object, one rig)."""
        from eva.source_kinds import source_kind

        return source_kind(self.kind).group_key(self)
