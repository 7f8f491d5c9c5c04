"""What a source kind's worker gets in its source process (``eva.capture.source_worker``
builds it): the streams to push samples into, the event channel to the supervisor, the stop flag.

A kind's worker (``SourceKind.worker`` in ``eva.source_kinds``) is a function taking one
:class:`SourceContext`; it pushes each sample with ``stream.push(t, data)`` (``t``: capture
time, Unix wall-clock seconds) until ``ctx.stop`` is set or its input ends (then it returns: the
process reports ``ended``). It reports ``ctx.events.send("opened", ...)`` once its input is open
and each bad sample with ``ctx.events.bad(stream, detail)``; an exception it raises is reported
as the source's error (one line) and ends the process with exit code 1. A worker whose source
object yields samples (``.stream``, ``.t``, ``.data``) hands them to :func:`push_samples`.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

HIGH_NICE = -10  # priority "high"
REPORT_EVERY_S = 1.0  # bad samples of one stream are reported at most this often


class SourceEvents:
    """JSON lines on stdout; bad samples aggregated per stream and reported at most once a second."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bad: dict[str, tuple[int, str, float]] = {}

    def send(self, event: str, stream: str | None = None, detail: str = "", count: int = 1) -> None:
        line = json.dumps({"event": event, "stream": stream, "detail": detail, "count": count})
        with self._lock:
            try:
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
            except (BrokenPipeError, ValueError):  # the recorder went away
                os._exit(0)

    def bad(self, stream: str, detail: str) -> None:
        now = time.monotonic()
        count, first_detail, since = self._bad.get(stream, (0, detail, now))
        count += 1
        if now - since >= REPORT_EVERY_S or count == 1:
            self.send("bad_sample", stream, first_detail, count)
            self._bad[stream] = (0, detail, now)
        else:
            self._bad[stream] = (count, first_detail, since)

    def flush(self) -> None:
        for stream, (count, detail, _) in list(self._bad.items()):
            if count:
                self.send("bad_sample", stream, detail, count)
        self._bad.clear()


class SourceStream:
    """One stream of the process: its name, kind ("camera" / "vector"), shape and ring."""

    def __init__(self, spec: dict[str, Any], ring: Any, measure: bool = False) -> None:
        self.name: str = spec["name"]
        self.kind: str = spec["kind"]
        self.shape = tuple(int(s) for s in spec["shape"])
        self.topic: str | None = spec.get("topic")
        self.endpoint: str | None = spec.get("endpoint")
        self.ring = ring
        # EVA_SOURCE_STATS (benchmarks): each push's duration and its wall-clock receipt time
        self.measure = measure
        self.push_ns: list[int] = []
        self.stamps: list[float] = []  # the sample's capture time
        self.arrivals: list[float] = []  # time.time() when it was pushed

    def push(self, t: float, data: np.ndarray) -> bool:
        if not self.measure:
            return bool(self.ring.push(t, data))
        t0 = time.perf_counter_ns()
        ok = bool(self.ring.push(t, data))
        self.push_ns.append(time.perf_counter_ns() - t0)
        self.stamps.append(t)
        self.arrivals.append(time.time())
        return ok


@dataclass
class SourceContext:
    """A worker's view of its source process (see module doc). ``source``: the stream group's
    ``SourceConfig`` as a dict (``dataclasses.asdict``; a registered kind's own keys are in
    ``source["settings"]``); ``fps``: the config's frame rate."""

    source: dict[str, Any]
    streams: list[SourceStream]
    stop: threading.Event
    events: SourceEvents
    fps: float


def demoted_from_realtime() -> None:
    """The calling thread leaves ``SCHED_FIFO`` for the ordinary scheduler at nice -10 (what
    ``high`` gives); a no-op for a thread that is not real-time."""
    if os.sched_getscheduler(0) == os.SCHED_FIFO:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, HIGH_NICE)


def push_samples(ctx: SourceContext, samples: Iterator[Any]) -> None:
    """Each sample of ``samples`` (``.stream``, ``.t``, ``.data``) checked against its stream
    and pushed into its ring, until ``ctx.stop``; samples of streams this process does not
    record are skipped, bad ones reported."""
    streams, stop, events = ctx.streams, ctx.stop, ctx.events
    by_name = {s.name: s for s in streams}
    for sample in samples:
        if stop.is_set():
            return
        stream = by_name.get(sample.stream)
        if stream is None:
            continue  # a stream this process does not record (another source feeds it)
        data = sample.data
        if stream.kind == "camera":
            if (
                getattr(data, "shape", None) != stream.shape
                or getattr(data, "dtype", None) != np.uint8
            ):
                events.bad(
                    stream.name,
                    f"image of shape {getattr(data, 'shape', None)}, expected {stream.shape} uint8",
                )
                continue
        else:
            data = np.asarray(data, dtype=np.float64)
            if data.shape != stream.shape:
                events.bad(stream.name, f"value of shape {data.shape}, expected {stream.shape}")
                continue
        stream.push(float(sample.t), data)


def load_object(target: str) -> Callable[..., Any]:
    """The object ``"package.module:attr.path"`` names (its module imported)."""
    module_name, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return cast(Callable[..., Any], obj)
