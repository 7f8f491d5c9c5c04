"""Real publishers on 127.0.0.1 for the rig tests, each run as its own process:

    python rig_publishers.py udp PORT SECONDS [WIDTH HEIGHT]   H.264 in MPEG-TS over UDP, 30 fps
    python rig_publishers.py zmq PORT SECONDS [DIM] [MODE]     msgpack state on a ZeroMQ PUB, 200 Hz

The UDP camera paints frame ``i`` with a known pattern (``udp_frame(i)``: flat colour bands whose
level encodes ``i``) so a test can compare the recorded pixels with what was sent. The ZeroMQ
publisher sends ``value = zmq_value(t)`` (smooth, so linear interpolation onto the grid is close);
MODE ``bad`` also sends malformed messages, wrong lengths and non-finite values between the good
ones.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time

import numpy as np

FPS = 30
ZMQ_HZ = 200


def udp_frame(i: int, width: int = 160, height: int = 120) -> np.ndarray:
    frame = np.empty((height, width, 3), np.uint8)
    level = 40 + (i * 7) % 180
    frame[: height // 2] = (level, 255 - level, 80)
    frame[height // 2 :] = (200, level, 255 - level)
    return frame


def zmq_value(t: float, dim: int) -> list[float]:
    return [math.sin(0.9 * t + k) for k in range(dim)]


def publish_udp(port: int, seconds: float, width: int = 160, height: int = 120) -> None:
    import av

    # flush_packets: each frame leaves as it is muxed, as a camera sends it. Without it the
    # last datagram of a frame waits in FFmpeg's 1316-byte buffer until the next frames fill
    # it, and a small frame can reach the receiver (and its kernel stamp) a frame period late.
    url = f"udp://127.0.0.1:{port}?pkt_size=1316"
    with av.open(url, "w", format="mpegts", options={"flush_packets": "1"}) as out:
        stream = out.add_stream("libx264", rate=FPS)
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuv420p"
        # a keyframe a third of a second: a receiver that joins late starts quickly
        stream.options = {"preset": "ultrafast", "tune": "zerolatency", "g": "10", "bf": "0"}
        # RIG_SEND_LOG: each frame's lateness against its schedule, as it leaves (a test tells
        # a stall of this process, which the receiver rightly reports, from one of eva's)
        log_path = os.environ.get("RIG_SEND_LOG")
        log = open(log_path, "a", buffering=1) if log_path else None  # noqa: SIM115
        start = time.monotonic()
        i = 0
        while time.monotonic() - start < seconds:
            frame = av.VideoFrame.from_ndarray(udp_frame(i, width, height), format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                out.mux(packet)
            if log is not None:
                log.write(f"{i} {time.monotonic() - (start + i / FPS):.6f}\n")
            i += 1
            delay = start + i / FPS - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        for packet in stream.encode(None):
            out.mux(packet)


def publish_zmq(port: int, seconds: float, dim: int = 6, mode: str = "good") -> None:
    import msgpack
    import zmq

    context = zmq.Context()
    socket = context.socket(zmq.PUB)
    socket.bind(f"tcp://127.0.0.1:{port}")
    topic = b"observation.state"
    start = time.monotonic()
    i = 0
    while time.monotonic() - start < seconds:
        t = time.time()
        socket.send_multipart([topic, msgpack.packb({"t": t, "value": zmq_value(t, dim)})])
        if mode == "bad" and i % 20 == 5:
            socket.send_multipart([topic, b"\xc1not msgpack"])
            socket.send_multipart([topic, msgpack.packb({"t": t, "value": [1.0] * (dim + 1)})])
            socket.send_multipart([topic, msgpack.packb({"value": [1.0] * dim})])
            socket.send_multipart([topic])
        if mode == "bad" and i % 50 == 7:
            nan = [float("nan")] * dim
            socket.send_multipart([topic, msgpack.packb({"t": t + 1e-4, "value": nan})])
        i += 1
        delay = start + i / ZMQ_HZ - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    socket.close(0)
    context.term()


if __name__ == "__main__":
    # A camera or a robot controller sends on its own hardware: its send times must not wander
    # with this host's load (the whole suite, on 2 cores), or a green-quality assertion would
    # measure the publisher's wake-ups. Real-time where permitted (root), else as started.
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(20))
    kind, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    if kind == "udp":
        size = [int(x) for x in sys.argv[4:6]] or [160, 120]
        publish_udp(port, seconds, *size)
    elif kind == "zmq":
        dim = int(sys.argv[4]) if len(sys.argv) > 4 else 6
        publish_zmq(port, seconds, dim, sys.argv[5] if len(sys.argv) > 5 else "good")
    else:
        raise SystemExit(f"unknown publisher {kind!r}")
