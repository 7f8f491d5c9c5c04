"""The ``ffmpeg`` source kind's worker: one camera read by FFmpeg through PyAV (a V4L2/UVC
device, RTSP, UDP or RTP, HTTP MJPEG, a file), each frame scaled to the camera's size, converted
to RGB and pushed into its ring.

Clock: for a unicast ``udp://`` input, the kernel's receive time of the frame's first datagram
(``eva.capture.udp_input``); for a V4L2 device, the driver's buffer timestamp (where it is on
the wall clock); for any other input, the host's wall clock when the packet that completes the
frame is demuxed (before it is decoded); minus ``latency_s``.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Generator, Iterator
from typing import Any

import numpy as np

from eva.capture.source_context import (
    SourceContext,
    SourceEvents,
    SourceStream,
    demoted_from_realtime,
)

PACKET_QUEUE = 256  # packets received but not yet decoded (~8 s of a 30 fps camera)
DEVICE_CLOCK_SLACK_S = 1.0  # a device timestamp further than this from receipt: another clock


def run(ctx: SourceContext) -> None:
    (stream,) = ctx.streams  # one camera per FFmpeg input
    for t, rgb in _camera_frames(ctx.source, stream, ctx.stop, ctx.events):
        stream.push(t, rgb)


def _camera_frames(
    source: dict[str, Any], stream: SourceStream, stop: threading.Event, events: SourceEvents
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
    demoted_from_realtime()  # nothing here is timed by this thread's wake-ups

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


class _PacketReceiver:
    """The receiver thread of ``_demuxed_on_a_thread``: demuxes the input, stamps each packet as
    it is handed over and queues it; ``(nan, exception or None)`` ends the queue."""

    def __init__(self, container: Any, device: bool, events: SourceEvents, stream: str) -> None:
        self.container = container
        self.device = device
        self.events = events
        self.stream = stream
        self.packets: queue.Queue[tuple[float, Any]] = queue.Queue(maxsize=PACKET_QUEUE)
        self.receiving = threading.Event()
        self.receiving.set()
        self.warned = False
        self.thread = threading.Thread(target=self._receive, name="eva-receive", daemon=True)

    def _receive(self) -> None:
        end: BaseException | None = None
        try:
            for packet in self.container.demux(self.container.streams.video[0]):
                # the receipt time, taken before anything else: decode time varies from frame
                # to frame (a keyframe costs several P-frames), the arrival does not
                received = time.time()
                if self.device:
                    received = self._device_stamp(packet, received)
                if not self._put((received, packet)) or not self.receiving.is_set():
                    return
        except BaseException as e:  # handed to the decoding thread, which reports it
            end = e
        self._put((math.nan, end))

    def _device_stamp(self, packet: Any, received: float) -> float:
        """The device's buffer timestamp, or the receipt time (one warning) where it is not
        plausibly on the wall clock."""
        captured = device_time(packet, received)
        if captured is not None:
            return captured
        if not self.warned:
            self.warned = True
            self.events.send(
                "warning",
                self.stream,
                "the device's buffer timestamps are not on the wall clock: "
                "its frames are stamped on receipt",
            )
        return received

    def _put(self, item: tuple[float, Any]) -> bool:
        """Queue ``item``, waiting while the decoder is far behind; False once the decoding
        thread has stopped receiving."""
        while self.receiving.is_set():
            try:
                self.packets.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False


def _demuxed_on_a_thread(
    container: Any,
    stop: threading.Event,
    read_timeout: float,
    device: bool,
    events: SourceEvents,
    stream: SourceStream,
) -> Generator[tuple[float, Any], None, None]:
    """Packets of FFmpeg's own input with their receipt times, demuxed on a receiver thread.

    The packet is stamped as the demuxer hands it over, so the receiver must run the moment
    data arrives: a real-time source process keeps only the receiver (and FFmpeg's socket
    reader) at ``SCHED_FIFO``, and the caller's thread, which decodes (milliseconds a frame),
    runs at the ordinary priority, where the decoders of several cameras cannot delay each
    other's receivers (with all of them at one real-time priority, a packet waited for the
    other cameras' decodes to finish). A V4L2 device stamps its buffers itself: that time is
    used (the receipt time where a packet's is implausible, with one warning)."""
    receiver = _PacketReceiver(container, device, events, stream.name)
    try:
        receiver.thread.start()  # inherits this thread's priority (real-time, if granted) ...
        demoted_from_realtime()  # ... which the decoding thread then gives up
        while not stop.is_set():
            try:
                received, packet = receiver.packets.get(timeout=0.1)
            except queue.Empty:
                continue
            if math.isnan(received):
                if packet is not None:
                    raise packet
                return  # the end of the input
            yield received, packet
    finally:
        receiver.receiving.clear()
        # the receiver may be inside a read (at most the stall timeout): the container must
        # outlive it; a process ending anyway leaves it to the OS
        receiver.thread.join(read_timeout + 1.0)
        if not receiver.thread.is_alive():
            container.close()


def _decoded(
    source: dict[str, Any],
    stream: SourceStream,
    container: Any,
    packets: Generator[tuple[float, Any], None, None],
    events: SourceEvents,
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
                # into one reused buffer (libswscale when it matches PyAV's, else PyAV's)
                if started:
                    converter.convert(frame, buffer, 0)
                else:
                    converter.start_video(frame, buffer, 0)
                    started = True
                yield t - latency, buffer[0]
    finally:
        packets.close()  # ends the demuxing (its thread, the input) with the frames
