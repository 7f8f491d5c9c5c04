"""Real loopback publishers for ``bench_rig.py``, each run as its own process:

    python rig_publishers.py udp PORT SECONDS WIDTH HEIGHT SEED SENDLOG
    python rig_publishers.py zmq PORT SECONDS DIM TOPIC

``udp``: H.264 in MPEG-TS over UDP to 127.0.0.1:PORT at 30 fps, the AVIO buffer flushed after
every packet (a camera that sends each frame as soon as it is encoded). The pictures are the
simulated rig's (``SyntheticScene(HEIGHT, WIDTH, seed=SEED)``, 16 frames cycled, what
``SimulatedRig(seed=0)`` gives camera SEED), so the recorder encodes the same content in the real
and the simulated sessions. A camera encodes on its own hardware: the 16 frames are encoded once
at start (libx264 ultrafast, zerolatency, no B-frames, a keyframe every 16 frames) and the packets
sent in a loop with increasing timestamps, so the publisher itself costs almost no CPU on the
host it shares with the recorder. Just before the packet of frame ``i`` is written to the socket,
``time.time()`` is appended to SENDLOG as one float64 (flushed each frame: the record survives a
kill), the sender-side send times a receiver's stamps are compared with.

``zmq``: ``[TOPIC, msgpack({"t": time.time(), "value": [DIM floats]})]`` on a PUB socket bound to
tcp://127.0.0.1:PORT at 200 Hz (``t`` is the send time; the receiver records its arrival).

Both pace themselves on ``time.monotonic()`` from their start and stop after SECONDS or on
SIGTERM.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import struct
import sys
import time
from fractions import Fraction

FPS = 30
ZMQ_HZ = 200
FRAME_BANK = 16

_stop = False


def _on_term(*_: object) -> None:
    global _stop
    _stop = True


def encode_loop(width: int, height: int, seed: int) -> list[tuple[bytes, bool]]:
    """The loop a camera publisher sends: the bank encoded once (a keyframe every FRAME_BANK
    frames, no scene cuts), after 2 warm-up cycles so the rate control has settled; it starts on
    a keyframe, so the loop can repeat forever."""
    import av

    from eva.capture.synthetic import SyntheticScene

    bank = SyntheticScene(height, width, seed=seed).frames(0, FRAME_BANK)
    ctx = av.CodecContext.create("libx264", "w")
    ctx.width, ctx.height, ctx.pix_fmt = width, height, "yuv420p"
    ctx.time_base = Fraction(1, FPS)
    ctx.framerate = Fraction(FPS, 1)
    ctx.options = {
        "preset": "ultrafast",
        "tune": "zerolatency",
        "g": str(FRAME_BANK),
        "keyint_min": str(FRAME_BANK),
        "sc_threshold": "0",
        "bf": "0",
    }
    packets = []
    for i in range(4 * FRAME_BANK):
        frame = av.VideoFrame.from_ndarray(bank[i % FRAME_BANK], format="rgb24")
        frame.pts = i
        packets += [(bytes(p), bool(p.is_keyframe)) for p in ctx.encode(frame)]
    packets += [(bytes(p), bool(p.is_keyframe)) for p in ctx.encode(None)]
    if len(packets) != 4 * FRAME_BANK or not packets[2 * FRAME_BANK][1]:
        raise RuntimeError("x264 did not give one packet per frame with a keyframe per loop")
    return packets[2 * FRAME_BANK :]


def publish_udp(
    port: int, seconds: float, width: int, height: int, seed: int, sendlog: str
) -> None:
    import av

    loop = encode_loop(width, height, seed)
    url = f"udp://127.0.0.1:{port}?pkt_size=1316"
    with (
        open(sendlog, "wb", buffering=0) as log,
        av.open(url, "w", format="mpegts", options={"flush_packets": "1"}) as out,
    ):
        stream = out.add_stream("h264", rate=FPS)
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuv420p"
        tb = Fraction(1, 90000)
        start = time.monotonic()
        i = 0
        while not _stop and time.monotonic() - start < seconds:
            data, key = loop[i % len(loop)]
            packet = av.Packet(data)
            packet.stream = stream
            packet.time_base = tb
            packet.pts = packet.dts = i * 90000 // FPS
            packet.is_keyframe = key
            # logged as the frame starts to leave: the moment its first datagram is sent
            log.write(struct.pack("<d", time.time()))
            out.mux(packet)
            i += 1
            delay = start + i / FPS - time.monotonic()
            if delay > 0:
                time.sleep(delay)


def publish_zmq(port: int, seconds: float, dim: int, topic: str) -> None:
    import msgpack
    import zmq

    context = zmq.Context()
    socket = context.socket(zmq.PUB)
    socket.setsockopt(zmq.LINGER, 0)
    socket.bind(f"tcp://127.0.0.1:{port}")
    name = topic.encode()
    start = time.monotonic()
    i = 0
    try:
        while not _stop and time.monotonic() - start < seconds:
            t = time.time()
            value = [math.sin(0.9 * t + k) for k in range(dim)]
            socket.send_multipart([name, msgpack.packb({"t": t, "value": value})])
            i += 1
            delay = start + i / ZMQ_HZ - time.monotonic()
            if delay > 0:
                time.sleep(delay)
    finally:
        socket.close(0)
        context.term()


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGTERM, _on_term)
    if os.environ.get("BENCH_PUBLISHER_FIFO", "1") == "1":
        # A camera or a robot controller sends on its own hardware (or at real-time priority):
        # its send times do not depend on this host's load. Here the publishers share 2 cores
        # with the recorder's encoders, so they run SCHED_FIFO (above the sources' priority 10)
        # to keep their own wake-up latency out of the receiver's measured jitter.
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(20))
    kind, port, seconds = argv[0], int(argv[1]), float(argv[2])
    if kind == "udp":
        width, height, seed = int(argv[3]), int(argv[4]), int(argv[5])
        publish_udp(port, seconds, width, height, seed, argv[6])
    elif kind == "zmq":
        publish_zmq(port, seconds, int(argv[3]), argv[4])
    else:
        raise SystemExit(f"unknown publisher {kind!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
