"""A source process: runs one configured source and writes its samples into shared-memory rings.

``python -m eva.capture.source_worker`` reads one JSON object on stdin::

    {"source": {SourceConfig fields}, "fps": 30,
     "streams": [{"name", "kind": "camera"|"vector", "shape": [...], "ring": PATH,
                  "topic": str|None, "endpoint": str|None}, ...]}

One process runs one FFmpeg camera, or every ZeroMQ stream with the same settings (each on its
own endpoint), or one plugin object, or the simulated rig.

It attaches each stream's ring (``eva.capture.shm_ring``; the recorder created them), then pushes
every sample with its capture time. Running in its own process, a source is never stalled by the
recorder's Python threads (HTTP, encoding, alignment): the time a sample is stamped with is
taken when it arrives here.

Clock (one for the whole rig): Unix wall-clock seconds.
- ``ffmpeg``: for a unicast ``udp://`` input, the kernel's receive time of the frame's first
  datagram (``eva.capture.udp_input``); for any other input, the host's wall clock when the
  packet that completes the frame is demuxed (before it is decoded); minus ``latency_s``.
- ``zmq``: the sender's ``t`` (it must use the same clock).
- ``python``: whatever the plugin's samples carry (document yours: the same wall clock).
- ``sim``: the simulated rig's clock, which starts at the wall clock.

Events go to stdout as JSON lines (``{"event": "opened" | "bad_sample" | "error" | "ended",
"stream": NAME | null, "detail": TEXT, "count": N}``); the supervisor (``capture/rig.py``) turns
them into warnings and quality issues. Bad samples (a wrong length, a wrong image shape,
malformed messages) are counted and reported, never pushed and never fatal. The process exits
when its source ends (``ended``), fails (``error``, exit 1), or the recorder asks it to stop.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np

HIGH_NICE = -10  # priority "high"
REALTIME_PRIORITY = (
    10  # priority "realtime": SCHED_FIFO, low among real-time tasks (IRQ threads: 50)
)
PACKET_QUEUE = 256  # packets received but not yet decoded (~8 s of a 30 fps camera)
REPORT_EVERY_S = 1.0  # bad samples of one stream are reported at most this often
ORPHAN_GRACE_S = 2.0  # after the recorder died: time to stop cleanly before exiting anyway
DEVICE_CLOCK_SLACK_S = 1.0  # a device timestamp further than this from receipt: another clock


class _Events:
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


class _Stream:
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


def _write_stats(path: str, streams: list[_Stream]) -> None:
    """The measured pushes, as ``<path>-<pid>.npz`` (``<stream>.push_ns``, ``.stamps``,
    ``.arrivals`` arrays per stream)."""
    arrays: dict[str, Any] = {}
    for s in streams:
        arrays[f"{s.name}.push_ns"] = np.asarray(s.push_ns, np.int64)
        arrays[f"{s.name}.stamps"] = np.asarray(s.stamps, np.float64)
        arrays[f"{s.name}.arrivals"] = np.asarray(s.arrivals, np.float64)
    np.savez(f"{path}-{os.getpid()}.npz", **arrays)


def _demoted_from_realtime() -> None:
    """The calling thread leaves ``SCHED_FIFO`` for the ordinary scheduler at nice -10 (what
    ``high`` gives); a no-op for a thread that is not real-time."""
    if os.sched_getscheduler(0) == os.SCHED_FIFO:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, HIGH_NICE)


def _camera_frames(
    source: dict[str, Any], stream: _Stream, stop: threading.Event, events: _Events
) -> Iterator[tuple[float, np.ndarray]]:
    """Decoded frames of an FFmpeg input as (receipt time, (H, W, 3) RGB at the configured size);
    the frame is a view of one reused buffer, valid until the next one (push copies it)."""
    import av

    from eva.capture.udp_input import TimestampedUdpInput, demuxer_options, parse_udp_url

    open_timeout = float(source.get("open_timeout_s", 10.0))
    read_timeout = float(source.get("stall_timeout_s", 2.0))
    options = dict(source.get("options") or {})
    target = parse_udp_url(source["url"], options) if source.get("kernel_timestamps") else None
    if target is None:
        device = is_v4l2_input(source["url"], source.get("format"))
        if device and not {"timestamps", "ts"} & options.keys():
            # the driver's buffer timestamps (CLOCK_MONOTONIC), converted by FFmpeg to the wall
            # clock: when the frame was captured, not when this process got round to it
            options["timestamps"] = "mono2abs"
        container = av.open(
            source["url"],
            format=source.get("format"),
            options=options,
            timeout=(open_timeout, read_timeout),
        )
        device = device or "video4linux2" in container.format.name.split(",")
        packets = _demuxed_on_a_thread(container, stop, read_timeout, device, events, stream)
        stamped = ", device timestamps" if device else ""
        return _decoded(source, stream, container, packets, events, stamped)
    # eva reads the socket: every datagram's arrival is stamped by the kernel, so the time a
    # frame gets does not depend on when this process wakes up, and one thread demuxes,
    # decodes and pushes (no hand-off between threads per packet: a wake-up on these hosts
    # costs as much CPU as demuxing the packet)
    udp = TimestampedUdpInput(target, open_timeout, stop)
    try:
        container = av.open(udp, "r", format=source.get("format"), options=demuxer_options(options))
    except BaseException:
        udp.close()
        raise
    udp.read_timeout = read_timeout
    _demoted_from_realtime()  # nothing here is timed by this thread's wake-ups

    def demuxed() -> Generator[tuple[float, Any], None, None]:
        try:
            for packet in container.demux(container.streams.video[0]):
                if stop.is_set():
                    return
                arrival = udp.arrival_at(packet.pos)  # the frame's first datagram
                yield (time.time() if arrival is None else arrival), packet
        finally:
            container.close()
            udp.close()

    return _decoded(source, stream, container, demuxed(), events, ", kernel receive timestamps")


def is_v4l2_input(url: str, format: str | None) -> bool:
    """A V4L2 device, by the demuxer named or, without one, the path FFmpeg would probe as one."""
    if format is not None:
        return format in ("v4l2", "video4linux2")
    return url.startswith("/dev/video")


def device_time(packet: Any, now: float) -> float | None:
    """A V4L2 packet's capture time (its pts: the buffer timestamp, in wall-clock seconds), or
    None when it is missing or not plausibly on the wall clock (more than DEVICE_CLOCK_SLACK_S
    from ``now``: a driver with another clock)."""
    if packet.pts is None or packet.time_base is None:
        return None
    t = float(packet.pts * packet.time_base)
    return t if abs(t - now) <= DEVICE_CLOCK_SLACK_S else None


def _demuxed_on_a_thread(
    container: Any,
    stop: threading.Event,
    read_timeout: float,
    device: bool,
    events: _Events,
    stream: _Stream,
) -> Generator[tuple[float, Any], None, None]:
    """Packets of FFmpeg's own input with their receipt times, demuxed on a receiver thread.

    The packet is stamped as the demuxer hands it over, so the receiver must run the moment
    data arrives: a real-time source process keeps only the receiver (and FFmpeg's socket
    reader) at ``SCHED_FIFO``, and the caller's thread, which decodes (milliseconds a frame),
    runs at the ordinary priority, where the decoders of several cameras cannot delay each
    other's receivers (with all of them at one real-time priority, a packet waited for the
    other cameras' decodes to finish). A V4L2 device stamps its buffers itself: that time is
    used (the receipt time where a packet's is implausible, with one warning)."""
    packets: queue.Queue[tuple[float, Any]] = queue.Queue(maxsize=PACKET_QUEUE)
    receiving = threading.Event()
    receiving.set()
    warned = threading.Event()
    video = container.streams.video[0]

    def receive() -> None:
        """Packets with their receipt times; ``(nan, exception or None)`` ends the queue."""
        end: BaseException | None = None
        try:
            for packet in container.demux(video):
                # the receipt time, taken before anything else: decode time varies from frame
                # to frame (a keyframe costs several P-frames), the arrival does not
                received = time.time()
                if device:
                    captured = device_time(packet, received)
                    if captured is not None:
                        received = captured
                    elif not warned.is_set():
                        warned.set()
                        events.send(
                            "warning",
                            stream.name,
                            "the device's buffer timestamps are not on the wall clock: "
                            "its frames are stamped on receipt",
                        )
                item = (received, packet)
                while receiving.is_set():
                    try:
                        packets.put(item, timeout=0.1)  # the decoder far behind: wait for it
                        break
                    except queue.Full:
                        continue
                if not receiving.is_set():
                    return
        except BaseException as e:  # handed to the decoding thread, which reports it
            end = e
        while receiving.is_set():
            try:
                packets.put((math.nan, end), timeout=0.1)
                return
            except queue.Full:
                continue

    receiver = threading.Thread(target=receive, name="eva-receive", daemon=True)
    try:
        receiver.start()  # inherits this thread's priority (real-time, if granted) ...
        _demoted_from_realtime()  # ... which the decoding thread then gives up
        while not stop.is_set():
            try:
                received, packet = packets.get(timeout=0.1)
            except queue.Empty:
                continue
            if math.isnan(received):
                if packet is not None:
                    raise packet
                return  # the end of the input
            yield received, packet
    finally:
        receiving.clear()
        # the receiver may be inside a read (at most the stall timeout): the container must
        # outlive it; a process ending anyway leaves it to the OS
        receiver.join(read_timeout + 1.0)
        if not receiver.is_alive():
            container.close()


def _decoded(
    source: dict[str, Any],
    stream: _Stream,
    container: Any,
    packets: Generator[tuple[float, Any], None, None],
    events: _Events,
    stamped: str = "",
) -> Iterator[tuple[float, np.ndarray]]:
    """Each packet decoded, scaled to the camera's size and converted to RGB into one reused
    buffer, with its packet's receipt time minus ``latency_s``."""
    from eva.dataset.rgb import FrameConverter

    height, width = stream.shape[0], stream.shape[1]
    video = container.streams.video[0]
    # slice threads only: frame threads would hold frames back and release them in bursts
    video.thread_type = "SLICE"
    events.send(
        "opened", stream.name, f"{video.codec_context.name} {video.width}x{video.height}{stamped}"
    )
    latency = float(source.get("latency_s", 0.0))
    buffer = np.zeros((1, height, width, 3), np.uint8)
    converter = FrameConverter()
    started = False
    pace_origin: tuple[float, float] | None = None
    try:
        for received, packet in packets:
            for frame in packet.decode():
                t = received
                if source.get("realtime") and frame.time is not None:
                    now = time.monotonic()
                    if pace_origin is None:
                        pace_origin = (now, frame.time)
                    delay = pace_origin[0] + (frame.time - pace_origin[1]) - now
                    if delay > 0:
                        time.sleep(delay)
                    t = time.time()  # a file played at its pace: the frame "arrives" now
                if (frame.width, frame.height) != (width, height):
                    frame = frame.reformat(width=width, height=height)  # scaled, same format
                # into one reused buffer (libswscale or the LUT kernel when they match PyAV's)
                if started:
                    converter.convert(frame, buffer, 0)
                else:
                    converter.start_video(frame, buffer, 0)
                    started = True
                yield t - latency, buffer[0]
    finally:
        packets.close()  # ends the demuxing (its thread, the input) with the frames


def _run_ffmpeg(
    source: dict[str, Any], streams: list[_Stream], stop: threading.Event, events: _Events
) -> None:
    (stream,) = streams  # one camera per FFmpeg input
    for t, rgb in _camera_frames(source, stream, stop, events):
        stream.push(t, rgb)


def _run_zmq(
    source: dict[str, Any], streams: list[_Stream], stop: threading.Event, events: _Events
) -> None:
    """Every ZeroMQ stream of this process: one SUB socket per endpoint (a topic names a stream
    only within its endpoint), all polled by this one thread, which sleeps ``batch_s`` after
    the first message of a batch so that one wake-up takes every message of every stream."""
    try:
        import zmq
    except ImportError:
        raise RuntimeError("zmq sources need pyzmq: pip install 'eva[rig]'") from None

    context = zmq.Context()
    poller = zmq.Poller()
    by_endpoint: dict[str, dict[bytes, _Stream]] = {}
    for stream in streams:
        topics = by_endpoint.setdefault(stream.endpoint or source["endpoint"], {})
        topics[(stream.topic or stream.name).encode()] = stream
    sockets: list[tuple[Any, dict[bytes, _Stream]]] = []
    try:
        for endpoint, topics in by_endpoint.items():
            socket = context.socket(zmq.SUB)
            sockets.append((socket, topics))
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.RCVHWM, 100_000)
            for topic in topics:
                socket.setsockopt(zmq.SUBSCRIBE, topic)
            socket.connect(endpoint)
            poller.register(socket, zmq.POLLIN)
            events.send("opened", None, f"zmq {endpoint}")
        batch_s = float(source.get("batch_s", 0.0))
        while not stop.is_set():
            if not poller.poll(100):
                continue
            if batch_s:  # let the batch gather: one wake-up for every message in it
                stop.wait(batch_s)
            for socket, topics in sockets:
                _take_messages(socket, topics, events)
    finally:
        for socket, _ in sockets:
            socket.close(0)
        context.term()


def _take_messages(socket: Any, topics: dict[bytes, _Stream], events: _Events) -> None:
    """Every message waiting on ``socket``, checked and pushed into its stream's ring."""
    import msgpack
    import zmq

    while True:
        try:
            parts = socket.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        stream = topics.get(parts[0]) if parts else None
        if stream is None:
            continue  # a prefix match of another topic
        try:
            if len(parts) != 2:
                raise ValueError(f"{len(parts)} frames, expected [topic, payload]")
            message = msgpack.unpackb(parts[1], raw=False)
            t = float(message["t"])
            value = np.asarray(message["value"], dtype=np.float64)
        except (ValueError, TypeError, KeyError, msgpack.UnpackException) as e:
            events.bad(stream.name, f"malformed message on topic {stream.topic!r}: {e}")
            continue
        if not math.isfinite(t):
            events.bad(stream.name, f"time {t!r} is not finite")
            continue
        if value.shape != stream.shape:
            events.bad(stream.name, f"value of shape {value.shape}, expected {stream.shape}")
            continue
        # Non-finite values are pushed: the recorder's checks report them (non_finite_value).
        stream.push(t, value)


def _samples_into(
    samples: Iterator[Any], streams: list[_Stream], stop: threading.Event, events: _Events
) -> None:
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
    module_name, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return cast(Callable[..., Any], obj)


def _run_python(
    source: dict[str, Any], streams: list[_Stream], stop: threading.Event, events: _Events
) -> None:
    factory = load_object(source["object"])
    plugin = factory(**dict(source.get("args") or {}))
    if not callable(getattr(plugin, "samples", None)):
        raise TypeError(f"{source['object']}: the object it made has no samples() method")
    events.send("opened", None, f"python {source['object']}")
    _samples_into(plugin.samples(), streams, stop, events)


def _run_sim(
    source: dict[str, Any],
    streams: list[_Stream],
    stop: threading.Event,
    events: _Events,
    fps: float,
) -> None:
    from eva.capture.sources import SimulatedRig
    from eva.config import CameraConfig, VectorConfig

    cameras = [CameraConfig(s.name, s.shape[1], s.shape[0]) for s in streams if s.kind == "camera"]
    vectors = [VectorConfig(s.name, s.shape[0]) for s in streams if s.kind == "vector"]
    rig = SimulatedRig(cameras, vectors, fps=fps, realtime=True, seed=int(source.get("seed", 0)))
    events.send("opened", None, "sim")
    _samples_into(rig.samples(), streams, stop, events)


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

    events = _Events()
    source = spec["source"]
    warning = apply_priority(source.get("priority", "high"))
    if warning:
        events.send("warning", None, warning)
    stats_path = os.environ.get("EVA_SOURCE_STATS")
    streams = [_Stream(s, attach_shm_ring(s["ring"]), bool(stats_path)) for s in spec["streams"]]

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
    kind = source["kind"]
    try:
        if kind == "ffmpeg":
            _run_ffmpeg(source, streams, stop, events)
        elif kind == "zmq":
            _run_zmq(source, streams, stop, events)
        elif kind == "python":
            _run_python(source, streams, stop, events)
        elif kind == "sim":
            _run_sim(source, streams, stop, events, float(spec.get("fps", 30)))
        else:
            raise ValueError(f"unknown source kind {kind!r}")
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
