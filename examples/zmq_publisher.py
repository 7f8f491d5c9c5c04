"""Feed eva from a robot or teleop process: publish each stream on a ZeroMQ PUB socket.

A message is two frames: the topic (the stream's name, or the ``topic`` of its source table)
and MessagePack of ``{"t": seconds, "value": [floats]}``, where ``t`` is the Unix wall-clock time
the values were measured (the rig's one clock). Run it beside ``eva collect examples/rig.toml``.
"""

import math
import time

import msgpack
import zmq

socket = zmq.Context().socket(zmq.PUB)
socket.bind("tcp://127.0.0.1:5601")
while True:
    t = time.time()
    joints = [math.sin(t + k) for k in range(5)] + [1.0 if int(t) % 4 < 2 else 0.0]
    socket.send_multipart([b"observation.state", msgpack.packb({"t": t, "value": joints})])
    socket.send_multipart([b"action", msgpack.packb({"t": t, "value": joints})])
    time.sleep(1 / 200)
