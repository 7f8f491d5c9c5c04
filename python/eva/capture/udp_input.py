"""A ``udp://`` camera input read by eva itself, each datagram stamped by the kernel on arrival.

FFmpeg's own UDP reader hands the demuxer bytes without their arrival times, so a frame could only
be stamped when the demuxer returns it: after the *next* frame has begun to arrive (the MPEG-TS
demuxer and the H.264 parser end a frame at the next one's start), and only as soon as the
receiving thread is scheduled. On a loaded host that wake-up wanders by milliseconds.

Here the socket asks the kernel for the receive time of every datagram (``SO_TIMESTAMPNS``: the
wall clock when the datagram reached the socket, taken in the kernel whatever the process is
doing). The datagrams are handed to PyAV as a byte stream (``av.open(input, format=...)``) and
the offset each one starts at is remembered, so a demuxed packet's byte position (``pos``, where
its PES begins) gives the arrival of the frame's first datagram: the frame's capture time, on
the rig's wall clock, exact to the kernel's delivery.

Used for unicast ``udp://HOST:PORT`` URLs (``@`` or an empty host listens on every address) whose
query options it understands; any other input (multicast, RTP, RTSP, devices, files) stays
FFmpeg's, stamped at demux.
"""

from __future__ import annotations

import bisect
import contextlib
import ipaddress
import select
import socket
import struct
import threading
import time
from urllib.parse import parse_qsl, urlsplit

# Linux values; CPython does not export these names on every build
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
RECEIVE_BUFFER = 8 << 20  # kernel buffer: seconds of video while the demuxer is busy
# FFmpeg's UDP options that concern only its own reader (its FIFO thread, its buffer): the
# kernel buffer above takes their place.
IGNORED_OPTIONS = {"fifo_size", "overrun_nonfatal", "timeout", "pkt_size", "reuse"}
STOP_POLL_S = 0.1  # a stalled read notices ``stop`` within this
KEPT_ARRIVALS = 16384  # datagram arrivals remembered (several seconds of any camera)
_TIMESPEC = struct.Struct("qq")


class UdpTarget:
    """Where a ``udp://`` URL listens: host, port and the receive buffer it asks for."""

    def __init__(self, host: str, port: int, buffer_bytes: int) -> None:
        self.host = host
        self.port = port
        self.buffer_bytes = buffer_bytes


def demuxer_options(options: dict[str, str]) -> dict[str, str]:
    """``options`` without those of FFmpeg's UDP reader (the demuxer's own stay)."""
    return {k: v for k, v in options.items() if k not in IGNORED_OPTIONS | {"buffer_size"}}


def parse_udp_url(url: str, options: dict[str, str]) -> UdpTarget | None:
    """The target of a unicast ``udp://`` URL eva can read itself, else None (FFmpeg reads it)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme != "udp" or port is None or parts.path not in ("", "/"):
        return None
    host = parts.hostname or ""
    if host in ("", "@"):
        host = "0.0.0.0"
    try:
        if ipaddress.ip_address(host).is_multicast:
            return None  # group membership and source filters: FFmpeg's reader does those
    except ValueError:
        return None  # a host name: FFmpeg resolves it as it documents
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    buffer_bytes = RECEIVE_BUFFER
    for key, value in {**options, **query}.items():
        if key == "buffer_size":
            try:
                buffer_bytes = max(int(value), 65536)
            except ValueError:
                return None
        elif key not in IGNORED_OPTIONS and key in query:
            return None  # an option of FFmpeg's UDP reader this one does not have
    return UdpTarget(host, port, buffer_bytes)


class TimestampedUdpInput:
    """The datagrams of one UDP port as a readable byte stream (``read(n)``, for ``av.open``)
    that remembers the kernel's arrival time of the datagram at every byte offset."""

    def __init__(
        self, target: UdpTarget, read_timeout: float, stop: threading.Event | None = None
    ) -> None:
        self.target = target
        self.read_timeout = read_timeout
        self.stop = stop  # once set, reads end the stream (``b""``) instead of waiting
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            try:  # past rmem_max where permitted (CAP_NET_ADMIN), as FFmpeg's buffer_size
                self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, target.buffer_bytes)
            except OSError:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, target.buffer_bytes)
            self.sock.bind((target.host, target.port))
        except OSError:
            self.sock.close()
            raise
        self.ancillary = socket.CMSG_SPACE(_TIMESPEC.size)
        self.received = 0  # bytes received: the stream offset the next datagram starts at
        self.starts: list[int] = []  # offset of each remembered datagram ...
        self.arrivals: list[float] = []  # ... and its arrival (Unix seconds)
        self.rest = memoryview(b"")  # the part of a datagram a short read left over

    def describe(self) -> str:
        return f"udp://{self.target.host}:{self.target.port}"

    def _receive(self, flags: int = 0) -> bytes | None:
        """One datagram (None when none is waiting and ``flags`` asks not to wait)."""
        try:
            data, ancillary, _, _ = self.sock.recvmsg(65536, self.ancillary, flags)
        except BlockingIOError:
            return None
        arrival = None
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                seconds, nanoseconds = _TIMESPEC.unpack_from(payload)
                arrival = seconds + nanoseconds * 1e-9
        self.starts.append(self.received)
        self.arrivals.append(time.time() if arrival is None else arrival)
        self.received += len(data)
        if len(self.starts) > 2 * KEPT_ARRIVALS:
            del self.starts[:KEPT_ARRIVALS], self.arrivals[:KEPT_ARRIVALS]
        return data

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes: what has arrived, waiting up to ``read_timeout`` for the first;
        ``b""`` (the end) once ``stop`` is set."""
        if not self.rest:
            deadline = time.monotonic() + self.read_timeout
            while True:
                if self.stop is not None and self.stop.is_set():
                    return b""
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"{self.describe()}: no datagram for {self.read_timeout:g} s "
                        "(stall timeout)"
                    )
                ready, _, _ = select.select([self.sock], [], [], min(left, STOP_POLL_S))
                if ready:
                    break
            self.rest = memoryview(self._receive() or b"")
        out = bytearray(self.rest[:n])
        self.rest = self.rest[n:]
        while not self.rest and len(out) < n:
            more = self._receive(socket.MSG_DONTWAIT)
            if more is None:
                break
            take = n - len(out)
            out += more[:take]
            self.rest = memoryview(more)[take:]
        return bytes(out)

    def arrival_at(self, pos: int | None) -> float | None:
        """The arrival of the datagram holding byte ``pos`` (None if unknown or forgotten)."""
        if pos is None or pos < 0 or not self.starts or pos < self.starts[0]:
            return None
        return self.arrivals[bisect.bisect_right(self.starts, pos) - 1]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
