"""eva's own UDP camera input: kernel arrival times per datagram, served to PyAV as a byte stream.

Real sockets on 127.0.0.1 and a real PyAV MPEG-TS stream; no wall-time assertions, only the
clock's order (a datagram arrives after it was sent and before it was read).
"""

from __future__ import annotations

import socket
import threading
import time
from fractions import Fraction

import av
import numpy as np
import pytest

from eva.capture.udp_input import (
    TimestampedUdpInput,
    UdpTarget,
    demuxer_options,
    parse_udp_url,
)

pytestmark = pytest.mark.realtime


def bound_input(
    read_timeout: float = 2.0, stop: threading.Event | None = None
) -> TimestampedUdpInput:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return TimestampedUdpInput(UdpTarget("127.0.0.1", port, 1 << 20), read_timeout, stop)


@pytest.mark.parametrize(
    ("url", "host", "port"),
    [
        ("udp://127.0.0.1:5000", "127.0.0.1", 5000),
        ("udp://@:5001", "0.0.0.0", 5001),
        ("udp://:5002", "0.0.0.0", 5002),
        ("udp://127.0.0.1:5003?fifo_size=100000&overrun_nonfatal=1", "127.0.0.1", 5003),
    ],
)
def test_unicast_urls_are_read_by_eva(url: str, host: str, port: int) -> None:
    target = parse_udp_url(url, {})
    assert target is not None and (target.host, target.port) == (host, port)


@pytest.mark.parametrize(
    "url",
    [
        "udp://239.0.0.1:5000",  # multicast: FFmpeg joins the group
        "udp://camera.local:5000",  # a host name: FFmpeg resolves it
        "udp://127.0.0.1:5000?localport=7",  # an option only FFmpeg's reader has
        "udp://127.0.0.1",  # no port
        "rtp://127.0.0.1:5000",
        "rtsp://127.0.0.1/stream",
        "/dev/video0",
        "udp://127.0.0.1:5000?buffer_size=big",
        "udp://127.0.0.1:99999",
    ],
)
def test_other_inputs_stay_ffmpegs(url: str) -> None:
    assert parse_udp_url(url, {}) is None


def test_buffer_size_and_demuxer_options() -> None:
    target = parse_udp_url("udp://127.0.0.1:5000", {"buffer_size": "4194304"})
    assert target is not None and target.buffer_bytes == 4194304
    options = {"probesize": "65536", "fifo_size": "1000", "buffer_size": "1", "timeout": "5"}
    assert demuxer_options(options) == {"probesize": "65536"}


def test_reads_return_every_byte_in_order_with_each_datagrams_arrival() -> None:
    udp = bound_input()
    rng = np.random.default_rng(1)
    payloads = [rng.bytes(int(n)) for n in rng.integers(1, 3000, 60)]
    sent_before: list[float] = []
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
            for data in payloads:
                sent_before.append(time.time())
                tx.sendto(data, (udp.target.host, udp.target.port))
        out = bytearray()
        while len(out) < sum(map(len, payloads)):
            out += udp.read(int(rng.integers(1, 5000)))  # shorter and longer than a datagram
        read_after = time.time()
        assert bytes(out) == b"".join(payloads)
        offset = 0
        for k, data in enumerate(payloads):
            arrival = udp.arrival_at(offset + len(data) // 2)
            assert arrival is not None and sent_before[k] <= arrival <= read_after
            assert udp.arrival_at(offset) == arrival  # every byte of a datagram: one arrival
            offset += len(data)
        assert udp.arrival_at(None) is None and udp.arrival_at(-1) is None
    finally:
        udp.close()


def test_a_silent_socket_times_out_naming_the_input() -> None:
    udp = bound_input(read_timeout=0.2)
    try:
        with pytest.raises(TimeoutError, match=r"udp://127\.0\.0\.1:\d+: no datagram for 0\.2 s"):
            udp.read(1000)
    finally:
        udp.close()


def test_a_stop_ends_a_waiting_read_as_the_end_of_the_stream() -> None:
    """The camera's one thread waits in ``read``: a stop must end it (``b""``, FFmpeg's EOF)
    long before the stall timeout, with no error."""
    stop = threading.Event()
    udp = bound_input(read_timeout=30.0, stop=stop)
    try:
        threading.Timer(0.2, stop.set).start()
        assert udp.read(1000) == b""
        assert stop.is_set()
    finally:
        udp.close()


def test_pyav_demuxes_mpegts_from_it_with_packet_arrivals() -> None:
    """Each demuxed packet's ``pos`` leads to the arrival of the datagram its PES starts in."""
    udp = bound_input()
    frames = 40
    rng = np.random.default_rng(2)
    sends: list[float] = []

    def publish() -> None:
        url = f"udp://{udp.target.host}:{udp.target.port}?pkt_size=1316"
        with av.open(url, "w", format="mpegts", options={"flush_packets": "1"}) as out:
            stream = out.add_stream("libx264", rate=30)
            stream.width, stream.height, stream.pix_fmt = 160, 120, "yuv420p"
            stream.options = {"preset": "ultrafast", "tune": "zerolatency", "bf": "0"}
            stream.time_base = Fraction(1, 30)
            for i in range(frames):
                picture = rng.integers(0, 256, (120, 160, 3), np.uint8)  # ~10 KB a frame
                frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
                frame.pts = i
                for packet in stream.encode(frame):
                    sends.append(time.time())
                    out.mux(packet)
                time.sleep(0.01)
            for packet in stream.encode(None):
                sends.append(time.time())
                out.mux(packet)

    sender = threading.Thread(target=publish)
    sender.start()
    try:
        container = av.open(udp, format="mpegts", options={"probesize": "32768"})
        udp.read_timeout = 0.5
        arrivals = []
        try:
            for packet in container.demux(container.streams.video[0]):
                if packet.size:
                    arrivals.append(udp.arrival_at(packet.pos))
        except TimeoutError:  # the publisher finished: the socket went silent
            pass
        container.close()
    finally:
        sender.join()
        udp.close()
    assert len(arrivals) >= frames - 2  # the last packets wait for a next one that never comes
    assert all(a is not None for a in arrivals)
    stamps = np.asarray(arrivals, np.float64)
    assert np.all(np.diff(stamps) > 0)  # one datagram per frame start, in order
    # each frame's stamp follows its own send, not a later frame's
    sent = np.asarray(sends[: len(stamps)])
    assert np.all(stamps >= sent) and np.all(stamps[:-1] < sent[1:])


@pytest.mark.parametrize(
    ("url", "fmt", "device"),
    [
        ("/dev/video0", None, True),
        ("/dev/video2", "v4l2", True),
        ("/dev/v4l/by-id/usb-cam-video-index0", "video4linux2", True),
        ("/dev/v4l/by-id/usb-cam-video-index0", None, False),  # FFmpeg's probe: checked on open
        ("rtsp://127.0.0.1/cam", None, False),
        ("/dev/video0", "mjpeg", False),
    ],
)
def test_v4l2_inputs_are_recognised(url: str, fmt: str | None, device: bool) -> None:
    from eva.capture.ffmpeg_source import is_v4l2_input

    assert is_v4l2_input(url, fmt) is device


def test_a_v4l2_packets_pts_is_its_capture_time_when_on_the_wall_clock() -> None:
    """FFmpeg's V4L2 demuxer (``timestamps=mono2abs``) puts the driver's buffer timestamp,
    converted to the wall clock, into each packet's pts in microseconds."""
    from eva.capture.ffmpeg_source import device_time

    now = time.time()
    packet = av.Packet(b"\x00" * 16)
    packet.time_base = Fraction(1, 1_000_000)
    packet.pts = int((now - 0.040) * 1_000_000)  # captured 40 ms before it was read
    assert device_time(packet, now) == pytest.approx(now - 0.040, abs=1e-6)
    packet.pts = int(12_345.0 * 1_000_000)  # CLOCK_MONOTONIC (seconds since boot): not used
    assert device_time(packet, now) is None
    assert device_time(av.Packet(b"\x00"), now) is None  # no pts at all
