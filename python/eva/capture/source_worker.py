"""A source process: runs one configured source and writes its samples into shared-memory rings.

``python -m eva.capture.source_worker`` reads one JSON object on stdin::

    {"source": {SourceConfig fields}, "worker": "module:function", "fps": 30, "parent": PID,
     "streams": [{"name", "kind": "camera"|"vector", "shape": [...], "ring": PATH,
                  "topic": str|None, "endpoint": str|None}, ...]}

``worker`` is the source kind's (``SourceKind.worker`` in ``eva.source_kinds``): this process
imports it by that path alone (no registry here, so a kind registered outside eva reaches the
process as long as its module imports with the parent's environment) and calls it with an
``eva.capture.source_context.SourceContext``. Eva's own kinds: ``ffmpeg`` (one camera,
``capture/ffmpeg_source.py``), ``zmq`` (every ZeroMQ stream with the same settings, each on its
own endpoint, ``capture/zmq_source.py``), ``python`` (one plugin object) and ``sim`` (the
simulated rig), both in ``capture/plugin_source.py``.

It attaches each stream's ring (``eva.capture.shm_ring``; the recorder created them), then the
worker pushes every sample with its capture time. Running in its own process, a source is never
stalled by the recorder's Python threads (HTTP, encoding, alignment): the time a sample is
stamped with is taken when it arrives here. Clock (one for the whole rig): Unix wall-clock
seconds (each worker module says how it stamps).

Events go to stdout as JSON lines (``{"event": "opened" | "bad_sample" | "warning" | "error" |
"ended", "stream": NAME | null, "detail": TEXT, "count": N}``); the supervisor
(``capture/rig.py``) turns them into warnings and quality issues. Bad samples (a wrong length, a
wrong image shape, malformed messages) are counted and reported, never pushed and never fatal.
The process exits when its source ends (``ended``), fails (``error``, exit 1), or the recorder
asks it to stop.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from eva.capture.source_context import (
    HIGH_NICE,
    SourceContext,
    SourceEvents,
    SourceStream,
    load_object,
)

REALTIME_PRIORITY = (
    10  # priority "realtime": SCHED_FIFO, low among real-time tasks (IRQ threads: 50)
)
ORPHAN_GRACE_S = 2.0  # after the recorder died: time to stop cleanly before exiting anyway


def _write_stats(path: str, streams: list[SourceStream]) -> None:
    """The measured pushes, as ``<path>-<pid>.npz`` (``<stream>.push_ns``, ``.stamps``,
    ``.arrivals`` arrays per stream)."""
    arrays: dict[str, Any] = {}
    for s in streams:
        arrays[f"{s.name}.push_ns"] = np.asarray(s.push_ns, np.int64)
        arrays[f"{s.name}.stamps"] = np.asarray(s.stamps, np.float64)
        arrays[f"{s.name}.arrivals"] = np.asarray(s.arrivals, np.float64)
    np.savez(f"{path}-{os.getpid()}.npz", **arrays)


def apply_priority(priority: str) -> str | None:
    """Raise this process's CPU scheduling priority before it starts any thread (threads inherit
    it: FFmpeg's UDP reader, ZeroMQ's I/O thread). A sample is stamped when this process wakes up
    to receive it; at an ordinary priority, on a host whose cores are busy (the recorder's
    encoders), that wake-up is milliseconds late. Returns a warning when the host refuses
    ``realtime`` (it needs CAP_SYS_NICE or an RLIMIT_RTPRIO); ``high`` (the default) quietly
    stays at the ordinary priority where lowering the nice value is not permitted."""
    if priority == "realtime":
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
            return None
        except (PermissionError, OSError) as e:
            warning = f"realtime priority refused ({e.strerror or e}); running at nice {HIGH_NICE}"
            try:
                os.setpriority(os.PRIO_PROCESS, 0, HIGH_NICE)
            except OSError:
                warning = (
                    f"realtime priority refused ({e.strerror or e}); running at normal priority"
                )
            return warning
    # A process started by a real-time parent inherits SCHED_FIFO: "high" and "normal" mean the
    # ordinary scheduler whatever launched eva.
    with contextlib.suppress(OSError):
        if os.sched_getscheduler(0) != os.SCHED_OTHER:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    if priority == "high":
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, HIGH_NICE)
    return None


def run(spec: dict[str, Any], stop: threading.Event) -> int:
    from eva.capture.shm_ring import attach_shm_ring

    events = SourceEvents()
    source = spec["source"]
    warning = apply_priority(source.get("priority", "high"))
    if warning:
        events.send("warning", None, warning)
    stats_path = os.environ.get("EVA_SOURCE_STATS")
    streams = [
        SourceStream(s, attach_shm_ring(s["ring"]), bool(stats_path)) for s in spec["streams"]
    ]

    # The recorder's pid, from the spec: one read from getppid() here would already be the
    # re-parented one if the recorder died while this process started.
    parent = int(spec.get("parent") or os.getppid())

    def watch_stop() -> None:
        """The recorder asks through the rings; a recorder that died (``kill -9``) cannot, so
        its death (this process re-parented) stops the source too, after removing the dead
        recorder's ring files from /dev/shm, and a source that does not return within a grace
        period (a plugin blocked in a read) is ended."""
        while True:
            if any(getattr(s.ring, "stop_requested", False) for s in streams):
                stop.set()
            if os.getppid() != parent:
                remove_orphaned_rings(spec, parent)
                stop.set()
                time.sleep(ORPHAN_GRACE_S)
                os._exit(0)
            time.sleep(0.1)

    threading.Thread(target=watch_stop, daemon=True).start()
    ctx = SourceContext(source, streams, stop, events, float(spec.get("fps", 30)))
    try:
        load_object(spec["worker"])(ctx)
    except Exception as e:  # one line for the supervisor; the exit code says it failed
        events.flush()
        text = (str(e).strip().splitlines() or [type(e).__name__])[0]
        events.send("error", None, f"{type(e).__name__}: {text}")
        return 1
    finally:
        if stats_path:
            _write_stats(stats_path, streams)
    events.flush()
    if not stop.is_set():
        events.send("ended", None, "the source has no more samples")
    return 0


def remove_orphaned_rings(spec: dict[str, Any], parent: int) -> None:
    """The ring files of ``spec`` that the recorder ``parent``, dead now, created (named after
    its pid: ``eva-<pid>-...``): nobody else would remove them before the next recording. This
    process keeps its own mappings."""
    for stream in spec["streams"]:
        path = Path(stream["ring"])
        if path.name.startswith(f"eva-{parent}-") and path.suffix == ".ring":
            with contextlib.suppress(OSError):
                path.unlink()


def main() -> None:
    spec = json.loads(sys.stdin.read())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the recorder, which stops us
    sys.exit(run(spec, stop))


if __name__ == "__main__":
    main()
