"""One episode's capture backlog: how deep each stream's ring got (``high_water``, saved as the
episode's ``capture_backlog``) and the warnings logged as a stream's lag rises past each of
``backlog.warn_seconds`` (and once it has caught up)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence

from eva.capture.streams import Stream

log = logging.getLogger("eva.capture")


class BacklogWatch:
    """The backlog of ``streams`` during one episode; ``check`` once per consumer pass."""

    def __init__(self, streams: Mapping[str, Stream], thresholds: Sequence[float]) -> None:
        self.streams = streams
        self.thresholds = tuple(thresholds)
        self.warn_level = {name: 0 for name in streams}
        self.high_water = {name: 0 for name in streams}

    def check(self, waiting_for: Callable[[str], str]) -> None:
        """Note each ring's depth; warn of a lag past the next threshold. ``waiting_for(name)``
        says what holds the stream back (the aligner knows)."""
        thresholds = self.thresholds
        for name, st in self.streams.items():
            backlog = len(st.ring)
            self.high_water[name] = max(self.high_water[name], backlog)
            if not thresholds:
                continue
            oldest = st.ring.peek_time() if backlog else None
            # a source process stamps its samples on the rig's wall clock, and nothing here sees
            # its pushes: its lag is the age of the oldest unread sample
            newest = time.time() if st.external else st.last_pushed_t
            lag = (newest - oldest) if oldest is not None else 0.0
            if not math.isfinite(lag):
                lag = 0.0
            level = self.warn_level[name]
            if level < len(thresholds) and lag >= thresholds[level]:
                while level < len(thresholds) and lag >= thresholds[level]:
                    level += 1
                log.warning(
                    "capture backlog: stream %s has %d samples waiting (%.1f MB), %.2f s behind%s",
                    name,
                    backlog,
                    backlog * st.ring.item_bytes / 1e6,
                    lag,
                    waiting_for(name),
                )
                self.warn_level[name] = level
            elif level and lag < thresholds[0] / 2:
                log.info("capture backlog: stream %s caught up", name)
                self.warn_level[name] = 0
