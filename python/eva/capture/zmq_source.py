"""The ``zmq`` source kind's worker: every ZeroMQ vector stream of one source process.

Messages are ``[topic, msgpack({"t": capture time, "value": [...]})]``; a sample keeps its
sender's ``t`` (the sender must use the rig's clock, Unix wall-clock seconds).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from eva.capture.source_context import SourceContext, SourceEvents, SourceStream


def run(ctx: SourceContext) -> None:
    """Every ZeroMQ stream of this process: one SUB socket per endpoint (a topic names a stream
    only within its endpoint), all polled by this one thread, which sleeps ``batch_s`` after
    the first message of a batch so that one wake-up takes every message of every stream."""
    try:
        import zmq
    except ImportError:
        raise RuntimeError("zmq sources need pyzmq: pip install 'eva[rig]'") from None

    source, stop, events = ctx.source, ctx.stop, ctx.events
    context = zmq.Context()
    poller = zmq.Poller()
    by_endpoint: dict[str, dict[bytes, SourceStream]] = {}
    for stream in ctx.streams:
        topics = by_endpoint.setdefault(stream.endpoint or source["endpoint"], {})
        topics[(stream.topic or stream.name).encode()] = stream
    sockets: list[tuple[Any, dict[bytes, SourceStream]]] = []
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


def _take_messages(socket: Any, topics: dict[bytes, SourceStream], events: SourceEvents) -> None:
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
