"""A source kind defined outside eva (by the test suite alone): ``counter``.

Importing this module registers it (``eva.source_kinds.register_source_kind``); the source
process imports it again by its worker path (``extra_source_kind:run``), so this directory must be
on the ``PYTHONPATH`` the source processes inherit. Every vector stream it feeds carries
``start, start + 1, ...`` in all its dimensions, one count per frame period, and every camera a
solid ``color`` image. ``refuse = true`` makes its ``eva collect --check`` probe refuse it.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from eva.capture.source_context import SourceContext
from eva.config_table import TableReader
from eva.source_config import SourceConfig
from eva.source_kinds import SourceKind, register_source_kind

REFUSAL = "the counter's probe refuses this rig (refuse = true)"


def _parse(table: TableReader, base: SourceConfig, stream: str) -> SourceConfig:
    color = table.get("color", list, [0, 0, 0])
    if len(color) != 3 or not all(
        isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= 255 for c in color
    ):
        raise table.fail("color", "expected [r, g, b] in 0..255")
    settings = {
        "start": table.number("start", 0, minimum=0, maximum=1_000_000, integer=True),
        "color": list(color),
        "refuse": table.get("refuse", bool, False),
    }
    return dataclasses.replace(base, settings=settings)


def _describe(source: SourceConfig) -> str:
    r, g, b = source.settings["color"]
    return f"counter from {source.settings['start']}, colour {r},{g},{b}"


def _check(source: SourceConfig) -> str | None:
    return REFUSAL if source.settings["refuse"] else None


def run(ctx: SourceContext) -> None:
    """One count per frame period, pushed into every stream on the wall clock."""
    start, color = ctx.source["settings"]["start"], ctx.source["settings"]["color"]
    period = 1.0 / ctx.fps
    images = {
        s.name: np.broadcast_to(np.asarray(color, np.uint8), s.shape).copy()
        for s in ctx.streams
        if s.kind == "camera"
    }
    ctx.events.send(
        "opened", None, _describe(SourceConfig("counter", settings=ctx.source["settings"]))
    )
    origin = time.time()
    count = 0
    while not ctx.stop.is_set():
        t = time.time()
        for stream in ctx.streams:
            if stream.kind == "camera":
                stream.push(t, images[stream.name])
            else:
                stream.push(t, np.full(stream.shape, float(start + count)))
        count += 1
        ctx.stop.wait(max(origin + count * period - time.time(), 0.0))


COUNTER = register_source_kind(
    SourceKind(
        "counter",
        ("camera", "vector"),
        frozenset({"start", "color", "refuse"}),
        _parse,
        _describe,
        lambda s: ("counter", s.settings["start"], tuple(s.settings["color"])),
        "extra_source_kind:run",
        check=_check,
    )
)
